"""AnswerStream: the first words open the streamed message, later words are appended, a restart freezes it, and
closing stops it; a stream that may not open (an earlier attempt's message is there) never starts."""

from __future__ import annotations

import asyncio

from chat.message import AnswerStreaming, MessageRef, MessengerError, Place
from worker.answer_stream import AnswerStream

PLACE = Place(platform="chat", workspace="W1", channel="C1", thread="100.1")


class StreamingMessenger:
    """Records stream calls; `called` is set on each, so a test waits on it instead of sleeping."""

    platform = "chat"

    def __init__(self, refuse_appends: bool = False) -> None:
        self.calls: list[tuple[str, str]] = []
        self.called = asyncio.Event()
        self.refuse_appends = refuse_appends

    async def start_stream(self, place: Place, text: str, *, recipient: str) -> MessageRef:
        self._note("start", f"{recipient}:{text}")
        return MessageRef(platform="chat", workspace=place.workspace, channel=place.channel, message_id="200.2",
                          thread=place.thread)

    async def append_stream(self, ref: MessageRef, text: str) -> None:
        self._note("append", text)
        if self.refuse_appends:
            raise MessengerError("message_not_in_streaming_state")

    async def stop_stream(self, ref: MessageRef) -> None:
        self._note("stop", ref.message_id)

    def _note(self, kind: str, detail: str) -> None:
        self.calls.append((kind, detail))
        self.called.set()

    async def next_call(self) -> None:
        await self.called.wait()
        self.called.clear()


ASKED_TO_OPEN = "asked to open"


def stream_for(messenger: StreamingMessenger, *, may_open: bool = True) -> tuple[AnswerStream, list[MessageRef]]:
    recorded: list[MessageRef] = []

    async def allowed() -> bool:
        messenger._note(ASKED_TO_OPEN, "")
        return may_open

    async def record(ref: MessageRef) -> bool:
        recorded.append(ref)
        return True

    return AnswerStream(messenger, PLACE, "U1", loop=asyncio.get_running_loop(), may_open=allowed,
                        record_opened=record, append_interval=0.0), recorded


async def test_first_words_open_the_stream_and_later_words_are_appended_then_it_stops() -> None:
    messenger = StreamingMessenger()
    assert isinstance(messenger, AnswerStreaming)
    stream, recorded = stream_for(messenger)
    stream.show("Tides")
    await messenger.next_call()
    stream.show("Tides happen")
    stream.show("Tides happen twice")  # both before the next send: one append carries them
    await messenger.next_call()
    ref = await stream.close()
    assert messenger.calls == [(ASKED_TO_OPEN, ""), ("start", "U1:Tides"), ("append", " happen twice"),
                               ("stop", "200.2")]
    assert recorded == [ref] and ref is not None and ref.message_id == "200.2"


async def test_an_answer_that_starts_over_is_not_appended_but_the_stream_is_still_stopped() -> None:
    messenger = StreamingMessenger()
    stream, _ = stream_for(messenger)
    stream.show("Let me think about tides")
    await messenger.next_call()
    stream.show("Tides happen twice a day.")
    await stream.close()  # it sends what is unsent first, so the restart has been seen
    assert [kind for kind, _ in messenger.calls] == [ASKED_TO_OPEN, "start", "stop"]


async def test_an_expired_stream_stops_appending() -> None:
    messenger = StreamingMessenger(refuse_appends=True)
    stream, _ = stream_for(messenger)
    stream.show("Tides")
    await messenger.next_call()
    stream.show("Tides happen")
    await messenger.next_call()
    stream.show("Tides happen twice")
    await stream.close()
    assert [kind for kind, _ in messenger.calls] == [ASKED_TO_OPEN, "start", "append", "stop"]


async def test_no_stream_opens_where_an_earlier_attempt_already_answered() -> None:
    messenger = StreamingMessenger()
    stream, recorded = stream_for(messenger, may_open=False)
    stream.show("Tides")
    await messenger.next_call()
    assert await stream.close() is None
    assert messenger.calls == [(ASKED_TO_OPEN, "")] and recorded == []
