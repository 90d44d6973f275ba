"""The Discord bot (`deepthread discord` minus the CLI) on its own event loop in a thread, with discord.py's built-in
Discord URLs pointed where nothing listens, so the bot reaches the fake Discord only through DISCORD_API_URL."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import discord.gateway
import discord.http
import yarl

from bot.cli import platform_core
from bot.conversation.core import ConversationCore
from bot.discord.app import DiscordBot, discover
from bot.discord.bundle import BUNDLE as DISCORD
from bot.discord.bundle import http as discord_http
from config import Settings
from tests.fakes.discord_api import (
    COMPONENT_BUTTON,
    COMPONENT_STRING_SELECT,
    DiscordMessage,
    FakeDiscord,
    message_components,
)

# Nothing listens here: discord.py reaches the fake only if the bot points it there from DISCORD_API_URL.
NOWHERE = "http://127.0.0.1:9"


@contextmanager
def discord_urls_nowhere() -> Iterator[None]:
    """discord.py's default REST base and gateway pointed at a closed port while inside, restored after."""
    saved = discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY
    discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = NOWHERE, yarl.URL("ws://127.0.0.1:9/")
    try:
        yield
    finally:
        discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = saved


def cluster_settings(fake: FakeDiscord) -> dict[str, str]:
    """The settings a `Cluster` (the bot and its workers) needs to speak to `fake`: its token, REST base and guild, and
    its CDN as the only origin shared attachments are downloaded from (DISCORD_FILE_HOSTS)."""
    return {"discord_bot_token": fake.token, "discord_api_url": fake.api_url, "discord_guild_ids": str(fake.guild_id),
            "discord_file_hosts": fake.cdn_url}


def buttons_of(message: DiscordMessage) -> dict[str, str]:
    """A message's buttons: label → custom id."""
    return {component["label"]: component["custom_id"] for component in message_components(message)
            if component.get("type") == COMPONENT_BUTTON}


def menus_of(message: DiscordMessage) -> dict[str, dict[str, Any]]:
    """A message's select menus by their placeholder."""
    return {component["placeholder"]: component for component in message_components(message)
            if component.get("type") == COMPONENT_STRING_SELECT}


def chosen(menu: dict[str, Any]) -> list[str]:
    """The values a select menu shows as chosen (its default options)."""
    return [option["value"] for option in menu.get("options") or [] if option.get("default")]


def discord_core(settings: Settings) -> ConversationCore:
    """The core as `deepthread discord` builds it: Discord's messenger and renderer on DATABASE_URL."""
    return platform_core(DISCORD, settings)


class BotThread:
    """The Discord bot with the core `build_core(settings)` gives, on its own event loop in a thread."""

    def __init__(self, settings: Settings, *, build_core: Callable[[Settings], ConversationCore] = discord_core,
                 sync_globally: bool = False) -> None:
        self.settings = settings
        self.build_core = build_core
        self.sync_globally = sync_globally
        self.loop = asyncio.new_event_loop()
        self.bot: DiscordBot | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="discord-bot", daemon=True)

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._serve())
        except BaseException as error:  # surfaced by the test that waits on the bot
            self.error = error

    async def _serve(self) -> None:
        core = self.build_core(self.settings)
        probe = discord_http(self.settings)
        try:
            connection = await discover(probe)
        finally:
            await probe.aclose()
        self.bot = DiscordBot(self.settings, core, core.messenger, renderer=core.renderer, connection=connection,
                              guild_ready_timeout=0.2)
        self.bot.sync_globally = self.sync_globally
        await self.bot.run(self.settings.discord_bot_token.get_secret_value())

    def ready_or_failed(self) -> bool:
        """Whether the bot has had READY from the gateway, or has stopped on an error (then in `error`)."""
        return self.error is not None or (self.bot is not None and self.bot.ready.is_set())

    def start(self) -> "BotThread":
        self._thread.start()
        return self

    def stop(self) -> None:
        if self.bot is not None and self.loop.is_running():
            asyncio.run_coroutine_threadsafe(self.bot.close(), self.loop).result(timeout=15)
        self._thread.join(timeout=15)
