"""Leases: who is running a run right now, judged by the database's clock, and taking over runs whose worker died.

A run's `lease_owner` names the worker thread running it, or one of the markers below while no worker does yet
(admitted, sent again by the reaper) or while a finished run's delivery is being resumed.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Collection
from typing import NamedTuple

from sqlalchemy import and_, func, or_, select, tuple_, update
from sqlalchemy.orm import Session

from storage.db import Sessions, changed_rows, database_now, hold_write_lock, off_loop
from storage.models import Conversation, Run
from storage.vocabulary import ACTIVE_STATES, PENDING_THREAD_PREFIX, TERMINAL_STATES, RunMode

ADMITTED = "admitted"
RESUBMITTED = "resubmitted"
DELIVERING = "delivering"
# An admitted run whose task has not started within this time is sent again by the reaper.
START_GRACE_SECONDS = 120
MAX_ATTEMPTS = 3
# A finished run whose report is still undelivered this long after it ended lost its worker mid-delivery.
DELIVERY_GRACE_SECONDS = 300
ORPHANED = "The process running this stopped before it finished (a `deepthread research` that was killed)."


class RunTask(NamedTuple):
    """A run to hand to the workers, and the id of the task that carries it."""

    run_id: int
    mode: RunMode
    task_id: str


def take_lease(sessions: Sessions, run_id: int, owner: str, lease_seconds: float,
               now: dt.datetime | None = None) -> int | None:
    """Start a new attempt of the run if nobody holds a live lease on it; returns the attempt number."""
    with sessions.begin() as session:  # one short write on a busy database
        now = now or database_now(session)
        attempt: int | None = session.execute(
            update(Run)
            .where(Run.id == run_id, Run.state.in_(ACTIVE_STATES),
                   or_(Run.lease_until.is_(None), Run.lease_until < now, Run.lease_owner.in_((ADMITTED, RESUBMITTED))))
            .values(state="running", attempt=Run.attempt + 1, lease_owner=owner,
                    lease_until=now + dt.timedelta(seconds=lease_seconds),
                    started_at=func.coalesce(Run.started_at, now))
            .returning(Run.attempt)
            .execution_options(synchronize_session=False)
        ).scalar_one_or_none()
        return attempt


def renew_lease(sessions: Sessions, run_id: int, attempt: int, owner: str, lease_seconds: float) -> bool:
    """Extend our lease; False when the run has passed to another attempt, been reaped, or ended."""
    lease = HeldLease(run_id, attempt, owner)
    return lease not in renew_leases(sessions, [lease], lease_seconds)


class HeldLease(NamedTuple):
    """A lease this process holds: the run, the attempt it holds it for, and the owner name it holds it under."""

    run_id: int
    attempt: int
    owner: str


def renew_leases(sessions: Sessions, held: Collection[HeldLease], lease_seconds: float) -> set[HeldLease]:
    """Extend every one of `held` in one transaction; returns those lost: the run passed to another attempt, or was
    reaped. A run that has ended in the lease's own attempt is not lost (the attempt stored its outcome a moment
    ago and is letting go of the lease); it is simply not renewed."""
    if not held:
        return set()
    with sessions.begin() as session:
        until = database_now(session) + dt.timedelta(seconds=lease_seconds)
        renewed = set(session.scalars(
            update(Run).where(tuple_(Run.id, Run.attempt, Run.lease_owner).in_([tuple(lease) for lease in held]),
                              Run.state == "running")
            .values(lease_until=until).returning(Run.id).execution_options(synchronize_session=False)))
        unrenewed = [lease for lease in held if lease.run_id not in renewed]
        if not unrenewed:
            return set()
        rows = session.execute(select(Run.id, Run.attempt, Run.state)
                               .where(Run.id.in_([lease.run_id for lease in unrenewed])))
        ended_in = {run_id: attempt for run_id, attempt, state in rows if state in TERMINAL_STATES}
    return {lease for lease in unrenewed if ended_in.get(lease.run_id) != lease.attempt}


def holds_attempt(session: Session, run_id: int, attempt: int, *, lock: bool = False) -> bool:
    """Whether `attempt` is still the run's current one, inside the caller's session (every write, edit and post asks).

    With `lock`, a new attempt cannot start (`take_lease`) between this check and the writes that follow it in the
    session: on PostgreSQL the run's row stays locked (SELECT … FOR UPDATE) until the session commits; on SQLite the
    database's write lock is taken before the check and held to the commit (`storage.db.hold_write_lock`).
    """
    query = select(Run.attempt).where(Run.id == run_id)
    if lock:
        hold_write_lock(session, Run.id)
        query = query.with_for_update()
    return session.scalar(query) == attempt


def is_current_attempt(sessions: Sessions, run_id: int, attempt: int) -> bool:
    """Whether `attempt` is still the run's current one (`holds_attempt` in a session of its own)."""
    with sessions() as session:
        return holds_attempt(session, run_id, attempt)


def resubmit_expired(sessions: Sessions, now: dt.datetime | None = None) -> list[RunTask]:
    """Claim for sending again the runs whose lease expired (a dead worker, a lost task), each under a new task id;
    a run interrupted MAX_ATTEMPTS times is failed instead. Returns the runs to send."""
    resubmitted: list[RunTask] = []
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
            task_id = uuid.uuid4().hex
            claimed = changed_rows(session.execute(
                update(Run).where(Run.id == run.id, Run.lease_until == run.lease_until)
                .values(lease_owner=RESUBMITTED, lease_until=now + dt.timedelta(seconds=START_GRACE_SECONDS),
                        celery_task_id=task_id)
            ))
            if claimed:
                resubmitted.append(RunTask(run.id, run.mode, task_id))
    return resubmitted


def end_orphaned_runs(sessions: Sessions, now: dt.datetime | None = None) -> list[int]:
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


def claim_undelivered(sessions: Sessions, platforms: Collection[str], lease_seconds: float,
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
                   # A watch's run has no status message until its thread is opened (or ever, in its one thread),
                   # and loses its watch_id if the watch is deleted before that thread was opened.
                   or_(Run.status_message.is_not(None), Run.watch_id.is_not(None),
                       Conversation.thread.like(f"{PENDING_THREAD_PREFIX}%")),
                   Conversation.platform.in_(list(platforms)),
                   or_(Run.delivery_retry_at <= now,
                       and_(Run.delivery_retry_at.is_(None),
                            Run.finished_at < now - dt.timedelta(seconds=DELIVERY_GRACE_SECONDS))),
                   or_(Run.lease_until.is_(None), Run.lease_until < now))
            .order_by(Run.id).limit(20))
        for run in candidates:
            if changed_rows(session.execute(
                update(Run).where(Run.id == run.id, Run.delivered_at.is_(None),
                                  or_(Run.lease_until.is_(None), Run.lease_until < now))
                .values(lease_owner=DELIVERING, lease_until=now + dt.timedelta(seconds=lease_seconds))
            )):
                claimed.append(run.id)
    return claimed


def fail_unstartable(sessions: Sessions, run_id: int, reason: str, now: dt.datetime | None = None) -> bool:
    """End a run that no worker here can start (nobody holds a live lease on it) as failed, with the reason."""
    with sessions.begin() as session:
        now = now or database_now(session)
        return bool(changed_rows(session.execute(
            update(Run).where(Run.id == run_id, Run.state.in_(ACTIVE_STATES),
                              or_(Run.lease_until.is_(None), Run.lease_until < now,
                                  Run.lease_owner.in_((ADMITTED, RESUBMITTED))))
            .values(state="failed", error=reason, finished_at=now, lease_owner=None, lease_until=None)
        )))


ais_current_attempt = off_loop(is_current_attempt)
aclaim_undelivered = off_loop(claim_undelivered)
