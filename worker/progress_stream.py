"""A research run's progress as a streamed task list in its thread, on platforms that stream tasks (Slack).

The stream opens with the run's first state and then receives the tasks that changed, coalesced like status edits (at
most one append per `min_interval`, the latest state last) and drawn from the same per-workspace edit budget. The
status message stays: while the stream is live it is edited only when the phase or the run's state changes. Any
stream error (refused, expired after a pause, rate limited for good) ends streaming for the run: the status message
then takes every state again, as without streaming, and the streamed message is finished with an ordinary edit
(`show_task_list`, Slack's chat.update on the same ts). The streamed message is recorded on the run before anything
else happens to it, so a later attempt or the resume sweep finishes that message rather than opening another.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from chat.message import MessageRef, Place
from chat.state import RunProgress
from chat.tasks import TaskList, TaskStreaming, task_list
from storage.db import Sessions
from storage.deliveries import amark_progress_final, aunfinished_progress_message
from worker.progress import Clock, EditBudget, Sleep, StatusEditor

logger = logging.getLogger(__name__)

MayOpen = Callable[[int], Awaitable[bool]]
RecordOpened = Callable[[int, MessageRef], Awaitable[bool]]
OnFallback = Callable[[RunProgress], Awaitable[None]]


def _reason_of(error: BaseException) -> str:
    """The platform's error code, or the exception's type (never message text)."""
    return getattr(error, "reason", None) or type(error).__name__


# The key of a workspace's allowance for task-stream appends, after the workspace's own (status edits).
STREAM_BUDGET_SUFFIX = "/task-stream"


class ProgressStream:
    """One attempt's progress as a streamed task list: `show` each state, `close` with the final one (on the delivery loop)."""

    def __init__(self, messenger: TaskStreaming, place: Place, recipient: str, *, bucket: EditBudget,
                 may_open: MayOpen, record_opened: RecordOpened, on_fallback: OnFallback, min_interval: float = 1.0,
                 clock: Clock = time.monotonic, sleep: Sleep = asyncio.sleep,
                 busy: Callable[[], bool] = lambda: False) -> None:
        self.messenger = messenger
        self.place = place
        self.recipient = recipient
        self._may_open = may_open
        self._record_opened = record_opened
        self._on_fallback = on_fallback
        self.ref: MessageRef | None = None
        self.shown: TaskList | None = None
        self.fallen_back = False  # the status message shows the progress again; nothing more is streamed
        self.stopped = False  # chat.stopStream went through: the stream ended as it should
        self._closing = False
        # The final state does not wait for the budget: the report follows it, and a busy workspace must not hold that up.
        # Its own allowance in the workspace's budget: chat.appendStream is rate limited apart from chat.update, and
        # sharing one allowance left status edits (the first among them) refused under load. While the process is
        # overloaded (`busy`), it sheds as the status message does: only phase changes, at most every 3 s.
        self._sender = StatusEditor(self._send, bucket=bucket, workspace=f"{place.workspace}{STREAM_BUDGET_SUFFIX}",
                                    min_interval=min_interval, final_wait=0.0, clock=clock, sleep=sleep,
                                    count_edit=lambda outcome: None, busy=busy)

    async def show(self, progress: RunProgress) -> None:
        """Make `progress` the next state to stream; returns at once (ignored once fallen back or closed)."""
        if not self.fallen_back:
            await self._sender.update(progress)

    async def close(self, final_progress: RunProgress) -> None:
        """Show the final task list: the stream stopped with its last changes, or, when it ended early, the message
        edited; raises MessengerError when even the edit failed (the delivery retries)."""
        self._closing = True
        await self._sender.close(final_progress)

    async def stop(self) -> None:
        """Stop without a final state (a stale attempt must not deliver)."""
        await self._sender.stop()

    async def _send(self, progress: RunProgress) -> None:
        tasks = task_list(progress)
        if self._closing:
            await self._finish(tasks)
            return
        if self.fallen_back:
            return
        try:
            if self.ref is None:
                await self._open(progress, tasks)
            else:
                changed = tasks.changed_since(self.shown)
                if changed:
                    await self.messenger.append_task_stream(self.ref, changed)
                    self.shown = tasks
        except Exception as error:  # any stream error: the status message takes over, nothing is lost
            logger.info("progress stream of %s ended early (%s); editing the status message instead",
                        self.place.channel, _reason_of(error))
            await self._fall_back(progress)

    async def _open(self, progress: RunProgress, tasks: TaskList) -> None:
        if not await self._may_open(progress.attempt):
            # An earlier attempt's streamed message is in the thread (the delivery finishes it), or this attempt is stale.
            await self._fall_back(progress)
            return
        self.ref = await self.messenger.start_task_stream(self.place, tasks, recipient=self.recipient)
        self.shown = tasks
        if not await self._record_opened(progress.attempt, self.ref):
            self.fallen_back = True  # a newer attempt owns the run: it shows the progress

    async def _fall_back(self, progress: RunProgress) -> None:
        self.fallen_back = True
        await self._on_fallback(progress)

    async def _finish(self, tasks: TaskList) -> None:
        if self.ref is None:
            return
        if not self.fallen_back:
            try:
                await self.messenger.stop_task_stream(self.ref, tasks.changed_since(self.shown))
                self.stopped = True
                self.shown = tasks
                return
            except Exception as error:  # expired at the last moment: the same message is edited instead
                logger.info("could not stop the progress stream (%s); editing it instead", _reason_of(error))
        await self.messenger.show_task_list(self.ref, tasks)
        self.shown = tasks


async def finish_progress_message(sessions: Sessions, run_id: int, final_progress: RunProgress, *,
                                  messenger: object, stream: ProgressStream | None) -> None:
    """Show the final state in the run's progress message, once: the live stream stopped, or the recorded message
    (an earlier attempt's, or this one's after the stream ended) edited; raises MessengerError when that failed."""
    recorded = await aunfinished_progress_message(sessions, run_id)
    ref = MessageRef.model_validate(recorded) if recorded is not None else None
    if stream is not None and (ref is None or stream.ref != ref):
        await stream.stop()  # never opened here, or not the recorded message: nothing of it to finish
        stream = None
    if ref is None:
        return
    if stream is not None:
        await stream.close(final_progress)
    elif isinstance(messenger, TaskStreaming):
        await messenger.show_task_list(ref, task_list(final_progress))
    else:
        return
    await amark_progress_final(sessions, run_id, final_progress.attempt)
