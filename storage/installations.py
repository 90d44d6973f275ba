"""The Slack OAuth tables: installations, bots and install states, as slack-sdk's SQLAlchemy stores read and write them.

The columns are slack-sdk's own (`SQLAlchemyInstallationStore.build_installations_table`, `build_bots_table`,
`SQLAlchemyOAuthStateStore.build_oauth_states_table`), written out here so that the schema lives in our metadata and
migrations without importing slack-sdk; tests/unit/test_slack_oauth_settings.py checks they stay the same.
"""

from __future__ import annotations

from sqlalchemy import Boolean, Column, DateTime, Index, Integer, String, Table

from storage.base import Base

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
