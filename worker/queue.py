"""Admission and submission: the Run rows are the queue, Celery only carries the run id.

The one worker module the bot imports. `submit()` admits the oldest queued runs that the fairness
limits allow (per user, per workspace) and sends their tasks by name; `cancel()` stops a run,
queued or running. Admission is serialised across processes by a Redis lock, and on PostgreSQL
the queued rows are also locked with SKIP LOCKED.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis
from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from storage.db import database_now
from storage.models import Run
from storage.shared_limits import set_cancel_flag

logger = logging.getLogger(__name__)

QUEUE_NAME = "deepthread"
TASK_BY_MODE = {"research": "deepthread.research", "plan": "deepthread.plan", "chat": "deepthread.chat",
                "followup": "deepthread.chat"}
ADMISSION_LOCK = "deepthread:lock:admission"
# An admitted run whose task has not started within this time is sent again by the reaper.
START_GRACE_SECONDS = 120
ADMITTED = "admitted"
RESUBMITTED = "resubmitted"

SendTask = Callable[[str, int, str], None]


@dataclass(frozen=True)
class Limits:
    per_user: int
    per_workspace: int


def in_flight(run: Any = Run) -> Any:
    """SQL condition: a run that holds a fairness slot (running, or admitted and about to start)."""
    return or_(run.state == "running", and_(run.state == "queued", run.celery_task_id.is_not(None)))


def waiting(run: Any = Run) -> Any:
    """SQL condition: a queued run not admitted yet."""
    return and_(run.state == "queued", run.celery_task_id.is_(None))


class Queue:
    """Admission over the runs table; `send_task(name, run_id, task_id)` hands a run to Celery."""

    def __init__(self, sessions: sessionmaker[Session], redis_client: redis.Redis, limits: Limits,
                 send_task: SendTask) -> None:
        self.sessions = sessions
        self.redis = redis_client
        self.limits = limits
        self.send_task = send_task

    def submit(self, run_id: int) -> int | None:
        """Admit what the limits allow; returns the run's queue position, or None when it was admitted."""
        self.admit()
        return self.position(run_id)

    def admit(self) -> list[int]:
        """Send the tasks of the oldest queued runs the limits allow; returns their ids."""
        # The lock outlives SQLite's 30 s busy timeout, so it cannot expire while admission still runs.
        with self.redis.lock(ADMISSION_LOCK, timeout=120, blocking_timeout=60):
            admitted = self._admit_locked()
        for run_id, mode, task_id in admitted:
            try:
                self.send_task(TASK_BY_MODE[mode], run_id, task_id)
            except Exception:  # the reaper sends it again once its start grace has passed
                logger.warning("could not send run %s to the workers", run_id, exc_info=True)
        return [run_id for run_id, _, _ in admitted]

    def _admit_locked(self) -> list[tuple[int, str, str]]:
        with self.sessions.begin() as session:
            busy_users = dict(session.execute(
                select(Run.requested_by, func.count()).where(in_flight()).group_by(Run.requested_by)).all())
            busy_workspaces = dict(session.execute(
                select(Run.workspace, func.count()).where(in_flight()).group_by(Run.workspace)).all())
            candidates = select(Run).where(waiting()).order_by(Run.created_at, Run.id)
            if session.get_bind().dialect.name == "postgresql":
                candidates = candidates.with_for_update(skip_locked=True)
            admitted: list[tuple[int, str, str]] = []
            now = database_now(session)  # the clock every worker's reaper judges the start grace by
            for run in session.scalars(candidates):
                if busy_users.get(run.requested_by, 0) >= self.limits.per_user:
                    continue
                if busy_workspaces.get(run.workspace, 0) >= self.limits.per_workspace:
                    continue
                run.celery_task_id = uuid.uuid4().hex
                run.lease_owner = ADMITTED
                run.lease_until = now + dt.timedelta(seconds=START_GRACE_SECONDS)
                busy_users[run.requested_by] = busy_users.get(run.requested_by, 0) + 1
                busy_workspaces[run.workspace] = busy_workspaces.get(run.workspace, 0) + 1
                admitted.append((run.id, run.mode, run.celery_task_id))
            return admitted

    def position(self, run_id: int) -> int | None:
        """1 for the next waiting run in its workspace, 2 for the one after…; None once admitted or ended."""
        with self.sessions() as session:
            run = session.get(Run, run_id)
            if run is None or run.state != "queued" or run.celery_task_id is not None:
                return None
            ahead = session.scalar(select(func.count()).select_from(Run).where(
                waiting(), Run.workspace == run.workspace,
                or_(Run.created_at < run.created_at, and_(Run.created_at == run.created_at, Run.id < run.id))))
            return (ahead or 0) + 1

    def waiting_runs(self) -> Sequence[tuple[int, int]]:
        """(run id, position) of every waiting run, for refreshing their status messages."""
        with self.sessions() as session:
            rows = session.execute(select(Run.id, Run.workspace).where(waiting()).order_by(Run.created_at, Run.id)).all()
        positions: dict[str, int] = {}
        result = []
        for run_id, workspace in rows:
            positions[workspace] = positions.get(workspace, 0) + 1
            result.append((run_id, positions[workspace]))
        return result

    def cancel(self, run_id: int, by: str) -> str | None:
        """Stop a run: a queued one is cancelled at once, a running one is flagged; returns the new state."""
        set_cancel_flag(self.redis, run_id, by)
        with self.sessions.begin() as session:
            cancelled_queued = session.execute(
                update(Run).where(Run.id == run_id, Run.state == "queued")
                .values(state="cancelled", cancelled_by=by, finished_at=database_now(session), lease_owner=None,
                        lease_until=None)
            ).rowcount
            if cancelled_queued:
                return "cancelled"
            session.execute(update(Run).where(Run.id == run_id, Run.state == "running", Run.cancelled_by.is_(None))
                            .values(cancelled_by=by))
            run = session.get(Run, run_id)
            return run.state if run is not None else None


def celery_sender(settings: Any) -> SendTask:
    """A `send_task` that hands runs to the workers by task name over the configured broker."""
    from celery import Celery

    from storage.redis import celery_broker_url, resolve_redis_url

    sender = Celery("deepthread-sender", set_as_current=False)
    sender.conf.broker_url = celery_broker_url(resolve_redis_url(settings.redis_url, settings.data_dir))
    sender.conf.broker_connection_retry_on_startup = True

    def send(name: str, run_id: int, task_id: str) -> None:
        sender.send_task(name, args=[run_id], task_id=task_id, queue=QUEUE_NAME)

    return send
