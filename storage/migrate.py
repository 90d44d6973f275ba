"""Alembic migrations, driven from code so `deepthread migrate` works for any DATABASE_URL."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, inspect

from storage.db import make_engine, normalise_url
from storage.models import Base

MIGRATIONS = Path(__file__).parent / "migrations"


def alembic_config(url: str, engine: Engine | None = None) -> Config:
    """An Alembic Config pointing at our scripts and at `url` (or an open engine)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", normalise_url(url).replace("%", "%%"))
    config.attributes["engine"] = engine
    return config


@contextmanager
def _sqlite_file_lock(engine: Engine) -> Iterator[None]:
    """Processes starting together on one SQLite file migrate one at a time."""
    database = engine.url.database
    if engine.url.get_backend_name() != "sqlite" or not database or database == ":memory:":
        yield
        return
    with open(os.path.abspath(database) + ".migrate.lock", "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def upgrade(url: str, revision: str = "head", *, engine: Engine | None = None, build_empty: bool = True) -> None:
    """Upgrade the database at `url` to `revision`.

    An empty database asked for the newest revision is built from the models in one step and stamped with it
    (Alembic's way to build a new database), rather than taken through every migration: on SQLite each one
    that alters a table copies it, and a fresh `deepthread research` paid for all of them before its first step.
    `build_empty=False` always runs the migrations (the test that the models and the migrations agree does).
    """
    engine = engine or make_engine(url)
    config = alembic_config(url, engine)
    with _sqlite_file_lock(engine):
        if build_empty and revision == "head" and not inspect(engine).get_table_names():
            Base.metadata.create_all(engine)
            command.stamp(config, "head")
        else:
            command.upgrade(config, revision)


def downgrade(url: str, revision: str = "base", *, engine: Engine | None = None) -> None:
    """Downgrade the database at `url` to `revision`."""
    engine = engine or make_engine(url)
    command.downgrade(alembic_config(url, engine), revision)


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at, or None when it has none."""
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()
