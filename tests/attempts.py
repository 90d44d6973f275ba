"""Stored runs for tests of attempts: one as admission leaves it, and one run to its end as the terminal runs it
(take its lease as a new attempt, then execute)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from chat.state import RunProgress
from storage.leases import ADMITTED, START_GRACE_SECONDS
from storage.models import Conversation, Run
from storage.vocabulary import RunMode
from worker.attempt import RunAttempt
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
