"""A run's events: folded into progress at once, stored in batches, a terminal event stored at once, a stale attempt's refused."""

from __future__ import annotations

import asyncio

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from chat.state import RunProgress
from research.events import Complete, PhaseStarted, Progress
from storage.models import Conversation, Event, Run
from worker.runner import RunRecorder


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


def test_events_are_shown_at_once_and_stored_together_shortly_after(session_factory) -> None:
    run = running_run(session_factory)
    shown: list[RunProgress] = []

    async def record() -> tuple[list[int], list[int]]:
        async def on_state(progress: RunProgress) -> None:
            shown.append(progress)

        recorder = RunRecorder(session_factory, run, on_state, write_delay=0.1)
        await recorder(PhaseStarted(seq=1, phase="search"))
        await recorder(Progress(seq=2, phase="search", counts={"queries": 1}))
        await recorder(Progress(seq=3, phase="search", counts={"queries": 2}))
        before = stored_seqs(session_factory, run.id)
        await asyncio.sleep(0.3)
        return before, stored_seqs(session_factory, run.id)

    before, after = asyncio.run(record())
    assert [progress.last_seq for progress in shown] == [1, 2, 3]
    assert before == [] and after == [1, 2, 3]


def test_a_terminal_event_stores_everything_at_once(session_factory) -> None:
    run = running_run(session_factory)

    async def record() -> list[int]:
        recorder = RunRecorder(session_factory, run, None, write_delay=60.0)
        await recorder(PhaseStarted(seq=1, phase="search"))
        await recorder(Complete(seq=2))
        return stored_seqs(session_factory, run.id)

    assert asyncio.run(record()) == [1, 2]


def test_flush_stores_what_is_pending_and_a_newer_attempts_run_refuses_the_old_ones_events(session_factory) -> None:
    run = running_run(session_factory)

    async def record() -> tuple[list[int], list[int]]:
        recorder = RunRecorder(session_factory, run, None, write_delay=60.0)
        await recorder(PhaseStarted(seq=1, phase="search"))
        recorder.flush()
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

    def begin():
        if broken["on"]:
            raise RuntimeError("database is locked")
        return real_begin()

    async def record() -> list[int]:
        recorder = RunRecorder(session_factory, run, None, write_delay=0.05)
        monkeypatch.setattr(session_factory, "begin", begin)
        await recorder(PhaseStarted(seq=1, phase="search"))
        await asyncio.sleep(0.2)  # the batched write fails and is logged
        broken["on"] = False
        await recorder(Complete(seq=2))
        return stored_seqs(session_factory, run.id)

    assert asyncio.run(record()) == [1, 2]
    with session_factory() as session:
        assert session.scalar(select(func.count()).select_from(Event)) == 2
