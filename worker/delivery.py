"""A run's voice in its thread: coalesced status edits while it works, then the report, delivered once.

Before posting the report the run records the intent; after each post, the message reference.
A retried delivery edits the recorded messages instead of posting new ones. Every edit and post
first checks that this attempt still owns the run, so a stale attempt cannot deliver.

A delivery is done only when the report (or a notice that it cannot be posted) is in the thread
and the status message shows the final state. While the platform fails (HTTP 5xx, the network),
each failed try is counted on the run row and the resume sweep (`sweep_undelivered`, in every
worker's reaper) tries again, backing off; after the last try a notice is attempted and the run
is marked given up.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from config import setting_default
from chat.message import AnswerStreaming, Messenger, MessageRef, MessengerError, Place
from chat.platform import Outbound
from chat.render import PlatformRenderer
from chat.text import platform_user
from chat.state import RunProgress, progress_of_stored_run
from chat.tasks import TaskStreaming
from research.report import Report, audit_line
from storage.db import Sessions
from storage.deliveries import (
    StoredRun,
    adelivered_messages,
    ahas_report,
    amark_delivered,
    amay_open_progress,
    amay_stream_answer,
    arecord_delivered,
    arecord_failed_delivery,
    arecord_progress_message,
    arecord_streamed_answer,
    areport_for_delivery,
    arun_with_events,
    astill_waiting,
    delivery_run,
    progress_message,
    run_with_events,
)
from storage.leases import aclaim_undelivered, ais_current_attempt
from storage.vocabulary import TERMINAL_STATES, DeliveredMessage
from storage.watches import aopen_pending_thread, aprevious_run, astored_report, is_pending
from worker.answer_stream import AnswerStream
from worker.progress import EditBudget, StatusEditor
from worker.progress_stream import ProgressStream, finish_progress_message
from chat.watches import quiet_line, watch_headline
from worker.watches import stop_watch_for_good

if TYPE_CHECKING:
    from config import Settings

logger = logging.getLogger(__name__)

# How long the engine waits for the first status edit (a rate-limited Slack must not hold the research up).
FIRST_EDIT_WAIT_SECONDS = 2.0
# Beyond this many doublings the delay is the cap anyway (and 2 ** n stays a small number).
MAX_DOUBLINGS = 30

WallClock = Callable[[], dt.datetime]


class DeliveryRetry(BaseModel):
    """How many times a delivery the platform keeps failing is tried in all, and how far apart."""

    model_config = ConfigDict(frozen=True)

    max_attempts: int = Field(default=setting_default("delivery_max_attempts"), gt=0)
    first_delay_seconds: float = Field(default=setting_default("delivery_retry_seconds"), gt=0)
    max_delay_seconds: float = Field(default=setting_default("delivery_retry_max_seconds"), gt=0)

    @classmethod
    def from_settings(cls, settings: Settings) -> DeliveryRetry:
        """DELIVERY_MAX_ATTEMPTS, DELIVERY_RETRY_SECONDS and DELIVERY_RETRY_MAX_SECONDS."""
        return cls(max_attempts=settings.delivery_max_attempts, first_delay_seconds=settings.delivery_retry_seconds,
                   max_delay_seconds=settings.delivery_retry_max_seconds)

    def delay_after(self, failed_attempts: int) -> float:
        """Seconds to wait after `failed_attempts` failures: the first delay, doubled each time, capped."""
        doublings = min(max(failed_attempts - 1, 0), MAX_DOUBLINGS)
        return min(self.first_delay_seconds * 2 ** doublings, self.max_delay_seconds)


class DeliveryOutcome(StrEnum):
    """What one delivery attempt came to."""

    DELIVERED = "delivered"
    RETRY_SCHEDULED = "retry_scheduled"
    GIVEN_UP = "given_up"
    UNRECORDED = "unrecorded"  # not even the failure could be stored: the sweep's grace period brings it back
    STALE = "stale"  # a newer attempt of the run, or another worker's delivery, owns it now


def is_lasting_refusal(error: BaseException) -> bool:
    """Whether the platform refused for good (a deleted channel, say), so trying again later cannot help."""
    return isinstance(error, MessengerError) and not error.retryable


def reason_of(error: BaseException) -> str:
    """The platform's error code, or the exception's type: short, and never any message text."""
    return getattr(error, "reason", None) or type(error).__name__


def unpostable_notice(run_id: int, reason: str, *, tries: int | None = None) -> str:
    """The plain words posted in the thread when a run's report cannot be posted."""
    after = f", even after {tries} tries" if tries and tries > 1 else ""
    return (f"The report of this run could not be posted ({reason}){after}. It is saved: use the Export button "
            f"or `deepthread export {run_id}`.")


@dataclass(frozen=True)
class DeliveryTarget:
    """Where a run speaks: its thread, its status message, and whom its report mentions."""

    run_id: int
    place: Place
    status_ref: MessageRef | None
    requester: str
    mode: str = ""
    # The watch that fired the run (None too once the watch is deleted); a watch's run whose thread is not opened yet
    # has place.thread None.
    watch_id: int | None = None
    progress_recorded: bool = False  # an attempt had opened a streamed progress message when the target was read

    @classmethod
    def load(cls, sessions: Sessions, run_id: int) -> DeliveryTarget | None:
        """The run's target, read once; None when the run does not exist."""
        run = delivery_run(sessions, run_id)
        if run is None:
            return None
        conversation = run.conversation
        thread = None if is_pending(conversation.thread) else conversation.thread
        return cls(run_id=run_id,
                   place=Place(platform=conversation.platform, workspace=conversation.workspace,
                               channel=conversation.channel, thread=thread),
                   status_ref=MessageRef.model_validate(run.status_message) if run.status_message else None,
                   requester=platform_user(run.requested_by), mode=run.mode, watch_id=run.watch_id,
                   progress_recorded=progress_message(list(run.delivered_messages or [])) is not None)


class RunDelivery:
    """Edits one run's status message and posts its report, on the run's own platform."""

    def __init__(self, sessions: Sessions, target: DeliveryTarget, *, messenger: Messenger,
                 renderer: PlatformRenderer, bucket: EditBudget, min_interval: float = 1.0,
                 retry: DeliveryRetry | None = None, clock: WallClock | None = None,
                 busy: Callable[[], bool] = lambda: False) -> None:
        self.sessions = sessions
        self.run_id = target.run_id
        self.place = target.place
        self.watch_id = target.watch_id
        self._watch_run = target.watch_id is not None or target.place.thread is None
        self.status_ref = target.status_ref
        self.requester = target.requester
        self.messenger = messenger
        self.renderer = renderer
        self.retry = retry or DeliveryRetry()
        self._clock = clock  # None: the database's clock, the one the sweep judges retry times by
        self._first_shown = False
        self._fresh_attempt: int | None = None  # an attempt known to hold the lease without asking the database
        # Whether an attempt is surely the run's current one without asking the database (its lease kept here, its
        # outcome stored by it): set by the attempt (`worker.attempt`); None: the database is asked.
        self.known_current: Callable[[int], bool] | None = None
        self._report_in_thread = False
        self.answer_stream: AnswerStream | None = None
        # `busy`: whether the process is too loaded for ordinary status edits (worker.loop.RunLoop.overloaded).
        self.editor = StatusEditor(self._edit_status, bucket=bucket, workspace=self.place.workspace,
                                   min_interval=min_interval, busy=busy)
        self.progress_stream = self._progress_stream(target.mode, bucket, min_interval, busy)
        self._progress_recorded = target.progress_recorded
        self._latest: RunProgress | None = None
        self._status_phase: tuple[str | None, str] | None = None  # what the status message last showed while streaming

    def _progress_stream(self, mode: str, bucket: EditBudget, min_interval: float,
                         busy: Callable[[], bool]) -> ProgressStream | None:
        """Research progress as a streamed task list, where the platform and the workspace allow it."""
        if mode != "research" or not self.place.thread or self.watch_id is not None \
                or not isinstance(self.messenger, TaskStreaming) \
                or not self.messenger.streams_tasks(self.place.workspace):
            return None
        return ProgressStream(
            self.messenger, self.place, self.requester, bucket=bucket, min_interval=min_interval,
            may_open=lambda attempt: amay_open_progress(self.sessions, self.run_id, attempt),
            record_opened=lambda attempt, ref: arecord_progress_message(self.sessions, self.run_id, attempt,
                                                                        ref.model_dump(mode="json")),
            on_fallback=self._status_takes_over, busy=busy)

    async def _status_takes_over(self, progress: RunProgress) -> None:
        """The stream ended early: the status message shows every state again, starting with the latest."""
        await self._show_in_status(self._latest or progress)

    async def _show_in_status(self, progress: RunProgress, *, wait_seconds: float = 0.0) -> None:
        """Hand `progress` to the status editor, unless the run has ended: `finish` shows the final state after the
        report's last part, so the thread never reads done (its Stop button gone) while the report is still arriving."""
        if progress.state in TERMINAL_STATES:
            return
        await self.editor.update(progress, wait_seconds=wait_seconds)

    def _phase_changed(self, progress: RunProgress) -> bool:
        key = (progress.current_phase, progress.state)
        changed, self._status_phase = key != self._status_phase, key
        return changed

    async def _owns(self, attempt: int) -> bool:
        if self.known_current is not None and self.known_current(attempt):
            return True
        return await ais_current_attempt(self.sessions, self.run_id, attempt)

    async def _edit_status(self, progress: RunProgress) -> None:
        if self.status_ref is None:
            return
        fresh, self._fresh_attempt = progress.attempt == self._fresh_attempt, None
        if not fresh and not await self._owns(progress.attempt):
            return
        await self.messenger.edit(self.status_ref, self.renderer.status(progress, now=dt.datetime.now(dt.timezone.utc)))

    async def on_state(self, progress: RunProgress) -> None:
        """Show `progress`; the first state (the attempt has just started) is sent before this returns, and a final
        state is left to `finish`.

        The engine starts only after the message has left "queued", so the user sees the run
        start at once, not after the engine's first steps have had their turn on the event loop.
        """
        first, self._first_shown = not self._first_shown, True
        if first:
            # The runner shows the first state right after taking the lease: that edit needs no ownership check.
            self._fresh_attempt = progress.attempt
        self._latest = progress
        stream = self.progress_stream
        if stream is not None and not stream.fallen_back:
            await stream.show(progress)
            # While the tasks stream, the status message follows the phase and the run's state only.
            if not self._phase_changed(progress) and not first:
                return
        await self._show_in_status(progress, wait_seconds=FIRST_EDIT_WAIT_SECONDS if first else 0.0)

    def stream_answer(self, attempt: int, loop: asyncio.AbstractEventLoop) -> AnswerStream | None:
        """A stream showing this attempt's answer in the thread as it is written, run on `loop` (the delivery's);
        None when the platform does not stream (the answer is then posted whole) or the run has no thread."""
        if self.answer_stream is None and isinstance(self.messenger, AnswerStreaming) and self.place.thread:
            self.answer_stream = AnswerStream(
                self.messenger, self.place, self.requester, loop=loop,
                may_open=lambda: amay_stream_answer(self.sessions, self.run_id, attempt),
                record_opened=lambda ref: arecord_streamed_answer(self.sessions, self.run_id, attempt,
                                                                  ref.model_dump(mode="json")))
        return self.answer_stream

    async def close_answer_stream(self) -> None:
        """End the answer's stream, if one is open (the audited answer then replaces what it showed)."""
        if self.answer_stream is not None:
            await self.answer_stream.close()

    async def stop_progress_stream(self) -> None:
        """Stop streaming progress without a final state (a stale or broken attempt)."""
        if self.progress_stream is not None:
            await self.progress_stream.stop()

    async def abandon(self) -> None:
        """Stop showing an attempt that will not be finished (stale, or broken): no final edit, streams ended."""
        await self.editor.stop()
        await self.close_answer_stream()
        await self.stop_progress_stream()

    async def _final_progress_message(self, progress: RunProgress) -> None:
        """The final state in the run's streamed progress message, if it has one, once; a deleted message is let go."""
        if self.progress_stream is None and not self._progress_recorded:
            return  # no attempt had opened one when this delivery began, and this one opens none: nothing to read
        try:
            await finish_progress_message(self.sessions, self.run_id, progress, messenger=self.messenger,
                                          stream=self.progress_stream)
        except Exception as error:
            if not is_lasting_refusal(error):
                raise
            logger.warning("final progress of run %s refused (%s)", self.run_id, reason_of(error))

    async def finish(self, progress: RunProgress, *, report: Report | None = None) -> DeliveryOutcome:
        """The report (if the run has one), then the final status edit, each exactly once; never raises.

        The report goes first: posting is not drawn from the workspace's edit budget, so a busy
        workspace delays only the status message, never the answer; and the status reads done only
        once the report's last part is in the thread, however slowly the platform lets it be posted
        (`on_state` leaves a final state to this). The run is marked delivered only once both went
        out; a failure is counted and retried later by the sweep (see the module). `report` is the
        run's stored report as its attempt has it in memory (not read back); the sweep's retries read
        it from the run's row.
        """
        try:
            await self.close_answer_stream()
            await self._final_progress_message(progress)
            if self._watch_run and report is None and progress.state == "done":
                # Read once (a retry's): whether the watch's run has a thread of its own depends on it, then it is posted.
                report = await astored_report(self.sessions, self.run_id)
            if not self._watch_run or await self._watch_run_placed(progress, report):
                await self._report_or_notice(progress.attempt, report)
                await self._final_status(progress)
        except Exception as error:
            return await self._after_failed_attempt(progress, error)
        await amark_delivered(self.sessions, self.run_id, progress.attempt)
        return DeliveryOutcome.DELIVERED

    async def _report_or_notice(self, attempt: int, report: Report | None) -> None:
        """Put the report in the thread, or, when the platform refuses it for good, a notice saying so; raises otherwise."""
        try:
            await self.deliver_report(attempt, report)
        except Exception as error:
            if not is_lasting_refusal(error):
                raise
            logger.warning("the platform refused run %s's report (%s); posting a notice instead", self.run_id,
                           reason_of(error))
            await self._post_notice_once(attempt, unpostable_notice(self.run_id, reason_of(error)))
        self._report_in_thread = True

    async def _watch_run_placed(self, progress: RunProgress, report: Report | None) -> bool:
        """For a watch's run: whether its report goes in a thread — one opened now, with a headline, when the run has
        none yet — or, when nothing changed since the watch's previous run (or the run ended without a report), False
        once one quiet line says so in the previous run's thread instead."""
        comparison = report.watch if report is not None else None
        quiet = quiet_line(progress, comparison) if report is None or progress.state != "done" or (
            comparison is not None and not comparison.changes) else None
        if quiet is not None:
            previous = await aprevious_run(self.sessions, self.run_id)
            thread = previous.thread if previous is not None else self.place.thread
            if thread is not None:
                try:
                    await self._post_notice_once(progress.attempt, quiet, place=self.place.model_copy(
                        update={"thread": thread}))
                except Exception as error:
                    if not is_lasting_refusal(error):
                        raise
                    # That thread is gone or locked, not the channel: the line is let go, the watch goes on.
                    logger.warning("run %s: its line in the watch's previous thread was refused (%s)", self.run_id,
                                   reason_of(error))
            return False
        if self.place.thread is None:
            await self._open_watch_thread(progress, report)
        return True

    async def _open_watch_thread(self, progress: RunProgress, report: Report | None) -> None:
        """Open the watch run's own thread in its channel: a headline, then its status message; record both. A channel
        that refuses for good (deleted, archived, the app removed from it) stops the watch, and its owner is told."""
        try:
            opened = await self.messenger.open_thread(
                self.place, title=self.renderer.notice(watch_headline(progress.question, report)),
                status=self.renderer.status(progress, now=dt.datetime.now(dt.timezone.utc)))
        except Exception as error:
            if self.watch_id is not None and is_lasting_refusal(error):
                await stop_watch_for_good(self.sessions, self.watch_id, error,
                                          Outbound(messenger=self.messenger, renderer=self.renderer))
            raise
        await aopen_pending_thread(self.sessions, self.run_id, opened.thread, opened.status.model_dump(mode="json"),
                                   opened.status.message_id)
        self.place = self.place.model_copy(update={"thread": opened.thread})
        self.status_ref = opened.status

    async def _post_notice_once(self, attempt: int, text: str, *, place: Place | None = None) -> None:
        # The notice is recorded, so a retry does not post it twice.
        delivered = await adelivered_messages(self.sessions, self.run_id)
        if any(entry.kind == "notice" for entry in delivered):
            return
        ref = await self.messenger.post(place or self.place, self.renderer.notice(text))
        notice = DeliveredMessage(kind="notice", ref=ref.model_dump(mode="json"))
        await arecord_delivered(self.sessions, self.run_id, attempt, [*delivered, notice])

    async def _final_status(self, progress: RunProgress) -> None:
        """The last status edit; a message the platform refuses to edit for good (deleted) is let go."""
        try:
            await self.editor.close(progress)
        except Exception as error:
            if not is_lasting_refusal(error):
                raise
            logger.warning("final status edit of run %s refused (%s)", self.run_id, reason_of(error))

    async def _after_failed_attempt(self, progress: RunProgress, error: Exception) -> DeliveryOutcome:
        reason = reason_of(error)
        lasting = is_lasting_refusal(error)  # here: the report and the notice both refused for good
        try:
            recorded = await arecord_failed_delivery(
                self.sessions, self.run_id, progress.attempt, lasting=lasting, max_attempts=self.retry.max_attempts,
                delay_after=self.retry.delay_after, now=self._clock() if self._clock is not None else None)
        except Exception:
            logger.error("delivery of run %s failed (%s) and the failure could not be stored", self.run_id, reason,
                         exc_info=True)
            return DeliveryOutcome.UNRECORDED
        if recorded is None:
            return DeliveryOutcome.STALE
        failed_attempts, given_up = recorded
        if not given_up:
            logger.warning("delivery of run %s failed (%s), try %s of %s; the sweep tries again in %.0f s",
                           self.run_id, reason, failed_attempts, self.retry.max_attempts,
                           self.retry.delay_after(failed_attempts))
            return DeliveryOutcome.RETRY_SCHEDULED
        logger.warning("gave up delivering run %s after %s tries (%s)", self.run_id, failed_attempts, reason)
        await self._last_words(progress, reason, failed_attempts)
        return DeliveryOutcome.GIVEN_UP

    async def _last_words(self, progress: RunProgress, reason: str, tries: int) -> None:
        """Best effort, once: tell the thread the report could not be posted, and show the final state."""
        try:
            # A watch's run with no thread yet has nowhere to say it but the channel itself: it says nothing there.
            if self.place.thread is not None and not self._report_in_thread \
                    and await ahas_report(self.sessions, self.run_id, progress.attempt):
                await self.messenger.post(self.place, self.renderer.notice(unpostable_notice(self.run_id, reason,
                                                                                             tries=tries)))
        except Exception as error:
            logger.warning("could not tell the thread that run %s's report was given up (%s)", self.run_id,
                           reason_of(error))
        if self.editor.last_sent is not progress:
            try:
                await self._edit_status(progress)
            except Exception as error:
                logger.warning("last status edit of run %s failed (%s)", self.run_id, reason_of(error))

    async def deliver_report(self, attempt: int, report: Report | None = None) -> None:
        """Post the run's report into the thread (`report`, or the stored one read back); a retry edits what an
        earlier try posted."""
        stored = await areport_for_delivery(self.sessions, self.run_id, attempt, read_report=report is None)
        if stored is None:
            return
        report_json, delivered = stored
        report = report or Report.model_validate(report_json)
        # Rendering a report parses all its Markdown: in a thread, not on the loop every run's status edits share.
        delivery = await asyncio.to_thread(self.renderer.report, report, requester=self.requester, run_id=self.run_id)
        posted = [entry for entry in delivered if entry.kind == "message"]
        for index, content in enumerate(delivery.messages):
            if index < len(posted):
                await self.messenger.edit(MessageRef.model_validate(posted[index].ref), content)
                continue
            if not await self._owns(attempt):
                return
            ref = await self.messenger.post(self.place, content)
            delivered.append(DeliveredMessage(kind="message", ref=ref.model_dump(mode="json")))
            await arecord_delivered(self.sessions, self.run_id, attempt, delivered)
        if delivery.file is not None and not any(entry.kind == "file" for entry in delivered):
            if not await self._owns(attempt):
                return
            uploaded = await self.messenger.upload(self.place, delivery.file)
            delivered.append(DeliveredMessage(kind="file", ref=uploaded.model_dump(mode="json") if uploaded else None))
            await arecord_delivered(self.sessions, self.run_id, attempt, delivered)


def stored_progress(sessions: Sessions, run_id: int) -> RunProgress | None:
    """A stored run's progress as its status message should show it (None: no such run)."""
    return _progress_of(run_with_events(sessions, run_id))


def _progress_of(stored: StoredRun | None) -> RunProgress | None:
    if stored is None:
        return None
    progress = progress_of_stored_run(stored.run, stored.events)
    report = Report.model_validate(stored.run.report_json) if stored.run.report_json is not None else None
    if report is not None and report.audit.sentences_total:
        # As the runner shows it when it delivers at once: the audit's line on the final status.
        progress = progress.model_copy(update={"audit_line": audit_line(report)})
    return progress


async def sweep_undelivered(sessions: Sessions, *, platforms: Collection[str], lease_seconds: float,
                            delivery_for: Callable[[int], RunDelivery | None],
                            now: dt.datetime | None = None) -> dict[int, DeliveryOutcome]:
    """One pass of the resume sweep: claim the finished runs whose delivery is due and deliver each.

    Returns each claimed run's outcome. `delivery_for` builds a run's delivery on its platform.
    """
    outcomes: dict[int, DeliveryOutcome] = {}
    for run_id in await aclaim_undelivered(sessions, platforms, lease_seconds, now):
        try:
            delivery = await asyncio.to_thread(delivery_for, run_id)  # it reads the run's target and may build a client
            progress = _progress_of(await arun_with_events(sessions, run_id))
            if delivery is None or progress is None:
                continue
            outcomes[run_id] = await delivery.finish(progress)
        except Exception:  # one run's trouble must not hold up the others; its claim lapses and it comes back
            logger.warning("resuming the delivery of run %s failed", run_id, exc_info=True)
    return outcomes


PlatformParts = Callable[[str], "Outbound | None"]


async def show_queue_positions(sessions: Sessions, waiting: Iterable[tuple[int, int]], *,
                               platform_parts: PlatformParts, bucket: EditBudget) -> list[int]:
    """Show each waiting run's place in the queue in its status message; returns the runs edited.

    Each edit is an ordinary one of the workspace's edit budget: when the budget is down to the
    reserve kept for the running runs' phase changes, the position waits for the next refresh.
    """
    edited = []
    parts_of: dict[str, Outbound | None] = {}  # one client per platform, not per run
    for run_id, platform, workspace, progress, ref in await _still_waiting(sessions, list(waiting)):
        try:
            if platform not in parts_of:
                parts_of[platform] = platform_parts(platform)
            parts = parts_of[platform]
            if parts is None or not await bucket.take(workspace):
                continue
            await parts.messenger.edit(ref, parts.renderer.status(progress, now=dt.datetime.now(dt.timezone.utc)))
        except Exception:  # a stale position is harmless; the next refresh fixes it
            logger.warning("could not refresh queue position of run %s", run_id, exc_info=True)
            continue
        edited.append(run_id)
    return edited


async def _still_waiting(sessions: Sessions,
                         waiting: list[tuple[int, int]]) -> list[tuple[int, str, str, RunProgress, MessageRef]]:
    """(run id, platform, workspace, progress at its position, status message) of the runs still waiting, read at once."""
    position_of = dict(waiting)
    still: list[tuple[int, str, str, RunProgress, MessageRef]] = []
    for run in await astill_waiting(sessions, list(position_of)):
        progress = RunProgress.for_run(run, queue_position=position_of[run.id])
        still.append((run.id, run.conversation.platform, run.conversation.workspace, progress,
                      MessageRef.model_validate(run.status_message)))
    return sorted(still, key=lambda item: position_of[item[0]])
