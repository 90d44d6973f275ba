from __future__ import annotations

import datetime as dt
import subprocess
import sys
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, select
from sqlalchemy.exc import IntegrityError

from storage.conversations import NewRun, ThreadBusy, ThreadKey, store_run
from storage.db import make_engine, make_session_factory
from storage.migrate import HEAD_REVISION, alembic_config, current_revision, downgrade, upgrade
from storage.models import Base, Citation, Conversation, Event, Passage, Run, Source, compared_by_alembic

pytestmark = pytest.mark.integration

TABLES = {"conversations", "messages", "runs", "sources", "passages", "citations", "events"}


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/deepthread.db"
    return request.getfixturevalue("postgres_url")


def test_upgrade_downgrade_upgrade_round_trip(database_url: str) -> None:
    engine = make_engine(database_url)
    upgrade(database_url, engine=engine, build_empty=False)
    assert TABLES <= set(inspect(engine).get_table_names())
    assert current_revision(engine) is not None
    downgrade(database_url, "base", engine=engine)
    assert not TABLES & set(inspect(engine).get_table_names())
    assert current_revision(engine) is None
    upgrade(database_url, engine=engine, build_empty=False)
    assert TABLES <= set(inspect(engine).get_table_names())
    engine.dispose()


def test_models_and_migrations_do_not_drift(database_url: str) -> None:
    engine = make_engine(database_url)
    upgrade(database_url, engine=engine, build_empty=False)
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True,
                                                               "include_object": compared_by_alembic})
        differences = compare_metadata(context, Base.metadata)
    engine.dispose()
    assert differences == []


def test_the_newest_revision_known_without_alembic_is_alembic_s_head() -> None:
    # A new migration must move HEAD_REVISION too, or databases at the old head would be left unmigrated.
    assert ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head() == HEAD_REVISION


def test_a_new_database_and_one_at_the_newest_revision_are_opened_without_alembic(database_url: str) -> None:
    # Alembic (with Mako and Pygments) was half a second of every `deepthread research` before its first step.
    script = (
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})\n"
        "from storage.migrate import current_revision, upgrade\n"
        "from storage.db import make_engine\n"
        f"engine = make_engine({database_url!r})\n"
        "upgrade(engine.url.render_as_string(hide_password=False), engine=engine)\n"
        "print(current_revision(engine) if 'alembic' in sys.modules else 'no alembic')\n"
    )

    def opened() -> str:
        finished = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
        assert finished.returncode == 0, finished.stderr[-2000:]
        return finished.stdout.strip()

    assert opened() == "no alembic"  # a new database: built from the models and stamped
    assert opened() == "no alembic"  # at the newest revision: nothing to do
    engine = make_engine(database_url)
    assert current_revision(engine) == HEAD_REVISION
    downgrade(database_url, "0007", engine=engine)
    engine.dispose()
    assert opened() == HEAD_REVISION  # an older one is migrated, by Alembic


def test_an_empty_database_is_built_at_the_newest_revision_as_the_migrations_would_build_it(
        database_url: str) -> None:
    engine = make_engine(database_url)
    upgrade(database_url, engine=engine)
    built = current_revision(engine)
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True,
                                                               "include_object": compared_by_alembic})
        assert compare_metadata(context, Base.metadata) == []
    indexes = {table: {(index["name"], tuple(index["column_names"])) for index in inspect(engine).get_indexes(table)}
               for table in inspect(engine).get_table_names()}
    downgrade(database_url, "base", engine=engine)  # the stamped database migrates down like a migrated one
    upgrade(database_url, engine=engine, build_empty=False)
    assert current_revision(engine) == built
    migrated = {table: {(index["name"], tuple(index["column_names"])) for index in inspect(engine).get_indexes(table)}
                for table in inspect(engine).get_table_names()}
    assert indexes == migrated
    engine.dispose()


def test_migrated_schema_cascades_and_enforces_uniqueness(database_url: str) -> None:
    engine = make_engine(database_url)
    upgrade(database_url, engine=engine)
    sessions = make_session_factory(engine)
    with sessions() as session:
        conversation = Conversation(platform="slack", workspace="T", channel="C", thread="1.0", created_by="U")
        run = Run(conversation=conversation, workspace="T", mode="research", question="q", requested_by="U")
        source = Source(run=run, source_id="s1", url="https://example.com")
        passage = Passage(run=run, source=source, passage_id="p1", text="t", start=0, end=1)
        session.add_all([run, source, passage, Citation(run=run, passage=passage, sentence="s", verdict="supported"),
                         Event(run=run, seq=1, type="complete", payload={})])
        session.commit()
        session.add(Event(run=run, seq=1, type="progress", payload={}))
        with pytest.raises(IntegrityError):
            session.commit()
        session.rollback()
    with engine.begin() as connection:
        connection.execute(Run.__table__.delete())
    with sessions() as session:
        for model in (Source, Passage, Citation, Event):
            assert session.scalars(select(model)).all() == []
    engine.dispose()


def test_deepthread_migrate_command_upgrades_any_database_url(database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from bot.cli import app

    monkeypatch.setenv("DATABASE_URL", database_url)
    result = CliRunner().invoke(app, ["migrate"])
    assert result.exit_code == 0, result.output
    engine = make_engine(database_url)
    assert TABLES <= set(inspect(engine).get_table_names())
    engine.dispose()


def test_tokens_stored_before_the_key_was_set_are_encrypted_by_the_migration_and_read_back(database_url: str) -> None:
    import logging

    from cryptography.fernet import Fernet

    from storage.encryption import TokenCipher
    from storage.installations import find_installation, installation_store, slack_bots, slack_installations

    engine = make_engine(database_url)
    upgrade(database_url, "0007", engine=engine, build_empty=False)
    bot_token, refresh_token = "xoxb-1-2-plain", "xoxe-1-" + "r" * 190  # encrypted, far longer than the old 200
    installed = {"client_id": "1.2", "app_id": "A1", "team_id": "T1", "is_enterprise_install": False,
                 "installed_at": dt.datetime(2026, 1, 1), "bot_token": bot_token}
    with engine.begin() as connection:
        connection.execute(slack_installations.insert().values(**installed, user_id="U1", user_token="xoxp-plain"))
        connection.execute(slack_bots.insert().values(**installed))
    key = Fernet.generate_key().decode()
    cipher = TokenCipher([key])

    assert upgrade(database_url, engine=engine, token_cipher=cipher) == (3, 0)  # two tokens installed, one in the bot
    with engine.begin() as connection:
        stored = [value for table in (slack_installations, slack_bots)
                  for value in connection.execute(select(table.c.bot_token)).scalars()]
        stored.extend(connection.execute(select(slack_installations.c.user_token)).scalars())
        connection.execute(slack_installations.update().values(user_refresh_token=cipher.encrypt(refresh_token)))
    assert len(stored) == 3 and not any(value.startswith("xox") for value in stored)
    store = installation_store(engine, "1.2", cipher, logger=logging.getLogger(__name__))
    found = find_installation(store, enterprise_id=None, team_id="T1", user_id="U1")
    assert found is not None and (found.bot_token, found.user_token) == (bot_token, "xoxp-plain")
    assert found.user_refresh_token == refresh_token
    engine.dispose()


@pytest.mark.parametrize("built", [True, False], ids=["built from the models", "migrated"])
def test_a_thread_holds_one_run_in_flight_however_its_database_was_made(database_url: str, built: bool) -> None:
    engine = make_engine(database_url)
    upgrade(database_url, engine=engine, build_empty=built)
    sessions = make_session_factory(engine)
    key = ThreadKey("slack", "T1", "C1", "1.1")
    first = store_run(sessions, NewRun(key=key, mode="research", question="first?", requested_by="slack:U1"))
    with pytest.raises(ThreadBusy):
        store_run(sessions, NewRun(key=key, mode="research", question="second?", requested_by="slack:U1"))
    with sessions.begin() as session:
        session.get_one(Run, first).state = "done"
    store_run(sessions, NewRun(key=key, mode="research", question="second?", requested_by="slack:U1"))
    engine.dispose()
