"""Admission over the runs table: its cost follows the workspaces, not the runs waiting; Redis outages and lost task messages."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager

import fakeredis
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from sqlalchemy import Engine, event
from sqlalchemy.orm import Session, sessionmaker

from storage.models import Conversation, Run
from worker.queue import BROKER_MARK, Limits, Queue

START = dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc)


class SentTasks:
    """A `send_task` that records what it was handed, and fails while `failing` is set."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, int, str]] = []
        self.failing = False

    def __call__(self, name: str, run_id: int, task_id: str) -> None:
        if self.failing:
            raise ConnectionError("broker unreachable")
        self.sent.append((name, run_id, task_id))

    @property
    def run_ids(self) -> list[int]:
        return [run_id for _, run_id, _ in self.sent]


def add_runs(sessions: sessionmaker[Session], workspace: str, users: list[str], *, state: str = "queued",
             admitted: bool = False) -> list[int]:
    """One run per user (in this order, one second apart) in `workspace`, each in a thread of its own."""
    with sessions.begin() as session:
        runs = []
        for user in users:
            conversation = Conversation(platform="slack", workspace=workspace, channel="C1",
                                        thread=f"{workspace}-{user}-{len(runs)}-{state}", created_by=user)
            run = Run(conversation=conversation, workspace=workspace, mode="research", question="q", state=state,
                      requested_by=user, celery_task_id="task" if admitted or state == "running" else None,
                      created_at=START + dt.timedelta(seconds=len(runs)))
            session.add(run)
            runs.append(run)
        session.flush()
        return [run.id for run in runs]


@contextmanager
def counted_work(engine: Engine) -> Iterator[dict[str, int]]:
    """SQL statements sent to `engine`, and Run rows loaded into objects, while in the block."""
    counts = {"statements": 0, "runs loaded": 0}

    def statement(*_: object) -> None:
        counts["statements"] += 1

    def loaded(*_: object) -> None:
        counts["runs loaded"] += 1

    event.listen(engine, "before_cursor_execute", statement)
    event.listen(Run, "load", loaded)
    try:
        yield counts
    finally:
        event.remove(engine, "before_cursor_execute", statement)
        event.remove(Run, "load", loaded)


def cost_of_one_admission(engine: Engine, sessions: sessionmaker[Session], waiting_per_workspace: int) -> dict[str, int]:
    """An admission pass over 3 workspaces, each with 8 of its 10 slots busy and `waiting_per_workspace` runs waiting."""
    for workspace in ("T1", "T2", "T3"):
        add_runs(sessions, workspace, [f"slack:{workspace}busy{index}" for index in range(8)], state="running")
        add_runs(sessions, workspace, [f"slack:{workspace}wait{index}" for index in range(waiting_per_workspace)])
    sent = SentTasks()
    queue = Queue(sessions, fakeredis.FakeRedis(), Limits(per_user=1, per_workspace=10), sent)
    queue.redis.set(BROKER_MARK, "1")  # Redis kept its data: no lost task messages to look for
    with counted_work(engine) as counts:
        admitted = queue.admit()
    assert len(admitted) == 6  # two free slots in each workspace
    return counts


def test_an_admission_pass_costs_the_same_whatever_the_number_of_runs_waiting(
        sqlite_engine: Engine, session_factory: sessionmaker[Session]) -> None:
    few = cost_of_one_admission(sqlite_engine, session_factory, 10)
    with session_factory.begin() as session:
        session.query(Run).delete()
        session.query(Conversation).delete()
    many = cost_of_one_admission(sqlite_engine, session_factory, 100)
    assert few == many
    assert many["runs loaded"] == 6  # the heads of the queues, not the 300 runs waiting


def test_admission_takes_the_oldest_runs_each_workspace_and_each_person_may_have_in_flight(
        session_factory: sessionmaker[Session]) -> None:
    add_runs(session_factory, "T1", ["slack:A"], state="running")
    # A is at their limit, B asks twice: B's first run and C's are admitted, B's second waits for B's first.
    waiting = add_runs(session_factory, "T1", ["slack:A", "slack:B", "slack:B", "slack:C", "slack:D"])
    other = add_runs(session_factory, "T2", ["slack:E"])
    sent = SentTasks()
    queue = Queue(session_factory, fakeredis.FakeRedis(), Limits(per_user=1, per_workspace=3), sent)
    assert sorted(queue.admit()) == sorted([waiting[1], waiting[3], other[0]])
    assert sorted(sent.run_ids) == sorted([waiting[1], waiting[3], other[0]])
    assert [queue.position(run_id) for run_id in waiting] == [1, None, 2, None, 3]


def test_queue_positions_are_read_for_the_workspaces_whose_queue_moved_only(
        session_factory: sessionmaker[Session]) -> None:
    first = add_runs(session_factory, "T1", ["slack:A", "slack:B", "slack:C"])
    second = add_runs(session_factory, "T2", ["slack:D", "slack:E"])
    queue = Queue(session_factory, fakeredis.FakeRedis(), Limits(per_user=1, per_workspace=1), SentTasks())
    admitted = queue.admit()
    assert sorted(admitted) == sorted([first[0], second[0]])
    assert queue.waiting_runs([first[0]]) == [(first[1], 1), (first[2], 2)]
    assert sorted(queue.waiting_runs()) == sorted([(first[1], 1), (first[2], 2), (second[1], 1)])


def unreachable_redis() -> redis.Redis:
    from tests.fakes.server import free_port

    return redis.Redis(host="127.0.0.1", port=free_port(), socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))


def test_a_run_submitted_while_redis_is_down_stays_queued_with_its_position_and_a_later_pass_starts_it(
        session_factory: sessionmaker[Session]) -> None:
    (run_id,) = add_runs(session_factory, "T1", ["slack:A"])
    sent = SentTasks()
    assert Queue(session_factory, unreachable_redis(), Limits(1, 10), sent).submit(run_id) == 1
    assert sent.sent == []
    assert Queue(session_factory, fakeredis.FakeRedis(), Limits(1, 10), sent).admit() == [run_id]
    assert sent.run_ids == [run_id]


def test_a_run_whose_task_could_not_be_sent_waits_again_and_is_sent_by_the_next_pass(
        session_factory: sessionmaker[Session]) -> None:
    (run_id,) = add_runs(session_factory, "T1", ["slack:A"])
    sent = SentTasks()
    queue = Queue(session_factory, fakeredis.FakeRedis(), Limits(1, 10), sent)
    sent.failing = True
    assert queue.admit() == []
    assert queue.position(run_id) == 1
    sent.failing = False
    assert queue.admit() == [run_id]
    assert sent.run_ids == [run_id]


def test_admitted_runs_are_sent_again_when_redis_comes_back_without_their_task_messages(
        session_factory: sessionmaker[Session]) -> None:
    (run_id,) = add_runs(session_factory, "T1", ["slack:A"])
    server = fakeredis.FakeServer()
    sent = SentTasks()
    queue = Queue(session_factory, fakeredis.FakeRedis(server=server), Limits(1, 10), sent)
    assert queue.admit() == [run_id]
    assert queue.admit() == []
    assert sent.run_ids == [run_id]  # Redis kept its data: nothing is sent twice
    fakeredis.FakeRedis(server=server).flushall()  # a restart without persistence
    queue.admit()
    assert sent.run_ids == [run_id, run_id]
    assert sent.sent[0][2] == sent.sent[1][2]  # the same task id: a delivery that did survive is the same task
    assert fakeredis.FakeRedis(server=server).exists(BROKER_MARK)


def test_a_cancel_while_redis_is_down_is_recorded_on_the_row_without_raising(
        session_factory: sessionmaker[Session]) -> None:
    (queued,) = add_runs(session_factory, "T1", ["slack:A"])
    (running,) = add_runs(session_factory, "T1", ["slack:B"], state="running")
    queue = Queue(session_factory, unreachable_redis(), Limits(1, 10), SentTasks())
    assert queue.cancel(queued, "slack:A") == "cancelled"
    assert queue.cancel(running, "slack:B") == "running"
    with session_factory() as session:
        assert session.get(Run, running).cancelled_by == "slack:B"
        assert session.get(Run, queued).state == "cancelled"


@pytest.mark.parametrize("waiting_per_workspace", [1, 30])
def test_admission_fills_every_free_slot_when_one_person_heads_the_queue_many_times(
        session_factory: sessionmaker[Session], waiting_per_workspace: int) -> None:
    # Three runs of A at the head, then others: A gets one slot, the others the rest.
    repeated = add_runs(session_factory, "T1", ["slack:A"] * 3)
    others = add_runs(session_factory, "T1", [f"slack:U{index}" for index in range(waiting_per_workspace)])
    queue = Queue(session_factory, fakeredis.FakeRedis(), Limits(per_user=1, per_workspace=4), SentTasks())
    admitted = queue.admit()
    assert sorted(admitted) == sorted([repeated[0], *others[:3]])
