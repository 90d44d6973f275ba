"""Engines and sessions for any SQLAlchemy URL: SQLite tuned for concurrency, PostgreSQL via psycopg 3."""

from __future__ import annotations

import os
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

SQLITE_BUSY_TIMEOUT_MS = 30_000


def normalise_url(url: str) -> str:
    """Use psycopg 3 for plain `postgresql://` URLs (SQLAlchemy would pick psycopg2)."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def _ensure_sqlite_directory(url: str) -> None:
    database = make_url(url).database
    if database and database != ":memory:" and not database.startswith("file:"):
        directory = os.path.dirname(os.path.abspath(database))
        os.makedirs(directory, exist_ok=True)


def _tune_sqlite(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def make_engine(url: str, **options: Any) -> Engine:
    """An Engine for `url`; SQLite gets WAL, a busy timeout and foreign keys on every connection."""
    url = normalise_url(url)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        _ensure_sqlite_directory(url)
        connect_args = {"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}
        if parsed.database in (None, "", ":memory:"):
            options.setdefault("poolclass", StaticPool)
        engine = create_engine(url, connect_args=connect_args, **options)
        event.listen(engine, "connect", _tune_sqlite)
        return engine
    options.setdefault("pool_pre_ping", True)
    return create_engine(url, **options)


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    """A session factory whose objects stay readable after commit."""
    return sessionmaker(engine, expire_on_commit=False)
