"""The Slack OAuth tables: installations, bots and install states, as slack-sdk's SQLAlchemy stores read and write them.

The columns are slack-sdk's own (`SQLAlchemyInstallationStore.build_installations_table`, `build_bots_table`,
`SQLAlchemyOAuthStateStore.build_oauth_states_table`), written out here so that the schema lives in our metadata and
migrations without importing slack-sdk; tests/unit/test_slack_oauth_settings.py checks they stay the same.

slack-sdk's stores are built here too, on our table names, with every query the app makes of them: each function is
blocking and has an `a`-named twin that runs it off the event loop (see `storage.db`). slack-sdk is imported only
when a store is built, so that loading the schema (every process does) never loads its SQLAlchemy layer.
"""

from __future__ import annotations

import datetime as dt
from logging import Logger
from typing import TYPE_CHECKING

from sqlalchemy import Boolean, Column, DateTime, Index, Integer, String, Table, desc, select

from storage.base import Base
from storage.db import Engine, off_loop

if TYPE_CHECKING:
    from slack_sdk.oauth.installation_store.models.bot import Bot
    from slack_sdk.oauth.installation_store.models.installation import Installation
    from slack_sdk.oauth.installation_store.sqlalchemy import SQLAlchemyInstallationStore
    from slack_sdk.oauth.state_store.sqlalchemy import SQLAlchemyOAuthStateStore

INSTALLATIONS_TABLE = "slack_installations"
BOTS_TABLE = "slack_bots"
OAUTH_STATES_TABLE = "slack_oauth_states"

slack_installations = Table(
    INSTALLATIONS_TABLE,
    Base.metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("client_id", String(32), nullable=False),
    Column("app_id", String(32), nullable=False),
    Column("enterprise_id", String(32)),
    Column("enterprise_name", String(200)),
    Column("enterprise_url", String(200)),
    Column("team_id", String(32)),
    Column("team_name", String(200)),
    Column("bot_token", String(200)),
    Column("bot_id", String(32)),
    Column("bot_user_id", String(32)),
    Column("bot_scopes", String(1000)),
    Column("bot_refresh_token", String(200)),
    Column("bot_token_expires_at", DateTime),
    Column("user_id", String(32), nullable=False),
    Column("user_token", String(200)),
    Column("user_scopes", String(1000)),
    Column("user_refresh_token", String(200)),
    Column("user_token_expires_at", DateTime),
    Column("incoming_webhook_url", String(200)),
    Column("incoming_webhook_channel", String(200)),
    Column("incoming_webhook_channel_id", String(200)),
    Column("incoming_webhook_configuration_url", String(200)),
    Column("is_enterprise_install", Boolean, nullable=False),
    Column("token_type", String(32)),
    Column("installed_at", DateTime, nullable=False),
    Index(f"{INSTALLATIONS_TABLE}_idx", "client_id", "enterprise_id", "team_id", "user_id", "installed_at"),
)

slack_bots = Table(
    BOTS_TABLE,
    Base.metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("client_id", String(32), nullable=False),
    Column("app_id", String(32), nullable=False),
    Column("enterprise_id", String(32)),
    Column("enterprise_name", String(200)),
    Column("team_id", String(32)),
    Column("team_name", String(200)),
    Column("bot_token", String(200)),
    Column("bot_id", String(32)),
    Column("bot_user_id", String(32)),
    Column("bot_scopes", String(1000)),
    Column("bot_refresh_token", String(200)),
    Column("bot_token_expires_at", DateTime),
    Column("is_enterprise_install", Boolean, nullable=False),
    Column("installed_at", DateTime, nullable=False),
    Index(f"{BOTS_TABLE}_idx", "client_id", "enterprise_id", "team_id", "installed_at"),
)

slack_oauth_states = Table(
    OAUTH_STATES_TABLE,
    Base.metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("state", String(200), nullable=False),
    Column("expire_at", DateTime, nullable=False),
)


def installation_store(engine: Engine, client_id: str, *, logger: Logger) -> SQLAlchemyInstallationStore:
    """slack-sdk's installation store of app `client_id` on our installations and bots tables behind `engine`."""
    from slack_sdk.oauth.installation_store.sqlalchemy import SQLAlchemyInstallationStore

    return SQLAlchemyInstallationStore(client_id=client_id, engine=engine, bots_table_name=BOTS_TABLE,
                                       installations_table_name=INSTALLATIONS_TABLE, logger=logger)


def save_installation(store: SQLAlchemyInstallationStore, installation: Installation) -> None:
    """Store an installation (and its bot)."""
    store.save(installation)


def save_bot(store: SQLAlchemyInstallationStore, bot: Bot) -> None:
    """Store a bot installation."""
    store.save_bot(bot)


def find_bot(store: SQLAlchemyInstallationStore, *, enterprise_id: str | None, team_id: str | None,
             is_enterprise_install: bool | None = False) -> Bot | None:
    """The latest bot installed in the workspace, or None."""
    return store.find_bot(enterprise_id=enterprise_id, team_id=team_id, is_enterprise_install=is_enterprise_install)


def find_installation(store: SQLAlchemyInstallationStore, *, enterprise_id: str | None, team_id: str | None,
                      user_id: str | None = None, is_enterprise_install: bool | None = False) -> Installation | None:
    """The latest installation in the workspace (by `user_id`, if given), or None."""
    return store.find_installation(enterprise_id=enterprise_id, team_id=team_id, user_id=user_id,
                                   is_enterprise_install=is_enterprise_install)


def bot_of_workspace(store: SQLAlchemyInstallationStore, team_id: str) -> Bot | None:
    """The latest bot installed in workspace `team_id`, whatever Enterprise Grid org it belongs to, or None."""
    # slack-sdk's find_bot needs the enterprise id too, which a stored conversation does not keep.
    bots = store.bots.c
    query = (select(store.bots)
             .where(bots.client_id == store.client_id, bots.team_id == team_id, bots.bot_token.is_not(None))
             .order_by(desc(bots.installed_at)).limit(1))
    with store.engine.connect() as connection:
        row = connection.execute(query).mappings().first()
    return None if row is None else store.build_bot_entity(row)


def delete_bot(store: SQLAlchemyInstallationStore, *, enterprise_id: str | None, team_id: str | None) -> None:
    """Forget the workspace's bots."""
    store.delete_bot(enterprise_id=enterprise_id, team_id=team_id)


def delete_installation(store: SQLAlchemyInstallationStore, *, enterprise_id: str | None, team_id: str | None,
                        user_id: str | None = None) -> None:
    """Forget the workspace's installations (by `user_id`, if given)."""
    store.delete_installation(enterprise_id=enterprise_id, team_id=team_id, user_id=user_id)


def oauth_state_store(engine: Engine, expiration_seconds: int, *, logger: Logger) -> SQLAlchemyOAuthStateStore:
    """slack-sdk's store of install states on our table behind `engine`, each state valid `expiration_seconds`."""
    from slack_sdk.oauth.state_store.sqlalchemy import SQLAlchemyOAuthStateStore

    return SQLAlchemyOAuthStateStore(expiration_seconds=expiration_seconds, engine=engine, logger=logger,
                                     table_name=OAUTH_STATES_TABLE)


def issue_oauth_state(store: SQLAlchemyOAuthStateStore) -> str:
    """A new state, stored until it expires or is consumed; the expired states of installs never finished go first."""
    states = store.oauth_states
    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)  # slack-sdk stores naive UTC
    with store.engine.begin() as connection:
        connection.execute(states.delete().where(states.c.expire_at < now))
    return store.issue()


def consume_oauth_state(store: SQLAlchemyOAuthStateStore, state: str) -> bool:
    """Whether `state` was issued and has not expired; it cannot be used again either way."""
    return store.consume(state)


asave_installation = off_loop(save_installation)
asave_bot = off_loop(save_bot)
afind_bot = off_loop(find_bot)
afind_installation = off_loop(find_installation)
abot_of_workspace = off_loop(bot_of_workspace)
adelete_bot = off_loop(delete_bot)
adelete_installation = off_loop(delete_installation)
aissue_oauth_state = off_loop(issue_oauth_state)
aconsume_oauth_state = off_loop(consume_oauth_state)
