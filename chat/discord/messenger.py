"""Posting, editing, uploading and opening threads on Discord over REST (API v10) with the bot token.

Rate limits, as Discord describes them (developers/docs/topics/rate-limits): every answer names its bucket
(`X-RateLimit-Bucket`) and says how many calls are left in it (`X-RateLimit-Remaining`) and when it refills
(`X-RateLimit-Reset-After`, seconds). A bucket is shared per major parameter, here the channel id, so the limiter key
is the bucket's hash plus the channel; the hash is learnt per route (method and path with the channel kept and
message ids as `{id}`). When a bucket is empty the next call on it sleeps until it refills instead of spending a 429
(Discord bans clients that collect too many 401/403/429 answers). A 429 is waited out for its `retry_after` (the
JSON body's float seconds, else the `Retry-After` header) and the call tried again, up to `max_attempts` in all; a
global 429 holds back every route for that long. A 429 asking for more than `LONGEST_WAIT_SECONDS` is not waited
out: it surfaces at once as a retryable MessengerError for the caller to schedule.

Server errors (5xx) and dropped connections are retried with an exponential backoff (0.5, 1, 2 s, … up to 8 s).
That is safe for posts because every post carries a `nonce` with `enforce_nonce`, the same on every retry, so
Discord answers a repeated post with the message it already made; edits are idempotent; a thread that was made
by an attempt whose answer got lost is recognised by its error code (its id is the starter message's id).
Any other 4xx is final: a non-retryable MessengerError whose reason is Discord's "code: message".

Every message sends `allowed_mentions` (the renderer's, else none at all, so nothing can ping @everyone, a role
or a user by accident) and, unless the renderer set flags, SUPPRESS_EMBEDS (no link previews). A post whose text
is over Discord's 2,000 characters goes out as several messages; an edit cannot be split, so it fails.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from chat.message import (
    Content,
    FileUpload,
    MessageRef,
    MessengerError,
    OpenedThread,
    Place,
    RateLimitWaitCounter,
    uncounted_wait,
)
from chat.text import shortened, single_line, split_text

logger = logging.getLogger(__name__)

DISCORD_API_URL = "https://discord.com/api/v10"
USER_AGENT = "DiscordBot (https://github.com/deepthread, 0.1)"
# The workspace of a direct message: Discord's own name for "not in a guild" (`/users/@me/channels`).
DIRECT_MESSAGES = "@me"
TEXT_LIMIT = 2_000
THREAD_NAME_LIMIT = 100
THREAD_AUTO_ARCHIVE_MINUTES = 1_440
SUPPRESS_EMBEDS = 1 << 2
NO_MENTIONS: dict[str, Any] = {"parse": []}
# With `allowed_mentions` and `flags`, the keys of `Content.extra["discord"]` that are sent; any other key is not.
RICH_KEYS = ("components", "embeds")
DEFAULT_MAX_ATTEMPTS = 6
FIRST_BACKOFF_SECONDS = 0.5
LONGEST_BACKOFF_SECONDS = 8.0
# A 429 without `retry_after` or `Retry-After` (a proxy's, not Discord's) is waited out this long.
UNKNOWN_RETRY_AFTER_SECONDS = 1.0
LONGEST_WAIT_SECONDS = 120.0
ALREADY_HAS_THREAD = 160004
REQUEST_TIMEOUT = httpx.Timeout(30.0, connect=10.0)

Sleep = Callable[[float], Awaitable[None]]
Clock = Callable[[], float]


def build_discord_http(token: str, api_url: str = DISCORD_API_URL) -> httpx.AsyncClient:
    """An httpx client for Discord's REST API at `api_url`, signed in with the bot `token`."""
    return httpx.AsyncClient(
        base_url=str(api_url).rstrip("/"),
        headers={"Authorization": f"Bot {token}", "User-Agent": USER_AGENT},
        timeout=REQUEST_TIMEOUT,
    )


class DiscordError(MessengerError):
    """Discord refused a call; `status` is the HTTP status and `code` Discord's JSON error code, where there is one."""

    def __init__(self, reason: str, *, retryable: bool = False, status: int | None = None,
                 code: int | None = None) -> None:
        super().__init__(reason, retryable=retryable)
        self.status = status
        self.code = code


@dataclass(frozen=True)
class Route:
    """One REST endpoint under a channel: `template` names `{channel}` and, where there is one, `{message}`."""

    method: str
    template: str
    channel: str
    message: str | None = None

    @property
    def path(self) -> str:
        return self.template.format(channel=self.channel, message=self.message)

    @property
    def key(self) -> str:
        """The route as Discord buckets it: the channel (the major parameter) kept, message ids hidden."""
        return f"{self.method} " + self.template.format(channel=self.channel, message="{id}")


MESSAGES = "/channels/{channel}/messages"
MESSAGE = "/channels/{channel}/messages/{message}"
THREAD_FROM_MESSAGE = "/channels/{channel}/messages/{message}/threads"
OPEN_DIRECT_MESSAGES = "/users/@me/channels"  # `channel` unused: the bucket is the bot's own
DIRECT_CHANNELS_KEPT = 1_000


def new_nonce() -> str:
    """A fresh 19-digit nonce (Discord takes up to 25 characters) that makes retries of one post idempotent."""
    return str(10**18 + secrets.randbelow(9 * 10**18))


def discord_extra(content: Content) -> dict[str, Any]:
    """The renderer's Discord payload for `content` (`Content.extra["discord"]`), empty when there is none."""
    extra = content.extra.get("discord")
    return extra if isinstance(extra, dict) else {}


def message_payload(text: str, extra: dict[str, Any], *, rich: bool, clear_missing: bool = False) -> dict[str, Any]:
    """A message body: the text, allowed mentions and flags always; components and embeds when `rich`.

    `clear_missing` sends an empty list for rich keys the renderer left out (an edit must drop old buttons).
    """
    allowed_mentions = extra.get("allowed_mentions")
    payload: dict[str, Any] = {
        "content": text,
        "allowed_mentions": allowed_mentions if allowed_mentions is not None else NO_MENTIONS,
        "flags": extra["flags"] if extra.get("flags") is not None else SUPPRESS_EMBEDS,
    }
    if rich:
        for key in RICH_KEYS:
            if extra.get(key) is not None:
                payload[key] = extra[key]
            elif clear_missing:
                payload[key] = []
    return payload


def thread_name(title: Content) -> str:
    """The thread's name: the title on one line, within Discord's 100 characters."""
    return shortened(single_line(title.text), THREAD_NAME_LIMIT) or "Research"


def media_type(filename: str) -> str:
    return "text/markdown" if filename.lower().endswith(".md") else "application/octet-stream"


def _error_reason(response: httpx.Response) -> tuple[str, int | None]:
    """Discord's "code: message" for a refused call (`http_<status>` when the answer is not Discord's JSON)."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and "code" in body and body.get("message"):
        code = body["code"]
        return f"{code}: {body['message']}", code if isinstance(code, int) else None
    return f"http_{response.status_code}", None


def _retry_after(response: httpx.Response) -> tuple[float, bool]:
    """How long a 429 asks to wait, in seconds, and whether the limit is global."""
    try:
        body = response.json()
    except ValueError:
        body = None
    body = body if isinstance(body, dict) else {}
    is_global = bool(body.get("global")) or response.headers.get("X-RateLimit-Global", "").lower() == "true"
    for value in (body.get("retry_after"), response.headers.get("Retry-After")):
        if value is None:
            continue
        try:
            return max(0.0, float(value)), is_global
        except (TypeError, ValueError):
            continue
    return UNKNOWN_RETRY_AFTER_SECONDS, is_global


def _backoff(failures: int) -> float:
    return min(LONGEST_BACKOFF_SECONDS, FIRST_BACKOFF_SECONDS * 2 ** (failures - 1))


class DiscordMessenger:
    """Posts, edits and uploads in Discord channels and threads over REST; waits out Discord's rate limits."""

    platform = "discord"

    def __init__(self, http: httpx.AsyncClient, *, max_attempts: int = DEFAULT_MAX_ATTEMPTS, sleep: Sleep = asyncio.sleep,
                 clock: Clock = time.monotonic,
                 count_rate_limit_wait: RateLimitWaitCounter = uncounted_wait) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.http = http
        self.count_rate_limit_wait = count_rate_limit_wait
        self.max_attempts = max_attempts
        self.sleep = sleep
        self.clock = clock
        self._bucket_of_route: dict[str, str] = {}
        self._empty_until: dict[str, float] = {}
        self._global_until = 0.0
        # Each person's direct-message channel once opened (Discord answers the same one every time), the latest kept.
        self._direct_channels: dict[str, str] = {}

    async def direct(self, workspace: str, user: str, content: Content) -> MessageRef:
        """`content` in the bot's direct messages with `user` (opened with `POST /users/@me/channels`); Discord
        refuses (50007) a person who accepts no direct messages from the server's members."""
        channel = self._direct_channels.pop(user, None)
        if channel is None:
            opened = await self._request(Route("POST", OPEN_DIRECT_MESSAGES, DIRECT_MESSAGES),
                                         json={"recipient_id": user})
            channel = str(opened["id"])
        self._direct_channels[user] = channel  # the most recent last
        while len(self._direct_channels) > DIRECT_CHANNELS_KEPT:
            del self._direct_channels[next(iter(self._direct_channels))]
        return await self.post(Place(platform=self.platform, workspace=DIRECT_MESSAGES, channel=channel), content)

    async def post(self, place: Place, content: Content) -> MessageRef:
        """Post `content` in `place` (its thread if set); text over 2,000 characters goes as several messages, the
        first of which is returned. Raises MessengerError when Discord refuses."""
        channel = place.thread or place.channel
        extra = discord_extra(content)
        pieces = split_text(content.text, TEXT_LIMIT) if len(content.text) > TEXT_LIMIT else [content.text]
        first: MessageRef | None = None
        for index, piece in enumerate(pieces):
            # Buttons and embeds belong under the whole text, so only the last piece carries them.
            payload = message_payload(piece, extra, rich=index == len(pieces) - 1)
            message = await self._create_message(channel, json_body=payload)
            if first is None:
                first = MessageRef(platform=self.platform, workspace=place.workspace, channel=channel,
                                   message_id=str(message["id"]), thread=place.thread)
        assert first is not None
        return first

    async def edit(self, ref: MessageRef, content: Content) -> None:
        """Replace the message at `ref` with `content` (buttons and embeds it lacks are removed); raises
        MessengerError("content_too_long") for text over 2,000 characters, or when Discord refuses."""
        if len(content.text) > TEXT_LIMIT:
            raise DiscordError("content_too_long")
        payload = message_payload(content.text, discord_extra(content), rich=True, clear_missing=True)
        await self._request(Route("PATCH", MESSAGE, ref.channel, ref.message_id), json=payload)

    async def upload(self, place: Place, upload: FileUpload) -> MessageRef:
        """Attach a file in `place` as a message of its own, with the upload's comment; raises MessengerError."""
        channel = place.thread or place.channel
        attachment: dict[str, Any] = {"id": 0, "filename": upload.filename}
        if upload.title:
            attachment["title"] = upload.title
        payload = message_payload(shortened(upload.comment or "", TEXT_LIMIT), {}, rich=False)
        payload["attachments"] = [attachment]
        files = {"files[0]": (upload.filename, upload.data, media_type(upload.filename))}
        message = await self._create_message(channel, json_body=payload, files=files)
        return MessageRef(platform=self.platform, workspace=place.workspace, channel=channel,
                          message_id=str(message["id"]), thread=place.thread)

    async def open_thread(self, place: Place, *, title: Content, status: Content) -> OpenedThread:
        """Post `status` in the channel and start a thread named after `title` from it (in a direct message, where
        there are no threads, the channel is the thread); raises MessengerError."""
        top_level = place.model_copy(update={"thread": None})
        status_ref = await self.post(top_level, status)
        if place.workspace == DIRECT_MESSAGES:
            return OpenedThread(thread=place.channel, status=status_ref.model_copy(update={"thread": place.channel}))
        route = Route("POST", THREAD_FROM_MESSAGE, place.channel, status_ref.message_id)
        body = {"name": thread_name(title), "auto_archive_duration": THREAD_AUTO_ARCHIVE_MINUTES}
        try:
            thread_id = str((await self._request(route, json=body))["id"])
        except DiscordError as error:
            if error.code != ALREADY_HAS_THREAD:
                raise
            # An earlier attempt made the thread but its answer was lost; a message's thread has the message's id.
            thread_id = status_ref.message_id
        return OpenedThread(thread=thread_id, status=status_ref.model_copy(update={"thread": thread_id}))

    async def _create_message(self, channel: str, *, json_body: dict[str, Any],
                              files: dict[str, tuple[str, bytes, str]] | None = None) -> dict[str, Any]:
        """POST a new message; one nonce for all attempts, so a retry after a lost answer cannot post it twice."""
        body = {**json_body, "nonce": new_nonce(), "enforce_nonce": True}
        route = Route("POST", MESSAGES, channel)
        if files is None:
            return await self._request(route, json=body)
        return await self._request(route, data={"payload_json": json.dumps(body)}, files=files)

    async def _request(self, route: Route, **request: Any) -> dict[str, Any]:
        """Discord's JSON answer to `route`, after waiting out rate limits and retrying 5xx and dropped connections."""
        failure: DiscordError | None = None
        backoffs = 0
        for attempt in range(1, self.max_attempts + 1):
            await self._wait_for_bucket(route)
            try:
                response = await self.http.request(route.method, route.path, **request)
            except httpx.TransportError as error:
                failure = DiscordError("timeout" if isinstance(error, httpx.TimeoutException) else "connection_error",
                                       retryable=True)
                logger.warning("discord %s failed (%s, attempt %d of %d)", route.key, type(error).__name__, attempt,
                               self.max_attempts)
            else:
                self._remember_bucket(route, response)
                if response.status_code == 429:
                    failure = DiscordError("rate_limited", retryable=True, status=429)
                    wait, is_global = _retry_after(response)
                    scope = "global rate limit" if is_global else "rate limit"
                    if wait > LONGEST_WAIT_SECONDS:
                        logger.warning("discord %s on %s asks for %.2f s: not waiting", scope, route.key, wait)
                        raise failure
                    logger.warning("discord %s on %s: waiting %.2f s (attempt %d of %d)", scope, route.key, wait,
                                   attempt, self.max_attempts)
                    self._hold(route, wait, is_global)
                    continue
                if response.status_code >= 500:
                    failure = DiscordError(f"http_{response.status_code}", retryable=True, status=response.status_code)
                    logger.warning("discord %s answered HTTP %d (attempt %d of %d)", route.key, response.status_code,
                                   attempt, self.max_attempts)
                elif response.status_code >= 400:
                    reason, code = _error_reason(response)
                    raise DiscordError(reason, status=response.status_code, code=code)
                else:
                    return response.json()
            if attempt < self.max_attempts:
                backoffs += 1
                await self.sleep(_backoff(backoffs))
        assert failure is not None
        raise failure

    def _limiter_key(self, route: Route) -> str:
        bucket = self._bucket_of_route.get(route.key)
        return f"{bucket}:{route.channel}" if bucket else route.key

    async def _wait_for_bucket(self, route: Route) -> None:
        key = self._limiter_key(route)
        waited = 0.0
        while (wait := max(self._global_until, self._empty_until.get(key, 0.0)) - self.clock()) > 0:
            await self.sleep(wait)
            waited += wait
        if waited:
            self.count_rate_limit_wait(self.platform, waited)
        self._empty_until.pop(key, None)

    def _remember_bucket(self, route: Route, response: httpx.Response) -> None:
        """Learn the route's bucket and, when the answer says it is empty, until when."""
        bucket = response.headers.get("X-RateLimit-Bucket")
        if bucket:
            self._bucket_of_route[route.key] = bucket
        if response.headers.get("X-RateLimit-Remaining") == "0":
            try:
                reset_after = float(response.headers.get("X-RateLimit-Reset-After", ""))
            except ValueError:
                return
            self._hold(route, reset_after, is_global=False)

    def _hold(self, route: Route, seconds: float, is_global: bool) -> None:
        until = self.clock() + seconds
        if is_global:
            self._global_until = max(self._global_until, until)
        else:
            key = self._limiter_key(route)
            self._empty_until[key] = max(self._empty_until.get(key, 0.0), until)
