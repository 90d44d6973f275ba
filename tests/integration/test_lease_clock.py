"""Leases follow the database's clock, not the worker's: a worker whose clock is an hour slow keeps its run."""

from __future__ import annotations

import datetime as dt
import sys

import fakeredis
import pytest
from sqlalchemy.orm import Session, sessionmaker

from storage.db import database_now, make_engine, make_session_factory
from storage.migrate import upgrade
from storage.models import Conversation, Run
from worker.leases import reap, renew_lease, take_lease
from worker.queue import Limits, Queue

pytestmark = pytest.mark.integration

LEASE_SECONDS = 30.0


@pytest.fixture(params=["sqlite", "postgresql"])
def sessions(request: pytest.FixtureRequest, tmp_path) -> sessionmaker[Session]:
    url = f"sqlite:///{tmp_path}/deepthread.db" if request.param == "sqlite" else request.getfixturevalue("postgres_url")
    engine = make_engine(url)
    upgrade(url, engine=engine)
    yield make_session_factory(engine)
    engine.dispose()


def slow_clock(monkeypatch: pytest.MonkeyPatch, behind: dt.timedelta) -> None:
    """Every `utcnow` of deepthread's storage and worker code now answers `behind` late, as on a machine with a slow clock."""
    real = dt.datetime.now

    def late() -> dt.datetime:
        return real(dt.timezone.utc) - behind

    for name, module in list(sys.modules.items()):
        if name.split(".")[0] in ("storage", "worker") and hasattr(module, "utcnow"):
            monkeypatch.setattr(module, "utcnow", late)


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
    sessions: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = admitted_run(sessions)
    with monkeypatch.context() as patched:
        slow_clock(patched, dt.timedelta(hours=1))
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
