"""The messenger contract every platform implements, and the platform-neutral message content."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, Field

from research.errors import DeepthreadError


class Place(BaseModel):
    """Where a message goes: a channel, and the thread in it (None: the channel itself)."""

    platform: str
    workspace: str
    channel: str
    thread: str | None = None


class MessageRef(BaseModel):
    """A posted message, enough to edit it later."""

    platform: str
    workspace: str
    channel: str
    message_id: str
    thread: str | None = None


class Content(BaseModel):
    """One message as a platform renderer made it: plain text (always), plus the platform's own payload in
    `extra` under the platform's name (Slack's blocks, Discord's components and allowed mentions)."""

    text: str
    extra: dict[str, Any] = Field(default_factory=dict)


class FileUpload(BaseModel):
    """A file to attach in a thread (a report too long for messages)."""

    filename: str
    data: bytes
    title: str | None = None
    comment: str | None = None


class OpenedThread(BaseModel):
    """A thread opened for a new request: its id, and the run's status message."""

    thread: str
    status: MessageRef


class Messenger(Protocol):
    """Sends to one platform; every method raises MessengerError when the platform refuses for good."""

    platform: str

    async def post(self, place: Place, content: Content) -> MessageRef: ...

    async def edit(self, ref: MessageRef, content: Content) -> None: ...

    async def upload(self, place: Place, upload: FileUpload) -> MessageRef | None: ...

    async def open_thread(self, place: Place, *, title: Content, status: Content) -> OpenedThread:
        """Open a thread in `place`'s channel for a new request, with `status` as the run's status message (each
        platform shapes it its own way: under a title message, or started from the status message itself)."""
        ...


@runtime_checkable
class AnswerStreaming(Protocol):
    """A messenger that can show an answer as it is written (Slack's streamed messages); a messenger without these
    methods gets the answer posted whole. Every method raises MessengerError as `Messenger`'s do.

    The text is the model's own, not yet audited: the messenger shows it so that nothing in it pings anyone or links
    anywhere, and what it adds never changes what it already showed."""

    async def start_stream(self, place: Place, text: str, *, recipient: str) -> MessageRef:
        """Open a message in `place` showing `text`, to grow as more arrives; `recipient` is the platform user who
        asked (a stream in a channel is shown to them)."""
        ...

    async def append_stream(self, ref: MessageRef, text: str) -> None:
        """Add `text` to the end of the streamed message."""
        ...

    async def stop_stream(self, ref: MessageRef) -> None:
        """End the stream: the message keeps what it shows and can be edited like any other."""
        ...


@runtime_checkable
class DirectMessaging(Protocol):
    """A messenger that can write to one person privately (a direct message from the bot), where the platform lets a
    bot start one; raises MessengerError as `Messenger`'s methods do."""

    async def direct(self, workspace: str, user: str, content: Content) -> MessageRef:
        """Send `content` to `user` (the platform's own id, without the platform's name) of `workspace`."""
        ...


async def open_thread_under_title(messenger: Messenger, place: Place, *, title: Content, status: Content) -> OpenedThread:
    """The common shape of `open_thread`: the title posted in the channel, the status message in its thread."""
    root = await messenger.post(place, title)
    status_ref = await messenger.post(place.model_copy(update={"thread": root.message_id}), status)
    return OpenedThread(thread=root.message_id, status=status_ref)


class MessengerError(DeepthreadError):
    """The platform refused a message after retries; `reason` is the platform's error code."""

    def __init__(self, reason: str, *, retryable: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retryable = retryable


# Told of each wait out of a platform's rate limit (the platform's name, the seconds waited); the composition root
# hands the messengers ops.metrics', so that the chat layer needs no metrics of its own.
RateLimitWaitCounter = Callable[[str, float], None]


def uncounted_wait(platform: str, seconds: float) -> None:
    """The rate-limit counter of a messenger built without one: counts nothing."""
