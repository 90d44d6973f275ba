"""Conversations and their runs as the conversation core reads and writes them.

The core decides from a `ThreadView` (a conversation and its runs, detached from any session), then
stores a new run, its status message and its feedback here. Every function is blocking; its
`a`-named twin runs it off the event loop (see `storage.db`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass, field
from collections.abc import Sequence
from typing import Any, Literal, NamedTuple

from sqlalchemy import ColumnElement, Select, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from storage.admission import waiting
from storage.db import Sessions, hold_write_lock, off_loop
from storage.feedback import Verdict, record_comment, record_verdict
from storage.models import Conversation, ConversationFile, Message, Run
from storage.quotas import DailyQuotas, QuotaReached, quota_reached
from storage.vocabulary import ACTIVE_STATES, RunMode, RunOptions

Visibility = Literal["public", "private"]
PUBLIC: Visibility = "public"
PRIVATE: Visibility = "private"


class ThreadKey(NamedTuple):
    """Where a conversation lives: its platform, workspace, channel and thread."""

    platform: str
    workspace: str
    channel: str
    thread: str


@dataclass(frozen=True)
class ThreadView:
    """A conversation and its runs, oldest first, detached from the database: what the core's rules read."""

    conversation: Conversation
    runs: list[Run] = field(default_factory=list)
    shared_files: int = 0  # files shared in the conversation (sources of its research)
    newest_file_at: dt.datetime | None = None  # when the newest of them was shared

    @property
    def key(self) -> ThreadKey:
        conversation = self.conversation
        return ThreadKey(conversation.platform, conversation.workspace, conversation.channel, conversation.thread)

    @property
    def active(self) -> Run | None:
        """The run in flight (queued or running), if any: the database allows one a thread."""
        return next((run for run in reversed(self.runs) if run.state in ACTIVE_STATES), None)

    @property
    def last(self) -> Run | None:
        return self.runs[-1] if self.runs else None

    @property
    def last_report(self) -> Run | None:
        """The newest research run with a stored report."""
        return next((run for run in reversed(self.runs) if run.mode == "research" and run.report_json is not None), None)

    @property
    def last_reported(self) -> Run | None:
        """The newest run of any mode with a stored report (what `export` attaches)."""
        return next((run for run in reversed(self.runs) if run.report_json is not None), None)


class SharedFile(NamedTuple):
    """A file shared in a conversation, as its platform described it (`ConversationFile`): a source of its runs."""

    file_id: str
    name: str
    size: int | None = None
    mimetype: str | None = None
    url: str = ""
    link: str | None = None
    shared_by: str | None = None


class HistoryTurn(NamedTuple):
    """A message of a platform thread the bot joined late, stored as the conversation's context."""

    author: str
    text: str
    is_bot: bool


@dataclass(frozen=True)
class NewRun:
    """A run to store, and the question that asks for it as the conversation's newest message."""

    key: ThreadKey
    mode: RunMode
    question: str
    requested_by: str
    options: RunOptions = field(default_factory=RunOptions)
    plan: dict[str, Any] | None = None
    # The platform's id of the message that asked, and who may see the channel (None: unknown, stored private).
    message_id: str | None = None
    visibility: Visibility | None = None
    history: tuple[HistoryTurn, ...] = ()
    files: tuple[SharedFile, ...] = ()  # shared with the request: sources of this run and the thread's next ones


class ThreadBusy(Exception):
    """The database refused a new run of the thread: most likely another went in flight a moment ago (it keeps one
    a thread); the error it raised is the cause."""


class QueueFull(Exception):
    """The requester (`scope` "user") or the run's workspace ("workspace") already has `waiting` runs waiting in the
    queue, as many as a new run may find."""

    def __init__(self, waiting: int, scope: Literal["user", "workspace"] = "user") -> None:
        super().__init__(f"{waiting} runs waiting in the {scope}'s queue")
        self.waiting = waiting
        self.scope = scope


class RunRow(NamedTuple):
    """A run and the conversation it lives in, detached (for listings)."""

    run: Run
    conversation: Conversation


def _conversation_where(key: ThreadKey) -> tuple[ColumnElement[bool], ...]:
    return (Conversation.platform == key.platform, Conversation.workspace == key.workspace,
            Conversation.channel == key.channel, Conversation.thread == key.thread)


def thread_view(sessions: Sessions, key: ThreadKey) -> ThreadView | None:
    """The conversation in `key`'s thread with its runs, or None when deepthread has none there."""
    with sessions() as session:
        return _view_of(session, session.scalar(select(Conversation).where(*_conversation_where(key))))


def thread_view_of_run(sessions: Sessions, run: Run) -> ThreadView | None:
    """The conversation `run` lives in, with its runs."""
    with sessions() as session:
        return _view_of(session, session.get(Conversation, run.conversation_id))


def _view_of(session: Session, conversation: Conversation | None) -> ThreadView | None:
    if conversation is None:
        return None
    runs = list(session.scalars(select(Run).where(Run.conversation_id == conversation.id).order_by(Run.id)))
    shared_files, newest_file_at = session.execute(
        select(func.count(ConversationFile.id), func.max(ConversationFile.created_at))
        .where(ConversationFile.conversation_id == conversation.id)).one()
    session.expunge_all()
    return ThreadView(conversation=conversation, runs=runs, shared_files=shared_files or 0,
                      newest_file_at=newest_file_at)


def load_run(sessions: Sessions, run_id: int) -> Run | None:
    """Run `run_id`, detached, or None."""
    with sessions() as session:
        run = session.get(Run, run_id)
        if run is not None:
            session.expunge(run)
        return run


def run_by_status_message(sessions: Sessions, *, platform: str, channel: str, message_id: str) -> Run | None:
    """The run whose status message is `message_id` in the channel, detached, or None."""
    with sessions() as session:
        run = session.scalar(select(Run).join(Conversation).where(
            Run.status_message_id == message_id, Conversation.platform == platform, Conversation.channel == channel))
        if run is not None:
            session.expunge(run)
        return run


def in_flight_run_started_by(sessions: Sessions, *, platform: str, workspace: str, channel: str,
                             message_id: str) -> Run | None:
    """The queued or running run that message `message_id` started, detached: the run of the thread it is the root
    of (a mention, a DM question, or the title posted for a slash command), or the run answering the question it asked."""
    in_place = (Conversation.platform == platform, Conversation.workspace == workspace, Conversation.channel == channel)
    with sessions() as session:
        conversation_id = session.scalar(select(Conversation.id).where(*in_place, Conversation.thread == message_id))
        if conversation_id is None:
            conversation_id = _conversation_whose_latest_question_is(session, message_id, in_place)
        if conversation_id is None:
            return None
        run = session.scalar(select(Run).where(Run.conversation_id == conversation_id, Run.state.in_(ACTIVE_STATES))
                             .order_by(Run.id.desc()))
        if run is not None:
            session.expunge(run)
        return run


def _conversation_whose_latest_question_is(session: Session, message_id: str,
                                           in_place: tuple[ColumnElement[bool], ...]) -> int | None:
    """The conversation in which message `message_id` is the newest question (the one its current run answers)."""
    asked = session.scalar(select(Message).join(Conversation).where(
        *in_place, Message.platform_message_id == message_id, Message.role == "user"))
    if asked is None:
        return None
    # An older question of the thread did not start the run in flight now.
    newest = session.scalar(select(Message.id).where(
        Message.conversation_id == asked.conversation_id, Message.role == "user", Message.mode.is_not(None))
        .order_by(Message.id.desc()).limit(1))
    return asked.conversation_id if newest == asked.id else None


def waiting_runs_of(sessions: Sessions, user: str) -> int:
    """How many of `user`'s runs wait in the queue, not admitted yet."""
    with sessions() as session:
        return session.scalar(select(func.count()).select_from(Run).where(Run.requested_by == user, waiting())) or 0


def waiting_runs_in_workspace(sessions: Sessions, workspace: str) -> int:
    """How many runs of `workspace` wait in the queue, not admitted yet, whoever asked for them."""
    with sessions() as session:
        return session.scalar(select(func.count()).select_from(Run).where(Run.workspace == workspace, waiting())) or 0


def daily_quota_reached(sessions: Sessions, quotas: DailyQuotas, *, user: str, workspace: str,
                        now: dt.datetime) -> QuotaReached | None:
    """The first daily limit a new run by `user` in `workspace` would break at `now`, or None (no query when off)."""
    if not quotas.enabled:
        return None
    with sessions() as session:
        return quota_reached(session, quotas, user=user, workspace=workspace, now=now)


def store_run(sessions: Sessions, new: NewRun, *, max_waiting: int | None = None,
              max_waiting_in_workspace: int | None = None) -> int:
    """Store the run (and its conversation, the thread's history and the question as messages); returns its id.

    With `max_waiting`, the requester's waiting runs are counted in the same transaction, one new run of theirs
    at a time, and QueueFull is raised when they already have that many: a burst of commands cannot slip past
    the queue cap between the count and the insert. `max_waiting_in_workspace` (None or 0: no cap) does the same
    for every waiting run of the workspace. Raises ThreadBusy when another run of the thread went in flight
    meanwhile.
    """
    try:
        with sessions.begin() as session:
            if max_waiting_in_workspace:
                # Taken before the requester's lock, always in this order, so two stores cannot wait for each other.
                hold_lock_of(session, f"workspace:{new.key.workspace}")
                waiting_in_workspace = session.scalar(select(func.count()).select_from(Run).where(
                    Run.workspace == new.key.workspace, waiting())) or 0
                if waiting_in_workspace >= max_waiting_in_workspace:
                    raise QueueFull(waiting_in_workspace, "workspace")
            if max_waiting is not None:
                hold_lock_of(session, new.requested_by)
                waiting_now = session.scalar(select(func.count()).select_from(Run).where(
                    Run.requested_by == new.requested_by, waiting())) or 0
                if waiting_now >= max_waiting:
                    raise QueueFull(waiting_now)
            if new.visibility == PRIVATE:
                # A channel made private since its first runs: none of them may be listed elsewhere any longer.
                key = new.key
                session.execute(update(Conversation).where(
                    Conversation.platform == key.platform, Conversation.workspace == key.workspace,
                    Conversation.channel == key.channel, Conversation.visibility != PRIVATE).values(visibility=PRIVATE))
            conversation = _conversation(session, new)
            for turn in new.history:
                session.add(Message(conversation=conversation, role="assistant" if turn.is_bot else "user",
                                    author=turn.author, text=turn.text))
            session.add(Message(conversation=conversation, role="user", author=new.requested_by, text=new.question,
                                platform_message_id=new.message_id, mode=new.mode))
            _add_files(session, conversation, new.files)
            run = Run(conversation=conversation, workspace=new.key.workspace, mode=new.mode, question=new.question,
                      options=new.options, plan=new.plan, requested_by=new.requested_by)
            session.add(run)
            session.flush()
            return run.id
    except IntegrityError as error:
        # Most likely the one-in-flight index; the caller looks at the thread again to tell.
        raise ThreadBusy(new.key.thread) from error


def hold_lock_of(session: Session, holder: str) -> None:
    """Hold, until the transaction ends, a lock that any other transaction storing a run of `holder` (a requester,
    or `workspace:ID`) waits for.

    PostgreSQL: a transaction-scoped advisory lock keyed by the holder. SQLite: the database's one write lock
    (`storage.db.hold_write_lock`; SQLite admits one writer at a time anyway, at the insert that follows).
    """
    if session.get_bind().dialect.name == "postgresql":
        key = int.from_bytes(hashlib.blake2b(holder.encode("utf-8"), digest_size=8).digest(), "big", signed=True)
        session.execute(select(func.pg_advisory_xact_lock(key)))
    else:
        hold_write_lock(session, Run.id)


def _conversation(session: Session, new: NewRun) -> Conversation:
    return _conversation_at(session, new.key, created_by=new.requested_by, visibility=new.visibility)


def _conversation_at(session: Session, key: ThreadKey, *, created_by: str, visibility: Visibility | None) -> Conversation:
    found = session.scalar(select(Conversation).where(*_conversation_where(key)))
    if found is not None:
        return found
    conversation = Conversation(platform=key.platform, workspace=key.workspace, channel=key.channel, thread=key.thread,
                                created_by=created_by, visibility=visibility or PRIVATE)
    session.add(conversation)
    return conversation


def _add_files(session: Session, conversation: Conversation, files: Sequence[SharedFile]) -> list[SharedFile]:
    """Add the files the conversation does not hold yet (by platform id); returns those added."""
    if not files:
        return []
    held = set(session.scalars(select(ConversationFile.file_id).where(
        ConversationFile.conversation_id == conversation.id))) if conversation.id is not None else set()
    added: list[SharedFile] = []
    for shared in files:
        if shared.file_id in held:
            continue
        held.add(shared.file_id)
        session.add(ConversationFile(conversation=conversation, **shared._asdict()))
        added.append(shared)
    return added


def remember_files(sessions: Sessions, key: ThreadKey, files: Sequence[SharedFile], *, shared_by: str,
                   visibility: Visibility | None = None) -> list[SharedFile]:
    """Keep `files` as sources of the conversation in `key`'s thread (made if new): a reply that only shares files
    starts no run. Returns the files it did not hold yet."""
    with sessions.begin() as session:
        conversation = _conversation_at(session, key, created_by=shared_by, visibility=visibility)
        session.flush()
        return _add_files(session, conversation, files)


def store_status_message(sessions: Sessions, run_id: int, status_message: dict[str, Any], message_id: str) -> None:
    """Record the run's status message (a MessageRef as JSON), which reactions and buttons find it by."""
    with sessions.begin() as session:
        stored = session.get(Run, run_id)
        if stored is not None:
            stored.status_message = status_message
            stored.status_message_id = message_id


def latest_question(sessions: Sessions, *, platform: str, workspace: str, user: str) -> tuple[RunMode, str] | None:
    """The mode and question of the person's newest run in this workspace of this platform, or None."""
    with sessions() as session:
        run = session.scalars(select(Run).join(Conversation).where(
            Conversation.platform == platform, Run.workspace == workspace, Run.requested_by == user,
        ).order_by(Run.id.desc()).limit(1)).first()
        return None if run is None else (run.mode, run.question)


def listed_runs(sessions: Sessions, *, platform: str, workspace: str, channel: str, user: str,
                limit: int) -> tuple[list[RunRow], list[RunRow]]:
    """`user`'s latest runs that may be listed in `channel` (there, or in a public channel of the same workspace),
    and the latest runs others started in `channel`, newest first, at most `limit` of each.

    A private channel's runs are listed only in that channel, so a listing never names a run from a
    channel that someone reading it there may not see.
    """
    same_workspace = (Conversation.platform == platform, Conversation.workspace == workspace)
    in_channel = Conversation.channel == channel
    yours = select(Run, Conversation).join(Conversation).where(
        *same_workspace, Run.requested_by == user, or_(in_channel, Conversation.visibility == PUBLIC))
    others = select(Run, Conversation).join(Conversation).where(*same_workspace, in_channel, Run.requested_by != user)
    with sessions() as session:
        listed = _rows(session, yours, limit), _rows(session, others, limit)
        session.expunge_all()
        return listed


def _rows(session: Session, query: Select[Run, Conversation], limit: int) -> list[RunRow]:
    return [RunRow(run, conversation) for run, conversation in session.execute(query.order_by(Run.id.desc()).limit(limit))]


def store_feedback(sessions: Sessions, *, run_id: int, user: str, now: dt.datetime, verdict: Verdict | None = None,
                   comment: str | None = None) -> None:
    """Store `user`'s verdict on run `run_id`, or the comment saying what was wrong."""
    with sessions.begin() as session:
        if comment is not None:
            record_comment(session, run_id=run_id, user=user, comment=comment, now=now)
        elif verdict is not None:
            record_verdict(session, run_id=run_id, user=user, verdict=verdict, now=now)


athread_view = off_loop(thread_view)
athread_view_of_run = off_loop(thread_view_of_run)
aload_run = off_loop(load_run)
arun_by_status_message = off_loop(run_by_status_message)
ain_flight_run_started_by = off_loop(in_flight_run_started_by)
awaiting_runs_of = off_loop(waiting_runs_of)
awaiting_runs_in_workspace = off_loop(waiting_runs_in_workspace)
adaily_quota_reached = off_loop(daily_quota_reached)
astore_run = off_loop(store_run)
aremember_files = off_loop(remember_files)
astore_status_message = off_loop(store_status_message)
alatest_question = off_loop(latest_question)
alisted_runs = off_loop(listed_runs)
astore_feedback = off_loop(store_feedback)
