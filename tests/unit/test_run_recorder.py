"""A run's events: folded into progress at once, stored in batches, a terminal event stored at once, a stale attempt's refused."""

from __future__ import annotations

import asyncio
import datetime as dt
import sqlite3
from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy import event, func, select, update
from sqlalchemy.orm import Session, sessionmaker

from chat.state import RunProgress
from research.budget import ResearchOptions
from research.engine import ResearchTools
from research.events import Complete, PhaseStarted, Progress
from research.llm import LLMClient
from research.providers import SearchConfig
from storage.db import make_engine, make_session_factory
from storage.models import Base, Conversation, Event, Run
from tests.attempts import admitted_run
from tests.fakes.llm import ChatRequest, FakeLLM, HandlerResult, default_research_model
from tests.fakes.resolver import DictResolver
from tests.waiting import eventually
from worker.leases import reap
from tests.attempts import execute_stored
from worker.runner import RunnerServices, RunRecorder


def running_run(sessions: sessionmaker[Session]) -> Run:
    with sessions.begin() as session:
        conversation = Conversation(platform="slack", workspace="T1", channel="C1", thread="1.0", created_by="slack:U1")
        run = Run(conversation=conversation, workspace="T1", mode="research", question="q", requested_by="slack:U1",
                  state="running", attempt=1)
        session.add(run)
        session.flush()
        session.expunge(run)
        return run


def stored_seqs(sessions: sessionmaker[Session], run_id: int) -> list[int]:
    with sessions() as session:
        return list(session.scalars(select(Event.seq).where(Event.run_id == run_id).order_by(Event.seq)))


def test_events_are_shown_at_once_and_stored_together_shortly_after(sqlite_file) -> None:
    # A file, not the one shared in-memory connection: the batched write runs in a thread while this test reads.
    session_factory, _path = sqlite_file
    run = running_run(session_factory)
    shown: list[RunProgress] = []
    delays: list[float] = []

    async def record() -> tuple[list[int], list[int]]:
        delay_over = asyncio.Event()

        async def on_state(progress: RunProgress) -> None:
            shown.append(progress)

        async def sleep(seconds: float) -> None:
            delays.append(seconds)
            await delay_over.wait()

        recorder = RunRecorder(session_factory, run, on_state, write_delay=0.1, sleep=sleep)
        await recorder(PhaseStarted(seq=1, phase="search"))
        await recorder(Progress(seq=2, phase="search", counts={"queries": 1}))
        await recorder(Progress(seq=3, phase="search", counts={"queries": 2}))
        before = stored_seqs(session_factory, run.id)
        delay_over.set()
        await eventually(lambda: stored_seqs(session_factory, run.id) != [], "the batched write", 5, interval=0.01)
        return before, stored_seqs(session_factory, run.id)

    before, after = asyncio.run(record())
    assert [progress.last_seq for progress in shown] == [1, 2, 3]
    assert delays == [0.1]  # one batched write for the three events
    assert before == [] and after == [1, 2, 3]


def test_a_terminal_event_stores_everything_at_once(session_factory) -> None:
    run = running_run(session_factory)

    async def record() -> list[int]:
        recorder = RunRecorder(session_factory, run, None, write_delay=60.0)
        await recorder(PhaseStarted(seq=1, phase="search"))
        await recorder(Complete(seq=2))
        return stored_seqs(session_factory, run.id)

    assert asyncio.run(record()) == [1, 2]


def test_a_write_stores_what_is_pending_and_a_newer_attempts_run_refuses_the_old_ones_events(session_factory) -> None:
    run = running_run(session_factory)

    async def record() -> tuple[list[int], list[int]]:
        recorder = RunRecorder(session_factory, run, None, write_delay=60.0)
        await recorder(PhaseStarted(seq=1, phase="search"))
        recorder.write_unwritten()
        flushed = stored_seqs(session_factory, run.id)
        with session_factory.begin() as session:  # the run passes to a new attempt
            session.execute(update(Run).where(Run.id == run.id).values(attempt=2))
        await recorder(Complete(seq=2))
        return flushed, stored_seqs(session_factory, run.id)

    flushed, final = asyncio.run(record())
    assert flushed == [1] and final == [1]


def test_events_a_failed_write_could_not_store_are_kept_for_the_next(session_factory, monkeypatch) -> None:
    run = running_run(session_factory)
    broken = {"on": True}
    real_begin = session_factory.begin

    failed_writes: list[bool] = []

    def begin():
        if broken["on"]:
            failed_writes.append(True)
            raise RuntimeError("database is locked")
        return real_begin()

    async def record() -> list[int]:
        async def no_wait(seconds: float) -> None:
            pass

        recorder = RunRecorder(session_factory, run, None, write_delay=0.05, sleep=no_wait)
        monkeypatch.setattr(session_factory, "begin", begin)
        await recorder(PhaseStarted(seq=1, phase="search"))
        await eventually(lambda: failed_writes, "the batched write to fail and be logged", 5, interval=0.01)
        broken["on"] = False
        await recorder(Complete(seq=2))
        return stored_seqs(session_factory, run.id)

    assert asyncio.run(record()) == [1, 2]
    with session_factory() as session:
        assert session.scalar(select(func.count()).select_from(Event)) == 2


# -- the finished run's outcome, stored through a briefly locked database -----------------------------------

LOCK_WAIT_MS = 10  # SQLite's busy wait here: the production 30 s, scaled down


@pytest.fixture
def sqlite_file(tmp_path) -> Iterator[tuple[sessionmaker[Session], str]]:
    """A SQLite file whose connections give up on a lock after LOCK_WAIT_MS, and its path."""
    path = str(tmp_path / "deepthread.db")
    engine = make_engine(f"sqlite:///{path}")
    event.listen(engine, "connect", lambda connection, _: connection.execute(f"PRAGMA busy_timeout={LOCK_WAIT_MS}"))
    Base.metadata.create_all(engine)
    yield make_session_factory(engine), path
    engine.dispose()


class DatabaseLock:
    """Another process's write transaction (`BEGIN EXCLUSIVE`) held on the file until released."""

    def __init__(self, path: str) -> None:
        self.connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.held = False

    def take(self) -> None:
        self.connection.execute("BEGIN EXCLUSIVE")
        self.held = True

    def release(self) -> None:
        if self.held:
            self.connection.execute("COMMIT")
            self.held = False


def locking_model(lock: DatabaseLock, answers: list[str]) -> FakeLLM:
    """A model that answers, and the first time, takes the database lock just before: the run finishes into it."""
    def answer(request: ChatRequest) -> HandlerResult:
        if not answers:
            lock.take()
        answers.append("answered")
        return default_research_model(request)

    return FakeLLM(answer)


def chat_services(sessions: sessionmaker[Session], model: FakeLLM, sleep) -> RunnerServices:
    nowhere = httpx.AsyncClient(transport=httpx.MockTransport(lambda request: httpx.Response(404)))
    tools = ResearchTools(llm=LLMClient(model.config(), http_client=model.http_client()), search_config=SearchConfig(),
                          search_http=nowhere, resolver=DictResolver({}))
    return RunnerServices(sessions=sessions, tools=tools, options=ResearchOptions(), store_retry_delays=(1.0, 2.0, 4.0),
                          sleep=sleep)


def test_a_run_finishing_into_a_locked_database_stores_its_answer_once_the_lock_is_released(sqlite_file) -> None:
    sessions, path = sqlite_file
    run_id = admitted_run(sessions, mode="chat", question="How do tides work?")
    lock, waits = DatabaseLock(path), []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        lock.release()  # the other writer commits while we wait

    final = asyncio.run(execute_stored(run_id, chat_services(sessions, locking_model(lock, []), sleep)))
    assert waits == [1.0], "the first store met the lock and was tried again"
    assert final is not None and final.state == "done"
    with sessions() as session:
        run = session.get(Run, run_id)
        assert run.state == "done" and run.error is None and "tides" in run.report_json["question"]
        assert [event.type for event in run.events][-1] == "complete"


def test_a_run_whose_outcome_cannot_be_stored_is_not_failed_and_the_reapers_next_attempt_finishes_it(sqlite_file) -> None:
    sessions, path = sqlite_file
    run_id = admitted_run(sessions, mode="chat", question="How do tides work?")
    lock, waits, answers = DatabaseLock(path), [], []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)  # the lock outlasts every try

    services = chat_services(sessions, locking_model(lock, answers), sleep)
    assert asyncio.run(execute_stored(run_id, services)) is None
    assert waits == [1.0, 2.0, 4.0]
    lock.release()
    with sessions() as session:
        run = session.get(Run, run_id)
        assert run.state == "running" and run.error is None and run.report_json is None, "no lie, no lost report"
        lease_until = run.lease_until

    assert reap(sessions, lambda *task: None, now=lease_until + dt.timedelta(seconds=1)) == [run_id]
    final = asyncio.run(execute_stored(run_id, services))
    assert final is not None and final.state == "done" and len(answers) == 2
    with sessions() as session:
        run = session.get(Run, run_id)
        assert (run.state, run.attempt, run.error) == ("done", 2, None) and run.report_json is not None


def test_events_are_written_in_longer_batches_while_the_process_is_overloaded(session_factory) -> None:
    # At a thousand runs a worker spent an eighth of its time writing events four times a second per run.
    run = running_run(session_factory)
    overloaded = [False]
    delays: list[float] = []

    async def record() -> None:
        async def sleep(seconds: float) -> None:
            delays.append(seconds)

        recorder = RunRecorder(session_factory, run, None, write_delay=0.25, sleep=sleep,
                               overloaded=lambda: overloaded[0], overloaded_write_delay=1.0)
        await recorder(PhaseStarted(seq=1, phase="search"))
        await asyncio.sleep(0)  # the batch's wait is over: the next event starts another
        overloaded[0] = True
        await recorder(Progress(seq=2, phase="search", counts={"queries": 1}))
        await asyncio.sleep(0)
        await recorder(Complete(seq=3))

    asyncio.run(record())
    assert delays == [0.25, 1.0]
    assert stored_seqs(session_factory, run.id) == [1, 2, 3]
