"""Alembic migrations, driven from code so `deepthread migrate` works for any DATABASE_URL.

Every process upgrades its database as it starts. A database already at the newest revision (`HEAD_REVISION`), or a
new one, which is built from the models and stamped with it, needs nothing of Alembic: Alembic is imported only to
migrate (it loads Mako and Pygments, half a second of a `deepthread research` on a 2-core machine).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from typing import TYPE_CHECKING

from sqlalchemy import Column, Connection, Engine, MetaData, PrimaryKeyConstraint, String, Table, inspect, select

from storage.db import make_engine, normalise_url
from storage.encryption import TokenCipher
from storage.installations import StoredTokens, encrypt_stored_tokens
from storage.models import Base

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS = Path(__file__).parent / "migrations"
# The newest migration's revision (tests/integration/test_migrations.py checks it is Alembic's head).
HEAD_REVISION = "0010"
# Alembic's own table of the revision a database is at, as Alembic creates it.
_ALEMBIC_VERSION = Table("alembic_version", MetaData(), Column("version_num", String(32), nullable=False),
                         PrimaryKeyConstraint("version_num", name="alembic_version_pkc"))


def alembic_config(url: str, engine: Engine | None = None) -> Config:
    """An Alembic Config pointing at our scripts and at `url` (or an open engine)."""
    from alembic.config import Config

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


def upgrade(url: str, revision: str = "head", *, engine: Engine | None = None, build_empty: bool = True,
            token_cipher: TokenCipher | None = None) -> StoredTokens | None:
    """Upgrade the database at `url` to `revision`; with `token_cipher` (DEEPTHREAD_SECRET_KEY) and the newest
    revision, then encrypt with its first key the stored Slack tokens that are not yet (`encrypt_stored_tokens`, whose
    counts are returned).

    An empty database asked for the newest revision is built from the models in one step and stamped with it
    (Alembic's way to build a new database), rather than taken through every migration: on SQLite each one
    that alters a table copies it, and a fresh `deepthread research` paid for all of them before its first step.
    `build_empty=False` always runs the migrations (the test that the models and the migrations agree does).
    """
    engine = engine or make_engine(url)
    with _sqlite_file_lock(engine):
        tables = inspect(engine).get_table_names()
        if build_empty and revision == "head" and not tables:
            with engine.begin() as connection:
                Base.metadata.create_all(connection)
                _stamp(connection, HEAD_REVISION)
        elif revision != "head" or _revisions(engine, tables) != [HEAD_REVISION]:
            from alembic import command

            command.upgrade(alembic_config(url, engine), revision)
        if token_cipher is not None and revision == "head":
            return encrypt_stored_tokens(engine, token_cipher)
    return None


def _revisions(engine: Engine, tables: list[str]) -> list[str]:
    """The revisions Alembic's table says the database is at (none for a database without it)."""
    if _ALEMBIC_VERSION.name not in tables:
        return []
    with engine.connect() as connection:
        return list(connection.scalars(select(_ALEMBIC_VERSION.c.version_num)))


def _stamp(connection: Connection, revision: str) -> None:
    """Record that the database is at `revision`, as `alembic stamp` does on a database that has no revision yet."""
    _ALEMBIC_VERSION.create(connection)
    connection.execute(_ALEMBIC_VERSION.insert().values(version_num=revision))


def downgrade(url: str, revision: str = "base", *, engine: Engine | None = None) -> None:
    """Downgrade the database at `url` to `revision`."""
    from alembic import command

    engine = engine or make_engine(url)
    command.downgrade(alembic_config(url, engine), revision)


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at, or None when it has none."""
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()
