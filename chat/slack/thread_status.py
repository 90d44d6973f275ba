"""A run's progress in the status line of Slack's assistant pane (`assistant.threads.setStatus`).

In an assistant thread (a thread of a direct message with the app) Slack shows "deepthread is researching…" under
the conversation, with up to ten loading messages rotating. The renderer puts the line a status message stands for
into its content (`with_thread_status`); the messenger hands every status edit to `AssistantThreadStatus`, which
sends it when the line changes (a new phase), refreshes it before Slack's two-minute timeout, and clears it (status
"") when the run ends. Slack also clears it whenever the app posts in the thread.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel, Field
from slack_sdk.web.async_client import AsyncWebClient

from chat.message import Content, MessageRef, MessengerError
from chat.state import PHASE_LABELS, RunProgress

logger = logging.getLogger(__name__)

KEY = "slack"
THREAD_STATUS = "thread_status"
MAX_LOADING_MESSAGES = 10
# Slack drops a status after two minutes without a message; resending it a while before keeps it up.
REFRESH_SECONDS = 90.0
CALL_TIMEOUT_SECONDS = 10.0
# Threads remembered at once (a worker runs a handful of runs at a time; old entries are let go first).
REMEMBERED_THREADS = 1_000
# Errors after which the thread can never take a status: it is not an assistant thread, or the app lacks the scope.
LASTING_ERRORS = frozenset({"channel_not_found", "invalid_thread_ts", "thread_not_found", "missing_scope",
                            "not_allowed_token_type", "invalid_arguments", "not_in_channel"})

STATUS_BY_MODE = {"research": "is researching…", "plan": "is drafting a research plan…", "chat": "is thinking…",
                  "followup": "is answering from the sources…"}
MORE_BY_PHASE = {
    "decompose": "Breaking the question into sub-questions…",
    "search": "Looking for the best sources…",
    "fetch": "Downloading the pages worth reading…",
    "read": "Picking the passages that answer the question…",
    "gap_check": "Deciding whether more searching would help…",
    "synthesize": "Citing a source for every claim…",
    "verify": "Checking each claim against its source…",
    "answer": "Citing the passages it relies on…",
}


class ThreadStatus(BaseModel):
    """What the assistant pane shows under the thread: `status` ("" clears it) and the loading messages it rotates."""

    status: str
    loading_messages: list[str] = Field(default_factory=list, max_length=MAX_LOADING_MESSAGES)


def thread_status_of(progress: RunProgress) -> ThreadStatus:
    """The status line for a run's state: waiting, the current phase while it runs, cleared once it ended."""
    if progress.state == "queued":
        position = f" (number {progress.queue_position})" if progress.queue_position else ""
        return ThreadStatus(status="is waiting for a free worker…", loading_messages=[f"Waiting in the queue{position}…"])
    if progress.state != "running":
        return ThreadStatus(status="")
    status = STATUS_BY_MODE.get(progress.mode, "is working…")
    reached = [index for index, line in enumerate(progress.phases) if line.status != "waiting"]
    if not reached:
        return ThreadStatus(status=status, loading_messages=["Getting started…"])
    # Between two phases the line already names the next one (phases a run skips stay waiting behind it).
    upcoming = progress.phases[reached[-1] + 1:]
    phase = progress.current_phase or (upcoming[0].name if upcoming else None)
    if phase is None:
        return ThreadStatus(status=status, loading_messages=["Finishing up…"])
    messages = [f"{PHASE_LABELS.get(phase, phase)}…"]
    if phase in MORE_BY_PHASE:
        messages.append(MORE_BY_PHASE[phase])
    return ThreadStatus(status=status, loading_messages=messages)


def with_thread_status(content: Content, progress: RunProgress) -> Content:
    """`content` (a status message) carrying the assistant-pane status line of `progress`."""
    slack = {**(content.extra.get(KEY) or {}), THREAD_STATUS: thread_status_of(progress).model_dump()}
    return content.model_copy(update={"extra": {**content.extra, KEY: slack}})


def thread_status_in(content: Content) -> ThreadStatus | None:
    """The status line a status message's content carries; None for any other content."""
    carried = (content.extra.get(KEY) or {}).get(THREAD_STATUS)
    return None if carried is None else ThreadStatus.model_validate(carried)


def is_assistant_thread(ref: MessageRef) -> bool:
    """Whether the message is in a thread of a direct message, where Slack's assistant pane lives."""
    # Slack's direct-message conversation ids start with D.
    return ref.thread is not None and ref.channel.startswith("D")


class _Shown(BaseModel):
    status: ThreadStatus
    at: float


SlackCall = Callable[[str, Callable[[AsyncWebClient], Awaitable[Any]]], Awaitable[Any]]


class AssistantThreadStatus:
    """Mirrors status edits into the assistant pane's status line, once per change; never raises.

    `call(workspace, request)` runs a Web API request with the workspace's client, raising MessengerError on refusal
    (SlackMessenger's own `_call`).
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, refresh_seconds: float = REFRESH_SECONDS) -> None:
        self.clock = clock
        self.refresh_seconds = refresh_seconds
        self._shown: OrderedDict[tuple[str, str], _Shown] = OrderedDict()
        self._refused: OrderedDict[tuple[str, str], Any] = OrderedDict()

    async def follow(self, call: SlackCall, ref: MessageRef, content: Content) -> None:
        """Show the status line `content` carries in `ref`'s assistant thread, when it changed or is about to lapse."""
        wanted = thread_status_in(content)
        if wanted is None or not is_assistant_thread(ref):
            return
        key = (ref.channel, str(ref.thread))
        if key in self._refused or not self._worth_sending(wanted, self._shown.get(key)):
            return
        if not await self._send(call, ref.workspace, key, wanted):
            return
        if wanted.status:
            self._shown[key] = _Shown(status=wanted, at=self.clock())
            self._shown.move_to_end(key)
            _forget_oldest(self._shown)
        else:
            self._shown.pop(key, None)  # cleared: the thread needs no memory until its next run

    def _worth_sending(self, wanted: ThreadStatus, shown: _Shown | None) -> bool:
        if shown is None:
            return True  # clearing a line this process did not set is one harmless call
        return wanted != shown.status or self.clock() - shown.at >= self.refresh_seconds

    async def _send(self, call: SlackCall, workspace: str, key: tuple[str, str], wanted: ThreadStatus) -> bool:
        channel, thread = key
        try:
            await asyncio.wait_for(call(workspace, lambda client: client.assistant_threads_setStatus(
                channel_id=channel, thread_ts=thread, status=wanted.status,
                loading_messages=wanted.loading_messages or None)), CALL_TIMEOUT_SECONDS)
        except MessengerError as error:
            logger.info("assistant.threads.setStatus refused (%s)", error.reason)
            if error.reason in LASTING_ERRORS:
                self._refused[key] = None
                _forget_oldest(self._refused)
            return False
        except asyncio.TimeoutError:
            logger.info("assistant.threads.setStatus timed out")
            return False
        return True


def _forget_oldest(remembered: OrderedDict[tuple[str, str], Any]) -> None:
    while len(remembered) > REMEMBERED_THREADS:
        remembered.popitem(last=False)
