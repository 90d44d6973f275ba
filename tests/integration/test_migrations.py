from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, select
from sqlalchemy.exc import IntegrityError

from storage.db import make_engine, make_session_factory
from storage.migrate import current_revision, downgrade, upgrade
from storage.models import Base, Citation, Conversation, Event, Passage, Run, Source

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
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        differences = compare_metadata(context, Base.metadata)
    engine.dispose()
    assert differences == []


def test_an_empty_database_is_built_at_the_newest_revision_as_the_migrations_would_build_it(
        database_url: str) -> None:
    engine = make_engine(database_url)
    upgrade(database_url, engine=engine)
    built = current_revision(engine)
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
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
