"""Posting, editing and uploading to Slack with slack-sdk's AsyncWebClient, riding out rate limits.

Rate limits: the client retries HTTP 429 answers itself (`AsyncRateLimitErrorRetryHandler` sleeps for the
`Retry-After` seconds plus up to one second of jitter before each retry), `RATE_LIMIT_RETRIES` times per call, and
retries dropped connections twice. Server errors (5xx) are not retried here, because a retried `chat.postMessage`
could post twice; they surface as a retryable `MessengerError` for the caller to decide.

Plain-text fallback: when Slack rejects a message's blocks (`invalid_blocks`, `msg_too_long`, …) the message is sent
again as its `text` alone. A post whose text is longer than `PLAIN_TEXT_LIMIT` (Slack advises keeping messages under
4,000 characters and cuts them at 40,000) goes out as several messages in the same place, split at paragraph
boundaries; an edit cannot be split, so an edit whose text exceeds Slack's 40,000 characters fails loudly.

Tokens: one bot token for every workspace (SLACK_BOT_TOKEN), or, with OAuth installs, each workspace's own token
from the installation store (`WorkspaceClients`, keyed by the place's workspace); a token Slack refuses is looked up
afresh on the next call.

Every post sets `unfurl_links=False`, `unfurl_media=False` and `link_names=False` (so a bare `@here` stays text).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import aiohttp
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.http_retry.builtin_async_handlers import AsyncConnectionErrorRetryHandler, AsyncRateLimitErrorRetryHandler
from slack_sdk.http_retry.request import HttpRequest
from slack_sdk.http_retry.response import HttpResponse
from slack_sdk.http_retry.state import RetryState
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.webhook.async_client import AsyncWebhookClient, WebhookResponse

from chat.message import (
    Content,
    FileUpload,
    MessageRef,
    MessengerError,
    OpenedThread,
    Place,
    RateLimitWaitCounter,
    open_thread_under_title,
    uncounted_wait,
)
from chat.slack.render import blocks_of, stream_markdown_characters
from chat.slack.tasks import TASK_DISPLAY_MODE, stream_chunks, task_list_content
from chat.slack.thread_status import AssistantThreadStatus
from chat.tasks import ProgressMode, ProgressTask, TaskList
from chat.text import split_text

logger = logging.getLogger(__name__)

SLACK_API_URL = "https://slack.com/api/"
RATE_LIMIT_RETRIES = 8
CONNECTION_RETRIES = 2
REQUEST_TIMEOUT_SECONDS = 30
PLAIN_TEXT_LIMIT = 4_000
SLACK_TEXT_LIMIT = 40_000
# chat.startStream/appendStream take at most this much `markdown_text` a call.
STREAM_TEXT_LIMIT = 12_000
RICH_LAYOUT_ERRORS = frozenset({
    "invalid_blocks", "invalid_blocks_format", "msg_too_long", "msg_blocks_too_long", "too_many_blocks",
    "block_mismatch", "invalid_attachments", "markdown_text_conflict",
})
RETRYABLE_ERRORS = frozenset({
    "ratelimited", "rate_limited", "internal_error", "fatal_error", "service_unavailable", "request_timeout",
    "connection_error", "upload_failed",
})
# What Slack answers to a token that no longer works (the app uninstalled, the token revoked).
REFUSED_TOKEN_ERRORS = frozenset({"invalid_auth", "token_revoked", "account_inactive", "not_authed"})
NOT_INSTALLED = "app_not_installed"
# What chat.startStream answers in a workspace (or plan, or app config) without streaming: SLACK_PROGRESS=auto remembers it.
STREAMING_UNAVAILABLE_ERRORS = frozenset({
    "not_allowed", "not_allowed_token_type", "unknown_method", "missing_scope", "feature_not_enabled",
    "method_not_supported_for_channel_type", "access_denied", "team_access_not_granted",
})

Result = TypeVar("Result")


class LoopSessions:
    """One aiohttp session per event loop, made there on first use and kept, so that connections stay open between
    calls (a session belongs to the loop it was made in: a client used from a new loop gets a new one)."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def current(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._loop is not loop:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
            self._loop = loop
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


class PooledWebClient(AsyncWebClient):
    """An AsyncWebClient that keeps its connections open between calls (`LoopSessions`).

    Without a session slack-sdk opens and closes a connection for every call, which a worker
    editing hundreds of status messages pays for in TLS handshakes and event-loop time.
    """

    _sessions: LoopSessions | None = None

    async def _request(self, *, http_verb: str, api_url: str, req_args: dict[str, Any]) -> dict[str, Any]:
        self._sessions = self._sessions or LoopSessions(self.timeout)
        self.session = self._sessions.current()
        return await super()._request(http_verb=http_verb, api_url=api_url, req_args=req_args)


class ResponseUrlPoster:
    """Posts to commands' and buttons' `response_url`s over connections kept open (`LoopSessions`), as
    `PooledWebClient` calls the Web API: bolt's `respond` opens and closes a connection, TLS included, for every
    private reply, and under a burst of commands that work held up the next commands' acknowledgements."""

    def __init__(self, *, timeout: int = REQUEST_TIMEOUT_SECONDS) -> None:
        self.timeout = timeout
        self.sessions = LoopSessions(timeout)

    async def send(self, response_url: str, message: dict[str, Any]) -> WebhookResponse:
        return await AsyncWebhookClient(url=response_url, timeout=self.timeout,
                                        session=self.sessions.current()).send_dict(message)


class CountedRateLimitRetryHandler(AsyncRateLimitErrorRetryHandler):
    """slack-sdk's 429 handler (waits out Retry-After), telling `count_wait` of each wait."""

    def __init__(self, *, max_retry_count: int, count_wait: RateLimitWaitCounter) -> None:
        super().__init__(max_retry_count=max_retry_count)
        self.count_wait = count_wait

    async def prepare_for_next_attempt_async(self, *, state: RetryState, request: HttpRequest,
                                             response: HttpResponse | None = None, error: Exception | None = None) -> None:
        started = time.monotonic()
        await super().prepare_for_next_attempt_async(state=state, request=request, response=response, error=error)
        self.count_wait(SlackMessenger.platform, time.monotonic() - started)


def build_slack_client(token: str, base_url: str = SLACK_API_URL, *, rate_limit_retries: int = RATE_LIMIT_RETRIES,
                       connection_retries: int = CONNECTION_RETRIES, timeout: int = REQUEST_TIMEOUT_SECONDS,
                       count_rate_limit_wait: RateLimitWaitCounter = uncounted_wait) -> AsyncWebClient:
    """An AsyncWebClient for `base_url` that retries 429s (honouring Retry-After, each wait told to
    `count_rate_limit_wait`) and dropped connections, and keeps its connections open between calls."""
    return PooledWebClient(
        token=token,
        base_url=base_url,
        timeout=timeout,
        retry_handlers=[
            AsyncConnectionErrorRetryHandler(max_retry_count=connection_retries),
            CountedRateLimitRetryHandler(max_retry_count=rate_limit_retries, count_wait=count_rate_limit_wait),
        ],
    )


def messenger_error(error: Exception) -> MessengerError:
    """The MessengerError for a slack-sdk or network failure; its reason is Slack's error code where there is one."""
    if isinstance(error, SlackApiError):
        response = error.response
        status = getattr(response, "status_code", 200) or 200
        data = getattr(response, "data", None)
        code = data.get("error") if isinstance(data, dict) else None
        reason = str(code or f"http_{status}")
        return MessengerError(reason, retryable=reason in RETRYABLE_ERRORS or status == 429 or status >= 500)
    if isinstance(error, SlackClientError):
        return MessengerError("upload_failed", retryable=True)
    return MessengerError("connection_error", retryable=True)


async def _guarded(call: Awaitable[Result]) -> Result:
    """The result of a slack-sdk call; raises MessengerError for anything Slack or the network refused."""
    try:
        return await call
    except (SlackApiError, SlackClientError, aiohttp.ClientError, asyncio.TimeoutError) as error:
        raise messenger_error(error) from error


class WorkspaceClients(Protocol):
    """Web API clients by workspace (Slack team id), each with that workspace's bot token."""

    async def client_for(self, workspace: str) -> AsyncWebClient | None:
        """The client for `workspace`; None when the app is not installed there."""
        ...

    def forget(self, workspace: str) -> None:
        """Look `workspace`'s token up afresh next time (Slack refused it)."""
        ...


class SlackMessenger:
    """Posts, edits and uploads in Slack threads; falls back to plain text when Slack rejects the blocks."""

    platform = "slack"

    def __init__(self, client: AsyncWebClient | None = None, *, workspaces: WorkspaceClients | None = None,
                 thread_status: AssistantThreadStatus | None = None, progress_mode: ProgressMode = "edit") -> None:
        """Speak with one `client` (one bot token) everywhere, or with each workspace's own client from `workspaces`;
        `progress_mode` is SLACK_PROGRESS (research progress as streamed tasks, edited messages, or `auto`)."""
        if (client is None) == (workspaces is None):
            raise ValueError("give the messenger either one client or the workspaces' clients")
        self.client = client
        self.workspaces = workspaces
        self.progress_mode = progress_mode
        self._workspaces_without_streaming: set[str] = set()  # auto: those whose chat.startStream was refused
        # Each open answer stream's trailing backslashes: all of its text that decides how the next `[` is escaped.
        self._streamed: dict[tuple[str, str], str] = {}
        self.thread_status = thread_status or AssistantThreadStatus()  # status edits, mirrored in the assistant pane

    async def _call(self, workspace: str, call: Callable[[AsyncWebClient], Awaitable[Result]]) -> Result:
        """`call` with the workspace's client; raises MessengerError as `_guarded` does, or when it is not installed."""
        if self.client is not None:
            return await _guarded(call(self.client))
        assert self.workspaces is not None  # __init__ took exactly one of the two
        client = await self.workspaces.client_for(workspace)
        if client is None:
            raise MessengerError(NOT_INSTALLED)
        try:
            return await _guarded(call(client))
        except MessengerError as error:
            if error.reason in REFUSED_TOKEN_ERRORS:
                self.workspaces.forget(workspace)
            raise

    async def post(self, place: Place, content: Content) -> MessageRef:
        """Post `content` in `place` (its thread if set); raises MessengerError when Slack refuses even plain text."""
        blocks = blocks_of(content)
        if blocks:
            try:
                return await self._post_message(place, content.text, blocks)
            except MessengerError as error:
                if error.reason not in RICH_LAYOUT_ERRORS:
                    raise
                logger.warning("slack rejected the message layout (%s); posting it as plain text", error.reason)
        return await self._post_plain_text(place, content.text)

    async def direct(self, workspace: str, user: str, content: Content) -> MessageRef:
        """`content` in the app's direct messages with `user` (`chat.postMessage` to the user's id: Slack opens the
        conversation, in the app's Messages tab)."""
        return await self.post(Place(platform=self.platform, workspace=workspace, channel=user), content)

    async def edit(self, ref: MessageRef, content: Content) -> None:
        """Replace the message at `ref` with `content`; raises MessengerError when Slack refuses even plain text."""
        await self.thread_status.follow(self._call, ref, content)
        blocks = blocks_of(content)
        if blocks:
            try:
                await self._update(ref, content.text, blocks)
                return
            except MessengerError as error:
                if error.reason not in RICH_LAYOUT_ERRORS:
                    raise
                logger.warning("slack rejected the edited layout (%s); editing as plain text", error.reason)
        if len(content.text) > SLACK_TEXT_LIMIT:
            raise MessengerError("msg_too_long")
        # An empty list removes the previous blocks; leaving `blocks` out would keep them.
        await self._update(ref, content.text, [])

    async def open_thread(self, place: Place, *, title: Content, status: Content) -> OpenedThread:
        """The title in the channel, the status message in its thread."""
        return await open_thread_under_title(self, place, title=title, status=status)

    async def start_stream(self, place: Place, text: str, *, recipient: str) -> MessageRef:
        """Start a streamed reply in `place`'s thread (`chat.startStream`, shown to `recipient` of `place`'s
        workspace, as Slack requires in channels) showing `text` (the model's words, sent as `stream_markdown`:
        nothing in them pings or links); raises MessengerError."""
        first, *rest = _stream_pieces(text, after="")
        response = await self._call(place.workspace, lambda client: client.chat_startStream(
            channel=place.channel, thread_ts=place.thread or "", markdown_text=first,
            recipient_user_id=recipient, recipient_team_id=place.workspace,
        ))
        ref = MessageRef(platform=self.platform, workspace=place.workspace,
                         channel=str(response.get("channel") or place.channel), message_id=str(response["ts"]),
                         thread=place.thread)
        self._streamed[_stream_key(ref)] = ""
        await self._append_pieces(ref, rest, _backslash_tail("", text))
        return ref

    async def append_stream(self, ref: MessageRef, text: str) -> None:
        """Add `text` to the streamed reply (`chat.appendStream`, as `stream_markdown` in pieces within Slack's 12,000
        characters a call); raises MessengerError, `message_not_in_streaming_state` once Slack has ended the stream
        or when this messenger did not start it (what a `[` follows decides how it is escaped)."""
        streamed = self._streamed.get(_stream_key(ref))
        if streamed is None:
            raise MessengerError("message_not_in_streaming_state")
        await self._append_pieces(ref, _stream_pieces(text, after=streamed), _backslash_tail(streamed, text))

    async def _append_pieces(self, ref: MessageRef, pieces: list[str], tail: str) -> None:
        for piece in pieces:
            await self._call(ref.workspace, lambda client: client.chat_appendStream(
                channel=ref.channel, ts=ref.message_id, markdown_text=piece))
        self._streamed[_stream_key(ref)] = tail

    async def stop_stream(self, ref: MessageRef) -> None:
        """End the streamed reply (`chat.stopStream`); raises MessengerError as `append_stream`."""
        self._streamed.pop(_stream_key(ref), None)
        await self._call(ref.workspace, lambda client: client.chat_stopStream(channel=ref.channel, ts=ref.message_id))

    def streams_tasks(self, workspace: str) -> bool:
        """Whether a run's progress in `workspace` is tried as streamed tasks: SLACK_PROGRESS=stream, or auto while
        the workspace has not refused chat.startStream."""
        if self.progress_mode == "auto":
            return workspace not in self._workspaces_without_streaming
        return self.progress_mode == "stream"

    async def start_task_stream(self, place: Place, tasks: TaskList, *, recipient: str) -> MessageRef:
        """Open a streamed reply in `place`'s thread showing `tasks` as a plan (`plan_update`, then `task_update`
        chunks); raises MessengerError, and with SLACK_PROGRESS=auto remembers a workspace that has no streaming."""
        try:
            response = await self._call(place.workspace, lambda client: client.chat_startStream(
                channel=place.channel, thread_ts=place.thread or "", recipient_user_id=recipient,
                recipient_team_id=place.workspace, task_display_mode=TASK_DISPLAY_MODE,
                chunks=stream_chunks(tasks.tasks, title=tasks.title),
            ))
        except MessengerError as error:
            if error.reason in STREAMING_UNAVAILABLE_ERRORS:
                self._workspaces_without_streaming.add(place.workspace)
            raise
        return MessageRef(platform=self.platform, workspace=place.workspace,
                          channel=str(response.get("channel") or place.channel), message_id=str(response["ts"]),
                          thread=place.thread)

    async def append_task_stream(self, ref: MessageRef, tasks: list[ProgressTask]) -> None:
        """Send the changed tasks as `task_update` chunks (`chat.appendStream`); raises MessengerError,
        `message_not_in_streaming_state` once Slack has ended the stream."""
        await self._call(ref.workspace, lambda client: client.chat_appendStream(
            channel=ref.channel, ts=ref.message_id, chunks=stream_chunks(tasks)))

    async def stop_task_stream(self, ref: MessageRef, tasks: list[ProgressTask]) -> None:
        """End the streamed task list with its last changes (`chat.stopStream`); raises MessengerError."""
        await self._call(ref.workspace, lambda client: client.chat_stopStream(
            channel=ref.channel, ts=ref.message_id, chunks=stream_chunks(tasks) or None))

    async def show_task_list(self, ref: MessageRef, tasks: TaskList) -> None:
        """Replace the message at `ref` with the task list in Block Kit (`chat.update`: the fallback when a stream
        has ended); raises MessengerError."""
        content = task_list_content(tasks)
        try:
            await self._update(ref, content.text, blocks_of(content) or [])
        except MessengerError as error:
            if error.reason not in RICH_LAYOUT_ERRORS:
                raise
            await self._update(ref, content.text, [])

    async def upload(self, place: Place, upload: FileUpload) -> MessageRef | None:
        """Attach a file in `place` (Slack's two-step upload); the file's message when Slack reports where it is shared."""
        response = await self._call(place.workspace, lambda client: client.files_upload_v2(
            channel=place.channel,
            thread_ts=place.thread,
            filename=upload.filename,
            content=upload.data,
            title=upload.title or upload.filename,
            initial_comment=upload.comment,
        ))
        share_ts = _share_ts(response.data if isinstance(response.data, dict) else {}, place.channel)
        if share_ts is None:
            return None
        return MessageRef(platform=self.platform, workspace=place.workspace, channel=place.channel,
                          message_id=share_ts, thread=place.thread)

    async def _post_message(self, place: Place, text: str, blocks: list[dict[str, Any]] | None) -> MessageRef:
        response = await self._call(place.workspace, lambda client: client.chat_postMessage(
            channel=place.channel,
            thread_ts=place.thread,
            text=text,
            blocks=blocks,
            unfurl_links=False,
            unfurl_media=False,
            link_names=False,
        ))
        return MessageRef(platform=self.platform, workspace=place.workspace, channel=str(response.get("channel") or place.channel),
                          message_id=str(response["ts"]), thread=place.thread)

    async def _post_plain_text(self, place: Place, text: str) -> MessageRef:
        if not text.strip():
            raise MessengerError("no_text")
        pieces = split_text(text, PLAIN_TEXT_LIMIT)
        first = await self._post_message(place, pieces[0], None)
        for piece in pieces[1:]:
            await self._post_message(place, piece, None)
        return first

    async def _update(self, ref: MessageRef, text: str, blocks: list[dict[str, Any]]) -> None:
        await self._call(ref.workspace, lambda client: client.chat_update(channel=ref.channel, ts=ref.message_id, text=text,
                                                                        blocks=blocks))


def _backslash_tail(before: str, added: str) -> str:
    """The trailing backslashes of a stream's text `before` + `added`, without keeping the whole text."""
    kept = added.rstrip("\\")
    return added[len(kept):] if kept else before + added


def _stream_key(ref: MessageRef) -> tuple[str, str]:
    return ref.channel, ref.message_id


def _stream_pieces(text: str, *, after: str) -> list[str]:
    """`text` as `stream_markdown` (following `after`), cut into pieces within `STREAM_TEXT_LIMIT` between the
    renderings of two characters (an escape is never cut in two); one piece at least."""
    pieces = [""]
    for rendered in stream_markdown_characters(text, after=after):
        if len(pieces[-1]) + len(rendered) > STREAM_TEXT_LIMIT:
            pieces.append("")
        pieces[-1] += rendered
    return pieces


def _share_ts(data: dict[str, Any], channel: str) -> str | None:
    """The timestamp of the message that shares the uploaded file in `channel`, if Slack's answer says."""
    files = data.get("files") or ([data["file"]] if data.get("file") else [])
    for file in files:
        shares = file.get("shares") or {}
        for visibility in ("public", "private"):
            for share in (shares.get(visibility) or {}).get(channel) or []:
                if share.get("ts"):
                    return str(share["ts"])
    return None
