"""Engines and sessions for any SQLAlchemy URL: SQLite tuned for concurrency, PostgreSQL via psycopg 3.

The rest of deepthread reaches the database through `storage`'s modules, one per aggregate; each
function takes the process's `Sessions` and is blocking, for the Celery threads and the CLI. Its
async twin, named with an `a` in front (as Django's async ORM names them), runs it in a worker
thread (`off_loop`), so an event loop keeps serving while the database answers.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import os
import sqlite3
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, ParamSpec, Self, TypeAlias, TypeVar

from sqlalchemy import CursorResult, Engine, Result, create_engine, event, false, func, select, text, update
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as ConnectionPoolTimeout
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from storage.pools import WaitSayingQueuePool

Sessions: TypeAlias = sessionmaker[Session]
"""A process's session factory: what every storage function is handed."""

P = ParamSpec("P")
R = TypeVar("R")

__all__ = ["Engine", "Sessions", "database_now", "is_transient_database_error", "make_engine",
           "make_session_factory", "off_loop", "pool_options", "pooled_engine"]


def off_loop(function: Callable[P, R]) -> Callable[P, Awaitable[R]]:
    """The async twin of a blocking storage function: it runs in a worker thread, off the calling event loop."""

    @functools.wraps(function)
    async def twin(*args: P.args, **kwargs: P.kwargs) -> R:
        return await asyncio.to_thread(function, *args, **kwargs)

    return twin


def is_transient_database_error(error: BaseException) -> bool:
    """Whether the database may well answer if asked again soon: locked (SQLite), unreachable or restarting (PostgreSQL)."""
    if isinstance(error, DBAPIError) and error.connection_invalidated:
        return True
    return isinstance(error, (OperationalError, InterfaceError, ConnectionPoolTimeout))

SQLITE_BUSY_TIMEOUT_MS = 30_000
# A session that finds every pooled connection busy waits this long for one before failing (a burst waits).
POOL_WAIT_SECONDS = 60
# Connections beyond the sized pool, for a process's background threads (reaper, cancel watcher, admission).
POOL_OVERFLOW = 16


def normalise_url(url: str) -> str:
    """Use psycopg 3 for plain `postgresql://` URLs (SQLAlchemy would pick psycopg2)."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def _ensure_sqlite_file(url: str) -> None:
    """Create a SQLite database's file (and directory) readable by this user only, before SQLite creates it with the
    umask's mode; its -wal and -shm files take the file's mode. An existing file or directory is left as it is."""
    database = make_url(url).database
    if database and database != ":memory:" and not database.startswith("file:"):
        path = os.path.abspath(database)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            pass


# pysqlite (legacy transaction control) opens a transaction implicitly before these, and only these.
_SQLITE_WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE")
_writer_locks: dict[str, threading.Lock] = {}
_writer_locks_guard = threading.Lock()


def _writer_lock(database: str) -> threading.Lock:
    with _writer_locks_guard:
        return _writer_locks.setdefault(database, threading.Lock())


class _SerialisedWriterCursor(sqlite3.Cursor):
    def execute(self, sql: str, parameters: Any = (), /) -> Self:
        with self.connection._statement(sql):  # type: ignore[attr-defined]  # made only by SerialisedWriterConnection
            return super().execute(sql, parameters)

    def executemany(self, sql: str, parameters: Any, /) -> Self:
        with self.connection._statement(sql):  # type: ignore[attr-defined]  # made only by SerialisedWriterConnection
            return super().executemany(sql, parameters)


class SerialisedWriterConnection(sqlite3.Connection):
    """A pysqlite connection whose write transactions take turns within the process.

    SQLite admits one writer at a time; a writer that finds the database locked sleeps in SQLite's
    busy handler, in steps of up to 100 ms, however soon the lock is released. Many threads of one
    process writing at once (a worker's runs recording their events) then wait for sleeps rather
    than for each other. Here a thread about to open a write transaction first takes a lock shared
    by every connection of the process to the same file, held until the transaction ends, so the
    next writer starts the moment the last one commits. Other processes still meet the busy handler.
    A writer that waits for the lock longer than the busy timeout goes ahead without it, as before.
    In-memory databases live in one connection and take no lock.
    """

    def __init__(self, database: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(database, *args, **kwargs)
        in_memory = database in ("", ":memory:") or "mode=memory" in str(database)
        self._writer_lock = None if in_memory else _writer_lock(os.path.abspath(database))
        self._holds_writer_lock = False

    # One signature for typeshed's two overloads: this connection's cursors are serialised unless asked otherwise.
    def cursor(self, factory: Any = _SerialisedWriterCursor) -> sqlite3.Cursor:  # type: ignore[override]
        return super().cursor(factory)

    @contextmanager
    def _statement(self, sql: str) -> Iterator[None]:
        """Take the writer lock before a statement that opens a write transaction."""
        if (self._writer_lock is not None and not self._holds_writer_lock and not self.in_transaction
                and sql.lstrip()[:7].upper().startswith(_SQLITE_WRITES)):
            self._holds_writer_lock = self._writer_lock.acquire(timeout=SQLITE_BUSY_TIMEOUT_MS / 1000)
        try:
            yield
        finally:
            if self._holds_writer_lock and not self.in_transaction:  # autocommitted, or the BEGIN itself failed
                self._release_writer_lock()

    def _release_writer_lock(self) -> None:
        if self._holds_writer_lock and self._writer_lock is not None:
            self._holds_writer_lock = False
            self._writer_lock.release()

    def commit(self) -> None:
        try:
            super().commit()
        finally:
            if not self.in_transaction:
                self._release_writer_lock()

    def rollback(self) -> None:
        try:
            super().rollback()
        finally:
            self._release_writer_lock()

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._release_writer_lock()


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
        _ensure_sqlite_file(url)
        connect_args = {"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000,
                        "factory": SerialisedWriterConnection}
        if parsed.database in (None, "", ":memory:"):
            options.setdefault("poolclass", StaticPool)
        options.setdefault("poolclass", WaitSayingQueuePool)
        engine = create_engine(url, connect_args=connect_args, **options)
        event.listen(engine, "connect", _tune_sqlite)
        return engine
    options.setdefault("pool_pre_ping", True)
    options.setdefault("poolclass", WaitSayingQueuePool)
    return create_engine(url, **options)


def pool_options(sessions_at_once: int, max_connections: int | None = None) -> dict[str, int]:
    """SQLAlchemy pool settings for a process whose work may hold `sessions_at_once` sessions at the same time:
    that many connections kept, POOL_OVERFLOW more for its background threads, never more than `max_connections`
    in all, and a long wait for a free one rather than a failure."""
    cap = max_connections or sessions_at_once + POOL_OVERFLOW
    pool_size = min(sessions_at_once, cap)
    return {"pool_size": pool_size, "max_overflow": min(POOL_OVERFLOW, cap - pool_size), "pool_timeout": POOL_WAIT_SECONDS}


def pooled_engine(url: str, sessions_at_once: int, max_connections: int | None = None) -> Engine:
    """An engine for a process whose runs may hold `sessions_at_once` sessions at the same time: a pooled connection
    for each, up to `max_connections` in all (an in-memory SQLite database is one shared connection, no pool)."""
    parsed = make_url(normalise_url(url))
    if parsed.get_backend_name() == "sqlite" and parsed.database in (None, "", ":memory:"):
        return make_engine(url)
    # SQLAlchemy's default pool (5 + 10 overflow) would make runs beyond 15 wait for a connection, SQLite files too.
    return make_engine(url, **pool_options(sessions_at_once, max_connections))


def database_now(session: Session) -> dt.datetime:
    """The database server's time now, in UTC: one clock for every machine that shares the database.

    Leases are written by one worker and judged by another; their own clocks may disagree. On PostgreSQL it is
    `clock_timestamp()`, not `now()`: that is when the transaction began, and a run's outcome stored after a wait for
    its row's lock and the inserts of its findings read as finished seconds before it was (a report then looked
    seconds late, and the reaper's delivery grace ran short by as much).
    """
    if session.get_bind().dialect.name == "sqlite":
        moment = session.execute(text("SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')")).scalar_one()
        return dt.datetime.fromisoformat(moment).replace(tzinfo=dt.timezone.utc)
    return session.execute(select(func.clock_timestamp())).scalar_one().astimezone(dt.timezone.utc)


def hold_write_lock(session: Session, column: Any) -> None:
    """On SQLite, take the database's write lock now and hold it until the session's transaction ends (`column`:
    any mapped column, whose table the no-op write names).

    A read takes no lock there, and FOR UPDATE means nothing, so a check read before a write could be overtaken
    by another writer in between. An UPDATE that matches no row (of `column`'s table) opens the write transaction
    at once. Other databases lock rows or keys as asked; nothing is done for them.
    """
    if session.get_bind().dialect.name == "sqlite":
        session.execute(update(column.table).where(false()).values({column.key: column})
                        .execution_options(synchronize_session=False))


def changed_rows(result: Result[Any]) -> int:
    """How many rows the UPDATE or DELETE that gave `result` changed; raises TypeError for a query's result.

    `Session.execute` is typed to return a `Result` whatever the statement; an UPDATE's or DELETE's is a
    `CursorResult`, which holds the count.
    """
    if not isinstance(result, CursorResult):
        raise TypeError(f"{type(result).__name__} is not the result of an UPDATE or DELETE")
    return result.rowcount


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    """A session factory whose objects stay readable after commit."""
    return sessionmaker(engine, expire_on_commit=False)


def reachable_backend(url: str) -> str:
    """The name of the database backend at `url` (sqlite, postgresql) once it has answered `SELECT 1`.

    Raises whatever the driver raises when the database cannot be reached.
    """
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    finally:
        engine.dispose()
    return engine.url.get_backend_name()
