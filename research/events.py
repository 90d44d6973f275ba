"""Typed events the engine reports while it works; `seq` is assigned by the run's EventSink."""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Awaitable, Callable, Mapping
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

Phase = Literal["decompose", "search", "fetch", "read", "gap_check", "synthesize", "verify", "plan", "chat", "answer"]


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class _Event(BaseModel):
    model_config = ConfigDict(defer_build=True)

    seq: int = 0
    at: dt.datetime = Field(default_factory=_now)
    phase: Phase | None = None


class PhaseStarted(_Event):
    type: Literal["phase_started"] = "phase_started"


class PhaseDone(_Event):
    type: Literal["phase_done"] = "phase_done"
    seconds: float = 0.0
    counts: dict[str, int] = Field(default_factory=dict)


class PhaseFailed(_Event):
    type: Literal["phase_failed"] = "phase_failed"
    reason: str


class Progress(_Event):
    type: Literal["progress"] = "progress"
    counts: dict[str, int] = Field(default_factory=dict)
    percent: float = 0.0


class ProviderCall(_Event):
    type: Literal["provider_call"] = "provider_call"
    provider: str
    query: str


class ProviderResult(_Event):
    type: Literal["provider_result"] = "provider_result"
    provider: str
    query: str
    results: int
    seconds: float = 0.0


class ProviderError(_Event):
    type: Literal["provider_error"] = "provider_error"
    provider: str
    query: str | None = None
    reason: str
    skipped: bool = False


class LLMUsage(_Event):
    type: Literal["llm_usage"] = "llm_usage"
    model: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    step: str | None = None  # the engine step that made the call (decompose, synthesize, citation_check, …)


class Warning_(_Event):
    type: Literal["warning"] = "warning"
    message: str
    detail: dict[str, Any] = Field(default_factory=dict)


class PlanReady(_Event):
    """The sub-questions the research will answer, once decomposed (shown as tasks on platforms that can)."""

    type: Literal["plan_ready"] = "plan_ready"
    sub_questions: list[str] = Field(default_factory=list)


class ReadPage(BaseModel):
    """A page whose text was read: its source id, address and title."""

    source_id: str
    url: str
    title: str = ""


class SourcesRead(_Event):
    """Pages read since the last such event (shown as a task's sources on platforms that can)."""

    type: Literal["sources_read"] = "sources_read"
    pages: list[ReadPage] = Field(default_factory=list)


class Complete(_Event):
    type: Literal["complete"] = "complete"
    partial: bool = False
    partial_reason: str | None = None


class Aborted(_Event):
    type: Literal["aborted"] = "aborted"
    reason: str = "cancelled"


class Error(_Event):
    type: Literal["error"] = "error"
    message: str


Event = Annotated[
    Union[
        PhaseStarted, PhaseDone, PhaseFailed, Progress, ProviderCall, ProviderResult,
        ProviderError, LLMUsage, Warning_, PlanReady, SourcesRead, Complete, Aborted, Error,
    ],
    Field(discriminator="type"),
]
@functools.cache
def event_adapter() -> TypeAdapter[Event]:
    """The validator of any event, built when a stored event is first read (not when the module is imported)."""
    return TypeAdapter(Event)
# Exactly one of these ends every run; nothing follows it.
TerminalEvent = Complete | Aborted | Error
TERMINAL_TYPES = frozenset({"complete", "aborted", "error"})

# How the engine reports: every phase, the search router and the scrape fallback await it with each event.
Emit = Callable[[Event], Awaitable[None]]


def event_from_stored(*, type: str, phase: str | None, payload: Mapping[str, Any], seq: int, at: dt.datetime) -> Event:
    """The event a stored row holds (its columns and the rest of its fields in `payload`), as its own class.

    Raises pydantic.ValidationError when `type` is no event's or the payload does not fit it.
    """
    return event_adapter().validate_python({**payload, "type": type, "phase": phase, "seq": seq, "at": at})

