"""The Slack OAuth tables: installations and bots, as slack-sdk's SQLAlchemy installation store reads and writes them.

The columns are slack-sdk's own (`SQLAlchemyInstallationStore.build_installations_table`, `build_bots_table`),
written out here so that the schema lives in our metadata and migrations without importing slack-sdk;
tests/unit/test_slack_oauth_settings.py checks they stay the same, but for the secret columns (`SECRET_COLUMNS`):
those hold the tokens and the webhook URL encrypted with DEEPTHREAD_SECRET_KEY (`storage.encryption`), as text, since
a Fernet token is longer than the plain value. The store slack-sdk builds queries copies of our tables whose secret
columns are `EncryptedText`: it writes and reads plain values, the database holds only encrypted ones.

slack-sdk's store is built here too, on our table names, with every query the app makes of it: each function is
blocking and has an `a`-named twin that runs it off the event loop (see `storage.db`). slack-sdk is imported only
when a store is built, so that loading the schema (every process does) never loads its SQLAlchemy layer. The install
states of the OAuth flow are not stored: they are signed (bot.slack.oauth_state).
"""

from __future__ import annotations

from logging import Logger
from typing import TYPE_CHECKING, NamedTuple

from sqlalchemy import Boolean, Column, DateTime, Index, Integer, MetaData, String, Table, Text, desc, exists, select

from storage.base import Base
from storage.db import Engine, Sessions, off_loop
from storage.encryption import KEY_REQUIRED, KEY_SETTING, EncryptedText, TokenCipher

if TYPE_CHECKING:
    from slack_sdk.oauth.installation_store.models.bot import Bot
    from slack_sdk.oauth.installation_store.models.installation import Installation
    from slack_sdk.oauth.installation_store.sqlalchemy import SQLAlchemyInstallationStore

INSTALLATIONS_TABLE = "slack_installations"
BOTS_TABLE = "slack_bots"
# The columns that hold a credential: stored encrypted, as text.
SECRET_COLUMNS = frozenset({"bot_token", "bot_refresh_token", "user_token", "user_refresh_token",
                            "incoming_webhook_url"})

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
    Column("bot_token", Text),
    Column("bot_id", String(32)),
    Column("bot_user_id", String(32)),
    Column("bot_scopes", String(1000)),
    Column("bot_refresh_token", Text),
    Column("bot_token_expires_at", DateTime),
    Column("user_id", String(32), nullable=False),
    Column("user_token", Text),
    Column("user_scopes", String(1000)),
    Column("user_refresh_token", Text),
    Column("user_token_expires_at", DateTime),
    Column("incoming_webhook_url", Text),
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
    Column("bot_token", Text),
    Column("bot_id", String(32)),
    Column("bot_user_id", String(32)),
    Column("bot_scopes", String(1000)),
    Column("bot_refresh_token", Text),
    Column("bot_token_expires_at", DateTime),
    Column("is_enterprise_install", Boolean, nullable=False),
    Column("installed_at", DateTime, nullable=False),
    Index(f"{BOTS_TABLE}_idx", "client_id", "enterprise_id", "team_id", "installed_at"),
)


def _encrypting(table: Table, metadata: MetaData, cipher: TokenCipher) -> Table:
    """A copy of `table` in `metadata` whose secret columns are encrypted with `cipher` on the way in and out."""
    return Table(table.name, metadata, *(
        Column(column.name, EncryptedText(cipher) if column.name in SECRET_COLUMNS else column.type,
               primary_key=column.primary_key, nullable=column.nullable, autoincrement=column.autoincrement)
        for column in table.columns))


def installation_store(engine: Engine, client_id: str, cipher: TokenCipher, *,
                       logger: Logger) -> SQLAlchemyInstallationStore:
    """slack-sdk's installation store of app `client_id` on our installations and bots tables behind `engine`, its
    tokens encrypted with `cipher`."""
    from slack_sdk.oauth.installation_store.sqlalchemy import SQLAlchemyInstallationStore

    store = SQLAlchemyInstallationStore(client_id=client_id, engine=engine, bots_table_name=BOTS_TABLE,
                                        installations_table_name=INSTALLATIONS_TABLE, logger=logger)
    # Every query of the store goes through these two attributes: its own copies, without encryption, are replaced.
    store.metadata = MetaData()
    store.installations = _encrypting(slack_installations, store.metadata, cipher)
    store.bots = _encrypting(slack_bots, store.metadata, cipher)
    return store


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


class StoredTokens(NamedTuple):
    """What `encrypt_stored_tokens` found: values it encrypted or encrypted again with the first key, and values
    none of the keys can read."""

    renewed: int
    unreadable: int


def encrypt_stored_tokens(engine: Engine, cipher: TokenCipher) -> StoredTokens:
    """Encrypt every stored secret value that is in plain text (written before DEEPTHREAD_SECRET_KEY was set), and
    encrypt again with the first key every value an older key encrypted; a value no key reads is left as it is."""
    renewed = unreadable = 0
    for table in (slack_installations, slack_bots):
        secrets = [column for column in table.columns if column.name in SECRET_COLUMNS]
        with engine.begin() as connection:
            for row in connection.execute(select(table.c.id, *secrets)).mappings().all():
                changes: dict[str, str] = {}
                for column in secrets:
                    stored = row[column.name]
                    if stored is None:
                        continue
                    new_value = cipher.renewed(stored)
                    if new_value is not None:
                        changes[column.name] = new_value
                    elif not cipher.can_read(stored):
                        unreadable += 1
                if changes:
                    connection.execute(table.update().where(table.c.id == row["id"]).values(changes))
                    renewed += len(changes)
    return StoredTokens(renewed=renewed, unreadable=unreadable)


def token_key_problem(sessions: Sessions, cipher: TokenCipher | None) -> str | None:
    """Why a process that reads the stored Slack tokens cannot start, in one line naming DEEPTHREAD_SECRET_KEY: it is
    not set, or a stored value is not encrypted with one of its keys; None when every stored token can be read."""
    with sessions() as session:
        if cipher is None:
            if any(session.scalar(select(exists().select_from(table))) for table in (slack_installations, slack_bots)):
                return (f"{KEY_SETTING} is required: the database holds Slack installations, whose tokens are "
                        "stored encrypted with it (the README says how to make one)")
            return KEY_REQUIRED
        for table in (slack_installations, slack_bots):
            secrets = [column for column in table.columns if column.name in SECRET_COLUMNS]
            for row in session.execute(select(*secrets)):
                if any(value is not None and not cipher.can_read(value) for value in row):
                    return (f"{KEY_SETTING} cannot read the stored Slack tokens: put the key that encrypted them "
                            "back in the list (after the new one) and run `deepthread migrate`")
    return None


asave_installation = off_loop(save_installation)
asave_bot = off_loop(save_bot)
afind_bot = off_loop(find_bot)
afind_installation = off_loop(find_installation)
abot_of_workspace = off_loop(bot_of_workspace)
adelete_bot = off_loop(delete_bot)
adelete_installation = off_loop(delete_installation)
