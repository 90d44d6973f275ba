"""The run's budget (calls, rounds, bytes, tokens, time), its cancel token, and its event sink."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Callable

from pydantic import BaseModel, Field

from research.events import Aborted, Complete, Emit, Error, Event, TerminalEvent

MIB = 1024 * 1024


class ResearchOptions(BaseModel):
    """What one run may spend (a research run, a chat answer, a follow-up), and what the requester asked to narrow it to."""

    max_seconds: float = 300
    max_rounds: int = 3
    max_searches: int = 30
    max_sources: int = 12
    max_fetch_bytes: int = 25 * MIB
    max_llm_tokens: int = 200_000
    since: dt.date | None = None
    sites: list[str] = Field(default_factory=list)
    blocked_domains: list[str] = Field(default_factory=list)
    preferred_domains: list[str] = Field(default_factory=list)
    results_per_query: int = 6
    passages_per_question: int = 6
    passage_token_budget: int = 6_000
    # The thread's earlier messages sent with any run, newest first (research.thread_context).
    max_context_tokens: int = 12_000
    chat_max_output_tokens: int = 4_000
    # A chat answer or follow-up, all its model calls together (prompt and output), the citation check included.
    chat_max_llm_tokens: int = 40_000
    # The asker's scope: only the files shared in the conversation, no search provider called ("files only").
    files_only: bool = False

    def for_chat(self) -> "ResearchOptions":
        """These options with the chat budget as the run's LLM token cap, for a chat answer or a follow-up."""
        return self.model_copy(update={"max_llm_tokens": self.chat_max_llm_tokens})

    @property
    def writing_reserve_seconds(self) -> float:
        """Time kept back from gathering so the report can still be written within the budget."""
        return min(60.0, self.max_seconds * 0.3)


class Budget:
    """Counts what a run spends and says, in plain words, which cap it hit first."""

    def __init__(self, options: ResearchOptions, clock: Callable[[], float] = time.monotonic) -> None:
        self.options = options
        self.clock = clock
        self.started = clock()
        self.tokens_used: Callable[[], int] = lambda: 0
        self.searches_used: Callable[[], int] = lambda: 0
        self.bytes_exhausted: Callable[[], bool] = lambda: False

    @property
    def elapsed(self) -> float:
        return self.clock() - self.started

    @property
    def gathering_seconds_left(self) -> float:
        return self.options.max_seconds - self.options.writing_reserve_seconds - self.elapsed

    def may_use_llm(self) -> bool:
        """Whether the run's LLM tokens are still under its cap (optional model calls stop once they are not)."""
        return self.tokens_used() < self.options.max_llm_tokens

    def searches_left(self) -> int:
        return max(0, self.options.max_searches - self.searches_used())

    def overrun(self) -> str | None:
        """Why gathering must stop now, or None while everything is within the caps."""
        if self.gathering_seconds_left <= 0:
            return f"time budget of {self.options.max_seconds:g} s reached"
        if self.searches_left() <= 0:
            return f"search budget of {self.options.max_searches} provider calls reached"
        if self.bytes_exhausted():
            return f"fetch budget of {self.options.max_fetch_bytes / MIB:g} MiB reached"
        if self.tokens_used() >= self.options.max_llm_tokens:
            return f"token budget of {self.options.max_llm_tokens:,} LLM tokens reached"
        return None


class CancelToken:
    """Set once by whoever stops the run; the engine checks it between steps and awaits it during them."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.cancelled_by: str | None = None

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def cancel(self, by: str | None = None) -> None:
        if not self._event.is_set():
            self.cancelled_by = by
            self._event.set()

    async def wait(self) -> None:
        await self._event.wait()

    def cancel_from_thread(self, loop: asyncio.AbstractEventLoop, by: str | None = None) -> None:
        """From another thread: cancel in `loop`, the one the run awaits the token in (nothing once it has closed:
        the run has finished)."""
        try:
            loop.call_soon_threadsafe(self.cancel, by)
        except RuntimeError:
            pass


class EventSink:
    """Numbers events `seq` 1, 2, … and forwards them; refuses anything after the terminal event."""

    def __init__(self, forward: Emit, first_seq: int = 1) -> None:
        self._forward = forward
        self._next_seq = first_seq
        self.terminal: TerminalEvent | None = None
        self._lock = asyncio.Lock()

    @property
    def last_seq(self) -> int:
        return self._next_seq - 1

    async def __call__(self, event: Event) -> None:
        async with self._lock:
            if self.terminal is not None:
                return
            event.seq = self._next_seq
            self._next_seq += 1
            if isinstance(event, (Complete, Aborted, Error)):
                self.terminal = event
            await self._forward(event)
