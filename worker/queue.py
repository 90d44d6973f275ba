"""Admission and submission: the Run rows are the queue, Celery only carries the run id.

The one worker module the bot imports. `submit()` admits the oldest queued runs that the fairness
limits allow (per user, per workspace) and sends their tasks by name; `cancel()` stops a run,
queued or running. Admission is serialised across processes by a Redis lock, and on PostgreSQL
the queued rows are also locked with SKIP LOCKED. An admission pass reads the head of each
workspace's queue only, so its cost grows with the workspaces, not with the runs waiting.

With Redis unreachable a run stays queued (its row is the queue) and a later pass starts it; a
pass that finds Redis emptied (restarted without its data) sends again the admitted runs whose
task messages it lost (a second delivery finds the first attempt's lease and exits).
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import redis
from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from storage.db import database_now
from storage.models import Run
from storage.shared_limits import REDIS_ERRORS, set_cancel_flag
from storage.vocabulary import ACTIVE_STATES

logger = logging.getLogger(__name__)

QUEUE_NAME = "deepthread"
TASK_BY_MODE = {"research": "deepthread.research", "plan": "deepthread.plan", "chat": "deepthread.chat",
                "followup": "deepthread.chat"}
ADMISSION_LOCK = "deepthread:lock:admission"
# An admitted run whose task has not started within this time is sent again by the reaper.
START_GRACE_SECONDS = 120
ADMITTED = "admitted"
RESUBMITTED = "resubmitted"
# Present while Redis keeps its data; an admission pass that finds it gone knows queued task messages were lost.
BROKER_MARK = "deepthread:queue:broker-mark"

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
        """Admit what the limits allow; returns the run's queue position, or None when it was admitted.

        With Redis unreachable the run stays queued, with its position, for the next admission pass.
        """
        try:
            self.admit()
        except REDIS_ERRORS as error:
            logger.warning("admission unavailable (%s); run %s stays queued for the next admission pass",
                           type(error).__name__, run_id)
        return self.position(run_id)

    def admit(self) -> list[int]:
        """Send the tasks of the oldest queued runs the limits allow; returns their ids; raises redis errors."""
        # The lock outlives SQLite's 30 s busy timeout, so it cannot expire while admission still runs.
        with self.redis.lock(ADMISSION_LOCK, timeout=120, blocking_timeout=60):
            messages_lost = bool(self.redis.set(BROKER_MARK, "1", nx=True))
            lost = self._admitted_not_started() if messages_lost else []
            admitted = self._admit_locked()
        if lost:
            logger.warning("Redis lost its queued tasks; sending %s admitted runs again", len(lost))
        unsent = []
        for run_id, mode, task_id in admitted + lost:
            try:
                self.send_task(TASK_BY_MODE[mode], run_id, task_id)
            except Exception:
                logger.warning("could not send run %s to the workers; it goes back to the queue", run_id, exc_info=True)
                unsent.append((run_id, task_id))
        if unsent:
            self._back_to_queue(unsent)
        unsent_ids = {run_id for run_id, _ in unsent}
        return [run_id for run_id, _, _ in admitted if run_id not in unsent_ids]

    def _admit_locked(self) -> list[tuple[int, str, str]]:
        with self.sessions.begin() as session:
            # Workspaces in the order of their oldest waiting run, so a person waiting in two is served oldest first.
            workspaces = list(session.scalars(select(Run.workspace).where(waiting()).group_by(Run.workspace)
                                              .order_by(func.min(Run.created_at))))
            if not workspaces:
                return []
            busy_workspaces = dict(session.execute(
                select(Run.workspace, func.count()).where(in_flight(), Run.workspace.in_(workspaces))
                .group_by(Run.workspace)).all())
            # Bounded by the runs in flight (the fairness limits), not by the runs waiting.
            busy_users: dict[str, int] = dict(session.execute(
                select(Run.requested_by, func.count()).where(in_flight()).group_by(Run.requested_by)).all())
            now = database_now(session)  # the clock every worker's reaper judges the start grace by
            admitted: list[tuple[int, str, str]] = []
            for workspace in workspaces:
                free = self.limits.per_workspace - busy_workspaces.get(workspace, 0)
                while free > 0:
                    full_users = [user for user, count in busy_users.items() if count >= self.limits.per_user]
                    head = (select(Run).where(waiting(), Run.workspace == workspace, Run.requested_by.not_in(full_users))
                            .order_by(Run.created_at, Run.id).limit(free))
                    if session.get_bind().dialect.name == "postgresql":
                        head = head.with_for_update(skip_locked=True)
                    candidates = list(session.scalars(head))
                    skipped = 0
                    for run in candidates:
                        if busy_users.get(run.requested_by, 0) >= self.limits.per_user:
                            skipped += 1  # the same person twice in this head; the next read leaves them out
                            continue
                        run.celery_task_id = uuid.uuid4().hex
                        run.lease_owner = ADMITTED
                        run.lease_until = now + dt.timedelta(seconds=START_GRACE_SECONDS)
                        busy_users[run.requested_by] = busy_users.get(run.requested_by, 0) + 1
                        free -= 1
                        admitted.append((run.id, run.mode, run.celery_task_id))
                    if not skipped:
                        break  # every slot filled, or the workspace's queue is empty
            return admitted

    def _admitted_not_started(self) -> list[tuple[int, str, str]]:
        """Admitted runs no worker has taken yet (their task messages may be lost), bounded by the fairness limits."""
        with self.sessions() as session:
            rows = session.execute(select(Run.id, Run.mode, Run.celery_task_id).where(
                Run.state.in_(ACTIVE_STATES), Run.celery_task_id.is_not(None),
                Run.lease_owner.in_((ADMITTED, RESUBMITTED)))).all()
        return [(run_id, mode, task_id) for run_id, mode, task_id in rows]

    def _back_to_queue(self, unsent: list[tuple[int, str]]) -> None:
        """Make runs whose task could not be sent wait again, so the next pass admits them anew."""
        with self.sessions.begin() as session:
            for run_id, task_id in unsent:
                session.execute(update(Run).where(Run.id == run_id, Run.celery_task_id == task_id,
                                                  Run.lease_owner.in_((ADMITTED, RESUBMITTED)))
                                .values(state="queued", celery_task_id=None, lease_owner=None, lease_until=None))

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

    def waiting_runs(self, workspaces_of: Collection[int] | None = None) -> list[tuple[int, int]]:
        """(run id, position) of the waiting runs in the workspaces of runs `workspaces_of` (every workspace when
        None), in one windowed query, for refreshing their status messages."""
        position = func.row_number().over(partition_by=Run.workspace, order_by=(Run.created_at, Run.id))
        query = select(Run.id, position).where(waiting())
        if workspaces_of is not None:
            query = query.where(Run.workspace.in_(select(Run.workspace).where(Run.id.in_(list(workspaces_of)))))
        with self.sessions() as session:
            return [(run_id, place) for run_id, place in session.execute(query.order_by(Run.created_at, Run.id)).all()]

    def cancel(self, run_id: int, by: str) -> str | None:
        """Stop a run: a queued one is cancelled at once, a running one is marked on its row (and flagged in Redis
        when it can be); returns the new state."""
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
            state = run.state if run is not None else None
        try:
            set_cancel_flag(self.redis, run_id, by)
        except REDIS_ERRORS as error:  # the worker's cancel watcher reads the row too
            logger.warning("cancel flag of run %s not written (%s); the worker reads the cancel from the run's row",
                           run_id, type(error).__name__)
        return state


def celery_sender(settings: Any) -> SendTask:
    """A `send_task` that hands runs to the workers by task name over the configured broker."""
    from celery import Celery

    from storage.redis import broker_transport_options, celery_broker_url, resolve_redis_url

    sender = Celery("deepthread-sender", set_as_current=False)
    sender.conf.broker_url = celery_broker_url(resolve_redis_url(settings.redis_url, settings.data_dir))
    sender.conf.broker_connection_retry_on_startup = True
    sender.conf.broker_transport_options = broker_transport_options()

    def send(name: str, run_id: int, task_id: str) -> None:
        sender.send_task(name, args=[run_id], task_id=task_id, queue=QUEUE_NAME)

    return send
