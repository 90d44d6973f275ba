"""Leases and attempts: who is running a run right now, and taking over runs whose worker died."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Collection

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from storage.db import database_now
from storage.models import Conversation, Run
from storage.vocabulary import ACTIVE_STATES, TERMINAL_STATES
from worker.queue import ADMITTED, RESUBMITTED, START_GRACE_SECONDS, TASK_BY_MODE, SendTask


def take_lease(sessions: sessionmaker[Session], run_id: int, owner: str, lease_seconds: float,
               now: dt.datetime | None = None) -> int | None:
    """Start a new attempt of the run if nobody holds a live lease on it; returns the attempt number."""
    with sessions.begin() as session:  # one short write on a busy database
        now = now or database_now(session)
        return session.execute(
            update(Run)
            .where(Run.id == run_id, Run.state.in_(ACTIVE_STATES),
                   or_(Run.lease_until.is_(None), Run.lease_until < now, Run.lease_owner.in_((ADMITTED, RESUBMITTED))))
            .values(state="running", attempt=Run.attempt + 1, lease_owner=owner,
                    lease_until=now + dt.timedelta(seconds=lease_seconds),
                    started_at=func.coalesce(Run.started_at, now))
            .returning(Run.attempt)
            .execution_options(synchronize_session=False)
        ).scalar_one_or_none()


def renew_lease(sessions: sessionmaker[Session], run_id: int, attempt: int, owner: str, lease_seconds: float) -> bool:
    """Extend our lease; False when the run has passed to another attempt, been reaped, or ended."""
    with sessions.begin() as session:
        return bool(session.execute(
            update(Run).where(Run.id == run_id, Run.attempt == attempt, Run.lease_owner == owner, Run.state == "running")
            .values(lease_until=database_now(session) + dt.timedelta(seconds=lease_seconds))
        ).rowcount)


def holds_attempt(session: Session, run_id: int, attempt: int, *, lock: bool = False) -> bool:
    """Whether `attempt` is still the run's current one (every write, edit and post asks).

    With `lock`, the row stays locked until the session commits (PostgreSQL), so a new attempt
    cannot start between this check and the write that follows it.
    """
    query = select(Run.attempt).where(Run.id == run_id)
    return session.scalar(query.with_for_update() if lock else query) == attempt


def reap(sessions: sessionmaker[Session], send_task: SendTask, now: dt.datetime | None = None) -> list[int]:
    """Send again the runs whose lease expired (a dead worker, a lost task); returns their ids."""
    resubmitted: list[tuple[int, str, str]] = []
    with sessions.begin() as session:
        now = now or database_now(session)
        expired = session.scalars(
            select(Run).where(Run.state.in_(ACTIVE_STATES), Run.celery_task_id.is_not(None),
                              and_(Run.lease_until.is_not(None), Run.lease_until < now))
            .order_by(Run.id))
        for run in expired:
            if run.attempt >= MAX_ATTEMPTS:
                run.state, run.finished_at = "failed", now
                run.lease_owner, run.lease_until = None, None
                run.error = f"The run was interrupted {run.attempt} times (its workers stopped) and was given up."
                continue
            claimed = session.execute(
                update(Run).where(Run.id == run.id, Run.lease_until == run.lease_until)
                .values(lease_owner=RESUBMITTED, lease_until=now + dt.timedelta(seconds=START_GRACE_SECONDS),
                        celery_task_id=uuid.uuid4().hex)
            ).rowcount
            if claimed:
                session.refresh(run)
                resubmitted.append((run.id, run.mode, run.celery_task_id))
    for run_id, mode, task_id in resubmitted:
        send_task(TASK_BY_MODE[mode], run_id, task_id)
    end_orphaned_runs(sessions, now)
    return [run_id for run_id, _, _ in resubmitted]


ORPHANED = "The process running this stopped before it finished (a `deepthread research` that was killed)."


def end_orphaned_runs(sessions: sessionmaker[Session], now: dt.datetime | None = None) -> list[int]:
    """End as failed the running runs no task can take over (started in a terminal, not by a worker) whose
    process stopped renewing the lease; returns their ids."""
    with sessions.begin() as session:
        now = now or database_now(session)
        orphaned = list(session.scalars(
            select(Run.id).where(Run.state == "running", Run.celery_task_id.is_(None),
                                 Run.lease_until.is_not(None), Run.lease_until < now)))
        if orphaned:
            session.execute(update(Run).where(Run.id.in_(orphaned), Run.lease_until < now)
                            .values(state="failed", error=ORPHANED, finished_at=now, lease_owner=None, lease_until=None))
    return orphaned


MAX_ATTEMPTS = 3
# A finished run whose report is still undelivered this long after it ended lost its worker mid-delivery.
DELIVERY_GRACE_SECONDS = 300
DELIVERING = "delivering"


def claim_undelivered(sessions: sessionmaker[Session], platforms: Collection[str], lease_seconds: float,
                      now: dt.datetime | None = None) -> list[int]:
    """Finished runs on these platforms whose delivery is due, claimed for delivery by the caller.

    Due: a retry whose time has come (an earlier attempt failed and said so), or a delivery that never
    reported back (its worker died) well after the run ended; never one delivered or given up.
    """
    claimed: list[int] = []
    with sessions.begin() as session:
        now = now or database_now(session)
        candidates = session.scalars(
            select(Run).join(Conversation)
            .where(Run.state.in_(TERMINAL_STATES), Run.delivered_at.is_(None),
                   Run.delivery_given_up_at.is_(None),
                   Run.status_message.is_not(None), Conversation.platform.in_(list(platforms)),
                   or_(Run.delivery_retry_at <= now,
                       and_(Run.delivery_retry_at.is_(None),
                            Run.finished_at < now - dt.timedelta(seconds=DELIVERY_GRACE_SECONDS))),
                   or_(Run.lease_until.is_(None), Run.lease_until < now))
            .order_by(Run.id).limit(20))
        for run in candidates:
            if session.execute(
                update(Run).where(Run.id == run.id, Run.delivered_at.is_(None),
                                  or_(Run.lease_until.is_(None), Run.lease_until < now))
                .values(lease_owner=DELIVERING, lease_until=now + dt.timedelta(seconds=lease_seconds))
            ).rowcount:
                claimed.append(run.id)
    return claimed


def fail_unstartable(sessions: sessionmaker[Session], run_id: int, reason: str, now: dt.datetime | None = None) -> bool:
    """End a run that no worker here can start (nobody holds a live lease on it) as failed, with the reason."""
    with sessions.begin() as session:
        now = now or database_now(session)
        return bool(session.execute(
            update(Run).where(Run.id == run_id, Run.state.in_(ACTIVE_STATES),
                              or_(Run.lease_until.is_(None), Run.lease_until < now,
                                  Run.lease_owner.in_((ADMITTED, RESUBMITTED))))
            .values(state="failed", error=reason, finished_at=now, lease_owner=None, lease_until=None)
        ).rowcount)


def worker_identity() -> str:
    """A name for this worker thread's leases, unique across machines and restarts."""
    import os
    import socket
    import threading

    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}:{uuid.uuid4().hex[:6]}"
