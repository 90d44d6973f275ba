"""One attempt at a stored run, from the lease its worker holds to the report in the thread.

`RunAttempt` owns what the pieces of an attempt share: the lease (taken by `start_attempt`, kept
while the engine works and until the outcome is stored, given up when a newer attempt takes the
run), the recorder (each event stored and folded into the run's progress), the delivery (status
edits, the streamed answer, the report), and, in a worker, the hand-off between the process's two
event loops: the engine works on the runs loop, and every word to the platform goes out from the
delivery loop (`run_in_worker`). The terminal (`deepthread research`) and the worker call `execute`
the same way. The finished report is handed to the delivery in memory; the run's row stays the
truth of what was delivered, exactly once, for a retry by the resume sweep.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from chat.state import RunProgress
from ops.log_context import set_run_phase
from research import engine
from research.budget import CancelToken, ResearchOptions
from research.events import Error
from research.llm import OnText
from research.report import Report, audit_line
from research.thread_context import THREAD_SHARE_OF_WINDOW, fit_thread_context
from storage.attempts import afinish_attempt, amark_failed, arun_inputs
from storage.db import is_transient_database_error
from storage.leases import HeldLease
from storage.models import utcnow
from storage.vocabulary import RunState
from worker.leases import LEASE_LOST, LeaseKeeper, worker_identity
from worker.loop import RunLoop
from worker.runner import (
    HISTORY_MESSAGES,
    MAX_HISTORY_REPLY_CHARS,
    TERMINAL_STATE_OF_EVENT,
    OnState,
    RunnerServices,
    RunRecorder,
    StartedAttempt,
    context_text,
    file_refs,
    findings_of,
    turns_of,
    outcome_of,
    passages_and_sources,
    without_current_question,
    astart_attempt,
    options_for_run,
)

if TYPE_CHECKING:  # a worker's parts (Redis's client with them), not the terminal's: a fifth of its start-up
    from storage.answer_drafts import AnswerDraftWriter
    from worker.cancels import CancelWatcher
    from worker.delivery import DeliveryOutcome, RunDelivery

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerLoops:
    """A worker process's two event loops: the runs' (engines, database writes) and the delivery's (platform calls).

    Status edits and reports go out from a loop of their own: on the runs' loop, busy with a burst
    of runs, each step of an edit waited a whole turn behind every other run's work.
    """

    runs: RunLoop
    delivery: RunLoop


class RunAttempt:
    """One attempt at a run whose lease this process has just taken (`start_attempt`)."""

    def __init__(self, started: StartedAttempt, services: RunnerServices, *, owner: str | None = None,
                 delivery: RunDelivery | None = None) -> None:
        self.started = started
        self.run = started.run
        self.services = services
        self.owner = owner or worker_identity()
        self.delivery = delivery
        self.report: Report | None = None  # the report stored as the run's outcome, for the delivery
        self.recorder: RunRecorder | None = None
        self.stored = False  # this attempt stored the run's outcome: it is the run's last attempt, for good
        self._finishing: concurrent.futures.Future[DeliveryOutcome] | None = None  # the delivery's end, once started

    @classmethod
    async def start(cls, run_id: int, services: RunnerServices, *, owner: str | None = None,
                    delivery: RunDelivery | None = None) -> RunAttempt | None:
        """Take run `run_id`'s lease as a new attempt, off the loop (a worker's Celery thread calls `start_attempt`
        itself); None when the run has ended or another attempt holds it. Raises LookupError for no such run."""
        owner = owner or worker_identity()
        started = await astart_attempt(services.sessions, run_id, owner, services.lease_seconds)
        return None if started is None else cls(started, services, owner=owner, delivery=delivery)

    async def execute(self, *, on_state: OnState | None = None, cancel: CancelToken | None = None,
                      on_text: OnText | None = None) -> RunProgress | None:
        """Run the engine for the run's mode to one of its final states, store it, and return its last progress.

        `on_state` is shown the first state at once (the run has left "queued"), then every change.
        A chat or follow-up answer is streamed to `on_text` (the visible text so far) as the model
        writes it. Returns None when the lease was lost to a newer attempt, and None when the
        database stayed unavailable: the run is then left running with its lease lapsing, so the
        reaper's next attempt does it again (a finished report is never marked failed and lost).
        """
        run = self.run
        logger.info("run %s attempt %s started (%s)", run.id, run.attempt, run.mode)
        try:
            return await self._execute(on_state, cancel or CancelToken(), on_text)
        except Exception as error:
            if is_transient_database_error(error):
                # Writing "failed" would fail too, and would be untrue: the next attempt can still finish the run.
                logger.error("run %s attempt %s stopped: the database is unavailable (%s); left for the reaper",
                             run.id, run.attempt, type(error).__name__)
                return None
            # Whatever broke outside the engine, the run ends in a stored state that says so.
            logger.error("run %s failed outside the engine", run.id, exc_info=True)
            reason = f"Internal error ({type(error).__name__}); the run stopped before what it found could be stored."
            await amark_failed(self.services.sessions, run.id, run.attempt, reason)
            raise

    async def _execute(self, on_state: OnState | None, cancel: CancelToken, on_text: OnText | None) -> RunProgress | None:
        run, services = self.run, self.services
        observer = services.metrics.run_started(mode=run.mode, created_at=run.created_at, started_at=run.started_at,
                                                first_attempt=run.attempt == 1) if services.metrics is not None else None
        recorder = self.recorder = RunRecorder(services.sessions, run, on_state, observer=observer,
                                               overloaded=services.overloaded,
                                               progress=self.started.first_progress())
        if on_state is not None:
            # The status message leaves "queued" as soon as this attempt holds the run, before the engine starts.
            await on_state(recorder.progress)
        state = engine.ResearchState()
        work, options = await self._engine_work(recorder, cancel, state, on_text)
        hard_deadline = options.max_seconds + services.hard_deadline_grace_seconds
        timed_out = False
        report: Report | None = None
        # The lease is kept until the outcome is stored, so a slow final write is not taken for a dead worker; from a
        # thread, so that a saturated runs loop cannot let it lapse.
        own_keeper = services.leases is None
        keeper = services.leases or LeaseKeeper(services.sessions, services.lease_seconds)
        lease = HeldLease(run.id, run.attempt, self.owner)
        if self.delivery is not None:
            # Each status edit and post checks that this attempt still owns the run: while the lease is kept and was
            # lately renewed, or once the outcome is stored, that is known here, without a query on a busy database.
            self.delivery.known_current = functools.partial(self._known_current, keeper, lease)
        try:
            with keeper.keeping(lease, cancel, taken_at=self.started.asked_at):
                try:
                    async with asyncio.timeout(hard_deadline) as deadline:
                        report = await work
                except TimeoutError:
                    if not deadline.expired():  # a timeout of some step inside the run, not the hard deadline
                        raise
                    timed_out = True
                finally:
                    recorder.stop_batching()
                cancelled_by = cancel.cancelled_by
                if cancelled_by == LEASE_LOST:
                    logger.warning("run %s attempt %s lost its lease; another attempt owns it", run.id, run.attempt)
                    return None

                final_state: RunState
                error: str | None  # the timeout or the Error event that ended the run; None when neither did
                if timed_out:
                    final_state, error = "timed_out", f"The run passed its hard deadline of {hard_deadline:g} s and was stopped."
                    report = engine.unfinished_report(state, reason="timed out")
                    await recorder(Error(message=error, seq=recorder.progress.last_seq + 1))
                    recorder.progress = recorder.progress.model_copy(update={"state": "timed_out"})
                else:
                    terminal = recorder.terminal
                    final_state = TERMINAL_STATE_OF_EVENT[terminal.type] if terminal is not None else "failed"
                    error = terminal.message if isinstance(terminal, Error) else None
                    if final_state == "cancelled":
                        recorder.progress = recorder.progress.model_copy(update={"cancelled_by": cancelled_by})
                if report is not None and report.model is None:
                    report.model = services.tools.llm.config.model  # named in the report's "Written by AI" line
                findings = findings_of(state)
                if run.watch_id is not None and report is not None and final_state == "done":
                    # A watch's run opens with what changed since the watch's previous run, computed, never written.
                    from worker.watches import compared_with_previous  # a watch's parts: not on the terminal's start-up
                    try:
                        report = await compared_with_previous(services.sessions, run.id, report, findings)
                    except Exception as failure:  # the report stands without its comparison: posted as a new one
                        logger.warning("run %s: the changes since the watch's previous run could not be computed "
                                       "(%s); its report is posted as it was written", run.id, type(failure).__name__)
                # What the bot said joins the thread's history, so follow-ups and revisions have it as context.
                reply_text = report.body_markdown[:MAX_HISTORY_REPLY_CHARS] if report is not None else None
                # Rendering a long report takes a while: not on the loop the runs share.
                outcome = await asyncio.to_thread(outcome_of, final_state, state, report, error, reply_text, cancelled_by)
                stored = await self._store_outcome(functools.partial(
                    afinish_attempt, services.sessions, run.id, run.attempt, outcome, findings))
        finally:
            if own_keeper:
                keeper.stop()
        if not stored:
            return None
        self.stored = True
        self.report = report
        if observer is not None:
            observer.finished(final_state, pages=state.fetches.values())
        final: dict[str, object] = {"state": final_state, "finished_at": utcnow()}
        if report is not None and report.audit.sentences_total:
            final["audit_line"] = audit_line(report)
        if report is not None and report.partial:
            final.update(partial=True, partial_reason=report.partial_reason)
        return recorder.progress.model_copy(update=final)

    def _known_current(self, keeper: LeaseKeeper, lease: HeldLease, attempt: int) -> bool:
        """Whether `attempt` is surely the run's current one (from any thread): this attempt, with its outcome stored
        (a finished run takes no new attempt) or its lease held (none is taken before a lease lapses)."""
        return attempt == lease.attempt and (self.stored or keeper.holds(lease))

    async def _engine_work(self, recorder: RunRecorder, cancel: CancelToken, state: engine.ResearchState,
                           on_text: OnText | None) -> tuple[Awaitable[Report | None], ResearchOptions]:
        """The engine's entry point for the run's mode, with the thread's history (and a follow-up's passages) read."""
        run, services = self.run, self.services
        tools = services.tools
        options = options_for_run(services.options, run.options)
        inputs = await arun_inputs(services.sessions, run.conversation_id, history_messages=HISTORY_MESSAGES,
                                   answer_from_run=run.options.answer_from_run if run.mode == "followup" else None,
                                   # One more than a run reads: the engine then knows that older files were left out.
                                   max_files=tools.file_limits.max_files + 1 if run.mode == "research" else 0)
        earlier = without_current_question(turns_of(inputs.history), run.question)
        passages, sources, files = passages_and_sources(inputs.passages)
        # The thread's history takes at most CHAT_MAX_CONTEXT_TOKENS, and at most a quarter of the model's window, so
        # the passages and the answer keep their room (the window is asked of the server once per process; a run
        # with no history to fit does not wait for the answer: the engine asks beside its first steps).
        window = await tools.llm.context_tokens() if earlier else None
        history = fit_thread_context(earlier, run.question, min(options.max_context_tokens,
                                                                 window // THREAD_SHARE_OF_WINDOW if window else
                                                                 options.max_context_tokens))
        first_seq = self.started.first_seq
        work: Awaitable[Report | None]
        match run.mode:
            case "research":
                work = engine.research(run.question, plan=run.plan, context=context_text(history), options=options,
                                       tools=tools, events=recorder, cancel=cancel, state=state, first_seq=first_seq,
                                       files=file_refs(inputs.files, workspace=run.workspace))
            case "plan":
                work = engine.plan(run.question, context=context_text(history), llm=tools.llm, today=tools.today(),
                                   events=recorder, cancel=cancel, state=state, first_seq=first_seq)
            case "chat":
                work = engine.chat(run.question, history=history, llm=tools.llm, today=tools.today(), options=options,
                                   on_text=on_text, events=recorder, cancel=cancel, state=state, first_seq=first_seq)
            case "followup":
                work = engine.answer_from_passages(run.question, history=history, passages=passages, sources=sources,
                                                   llm=tools.llm, today=tools.today(), options=options, on_text=on_text,
                                                   events=recorder, cancel=cancel, state=state, first_seq=first_seq,
                                                   files=files)
        return work, options

    async def _store_outcome(self, store: Callable[[], Awaitable[bool]]) -> bool:
        """Write the last events and the run's outcome, trying again while the database is briefly unavailable.

        Returns whether the outcome was stored: False when a newer attempt owns the run, or when the
        database kept failing (logged; the lease then lapses and the reaper's next attempt redoes
        the run). Raises what a non-transient database error raised.
        """
        recorder, services = self.recorder, self.services
        assert recorder is not None  # made as the attempt starts executing
        delays = iter(services.store_retry_delays)
        while True:
            try:
                await asyncio.to_thread(recorder.write_unwritten)  # with its locks, in a thread as the batched writes
                return await store()
            except Exception as error:
                if not is_transient_database_error(error):
                    raise
                delay = next(delays, None)
                if delay is None:
                    logger.error("could not store the outcome of run %s (%s); its lease will lapse and the reaper's "
                                 "next attempt redoes it", self.run.id, type(error).__name__)
                    return False
                logger.warning("could not store the outcome of run %s yet (%s); trying again in %g s", self.run.id,
                               type(error).__name__, delay)
                await services.sleep(delay)

    # -- in a worker ---------------------------------------------------------------------------------------------

    def run_in_worker(self, loops: WorkerLoops, *, cancels: CancelWatcher, answer_draft: AnswerDraftWriter | None,
                      close: Callable[[], Awaitable[None]]) -> None:
        """From a Celery thread: the engine on the runs loop, each status crossing to the delivery loop, then the
        report delivered from there — or, for an attempt that will not be finished, its streams ended.

        `answer_draft` follows a streamed answer where nothing is delivered (the terminal follows it in
        Redis); `close` closes the attempt's own clients once the engine is done.
        """
        delivery = self.delivery
        # The status message leaves "queued" from the delivery loop as soon as this thread holds the run. Sent from
        # the engine's side, it waited for the runs loop's turn first: seconds when a thousand runs share that loop.
        first_edit = (loops.delivery.call(delivery.on_state(self.started.first_progress()))
                      if delivery is not None else None)
        try:
            loops.runs.run(self._engine_in_worker(loops, cancels, answer_draft, close, first_edit))
        finally:
            if self._finishing is not None:
                # The delivery began on its loop as soon as the outcome was stored (`_engine_in_worker`); it never raises.
                set_run_phase("deliver")
                self._finishing.result()
            elif delivery is not None:  # a stale attempt, or one that broke
                if first_edit is not None:  # the first edit, never awaited if the engine broke first, settles first
                    concurrent.futures.wait([first_edit])
                loops.delivery.call(delivery.abandon()).result()

    async def _engine_in_worker(self, loops: WorkerLoops, cancels: CancelWatcher,
                                answer_draft: AnswerDraftWriter | None, close: Callable[[], Awaitable[None]],
                                first_edit: concurrent.futures.Future[None] | None) -> RunProgress | None:
        delivery = self.delivery
        cancel = CancelToken()
        on_state: OnState | None = None
        if delivery is not None:
            unawaited_first = first_edit

            async def on_state(progress: RunProgress) -> None:
                nonlocal unawaited_first
                if unawaited_first is not None:
                    # The first state, already on its way from the delivery loop: the engine starts once it is shown.
                    first, unawaited_first = unawaited_first, None
                    await asyncio.wrap_future(first)
                    return
                await loops.delivery.bridged(delivery.on_state(progress))

        answer = delivery.stream_answer(self.run.attempt, loops.delivery.loop) if delivery else answer_draft
        on_text: OnText | None = None
        if answer is not None:
            async def on_text(visible_text: str) -> None:
                answer.show(visible_text)  # handed over without waiting: the model is not slowed by the platform

        try:
            with cancels.watching(self.run.id, cancel):
                final = await self.execute(on_state=on_state, cancel=cancel, on_text=on_text)
            if final is not None and final.state == "cancelled" and final.cancelled_by is None:
                final = final.model_copy(update={"cancelled_by": cancel.cancelled_by})
            if final is not None and delivery is not None:
                # The report goes out now, not once this job's clients are closed and its Celery thread has woken:
                # under a burst of runs, those hand-overs alone held reports back by a second and more.
                self._finishing = loops.delivery.call(delivery.finish(final, report=self.report))
            return final
        finally:
            if answer_draft is not None:
                await answer_draft.close()
            await close()
