"""The engine: research as its list of phases, plus plan, chat and follow-up answers.

decompose → (search → fetch → read → gap check)* → synthesize → verify. Gathering stops early
when the budget runs out (the report is then marked partial); a cancel stops everything within
a second and keeps what was gathered; exactly one terminal event ends every call.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import math
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from concurrent.futures import Executor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import httpx
from pydantic import BaseModel

from research.budget import Budget, CancelToken, EventSink, ResearchOptions
from research.changes import text_checksum
from research.errors import DeepthreadError, internal_error_reason
from research.events import (
    Aborted,
    Complete,
    Emit,
    LLMUsage,
    Error,
    Phase,
    PhaseDone,
    PhaseFailed,
    PhaseStarted,
    PlanReady,
    Progress,
    ReadPage,
    SourcesRead,
    Warning_,
)
from research.fetch import FetchBudget, FetchConfig, SafeFetcher, build_fetch_client
from research.files import FileDocument, FileDownloader, FileRef, FileRefused
from research.limits import CircuitBreaker, RateLimiter
from research.llm import (
    ContextOverflow,
    LLMClient,
    LLMError,
    LLMTimeout,
    LongAnswer,
    Message,
    OnText,
    StructuredOutputError,
    UsageLedger,
    UsageRecord,
    estimate_prompt_tokens,
)
from research.models import Document, FetchResult, Passage, SearchResult
from research.netguard import Resolver
from research.phases import decompose as decompose_phase
from research.phases import fetch as fetch_phase
from research.phases import files as files_phase
from research.phases import gap_check as gap_phase
from research.phases import read as read_phase
from research.phases import search as search_phase
from research.phases import synthesize as synthesize_phase
from research.phases.decompose import Decomposition
from research.plan import ResearchPlan, plan_as_decomposition, render_plan_markdown
from research.prompts import system_prompt
from research import readers
from research.rank import rank_passages_for_queries
from research.providers import NoSearchProviderError, SearchConfig, SearchRouter, build_router, build_scraper
from research.scrape_fallback import FallbackFetcher
from research.sources import SourceRegistry
from research.report import (
    TITLE_QUESTION_CHARS,
    AuditFigures,
    Report,
    ReportSource,
    UsageSummary,
    shortened,
    split_title,
    unfinished_title,
)
from research.thread_context import Turn
from research.untrusted import fence_passages, fence_untrusted

if TYPE_CHECKING:  # the citation audit is imported where a run audits (and early by research.readers.preload)
    from research.phases import verify as verify_phase

logger = logging.getLogger(__name__)

NO_SOURCES_NOTICE = "No sources could be found for this question, so there is nothing to report yet."
NOTHING_SUPPORTED_REASON = ("the model's report states nothing that the pages read support, so none of it could be "
                            "verified")
# Room for the gap check's verdict (a covered flag per sub-question and a few queries).
GAP_CHECK_ANSWER_TOKENS = 600
# Room for a claims answer (fifteen short sentences and their ids, with JSON around them).
CLAIMS_ANSWER_TOKENS = 1_500
# The share of a passage budget left for text once each passage's fence (id, title, URL) is paid for.
FENCE_SHARE = 0.85
# Each phase's share of the progress bar, in percent and in run order. A gathering phase's share is
# spread over the rounds; synthesis with a real model is the slowest phase, so it has the largest.
PROGRESS_WEIGHTS: dict[Phase, float] = {
    "decompose": 5, "search": 8, "fetch": 16, "read": 8, "gap_check": 8, "synthesize": 45, "verify": 10,
}
ROUND_PHASES: tuple[Phase, ...] = ("search", "fetch", "read", "gap_check")
# Synthesis progress follows 1 - e^(-t/τ): about two thirds of its share after τ seconds, never all of it.
SYNTHESIS_TIME_CONSTANT = 30.0
PROGRESS_INTERVAL = 1.0
# A run can fail to fetch dozens of pages; the unfinished report names the first few.
NOT_READ_LISTED = 10


def phase_progress(phase: Phase, done: float = 1.0, *, round_number: int = 1, rounds: int = 1) -> float:
    """The percent once `done` (0 to 1) of `phase` is behind the run; a gathering phase in round `round_number` of `rounds`."""
    names = list(PROGRESS_WEIGHTS)
    before = sum(PROGRESS_WEIGHTS[name] for name in names[:names.index(phase)])
    if phase not in ROUND_PHASES:
        return before + PROGRESS_WEIGHTS[phase] * done
    rounds = max(rounds, 1)
    round_number = min(max(round_number, 1), rounds)
    gathering_start = sum(PROGRESS_WEIGHTS[name] for name in names[:names.index(ROUND_PHASES[0])])
    round_weight = sum(PROGRESS_WEIGHTS[name] for name in ROUND_PHASES)
    within_round = before - gathering_start + PROGRESS_WEIGHTS[phase] * done
    return gathering_start + (round_weight * (round_number - 1) + within_round) / rounds


def synthesis_progress(seconds: float) -> float:
    """The percent `seconds` into synthesis: quick at first, then slower, and never the end of the phase."""
    share = 1.0 - math.exp(-max(seconds, 0.0) / SYNTHESIS_TIME_CONSTANT)
    # Percents are reported to a tenth: stop a tenth short, so that only the phase's end shows its end.
    return min(phase_progress("synthesize", share), phase_progress("synthesize") - 0.1)


class ProgressMeter:
    """Reports the run's percent as `Progress` events: never backwards, and ticking on its own through a long phase."""

    def __init__(
        self,
        sink: Emit,
        counts: Callable[[], dict[str, int]],
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.sink = sink
        self.counts = counts
        self.clock = clock
        self.sleep = sleep
        self.percent = 0.0

    async def reach(self, percent: float) -> None:
        """Report `percent` (to a tenth, at most 100) if it is ahead of the last one reported."""
        rounded = round(min(percent, 100.0), 1)
        if rounded <= self.percent:
            return
        self.percent = rounded
        await self.sink(Progress(counts=self.counts(), percent=rounded))

    @asynccontextmanager
    async def ticking(self, percent_at: Callable[[float], float], interval: float = PROGRESS_INTERVAL) -> AsyncIterator[None]:
        """Report `percent_at(seconds since the block began)` every `interval` seconds until the block ends."""
        started = self.clock()

        async def tick() -> None:
            while True:
                await self.sleep(interval)
                await self.reach(percent_at(self.clock() - started))

        ticker = asyncio.create_task(tick())
        try:
            yield
        finally:
            ticker.cancel()
            await asyncio.gather(ticker, return_exceptions=True)


@dataclass
class ResearchTools:
    """What the composition root hands the engine for research: clients, resolver, limits, a CPU pool."""

    llm: LLMClient
    search_config: SearchConfig
    search_http: httpx.AsyncClient
    resolver: Resolver
    fetch_config: FetchConfig = field(default_factory=FetchConfig)
    fetch_transport: httpx.AsyncBaseTransport | None = None
    fetch_ssl_context: ssl.SSLContext | None = None
    limiter: RateLimiter | None = None
    breaker: CircuitBreaker | None = None
    ddgs_search: Callable[..., Any] | None = None
    cpu_pool: Executor | None = None
    today: Callable[[], dt.date] = dt.date.today
    # The run's platform's way to the files shared in its conversation (None: no files can be read here).
    files: FileDownloader | None = None
    file_limits: files_phase.FileLimits = field(default_factory=files_phase.FileLimits)


@dataclass
class ResearchState:
    """Everything a run has gathered so far; the caller keeps it whatever way the run ends."""

    question: str = ""
    plan: Decomposition | None = None
    plan_fell_back: bool = False
    sources: dict[str, SearchResult] = field(default_factory=dict)
    fetches: dict[str, FetchResult] = field(default_factory=dict)
    documents: dict[str, Document] = field(default_factory=dict)
    # The shared files read, by source id (their text dropped once cut into passages).
    files: dict[str, FileDocument] = field(default_factory=dict)
    passages: list[Passage] = field(default_factory=list)
    draft: str | None = None
    # Words of the report written so far, shown while the model writes (the text itself only once audited).
    words_written: int = 0
    # Why the written draft is partial when it was cut off (None once another version replaces it).
    draft_cut_off: str | None = None
    notes: list[str] = field(default_factory=list)
    tainted_words: set[str] = field(default_factory=set)
    audit: verify_phase.AuditResult | None = None
    # False once the report's text is the engine's own (no sources found) or quotes (the model could not write it).
    written_by_ai: bool = True
    report: Report | None = None
    phase_seconds: dict[str, float] = field(default_factory=dict)
    partial_reason: str | None = None
    llm_usage: UsageLedger = field(default_factory=UsageLedger)
    search_calls: dict[str, int] = field(default_factory=dict)
    skipped_providers: dict[str, str] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)

    @property
    def total_tokens(self) -> int:
        return self.llm_usage.total_tokens

    @property
    def counts(self) -> dict[str, int]:
        return {
            "sub_questions": len(self.plan.sub_questions) if self.plan else 0,
            "results": len(self.sources),
            "pages_read": len(self.documents),
            "passages": len(self.passages),
            **({"words_written": self.words_written} if self.words_written else {}),
        }

    def titles(self) -> dict[str, tuple[str, str]]:
        return {sid: (source.title, source.url) for sid, source in self.sources.items()}

    def record_usage(self, record: UsageRecord) -> None:
        self.llm_usage.add(record)

    def usage_summary(self, fetch_budget: FetchBudget | None = None) -> UsageSummary:
        return UsageSummary(
            llm={model: usage.model_copy() for model, usage in self.llm_usage.by_model.items()},
            total_tokens=self.llm_usage.total_tokens,
            cost=round(self.llm_usage.cost, 6),
            search_calls=dict(self.search_calls),
            pages_fetched=sum(1 for result in self.fetches.values() if result.ok),
            bytes_fetched=fetch_budget.spent if fetch_budget else sum(r.bytes_read for r in self.fetches.values()),
            seconds=round(time.monotonic() - self.started, 2),
        )


class _Run:
    """One call of an entry point: its events, cancel token, state and phase timing."""

    def __init__(self, question: str, events: Emit, cancel: CancelToken | None, state: ResearchState | None,
                 first_seq: int) -> None:
        self.sink = EventSink(events, first_seq=first_seq)
        self.cancel = cancel or CancelToken()
        self.state = state or ResearchState()
        self.state.question = question
        self.meter = ProgressMeter(self.sink, lambda: self.state.counts)

    async def progress(self, percent: float) -> None:
        await self.meter.reach(percent)

    @asynccontextmanager
    async def phase(self, name: Phase) -> AsyncIterator[None]:
        await self.sink(PhaseStarted(phase=name))
        started = time.monotonic()
        try:
            yield
        except asyncio.CancelledError:
            raise
        except Exception as error:
            await self.sink(PhaseFailed(phase=name, reason=plain_reason(error)))
            raise
        finally:
            elapsed = time.monotonic() - started
            self.state.phase_seconds[name] = round(self.state.phase_seconds.get(name, 0.0) + elapsed, 3)
        await self.sink(PhaseDone(phase=name, seconds=round(elapsed, 3), counts=self.state.counts))

    async def finish(self, work: Callable[[], Awaitable[Report]]) -> Report | None:
        """Run `work` until it ends or the cancel token fires; emit the one terminal event."""
        task = asyncio.ensure_future(work())
        cancelled = asyncio.ensure_future(self.cancel.wait())
        try:
            await asyncio.wait({task, cancelled}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            # Our caller gave up (a hard deadline): stop the work too, keeping what it gathered.
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise
        finally:
            cancelled.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            self.state.report = unfinished_report(self.state, reason="stopped by user", stopped_by_user=True)
            await self.sink(Aborted(reason=f"stopped by {self.cancel.cancelled_by}" if self.cancel.cancelled_by else "cancelled"))
            return self.state.report
        if task.cancelled():
            await self.sink(Error(message="The run was interrupted before it could finish; what it found is kept."))
            return None
        error = task.exception()
        if error is None:
            report = task.result()
            self.state.report = report
            await self.sink(Complete(partial=report.partial, partial_reason=report.partial_reason))
            return report
        if not isinstance(error, (LLMError, NoSearchProviderError)):
            logger.error("engine failed", exc_info=error)
        await self.sink(Error(message=plain_reason(error)))
        return None


def plain_reason(error: BaseException) -> str:
    """What went wrong, in words a person in the thread can act on; never a traceback or a secret."""
    return error.plain_reason if isinstance(error, DeepthreadError) else internal_error_reason(error)


def cut_off_reason(llm: LLMClient, *, limit: int | None = None, setting: str = "LLM_MAX_OUTPUT_TOKENS") -> str:
    """Why a report is partial when the model kept stopping at its output limit (`limit`, else the client's)."""
    return (f"the model's report was cut off at its output limit ({limit or llm.config.max_output_tokens:,} tokens, "
            f"{setting}), even after it was asked to continue")


def _chat_cut_off_reason(llm: LLMClient, options: ResearchOptions) -> str:
    return cut_off_reason(llm, limit=options.chat_max_output_tokens, setting="CHAT_MAX_OUTPUT_TOKENS")


def unfinished_report(state: ResearchState, *, reason: str, stopped_by_user: bool = False) -> Report:
    """The report of a run that did not finish: the audited draft if one was written, else the pages it had read."""
    if state.audit is not None and state.audit.body_markdown.strip():
        own_title, body = split_title(state.audit.body_markdown)
        title = own_title or state.question or unfinished_title(state.question, stopped_by_user=stopped_by_user)
        sources, cited, audit = state.audit.sources, state.audit.cited_passages, state.audit.audit
        written_by_ai = state.written_by_ai
    else:
        written_by_ai = False  # the engine's words: why it stopped, and the pages it had read
        title = unfinished_title(state.question, stopped_by_user=stopped_by_user)
        sources, cited, audit = _read_sources(state), [], AuditFigures()
        body = _unwritten_body(state, reason, stopped_by_user=stopped_by_user, pages_read=len(sources))
    return Report(
        question=state.question, title=title, body_markdown=body, sources=sources, cited_passages=cited,
        audit=audit, usage=state.usage_summary(), phase_seconds=state.phase_seconds,
        partial=True, partial_reason=reason, skipped_providers=state.skipped_providers, stopped_by_user=stopped_by_user,
        written_by_ai=written_by_ai,
    )


def _source_order(source_id: str) -> int:
    return int(source_id[1:]) if source_id[1:].isdigit() else 0


def _read_sources(state: ResearchState) -> list[ReportSource]:
    """The sources whose pages were read, numbered in the order they were found."""
    read = [(source_id, state.sources[source_id]) for source_id in sorted(state.documents, key=_source_order)
            if source_id in state.sources]
    return _with_file_details([
        ReportSource(number=number, source_id=source_id, url=source.url, provider=source.provider,
                     title=source.title or state.documents[source_id].title or source.url)
        for number, (source_id, source) in enumerate(read, start=1)
    ], state)


def _with_file_details(sources: list[ReportSource], state: ResearchState) -> list[ReportSource]:
    """`sources` with each shared file's kind, size, checksum and cited pages."""
    if not state.files:
        return sources
    passages = {passage.id.lower(): passage for passage in state.passages}
    return [files_phase.described(source, state.files[source.source_id], passages)
            if source.source_id in state.files else source for source in sources]


async def _add_shared_files(run: _Run, shared: files_phase.SharedFiles, registry: SourceRegistry,
                            timeout: float) -> None:
    """The shared files, read within `timeout` seconds: each a source with its passages, or a refusal named in a
    warning and the notes."""
    state = run.state
    documents: dict[str, Document] = {}
    read_files: dict[str, FileDocument] = {}
    for ref, read in await shared.results(timeout=timeout):
        if isinstance(read, FileRefused):
            await run.sink(Warning_(phase="read", message=read.plain_reason, detail={"file": ref.name}))
            state.notes.append(read.plain_reason)
            continue
        checksum = text_checksum(read.text)  # of the text as read, before it is defused, as a web page's is
        # Defused here, page by page, so that a PDF's pages still match its passages' offsets.
        read, tainted = files_phase.defused(read)
        state.tainted_words |= tainted
        source = files_phase.register(registry, ref, read)
        state.sources[source.id] = source
        documents[source.id] = files_phase.as_document(read, source.url, checksum=checksum)
        read_files[source.id] = read
    if shared.skipped:
        note = (f"Only the newest {len(shared.refs)} files shared in this conversation were read; older ones were "
                "left out (FILE_MAX_PER_RUN).")
        await run.sink(Warning_(phase="read", message=note))
        state.notes.append(note)
    if not documents:
        return
    state.documents.update(documents)
    made = read_phase.read_passages(documents, first_number=len(state.passages) + 1)
    state.passages.extend(files_phase.with_pages(made.passages, read_files))
    # The text lives on in the passages; what stays is what the source list and the export say of the file.
    state.files.update({source_id: read.model_copy(update={"text": ""}) for source_id, read in read_files.items()})
    state.tainted_words |= made.tainted_words
    await run.sink(SourcesRead(phase="read", pages=[ReadPage(source_id=source_id, url=state.sources[source_id].url,
                                                             title=state.sources[source_id].title)
                                                    for source_id in documents]))


def _unwritten_body(state: ResearchState, reason: str, *, stopped_by_user: bool, pages_read: int) -> str:
    """What a run that wrote no report says instead: why, what it read, and which pages it could not read."""
    lines = ["The research was stopped before the report was written." if stopped_by_user
             else f"The run ended before the report was written ({reason})."]
    if pages_read:
        lines.append("This source had been found and read; it is listed below." if pages_read == 1
                     else f"These {pages_read} sources had been found and read; they are listed below.")
    not_read = [(state.sources[source_id].url, _why_not_read(result))
                for source_id, result in sorted(state.fetches.items(), key=lambda item: _source_order(item[0]))
                if source_id not in state.documents and source_id in state.sources]
    if not_read:
        listed = "; ".join(f"{url} ({why})" for url, why in not_read[:NOT_READ_LISTED])
        more = f"; and {len(not_read) - NOT_READ_LISTED} more" if len(not_read) > NOT_READ_LISTED else ""
        lines.append(f"Not read: {listed}{more}.")
    unfetched = len(set(state.sources) - set(state.fetches))
    if unfetched:
        lines.append(f"{unfetched} more search {'result was' if unfetched == 1 else 'results were'} not fetched yet.")
    return "\n\n".join(lines)


def _why_not_read(result: FetchResult) -> str:
    if not result.ok:
        return " ".join((result.reason or result.status).split())
    # A page is emptied once read, so a body still there was fetched but not read yet.
    return "not read before the run ended" if result.body else "no readable text"


async def research(
    question: str,
    *,
    plan: Decomposition | ResearchPlan | dict[str, Any] | None = None,
    context: str | None = None,
    options: ResearchOptions,
    tools: ResearchTools,
    events: Emit,
    cancel: CancelToken | None = None,
    state: ResearchState | None = None,
    first_seq: int = 1,
    files: Sequence[FileRef] = (),
) -> Report | None:
    """Research `question` and return the audited report (None after an error event); `files`, shared in the
    conversation, are read as sources beside the web's (instead of it, with `options.files_only`)."""
    run = _Run(question, events, cancel, state, first_seq)
    return await run.finish(lambda: _research(run, question, plan, context, options, tools, files))


async def _research(run: _Run, question: str, plan: Any, context: str | None,
                    options: ResearchOptions, tools: ResearchTools, files: Sequence[FileRef] = ()) -> Report:
    # The ranker's libraries (and the readers, without a CPU pool) load in a thread while the run waits on its model.
    readers.preload(reads_here=tools.cpu_pool is None)
    state = run.state
    budget = Budget(options)
    fetch_budget = FetchBudget(options.max_fetch_bytes)
    budget.bytes_exhausted = lambda: fetch_budget.exhausted
    budget.tokens_used = lambda: state.total_tokens

    llm = _llm_for_run(run, tools.llm)
    search_config = tools.search_config.model_copy(update={
        "blocked_domains": [*tools.search_config.blocked_domains, *options.blocked_domains],
        "preferred_domains": [*(options.sites or tools.search_config.preferred_domains), *options.preferred_domains],
        "restrict_to_preferred": bool(options.sites),
    })
    router = build_router(search_config, http=tools.search_http, emit=run.sink, limiter=tools.limiter,
                          breaker=tools.breaker, ddgs_search=tools.ddgs_search)
    budget.searches_used = lambda: router.total_calls
    fetch_client = build_fetch_client(tools.fetch_config, tools.fetch_transport, ssl_context=tools.fetch_ssl_context)
    # Every hop, redirects included, is checked against the run's blocked domains.
    fetch_config = tools.fetch_config.model_copy(update={"blocked_domains": tuple(search_config.blocked_domains)})
    # Pages the safe fetcher cannot read (bot walls, JavaScript shells, timeouts) go to Firecrawl when it is configured.
    fetcher = FallbackFetcher(
        SafeFetcher(fetch_client, tools.resolver, fetch_config, fetch_budget),
        scraper=build_scraper(search_config, http=tools.search_http), registry=router.registry, emit=run.sink,
        count_call=router.count_call, may_call=lambda: budget.searches_left() > 0, cpu_pool=tools.cpu_pool,
    )
    today = tools.today()
    reader = read_phase.PageReader(cpu_pool=tools.cpu_pool)
    # Downloaded and read while the model plans.
    shared = (files_phase.SharedFiles(files, downloader=tools.files, limits=tools.file_limits, cpu_pool=tools.cpu_pool)
              if files else None)
    question_search: search_phase.QuestionSearch | None = None
    question_pages: QuestionPages | None = None
    ahead: ReportInAdvance | None = None
    # The model's window is asked of the server (once per process) while the run plans and gathers; the prompts that
    # may not fit (gap check, report) wait for it.
    window = asyncio.ensure_future(asyncio.gather(llm.context_tokens(), llm.context_tokens(fast=True)))
    try:
        async with run.phase("decompose"):
            # Registered first, so that the question's own search cannot take the ids that put them first.
            for url in decompose_phase.priority_urls(question):
                if router.registry.is_blocked(url):
                    await run.sink(Warning_(phase="decompose", message=f"Skipped {url}: its domain is blocked."))
                    continue
                source = router.registry.add(SearchResult(provider="user", title=url, url=url))
                state.sources[source.id] = source
            if plan is not None:
                state.plan = plan_as_decomposition(plan)
            else:
                # A follow-up's question may lean on the thread, and a lone search must not use the round's last one.
                if context is None and options.max_searches > 1 and not options.files_only:
                    question_query = search_phase.build_queries([decompose_phase.question_as_query(question)], searches_left=1,
                                                                since=options.since, already_asked=set(),
                                                                results_per_query=options.results_per_query)
                    question_search = search_phase.QuestionSearch(question_query[0], router=router) if question_query else None
                    if question_search is not None:
                        # Its pages are fetched and read as soon as it answers, while the model still plans.
                        question_pages = QuestionPages(run, question_search, fetcher, reader, options)
                try:
                    state.plan, state.plan_fell_back = await decompose_phase.decompose(question, llm=llm, today=today,
                                                                                       context=context)
                except (LLMTimeout, ContextOverflow) as error:
                    # Not asked again (the model may still be working on it): the question itself is the plan.
                    await run.sink(Warning_(phase="decompose", message=f"Planning skipped: {plain_reason(error)}"))
                    state.plan, state.plan_fell_back = decompose_phase.fallback(question), True
                if state.plan_fell_back:
                    await run.sink(Warning_(phase="decompose", message="The question could not be broken down; researching it as asked."))
            await run.sink(PlanReady(phase="decompose", sub_questions=[sub.question for sub in state.plan.sub_questions]))
        await run.progress(phase_progress("decompose"))
        if shared is not None:
            async with run.phase("read"):
                await _add_shared_files(run, shared, router.registry, timeout=max(0.0, budget.gathering_seconds_left))

        async def write_report(shown: Callable[[], bool]) -> tuple[list[Passage], bool]:
            return await _write_report(run, question, context, options, llm, today, shown=shown)

        try:
            if not options.files_only:  # the asker's scope: no search provider is called
                async with asyncio.timeout(max(0.0, budget.gathering_seconds_left)):
                    ahead = await _gather(run, question, options, budget, router, fetcher, llm, tools, today,
                                          reader=reader, question_search=question_search, question_pages=question_pages,
                                          window=window,
                                          write_report=write_report if llm.config.serves_in_parallel() else None)
        except TimeoutError:
            state.partial_reason = state.partial_reason or f"time budget of {options.max_seconds:g} s reached"
        await _read_unread(run, reader)
        if not state.passages:
            state.passages = read_phase.snippet_passages(
                [source for source in state.sources.values() if source.id not in state.files])

        await asyncio.wait([window])
        await run.progress(phase_progress("synthesize", 0.0))
        selected: list[Passage] = []
        writing_error: LLMError | None = None
        wrote_claims = False
        try:
            async with run.phase("synthesize"):
                if state.passages:
                    async with run.meter.ticking(synthesis_progress):
                        selected, wrote_claims = await (ahead.kept() if ahead is not None else write_report(lambda: True))
                else:
                    state.draft = NO_SOURCES_NOTICE
                    state.written_by_ai = False
        except LLMError as error:
            # The sources are gathered and stored: a model down now still leaves the reader what was found.
            writing_error = error
        await run.progress(phase_progress("synthesize"))

        from research.phases import verify as verify_phase

        if writing_error is not None:
            from research.phases import digest as digest_phase

            reason = digest_phase.writing_failure(writing_error)
            await run.sink(Warning_(phase="synthesize", message=f"The report could not be written: {reason}; "
                                                                 "quoting the sources instead."))
            async with run.phase("verify"):
                digest = await digest_phase.quote_digest(question, state.plan, selected or state.passages,
                                                         state.sources, reason=reason)
            # With nothing quotable, the empty body below makes it the unfinished report: the sources read, and why.
            state.audit = digest or verify_phase.AuditResult(body_markdown="")
            state.written_by_ai = False
            state.partial_reason = f"{reason}, so this report quotes the sources instead of answering" if digest else reason
        elif selected:
            async with run.phase("verify"):
                state.audit = await _audit(state.draft or "", selected, state, llm, today, budget)
                if not wrote_claims and state.audit.body_markdown.strip() and not _cites_inline(state.audit):
                    await _cite_through_claims(run, question, context, options, llm, today, budget, selected)
            # The report that stands was cut off (a draft replaced by claims is not the report any more).
            state.partial_reason = state.partial_reason or state.draft_cut_off
            if state.audit.body_markdown.strip() and state.audit.audit.sentences_verified == 0:
                # Delivered, so the reader sees what the model wrote, but never as done: nothing in it is verified.
                state.partial_reason = state.partial_reason or NOTHING_SUPPORTED_REASON
        else:
            # The engine's own notice cites nothing and claims nothing: auditing it could only mark it unverified.
            state.audit = verify_phase.AuditResult(body_markdown=state.draft or "")
    finally:
        if not window.done():
            window.cancel()
        await asyncio.gather(window, return_exceptions=True)
        if question_pages is not None:
            await question_pages.cancel()
        if ahead is not None:
            await ahead.drop()
        if question_search is not None:
            question_search.cancel()
        if shared is not None:
            shared.cancel()
        reader.cancel()
        state.search_calls = router.calls
        state.skipped_providers = router.skipped
        await fetch_client.aclose()

    if not state.audit.body_markdown.strip():
        state.partial_reason = state.partial_reason or "the model returned no report text"
        return unfinished_report(state, reason=state.partial_reason)
    title, body = split_title(state.audit.body_markdown)
    return Report(
        question=question, title=title or question, body_markdown=body,
        sources=_with_file_details(state.audit.sources, state),
        cited_passages=state.audit.cited_passages, audit=state.audit.audit,
        usage=state.usage_summary(fetch_budget), phase_seconds=state.phase_seconds,
        partial=state.partial_reason is not None, partial_reason=state.partial_reason,
        skipped_providers=state.skipped_providers, stopped_by_user=False, notes=state.notes,
        written_by_ai=state.written_by_ai,
    )


def _writing_counter(run: _Run, expected_words: int, clock: Callable[[], float] = time.monotonic,
                    shown: Callable[[], bool] = lambda: True) -> OnText:
    """An `on_text` that counts the report's words as the model writes them and moves the progress bar through the
    rest of synthesis by their share of `expected_words` (at most once per `PROGRESS_INTERVAL`), so a slow synthesis
    shows its pace in the status message; the text itself is shown only once audited."""
    last_sent = -PROGRESS_INTERVAL
    writing_from: float | None = None

    async def on_text(text: str) -> None:
        nonlocal last_sent, writing_from
        if not shown():  # a report written ahead, while the gap check may still send it back
            return
        run.state.words_written = len(text.split())
        if writing_from is None:
            writing_from = run.meter.percent
        if clock() - last_sent < PROGRESS_INTERVAL:
            return
        last_sent = clock()
        end = phase_progress("synthesize") - 0.1  # only the phase's end shows its end
        share = min(1.0, run.state.words_written / max(expected_words, 1))
        await run.meter.reach(writing_from + (end - writing_from) * share)

    return on_text


T = TypeVar("T")


async def _fitted_ask(llm: LLMClient, state: ResearchState, options: ResearchOptions,
                      build: Callable[[list[Passage], int], list[Message]],
                      ask: Callable[[list[Passage], int], Awaitable[T]], *,
                      wanted_tokens: int, fast: bool = False) -> tuple[list[Passage], T]:
    """The best passages that fit the model's context window beside the answer's room (up to `wanted_tokens`; all
    the passages while no window is known), asked with (`build` makes the prompt, `ask` asks, each given the room);
    on an overflow the window is now learnt, so room and passages are chosen again and asked again. Passages left
    out for room are noted in the state."""
    tried: tuple[list[str], int] | None = None
    while True:
        answer_tokens = llm.answer_room(wanted_tokens, fast=fast) or wanted_tokens
        selected, left_out = _fitting_passages(llm, state, options, lambda shown: build(shown, answer_tokens),
                                               answer_tokens, fast=fast)
        if not selected or ([passage.id for passage in selected], answer_tokens) == tried:
            window = llm.known_context_tokens(fast=fast)
            raise ContextOverflow(f"not even the best passages fit the model's context window ({window or 0:,} tokens)",
                                  context_tokens=window)
        tried = ([passage.id for passage in selected], answer_tokens)
        try:
            answer = await ask(selected, answer_tokens)
        except ContextOverflow:
            continue
        if left_out:
            window = llm.known_context_tokens(fast=fast) or 0
            state.notes.append(f"{left_out} of the {left_out + len(selected)} best passages were left out to fit the "
                               f"model's context window ({window:,} tokens, LLM_CONTEXT_TOKENS).")
        return selected, answer


def _fitting_passages(llm: LLMClient, state: ResearchState, options: ResearchOptions,
                      build: Callable[[list[Passage]], list[Message]], answer_tokens: int, *,
                      fast: bool) -> tuple[list[Passage], int]:
    """The passages chosen for the prompt and how many of the best were left out to fit the known window."""
    ranking = read_phase.rank_for_synthesis(state.plan, state.passages, options, shared=state.files.keys())
    best = ranking.select(options.passage_token_budget)
    room = llm.prompt_room(answer_tokens, fast=fast)
    if room is None or estimate_prompt_tokens(build(best)) <= room:
        return best, 0
    # The ranker counts four characters a token, the window check three, and fences cost a little more.
    budget = int((room - estimate_prompt_tokens(build([]))) * 0.75 * FENCE_SHARE)
    while budget > 0:
        fitted = ranking.select(budget)
        if fitted and estimate_prompt_tokens(build(fitted)) <= room:
            return fitted, max(0, len(best) - len(fitted))
        budget = int(budget * 0.8)
    return [], len(best)


async def _write_report(run: _Run, question: str, context: str | None, options: ResearchOptions, llm: LLMClient,
                        today: dt.date, shown: Callable[[], bool] = lambda: True) -> tuple[list[Passage], bool]:
    """Write the draft into the state from passages that fit the window: inline citations, or JSON claims for a model
    known to cite only that way (falling back to inline when the claims come to nothing). Returns the passages shown
    and whether the draft came from claims."""
    state = run.state
    assert state.plan is not None
    plan, titles = state.plan, state.titles()
    if not llm.quirks.cites_inline:
        try:
            selected, claims = await _claims_draft(llm, state, options, question, context, today)
            if claims:
                state.draft = claims
                return selected, True
        except StructuredOutputError:
            pass  # asked inline below, as a model never known to cite through claims would be

    def build(passages: list[Passage], answer_tokens: int) -> list[Message]:
        return synthesize_phase.synthesis_messages(question, plan, passages, titles=titles, today=today,
                                                   context=context, answer_tokens=answer_tokens)

    room = llm.config.max_output_tokens

    async def ask(passages: list[Passage], answer_tokens: int) -> LongAnswer:
        nonlocal room
        room = answer_tokens
        expected_words = synthesize_phase.report_length_words(answer_tokens)
        return await synthesize_phase.synthesize(question, plan, passages, titles=titles, llm=llm, today=today,
                                                 context=context, answer_tokens=answer_tokens,
                                                 on_text=_writing_counter(run, expected_words, shown=shown))

    selected, written = await _fitted_ask(llm, state, options, build, ask, wanted_tokens=llm.config.max_output_tokens)
    state.draft = written.text
    if written.cut_off:
        # The limit that cut it: the output setting, or the room the model's context window left for the report.
        window_room = room < llm.config.max_output_tokens
        state.draft_cut_off = cut_off_reason(llm, limit=room, setting="the room left in the model's context window, "
                                                                     "LLM_CONTEXT_TOKENS" if window_room else
                                                                     "LLM_MAX_OUTPUT_TOKENS")
    return selected, False


async def _claims_draft(llm: LLMClient, state: ResearchState, options: ResearchOptions, question: str,
                        context: str | None, today: dt.date) -> tuple[list[Passage], str]:
    """The answer as JSON claims rendered as a cited draft, from passages that fit ("" when it made no claim)."""
    assert state.plan is not None
    plan, titles = state.plan, state.titles()

    def build(passages: list[Passage], answer_tokens: int) -> list[Message]:
        return synthesize_phase.claims_messages(question, plan, passages, titles=titles, today=today, context=context)

    async def ask(passages: list[Passage], answer_tokens: int) -> str:
        return await synthesize_phase.cited_claims(question, plan, passages, titles=titles, llm=llm, today=today,
                                                   title=question, context=context, max_tokens=answer_tokens)

    return await _fitted_ask(llm, state, options, build, ask, wanted_tokens=CLAIMS_ANSWER_TOKENS)


async def _audit(draft: str, shown: list[Passage], state: ResearchState, llm: LLMClient, today: dt.date,
                 budget: Budget) -> verify_phase.AuditResult:
    from research.phases import verify as verify_phase

    return await verify_phase.verify_draft(draft, passages={passage.id: passage for passage in shown},
                                           sources=state.sources, judge=_citation_judge(llm, today),
                                           may_use_llm=budget.may_use_llm)


def own_support(audit: verify_phase.AuditResult) -> int:
    """Sentences verified through the model's own citations (not those the audit cited for it)."""
    return audit.audit.sentences_verified - audit.audit.citations_added


def _cites_inline(audit: verify_phase.AuditResult) -> bool:
    """Whether the model wrote any citation of its own (right or wrong), as opposed to none at all."""
    return any(verdict.claimed_id for verdict in audit.citations if not getattr(verdict, "added_by_audit", False))


async def _cite_through_claims(run: _Run, question: str, context: str | None, options: ResearchOptions,
                               llm: LLMClient, today: dt.date, budget: Budget, selected: list[Passage]) -> None:
    """A draft with no citation of its own: ask once more, as JSON claims, and keep whichever version the audit
    verifies more of. A model whose claims did better is asked that way from now on (learnt for the endpoint)."""
    state = run.state
    assert state.audit is not None
    try:
        shown, claims = await _claims_draft(llm, state, options, question, context, today)
    except LLMError as error:
        await run.sink(Warning_(phase="verify", message=f"The report cites no passage, and asking for cited claims "
                                                        f"failed: {plain_reason(error)}"))
        return
    if not claims:
        return
    audited = await _audit(claims, shown, state, llm, today, budget)
    # The audit may have cited a never-citing draft's copied sentences itself: count what each version cited.
    if own_support(audited) > own_support(state.audit):
        state.draft, state.audit = claims, audited
        llm.quirks.cites_inline = False
        state.draft_cut_off = None


WriteReport = Callable[[Callable[[], bool]], Coroutine[Any, Any, tuple[list[Passage], bool]]]


class ReportInAdvance:
    """The report written while the gap check runs, from the passages gathered so far: kept when the check finds no
    gap (the common case: the check's model call then costs no time), dropped when it sends the run out again.

    Only for an endpoint that answers two calls at once (`LLMConfig.serves_in_parallel`): a local server working
    on one request at a time would make the check wait behind the whole report. Its writing progress is shown only
    once it is kept; a dropped one costs its prompt and the words written before it was stopped.
    """

    def __init__(self, run: _Run, write: WriteReport) -> None:
        self._run = run
        self._shown = False
        self._task = asyncio.create_task(write(lambda: self._shown), name="report in advance")

    async def kept(self) -> tuple[list[Passage], bool]:
        """The report, now shown as the one being written (what `_write_report` returns; raises what it raised)."""
        self._shown = True
        return await self._task

    async def drop(self) -> None:
        """Stop writing it and, unless it was kept, forget what it wrote."""
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        if not self._shown:
            self._run.state.draft, self._run.state.draft_cut_off = None, None


async def _gather(run: _Run, question: str, options: ResearchOptions, budget: Budget, router: SearchRouter,
                  fetcher: fetch_phase.PageFetcher, llm: LLMClient, tools: ResearchTools, today: dt.date, *,
                  reader: read_phase.PageReader, question_search: search_phase.QuestionSearch | None = None,
                  question_pages: QuestionPages | None = None, window: asyncio.Future[Any] | None = None,
                  write_report: WriteReport | None = None) -> ReportInAdvance | None:
    """Rounds of search → fetch → read → gap check until covered, out of rounds, or out of budget.

    With `write_report` (an endpoint that answers two calls at once), the report is written beside each gap check;
    the one written beside the last check is returned, for the run to keep."""
    state = run.state
    assert state.plan is not None
    asked: set[str] = {search_phase.query_key(question_search.query.text)} if question_search else set()
    texts = [query for sub in state.plan.sub_questions for query in sub.queries]
    for round_number in range(1, options.max_rounds + 1):
        if (reason := budget.overrun()) is not None:
            state.partial_reason = reason
            return None
        queries = search_phase.build_queries(texts, searches_left=budget.searches_left(), since=options.since,
                                             already_asked=asked, results_per_query=options.results_per_query)
        joining = question_search if round_number == 1 else None
        early = question_pages if round_number == 1 else None
        pages = RoundPages(run, fetcher, reader, options)
        try:
            if queries or joining:
                async with run.phase("search"):
                    # The question's own results come first; unanswered, it fails the round only when nothing else is asked.
                    for source in await joining.results(raise_when_unanswered=not queries) if joining else []:
                        state.sources.setdefault(source.id, source)
                    pages.taken |= await early.choice() if early is not None else set()
                    # What is known already goes first, in id order: the addresses the question names, and what
                    # earlier rounds found and left unfetched.
                    pages.start(list(state.sources.values()))
                    if queries:
                        # Each query's sources are kept, and its pages fetched (and read), as soon as it answers,
                        # while the others search on.
                        await search_phase.search(queries, router=router, on_found=pages.start)
                await run.progress(phase_progress("search", round_number=round_number, rounds=options.max_rounds))
            else:
                pages.taken |= await early.choice() if early is not None else set()
                pages.start(list(state.sources.values()))  # what earlier rounds found and left unfetched
            if pages.fetching or (early is not None and early.chosen):
                async with run.phase("fetch"):
                    await asyncio.gather(pages.fetched(), *([early.fetched()] if early is not None else []))
                await run.progress(phase_progress("fetch", round_number=round_number, rounds=options.max_rounds))
                async with run.phase("read"):
                    await _read_unread(run, reader)
                await run.progress(phase_progress("read", round_number=round_number, rounds=options.max_rounds))
        finally:
            pages.cancel()

        if round_number == options.max_rounds or (reason := budget.overrun()) is not None:
            if round_number < options.max_rounds:
                state.partial_reason = reason
            return None
        if window is not None:
            await asyncio.wait([window])  # the gap check's passages are cut to the window
        ahead = (ReportInAdvance(run, write_report)
                 if write_report is not None and state.passages and budget.may_use_llm() else None)
        try:
            async with run.phase("gap_check"):
                texts = await gap_phase.check_gaps(question, state.plan, _gap_check_passages(llm, state, options, today),
                                                   titles=state.titles(), llm=llm, today=today,
                                                   tainted=frozenset(state.tainted_words))
        except LLMError as error:
            # What is gathered is enough to report from; the report step says so if the model stays down.
            await run.sink(Warning_(phase="gap_check", message=f"Gathering stopped: {plain_reason(error)}"))
            return ahead
        except BaseException:
            if ahead is not None:
                await ahead.drop()
            raise
        await run.progress(phase_progress("gap_check", round_number=round_number, rounds=options.max_rounds))
        if not texts:
            return ahead
        if ahead is not None:
            await ahead.drop()
    return None


def _on_fetched(run: _Run, reader: read_phase.PageReader) -> Callable[[SearchResult, FetchResult], Awaitable[None]]:
    """What happens to each page as it arrives: kept in the state, and read at once (or its failure said)."""
    async def on_fetched(source: SearchResult, result: FetchResult) -> None:
        run.state.fetches[source.id] = result
        if result.ok:
            # Reading starts now, while the other pages are still arriving.
            reader.start(source.id, result)
        else:
            await run.sink(Warning_(phase="fetch", message=f"Skipped {source.url}: {result.reason}",
                                    detail={"source_id": source.id, "status": result.status}))
    return on_fetched


class RoundPages:
    """The pages of one round: fetched as soon as a search names them (up to the run's number of sources, in id order
    within each query's answer), each read as it arrives."""

    def __init__(self, run: _Run, fetcher: fetch_phase.PageFetcher, reader: read_phase.PageReader,
                 options: ResearchOptions) -> None:
        self.run = run
        self.taken: set[str] = set(run.state.fetches)  # fetched, or being fetched
        self.fetching: list[asyncio.Task[dict[str, FetchResult]]] = []
        self._fetcher = fetcher
        self._reader = reader
        self._options = options

    def start(self, found: list[SearchResult]) -> None:
        """Keep `found` among the run's sources and start fetching those not taken yet, while sources are left."""
        state = self.run.state
        for source in found:
            state.sources.setdefault(source.id, source)
        # Shared files are read already: only web sources are fetched.
        chosen = fetch_phase.choose_sources([source for source in found if source.id not in state.files],
                                            already_fetched=self.taken, limit=self._options.max_sources - len(self.taken))
        if not chosen:
            return
        self.taken.update(source.id for source in chosen)
        self.fetching.append(asyncio.create_task(
            fetch_phase.fetch_sources(chosen, fetcher=self._fetcher, on_fetched=_on_fetched(self.run, self._reader)),
            name="round pages"))

    async def fetched(self) -> None:
        """Once every page started here has arrived (or failed)."""
        await asyncio.gather(*self.fetching)

    def cancel(self) -> None:
        """Stop fetching what is still under way (the round was cut short)."""
        for task in self.fetching:
            task.cancel()


class QuestionPages:
    """The pages of the question's own search, fetched (and read) as soon as it answers, while decomposition goes on.

    The first round would fetch them first anyway (its sources are chosen in id order, and the question's search
    registered its results first); here they arrive a model call earlier. The round then fetches the rest beside
    them (`chosen` are taken), and waits for them with its own (`fetched`).
    """

    def __init__(self, run: _Run, search: search_phase.QuestionSearch, fetcher: fetch_phase.PageFetcher,
                 reader: read_phase.PageReader, options: ResearchOptions) -> None:
        self.chosen: set[str] = set()
        self._chose = asyncio.Event()
        self._task = asyncio.create_task(self._fetch(run, search, fetcher, reader, options), name="question pages")

    async def _fetch(self, run: _Run, search: search_phase.QuestionSearch, fetcher: fetch_phase.PageFetcher,
                     reader: read_phase.PageReader, options: ResearchOptions) -> None:
        try:
            found = await search.results(raise_when_unanswered=False)
            state = run.state
            for source in found:
                state.sources.setdefault(source.id, source)
            chosen = fetch_phase.choose_sources(found, already_fetched=set(state.fetches),
                                                limit=options.max_sources - len(state.fetches))
            self.chosen = {source.id for source in chosen}
        finally:
            self._chose.set()
        await fetch_phase.fetch_sources(chosen, fetcher=fetcher, on_fetched=_on_fetched(run, reader))

    async def choice(self) -> set[str]:
        """The ids of the pages being fetched here, once the question's search has answered."""
        await self._chose.wait()
        return self.chosen

    async def fetched(self) -> None:
        """Once every chosen page has arrived (or failed); raises what the fetching raised."""
        await asyncio.shield(self._task)

    async def cancel(self) -> None:
        """Stop fetching (the run is over) and consume the outcome."""
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


async def _read_unread(run: _Run, reader: read_phase.PageReader) -> None:
    """Extract (or finish extracting) and chunk every fetched page not read yet; passages keep run-stable ids."""
    state = run.state
    unread = [sid for sid, result in sorted(state.fetches.items(), key=lambda item: int(item[0][1:]))
              if result.ok and sid not in state.documents]
    if not unread:
        return
    documents = await reader.documents([(sid, state.fetches[sid]) for sid in unread])
    for sid in unread:
        # The body is no longer needed once read; dropping it keeps a long run's memory flat.
        state.fetches[sid] = state.fetches[sid].model_copy(update={"body": b""})
    state.documents.update(documents)
    made = read_phase.read_passages(documents, first_number=len(state.passages) + 1)
    state.passages.extend(made.passages)
    # Words of text a page addressed to the model (defused out of its passages): no query may carry them.
    state.tainted_words |= made.tainted_words
    read = [ReadPage(source_id=sid, url=state.sources[sid].url, title=state.sources[sid].title)
            for sid in unread if sid in documents and sid in state.sources]
    if read:
        await run.sink(SourcesRead(phase="read", pages=read))


class JudgeVerdict(BaseModel):
    id: str
    supported: bool


class JudgeVerdicts(BaseModel):
    """The fast model's verdict on each doubtful citation it was shown."""

    verdicts: list[JudgeVerdict]


def _gap_check_passages(llm: LLMClient, state: ResearchState, options: ResearchOptions, today: dt.date) -> list[Passage]:
    """The passages the gap check is shown: the report's selection, cut to what fits the fast model's known window."""
    plan = state.plan
    assert plan is not None

    def build(passages: list[Passage]) -> list[Message]:
        return list(gap_phase.gap_check_messages(state.question, plan, passages, titles=state.titles(), today=today))

    return _fitting_passages(llm, state, options, build, GAP_CHECK_ANSWER_TOKENS, fast=True)[0]


def _citation_judge(llm: LLMClient, today: dt.date) -> verify_phase.Judge:
    async def judge(items: list[verify_phase.JudgeItem]) -> dict[str, bool]:
        listing = "\n\n".join(
            f"Item {item.id}\nSentence: {item.sentence}\n" + fence_untrusted(item.id, "", "", item.passage_text)
            for item in items)
        messages = [{"role": "system", "content": system_prompt("citation_check", today, cites=False)},
                    {"role": "user", "content": listing}]
        try:
            verdicts = await llm.structured(messages, JudgeVerdicts, task="citation_check", fast=True)
        except ContextOverflow:
            if len(items) == 1:
                raise
            # A small window: judge the batch in halves (the window is learnt now, so each half is cut to fit).
            half = len(items) // 2
            return {**await judge(items[:half]), **await judge(items[half:])}
        return {verdict.id: verdict.supported for verdict in verdicts.verdicts}
    return judge


def fitted_history(llm: LLMClient, fixed: list[Message], history: Sequence[Turn], answer_tokens: int) -> list[Message]:
    """The newest part of `history` that fits the model's known window beside the `fixed` messages and the answer."""
    room = llm.prompt_room(answer_tokens)
    kept: list[Message] = [dict(turn) for turn in history]
    if room is None:
        return kept
    while kept and estimate_prompt_tokens([*fixed, *kept]) > room:
        kept.pop(0)  # the oldest turn goes first
    return kept


def _llm_for_run(run: _Run, llm: LLMClient) -> LLMClient:
    """The client, reporting this run's token usage to its state and as events."""

    async def on_usage(record: UsageRecord) -> None:
        run.state.record_usage(record)
        await run.sink(LLMUsage(model=record.model, prompt_tokens=record.prompt_tokens,
                                completion_tokens=record.completion_tokens, cost=record.cost, step=record.task))

    return llm.with_usage_callback(on_usage)


async def plan(
    question: str,
    *,
    context: str | None = None,
    llm: LLMClient,
    today: dt.date,
    events: Emit,
    cancel: CancelToken | None = None,
    state: ResearchState | None = None,
    first_seq: int = 1,
) -> Report | None:
    """A research plan for approval; built with no search or fetch capability at all."""
    run = _Run(question, events, cancel, state, first_seq)

    async def work() -> Report:
        client = _llm_for_run(run, llm)
        user = f"Question:\n{question}"
        if context:
            user = f"Earlier conversation (for context):\n{context}\n\n{user}"
        messages = [{"role": "system", "content": system_prompt("plan", today, cites=False)}, {"role": "user", "content": user}]
        async with run.phase("plan"):
            research_plan = await client.structured(messages, ResearchPlan, task="plan")
        return Report(
            question=question, title=f"Research plan: {research_plan.query}", mode="plan",
            body_markdown=render_plan_markdown(research_plan), usage=run.state.usage_summary(),
            phase_seconds=run.state.phase_seconds, plan=research_plan.model_dump(mode="json"),
        )

    return await run.finish(work)


async def chat(
    question: str,
    *,
    history: Sequence[Turn],
    llm: LLMClient,
    today: dt.date,
    events: Emit,
    options: ResearchOptions | None = None,
    cancel: CancelToken | None = None,
    state: ResearchState | None = None,
    first_seq: int = 1,
    on_text: OnText | None = None,
) -> Report | None:
    """A short conversational answer from the model alone (no tools), with the thread's history (fitted to
    `options.max_context_tokens` by the caller), at most `options.chat_max_output_tokens` long; streamed to
    `on_text` (the visible text so far) as the model writes it, when given."""
    options = options or ResearchOptions()
    run = _Run(question, events, cancel, state, first_seq)

    async def work() -> Report:
        client = _llm_for_run(run, llm)
        await client.context_tokens()
        answer_tokens = client.answer_room(options.chat_max_output_tokens) or options.chat_max_output_tokens
        system = {"role": "system", "content": system_prompt("chat", today, cites=False)}
        question_message = {"role": "user", "content": question}
        fitted = fitted_history(client, [system, question_message], history, answer_tokens)
        shown = (lambda text: on_text(search_phase.without_citation_markers(text))) if on_text is not None else None
        async with run.phase("chat"):
            answer = await client.complete_long([system, *fitted, question_message], task="chat",
                                                max_tokens=answer_tokens, on_text=shown)
        # No source was shown, so a marker could only be copied from the history or made up: none is shown.
        text = search_phase.without_citation_markers(answer.text)
        if not text:
            raise LLMError("the model returned an empty answer")
        return Report(question=question, title=shortened(question, TITLE_QUESTION_CHARS), mode="chat", body_markdown=text,
                      usage=run.state.usage_summary(), phase_seconds=run.state.phase_seconds,
                      partial=answer.cut_off, partial_reason=_chat_cut_off_reason(client, options) if answer.cut_off else None)

    return await run.finish(work)


async def answer_from_passages(
    question: str,
    *,
    history: Sequence[Turn],
    passages: list[Passage],
    sources: dict[str, SearchResult],
    llm: LLMClient,
    today: dt.date,
    events: Emit,
    options: ResearchOptions | None = None,
    cancel: CancelToken | None = None,
    state: ResearchState | None = None,
    first_seq: int = 1,
    on_text: OnText | None = None,
    files: dict[str, FileDocument] | None = None,
) -> Report | None:
    """A follow-up answered only from an earlier run's passages, audited like a report; no web access. Its model
    calls together stay within `options.chat_max_llm_tokens` (the citation check is skipped past it). The draft is
    streamed to `on_text` as the model writes it, when given; the report returned is the audited answer. `files`
    are the sources among `sources` that are shared files (their details, by source id)."""
    options = options or ResearchOptions()
    run = _Run(question, events, cancel, state, first_seq)
    run.state.sources = dict(sources)
    run.state.passages = list(passages)
    run.state.files = dict(files or {})
    budget = Budget(options.for_chat())
    budget.tokens_used = lambda: run.state.total_tokens

    async def work() -> Report:
        client = _llm_for_run(run, llm)
        titles = {sid: (source.title, source.url) for sid, source in sources.items()}
        selected: list[Passage] = []
        if passages:
            ranked = rank_passages_for_queries([question], passages, 12)[question]
            selected = [passage for passage, _score in ranked] or passages[:12]
        await client.context_tokens()
        answer_tokens = client.answer_room(options.chat_max_output_tokens) or options.chat_max_output_tokens
        system = {"role": "system", "content": system_prompt("answer", today)}

        def asked(shown: list[Passage]) -> Message:
            return {"role": "user", "content": f"Follow-up question:\n{question}\n\nSource passages:\n"
                                               + fence_passages(shown, titles)}

        room = client.prompt_room(answer_tokens)
        while room is not None and len(selected) > 1 and estimate_prompt_tokens([system, asked(selected)]) > room:
            selected.pop()  # the least relevant passage goes first
        fitted = fitted_history(client, [system, asked(selected)], history, answer_tokens)
        async with run.phase("answer"):
            answer = await client.complete_long([system, *fitted, asked(selected)], task="answer",
                                                max_tokens=answer_tokens, on_text=on_text)
            run.state.draft = answer.text
        from research.phases import verify as verify_phase

        async with run.phase("verify"):
            run.state.audit = await verify_phase.verify_draft(
                run.state.draft, passages={passage.id: passage for passage in selected}, sources=sources,
                judge=_citation_judge(client, today), may_use_llm=budget.may_use_llm)
        audit = run.state.audit
        if not audit.body_markdown.strip():
            raise LLMError("the model returned an empty answer")
        reason = _chat_cut_off_reason(client, options) if answer.cut_off else None
        if audit.audit.sentences_total and not audit.audit.sentences_verified:
            reason = reason or NOTHING_SUPPORTED_REASON.replace("report", "answer")
        return Report(
            question=question, title=shortened(question, TITLE_QUESTION_CHARS), mode="followup",
            body_markdown=audit.body_markdown,
            sources=_with_file_details(audit.sources, run.state), cited_passages=audit.cited_passages,
            audit=audit.audit, usage=run.state.usage_summary(), phase_seconds=run.state.phase_seconds,
            partial=reason is not None, partial_reason=reason,
        )

    return await run.finish(work)
