"""The Slack platform bundle: configured by SLACK_BOT_TOKEN; Block Kit renderer, Web API messenger, `deepthread slack`."""

from __future__ import annotations

import httpx

from bot.doctor import Check, describe_http_error
from bot.platform import PlatformBundle
from chat.platform import Outbound
from chat.slack.messenger import SlackMessenger, build_slack_client
from chat.slack.render import SlackRenderer
from config import Settings

NAME = "slack"
TOKEN_SETTING = "SLACK_BOT_TOKEN"


def configured(settings: Settings) -> bool:
    """Whether the Slack bot token is set (the one setting every Slack part needs)."""
    return settings.secret("slack_bot_token") is not None


def socket_mode(settings: Settings) -> bool:
    """Whether SLACK_APP_TOKEN is set, which selects Socket Mode."""
    return settings.secret("slack_app_token") is not None


def missing_adapter_setting(settings: Settings) -> str | None:
    """Why the Slack app cannot start with these settings (naming the variable), or None."""
    if not configured(settings):
        return f"{TOKEN_SETTING} (xoxb-…) is required for the Slack bot"
    if not socket_mode(settings) and settings.secret("slack_signing_secret") is None:
        return "SLACK_SIGNING_SECRET is required in HTTP mode; set SLACK_APP_TOKEN (xapp-…) for Socket Mode"
    return None


def renderer(settings: Settings) -> SlackRenderer:
    """The Slack renderer, its stop hint naming the first CANCEL_EMOJI."""
    return SlackRenderer(cancel_emoji=settings.cancel_emoji[0] if settings.cancel_emoji else "x")


def outbound(settings: Settings) -> Outbound:
    """The Web API messenger (SLACK_API_URL, the bot token) and the renderer."""
    token = settings.secret("slack_bot_token") or ""
    return Outbound(messenger=SlackMessenger(build_slack_client(token, settings.slack_api_url)), renderer=renderer(settings))


def doctor(settings: Settings, http: httpx.Client) -> Check:
    """Slack: off without a token; otherwise the mode's settings and `auth.test`."""
    token = settings.secret("slack_bot_token")
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
