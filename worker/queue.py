"""Admission and submission: the Run rows are the queue, Celery only carries the run id.

The one worker module the bot imports. `submit()` admits the oldest queued runs that the fairness
limits allow (per user, per workspace) and sends their tasks by name; `cancel()` stops a run,
queued or running. Admission is serialised across processes by a Redis lock, and on PostgreSQL
the queued rows are also locked with SKIP LOCKED. The SQL is storage.admission's; the lock and the
sending are here.

With Redis unreachable a run stays queued (its row is the queue) and a later pass starts it; a
pass that finds Redis emptied (restarted without its data) sends again the admitted runs whose
task messages it lost (a second delivery finds the first attempt's lease and exits).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import redis

from storage.admission import (
    admit_waiting,
    admitted_not_started,
    back_to_queue,
    cancel_run,
    queue_position,
    queue_positions,
)
from storage.db import Sessions
from storage.leases import ADMITTED
from storage.shared_limits import REDIS_ERRORS, redis_lock, set_cancel_flag
from storage.vocabulary import RunState

# ADMITTED: the lease owner of a run admitted here and not started yet (storage.leases names the others).
__all__ = ["ADMISSION_LOCK", "ADMITTED", "BROKER_MARK", "QUEUE_NAME", "TASK_BY_MODE", "Limits", "Queue", "SendTask",
           "celery_sender"]

logger = logging.getLogger(__name__)

QUEUE_NAME = "deepthread"
TASK_BY_MODE = {"research": "deepthread.research", "plan": "deepthread.plan", "chat": "deepthread.chat",
                "followup": "deepthread.chat"}
ADMISSION_LOCK = "admission"  # deepthread:lock:admission
# Present while Redis keeps its data; an admission pass that finds it gone knows queued task messages were lost.
BROKER_MARK = "deepthread:queue:broker-mark"

SendTask = Callable[[str, int, str], None]


@dataclass(frozen=True)
class Limits:
    per_user: int
    per_workspace: int


class Queue:
    """Admission over the runs table; `send_task(name, run_id, task_id)` hands a run to Celery."""

    def __init__(self, sessions: Sessions, redis_client: redis.Redis, limits: Limits, send_task: SendTask) -> None:
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
        with redis_lock(self.redis, ADMISSION_LOCK, timeout=120, blocking_timeout=60):
            messages_lost = bool(self.redis.set(BROKER_MARK, "1", nx=True))
            lost = admitted_not_started(self.sessions) if messages_lost else []
            admitted = admit_waiting(self.sessions, per_user=self.limits.per_user,
                                     per_workspace=self.limits.per_workspace)
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
            back_to_queue(self.sessions, unsent)
        unsent_ids = {run_id for run_id, _ in unsent}
        return [run_id for run_id, _, _ in admitted if run_id not in unsent_ids]

    def position(self, run_id: int) -> int | None:
        """1 for the next waiting run in its workspace, 2 for the one after…; None once admitted or ended."""
        return queue_position(self.sessions, run_id)

    def waiting_runs(self, workspaces_of: Collection[int] | None = None) -> list[tuple[int, int]]:
        """(run id, position) of the waiting runs in the workspaces of runs `workspaces_of` (every workspace when
        None), in one windowed query, for refreshing their status messages."""
        return queue_positions(self.sessions, workspaces_of)

    def cancel(self, run_id: int, by: str) -> RunState | None:
        """Stop a run: a queued one is cancelled at once, a running one is marked on its row (and flagged in Redis
        when it can be); returns the new state."""
        cancelled = cancel_run(self.sessions, run_id, by)
        if not cancelled.dequeued:
            self.flag_cancel(run_id, by)
        return cancelled.state

    def flag_cancel(self, run_id: int, by: str) -> None:
        """Flag a running run, already marked cancelled on its row, in Redis, where its worker sees it soonest."""
        try:
            set_cancel_flag(self.redis, run_id, by)
        except REDIS_ERRORS as error:  # the worker's cancel watcher reads the row too
            logger.warning("cancel flag of run %s not written (%s); the worker reads the cancel from the run's row",
                           run_id, type(error).__name__)


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
