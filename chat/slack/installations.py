"""Slack workspaces installed through OAuth: their stored installations, and a Web API client per workspace.

The installations live in our database and are read and written by slack-sdk's SQLAlchemy store, built and queried
in storage/installations.py, their tokens encrypted with DEEPTHREAD_SECRET_KEY's cipher; `DatabaseInstallationStore`
offers it to slack-bolt (and to the worker) through the async interface, each call off the event loop so that it
never waits on the database.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from logging import Logger

from slack_sdk.oauth.installation_store.async_installation_store import AsyncInstallationStore
from slack_sdk.oauth.installation_store.models.bot import Bot
from slack_sdk.oauth.installation_store.models.installation import Installation
from slack_sdk.web.async_client import AsyncWebClient

from storage.db import Engine
from storage.encryption import TokenCipher
from storage.installations import (
    abot_of_workspace,
    adelete_bot,
    adelete_installation,
    afind_bot,
    afind_installation,
    asave_bot,
    asave_installation,
    installation_store,
)

logger = logging.getLogger(__name__)

# How long a worker trusts a workspace's token before reading the store again (an uninstall stops delivery by then).
TOKEN_CACHE_SECONDS = 60.0


class DatabaseInstallationStore(AsyncInstallationStore):
    """slack-bolt's async installation store over slack-sdk's SQLAlchemy store on our tables, its tokens encrypted
    with `cipher`."""

    def __init__(self, engine: Engine, client_id: str, cipher: TokenCipher) -> None:
        self.store = installation_store(engine, client_id, cipher, logger=logger)

    @property
    def logger(self) -> Logger:
        return logger

    async def async_save(self, installation: Installation) -> None:
        """Store an installation (and its bot)."""
        await asave_installation(self.store, installation)

    async def async_save_bot(self, bot: Bot) -> None:
        """Store a bot installation."""
        await asave_bot(self.store, bot)

    async def async_find_bot(self, *, enterprise_id: str | None, team_id: str | None,
                             is_enterprise_install: bool | None = False) -> Bot | None:
        """The latest bot installed in the workspace, or None."""
        return await afind_bot(self.store, enterprise_id=enterprise_id, team_id=team_id,
                               is_enterprise_install=is_enterprise_install)

    async def async_find_installation(self, *, enterprise_id: str | None, team_id: str | None, user_id: str | None = None,
                                      is_enterprise_install: bool | None = False) -> Installation | None:
        """The latest installation in the workspace (by `user_id`, if given), or None."""
        return await afind_installation(self.store, enterprise_id=enterprise_id, team_id=team_id, user_id=user_id,
                                        is_enterprise_install=is_enterprise_install)

    async def bot_of_workspace(self, team_id: str) -> Bot | None:
        """The latest bot installed in workspace `team_id`, whatever Enterprise Grid org it belongs to, or None."""
        return await abot_of_workspace(self.store, team_id)

    async def async_delete_bot(self, *, enterprise_id: str | None, team_id: str | None) -> None:
        """Forget the workspace's bots."""
        await adelete_bot(self.store, enterprise_id=enterprise_id, team_id=team_id)

    async def async_delete_installation(self, *, enterprise_id: str | None, team_id: str | None,
                                        user_id: str | None = None) -> None:
        """Forget the workspace's installations (by `user_id`, if given)."""
        await adelete_installation(self.store, enterprise_id=enterprise_id, team_id=team_id, user_id=user_id)


class InstalledWorkspaceClients:
    """A client per installed workspace, with the bot token from the installation store, remembered for a while
    (chat.slack.messenger.WorkspaceClients)."""

    def __init__(self, store: DatabaseInstallationStore, build_client: Callable[[str], AsyncWebClient], *,
                 cache_seconds: float = TOKEN_CACHE_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.build_client = build_client
        self.cache_seconds = cache_seconds
        self.clock = clock
        self._known: dict[str, tuple[float, AsyncWebClient]] = {}

    async def client_for(self, workspace: str) -> AsyncWebClient | None:
        """The client for `workspace`'s latest bot token; None when no bot is installed there."""
        until, client = self._known.get(workspace, (0.0, None))
        if client is not None and until > self.clock():
            return client
        bot = await self.store.bot_of_workspace(workspace)
        if bot is None or not bot.bot_token:
            self._known.pop(workspace, None)
            return None
        if client is None or client.token != bot.bot_token:
            client = self.build_client(bot.bot_token)  # a new token (reinstalled): a new client and its connections
        self._known[workspace] = (self.clock() + self.cache_seconds, client)
        return client

    def forget(self, workspace: str) -> None:
        """Read `workspace`'s token from the store on the next call."""
        self._known.pop(workspace, None)
