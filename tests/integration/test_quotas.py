"""The daily quotas' SQL and the queue cap's on the migrated schema, on SQLite and on a real PostgreSQL."""

from __future__ import annotations

import datetime as dt
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from storage.conversations import NewRun, QueueFull, ThreadKey, store_run
from storage.models import Conversation, Event, Run
from storage.quotas import DailyQuotas, QuotaReached, quota_reached, runs_started_since, workspace_cost_since

pytestmark = pytest.mark.integration

NOW = dt.datetime(2030, 5, 1, 20, 48, tzinfo=dt.timezone.utc)
MIDNIGHT = dt.datetime(2030, 5, 1, tzinfo=dt.timezone.utc)
TOMORROW = MIDNIGHT + dt.timedelta(days=1)


def store_runs(sessions: sessionmaker[Session]) -> None:
    """Alice's and Bob's runs in T1 and T2, today and just before midnight, with their LLM costs as events."""
    rows = [  # (user, workspace, created_at, state, started, costs)
        ("alice", "T1", MIDNIGHT + dt.timedelta(hours=1), "done", True, (0.5, 1.25)),
        ("alice", "T1", MIDNIGHT, "failed", True, (0.25,)),
        ("alice", "T2", MIDNIGHT + dt.timedelta(hours=9), "running", True, (2.0,)),
        ("alice", "T1", MIDNIGHT + dt.timedelta(hours=10), "cancelled", False, ()),
        ("alice", "T1", MIDNIGHT - dt.timedelta(microseconds=1), "done", True, (40.0,)),
        ("bob", "T1", MIDNIGHT + dt.timedelta(hours=2), "queued", False, ()),
        ("bob", "T1", MIDNIGHT + dt.timedelta(hours=3), "done", True, (1.0,)),
    ]
    with sessions.begin() as session:
        for index, (user, workspace, created_at, state, started, costs) in enumerate(rows):
            conversation = Conversation(platform="slack", workspace=workspace, channel="C", thread=f"{index}.0",
                                        created_by=user, created_at=created_at)
            run = Run(conversation=conversation, workspace=workspace, mode="research", question="q", state=state,
                      requested_by=user, created_at=created_at, started_at=created_at if started else None)
            session.add(run)
            session.add(Event(run=run, seq=1, type="phase_started", phase="search", payload={"cost": 99.0},
                              at=created_at))
            session.add_all([Event(run=run, seq=seq, type="llm_usage", phase="synthesize", at=created_at,
                                   payload={"model": "m", "prompt_tokens": 1, "completion_tokens": 1, "cost": cost})
                             for seq, cost in enumerate(costs, start=2)])


def test_runs_and_cost_of_the_day_are_counted_in_sql(sessions: sessionmaker[Session]) -> None:
    store_runs(sessions)
    with sessions() as session:
        assert runs_started_since(session, "alice", MIDNIGHT) == 3  # not the cancelled-unstarted one nor yesterday's
        assert runs_started_since(session, "bob", MIDNIGHT) == 2  # a queued run counts: it was started today
        assert workspace_cost_since(session, "T1", MIDNIGHT) == pytest.approx(3.0)
        assert workspace_cost_since(session, "T2", MIDNIGHT) == pytest.approx(2.0)
        assert workspace_cost_since(session, "T3", MIDNIGHT) == 0.0


def test_quota_reached_names_the_first_limit_broken_and_the_next_midnight(sessions: sessionmaker[Session]) -> None:
    store_runs(sessions)
    with sessions() as session:
        assert quota_reached(session, DailyQuotas(runs_per_user=3), user="alice", workspace="T1", now=NOW) == \
            QuotaReached(limit="runs_per_user", used=3, allowed=3, resets_at=TOMORROW)
        assert quota_reached(session, DailyQuotas(runs_per_user=4, cost_per_workspace=3.0), user="alice",
                             workspace="T1", now=NOW) == \
            QuotaReached(limit="cost_per_workspace", used=3.0, allowed=3.0, resets_at=TOMORROW)
        assert quota_reached(session, DailyQuotas(runs_per_user=3, cost_per_workspace=3.0), user="bob",
                             workspace="T2", now=NOW) is None
        assert quota_reached(session, DailyQuotas(), user="alice", workspace="T1", now=NOW) is None


def test_a_burst_of_one_persons_runs_stops_at_the_queue_cap(sessions: sessionmaker[Session]) -> None:
    """Twelve threads store a run of the same person at the same moment: the count and the insert are one step,
    so exactly `max_waiting` are stored and the rest are refused with the number found waiting."""
    burst, cap = 12, 3
    start = threading.Barrier(burst)

    def store(number: int) -> int | QueueFull:
        new = NewRun(key=ThreadKey("slack", "T1", "C1", f"burst.{number}"), mode="research", question="q",
                     requested_by="slack:U0ALICE01")
        start.wait()
        try:
            return store_run(sessions, new, max_waiting=cap)
        except QueueFull as full:
            return full

    with ThreadPoolExecutor(max_workers=burst) as pool:
        outcomes = list(pool.map(store, range(burst)))
    stored = [outcome for outcome in outcomes if isinstance(outcome, int)]
    refused = [outcome for outcome in outcomes if isinstance(outcome, QueueFull)]
    assert len(stored) == cap and len(refused) == burst - cap
    assert {full.waiting for full in refused} == {cap}
    with sessions() as session:
        assert session.scalar(select(func.count()).select_from(Run)) == cap
    # Another person is not held back by Alice's cap.
    other = NewRun(key=ThreadKey("slack", "T1", "C1", "bob.1"), mode="research", question="q", requested_by="bob")
    assert isinstance(store_run(sessions, other, max_waiting=cap), int)


def test_a_burst_of_many_peoples_runs_stops_at_the_workspace_queue_cap(sessions: sessionmaker[Session]) -> None:
    """Twelve people store a run in one workspace at the same moment: the workspace's count and the insert are one
    step too, so exactly `max_waiting_in_workspace` are stored, and another workspace is not held back."""
    burst, cap = 12, 5
    start = threading.Barrier(burst)

    def store(number: int) -> int | QueueFull:
        new = NewRun(key=ThreadKey("slack", "T1", "C1", f"burst.{number}"), mode="research", question="q",
                     requested_by=f"slack:U0PERSON{number:02d}")
        start.wait()
        try:
            return store_run(sessions, new, max_waiting=3, max_waiting_in_workspace=cap)
        except QueueFull as full:
            return full

    with ThreadPoolExecutor(max_workers=burst) as pool:
        outcomes = list(pool.map(store, range(burst)))
    refused = [outcome for outcome in outcomes if isinstance(outcome, QueueFull)]
    assert len(refused) == burst - cap
    assert {(full.scope, full.waiting) for full in refused} == {("workspace", cap)}
    with sessions() as session:
        assert session.scalar(select(func.count()).select_from(Run)) == cap
    elsewhere = NewRun(key=ThreadKey("slack", "T2", "C1", "t2.1"), mode="research", question="q", requested_by="carol")
    assert isinstance(store_run(sessions, elsewhere, max_waiting=3, max_waiting_in_workspace=cap), int)
