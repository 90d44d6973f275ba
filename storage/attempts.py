"""A run's attempt as the runner stores it: started (its lease taken, an earlier attempt's findings cleared), its
inputs read (the thread's history, a follow-up's passages), its events written as they come, and its outcome and
findings stored when it ends, unless a newer attempt owns the run by then.

The runner's research types stay out of storage: it hands its findings and outcome over as plain rows.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict
from sqlalchemy import delete, func, insert, select
from sqlalchemy.orm import Session, joinedload

from storage.conversations import SharedFile
from storage.db import Sessions, database_now, off_loop
from storage.leases import holds_attempt, take_lease
from storage.models import Citation, ConversationFile, Event, Message, Passage, Run, Source
from storage.vocabulary import RunState


class AttemptStart(NamedTuple):
    """A run just taken as a new attempt (detached, its conversation loaded), and the seq its first event gets."""

    run: Run
    first_seq: int


class StoredPassage(NamedTuple):
    """A passage an earlier run read, with the source it came from."""

    passage_id: str
    text: str
    start: int
    end: int
    is_snippet: bool
    source_id: str
    url: str
    title: str | None
    provider: str | None
    page: int | None = None
    file: dict[str, Any] | None = None  # a shared file's details (research.report.SourceFile as JSON)


class RunInputs(NamedTuple):
    """What a run reads before it starts: its thread's latest messages (oldest first), the passages it answers from,
    and the files shared in its conversation (the newest, oldest first)."""

    history: list[Message]
    passages: list[StoredPassage]
    files: list[SharedFile] = []


class SourceFinding(NamedTuple):
    """A search result or priority URL of the run, with the outcome of fetching it (None: never fetched)."""

    source_id: str
    url: str
    title: str | None
    snippet: str | None
    provider: str | None
    published: str | None
    fetch_status: str | None
    fetch_reason: str | None
    file: dict[str, Any] | None = None  # a shared file's kind, size and SHA-256
    checksum: str | None = None  # SHA-256 of the text read from it; None when only its snippet was seen


class PassageFinding(NamedTuple):
    """A passage of one of the run's sources that the model was shown."""

    passage_id: str
    source_id: str
    text: str
    start: int
    end: int
    is_snippet: bool
    page: int | None = None


class CitationFinding(NamedTuple):
    """One sentence of the report citing one passage (None: a passage the run does not have), and the audit's verdict."""

    sentence: str
    verdict: str
    passage_id: str | None


class Findings(NamedTuple):
    """What an attempt gathered, stored with its outcome."""

    sources: list[SourceFinding]
    passages: list[PassageFinding]
    citations: list[CitationFinding]


class AttemptOutcome(BaseModel):
    """How an attempt ended, as its run's row keeps it.

    `cancelled_by` is recorded only when nobody was recorded before; the report's columns only when
    `report_json` is given; `partial` and its reason only when `partial` is given.
    """

    model_config = ConfigDict(frozen=True)

    state: RunState
    error: str | None = None
    cancelled_by: str | None = None
    phase_timings: dict[str, float]
    report_markdown: str | None = None
    report_json: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    partial: bool | None = None
    partial_reason: str | None = None
    # What the bot said, added to the thread's history so that follow-ups and revisions have it.
    reply_text: str | None = None


def start_attempt(sessions: Sessions, run_id: int, owner: str, lease_seconds: float) -> AttemptStart | None:
    """Take the run's lease as a new attempt and clear an earlier attempt's findings.

    Returns None when the run has ended or another attempt holds a live lease. Raises LookupError
    when the run does not exist.
    """
    attempt = take_lease(sessions, run_id, owner, lease_seconds)
    if attempt is None:
        with sessions() as session:
            if session.get(Run, run_id) is None:
                raise LookupError(f"run {run_id} does not exist")
        return None
    with sessions.begin() as session:
        if attempt > 1:
            for model in (Citation, Passage, Source):
                session.execute(delete(model).where(model.run_id == run_id))
        last_seq = session.scalar(select(func.max(Event.seq)).where(Event.run_id == run_id)) or 0
        run = session.get_one(Run, run_id, options=[joinedload(Run.conversation)])  # the caller's log lines name it
        session.expunge(run)
    return AttemptStart(run, last_seq + 1)


def write_events(sessions: Sessions, run_id: int, attempt: int, rows: list[dict[str, Any]]) -> bool:
    """Insert the events' rows (the columns of `Event`) unless a newer attempt owns the run; whether they were written.

    Raises what the database raised.
    """
    with sessions.begin() as session:
        if not holds_attempt(session, run_id, attempt, lock=True):
            return False
        session.execute(insert(Event), rows)
        return True


def run_inputs(sessions: Sessions, conversation_id: int, *, history_messages: int,
               answer_from_run: int | None, max_files: int = 0) -> RunInputs:
    """The conversation's latest `history_messages` messages, the passages of run `answer_from_run` (if any), and
    the newest `max_files` files shared in the conversation."""
    with sessions() as session:
        newest = session.scalars(select(Message).where(Message.conversation_id == conversation_id)
                                 .order_by(Message.id.desc()).limit(history_messages)).all()
        passages = _passages_of(session, answer_from_run) if answer_from_run is not None else []
        files = session.execute(
            select(ConversationFile.file_id, ConversationFile.name, ConversationFile.size, ConversationFile.mimetype,
                   ConversationFile.url, ConversationFile.link, ConversationFile.shared_by)
            .where(ConversationFile.conversation_id == conversation_id)
            .order_by(ConversationFile.id.desc()).limit(max_files)).all() if max_files > 0 else []
    return RunInputs(list(reversed(newest)), passages, [SharedFile(*row) for row in reversed(files)])


def _passages_of(session: Session, run_id: int) -> list[StoredPassage]:
    rows = session.execute(
        select(Passage.passage_id, Passage.text, Passage.start, Passage.end, Passage.is_snippet,
               Source.source_id, Source.url, Source.title, Source.provider, Passage.page, Source.file)
        .join(Passage.source).where(Passage.run_id == run_id).order_by(Passage.id))
    return [StoredPassage(*row) for row in rows]


def finish_attempt(sessions: Sessions, run_id: int, attempt: int, outcome: AttemptOutcome, findings: Findings) -> bool:
    """Store the attempt's outcome and findings unless a newer attempt owns the run; whether they were stored.

    Storing again what this attempt stored (a retry) writes nothing more: no second copy of a source, a passage,
    a citation or the bot's reply."""
    with sessions.begin() as session:
        if not holds_attempt(session, run_id, attempt, lock=True):
            return False
        run = session.get(Run, run_id)
        if run is None:  # not so: holds_attempt has just read its row
            return False
        if run.finished:
            # This attempt stored it already: a store tried again after a commit whose answer was lost.
            return run.state == outcome.state
        run.lease_owner, run.lease_until = None, None
        _add_findings(session, run_id, findings)
        run.state = outcome.state
        run.finished_at = database_now(session)  # the reaper judges delivery's grace by it
        if outcome.state == "cancelled" and run.cancelled_by is None:
            run.cancelled_by = outcome.cancelled_by
        run.error = outcome.error
        run.phase_timings = dict(outcome.phase_timings)
        if outcome.report_json is not None:
            run.report_markdown, run.report_json, run.usage = outcome.report_markdown, outcome.report_json, outcome.usage
        if outcome.partial is not None:
            run.partial, run.partial_reason = outcome.partial, outcome.partial_reason
        if outcome.reply_text:
            session.add(Message(conversation_id=run.conversation_id, role="assistant", author="deepthread",
                                text=outcome.reply_text, mode=run.mode))
    return True


def _add_findings(session: Session, run_id: int, findings: Findings) -> None:
    source_rows: dict[str, Source] = {}
    for found in findings.sources:
        source_row = Source(run_id=run_id, **found._asdict())
        session.add(source_row)
        source_rows[found.source_id] = source_row
    passage_rows: dict[str, Passage] = {}
    for passage in findings.passages:
        source_of_passage = source_rows.get(passage.source_id)
        if source_of_passage is None:
            continue
        passage_row = Passage(run_id=run_id, source=source_of_passage, passage_id=passage.passage_id, text=passage.text,
                              start=passage.start, end=passage.end, is_snippet=passage.is_snippet, page=passage.page)
        session.add(passage_row)
        passage_rows[passage.passage_id] = passage_row
    for cited in findings.citations:
        session.add(Citation(run_id=run_id, sentence=cited.sentence, verdict=cited.verdict,
                             passage=passage_rows.get(cited.passage_id) if cited.passage_id else None))


def mark_failed(sessions: Sessions, run_id: int, attempt: int, reason: str) -> None:
    """End the run as failed with `reason`, unless it has ended or a newer attempt owns it."""
    with sessions.begin() as session:
        run = session.get(Run, run_id)
        if run is not None and run.attempt == attempt and not run.finished:
            run.state, run.error, run.finished_at = "failed", reason, database_now(session)
            run.lease_owner, run.lease_until = None, None


arun_inputs = off_loop(run_inputs)
afinish_attempt = off_loop(finish_attempt)
amark_failed = off_loop(mark_failed)
