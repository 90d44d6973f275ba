"""The status message leaves "queued" as soon as a worker holds the run, however busy the runs' event loop is
(issue 23: a thousand runs on one loop waited seconds for their first edit behind the other runs' work)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy.orm import Session, sessionmaker

from chat.message import Content, MessageRef
from chat.slack.render import SlackRenderer
from research.budget import ResearchOptions
from research.engine import ResearchTools
from research.llm import LLMClient
from research.providers import SearchConfig
from storage.models import Run
from tests.attempts import admitted_run
from tests.fakes.llm import FakeLLM
from tests.fakes.messenger import RecordingMessenger
from tests.fakes.resolver import DictResolver
from worker.attempt import RunAttempt, WorkerLoops
from worker.cancels import CancelWatcher
from worker.delivery import DeliveryTarget, RunDelivery
from worker.loop import RunLoop
from worker.progress import InMemoryEditBucket
from worker.runner import RunnerServices

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
def loops() -> Iterator[WorkerLoops]:
    both = WorkerLoops(runs=RunLoop(blocking_threads=4, name="test-runs"),
                       delivery=RunLoop(blocking_threads=4, name="test-delivery"))
    yield both
    both.runs.stop()
    both.delivery.stop()


def test_the_first_edit_is_made_while_the_runs_loop_is_still_busy(sessions: sessionmaker[Session],
                                                                   loops: WorkerLoops) -> None:
    run_id = admitted_run(sessions, mode="chat")
    with sessions.begin() as session:
        session.get_one(Run, run_id).status_message = {"platform": "slack", "workspace": "T1", "channel": "C1",
                                                       "message_id": "1.5", "thread": "1.0"}
    model = FakeLLM(lambda request: "Rivers carry dissolved salts to the sea, and evaporation leaves them behind.")
    nowhere = httpx.AsyncClient(transport=httpx.MockTransport(lambda request: httpx.Response(404)))
    tools = ResearchTools(llm=LLMClient(model.config(), http_client=model.http_client()), search_config=SearchConfig(),
                          search_http=nowhere, resolver=DictResolver({}))
    services = RunnerServices(sessions=sessions, tools=tools, options=ResearchOptions())
    messenger = SignallingMessenger()
    delivery = RunDelivery(sessions, DeliveryTarget.load(sessions, run_id), messenger=messenger,
                           renderer=SlackRenderer(), bucket=InMemoryEditBucket(), min_interval=0.0)
    attempt = loops.runs.run(RunAttempt.start(run_id, services, delivery=delivery))
    assert attempt is not None

    release = threading.Event()

    async def busy() -> None:
        release.wait(PATIENCE_SECONDS)  # the runs' loop does nothing else until released: a burst's worth of work

    loops.runs.call(busy())
    cancels = CancelWatcher(lambda run_ids: {}, lambda run_ids: {})

    async def close() -> None:
        await tools.llm.aclose()

    worker = threading.Thread(target=attempt.run_in_worker, args=(loops,),
                              kwargs={"cancels": cancels, "answer_draft": None, "close": close})
    worker.start()
    try:
        assert messenger.edited.wait(PATIENCE_SECONDS), "the status message was not edited while the runs loop was busy"
        assert not release.is_set() and not model.chat_requests  # the engine has not started: its loop is held
        ref, content = messenger.edits[0]
        assert ref.message_id == "1.5" and "queued" not in content.text.lower()
    finally:
        release.set()
        worker.join(PATIENCE_SECONDS)
    assert not worker.is_alive()
    with sessions() as session:
        assert session.get_one(Run, run_id).state == "done"
