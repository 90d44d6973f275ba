"""The parts of executing a stored run: its services and options, its recorder (every event stored and folded into
progress), the lease taken as a new attempt, and its findings and outcome as storage keeps them. `worker.attempt`
puts them together."""

from __future__ import annotations

import asyncio
import threading
import datetime as dt
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from research import engine
from research.budget import ResearchOptions
from research.events import Aborted, Complete, Error, Event, PhaseStarted, TerminalEvent
from research.files import FileDocument, FileRef
from research.models import Passage as FoundPassage
from research.models import SearchResult
from research.report import Report, render_markdown
from research.thread_context import Turn
from storage.attempts import (
    AttemptOutcome,
    AttemptStart,
    CitationFinding,
    Findings,
    PassageFinding,
    SourceFinding,
    StoredPassage,
    write_events,
)
from storage.attempts import start_attempt as take_attempt
from storage.conversations import SharedFile
from storage.db import Sessions, off_loop
from storage.models import Message, Run
from storage.vocabulary import RunOptions, RunState
from chat.state import RunProgress, apply_event
from ops.log_context import describe_run, set_run_phase
from worker.leases import LeaseKeeper

if TYPE_CHECKING:  # Prometheus's client: a worker's, not the terminal's start-up
    from ops.metrics import Metrics, RunObserver

logger = logging.getLogger(__name__)

OnState = Callable[[RunProgress], Awaitable[None]]
Sleep = Callable[[float], Awaitable[None]]
TERMINAL_STATE_OF_EVENT: dict[str, RunState] = {"complete": "done", "aborted": "cancelled", "error": "failed"}
HISTORY_MESSAGES = 20
MAX_HISTORY_REPLY_CHARS = 6_000
EVENT_WRITE_DELAY_SECONDS = 0.25
# The batches' delay while the process is overloaded: a transaction a second per run instead of four.
OVERLOADED_EVENT_WRITE_DELAY_SECONDS = 1.0
# Waits between tries of storing a finished run's outcome while the database is briefly unavailable.
STORE_RETRY_DELAYS_SECONDS = (1.0, 2.0, 4.0, 8.0)


@dataclass
class RunnerServices:
    """What executing a run needs: the database, the engine's tools, and the run's limits."""

    sessions: Sessions
    tools: engine.ResearchTools
    options: ResearchOptions
    hard_deadline_grace_seconds: float = 60.0
    lease_seconds: float = 30.0
    store_retry_delays: tuple[float, ...] = STORE_RETRY_DELAYS_SECONDS
    sleep: Sleep = asyncio.sleep
    metrics: Metrics | None = None  # the process's Prometheus metrics (ops.metrics), fed by every run's events
    # The process's lease keeper (a worker's, shared by its runs); None: the attempt keeps its lease with one of its own.
    leases: LeaseKeeper | None = None
    # Whether the process is overloaded (a worker's runs loop lagging): events are then written in fewer, larger batches.
    overloaded: Callable[[], bool] = lambda: False


def options_for_run(base: ResearchOptions, stored: RunOptions) -> ResearchOptions:
    """The run's options: the configured budget with the requester's narrowing (since, sites, files only, preset)
    applied."""
    update: dict[str, Any] = {}
    if stored.since:
        update["since"] = dt.date.fromisoformat(stored.since)
    if stored.sites:
        update["sites"] = list(stored.sites)
    if stored.files_only:
        update["files_only"] = True
    preset = stored.preset
    if preset == "quick":
        update.update(max_rounds=1, max_sources=min(base.max_sources, 6), max_searches=min(base.max_searches, 8),
                      max_seconds=min(base.max_seconds, 120))
    elif preset == "deep":
        update.update(max_rounds=base.max_rounds + 2, max_sources=base.max_sources * 2,
                      max_searches=base.max_searches * 2, max_seconds=base.max_seconds * 2)
    return base.model_copy(update=update)


class RunRecorder:
    """Stores a run's events and its findings at the end; folds each event into progress at once.

    Events reach the database in batches, at most `write_delay` seconds after they happen (the
    longer `overloaded_write_delay` while `overloaded()` says the process is), and a terminal
    event writes at once: one transaction for many events costs a busy worker far less than one each.
    """

    def __init__(self, sessions: Sessions, run: Run, on_state: OnState | None, *,
                 write_delay: float = EVENT_WRITE_DELAY_SECONDS, sleep: Sleep = asyncio.sleep,
                 observer: RunObserver | None = None, progress: RunProgress | None = None,
                 overloaded: Callable[[], bool] = lambda: False,
                 overloaded_write_delay: float = OVERLOADED_EVENT_WRITE_DELAY_SECONDS) -> None:
        self.sessions = sessions
        self.observer = observer
        self.run_id = run.id
        self.attempt = run.attempt
        self.on_state = on_state
        self.progress = progress or RunProgress.for_run(run, state="running")
        self.terminal: TerminalEvent | None = None
        self._write_delay = write_delay
        self._overloaded = overloaded
        self._overloaded_write_delay = max(write_delay, overloaded_write_delay)
        self._sleep = sleep
        self._unwritten: list[dict[str, Any]] = []
        self._unwritten_lock = threading.Lock()  # the loop adds events while a thread may be writing earlier ones
        self._write_lock = threading.Lock()  # one write at a time: a later write waits for an earlier failed one's rows
        self._writer: asyncio.Task[None] | None = None

    async def __call__(self, event: Event) -> None:
        if self.observer is not None:
            self.observer.saw(event)
        row = {"run_id": self.run_id, "seq": event.seq, "type": event.type, "phase": event.phase,
               "payload": event.model_dump(mode="json", exclude={"seq", "type", "phase", "at"}), "at": event.at}
        with self._unwritten_lock:
            self._unwritten.append(row)
        match event:
            case PhaseStarted(phase=str(phase)):
                set_run_phase(phase)
                logger.info("phase %s started", phase)
            case Complete() | Aborted() | Error():
                logger.info("run %s ended: %s", self.run_id, event.type)
                self.terminal = event
                self.stop_batching()
                try:
                    await asyncio.to_thread(self.write_unwritten)  # off the loop, like the batched writes
                except Exception:  # kept: the run's final store writes them, trying again while the database is busy
                    logger.warning("could not store the events of run %s yet", self.run_id, exc_info=True)
        if self.terminal is not event and self._writer is None:
            self._writer = asyncio.create_task(self._write_soon())
        self.progress = apply_event(self.progress, event)
        if self.on_state is not None:
            try:
                await self.on_state(self.progress)
            except Exception:  # a failed status edit must never stop the research
                logger.warning("status update failed for run %s", self.run_id, exc_info=True)

    def stop_batching(self) -> None:
        """Cancel the batched write that is waiting; what it would have written stays for the next write."""
        if self._writer is not None:
            self._writer.cancel()
            self._writer = None

    def write_unwritten(self) -> None:
        """Write the events not written yet, unless a newer attempt owns the run; safe from any thread; raises what
        the database raised (the rows are then kept for the next write)."""
        with self._write_lock:
            with self._unwritten_lock:
                rows, self._unwritten = self._unwritten, []
            if not rows:
                return
            try:
                write_events(self.sessions, self.run_id, self.attempt, rows)
            except Exception:
                with self._unwritten_lock:
                    self._unwritten = rows + self._unwritten  # kept for the next write
                raise

    async def _write_soon(self) -> None:
        await self._sleep(self._overloaded_write_delay if self._overloaded() else self._write_delay)
        self._writer = None
        try:
            # In a thread: a write waiting for the database must not hold up every run sharing the event loop.
            await asyncio.to_thread(self.write_unwritten)
        except Exception:  # the next write, at the latest the final one, tries again
            logger.warning("could not store the events of run %s yet", self.run_id, exc_info=True)


def turns_of(messages: list[Message]) -> list[Turn]:
    return [Turn(role="assistant" if message.role == "assistant" else "user", content=message.text)
            for message in messages]


def without_current_question(history: list[Turn], question: str) -> list[Turn]:
    """The history before the question being answered (the bot stored it as the thread's last message)."""
    if history and history[-1]["role"] == "user" and history[-1]["content"] == question:
        return history[:-1]
    return history


def context_text(history: list[Turn]) -> str | None:
    if not history:
        return None
    return "\n".join(f"{turn['role']}: {turn['content']}" for turn in history)


def passages_and_sources(rows: list[StoredPassage]) -> tuple[list[FoundPassage], dict[str, SearchResult],
                                                         dict[str, FileDocument]]:
    """The passages and sources of the run a follow-up answers from, as the engine takes them, and which of those
    sources are shared files."""
    passages = [FoundPassage(id=row.passage_id, source_id=row.source_id, text=row.text, start=row.start,
                             end=row.end, is_snippet=row.is_snippet, page=row.page) for row in rows]
    sources = {row.source_id: SearchResult(id=row.source_id, provider=row.provider or "", title=row.title or row.url,
                                           url=row.url)
               for row in rows}
    details = {row.source_id: row.file for row in rows if row.file}  # one per source, not per passage
    files = {source_id: FileDocument.model_validate({**file, "text": ""}) for source_id, file in details.items()}
    return passages, sources, files


def file_refs(files: list[SharedFile], *, workspace: str) -> list[FileRef]:
    """The files shared in a run's conversation, as the engine takes them (the run's workspace downloads them)."""
    return [FileRef(**shared._asdict(), workspace=workspace) for shared in files]


def _file_details(document: FileDocument | None) -> dict[str, Any] | None:
    """What storage keeps of a shared file's source: its name, kind, size and SHA-256 (never its text)."""
    if document is None:
        return None
    return document.model_dump(mode="json", include={"name", "kind", "size", "sha256"})


class StartedAttempt(NamedTuple):
    """A run whose lease this worker has just taken as a new attempt, the seq its first event gets, and when (on
    `time.monotonic`) the lease was asked for: it lasts at least the lease's length from then."""

    run: Run
    first_seq: int
    asked_at: float = -math.inf  # unknown: the lease is not taken for held without asking the database

    def first_progress(self) -> RunProgress:
        """What the run's status shows as the attempt starts, before any event."""
        return RunProgress.for_run(self.run, state="running", last_seq=self.first_seq - 1)


def as_started(taken: AttemptStart | None, asked_at: float) -> StartedAttempt | None:
    """The attempt storage has just started (its lease asked for at `asked_at`), its run named on the log lines from
    now on."""
    if taken is None:
        return None
    run = taken.run
    describe_run(conversation_id=run.conversation_id, platform=run.conversation.platform, workspace=run.workspace)
    return StartedAttempt(run, taken.first_seq, asked_at)


def start_attempt(sessions: Sessions, run_id: int, owner: str, lease_seconds: float) -> StartedAttempt | None:
    """Take the run's lease as a new attempt and clear an earlier attempt's findings (blocking: call from a thread).

    Returns None when the run has ended or another attempt holds a live lease. Raises LookupError
    when the run does not exist.
    """
    asked_at = time.monotonic()  # before the statement: the lease lasts at least its length from here
    return as_started(take_attempt(sessions, run_id, owner, lease_seconds), asked_at)


astart_attempt = off_loop(start_attempt)


def findings_of(state: engine.ResearchState) -> Findings:
    """What the run gathered, as storage keeps it: its sources (with how fetching them went), passages and citations."""
    sources = []
    for source_id, found in state.sources.items():
        outcome = state.fetches.get(source_id)
        read = state.documents.get(source_id)
        sources.append(SourceFinding(
            source_id=source_id, url=found.url, title=found.title, snippet=found.snippet, provider=found.provider,
            published=found.published.isoformat() if found.published else None,
            fetch_status=outcome.status if outcome else None, fetch_reason=outcome.reason if outcome else None,
            file=_file_details(state.files.get(source_id)), checksum=read.checksum if read is not None else None))
    passages = [PassageFinding(passage_id=found.id, source_id=found.source_id, text=found.text, start=found.start,
                               end=found.end, is_snippet=found.is_snippet, page=found.page) for found in state.passages]
    citations = [CitationFinding(sentence=verdict.sentence, verdict=verdict.stored_verdict, passage_id=verdict.passage_id)
                 for verdict in (state.audit.citations if state.audit is not None else [])]
    return Findings(sources, passages, citations)


def outcome_of(final_state: RunState, state: engine.ResearchState, report: Report | None, error: str | None,
             reply_text: str | None, cancelled_by: str | None) -> AttemptOutcome:
    """How the attempt ended, as its run's row keeps it: with the report, or with the partial reason the engine gave."""
    report_columns: dict[str, Any] = {}
    if report is not None:
        report_columns = {"report_markdown": render_markdown(report), "report_json": report.model_dump(mode="json"),
                          "usage": report.usage.model_dump(mode="json"), "partial": report.partial,
                          "partial_reason": report.partial_reason}
    elif state.partial_reason:
        report_columns = {"partial": True, "partial_reason": state.partial_reason}
    return AttemptOutcome(state=final_state, error=error, cancelled_by=cancelled_by,
                          phase_timings=dict(state.phase_seconds), reply_text=reply_text, **report_columns)
