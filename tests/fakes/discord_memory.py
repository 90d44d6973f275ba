"""Discord's message, edit and thread routes in memory, served through httpx.MockTransport, with a fake clock for
its rate limits: enough of Discord's REST API for the messenger, without a socket."""

from __future__ import annotations

import email.parser
import itertools
import json
import re
from dataclasses import dataclass, field
from typing import Any

import httpx

from chat.message import Place
from tests.fakes.clock import FakeClock

TOKEN = "MTE5.fake-bot-token.do-not-leak"
API_URL = "https://discord.test/api/v10"
GUILD = "111111111111111111"
CHANNEL = "222222222222222222"
OTHER_CHANNEL = "333333333333333333"
DM_CHANNEL = "444444444444444444"
MESSAGES_PATH = re.compile(r"^/api/v10/channels/(\d+)/messages$")
MESSAGE_PATH = re.compile(r"^/api/v10/channels/(\d+)/messages/(\d+)$")
THREADS_PATH = re.compile(r"^/api/v10/channels/(\d+)/messages/(\d+)/threads$")



@dataclass
class Call:
    """One request as the fake saw it, and what it answered."""

    method: str
    path: str
    at: float
    headers: httpx.Headers
    body: dict[str, Any]
    files: dict[str, tuple[str, bytes, str]]
    status: int = 0


@dataclass
class Scripted:
    """An answer given instead of (or, with `handled`, after doing) what Discord would do."""

    method: str
    path_suffix: str = ""
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    handled: bool = False
    error: Exception | None = None


class InMemoryDiscord:
    """Discord's message, edit and thread routes in memory, with its nonce, error and rate-limit answers."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.calls: list[Call] = []
        self.messages: dict[str, dict[str, Any]] = {}
        self.threads: dict[str, dict[str, Any]] = {}
        self.edits: list[tuple[str, str]] = []
        self._message_by_nonce: dict[str, str] = {}
        self._scripted: list[Scripted] = []
        self._ids = itertools.count(900_000_000_000_000_001)

    def answer_next(self, method: str, *, path_suffix: str = "", status: int = 200, body: Any = None,
                    headers: dict[str, str] | None = None, times: int = 1, handled: bool = False,
                    error: Exception | None = None) -> None:
        """The next `times` calls with `method` (to a path ending in `path_suffix`) get this answer; `handled` does
        the real work first, so the answer is a lost one."""
        for _ in range(times):
            self._scripted.append(Scripted(method, path_suffix, status, body, headers or {}, handled, error))

    def rate_limit_next(self, method: str, retry_after: float, *, times: int = 1, is_global: bool = False) -> None:
        body = {"message": "You are being rate limited.", "retry_after": retry_after, "global": is_global}
        self.answer_next(method, status=429, body=body, times=times,
                         headers={"X-RateLimit-Global": "true"} if is_global else {})

    def client(self) -> httpx.AsyncClient:
        """An httpx client that reaches this fake as the bot would reach Discord (its token, under API_URL)."""
        return httpx.AsyncClient(base_url=API_URL, transport=httpx.MockTransport(self.handler),
                                 headers={"Authorization": f"Bot {TOKEN}"})

    def channel_messages(self, channel: str) -> list[dict[str, Any]]:
        return [message for message in self.messages.values() if message["channel_id"] == channel]

    def handler(self, request: httpx.Request) -> httpx.Response:
        body, files = _parse_body(request)
        call = Call(request.method, request.url.path, self.clock.now, request.headers, body, files)
        self.calls.append(call)
        scripted = next((answer for answer in self._scripted
                         if answer.method == request.method and request.url.path.endswith(answer.path_suffix)), None)
        if scripted is not None:
            self._scripted.remove(scripted)
            if scripted.handled:
                self._route(request.method, request.url.path, body)
            if scripted.error is not None:
                raise scripted.error
            call.status = scripted.status
            return httpx.Response(scripted.status, json=scripted.body, headers=scripted.headers)
        if request.headers.get("Authorization") != f"Bot {TOKEN}":
            call.status = 401
            return httpx.Response(401, json={"message": "401: Unauthorized", "code": 0})
        status, answer = self._route(request.method, request.url.path, body)
        call.status = status
        headers = {"X-RateLimit-Bucket": f"hash-{request.method}-{len(request.url.path.split('/'))}",
                   "X-RateLimit-Limit": "5", "X-RateLimit-Remaining": "4", "X-RateLimit-Reset-After": "5.0"}
        return httpx.Response(status, json=answer, headers=headers)

    def _route(self, method: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if method == "POST" and (match := MESSAGES_PATH.match(path)):
            nonce = body.get("nonce")
            if body.get("enforce_nonce") and nonce in self._message_by_nonce:
                return 200, self.messages[self._message_by_nonce[nonce]]
            message = {"id": str(next(self._ids)), "channel_id": match.group(1), **body}
            self.messages[message["id"]] = message
            if nonce is not None:
                self._message_by_nonce[nonce] = message["id"]
            return 200, message
        if method == "PATCH" and (match := MESSAGE_PATH.match(path)):
            message = self.messages.get(match.group(2))
            if message is None or message["channel_id"] != match.group(1):
                return 404, {"message": "Unknown Message", "code": 10008}
            message.update(body)
            self.edits.append((message["id"], body["content"]))
            return 200, message
        if method == "POST" and (match := THREADS_PATH.match(path)):
            channel, message_id = match.groups()
            if message_id in self.threads:
                return 400, {"message": "A thread has already been created for this message", "code": 160004}
            # A thread started from a message has the message's id.
            self.threads[message_id] = {"id": message_id, "type": 11, "parent_id": channel, **body}
            return 201, self.threads[message_id]
        return 404, {"message": "404: Not Found", "code": 0}


def _parse_body(request: httpx.Request) -> tuple[dict[str, Any], dict[str, tuple[str, bytes, str]]]:
    """The JSON body of a request, or the `payload_json` and files of a multipart one."""
    content = request.read()
    content_type = request.headers.get("Content-Type", "")
    if not content:
        return {}, {}
    if not content_type.startswith("multipart/form-data"):
        return json.loads(content), {}
    parsed = email.parser.BytesParser().parsebytes(b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + content)
    body: dict[str, Any] = {}
    files: dict[str, tuple[str, bytes, str]] = {}
    for part in parsed.get_payload():
        name = part.get_param("name", header="content-disposition")
        data = part.get_payload(decode=True)
        if part.get_filename():
            files[name] = (part.get_filename(), data, part.get_content_type())
        elif name == "payload_json":
            body = json.loads(data)
    return body, files


def channel_place(thread: str | None = None, channel: str = CHANNEL) -> Place:
    """A place in the fake's guild: `channel`, or a thread in it."""
    return Place(platform="discord", workspace=GUILD, channel=channel, thread=thread)
