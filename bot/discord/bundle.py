"""The Discord platform bundle: configured by DISCORD_BOT_TOKEN; message renderer, REST messenger, `deepthread discord`."""

from __future__ import annotations

import httpx

from bot.doctor import Check, describe_http_error
from bot.platform import PlatformBundle
from chat.discord.files import DiscordFileDownloader
from chat.discord.messenger import DiscordMessenger, build_discord_http
from chat.discord.render import DiscordRenderer
from chat.platform import Outbound
from config import Settings
from ops.metrics import record_rate_limit_wait

NAME = "discord"
TOKEN_SETTING = "DISCORD_BOT_TOKEN"


def configured(settings: Settings) -> bool:
    """Whether the Discord bot token is set."""
    return settings.secret("discord_bot_token") is not None


def renderer(settings: Settings) -> DiscordRenderer:
    """The Discord renderer, its stop hint naming the first CANCEL_EMOJI written as an emoji (Discord has no `:x:`)."""
    emoji = next((name for name in settings.cancel_emoji if not name.isascii()), "❌")
    return DiscordRenderer(cancel_emoji=emoji)


def http(settings: Settings) -> httpx.AsyncClient:
    """An httpx client for DISCORD_API_URL with the bot token."""
    return build_discord_http(settings.secret("discord_bot_token") or "", settings.discord_api_url)


def outbound(settings: Settings) -> Outbound:
    """The REST messenger (DISCORD_API_URL, the bot token, rate-limit waits counted in the process's metrics) and the
    renderer."""
    messenger = DiscordMessenger(http(settings), count_rate_limit_wait=record_rate_limit_wait)
    return Outbound(messenger=messenger, renderer=renderer(settings),
                    files=DiscordFileDownloader(hosts=settings.discord_file_hosts))


def doctor(settings: Settings, http: httpx.Client) -> Check:
    """Discord: off without a token; otherwise the token must sign in (`GET /users/@me`)."""
    token = settings.secret("discord_bot_token")
    if not token:
        return Check(component=NAME, status="off", detail=f"{TOKEN_SETTING} not set")
    try:
        response = http.get(settings.discord_api_url + "/users/@me", headers={"Authorization": f"Bot {token}"})
    except httpx.HTTPError as error:
        return Check(component=NAME, status="error", detail=describe_http_error(error), required=True)
    if response.status_code != 200:
        return Check(component=NAME, status="error", detail=f"/users/@me answers HTTP {response.status_code}", required=True)
    return Check(component=NAME, status="ok", detail=f"signed in as {response.json().get('username', '?')}", required=True)


BUNDLE = PlatformBundle(name=NAME, configured=configured, build_outbound=outbound, adapter_command="discord",
                        doctor=doctor, missing_setting=TOKEN_SETTING)


# Only what the bot uses: see channels, post, start public threads and talk in them, links, files, history.
INVITE_PERMISSIONS = {"View Channels": 1 << 10, "Send Messages": 1 << 11, "Embed Links": 1 << 14,
                      "Attach Files": 1 << 15, "Read Message History": 1 << 16, "Create Public Threads": 1 << 35,
                      "Send Messages in Threads": 1 << 38}
OAUTH_AUTHORIZE_URL = "https://discord.com/oauth2/authorize"


def invite_url(application_id: str) -> str:
    """The OAuth2 URL that adds the bot to a server with its commands and only the permissions it uses."""
    permissions = sum(INVITE_PERMISSIONS.values())
    return f"{OAUTH_AUTHORIZE_URL}?client_id={application_id}&scope=bot+applications.commands&permissions={permissions}"
