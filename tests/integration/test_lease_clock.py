"""Leases follow the database's clock, not the worker's: a worker whose clock is an hour slow keeps its run.

The skew is made at the database (its clock runs an hour ahead of this machine's), so no module of ours is patched.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest
from sqlalchemy import Engine, event, text
from sqlalchemy.orm import Session, sessionmaker

from storage.db import database_now, make_engine, make_session_factory
from storage.migrate import upgrade
from storage.leases import renew_lease, take_lease
from storage.models import Conversation, Run
from worker.leases import reap
from worker.queue import Limits, Queue

pytestmark = pytest.mark.integration

LEASE_SECONDS = 30.0
DATABASE_AHEAD = dt.timedelta(hours=1)
SQLITE_NOW_FORMAT = "%Y-%m-%d %H:%M:%f"


def sqlite_clock_ahead(engine: Engine) -> None:
    """SQLite's `strftime(…, 'now')` answers an hour ahead of this machine, as a database server with its own clock."""
    def strftime_ahead(pattern: str, moment: str) -> str:
        assert (pattern, moment) == (SQLITE_NOW_FORMAT, "now"), "only the database's current time is skewed"
        ahead = dt.datetime.now(dt.timezone.utc) + DATABASE_AHEAD
        return ahead.strftime("%Y-%m-%d %H:%M:%S.") + f"{ahead.microsecond // 1000:03d}"

    event.listen(engine, "connect", lambda connection, record: connection.create_function("strftime", 2, strftime_ahead))
    engine.dispose()  # connections opened before (by the migration) keep the real clock


def postgresql_clock_ahead(engine: Engine) -> None:
    """PostgreSQL's clock (`clock_timestamp()`, and `now()`) answers an hour ahead: functions of those names earlier
    on the search path."""
    with engine.begin() as connection:
        connection.execute(text("CREATE SCHEMA IF NOT EXISTS clock_ahead"))
        for name in ("now", "clock_timestamp"):
            connection.execute(text(f"CREATE OR REPLACE FUNCTION clock_ahead.{name}() RETURNS timestamptz LANGUAGE sql "
                                    f"VOLATILE AS $$ SELECT pg_catalog.{name}() + interval '1 hour' $$"))

    def search_clock_first(connection: Any, record: Any) -> None:
        with connection.cursor() as cursor:
            cursor.execute("SET search_path = clock_ahead, public, pg_catalog")
        connection.commit()

    event.listen(engine, "connect", search_clock_first)
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path) -> str:
    return f"sqlite:///{tmp_path}/deepthread.db" if request.param == "sqlite" else request.getfixturevalue("postgres_url")


def migrated_sessions(url: str, skew_clock: bool) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(url)
    upgrade(url, engine=engine)
    if skew_clock:
        (sqlite_clock_ahead if url.startswith("sqlite") else postgresql_clock_ahead)(engine)
    yield make_session_factory(engine)
    engine.dispose()


@pytest.fixture
def sessions(database_url: str) -> Iterator[sessionmaker[Session]]:
    yield from migrated_sessions(database_url, skew_clock=False)


@pytest.fixture
def sessions_an_hour_ahead(database_url: str) -> Iterator[sessionmaker[Session]]:
    """A database whose clock runs an hour ahead of this machine's: seen from it, this worker's clock is an hour slow."""
    yield from migrated_sessions(database_url, skew_clock=True)


def admitted_run(sessions: sessionmaker[Session]) -> int:
    queue = Queue(sessions, fakeredis.FakeRedis(), Limits(5, 10), send_task=lambda *args: None)
    with sessions.begin() as session:
        conversation = Conversation(platform="slack", workspace="T1", channel="C1", thread="1.0", created_by="slack:U1")
        run = Run(conversation=conversation, workspace="T1", mode="research", question="q", requested_by="slack:U1")
        session.add(run)
        session.flush()
        run_id = run.id
    assert queue.admit() == [run_id]
    return run_id


def test_a_worker_with_a_slow_clock_holds_its_lease_by_the_databases_time(
        sessions_an_hour_ahead: sessionmaker[Session]) -> None:
    sessions = sessions_an_hour_ahead
    run_id = admitted_run(sessions)
    with sessions() as session:
        assert database_now(session) - dt.datetime.now(dt.timezone.utc) > DATABASE_AHEAD - dt.timedelta(minutes=1)
    attempt = take_lease(sessions, run_id, "slow-worker", LEASE_SECONDS)
    assert attempt == 1
    assert renew_lease(sessions, run_id, attempt, "slow-worker", LEASE_SECONDS)
    with sessions() as session:
        lease_until = session.get(Run, run_id).lease_until
        now = database_now(session)
    assert abs((lease_until - now).total_seconds() - LEASE_SECONDS) < 10
    # Another worker's reaper, with a right clock, sees a live lease and leaves the run alone.
    assert reap(sessions, send_task=lambda *args: None) == []
    with sessions() as session:
        run = session.get(Run, run_id)
        assert (run.state, run.lease_owner, run.attempt) == ("running", "slow-worker", 1)


def test_the_databases_time_is_utc_and_close_to_this_machines(sessions: sessionmaker[Session]) -> None:
    with sessions() as session:
        now = database_now(session)
    assert now.tzinfo is not None and now.utcoffset() == dt.timedelta(0)
    assert abs((now - dt.datetime.now(dt.timezone.utc)).total_seconds()) < 5
