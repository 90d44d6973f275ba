"""The Slack platform bundle: configured by SLACK_BOT_TOKEN (one workspace) or by SLACK_CLIENT_ID and
SLACK_CLIENT_SECRET (OAuth installs in many workspaces); Block Kit renderer, Web API messenger, `deepthread slack`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx

from bot.doctor import Check, describe_http_error
from bot.platform import PlatformBundle
from chat.platform import Outbound
from chat.slack.files import SlackFileDownloader
from chat.slack.messenger import SlackMessenger, build_slack_client
from chat.slack.render import SlackRenderer
from config import Settings, SettingsError
from ops.metrics import record_rate_limit_wait

if TYPE_CHECKING:
    from slack_sdk.web.async_client import AsyncWebClient

    from chat.slack.installations import DatabaseInstallationStore
    from storage.db import Engine

NAME = "slack"
TOKEN_SETTING = "SLACK_BOT_TOKEN"


def oauth_mode(settings: Settings) -> bool:
    """Whether the app's client id and secret are set: workspaces install it through OAuth, each with its own token."""
    return bool(settings.slack_client_id) and settings.secret("slack_client_secret") is not None


def configured(settings: Settings) -> bool:
    """Whether the Slack bot token is set, or the OAuth credentials that give each workspace its own."""
    return settings.secret("slack_bot_token") is not None or oauth_mode(settings)


def socket_mode(settings: Settings) -> bool:
    """Whether SLACK_APP_TOKEN is set, which selects Socket Mode."""
    return settings.secret("slack_app_token") is not None


def missing_adapter_setting(settings: Settings) -> str | None:
    """Why the Slack app cannot start with these settings (naming the variable), or None."""
    if not configured(settings):
        return f"{TOKEN_SETTING} (xoxb-…) is required for the Slack bot, or SLACK_CLIENT_ID and SLACK_CLIENT_SECRET for OAuth"
    if oauth_mode(settings) and socket_mode(settings):
        return "OAuth installs (SLACK_CLIENT_ID) work in HTTP mode: leave SLACK_APP_TOKEN empty and set SLACK_SIGNING_SECRET"
    if not socket_mode(settings) and settings.secret("slack_signing_secret") is None:
        return "SLACK_SIGNING_SECRET is required in HTTP mode; set SLACK_APP_TOKEN (xapp-…) for Socket Mode"
    return None


def renderer(settings: Settings) -> SlackRenderer:
    """The Slack renderer, its stop hint naming the first CANCEL_EMOJI."""
    return SlackRenderer(cancel_emoji=settings.cancel_emoji[0] if settings.cancel_emoji else "x")


def web_client(settings: Settings, token: str) -> AsyncWebClient:
    """A Web API client for SLACK_API_URL with `token`, its rate-limit waits counted in the process's metrics."""
    return build_slack_client(token, settings.slack_api_url, count_rate_limit_wait=record_rate_limit_wait)


def outbound(settings: Settings) -> Outbound:
    """The Web API messenger on SLACK_API_URL (with each workspace's installed token in OAuth mode, else the bot token)
    and the renderer."""
    if oauth_mode(settings):
        # Imported here: single-token mode never loads the store (nor the SQLAlchemy asyncio layer slack-sdk's pulls in).
        from chat.slack.installations import InstalledWorkspaceClients
        from storage.db import make_engine

        store = installation_store(settings, make_engine(settings.database_url))
        workspaces = InstalledWorkspaceClients(store, lambda token: web_client(settings, token))
        # The files' clients are their own: runs download on the runs' loop, the messenger speaks from the delivery's.
        file_workspaces = InstalledWorkspaceClients(store, lambda token: web_client(settings, token))
        return Outbound(messenger=SlackMessenger(workspaces=workspaces, progress_mode=settings.slack_progress),
                        renderer=renderer(settings),
                        files=SlackFileDownloader(workspaces=file_workspaces, hosts=settings.slack_file_hosts))
    token = settings.secret("slack_bot_token") or ""
    return Outbound(messenger=SlackMessenger(web_client(settings, token),
                                             progress_mode=settings.slack_progress), renderer=renderer(settings),
                    files=SlackFileDownloader(web_client(settings, token), hosts=settings.slack_file_hosts))


def installation_store(settings: Settings, engine: Engine) -> DatabaseInstallationStore:
    """The OAuth installations of this app (SLACK_CLIENT_ID) in the database behind `engine`, their tokens encrypted
    with DEEPTHREAD_SECRET_KEY; raises SettingsError when it is not set."""
    from chat.slack.installations import DatabaseInstallationStore
    from storage.encryption import KEY_REQUIRED, token_cipher

    cipher = token_cipher(settings.secret("deepthread_secret_key"))
    if cipher is None:
        raise SettingsError(KEY_REQUIRED)
    return DatabaseInstallationStore(engine, settings.slack_client_id or "", cipher)


def doctor(settings: Settings, http: httpx.Client) -> Check:
    """Slack: off without a token; otherwise the mode's settings and `auth.test`."""
    token = settings.secret("slack_bot_token")
    if not token and oauth_mode(settings):
        problem = missing_adapter_setting(settings)
        if problem:
            return Check(component=NAME, status="missing", detail=problem, required=True)
        return Check(component=NAME, status="ok", detail="HTTP mode with OAuth installs at /slack/install", required=True)
    if not token:
        return Check(component=NAME, status="off", detail=f"{TOKEN_SETTING} not set")
    mode = "Socket Mode" if socket_mode(settings) else "HTTP mode"
    problem = missing_adapter_setting(settings)
    if problem:
        return Check(component=NAME, status="missing", detail=problem, required=True)
    try:
        answer = http.post(settings.slack_api_url + "auth.test", headers={"Authorization": f"Bearer {token}"}).json()
    except (httpx.HTTPError, ValueError) as error:
        return Check(component=NAME, status="error", detail=f"auth.test failed: {describe_http_error(error)}", required=True)
    if not answer.get("ok"):
        return Check(component=NAME, status="error", detail=f"auth.test: {answer.get('error', 'not ok')}", required=True)
    return Check(component=NAME, status="ok", detail=f"{mode}; signed in as {answer.get('user', '?')} in {answer.get('team', '?')}",
                 required=True)


BUNDLE = PlatformBundle(name=NAME, configured=configured, build_outbound=outbound, adapter_command="slack",
                        doctor=doctor, missing_setting=TOKEN_SETTING)
