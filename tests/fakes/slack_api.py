"""A fake Slack Web API on 127.0.0.1 that answers like Slack, so slack-sdk and slack-bolt run unchanged against it.

It serves `{url}/api/<method>` (configure `api_url`, which ends with `/`, as `SLACK_API_URL`) and the upload URLs it
hands out, keeps channels, threads, edits, files and reactions in memory in the test process, and records every
call. Because it is a real loopback server, Celery workers in other processes can talk to it too:

    slack = FakeSlack().start()
    client = build_slack_client(slack.token, slack.api_url)
    slack.fail_next("chat.postMessage", status=429, headers={"Retry-After": "2"}, times=3)
    slack.error_next("chat.postMessage", "invalid_blocks")
    slack.start_outage(); slack.end_outage()                # HTTP 500 to posts, edits and uploads until ended
    slack.messages("C1", thread_ts="1700000001.000100")   # SlackMessage list
    slack.edits("C1", ts)                                 # SlackEdit list, with times
    slack.calls("chat.update")                            # SlackCall list: method, params, time
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from tests.fakes.server import LoopbackFake, LoopbackServer, RecordedRequest, RequestLog

FAKE_TOKEN = "xoxb-fake-token"
SECTION_TEXT_LIMIT = 3_000
MARKDOWN_BLOCKS_LIMIT = 12_000
BLOCKS_PER_MESSAGE = 50
TEXT_LIMIT = 40_000
KNOWN_BLOCK_TYPES = frozenset({"section", "context", "markdown", "header", "divider", "rich_text", "actions", "image",
                               "input", "file", "video"})
MESSAGE_METHODS = frozenset({"chat.postMessage", "chat.update", "chat.postEphemeral"})
UPLOAD_METHOD = "upload"
# What a platform outage at delivery time breaks: posting, editing and the three steps of an upload.
OUTAGE_METHODS = ("chat.postMessage", "chat.update", "files.getUploadURLExternal", UPLOAD_METHOD,
                  "files.completeUploadExternal")
FIRST_TS_SECONDS = 1_700_000_000


@dataclass
class SlackCall:
    """One call as the fake saw it: the Web API method (or `upload`), its merged parameters, when, and the answer."""

    method: str
    params: dict[str, Any]
    at: float
    wall_time: float
    status: int = 200
    error: str | None = None


@dataclass
class SlackEdit:
    """One `chat.update` of a message: what it said afterwards, and when."""

    at: float
    text: str
    blocks: list[dict[str, Any]] | None


@dataclass
class SlackFile:
    """A file uploaded through `files.getUploadURLExternal`, the upload URL and `files.completeUploadExternal`."""

    id: str
    filename: str
    length: int
    title: str | None = None
    data: bytes | None = None
    channel: str | None = None
    thread_ts: str | None = None
    initial_comment: str | None = None
    completed: bool = False

    def as_api(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.filename, "title": self.title or self.filename, "size": len(self.data or b""),
                "mimetype": "text/plain", "filetype": self.filename.rsplit(".", 1)[-1] if "." in self.filename else "text"}


@dataclass
class SlackMessage:
    """A message in a channel as Slack stores it: text, blocks, thread, files, reactions and edit history."""

    channel: str
    ts: str
    text: str
    blocks: list[dict[str, Any]] | None
    thread_ts: str | None
    user: str
    bot_id: str | None
    params: dict[str, Any]
    posted_at: float
    files: list[SlackFile] = field(default_factory=list)
    edits: list[SlackEdit] = field(default_factory=list)
    reactions: dict[str, list[str]] = field(default_factory=dict)
    deleted: bool = False

    @property
    def visible_text(self) -> str:
        """The text a reader sees: every block's text when there are blocks, else the `text` field."""
        if not self.blocks:
            return self.text
        return "\n\n".join(text for block in self.blocks for text in block_texts(block))

    def as_api(self) -> dict[str, Any]:
        message: dict[str, Any] = {"type": "message", "ts": self.ts, "text": self.text, "user": self.user}
        if self.bot_id:
            message["bot_id"] = self.bot_id
        if self.blocks:
            message["blocks"] = self.blocks
        if self.thread_ts:
            message["thread_ts"] = self.thread_ts
        if self.files:
            message["files"] = [file.as_api() for file in self.files]
        if self.edits:
            message["edited"] = {"user": self.user, "ts": self.edits[-1].at}
        if self.reactions:
            message["reactions"] = [{"name": name, "users": users, "count": len(users)} for name, users in self.reactions.items()]
        return message


@dataclass
class ScriptedFailure:
    """An answer served instead of the real one, `times` times: an HTTP status with headers, or an `ok: false` error."""

    status: int = 200
    error: str = "ratelimited"
    headers: dict[str, str] = field(default_factory=dict)
    times: int = 1
    when: Callable[[dict[str, Any]], bool] | None = None


@dataclass
class HeldCall:
    """One call kept unanswered (and not yet applied) until the test sets `release`; `arrived` is set when it comes."""

    method: str
    when: Callable[[dict[str, Any]], bool]
    arrived: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    max_hold_seconds: float = 120.0


def block_texts(block: dict[str, Any]) -> list[str]:
    """The texts inside one Block Kit block (section text and fields, context elements, markdown, header)."""
    texts: list[str] = []
    text = block.get("text")
    if isinstance(text, dict):
        texts.append(str(text.get("text", "")))
    elif isinstance(text, str):
        texts.append(text)
    for item in block.get("fields") or []:
        texts.append(str(item.get("text", "")))
    for element in block.get("elements") or []:
        if isinstance(element, dict) and "text" in element:
            texts.append(str(element["text"]) if not isinstance(element["text"], dict) else str(element["text"].get("text", "")))
    return texts


def blocks_error(blocks: Any) -> str | None:
    """The error Slack answers for `blocks` (None when they are acceptable)."""
    if not isinstance(blocks, list) or not all(isinstance(block, dict) for block in blocks):
        return "invalid_blocks_format"
    if len(blocks) > BLOCKS_PER_MESSAGE:
        return "invalid_blocks"
    markdown_characters = 0
    for block in blocks:
        kind = block.get("type")
        if kind not in KNOWN_BLOCK_TYPES:
            return "invalid_blocks"
        if kind == "section":
            text = block.get("text")
            if text is None and not block.get("fields"):
                return "invalid_blocks"
            if isinstance(text, dict) and not 1 <= len(str(text.get("text", ""))) <= SECTION_TEXT_LIMIT:
                return "invalid_blocks"
        if kind == "markdown":
            if not isinstance(block.get("text"), str):
                return "invalid_blocks"
            markdown_characters += len(block["text"])
        if kind == "context" and not 1 <= len(block.get("elements") or []) <= 10:
            return "invalid_blocks"
    if markdown_characters > MARKDOWN_BLOCKS_LIMIT:
        return "invalid_blocks"
    return None


JSON_PARAMETERS = frozenset({"blocks", "attachments", "files", "metadata"})


def _decoded(key: str, value: Any) -> Any:
    """Form values that Slack clients send as JSON strings (blocks, files, attachments) as Python values."""
    if key in JSON_PARAMETERS and isinstance(value, str) and value[:1] in "[{":
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


class FakeSlack(LoopbackFake):
    """The Slack Web API methods a bot uses, answering in Slack's shapes, with scripted rate limits and errors."""

    def __init__(self, *, token: str = FAKE_TOKEN, team_id: str = "T0FAKE", bot_user_id: str = "U0BOT",
                 bot_id: str = "B0BOT", require_join: bool = False, validate_blocks: bool = True) -> None:
        self.token = token
        self.team_id = team_id
        self.bot_user_id = bot_user_id
        self.bot_id = bot_id
        self.require_join = require_join
        self.validate_blocks = validate_blocks
        self.users: dict[str, dict[str, Any]] = {}
        self.requests = RequestLog()
        self._lock = threading.RLock()
        self._calls: list[SlackCall] = []
        self._channels: dict[str, list[SlackMessage]] = {}
        self._ephemeral: list[dict[str, Any]] = []
        self._joined: set[str] = set()
        self._files: dict[str, SlackFile] = {}
        self._scripts: dict[str, list[ScriptedFailure]] = {}
        self._outages: list[tuple[str, ScriptedFailure]] = []
        self._holds: list[HeldCall] = []
        self._ts_counter = itertools.count(1)
        self._file_counter = itertools.count(1)
        self._server: LoopbackServer | None = None
        self._handlers: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
            "auth.test": self._auth_test,
            "chat.postMessage": self._post_message,
            "chat.update": self._update,
            "chat.postEphemeral": self._post_ephemeral,
            "chat.delete": self._delete,
            "chat.getPermalink": self._permalink,
            "conversations.join": self._join,
            "conversations.info": self._conversation_info,
            "conversations.replies": self._replies,
            "users.info": self._user_info,
            "files.getUploadURLExternal": self._upload_url,
            "files.completeUploadExternal": self._complete_upload,
            "reactions.add": self._add_reaction,
        }
        self.app = Starlette(routes=[
            Route("/api/{method}", self._api, methods=["GET", "POST"]),
            Route("/upload/v1/{file_id}", self._upload, methods=["POST"]),
        ])

    # --- lifecycle -------------------------------------------------------------------------------


    @property
    def api_url(self) -> str:
        """The base URL to configure as SLACK_API_URL (ends with `/`)."""
        return f"{self.url}/api/"

    # --- scripting -------------------------------------------------------------------------------

    def fail_next(self, method: str, status: int = 429, headers: dict[str, str] | None = None, times: int = 1,
                  error: str | None = None) -> None:
        """Answer the next `times` calls of `method` with HTTP `status` (429: `ratelimited` with a Retry-After)."""
        if headers is None:
            headers = {"Retry-After": "1"} if status == 429 else {}
        code = error or ("ratelimited" if status == 429 else "internal_error")
        with self._lock:
            self._scripts.setdefault(method, []).append(ScriptedFailure(status=status, error=code, headers=headers, times=times))

    def error_next(self, method: str, error: str, times: int = 1,
                   when: Callable[[dict[str, Any]], bool] | None = None) -> None:
        """Answer the next `times` calls of `method` (those matching `when`, if given) with `ok: false, error`."""
        with self._lock:
            self._scripts.setdefault(method, []).append(ScriptedFailure(status=200, error=error, times=times, when=when))

    def start_outage(self, methods: Collection[str] = OUTAGE_METHODS, *, status: int = 500,
                     when: Callable[[dict[str, Any]], bool] | None = None) -> None:
        """Answer every call of `methods` (those matching `when`, if given) with HTTP `status`, unapplied, until `end_outage`."""
        with self._lock:
            for method in methods:
                outage = ScriptedFailure(status=status, error="internal_error", times=sys.maxsize, when=when)
                self._outages.append((method, outage))
                self._scripts.setdefault(method, []).append(outage)

    def end_outage(self) -> None:
        """Answer normally again (scripts added with `fail_next` or `error_next` stay)."""
        with self._lock:
            for method, outage in self._outages:
                self._scripts[method] = [script for script in self._scripts.get(method, []) if script is not outage]
            self._outages.clear()

    def hold_next(self, method: str, when: Callable[[dict[str, Any]], bool]) -> HeldCall:
        """Keep the next call of `method` matching `when` waiting, unapplied, until `release` (a caller to kill meanwhile)."""
        held = HeldCall(method=method, when=when)
        with self._lock:
            self._holds.append(held)
        return held

    async def _hold_if_asked(self, method: str, params: dict[str, Any]) -> None:
        with self._lock:
            candidates = [held for held in self._holds if held.method == method]
        held = next((held for held in candidates if held.when(params)), None)
        if held is None:
            return
        with self._lock:
            if held not in self._holds:
                return
            self._holds.remove(held)
        held.arrived.set()
        await asyncio.to_thread(held.release.wait, held.max_hold_seconds)

    def add_user(self, user_id: str, name: str, **fields: Any) -> None:
        """A user that `users.info` knows by this name (others get a made-up profile)."""
        self.users[user_id] = {"id": user_id, "name": name, "real_name": name, **fields}

    # --- reading what happened -------------------------------------------------------------------

    def calls(self, method: str | None = None) -> list[SlackCall]:
        """Every call received (of `method`, if given), in order."""
        with self._lock:
            return [call for call in self._calls if method is None or call.method == method]

    def messages(self, channel: str, thread_ts: str | None = None) -> list[SlackMessage]:
        """Messages not deleted: the whole channel in posting order, or one thread (its parent first) when `thread_ts`."""
        with self._lock:
            stored = [message for message in self._channels.get(channel, []) if not message.deleted]
        if thread_ts is None:
            return stored
        return [message for message in stored if message.ts == thread_ts or message.thread_ts == thread_ts]

    def message(self, channel: str, ts: str) -> SlackMessage:
        """The message at `ts`; raises KeyError if there is none."""
        with self._lock:
            for message in self._channels.get(channel, []):
                if message.ts == ts:
                    return message
        raise KeyError(f"no message {ts} in {channel}")

    def edits(self, channel: str, ts: str) -> list[SlackEdit]:
        """The `chat.update` history of one message, oldest first."""
        with self._lock:
            return list(self.message(channel, ts).edits)

    def files(self, channel: str | None = None) -> list[SlackFile]:
        """Completed uploads (to `channel`, if given)."""
        with self._lock:
            return [file for file in self._files.values() if file.completed and (channel is None or file.channel == channel)]

    def ephemeral_messages(self) -> list[dict[str, Any]]:
        """Messages sent with `chat.postEphemeral`."""
        with self._lock:
            return list(self._ephemeral)

    def joined_channels(self) -> set[str]:
        with self._lock:
            return set(self._joined)

    # --- HTTP ------------------------------------------------------------------------------------

    async def _record_request(self, request: Request) -> bytes:
        body = await request.body()
        self.requests.add(RecordedRequest(method=request.method, host=request.headers.get("host", ""), path=request.url.path,
                                          query=dict(request.query_params), headers=dict(request.headers), body=body))
        return body

    @staticmethod
    async def _params(request: Request, body: bytes) -> dict[str, Any]:
        params: dict[str, Any] = dict(request.query_params)
        content_type = request.headers.get("content-type", "")
        if content_type.startswith("application/json") and body:
            params.update(json.loads(body))
        elif content_type.startswith("application/x-www-form-urlencoded"):
            params.update(parse_qsl(body.decode("utf-8"), keep_blank_values=True))
        elif content_type.startswith("multipart/form-data"):
            form = await request.form()
            params.update({key: value for key, value in form.items() if isinstance(value, str)})
        return {key: _decoded(key, value) for key, value in params.items()}

    def _token_error(self, request: Request, params: dict[str, Any]) -> str | None:
        authorization = request.headers.get("authorization", "")
        token = authorization.removeprefix("Bearer ").strip() if authorization.startswith("Bearer ") else params.pop("token", None)
        params.pop("token", None)
        if not token:
            return "not_authed"
        return None if token == self.token else "invalid_auth"

    def _scripted(self, method: str, params: dict[str, Any]) -> ScriptedFailure | None:
        with self._lock:
            queue = self._scripts.get(method, [])
            for script in queue:
                if script.when is not None and not script.when(params):
                    continue
                script.times -= 1
                if script.times <= 0:
                    queue.remove(script)
                return script
        return None

    def _record(self, method: str, params: dict[str, Any], status: int, error: str | None) -> None:
        with self._lock:
            self._calls.append(SlackCall(method=method, params=params, at=time.monotonic(), wall_time=time.time(),
                                         status=status, error=error))

    async def _api(self, request: Request) -> Response:
        method = request.path_params["method"]
        body = await self._record_request(request)
        params = await self._params(request, body)
        token_error = self._token_error(request, params)
        if token_error:
            self._record(method, params, 200, token_error)
            return JSONResponse({"ok": False, "error": token_error})
        await self._hold_if_asked(method, params)
        script = self._scripted(method, params)
        if script is not None:
            self._record(method, params, script.status, script.error)
            return JSONResponse({"ok": False, "error": script.error}, status_code=script.status, headers=script.headers)
        handler = self._handlers.get(method)
        if handler is None:
            self._record(method, params, 200, "unknown_method")
            return JSONResponse({"ok": False, "error": "unknown_method"})
        with self._lock:
            answer = handler(params)
        self._record(method, params, 200, None if answer.get("ok") else answer.get("error"))
        return JSONResponse(answer)

    async def _upload(self, request: Request) -> Response:
        file_id = request.path_params["file_id"]
        body = await self._record_request(request)
        script = self._scripted(UPLOAD_METHOD, {"file_id": file_id})
        if script is not None:
            self._record(UPLOAD_METHOD, {"file_id": file_id}, script.status, script.error)
            return PlainTextResponse(script.error, status_code=script.status if script.status != 200 else 500,
                                     headers=script.headers)
        with self._lock:
            file = self._files.get(file_id)
            if file is None:
                self._record(UPLOAD_METHOD, {"file_id": file_id}, 404, "file_not_found")
                return PlainTextResponse("Not Found", status_code=404)
            file.data = body
        self._record(UPLOAD_METHOD, {"file_id": file_id, "bytes": len(body)}, 200, None)
        return PlainTextResponse(f"OK - {len(body)}")

    # --- methods (called under the lock) ---------------------------------------------------------

    def _next_ts(self) -> str:
        counter = next(self._ts_counter)
        return f"{FIRST_TS_SECONDS + counter}.{counter:06d}"

    def _find(self, channel: str, ts: str) -> SlackMessage | None:
        return next((message for message in self._channels.get(channel, []) if message.ts == ts and not message.deleted), None)

    def _message_error(self, params: dict[str, Any], *, needs_text: bool = True) -> str | None:
        if not params.get("channel"):
            return "channel_not_found"
        blocks = params.get("blocks")
        text = params.get("text")
        if blocks is not None and self.validate_blocks and (blocks or not isinstance(blocks, list)):
            error = blocks_error(blocks)
            if error:
                return error
        if needs_text and not text and not blocks:
            return "no_text"
        if text and len(str(text)) > TEXT_LIMIT:
            return "msg_too_long"
        return None

    def _auth_test(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "url": "https://fake-workspace.slack.com/", "team": "Fake Workspace", "user": "deepthread",
                "team_id": self.team_id, "user_id": self.bot_user_id, "bot_id": self.bot_id, "is_enterprise_install": False}

    def _post_message(self, params: dict[str, Any]) -> dict[str, Any]:
        error = self._message_error(params)
        channel = str(params.get("channel", ""))
        if error is None and self.require_join and channel not in self._joined:
            error = "not_in_channel"
        thread_ts = params.get("thread_ts") or None
        if error is None and thread_ts and self._find(channel, str(thread_ts)) is None:
            error = "thread_not_found"
        if error:
            return {"ok": False, "error": error}
        message = SlackMessage(channel=channel, ts=self._next_ts(), text=str(params.get("text") or ""),
                               blocks=params.get("blocks") or None, thread_ts=str(thread_ts) if thread_ts else None,
                               user=self.bot_user_id, bot_id=self.bot_id, params=params, posted_at=time.monotonic())
        self._channels.setdefault(channel, []).append(message)
        return {"ok": True, "channel": channel, "ts": message.ts, "message": message.as_api()}

    def _update(self, params: dict[str, Any]) -> dict[str, Any]:
        error = self._message_error(params, needs_text=False)
        if error:
            return {"ok": False, "error": error}
        channel = str(params["channel"])
        message = self._find(channel, str(params.get("ts", "")))
        if message is None:
            return {"ok": False, "error": "message_not_found"}
        if "text" in params:
            message.text = str(params.get("text") or "")
        if "blocks" in params:
            # An empty list removes the blocks, as on Slack; leaving the field out keeps them.
            message.blocks = params.get("blocks") or None
        message.edits.append(SlackEdit(at=time.monotonic(), text=message.text, blocks=message.blocks))
        return {"ok": True, "channel": channel, "ts": message.ts, "text": message.text, "message": message.as_api()}

    def _post_ephemeral(self, params: dict[str, Any]) -> dict[str, Any]:
        error = self._message_error(params)
        if error is None and not params.get("user"):
            error = "user_not_in_channel"
        if error:
            return {"ok": False, "error": error}
        ts = self._next_ts()
        self._ephemeral.append({**params, "message_ts": ts, "at": time.monotonic()})
        return {"ok": True, "message_ts": ts}

    def _delete(self, params: dict[str, Any]) -> dict[str, Any]:
        channel = str(params.get("channel", ""))
        message = self._find(channel, str(params.get("ts", "")))
        if message is None:
            return {"ok": False, "error": "message_not_found"}
        message.deleted = True
        return {"ok": True, "channel": channel, "ts": message.ts}

    def _permalink(self, params: dict[str, Any]) -> dict[str, Any]:
        channel, ts = str(params.get("channel", "")), str(params.get("message_ts", ""))
        if self._find(channel, ts) is None:
            return {"ok": False, "error": "message_not_found"}
        return {"ok": True, "channel": channel, "permalink": f"https://fake-workspace.slack.com/archives/{channel}/p{ts.replace('.', '')}"}

    def _channel_json(self, channel: str) -> dict[str, Any]:
        return {"id": channel, "name": f"channel-{channel.lower()}", "is_channel": True, "is_private": False,
                "is_archived": False, "is_member": channel in self._joined or not self.require_join}

    def _join(self, params: dict[str, Any]) -> dict[str, Any]:
        channel = str(params.get("channel", ""))
        if not channel:
            return {"ok": False, "error": "channel_not_found"}
        self._joined.add(channel)
        return {"ok": True, "channel": self._channel_json(channel)}

    def _conversation_info(self, params: dict[str, Any]) -> dict[str, Any]:
        channel = str(params.get("channel", ""))
        if not channel:
            return {"ok": False, "error": "channel_not_found"}
        return {"ok": True, "channel": self._channel_json(channel)}

    def _replies(self, params: dict[str, Any]) -> dict[str, Any]:
        channel, ts = str(params.get("channel", "")), str(params.get("ts", ""))
        if self._find(channel, ts) is None:
            return {"ok": False, "error": "thread_not_found"}
        thread = [message for message in self._channels.get(channel, [])
                  if not message.deleted and (message.ts == ts or message.thread_ts == ts)]
        limit = int(params.get("limit") or 1000)
        answer = [message.as_api() for message in thread[:limit]]
        answer[0].update(thread_ts=ts, reply_count=len(thread) - 1)
        return {"ok": True, "messages": answer, "has_more": False, "response_metadata": {"next_cursor": ""}}

    def _user_info(self, params: dict[str, Any]) -> dict[str, Any]:
        user_id = str(params.get("user", ""))
        if not user_id:
            return {"ok": False, "error": "user_not_found"}
        user = self.users.get(user_id) or {"id": user_id, "name": user_id.lower(), "real_name": f"User {user_id}"}
        profile = {"display_name": user["name"], "real_name": user["real_name"]}
        return {"ok": True, "user": {"team_id": self.team_id, "deleted": False, "is_bot": False, "tz": "UTC",
                                     "profile": profile, **user}}

    def _upload_url(self, params: dict[str, Any]) -> dict[str, Any]:
        filename = str(params.get("filename") or "")
        try:
            length = int(params.get("length") or 0)
        except (TypeError, ValueError):
            length = 0
        if not filename or length <= 0:
            return {"ok": False, "error": "invalid_arguments"}
        file_id = f"F{next(self._file_counter):08d}"
        self._files[file_id] = SlackFile(id=file_id, filename=filename, length=length)
        return {"ok": True, "upload_url": f"{self.url}/upload/v1/{file_id}", "file_id": file_id}

    def _complete_upload(self, params: dict[str, Any]) -> dict[str, Any]:
        entries = params.get("files")
        if not isinstance(entries, list) or not entries:
            return {"ok": False, "error": "invalid_arguments"}
        channel = params.get("channel_id") or params.get("channels")
        thread_ts = params.get("thread_ts") or None
        files: list[SlackFile] = []
        for entry in entries:
            file = self._files.get(str(entry.get("id")))
            if file is None or file.data is None:
                return {"ok": False, "error": "file_not_found"}
            if len(file.data) != file.length:
                return {"ok": False, "error": "file_size_mismatch"}
            files.append(file)
        for file in files:
            file.title = entry_title(entries, file.id) or file.filename
            file.channel, file.thread_ts = (str(channel) if channel else None), (str(thread_ts) if thread_ts else None)
            file.initial_comment = params.get("initial_comment")
            file.completed = True
        answer_files = [file.as_api() for file in files]
        if channel:
            channel = str(channel)
            message = SlackMessage(channel=channel, ts=self._next_ts(), text=str(params.get("initial_comment") or ""),
                                   blocks=None, thread_ts=str(thread_ts) if thread_ts else None, user=self.bot_user_id,
                                   bot_id=self.bot_id, params=params, posted_at=time.monotonic(), files=files)
            self._channels.setdefault(channel, []).append(message)
            share = {"ts": message.ts, **({"thread_ts": message.thread_ts} if message.thread_ts else {})}
            for answer in answer_files:
                answer["shares"] = {"public": {channel: [share]}}
        return {"ok": True, "files": answer_files}

    def _add_reaction(self, params: dict[str, Any]) -> dict[str, Any]:
        message = self._find(str(params.get("channel", "")), str(params.get("timestamp", "")))
        name = str(params.get("name", ""))
        if message is None:
            return {"ok": False, "error": "message_not_found"}
        if not name:
            return {"ok": False, "error": "invalid_name"}
        users = message.reactions.setdefault(name, [])
        if self.bot_user_id in users:
            return {"ok": False, "error": "already_reacted"}
        users.append(self.bot_user_id)
        return {"ok": True}


def entry_title(entries: list[dict[str, Any]], file_id: str) -> str | None:
    """The title given for `file_id` in a `files.completeUploadExternal` request."""
    return next((entry.get("title") for entry in entries if str(entry.get("id")) == file_id), None)
