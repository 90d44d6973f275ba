"""Leases and attempts: who is running a run right now, and taking over runs whose worker died."""

from __future__ import annotations

import datetime as dt
import uuid

from sqlalchemy import and_, or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from storage.models import Run, utcnow
from worker.queue import ADMITTED, RESUBMITTED, START_GRACE_SECONDS, TASK_BY_MODE, SendTask


def take_lease(sessions: sessionmaker[Session], run_id: int, owner: str, lease_seconds: float,
               now: dt.datetime | None = None) -> int | None:
    """Start a new attempt of the run if nobody holds a live lease on it; returns the attempt number."""
    now = now or utcnow()
    with sessions.begin() as session:
        taken = session.execute(
            update(Run)
            .where(Run.id == run_id, Run.state.in_(("queued", "running")),
                   or_(Run.lease_until.is_(None), Run.lease_until < now, Run.lease_owner.in_((ADMITTED, RESUBMITTED))))
            .values(state="running", attempt=Run.attempt + 1, lease_owner=owner,
                    lease_until=now + dt.timedelta(seconds=lease_seconds))
        ).rowcount
        if not taken:
            return None
        run = session.get(Run, run_id)
        if run.started_at is None:
            run.started_at = now
        return run.attempt


def renew_lease(sessions: sessionmaker[Session], run_id: int, attempt: int, lease_seconds: float) -> bool:
    """Extend our lease; False when the run has passed to another attempt (or ended)."""
    with sessions.begin() as session:
        return bool(session.execute(
            update(Run).where(Run.id == run_id, Run.attempt == attempt, Run.state == "running")
            .values(lease_until=utcnow() + dt.timedelta(seconds=lease_seconds))
        ).rowcount)


def holds_attempt(session: Session, run_id: int, attempt: int) -> bool:
    """Whether `attempt` is still the run's current one (every write, edit and post asks)."""
    return session.scalar(select(Run.attempt).where(Run.id == run_id)) == attempt


def reap(sessions: sessionmaker[Session], send_task: SendTask, now: dt.datetime | None = None) -> list[int]:
    """Send again the runs whose lease expired (a dead worker, a lost task); returns their ids."""
    now = now or utcnow()
    resubmitted: list[tuple[int, str, str]] = []
    with sessions.begin() as session:
        expired = session.scalars(
            select(Run).where(Run.state.in_(("queued", "running")), Run.celery_task_id.is_not(None),
                              and_(Run.lease_until.is_not(None), Run.lease_until < now))
            .order_by(Run.id))
        for run in expired:
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
    return [run_id for run_id, _, _ in resubmitted]


def worker_identity() -> str:
    """A name for this worker thread's leases, unique across machines and restarts."""
    import os
    import socket
    import threading

    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}:{uuid.uuid4().hex[:6]}"
