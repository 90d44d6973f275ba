"""Installing the Slack app in many workspaces: slack-bolt's OAuth flow on our database, and uninstalls.

`GET /slack/install` sends the person to Slack's authorize page (SLACK_AUTHORIZE_URL) with a state that is signed
(bot.slack.oauth_state; nothing is written) and set as a cookie; Slack sends them back to `GET /slack/oauth_redirect`
with a code, which bolt checks against the cookie and the state's signature, exchanges with `oauth.v2.access` (on
SLACK_API_URL), and stores as the workspace's installation (its tokens encrypted with DEEPTHREAD_SECRET_KEY). Every
request from Slack is then authorized with the bot token installed in its workspace. `app_uninstalled` and a revoked
bot token delete the workspace's installation.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from slack_bolt.async_app import AsyncBoltContext
from slack_bolt.authorization.async_authorize import AsyncInstallationStoreAuthorize
from slack_bolt.oauth.async_oauth_flow import AsyncOAuthFlow
from slack_bolt.oauth.async_oauth_settings import AsyncOAuthSettings
from slack_sdk.web.async_client import AsyncWebClient

from bot.slack.bundle import installation_store
from bot.slack.oauth_state import STATE_SECONDS, SignedOAuthStateStore
from chat.slack.installations import DatabaseInstallationStore
from config import Settings
from storage.db import Engine

logger = logging.getLogger(__name__)

INSTALL_PATH = "/slack/install"
REDIRECT_PATH = "/slack/oauth_redirect"
# What the app asks each workspace for: slack/manifest.yml's bot scopes (a unit test keeps the two equal).
BOT_SCOPES = (
    "commands", "chat:write", "app_mentions:read", "channels:history", "groups:history", "im:history", "mpim:history",
    "channels:read", "groups:read", "im:read", "mpim:read", "channels:join", "reactions:read", "files:write",
    "files:read", "assistant:write", "users:read",
)


@dataclass(frozen=True)
class OAuthInstalls:
    """The install flow, the installations it stores, and how a request is authorized with its workspace's token."""

    flow: AsyncOAuthFlow
    store: DatabaseInstallationStore
    authorize: AsyncInstallationStoreAuthorize


def oauth_installs(settings: Settings, engine: Engine, client: AsyncWebClient) -> OAuthInstalls:
    """The OAuth install flow for SLACK_CLIENT_ID on the database behind `engine`, calling Slack through `client`."""
    store = installation_store(settings, engine)
    client_secret = settings.secret("slack_client_secret") or ""
    oauth_settings = AsyncOAuthSettings(
        client_id=settings.slack_client_id,
        client_secret=client_secret,
        scopes=list(BOT_SCOPES),
        install_path=INSTALL_PATH,
        redirect_uri_path=REDIRECT_PATH,
        # Straight to Slack's approval page: no page of ours with an "Add to Slack" button in between.
        install_page_rendering_enabled=False,
        authorization_url=settings.slack_authorize_url,
        installation_store=store,
        installation_store_bot_only=True,
        state_store=SignedOAuthStateStore(client_secret),
        state_expiration_seconds=STATE_SECONDS,
        logger=logger,
    )
    # auth.test once per token, not on every request; the store is still read each time, so an uninstall counts at once.
    authorize = AsyncInstallationStoreAuthorize(logger=logger, installation_store=store, bot_only=True, cache_enabled=True,
                                                client=client)
    return OAuthInstalls(flow=AsyncOAuthFlow(client=client, logger=logger, settings=oauth_settings), store=store,
                         authorize=authorize)


class InstallationRemoval:
    """Forgets a workspace's installation when the app is uninstalled there or its bot token is revoked."""

    def __init__(self, store: DatabaseInstallationStore) -> None:
        self.store = store

    async def on_app_uninstalled(self, context: AsyncBoltContext) -> None:
        """`app_uninstalled`: every installation and bot of the workspace."""
        await self.store.async_delete_all(enterprise_id=context.enterprise_id, team_id=context.team_id)
        logger.info("the app was uninstalled from a workspace; its installation is deleted")

    async def on_tokens_revoked(self, event: dict[str, Any], context: AsyncBoltContext) -> None:
        """`tokens_revoked`: the workspace's installation when the bot's token is among them, else those users'."""
        tokens = event.get("tokens") or {}
        if tokens.get("bot"):
            await self.store.async_delete_all(enterprise_id=context.enterprise_id, team_id=context.team_id)
            logger.info("a workspace revoked the bot's token; its installation is deleted")
            return
        for user_id in tokens.get("oauth") or []:
            await self.store.async_delete_installation(enterprise_id=context.enterprise_id, team_id=context.team_id,
                                                       user_id=user_id)
