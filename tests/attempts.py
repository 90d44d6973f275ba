"""Stored runs for tests of attempts: one as admission leaves it, one run to its end as the terminal runs it
(take its lease as a new attempt, then execute), and a chat run as a worker runs it."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import httpx
from sqlalchemy.orm import Session, sessionmaker

from chat.message import Messenger
from chat.slack.render import SlackRenderer
from chat.state import RunProgress
from research.budget import ResearchOptions
from research.engine import ResearchTools
from research.llm import LLMClient
from research.providers import SearchConfig
from storage.leases import ADMITTED, START_GRACE_SECONDS
from storage.models import Conversation, Run
from storage.vocabulary import RunMode
from tests.fakes.llm import FakeLLM
from tests.fakes.resolver import DictResolver
from worker.attempt import RunAttempt, WorkerLoops
from worker.cancels import CancelWatcher
from worker.delivery import DeliveryTarget, RunDelivery
from worker.leases import LeaseKeeper
from worker.progress import InMemoryEditBucket
from worker.runner import RunnerServices


async def execute_stored(run_id: int, services: RunnerServices, **execute: Any) -> RunProgress | None:
    """Run `run_id`'s new attempt with `execute`'s arguments (on_state, cancel, on_text); None when it cannot start."""
    attempt = await RunAttempt.start(run_id, services)
    return None if attempt is None else await attempt.execute(**execute)


def admitted_run(sessions: sessionmaker[Session], *, mode: RunMode = "research", thread: str = "1.0",
                 question: str = "Why is the sea salty?") -> int:
    """A stored run as admission leaves it: marked admitted under a task id, its start grace running."""
    with sessions.begin() as session:
        conversation = Conversation(platform="slack", workspace="T1", channel="C1", thread=thread, created_by="slack:U1")
        run = Run(conversation=conversation, workspace="T1", mode=mode, question=question, requested_by="slack:U1",
                  celery_task_id="task-1", lease_owner=ADMITTED,
                  lease_until=dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=START_GRACE_SECONDS))
        session.add(run)
        session.flush()
        return run.id


class WorkerChatRun(NamedTuple):
    """A chat run with a Slack status message, its attempt started with a delivery as a worker starts it, and how to
    run that attempt in a worker's thread."""

    run_id: int
    attempt: RunAttempt
    model: FakeLLM
    start: Callable[[WorkerLoops], threading.Thread]  # runs `attempt.run_in_worker` in a new thread, started


def worker_chat_run(sessions: sessionmaker[Session], loops: WorkerLoops, messenger: Messenger, *,
                    leases: LeaseKeeper | None = None) -> WorkerChatRun:
    """A chat run as a worker executes it: answered by a fake model, shown through `messenger` on Slack's renderer,
    with every status edit made (no minimum interval, an ample budget); `leases`: the worker's lease keeper."""
    run_id = admitted_run(sessions, mode="chat")
    with sessions.begin() as session:
        session.get_one(Run, run_id).status_message = {"platform": "slack", "workspace": "T1", "channel": "C1",
                                                       "message_id": "1.5", "thread": "1.0"}
    model = FakeLLM(lambda request: "Rivers carry dissolved salts to the sea, and evaporation leaves them behind.")
    nowhere = httpx.AsyncClient(transport=httpx.MockTransport(lambda request: httpx.Response(404)))
    tools = ResearchTools(llm=LLMClient(model.config(), http_client=model.http_client()), search_config=SearchConfig(),
                          search_http=nowhere, resolver=DictResolver({}))
    services = RunnerServices(sessions=sessions, tools=tools, options=ResearchOptions(), leases=leases)
    target = DeliveryTarget.load(sessions, run_id)
    assert target is not None
    delivery = RunDelivery(sessions, target, messenger=messenger,
                           renderer=SlackRenderer(), bucket=InMemoryEditBucket(), min_interval=0.0)
    attempt = loops.runs.run(RunAttempt.start(run_id, services, delivery=delivery))
    assert attempt is not None

    async def close() -> None:
        await tools.llm.aclose()

    def start(loops: WorkerLoops) -> threading.Thread:
        worker = threading.Thread(target=attempt.run_in_worker, args=(loops,),
                                  kwargs={"cancels": CancelWatcher(lambda run_ids: {}, lambda run_ids: {}),
                                          "answer_draft": None, "close": close})
        worker.start()
        return worker

    return WorkerChatRun(run_id, attempt, model, start)
