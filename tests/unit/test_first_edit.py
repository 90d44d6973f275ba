"""The status message leaves "queued" as soon as a worker holds the run, however busy the runs' event loop is
(issue 23: a thousand runs on one loop waited seconds for their first edit behind the other runs' work)."""

from __future__ import annotations

import threading
import pytest
from sqlalchemy.orm import Session, sessionmaker

from chat.message import Content, MessageRef
from storage.models import Run
from tests.attempts import worker_chat_run
from tests.fakes.messenger import RecordingMessenger
from worker.attempt import WorkerLoops

# Longest the test waits for something that should happen at once.
PATIENCE_SECONDS = 20.0


class SignallingMessenger(RecordingMessenger):
    """Records like RecordingMessenger, and says when the first edit arrives."""

    def __init__(self) -> None:
        super().__init__()
        self.edited = threading.Event()

    async def edit(self, ref: MessageRef, content: Content) -> None:
        await super().edit(ref, content)
        self.edited.set()


@pytest.fixture
def sessions(file_sessions: sessionmaker[Session]) -> sessionmaker[Session]:
    return file_sessions


@pytest.fixture
def loops(worker_loops: WorkerLoops) -> WorkerLoops:
    return worker_loops


def test_the_first_edit_is_made_while_the_runs_loop_is_still_busy(sessions: sessionmaker[Session],
                                                                   loops: WorkerLoops) -> None:
    messenger = SignallingMessenger()
    run = worker_chat_run(sessions, loops, messenger)
    release = threading.Event()

    async def busy() -> None:
        release.wait(PATIENCE_SECONDS)  # the runs' loop does nothing else until released: a burst's worth of work

    loops.runs.call(busy())
    worker = run.start(loops)
    try:
        assert messenger.edited.wait(PATIENCE_SECONDS), "the status message was not edited while the runs loop was busy"
        assert not release.is_set() and not run.model.chat_requests  # the engine has not started: its loop is held
        ref, content = messenger.edits[0]
        assert ref.message_id == "1.5" and "queued" not in content.text.lower()
    finally:
        release.set()
        worker.join(PATIENCE_SECONDS)
    assert not worker.is_alive()
    with sessions() as session:
        assert session.get_one(Run, run.run_id).state == "done"
