"""A worker's status edits and posts check that their attempt still owns the run without a query while the attempt's
lease is kept (and lately renewed) or its outcome stored (issue 23: at a thousand runs, one query per status edit
crowded the database's threads and delayed reports by seconds). An attempt that does not know asks the database:
`tests/unit/test_delivery.py::test_a_stale_attempt_cannot_deliver`."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy.orm import Session, sessionmaker

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
from worker import delivery as delivery_module
from worker.attempt import RunAttempt, WorkerLoops
from worker.cancels import CancelWatcher
from worker.delivery import DeliveryTarget, RunDelivery
from worker.leases import LeaseKeeper
from worker.loop import RunLoop
from worker.progress import InMemoryEditBucket
from worker.runner import RunnerServices

PATIENCE_SECONDS = 20.0


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


@pytest.mark.parametrize("process_keeper", [True, False], ids=["worker's keeper", "the attempt's own keeper"])
def test_an_attempt_holding_its_lease_edits_and_posts_without_asking_the_database_whether_it_owns_the_run(
        sessions: sessionmaker[Session], loops: WorkerLoops, monkeypatch: pytest.MonkeyPatch,
        process_keeper: bool) -> None:
    asked: list[int] = []
    ask = delivery_module.ais_current_attempt

    async def counted(sessions_: object, run_id: int, attempt: int) -> bool:
        asked.append(attempt)
        return await ask(sessions_, run_id, attempt)  # type: ignore[arg-type]

    monkeypatch.setattr(delivery_module, "ais_current_attempt", counted)
    run_id = admitted_run(sessions, mode="chat")
    with sessions.begin() as session:
        session.get_one(Run, run_id).status_message = {"platform": "slack", "workspace": "T1", "channel": "C1",
                                                       "message_id": "1.5", "thread": "1.0"}
    model = FakeLLM(lambda request: "Rivers carry dissolved salts to the sea, and evaporation leaves them behind.")
    nowhere = httpx.AsyncClient(transport=httpx.MockTransport(lambda request: httpx.Response(404)))
    tools = ResearchTools(llm=LLMClient(model.config(), http_client=model.http_client()), search_config=SearchConfig(),
                          search_http=nowhere, resolver=DictResolver({}))
    keeper = LeaseKeeper(sessions, 30.0) if process_keeper else None
    services = RunnerServices(sessions=sessions, tools=tools, options=ResearchOptions(), leases=keeper)
    messenger = RecordingMessenger()
    delivery = RunDelivery(sessions, DeliveryTarget.load(sessions, run_id), messenger=messenger,
                           renderer=SlackRenderer(), bucket=InMemoryEditBucket(), min_interval=0.0)
    attempt = loops.runs.run(RunAttempt.start(run_id, services, delivery=delivery))
    assert attempt is not None

    async def close() -> None:
        await tools.llm.aclose()

    worker = threading.Thread(target=attempt.run_in_worker, args=(loops,),
                              kwargs={"cancels": CancelWatcher(lambda run_ids: {}, lambda run_ids: {}),
                                      "answer_draft": None, "close": close})
    worker.start()
    worker.join(PATIENCE_SECONDS)
    if keeper is not None:
        keeper.stop()
    assert not worker.is_alive()
    with sessions() as session:
        run = session.get_one(Run, run_id)
        assert run.state == "done" and run.delivered_at is not None
    assert len(messenger.edits) >= 3, "the first state, the engine's, and the final one were shown"
    assert any("evaporation" in content.text for _, content, _ in messenger.posts), "the answer was posted"
    assert asked == []
