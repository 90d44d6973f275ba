"""A chat or follow-up answer shown in its thread while the model writes it, on platforms that stream (Slack).

The engine hands over the visible answer so far, from the runs' loop, as often as it likes; the stream lives on the
delivery loop. It opens the streamed message at the first words, then sends what arrived since at most every
`append_interval` seconds (Slack's chat.appendStream allows about 100 calls a minute), and is stopped before the
audited answer replaces it. The streamed message is recorded as the report's first message before anything else is
posted, so the delivery (and every retry of it) edits that message instead of posting the answer again. A stream that
fails (expired, refused, rate limited) only stops streaming: the final edit of the same message still delivers.

What the stream hands the messenger is the model's text, unaudited; the messenger sends its safe rendering (no
mention, no link: a draft has no audited sources), which only ever grows as the text does (issue 24, M3).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
from contextlib import suppress

from chat.message import AnswerStreaming, MessageRef, Place

logger = logging.getLogger(__name__)

# chat.appendStream is a Tier 4 method (about 100 calls a minute): one stream appends at most this often.
APPEND_INTERVAL_SECONDS = 0.6

MayOpen = Callable[[], Awaitable[bool]]
RecordOpened = Callable[[MessageRef], Awaitable[bool]]


class AnswerStream:
    """One answer streamed into one thread: `show` from any thread, `close` on the delivery loop."""

    def __init__(self, messenger: AnswerStreaming, place: Place, recipient: str, *, loop: asyncio.AbstractEventLoop,
                 may_open: MayOpen, record_opened: RecordOpened,
                 append_interval: float = APPEND_INTERVAL_SECONDS) -> None:
        self.messenger = messenger
        self.place = place
        self.recipient = recipient
        self.loop = loop
        self.append_interval = append_interval
        self._may_open = may_open
        self._record_opened = record_opened
        self._lock = threading.Lock()  # `show` runs on the runs' loop, the pump on the delivery loop
        self._latest = ""
        self._wake_pending = False
        self._changed = asyncio.Event()
        self._closing = asyncio.Event()
        self._pump_task: asyncio.Task[None] | None = None
        self.ref: MessageRef | None = None
        self.shown = ""
        self.frozen = False  # nothing more is appended: refused, not ours, or the text started over
        self._stop_sent = False

    def show(self, visible_text: str) -> None:
        """Make `visible_text` (the whole answer so far) the next thing to show; never blocks, safe from any thread."""
        with self._lock:
            self._latest = visible_text
            if self._wake_pending:
                return
            self._wake_pending = True
        self.loop.call_soon_threadsafe(self._wake)

    async def close(self) -> MessageRef | None:
        """Send what is still unsent, then end the stream; the streamed message, if one was opened."""
        self._closing.set()
        self._changed.set()
        if self._pump_task is not None:
            await asyncio.gather(self._pump_task, return_exceptions=True)
        if self.ref is not None and not self._stop_sent:
            self._stop_sent = True
            try:
                await self.messenger.stop_stream(self.ref)
            except Exception as error:  # the final edit replaces it all the same
                logger.info("could not stop the answer stream (%s)", getattr(error, "reason", type(error).__name__))
        return self.ref

    def _wake(self) -> None:
        self._changed.set()
        if self._pump_task is None and not self._closing.is_set():
            self._pump_task = asyncio.ensure_future(self._pump())

    def _take_latest(self) -> str:
        with self._lock:
            self._wake_pending = False
            return self._latest

    async def _pump(self) -> None:
        try:
            while not self.frozen:
                await self._changed.wait()
                self._changed.clear()
                await self._send(self._take_latest())
                if self._closing.is_set():
                    return
                with suppress(TimeoutError):  # pacing; a close ends the wait at once
                    await asyncio.wait_for(self._closing.wait(), self.append_interval)
        except Exception as error:  # streaming is a courtesy: the delivery posts or edits the answer anyway
            self.frozen = True
            logger.info("stopped streaming the answer (%s)", getattr(error, "reason", type(error).__name__))

    async def _send(self, text: str) -> None:
        if self.ref is None:
            if not text.strip():
                return
            if not await self._may_open():
                self.frozen = True  # an earlier attempt's message is there: the delivery edits it instead
                return
            self.ref = await self.messenger.start_stream(self.place, text, recipient=self.recipient)
            self.shown = text
            if not await self._record_opened(self.ref):
                self.frozen = True  # this attempt no longer owns the run
            return
        if not text.startswith(self.shown):
            # The model started over (a reasoning prefix ended, a retry): a stream cannot take words back.
            self.frozen = True
            return
        unsent = text[len(self.shown):]
        if unsent:
            await self.messenger.append_stream(self.ref, unsent)
            self.shown = text
