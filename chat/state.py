"""A run's renderable state (for status messages on every platform), folded from its events by a pure function."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal, assert_never

from pydantic import BaseModel, Field

from research.events import (
    Aborted,
    Complete,
    Error,
    Event,
    LLMUsage,
    PhaseDone,
    PhaseFailed,
    PhaseStarted,
    PlanReady,
    Progress,
    ProviderCall,
    ProviderError,
    ProviderResult,
    SourcesRead,
    Warning_,
    event_from_stored,
)
from storage.vocabulary import TERMINAL_STATES, RunMode, RunState

if TYPE_CHECKING:
    from storage.models import Event as StoredEvent
    from storage.models import Run

PhaseStatus = Literal["waiting", "current", "done", "failed"]

PHASES_BY_MODE: dict[RunMode, list[str]] = {
    "research": ["decompose", "search", "fetch", "read", "gap_check", "synthesize", "verify"],
    "plan": ["plan"],
    "chat": ["chat"],
    "followup": ["answer", "verify"],
}
# Research of the shared files only: nothing is searched or fetched, so the checklist does not say it was.
FILES_ONLY_PHASES = ["decompose", "read", "synthesize", "verify"]
PHASE_LABELS = {
    "decompose": "Planning the research",
    "search": "Searching the web",
    "fetch": "Fetching pages",
    "read": "Reading pages",
    "gap_check": "Checking for gaps",
    "synthesize": "Writing the report",
    "verify": "Auditing citations",
    "plan": "Drafting a plan",
    "chat": "Thinking",
    "answer": "Answering from the sources",
}


class PhaseLine(BaseModel):
    name: str
    status: PhaseStatus = "waiting"

    @property
    def label(self) -> str:
        return PHASE_LABELS.get(self.name, self.name)


class PageRead(BaseModel):
    """A page the run has read, as a task's source: its address and title."""

    source_id: str
    url: str
    title: str = ""


class RunProgress(BaseModel):
    """What the status message shows about one run at one moment."""

    run_id: int
    attempt: int = 0
    mode: RunMode
    question: str
    requested_by: str
    state: RunState = "queued"
    phases: list[PhaseLine] = Field(default_factory=list)
    counts: dict[str, int] = Field(default_factory=dict)
    percent: float = 0.0
    # When it was asked for (the run's created_at): its time counts from there, waiting in the queue included.
    requested_at: dt.datetime | None = None
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    last_seq: int = 0
    warnings: int = 0
    last_warning: str | None = None
    partial: bool = False
    partial_reason: str | None = None
    error: str | None = None
    cancelled_by: str | None = None
    queue_position: int | None = None
    audit_line: str | None = None
    sub_questions: list[str] = Field(default_factory=list)
    pages_read: list[PageRead] = Field(default_factory=list)

    @classmethod
    def for_run(cls, run: Run, **update: Any) -> RunProgress:
        """A stored run's progress before any event (its mode's phases, its attempt and start), with `update` set
        (a state, the last event seen, a queue position): the one way every status starts from a run row."""
        return initial_progress(run_id=run.id, mode=run.mode, question=run.question, requested_by=run.requested_by,
                                attempt=run.attempt, requested_at=run.created_at, started_at=run.started_at,
                                files_only=run.options is not None and run.options.files_only,
                                ).model_copy(update=update)

    @property
    def current_phase(self) -> str | None:
        return next((line.name for line in self.phases if line.status == "current"), None)

    def elapsed_seconds(self, now: dt.datetime) -> float:
        """Seconds since the run was asked for (since it started, when that is unknown) until it ended or `now`."""
        since = self.requested_at or self.started_at
        if since is None:
            return 0.0
        return max(0.0, ((self.finished_at or now) - since).total_seconds())


def initial_progress(*, run_id: int, mode: RunMode, question: str, requested_by: str, state: RunState = "queued",
                     requested_at: dt.datetime | None = None, started_at: dt.datetime | None = None,
                     attempt: int = 0, files_only: bool = False) -> RunProgress:
    """The state of a run before any event (a research run of the shared files only lists no search or fetch)."""
    names = FILES_ONLY_PHASES if files_only and mode == "research" else PHASES_BY_MODE.get(mode, [])
    phases = [PhaseLine(name=name) for name in names]
    return RunProgress(run_id=run_id, attempt=attempt, mode=mode, question=question, requested_by=requested_by,
                       state=state, phases=phases, requested_at=requested_at, started_at=started_at)


def _set_phase(phases: list[PhaseLine], name: str | None, status: PhaseStatus) -> list[PhaseLine]:
    if name is None:  # the engine names the phase of every phase event; a stored row without one changes no line
        return phases
    lines = [line.model_copy() for line in phases]
    if not any(line.name == name for line in lines):
        lines.append(PhaseLine(name=name))
    seen_target = False
    for line in lines:
        if line.name == name:
            line.status = status
            seen_target = True
        elif status == "current" and line.status == "current":
            line.status = "done"
        elif status == "current" and not seen_target and line.status == "waiting" and line.name != "gap_check":
            # A phase skipped on the way (no new queries, nothing to fetch) counts as done.
            line.status = "done"
    return lines


def apply_event(progress: RunProgress, event: Event) -> RunProgress:
    """The progress after `event`; returns a new object."""
    update: dict[str, Any] = {"last_seq": max(progress.last_seq, event.seq), "state": "running" if progress.state == "queued" else progress.state}
    match event:
        case PhaseStarted(phase=phase):
            update["phases"] = _set_phase(progress.phases, phase, "current")
        case PhaseDone(phase=phase, counts=counts):
            update["phases"] = _set_phase(progress.phases, phase, "done")
            update["counts"] = {**progress.counts, **counts}
        case PhaseFailed(phase=phase):
            update["phases"] = _set_phase(progress.phases, phase, "failed")
        case Progress(counts=counts, percent=percent):
            update["counts"] = {**progress.counts, **counts}
            update["percent"] = max(progress.percent, percent)
        case Warning_(message=message):
            update.update(warnings=progress.warnings + 1, last_warning=message)
        case PlanReady(sub_questions=sub_questions):
            update["sub_questions"] = list(sub_questions)
        case SourcesRead(pages=pages):
            known = {page.source_id for page in progress.pages_read}
            update["pages_read"] = [*progress.pages_read, *(PageRead(source_id=page.source_id, url=page.url, title=page.title)
                                                           for page in pages if page.source_id not in known)]
        case Complete(partial=partial, partial_reason=partial_reason):
            update.update(state="done", percent=100.0, partial=partial, partial_reason=partial_reason,
                          phases=[line.model_copy(update={"status": "done" if line.status in ("current", "done") else line.status})
                                  for line in progress.phases])
        case Aborted():
            update.update(state="cancelled")
        case Error(message=message):
            update.update(state="failed", error=message)
        case ProviderCall() | ProviderResult() | ProviderError() | LLMUsage():
            pass  # counted by the metrics and the report's footer; a status message does not show them
        case _:
            assert_never(event)
    return progress.model_copy(update=update)


def progress_of_stored_run(run: Run, events: Iterable[StoredEvent], progress: RunProgress | None = None) -> RunProgress:
    """A stored run's progress: `progress` (or a fresh one) with the stored `events` after it folded in,
    and the run row's final state when it has ended."""
    progress = progress or RunProgress.for_run(run)
    for row in events:
        if row.seq > progress.last_seq:
            progress = apply_event(progress, event_from_stored(type=row.type, phase=row.phase, payload=row.payload,
                                                               seq=row.seq, at=row.at))
    update: dict[str, Any] = {"requested_at": run.created_at, "started_at": run.started_at, "attempt": run.attempt}
    if run.state in TERMINAL_STATES:
        update.update(state=run.state, error=run.error, cancelled_by=run.cancelled_by, partial=run.partial,
                      partial_reason=run.partial_reason, finished_at=run.finished_at)
    return progress.model_copy(update=update)
