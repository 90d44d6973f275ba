"""Forgetting a workspace (`deepthread prune --workspace`, Slack's `app_uninstalled`) never deletes a run from under its
worker: a run in flight is stopped, its thread kept, and a later pass deletes it once the run has ended."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import fakeredis
import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner

from bot.cli import app
from storage.db import make_engine, make_session_factory
from storage.migrate import upgrade
from storage.models import Conversation, Event, Message, Run, Source
from storage.retention import PruneCounts, count_workspace, forget_workspace
from storage.shared_limits import CANCEL_FLAG

BY = "deepthread prune"


def thread(sessions: sessionmaker[Session], workspace: str, state: str, **fields: object) -> int:
    """A thread with two messages and a run in `state` with a source and an event; returns the run's id."""
    with sessions.begin() as session:
        number = session.scalar(select(func.count()).select_from(Conversation)) or 0
        conversation = Conversation(platform="slack", workspace=workspace, channel="C1", thread=f"{number}.0",
                                    created_by="slack:U0ASKER01")
        run = Run(conversation=conversation, workspace=workspace, mode="research", question="q", state=state,
                  requested_by="slack:U0ASKER01", **fields)
        session.add_all([Message(conversation=conversation, role="user", author="slack:U0ASKER01", text="q"),
                         Message(conversation=conversation, role="user", author="slack:U0BYSTAND", text="a reply"),
                         run, Source(run=run, source_id="s1", url="https://example.com/"),
                         Event(run=run, seq=1, type="progress", payload={})])
        session.flush()
        return run.id


def runs(sessions: sessionmaker[Session]) -> dict[int, tuple[str, str | None]]:
    """Every run left: its state and who stopped it."""
    with sessions() as session:
        return {run_id: (state, by) for run_id, state, by in session.execute(select(Run.id, Run.state, Run.cancelled_by))}


def ended(sessions: sessionmaker[Session], run_id: int) -> None:
    """The worker saw the cancel and stored its outcome."""
    with sessions.begin() as session:
        session.get_one(Run, run_id).state = "cancelled"


ONE_THREAD = {"conversations": 1, "messages": 2, "runs": 1, "sources": 1, "events": 1}


def test_forgetting_a_workspace_stops_its_runs_in_flight_keeps_their_threads_and_deletes_them_once_ended(
        session_factory: sessionmaker[Session]) -> None:
    finished = thread(session_factory, "T1", "done")
    running = thread(session_factory, "T1", "running", lease_owner="worker-1")
    queued = thread(session_factory, "T1", "queued", celery_task_id="task-1", lease_owner="admitted")
    elsewhere = thread(session_factory, "T2", "running", lease_owner="worker-2")

    dry = count_workspace(session_factory, "T1")
    assert dry == PruneCounts(**ONE_THREAD, kept_conversations=2, in_flight=[running, queued], running=[running])
    assert runs(session_factory)[running] == ("running", None), "counting stops nothing"

    first = forget_workspace(session_factory, "T1", by=BY)
    assert first == PruneCounts(**ONE_THREAD, batches=1, kept_conversations=2, in_flight=[running, queued],
                                running=[running])
    assert runs(session_factory) == {running: ("running", BY), queued: ("cancelled", BY),
                                     elsewhere: ("running", None)}, "its worker reads the stop on the row"
    assert finished not in runs(session_factory)

    # The queued run is cancelled now; the running one goes on until its worker sees the stop.
    second = forget_workspace(session_factory, "T1", by=BY)
    assert second == PruneCounts(**ONE_THREAD, batches=1, kept_conversations=1, in_flight=[running],
                                 running=[running])
    assert set(runs(session_factory)) == {running, elsewhere}

    ended(session_factory, running)
    assert count_workspace(session_factory, "T1") == PruneCounts(**ONE_THREAD)
    assert forget_workspace(session_factory, "T1", by=BY) == PruneCounts(**ONE_THREAD, batches=1)
    assert runs(session_factory) == {elsewhere: ("running", None)}
    with session_factory() as session:
        assert session.scalar(select(func.count()).select_from(Conversation).where(Conversation.workspace == "T1")) == 0
    assert forget_workspace(session_factory, "T1", by=BY) == PruneCounts(), "a last pass finds nothing"


@pytest.fixture
def redis_server() -> Iterator[fakeredis.FakeServer]:
    """A Redis server on a loopback port (REDIS_URL points at it); its data, to read."""
    server = fakeredis.TcpFakeServer(("127.0.0.1", 0))
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    yield server
    server.shutdown()
    server.server_close()
    serving.join()


def test_prune_workspace_reports_the_threads_it_keeps_flags_their_runs_stopped_and_deletes_them_once_ended(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis_server: fakeredis.TcpFakeServer) -> None:
    url = f"sqlite:///{tmp_path}/deepthread.db"
    monkeypatch.setenv("DATABASE_URL", url)
    host, port = redis_server.server_address[:2]
    monkeypatch.setenv("REDIS_URL", f"redis://{host!s}:{port}/0")
    engine = make_engine(url)
    upgrade(url, engine=engine)
    sessions = make_session_factory(engine)
    thread(sessions, "T0GONE", "done")
    running = thread(sessions, "T0GONE", "running", lease_owner="worker-1")
    flags = fakeredis.FakeRedis(server=redis_server.fake_server)
    runner = CliRunner()

    dry = runner.invoke(app, ["prune", "--workspace", "T0GONE", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert dry.output.splitlines() == [
        "Would delete what is stored of workspace T0GONE: 1 conversation, with 2 messages and 1 run (with 1 source, "
        "0 passages, 0 citations and 1 event).",
        "Would keep 1 conversation: a run is still in flight (1 run to stop); they are removed by "
        "`deepthread prune --workspace T0GONE` once it ends."]
    assert len(runs(sessions)) == 2, "a dry run deletes nothing"
    assert runs(sessions)[running] == ("running", None) and flags.get(CANCEL_FLAG.format(run_id=running)) is None

    done = runner.invoke(app, ["prune", "--workspace", "T0GONE"])
    assert done.exit_code == 0, done.output
    assert done.output.splitlines()[1] == ("Kept 1 conversation: a run is still in flight (1 run stopped); they are "
                                           "removed by `deepthread prune --workspace T0GONE` once it ends.")
    assert runs(sessions) == {running: ("running", BY)}
    assert flags.get(CANCEL_FLAG.format(run_id=running)) == BY.encode(), "the worker's cancel watcher reads it"

    ended(sessions, running)
    again = runner.invoke(app, ["prune", "--workspace", "T0GONE"])
    assert again.exit_code == 0, again.output
    assert again.output.splitlines() == [
        "Deleted everything stored of workspace T0GONE: 1 conversation, with 2 messages and 1 run (with 1 source, "
        "0 passages, 0 citations and 1 event)."]
    assert runs(sessions) == {}
    engine.dispose()
