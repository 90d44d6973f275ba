"""OAuth mode's settings and schema: when it is on, what it asks Slack for, and that our copy of slack-sdk's tables
matches the tables slack-sdk's installation store queries (but for the secret columns, text to hold them encrypted)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import yaml
from sqlalchemy import MetaData, Table, Text

from bot.slack.bundle import configured, doctor, missing_adapter_setting, oauth_mode
from config import load_settings
from storage.installations import SECRET_COLUMNS, slack_bots, slack_installations

ROOT = Path(__file__).resolve().parents[2]
OAUTH = {"slack_bot_token": "", "slack_app_token": "", "slack_client_id": "1111.2222", "slack_client_secret": "shh",
         "slack_signing_secret": "signing"}


def table_shape(table: Table, *, secrets_as_text: bool = False) -> dict[str, object]:
    def type_of(name: str, column_type: object) -> str:
        return repr(Text()) if secrets_as_text and name in SECRET_COLUMNS else repr(column_type)

    return {
        "columns": [(column.name, type_of(column.name, column.type), column.nullable, column.primary_key)
                    for column in table.columns],
        "indexes": sorted((index.name, tuple(column.name for column in index.columns)) for index in table.indexes),
    }


def test_our_tables_are_the_ones_slack_sdk_s_store_queries_with_the_secrets_as_text() -> None:
    from slack_sdk.oauth.installation_store.sqlalchemy import SQLAlchemyInstallationStore

    theirs = MetaData()
    assert table_shape(slack_installations) == table_shape(
        SQLAlchemyInstallationStore.build_installations_table(theirs, slack_installations.name), secrets_as_text=True)
    assert table_shape(slack_bots) == table_shape(SQLAlchemyInstallationStore.build_bots_table(theirs, slack_bots.name),
                                                  secrets_as_text=True)


def test_the_install_asks_for_the_manifest_s_bot_scopes() -> None:
    from bot.slack.oauth import BOT_SCOPES

    manifest = yaml.safe_load((ROOT / "slack" / "manifest.yml").read_text())
    assert sorted(BOT_SCOPES) == sorted(manifest["oauth_config"]["scopes"]["bot"])
    assert {"app_uninstalled", "tokens_revoked"} <= set(manifest["settings"]["event_subscriptions"]["bot_events"])


def test_client_id_and_secret_configure_slack_without_a_bot_token() -> None:
    settings = load_settings(**OAUTH)
    assert oauth_mode(settings) and configured(settings) and missing_adapter_setting(settings) is None
    assert not oauth_mode(load_settings(**{**OAUTH, "slack_client_secret": ""}))
    assert not configured(load_settings(slack_bot_token="", slack_client_id="", slack_client_secret=""))


def test_oauth_installs_need_http_mode() -> None:
    problem = missing_adapter_setting(load_settings(**{**OAUTH, "slack_app_token": "xapp-1"}))
    assert problem is not None and "SLACK_APP_TOKEN" in problem


def test_doctor_reports_oauth_mode_as_configured() -> None:
    with httpx.Client(transport=httpx.MockTransport(lambda request: pytest.fail("OAuth mode has no token to test"))) as http:
        check = doctor(load_settings(**OAUTH), http)
    assert check.status == "ok" and "/slack/install" in check.detail


def test_deepthread_slack_if_configured_starts_in_oauth_mode_without_a_bot_token(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from bot.cli import app

    for name, value in {**OAUTH, "slack_signing_secret": ""}.items():
        monkeypatch.setenv(name.upper(), value)
    result = CliRunner().invoke(app, ["slack", "--if-configured"])
    # Past the --if-configured check: it stops on the next setting HTTP mode needs, before serving anything.
    assert result.exit_code == 2 and "SLACK_SIGNING_SECRET" in result.output, result.output
