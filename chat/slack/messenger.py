"""Posting, editing and uploading to Slack with slack-sdk's AsyncWebClient, riding out rate limits.

Rate limits: the client retries HTTP 429 answers itself (`AsyncRateLimitErrorRetryHandler` sleeps for the
`Retry-After` seconds plus up to one second of jitter before each retry), `RATE_LIMIT_RETRIES` times per call, and
retries dropped connections twice. Server errors (5xx) are not retried here, because a retried `chat.postMessage`
could post twice; they surface as a retryable `MessengerError` for the caller to decide.

Plain-text fallback: when Slack rejects a message's blocks (`invalid_blocks`, `msg_too_long`, …) the message is sent
again as its `text` alone. A post whose text is longer than `PLAIN_TEXT_LIMIT` (Slack advises keeping messages under
4,000 characters and cuts them at 40,000) goes out as several messages in the same place, split at paragraph
boundaries; an edit cannot be split, so an edit whose text exceeds Slack's 40,000 characters fails loudly.

Every post sets `unfurl_links=False`, `unfurl_media=False` and `link_names=False` (so a bare `@here` stays text).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any, TypeVar

import aiohttp
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.http_retry.builtin_async_handlers import AsyncConnectionErrorRetryHandler, AsyncRateLimitErrorRetryHandler
from slack_sdk.web.async_client import AsyncWebClient

from chat.message import Content, FileUpload, MessageRef, MessengerError, OpenedThread, Place, open_thread_under_title
from chat.slack.render import blocks_of
from chat.text import split_text

logger = logging.getLogger(__name__)

SLACK_API_URL = "https://slack.com/api/"
RATE_LIMIT_RETRIES = 8
CONNECTION_RETRIES = 2
REQUEST_TIMEOUT_SECONDS = 30
PLAIN_TEXT_LIMIT = 4_000
SLACK_TEXT_LIMIT = 40_000
RICH_LAYOUT_ERRORS = frozenset({
    "invalid_blocks", "invalid_blocks_format", "msg_too_long", "msg_blocks_too_long", "too_many_blocks",
    "block_mismatch", "invalid_attachments", "markdown_text_conflict",
})
RETRYABLE_ERRORS = frozenset({
    "ratelimited", "rate_limited", "internal_error", "fatal_error", "service_unavailable", "request_timeout",
    "connection_error", "upload_failed",
})

Result = TypeVar("Result")


class PooledWebClient(AsyncWebClient):
    """An AsyncWebClient that keeps its connections open between calls (one aiohttp session per event loop).

    Without a session slack-sdk opens and closes a connection for every call, which a worker
    editing hundreds of status messages pays for in TLS handshakes and event-loop time.
    """

    _session_loop: asyncio.AbstractEventLoop | None = None

    async def _request(self, *, http_verb: str, api_url: str, req_args: dict[str, Any]) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        if self.session is None or self.session.closed or self._session_loop is not loop:
            # A session belongs to the loop it was made in; a client used from a new loop gets a new one.
            self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
            self._session_loop = loop
        return await super()._request(http_verb=http_verb, api_url=api_url, req_args=req_args)


def build_slack_client(token: str, base_url: str = SLACK_API_URL, *, rate_limit_retries: int = RATE_LIMIT_RETRIES,
                       connection_retries: int = CONNECTION_RETRIES,
                       timeout: int = REQUEST_TIMEOUT_SECONDS) -> AsyncWebClient:
    """An AsyncWebClient for `base_url` that retries 429s (honouring Retry-After) and dropped connections, and keeps
    its connections open between calls."""
    return PooledWebClient(
        token=token,
        base_url=base_url,
        timeout=timeout,
        retry_handlers=[
            AsyncConnectionErrorRetryHandler(max_retry_count=connection_retries),
            AsyncRateLimitErrorRetryHandler(max_retry_count=rate_limit_retries),
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


class SlackMessenger:
    """Posts, edits and uploads in Slack threads; falls back to plain text when Slack rejects the blocks."""

    platform = "slack"

    def __init__(self, client: AsyncWebClient) -> None:
        self.client = client

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

    async def edit(self, ref: MessageRef, content: Content) -> None:
        """Replace the message at `ref` with `content`; raises MessengerError when Slack refuses even plain text."""
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

    async def upload(self, place: Place, upload: FileUpload) -> MessageRef | None:
        """Attach a file in `place` (Slack's two-step upload); the file's message when Slack reports where it is shared."""
        response = await _guarded(self.client.files_upload_v2(
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
        response = await _guarded(self.client.chat_postMessage(
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
        await _guarded(self.client.chat_update(channel=ref.channel, ts=ref.message_id, text=text, blocks=blocks))


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
