"""The Slack tokens of OAuth installs are stored encrypted with DEEPTHREAD_SECRET_KEY: what the tables hold, key
rotation, the start-up check of the processes that read tokens, and the key's setting."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from cryptography.fernet import Fernet, InvalidToken
from sqlalchemy import Engine, select
from typer.testing import CliRunner

from config import SettingsError, load_settings
from storage.db import make_engine, make_session_factory
from storage.encryption import TokenCipher, token_cipher
from storage.installations import (
    SECRET_COLUMNS,
    bot_of_workspace,
    find_bot,
    find_installation,
    installation_store,
    save_installation,
    slack_bots,
    slack_installations,
    token_key_problem,
)
from storage.migrate import upgrade

CLIENT_ID = "1111.2222"
TEAM = "T0TEAM"
BOT_TOKEN = "xoxb-1111-2222-abcdefghijklmnopqrstuvwx"
USER_TOKEN = "xoxp-1111-2222-3333-abcdefghijklmnopqrstuvwxyz012345"
REFRESH_TOKEN = "xoxe-1-" + "r" * 150  # rotating tokens' refresh tokens are long: encrypted, longer than 200 characters
WEBHOOK = "https://hooks.slack.com/services/T0TEAM/B0HOOK/abcdefghijklmnopqrstuvwx"
PLAIN_SECRETS = {BOT_TOKEN, USER_TOKEN, REFRESH_TOKEN, WEBHOOK}
OLD_KEY, NEW_KEY = Fernet.generate_key().decode(), Fernet.generate_key().decode()
OAUTH = {"slack_bot_token": "", "slack_app_token": "", "slack_client_id": CLIENT_ID, "slack_client_secret": "shh",
         "slack_signing_secret": "signing"}


@pytest.fixture
def database(tmp_path: Path) -> tuple[str, Engine]:
    url = f"sqlite:///{tmp_path}/deepthread.db"
    engine = make_engine(url)
    upgrade(url, engine=engine)
    return url, engine


def install(engine: Engine, cipher: TokenCipher, team_id: str = TEAM, installed_at: float = 1_700_000_000.0) -> None:
    """What the OAuth flow stores: an installation with every kind of secret, and its bot."""
    from slack_sdk.oauth.installation_store.models.installation import Installation

    store = installation_store(engine, CLIENT_ID, cipher, logger=logging.getLogger(__name__))
    save_installation(store, Installation(
        app_id="A0APP", team_id=team_id, team_name="Team", bot_token=BOT_TOKEN, bot_id="B0BOT", bot_user_id="U0BOT",
        bot_scopes="commands,chat:write", bot_refresh_token=REFRESH_TOKEN, bot_token_expires_in=43_200,
        user_id="U0INSTALLER", user_token=USER_TOKEN, user_refresh_token=REFRESH_TOKEN, user_token_expires_in=43_200,
        incoming_webhook_url=WEBHOOK, incoming_webhook_channel="#general", installed_at=installed_at))


def stored_secrets(engine: Engine) -> list[str]:
    """Every value of a secret column, as the database holds it."""
    values: list[str] = []
    with engine.connect() as connection:
        for table in (slack_installations, slack_bots):
            secrets = [column for column in table.columns if column.name in SECRET_COLUMNS]
            for row in connection.execute(select(*secrets)):
                values.extend(value for value in row if value is not None)
    return values


def read_with(engine: Engine, cipher: TokenCipher) -> tuple[str | None, str | None, str | None, str | None]:
    """The bot token, user token, refresh token and webhook URL, as the app reads them through the store."""
    store = installation_store(engine, CLIENT_ID, cipher, logger=logging.getLogger(__name__))
    installation = find_installation(store, enterprise_id=None, team_id=TEAM)
    bot = find_bot(store, enterprise_id=None, team_id=TEAM)
    assert installation is not None and bot is not None
    assert bot.bot_token == installation.bot_token and bot.bot_refresh_token == installation.bot_refresh_token
    workspace_bot = bot_of_workspace(store, TEAM)
    assert workspace_bot is not None and workspace_bot.bot_token == bot.bot_token
    return (installation.bot_token, installation.user_token, installation.user_refresh_token,
            installation.incoming_webhook_url)


def cipher_of(*keys: str) -> TokenCipher:
    cipher = token_cipher(",".join(keys))
    assert cipher is not None
    return cipher


def test_an_installation_s_tokens_are_stored_encrypted_and_read_back_in_plain_text(database: tuple[str, Engine]) -> None:
    _, engine = database
    install(engine, cipher_of(NEW_KEY))
    stored = stored_secrets(engine)
    assert len(stored) == 7  # the installation's bot, user and refresh tokens and webhook; the bot's token and refresh
    for value in stored:
        assert "xox" not in value and "hooks.slack.com" not in value, "a secret is stored readable"
    assert {Fernet(NEW_KEY).decrypt(value.encode()).decode() for value in stored} == PLAIN_SECRETS
    assert read_with(engine, cipher_of(NEW_KEY)) == (BOT_TOKEN, USER_TOKEN, REFRESH_TOKEN, WEBHOOK)


def test_a_rotated_key_reads_the_old_key_s_rows_and_migrate_encrypts_them_again_with_the_new_one(
        database: tuple[str, Engine], monkeypatch: pytest.MonkeyPatch) -> None:
    from bot.cli import app

    url, engine = database
    install(engine, cipher_of(OLD_KEY))
    assert read_with(engine, cipher_of(NEW_KEY, OLD_KEY)) == (BOT_TOKEN, USER_TOKEN, REFRESH_TOKEN, WEBHOOK)
    monkeypatch.setenv("DATABASE_URL", url)
    monkeypatch.setenv("DEEPTHREAD_SECRET_KEY", f"{NEW_KEY},{OLD_KEY}")

    migrated = CliRunner().invoke(app, ["migrate"])

    assert migrated.exit_code == 0, migrated.output
    assert "7 stored Slack secrets encrypted with the first DEEPTHREAD_SECRET_KEY" in migrated.output
    for value in stored_secrets(engine):
        with pytest.raises(InvalidToken):
            Fernet(OLD_KEY).decrypt(value.encode())
        assert Fernet(NEW_KEY).decrypt(value.encode()).decode() in PLAIN_SECRETS
    assert read_with(engine, cipher_of(NEW_KEY)) == (BOT_TOKEN, USER_TOKEN, REFRESH_TOKEN, WEBHOOK), "the old key can go"
    again = upgrade(url, engine=engine, token_cipher=cipher_of(NEW_KEY, OLD_KEY))
    assert again is not None and again.renewed == 0, "values the first key encrypted are left alone"


def test_migrate_says_so_when_a_stored_token_cannot_be_read_with_any_key(
        database: tuple[str, Engine], monkeypatch: pytest.MonkeyPatch) -> None:
    from bot.cli import app

    url, engine = database
    install(engine, cipher_of(OLD_KEY))
    monkeypatch.setenv("DATABASE_URL", url)
    monkeypatch.setenv("DEEPTHREAD_SECRET_KEY", NEW_KEY)  # the old key dropped too soon

    migrated = CliRunner().invoke(app, ["migrate"])

    assert migrated.exit_code == 1 and "7 stored Slack secrets cannot be read" in migrated.output, migrated.output
    assert read_with(engine, cipher_of(OLD_KEY))[0] == BOT_TOKEN, "left as they were"


def test_the_start_up_check_names_the_key_in_one_line_when_it_is_missing_or_cannot_read_the_tokens(
        database: tuple[str, Engine]) -> None:
    _, engine = database
    sessions = make_session_factory(engine)
    assert token_key_problem(sessions, None) is not None, "OAuth installs need the key before the first install"
    install(engine, cipher_of(OLD_KEY))

    missing = token_key_problem(sessions, None)
    wrong = token_key_problem(sessions, cipher_of(NEW_KEY))

    for problem in (missing, wrong):
        assert problem is not None and "DEEPTHREAD_SECRET_KEY" in problem and "\n" not in problem
        assert OLD_KEY not in problem and NEW_KEY not in problem
    assert missing is not None and "holds Slack installations" in missing
    assert token_key_problem(sessions, cipher_of(NEW_KEY, OLD_KEY)) is None
    with pytest.raises(SettingsError, match="DEEPTHREAD_SECRET_KEY cannot decrypt") as refused:
        read_with(engine, cipher_of(NEW_KEY))
    assert BOT_TOKEN not in str(refused.value)


def test_the_key_setting_takes_a_comma_list_of_fernet_keys_and_never_echoes_a_bad_one() -> None:
    assert load_settings(deepthread_secret_key=f"{NEW_KEY}, {OLD_KEY}").secret("deepthread_secret_key")
    with pytest.raises(SettingsError) as refused:
        load_settings(deepthread_secret_key=f"{NEW_KEY},not-a-key-at-all")
    assert str(refused.value).startswith("Invalid setting DEEPTHREAD_SECRET_KEY: must be Fernet keys")
    assert "not-a-key-at-all" not in str(refused.value) and NEW_KEY not in str(refused.value)
    assert NEW_KEY not in repr(load_settings(deepthread_secret_key=NEW_KEY))


# --- start-up of the processes that read tokens ----------------------------------------------------------


def configure(monkeypatch: pytest.MonkeyPatch, url: str, **settings: str) -> list[list[str]]:
    """The environment of a deployment; the Celery worker's entry point replaced by one that records its start."""
    import worker.tasks as tasks

    for name, value in settings.items():
        monkeypatch.setenv(name.upper(), value)
    monkeypatch.setenv("DATABASE_URL", url)
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:9/0")  # never connected to: the worker stops before Celery runs
    monkeypatch.setenv("LLM_MODEL", "m")
    started: list[list[str]] = []
    monkeypatch.setattr(tasks, "_settings", None)
    monkeypatch.setattr(tasks.app, "worker_main", lambda argv: started.append(argv))
    monkeypatch.setattr(tasks.app.conf, "broker_url", tasks.app.conf.broker_url)
    return started


@pytest.mark.parametrize("command", [["worker"], ["slack"]])
def test_the_worker_and_the_slack_app_refuse_to_start_in_one_line_when_installations_exist_and_the_key_is_missing(
        database: tuple[str, Engine], monkeypatch: pytest.MonkeyPatch, command: list[str]) -> None:
    from bot.cli import app

    url, engine = database
    install(engine, cipher_of(OLD_KEY))
    started = configure(monkeypatch, url, **OAUTH)

    result = CliRunner().invoke(app, command)

    assert result.exit_code == 2, f"exit code {result.exit_code}, Celery started {len(started)} times: {result.output}"
    assert result.output.strip().splitlines() == [
        "DEEPTHREAD_SECRET_KEY is required: the database holds Slack installations, whose tokens are stored encrypted "
        "with it (the README says how to make one)"]
    assert started == []


def test_the_worker_starts_with_the_key_and_a_single_workspace_needs_none(
        database: tuple[str, Engine], monkeypatch: pytest.MonkeyPatch) -> None:
    from bot.cli import app

    url, engine = database
    install(engine, cipher_of(OLD_KEY))
    started = configure(monkeypatch, url, **OAUTH, deepthread_secret_key=f"{NEW_KEY},{OLD_KEY}")
    assert CliRunner().invoke(app, ["worker"]).exit_code == 0 and len(started) == 1
    assert all(Fernet(NEW_KEY).decrypt(value.encode()) for value in stored_secrets(engine)), "start-up re-encrypts"

    monkeypatch.delenv("DEEPTHREAD_SECRET_KEY")
    for name in OAUTH:
        monkeypatch.delenv(name.upper())
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-one-workspace")
    assert CliRunner().invoke(app, ["worker"]).exit_code == 0 and len(started) == 2


def test_the_installation_store_refuses_to_be_built_without_the_key(database: tuple[str, Engine]) -> None:
    from bot.slack.bundle import installation_store as bundle_store

    _, engine = database
    with pytest.raises(SettingsError, match="DEEPTHREAD_SECRET_KEY is required for OAuth installs"):
        bundle_store(load_settings(**OAUTH), engine)
    assert bundle_store(load_settings(**OAUTH, deepthread_secret_key=NEW_KEY), engine).store is not None


def test_an_installation_saved_again_keeps_its_tokens_encrypted(database: tuple[str, Engine]) -> None:
    _, engine = database
    install(engine, cipher_of(NEW_KEY))
    install(engine, cipher_of(NEW_KEY))  # the same install time again: slack-sdk updates the rows instead of adding
    with engine.connect() as connection:
        assert len(connection.execute(select(slack_installations.c.id)).all()) == 1
        assert len(connection.execute(select(slack_bots.c.id)).all()) == 1
    assert {Fernet(NEW_KEY).decrypt(value.encode()).decode() for value in stored_secrets(engine)} == PLAIN_SECRETS
