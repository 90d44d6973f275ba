"""The SQL schema: conversations, messages, runs and what each run gathered."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import DDL, JSON, Boolean, ForeignKey, Index, Integer, String, Text, UniqueConstraint, event, text
from sqlalchemy.orm import Mapped, mapped_column, relationship

# The Slack OAuth tables join Base.metadata, so migrations and their drift check see them.
import storage.installations  # noqa: F401
from storage.base import Base, ModelJSON
from storage.base import UTCDateTime as UTCDateTime  # the migrations name the column type storage.models.UTCDateTime
from storage.vocabulary import TERMINAL_STATES, DeliveredMessage, RunMode, RunOptions, RunState, WatchSchedule, WatchState


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class Conversation(Base):
    """A thread (or terminal session) the bot answers in."""

    __tablename__ = "conversations"
    __table_args__ = (
        UniqueConstraint("platform", "workspace", "channel", "thread", name="uq_conversations_place"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    platform: Mapped[str] = mapped_column(String(16))
    workspace: Mapped[str] = mapped_column(String(64))
    channel: Mapped[str] = mapped_column(String(64))
    thread: Mapped[str] = mapped_column(String(64))
    created_by: Mapped[str] = mapped_column(String(64))
    # Who can see the channel: a private channel's or a DM's runs are listed only in that channel's history.
    visibility: Mapped[str] = mapped_column(String(16), default="private", server_default=text("'private'"))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)

    messages: Mapped[list[Message]] = relationship(
        back_populates="conversation", cascade="all, delete-orphan", passive_deletes=True, order_by="Message.id"
    )
    runs: Mapped[list[Run]] = relationship(
        back_populates="conversation", cascade="all, delete-orphan", passive_deletes=True, order_by="Run.id"
    )
    files: Mapped[list[ConversationFile]] = relationship(
        back_populates="conversation", cascade="all, delete-orphan", passive_deletes=True,
        order_by="ConversationFile.id"
    )


class ConversationFile(Base):
    """A file a person shared in a conversation, as its platform describes it: a source of the conversation's runs.

    Only the reference is kept (the platform's id, name, where to download it and where to open it); the bytes are
    downloaded by each run that reads the file, and never stored.
    """

    __tablename__ = "conversation_files"
    __table_args__ = (UniqueConstraint("conversation_id", "file_id", name="uq_conversation_files_file"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    conversation_id: Mapped[int] = mapped_column(ForeignKey("conversations.id", ondelete="CASCADE"), index=True)
    file_id: Mapped[str] = mapped_column(Text)
    name: Mapped[str] = mapped_column(Text)
    size: Mapped[int | None] = mapped_column(Integer)
    mimetype: Mapped[str | None] = mapped_column(String(128))
    url: Mapped[str] = mapped_column(Text, default="")
    link: Mapped[str | None] = mapped_column(Text)
    shared_by: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)

    conversation: Mapped[Conversation] = relationship(back_populates="files")


class Message(Base):
    """One message of a conversation, from a person or the bot."""

    __tablename__ = "messages"

    id: Mapped[int] = mapped_column(primary_key=True)
    conversation_id: Mapped[int] = mapped_column(ForeignKey("conversations.id", ondelete="CASCADE"), index=True)
    role: Mapped[str] = mapped_column(String(16))
    author: Mapped[str] = mapped_column(String(64))
    text: Mapped[str] = mapped_column(Text)
    platform_message_id: Mapped[str | None] = mapped_column(String(64))
    mode: Mapped[RunMode | None] = mapped_column(String(16))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)

    conversation: Mapped[Conversation] = relationship(back_populates="messages")


class Run(Base):
    """One job of the bot: research, plan, chat or follow-up; the row is the truth of its state."""

    __tablename__ = "runs"
    __table_args__ = (
        Index("ix_runs_state_created", "state", "created_at"),
        Index("ix_runs_requester_state", "requested_by", "state"),
        Index("ix_runs_workspace_state", "workspace", "state"),
        Index("ix_runs_status_message_id", "status_message_id"),
        # One run in flight per thread: IN_FLIGHT_INDEX, below.
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    conversation_id: Mapped[int] = mapped_column(ForeignKey("conversations.id", ondelete="CASCADE"), index=True)
    workspace: Mapped[str] = mapped_column(String(64))
    mode: Mapped[RunMode] = mapped_column(String(16))
    question: Mapped[str] = mapped_column(Text)
    options: Mapped[RunOptions] = mapped_column(ModelJSON(RunOptions), default=lambda: RunOptions())
    plan: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    state: Mapped[RunState] = mapped_column(String(16), default="queued")
    requested_by: Mapped[str] = mapped_column(String(64))
    cancelled_by: Mapped[str | None] = mapped_column(String(64))
    status_message: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    status_message_id: Mapped[str | None] = mapped_column(String(64))
    delivered_messages: Mapped[list[DeliveredMessage] | None] = mapped_column(ModelJSON(list[DeliveredMessage]))
    delivery_intent_at: Mapped[dt.datetime | None]
    delivered_at: Mapped[dt.datetime | None]
    # Delivery attempts that failed (the platform down), when the resume sweep tries again, and when it stopped trying.
    delivery_attempts: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    delivery_retry_at: Mapped[dt.datetime | None]
    delivery_given_up_at: Mapped[dt.datetime | None]
    celery_task_id: Mapped[str | None] = mapped_column(String(64))
    # The watch that fired this run (None: a person asked for it).
    watch_id: Mapped[int | None] = mapped_column(ForeignKey("watches.id", ondelete="SET NULL"), index=True)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    lease_until: Mapped[dt.datetime | None]
    lease_owner: Mapped[str | None] = mapped_column(String(128))
    report_markdown: Mapped[str | None] = mapped_column(Text)
    report_json: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    partial: Mapped[bool] = mapped_column(Boolean, default=False)
    partial_reason: Mapped[str | None] = mapped_column(Text)
    usage: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    phase_timings: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    started_at: Mapped[dt.datetime | None]
    finished_at: Mapped[dt.datetime | None]

    conversation: Mapped[Conversation] = relationship(back_populates="runs")
    sources: Mapped[list[Source]] = relationship(
        back_populates="run", cascade="all, delete-orphan", passive_deletes=True, order_by="Source.id"
    )
    passages: Mapped[list[Passage]] = relationship(
        back_populates="run", cascade="all, delete-orphan", passive_deletes=True, order_by="Passage.id"
    )
    citations: Mapped[list[Citation]] = relationship(
        back_populates="run", cascade="all, delete-orphan", passive_deletes=True, order_by="Citation.id"
    )
    events: Mapped[list[Event]] = relationship(
        back_populates="run", cascade="all, delete-orphan", passive_deletes=True, order_by="Event.seq"
    )

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL_STATES


# One run in flight per thread, whatever races the bot's handlers run into: a partial unique index, written as the SQL
# that SQLite and PostgreSQL both read. Declared on the model with `sqlite_where` and `postgresql_where`, it made
# SQLAlchemy import both dialects as this module loaded, a tenth of a second of every start (the PostgreSQL one even
# where the database is SQLite). Migration 0003 creates it; a database built from the models gets it here; the drift
# check skips it (`DDL_INDEXES`), as Alembic compares no index it is not declared.
IN_FLIGHT_INDEX = "uq_runs_one_in_flight_per_conversation"
DDL_INDEXES = frozenset({IN_FLIGHT_INDEX})
event.listen(Run.__table__, "after_create", DDL(
    f"CREATE UNIQUE INDEX {IN_FLIGHT_INDEX} ON runs (conversation_id) WHERE state IN ('queued', 'running')"))


def compared_by_alembic(item: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    """Alembic's `include_object`: every schema item but the indexes created by DDL here."""
    return not (type_ == "index" and name in DDL_INDEXES)


class Source(Base):
    """A search result or priority URL of a run, with the outcome of fetching it."""

    __tablename__ = "sources"
    __table_args__ = (UniqueConstraint("run_id", "source_id", name="uq_sources_run_source_id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    source_id: Mapped[str] = mapped_column(String(16))
    url: Mapped[str] = mapped_column(Text)
    title: Mapped[str | None] = mapped_column(Text)
    snippet: Mapped[str | None] = mapped_column(Text)
    provider: Mapped[str | None] = mapped_column(String(32))
    published: Mapped[str | None] = mapped_column(String(32))
    fetch_status: Mapped[str | None] = mapped_column(String(16))
    fetch_reason: Mapped[str | None] = mapped_column(Text)
    # A shared file's kind, size and SHA-256 (`research.report.SourceFile`); None for a web source.
    file: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # SHA-256 of the text read from the source (None: only its search snippet was seen): a watch's next run compares it.
    checksum: Mapped[str | None] = mapped_column(String(64))

    run: Mapped[Run] = relationship(back_populates="sources")
    passages: Mapped[list[Passage]] = relationship(back_populates="source", passive_deletes=True)


class Passage(Base):
    """A chunk of a source's text that the model was shown, with its run-stable id `pN`."""

    __tablename__ = "passages"
    __table_args__ = (UniqueConstraint("run_id", "passage_id", name="uq_passages_run_passage_id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    source_row_id: Mapped[int] = mapped_column(ForeignKey("sources.id", ondelete="CASCADE"), index=True)
    passage_id: Mapped[str] = mapped_column(String(16))
    text: Mapped[str] = mapped_column(Text)
    start: Mapped[int] = mapped_column(Integer)
    end: Mapped[int] = mapped_column(Integer)
    is_snippet: Mapped[bool] = mapped_column(Boolean, default=False)
    page: Mapped[int | None] = mapped_column(Integer)  # a PDF's page the passage starts on

    run: Mapped[Run] = relationship(back_populates="passages")
    source: Mapped[Source] = relationship(back_populates="passages")


class Citation(Base):
    """One sentence of a report citing one passage, with the audit's verdict."""

    __tablename__ = "citations"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    passage_row_id: Mapped[int | None] = mapped_column(ForeignKey("passages.id", ondelete="CASCADE"), index=True)
    sentence: Mapped[str] = mapped_column(Text)
    verdict: Mapped[str] = mapped_column(String(16))

    run: Mapped[Run] = relationship(back_populates="citations")
    passage: Mapped[Passage | None] = relationship()


class Event(Base):
    """An engine event of a run, in `seq` order."""

    __tablename__ = "events"
    __table_args__ = (UniqueConstraint("run_id", "seq", name="uq_events_run_seq"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    seq: Mapped[int] = mapped_column(Integer)
    type: Mapped[str] = mapped_column(String(32))
    phase: Mapped[str | None] = mapped_column(String(32))
    payload: Mapped[dict[str, Any]] = mapped_column(default=dict)
    at: Mapped[dt.datetime] = mapped_column(default=utcnow)

    run: Mapped[Run] = relationship(back_populates="events")


class Feedback(Base):
    """One person's 👍 (+1) or 👎 (-1) on a run's report or answer, with what was wrong when they said."""

    __tablename__ = "feedback"
    # One verdict per person and run: a second click changes it rather than counting twice.
    __table_args__ = (UniqueConstraint("run_id", "user", name="uq_feedback_run_user"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    user: Mapped[str] = mapped_column(String(64))
    value: Mapped[int] = mapped_column(Integer)
    comment: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(default=utcnow)



class Watch(Base):
    """A research question that comes back on its own schedule, and says what changed since its previous run.

    Times are judged on the database's clock: `next_due_at` is the next moment it fires (UTC), and a beat's tick
    claims a due watch for `claimed_until` before firing it, so two beats, many workers or clocks that disagree fire
    each due time once. `thread` is where the watch was made (the report's thread); each run opens a thread of its own
    in `channel`, or posts in `thread` when `one_thread` is set.
    """

    __tablename__ = "watches"
    __table_args__ = (
        Index("ix_watches_state_next_due", "state", "next_due_at"),
        Index("ix_watches_place", "platform", "workspace", "channel"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    platform: Mapped[str] = mapped_column(String(16))
    workspace: Mapped[str] = mapped_column(String(64))
    channel: Mapped[str] = mapped_column(String(64))
    thread: Mapped[str] = mapped_column(String(64))
    visibility: Mapped[str] = mapped_column(String(16), default="private", server_default=text("'private'"))
    created_by: Mapped[str] = mapped_column(String(64))
    question: Mapped[str] = mapped_column(Text)
    options: Mapped[RunOptions] = mapped_column(ModelJSON(RunOptions), default=lambda: RunOptions())
    schedule: Mapped[WatchSchedule] = mapped_column(ModelJSON(WatchSchedule))
    one_thread: Mapped[bool] = mapped_column(Boolean, default=False)
    state: Mapped[WatchState] = mapped_column(String(16), default="active")
    stopped_reason: Mapped[str | None] = mapped_column(Text)
    next_due_at: Mapped[dt.datetime]
    claimed_by: Mapped[str | None] = mapped_column(String(128))
    claimed_until: Mapped[dt.datetime | None]
    # The run the watch was made from, and the latest it fired: the next run's changes are computed against the
    # newest of them that finished with a report.
    # (Plain ids, no foreign keys: runs name their watch, and two tables naming each other cannot be created in order.)
    origin_run_id: Mapped[int | None] = mapped_column(Integer)
    last_run_id: Mapped[int | None] = mapped_column(Integer)
    last_fired_at: Mapped[dt.datetime | None]
    fired: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class WorkspaceSetting(Base):
    """What a workspace (a Slack workspace, a Discord server) set for itself: the time zone its watches' times are in
    where the platform does not tell each person's (Discord: `/watches timezone Europe/Paris`; UTC until set)."""

    __tablename__ = "workspace_settings"

    platform: Mapped[str] = mapped_column(String(16), primary_key=True)
    workspace: Mapped[str] = mapped_column(String(64), primary_key=True)
    timezone: Mapped[str] = mapped_column(String(64), default="UTC")
    updated_by: Mapped[str | None] = mapped_column(String(64))
    updated_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
