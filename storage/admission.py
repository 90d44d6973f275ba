"""The queue's SQL: the runs table is the queue, and these are its reads and writes.

An admission pass reads the head of each workspace's queue only, so its cost grows with the
workspaces, not with the runs waiting; on PostgreSQL the rows it admits are locked with SKIP
LOCKED. Whoever calls it serialises the passes across processes (worker.queue takes a Redis lock).
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Collection, Sequence
from typing import Any, NamedTuple

from sqlalchemy import and_, func, or_, select, update

from storage.db import Sessions, changed_rows, database_now, off_loop
from storage.leases import ADMITTED, RESUBMITTED, START_GRACE_SECONDS, RunTask
from storage.models import Conversation, ConversationFile, Message, Run
from storage.vocabulary import ACTIVE_STATES, RunMode, RunOptions, RunState


class CancelOutcome(NamedTuple):
    """What a cancel did to a run: its state afterwards (None: no such run), and whether it stopped a queued run
    outright (no worker has it to tell)."""

    state: RunState | None
    dequeued: bool


def in_flight(run: Any = Run) -> Any:
    """SQL condition: a run that holds a fairness slot (running, or admitted and about to start)."""
    return or_(run.state == "running", and_(run.state == "queued", run.celery_task_id.is_not(None)))


def waiting(run: Any = Run) -> Any:
    """SQL condition: a queued run not admitted yet."""
    return and_(run.state == "queued", run.celery_task_id.is_(None))


def admit_waiting(sessions: Sessions, *, per_user: int, per_workspace: int) -> list[RunTask]:
    """Admit the oldest waiting runs that the fairness limits allow (each under a new task id); returns them."""
    with sessions.begin() as session:
        # Workspaces in the order of their oldest waiting run, so a person waiting in two is served oldest first.
        workspaces = list(session.scalars(select(Run.workspace).where(waiting()).group_by(Run.workspace)
                                          .order_by(func.min(Run.created_at))))
        if not workspaces:
            return []
        busy_workspaces: dict[str, int] = dict(session.execute(
            select(Run.workspace, func.count()).where(in_flight(), Run.workspace.in_(workspaces))
            .group_by(Run.workspace)).all())
        # Bounded by the runs in flight (the fairness limits), not by the runs waiting.
        busy_users: dict[str, int] = dict(session.execute(
            select(Run.requested_by, func.count()).where(in_flight()).group_by(Run.requested_by)).all())
        now = database_now(session)  # the clock every worker's reaper judges the start grace by
        admitted: list[RunTask] = []
        for workspace in workspaces:
            free = per_workspace - busy_workspaces.get(workspace, 0)
            while free > 0:
                full_users = [user for user, count in busy_users.items() if count >= per_user]
                head = (select(Run).where(waiting(), Run.workspace == workspace, Run.requested_by.not_in(full_users))
                        .order_by(Run.created_at, Run.id).limit(free))
                if session.get_bind().dialect.name == "postgresql":
                    head = head.with_for_update(skip_locked=True)
                candidates = list(session.scalars(head))
                skipped = 0
                for run in candidates:
                    if busy_users.get(run.requested_by, 0) >= per_user:
                        skipped += 1  # the same person twice in this head; the next read leaves them out
                        continue
                    task_id = uuid.uuid4().hex
                    run.celery_task_id = task_id
                    run.lease_owner = ADMITTED
                    run.lease_until = now + dt.timedelta(seconds=START_GRACE_SECONDS)
                    busy_users[run.requested_by] = busy_users.get(run.requested_by, 0) + 1
                    free -= 1
                    admitted.append(RunTask(run.id, run.mode, task_id))
                if not skipped:
                    break  # every slot filled, or the workspace's queue is empty
        return admitted


def admitted_not_started(sessions: Sessions) -> list[RunTask]:
    """Admitted runs no worker has taken yet (their task messages may be lost), bounded by the fairness limits."""
    with sessions() as session:
        rows = session.execute(select(Run.id, Run.mode, Run.celery_task_id).where(
            Run.state.in_(ACTIVE_STATES), Run.celery_task_id.is_not(None),
            Run.lease_owner.in_((ADMITTED, RESUBMITTED)))).all()
    return [RunTask(run_id, mode, task_id) for run_id, mode, task_id in rows if task_id is not None]


def back_to_queue(sessions: Sessions, unsent: Collection[tuple[int, str]]) -> None:
    """Make runs whose task (run id, task id) could not be sent wait again, so the next pass admits them anew."""
    with sessions.begin() as session:
        for run_id, task_id in unsent:
            session.execute(update(Run).where(Run.id == run_id, Run.celery_task_id == task_id,
                                              Run.lease_owner.in_((ADMITTED, RESUBMITTED)))
                            .values(state="queued", celery_task_id=None, lease_owner=None, lease_until=None))


def queue_position(sessions: Sessions, run_id: int) -> int | None:
    """1 for the next waiting run in its workspace, 2 for the one after…; None once admitted or ended."""
    with sessions() as session:
        run = session.get(Run, run_id)
        if run is None or run.state != "queued" or run.celery_task_id is not None:
            return None
        ahead = session.scalar(select(func.count()).select_from(Run).where(
            waiting(), Run.workspace == run.workspace,
            or_(Run.created_at < run.created_at, and_(Run.created_at == run.created_at, Run.id < run.id))))
        return (ahead or 0) + 1


def queue_positions(sessions: Sessions, workspaces_of: Collection[int] | None = None) -> list[tuple[int, int]]:
    """(run id, position) of the waiting runs in the workspaces of runs `workspaces_of` (every workspace when
    None), in one windowed query."""
    position = func.row_number().over(partition_by=Run.workspace, order_by=(Run.created_at, Run.id))
    query = select(Run.id, position).where(waiting())
    if workspaces_of is not None:
        query = query.where(Run.workspace.in_(select(Run.workspace).where(Run.id.in_(list(workspaces_of)))))
    with sessions() as session:
        return [(run_id, place) for run_id, place in session.execute(query.order_by(Run.created_at, Run.id)).all()]


def cancel_run(sessions: Sessions, run_id: int, by: str) -> CancelOutcome:
    """Cancel a queued run at once, or mark a running one as stopped by `by` on its row (its worker reads it)."""
    with sessions.begin() as session:
        cancelled_queued = changed_rows(session.execute(
            update(Run).where(Run.id == run_id, Run.state == "queued")
            .values(state="cancelled", cancelled_by=by, finished_at=database_now(session), lease_owner=None,
                    lease_until=None)
        ))
        if cancelled_queued:
            return CancelOutcome("cancelled", dequeued=True)
        session.execute(update(Run).where(Run.id == run_id, Run.state == "running", Run.cancelled_by.is_(None))
                        .values(cancelled_by=by))
        run = session.get(Run, run_id)
        return CancelOutcome(run.state if run is not None else None, dequeued=False)


def cancellers(sessions: Sessions, run_ids: Collection[int]) -> dict[int, str]:
    """Who stopped each of the runs that someone stopped, from their rows."""
    with sessions() as session:
        rows = session.execute(select(Run.id, Run.cancelled_by)
                               .where(Run.id.in_(list(run_ids)), Run.cancelled_by.is_not(None))).all()
    return {run_id: by for run_id, by in rows if by is not None}


def queue_run_in_own_conversation(sessions: Sessions, *, platform: str, workspace: str, channel: str, requester: str,
                                  mode: RunMode, question: str, options: RunOptions,
                                  plan: dict[str, Any] | None = None, files: Sequence[Any] = ()) -> int:
    """A conversation of its own (a new thread id) in the channel, with `files` (`storage.conversations.SharedFile`)
    shared in it, and a queued run in it; returns the run id."""
    with sessions.begin() as session:
        conversation = Conversation(platform=platform, workspace=workspace, channel=channel,
                                    thread=uuid.uuid4().hex, created_by=requester)
        run = Run(conversation=conversation, workspace=workspace, mode=mode, question=question,
                  options=options, plan=plan, requested_by=requester)
        session.add_all([conversation, run,
                         Message(conversation=conversation, role="user", author=requester, text=question, mode=mode),
                         *(ConversationFile(conversation=conversation, **shared._asdict()) for shared in files)])
        session.flush()
        return run.id


aqueue_position = off_loop(queue_position)
aqueue_positions = off_loop(queue_positions)
