"""Retention: delete finished runs older than a cutoff with everything they own, in batches, on SQLite and PostgreSQL;
and forget a whole workspace.

A run goes when it is in a final state, was created before the cutoff, has no delivery retry
waiting and no live lease (a delivery in progress). Its sources, passages, citations and events go
with it; a conversation created before the cutoff that has no run left goes too, with its messages.
A message written before the cutoff goes even while its thread lives on with newer runs (the bot
keeps every reply of a thread it answers in, also from people who never asked it anything), unless
a run of its thread is in flight and may still read it as history.

`forget_workspace` deletes every conversation of a workspace with its messages and runs, for an
uninstall or `deepthread prune --workspace`, but never from under a worker: a run in flight is
stopped first, as a cancel does (a queued one at once, a running one marked on its row for its
worker, which the caller also flags in Redis: storage does not reach the workers), and its thread
is kept in this pass. Once the run has ended, the next `forget_workspace` of the workspace deletes
that thread too; nothing does it on its own. Each batch is one transaction, so a long prune never
holds the database for long.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any, NamedTuple

from pydantic import BaseModel
from sqlalchemy import ColumnElement, Select, and_, delete, exists, func, not_, or_, select
from sqlalchemy.orm import Session, sessionmaker

from storage.admission import cancel_run
from storage.db import changed_rows, database_now, off_loop
from storage.models import Citation, Conversation, Event, Message, Passage, Run, Source, Watch
from storage.vocabulary import ACTIVE_STATES, TERMINAL_STATES
from storage.watches import delete_watches_of

RUNS_PER_BATCH = 500
# Children before parents: citations point at passages, passages at sources.
RUN_CHILDREN = (Citation, Passage, Source, Event)
# A month is 30 days. A bare `m` is refused: minutes or months, a prune must not guess.
AGE_UNITS = {"min": dt.timedelta(minutes=1), "h": dt.timedelta(hours=1), "d": dt.timedelta(days=1),
             "w": dt.timedelta(weeks=1), "mo": dt.timedelta(days=30)}
AGE_PATTERN = re.compile(r"(\d+)\s*(min|mo|m|h|d|w)")
AGE_EXAMPLES = "90d, 12h, 2w, 3mo or 30min"


class PruneCounts(BaseModel):
    """What a prune deleted (or, dry, would delete), and in how many transactions."""

    runs: int = 0
    sources: int = 0
    passages: int = 0
    citations: int = 0
    events: int = 0
    conversations: int = 0
    messages: int = 0
    watches: int = 0  # of a workspace forgotten: its watches (and its time zone setting)
    batches: int = 0
    # Of a workspace forgotten: the conversations kept because a run of theirs is in flight, those runs (stopped, or
    # on a dry run to be stopped), and the ones of them a worker is running (whose cancel the caller flags in Redis).
    kept_conversations: int = 0
    in_flight: list[int] = []
    running: list[int] = []


def parse_age(text: str) -> dt.timedelta:
    """`90d`, `12h`, `2w`, `3mo` (30 days each) or `30min` as a duration; raises ValueError for anything else, and
    for a bare `m`, which could mean minutes or months."""
    match = AGE_PATTERN.fullmatch(text.strip().lower())
    if match is None or int(match.group(1)) == 0:
        raise ValueError(f"{text!r} is not an age such as {AGE_EXAMPLES}")
    count, unit = int(match.group(1)), match.group(2)
    if unit == "m":
        raise ValueError(f"{text!r} could mean minutes or months: write {count}min or {count}mo")
    return count * AGE_UNITS[unit]


def _prunable(cutoff: dt.datetime, now: dt.datetime) -> ColumnElement[bool]:
    return and_(Run.state.in_(sorted(TERMINAL_STATES)), Run.created_at < cutoff, Run.delivery_retry_at.is_(None),
                or_(Run.lease_until.is_(None), Run.lease_until < now))


def _runless_conversations(cutoff: dt.datetime, keeping: ColumnElement[bool] | None = None) -> Select[Any]:
    """Conversations created before the cutoff with no run left (or none matching `keeping`)."""
    runs_kept = select(Run.id).where(Run.conversation_id == Conversation.id)
    if keeping is not None:
        runs_kept = runs_kept.where(keeping)
    return select(Conversation.id).where(Conversation.created_at < cutoff, not_(exists(runs_kept)))


def _old_message(cutoff: dt.datetime) -> ColumnElement[bool]:
    """A message written before the cutoff in a thread with no run in flight (which may still read it as history)."""
    in_flight = select(Run.id).where(Run.conversation_id == Message.conversation_id,
                                     Run.state.in_(sorted(ACTIVE_STATES)))
    return and_(Message.created_at < cutoff, not_(exists(in_flight)))


def _count(session: Session, model: Any, column: Any, ids: Select[Any]) -> int:
    return session.scalar(select(func.count()).select_from(model).where(column.in_(ids))) or 0


def count_prunable(sessions: sessionmaker[Session], cutoff: dt.datetime) -> PruneCounts:
    """What `prune(sessions, cutoff)` would delete now, without deleting anything."""
    with sessions() as session:
        prunable = _prunable(cutoff, database_now(session))
        runs = select(Run.id).where(prunable)
        conversations = _runless_conversations(cutoff, keeping=not_(prunable))
        messages = select(func.count()).select_from(Message).where(
            or_(Message.conversation_id.in_(conversations), _old_message(cutoff)))
        return PruneCounts.model_validate({
            "runs": _count(session, Run, Run.id, runs),
            **{model.__tablename__: _count(session, model, model.run_id, runs) for model in RUN_CHILDREN},
            "conversations": _count(session, Conversation, Conversation.id, conversations),
            "messages": session.scalar(messages) or 0,
        })


def _locked(session: Session, query: Select[Any]) -> Select[Any]:
    # On PostgreSQL rows another transaction holds (a delivery, a new run in an old thread) are left for the next prune.
    return query.with_for_update(skip_locked=True) if session.get_bind().dialect.name == "postgresql" else query


def _deleted(session: Session, statement: Any) -> int:
    return changed_rows(session.execute(statement, execution_options={"synchronize_session": False}))


def prune(sessions: sessionmaker[Session], cutoff: dt.datetime, *, batch_size: int = RUNS_PER_BATCH) -> PruneCounts:
    """Delete the finished runs created before `cutoff` with what they own, then the conversations left without runs,
    then the messages written before `cutoff` in the threads that remain (but those with a run in flight)."""
    counts = PruneCounts()
    while True:
        with sessions.begin() as session:
            query = select(Run.id).where(_prunable(cutoff, database_now(session))).order_by(Run.id).limit(batch_size)
            run_ids = list(session.scalars(_locked(session, query)))
            if not run_ids:
                break
            for model in RUN_CHILDREN:
                deleted = _deleted(session, delete(model).where(model.run_id.in_(run_ids)))
                setattr(counts, model.__tablename__, getattr(counts, model.__tablename__) + deleted)
            counts.runs += _deleted(session, delete(Run).where(Run.id.in_(run_ids)))
            counts.batches += 1
    while True:
        with sessions.begin() as session:
            query = _runless_conversations(cutoff).order_by(Conversation.id).limit(batch_size)
            conversation_ids = list(session.scalars(_locked(session, query)))
            if not conversation_ids:
                break
            # Checked again as it deletes: a reply in an old thread may have started a run since the read.
            still_runless = _runless_conversations(cutoff).where(Conversation.id.in_(conversation_ids))
            counts.messages += _deleted(session, delete(Message).where(Message.conversation_id.in_(still_runless)))
            counts.conversations += _deleted(session, delete(Conversation).where(
                Conversation.id.in_(conversation_ids),
                not_(exists(select(Run.id).where(Run.conversation_id == Conversation.id)))))
            counts.batches += 1
    while True:
        with sessions.begin() as session:
            query = select(Message.id).where(_old_message(cutoff)).order_by(Message.id).limit(batch_size)
            message_ids = list(session.scalars(_locked(session, query)))
            if not message_ids:
                break
            # Checked again as it deletes: a run of the thread may have gone in flight since the read.
            counts.messages += _deleted(session, delete(Message).where(Message.id.in_(message_ids),
                                                                       _old_message(cutoff)))
            counts.batches += 1
    return counts


def _of_workspace(workspace: str, platform: str | None) -> ColumnElement[bool]:
    return and_(Conversation.workspace == workspace, *([] if platform is None else [Conversation.platform == platform]))


class InFlight(NamedTuple):
    """A run of a workspace being forgotten that is queued or running, and its thread."""

    run_id: int
    state: str
    conversation_id: int


def _in_flight_runs(session: Session, workspace: str, platform: str | None) -> list[InFlight]:
    """The workspace's runs in flight, oldest first."""
    return [InFlight(*row) for row in session.execute(
        select(Run.id, Run.state, Run.conversation_id).join(Conversation, Run.conversation_id == Conversation.id)
        .where(_of_workspace(workspace, platform), Run.state.in_(sorted(ACTIVE_STATES))).order_by(Run.id)).all()]


def _with_run_in_flight() -> ColumnElement[bool]:
    return exists(select(Run.id).where(Run.conversation_id == Conversation.id, Run.state.in_(sorted(ACTIVE_STATES))))


def count_workspace(sessions: sessionmaker[Session], workspace: str, *, platform: str | None = None) -> PruneCounts:
    """What `forget_workspace(sessions, workspace, platform=platform)` would delete now, without deleting anything:
    the conversations with a run in flight are counted as kept, with the runs it would stop."""
    with sessions() as session:
        in_flight = _in_flight_runs(session, workspace, platform)
        conversations = select(Conversation.id).where(_of_workspace(workspace, platform), not_(_with_run_in_flight()))
        runs = select(Run.id).where(Run.conversation_id.in_(conversations))
        return PruneCounts.model_validate({
            "runs": _count(session, Run, Run.id, runs),
            **{model.__tablename__: _count(session, model, model.run_id, runs) for model in RUN_CHILDREN},
            "conversations": _count(session, Conversation, Conversation.id, conversations),
            "messages": _count(session, Message, Message.conversation_id, conversations),
            "watches": session.scalar(select(func.count()).select_from(Watch).where(
                Watch.workspace == workspace, *([Watch.platform == platform] if platform is not None else []))) or 0,
            "kept_conversations": session.scalar(select(func.count()).select_from(Conversation).where(
                _of_workspace(workspace, platform), _with_run_in_flight())) or 0,
            "in_flight": [run.run_id for run in in_flight],
            "running": [run.run_id for run in in_flight if run.state == "running"],
        })


def forget_workspace(sessions: sessionmaker[Session], workspace: str, *, by: str, platform: str | None = None,
                     batch_size: int = RUNS_PER_BATCH) -> PruneCounts:
    """Delete every conversation of `workspace` (on `platform`, or on any) with its messages and its runs, with what
    they gathered (their feedback goes with them, by the database's cascade); but first stop its runs in flight, as
    stopped by `by`, and keep their conversations (`kept_conversations`) for a later call, once the runs have ended.

    A queued run is cancelled on its row (its task, if sent, finds it ended); a running one is marked on its row,
    which its worker reads within seconds. The caller flags the ids in `running` in Redis as well, as
    `worker.queue.Queue.cancel` does. An uninstall calls this once: the threads of the runs it stopped stay until a
    `deepthread prune --workspace` (or the age prune) after they have ended."""
    with sessions.begin() as session:  # first, so that no tick fires a watch's run into what is being forgotten
        watches = delete_watches_of(session, platform=platform, workspace=workspace)
    with sessions() as session:
        in_flight = _in_flight_runs(session, workspace, platform)
    running = [run.run_id for run in in_flight if cancel_run(sessions, run.run_id, by).state == "running"]
    counts = PruneCounts(in_flight=[run.run_id for run in in_flight], running=running, watches=watches)
    kept = sorted({run.conversation_id for run in in_flight})
    # Kept: the threads of the runs just stopped (a worker, or a task on its way to one, may still read them), and
    # any thread with a run in flight as this deletes (a reply may have started one since).
    deletable = and_(_of_workspace(workspace, platform), Conversation.id.not_in(kept), not_(_with_run_in_flight()))
    while True:
        with sessions.begin() as session:
            query = select(Conversation.id).where(deletable).order_by(Conversation.id)
            # Locked on PostgreSQL: a run stored in one of them now waits for this batch (its row's key is locked),
            # instead of starting between the deletes below and finding its thread's earlier findings gone.
            conversation_ids = list(session.scalars(_locked(session, query.limit(batch_size))))
            if not conversation_ids:
                break
            # Checked again as it deletes: a run may have started in one of them since the read.
            idle = select(Conversation.id).where(Conversation.id.in_(conversation_ids), deletable)
            run_ids = select(Run.id).where(Run.conversation_id.in_(idle))
            for model in RUN_CHILDREN:
                deleted = _deleted(session, delete(model).where(model.run_id.in_(run_ids)))
                setattr(counts, model.__tablename__, getattr(counts, model.__tablename__) + deleted)
            counts.runs += _deleted(session, delete(Run).where(Run.conversation_id.in_(idle)))
            counts.messages += _deleted(session, delete(Message).where(Message.conversation_id.in_(idle)))
            counts.conversations += _deleted(session, delete(Conversation).where(
                Conversation.id.in_(conversation_ids),
                not_(exists(select(Run.id).where(Run.conversation_id == Conversation.id)))))
            counts.batches += 1
    with sessions() as session:
        counts.kept_conversations = session.scalar(select(func.count()).select_from(Conversation).where(
            _of_workspace(workspace, platform))) or 0
    return counts


aforget_workspace = off_loop(forget_workspace)
