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
    slack.calls("chat.update")                            # SlackCall list: method, params, time, token
    slack.installing("T0SECOND", "Second Workspace")       # who approves the next OAuth install (oauth.v2.access)
    slack.stream("C1", ts)                                # SlackStream: what chat.*Stream did to a message
    slack.expire_streams()                                # as Slack does after a pause: appends and stops now fail
    slack.add_file("notes.pdf", data, channel="C1")        # a file a person shared: files.info and the file host
    slack.set_timezone("U1", "Asia/Tokyo")                # users.info's `tz` for U1 (a person it knows)
    slack.redirect_downloads("http://elsewhere/x")         # the file host answers the next download with a redirect
    slack.file_requests.all()                             # every request the file host got, with its headers

`users.info` knows the people added with `add_user` or `set_timezone` (their `tz` America/New_York unless set) and
answers `user_not_found` for anyone else.

Shared files are served as Slack serves them: `files.info` describes them (the file object, or `file_not_found`,
`file_deleted`), and the file host (configure `file_host` as SLACK_FILE_HOSTS) serves `url_private` and
`url_private_download` only to a request bearing a bot token, sending any other to the workspace's sign-in page.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import datetime as dt
import itertools
import json
import mimetypes
import sys
import threading
import time
import zoneinfo
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from tests.fakes.server import LoopbackFake, LoopbackServer, RecordedRequest, RequestLog
from tests.fakes.slack_interactivity import SlackViews, context_actions_error
from tests.fakes.slack_assistant import FakeAssistantThreads
from tests.fakes.slack_chunks import TASK_DISPLAY_MODES, StreamedTasks, chunks_error, decoded_chunks

FAKE_TOKEN = "xoxb-fake-token"
FAKE_CLIENT_ID = "1111111111.2222222222"
FAKE_CLIENT_SECRET = "fake-client-secret"
FAKE_APP_ID = "A0DEEPTHREAD"
OAUTH_ACCESS_METHOD = "oauth.v2.access"
SECTION_TEXT_LIMIT = 3_000
MARKDOWN_BLOCKS_LIMIT = 12_000
BLOCKS_PER_MESSAGE = 50
TEXT_LIMIT = 40_000
KNOWN_BLOCK_TYPES = frozenset({"section", "context", "markdown", "header", "divider", "rich_text", "actions", "image",
                               "input", "file", "video", "context_actions"})
MESSAGE_METHODS = frozenset({"chat.postMessage", "chat.update", "chat.postEphemeral"})
UPLOAD_METHOD = "upload"
# What a platform outage at delivery time breaks: posting, editing and the three steps of an upload.
OUTAGE_METHODS = ("chat.postMessage", "chat.update", "files.getUploadURLExternal", UPLOAD_METHOD,
                  "files.completeUploadExternal")
FIRST_TS_SECONDS = 1_700_000_000
# Slack ends a streamed message left this long without an append (`message_not_in_streaming_state` afterwards).
STREAM_IDLE_SECONDS = 300.0
STREAM_TEXT_LIMIT = 12_000
# Where Slack's file host sends a download without a valid token: the workspace's sign-in page (not a file host).
SIGN_IN_URL = "https://fake-workspace.slack.com/"
DEFAULT_TIMEZONE = "America/New_York"


@dataclass
class SlackCall:
    """One call as the fake saw it: the Web API method (or `upload`), its merged parameters, when, and the answer."""

    method: str
    params: dict[str, Any]
    at: float
    wall_time: float
    status: int = 200
    error: str | None = None
    # The token the call came with (Authorization: Bearer, or the `token` field); None for app-credential calls.
    token: str | None = None


@dataclass
class PendingInstall:
    """Who approves the next install on the fake authorize page: the workspace, and the person installing."""

    team_id: str
    team_name: str
    installer: str
    scopes: str = ""


@dataclass
class SlackEdit:
    """One `chat.update` of a message: what it said afterwards, and when."""

    at: float
    text: str
    blocks: list[dict[str, Any]] | None


@dataclass
class SlackStream:
    """A message written with chat.startStream/appendStream/stopStream: its pieces, its state, when it last moved."""

    channel: str
    ts: str
    recipient_user_id: str | None
    recipient_team_id: str | None
    pieces: list[str] = field(default_factory=list)
    state: str = "streaming"  # then "stopped", or "expired" after a pause
    last_active: float = 0.0
    stop_blocks: list[dict[str, Any]] | None = None
    task_display_mode: str | None = None
    streamed_tasks: StreamedTasks = field(default_factory=StreamedTasks)  # the task and plan chunks, in order

    @property
    def markdown(self) -> str:
        return "".join(self.pieces)


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
class SharedFile:
    """A file a person shared in a channel (`add_file`): what files.info describes and the file host serves."""

    id: str
    name: str
    data: bytes
    channel: str
    user: str
    user_team: str  # the uploader's workspace: another one's for a file from a Slack Connect channel
    mimetype: str
    title: str
    created: int
    external_type: str | None = None  # "gdrive", "dropbox", …: a link to a file stored outside Slack
    file_access: str = "visible"  # "check_file_info" in Slack Connect event payloads
    download_url: str | None = None  # in place of the file host's url_private_download (an answer pointing elsewhere)
    deleted: bool = False


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
        if kind == "context_actions" and context_actions_error(block):
            return "invalid_blocks"
    if markdown_characters > MARKDOWN_BLOCKS_LIMIT:
        return "invalid_blocks"
    return None


JSON_PARAMETERS = frozenset({"blocks", "attachments", "files", "metadata", "view"})


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
                 bot_id: str = "B0BOT", require_join: bool = False, validate_blocks: bool = True,
                 client_id: str = FAKE_CLIENT_ID, client_secret: str = FAKE_CLIENT_SECRET, app_id: str = FAKE_APP_ID,
                 stream_idle_seconds: float = STREAM_IDLE_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        self.token = token
        self.team_id = team_id
        self.bot_user_id = bot_user_id
        self.bot_id = bot_id
        self.require_join = require_join
        self.validate_blocks = validate_blocks
        self.users: dict[str, dict[str, Any]] = {}
        # Streams expire after this long without an append, by `clock` (a test's manual clock, or `expire_streams`).
        self.stream_idle_seconds = stream_idle_seconds
        self.clock = clock
        self._streams: dict[tuple[str, str], SlackStream] = {}
        # Modals: `views.issue_trigger_id` for the payloads a test sends, `views.opened()` for what the bot opened.
        self.views = SlackViews(team_id=team_id, clock=clock)
        # Private channels (conversations.info says is_private; Slack hides one from a bot that is not in it).
        self.private_channels: set[str] = set()
        self.requests = RequestLog()
        self._lock = threading.RLock()
        self._calls: list[SlackCall] = []
        self._channels: dict[str, list[SlackMessage]] = {}
        self._ephemeral: list[dict[str, Any]] = []
        self._joined: set[str] = set()
        self._files: dict[str, SlackFile] = {}
        # Files people shared (`add_file`); every request to the file host; downloads to answer with a redirect.
        self._shared_files: dict[str, SharedFile] = {}
        self.file_requests = RequestLog()
        self._download_redirects: list[list[Any]] = []
        self._scripts: dict[str, list[ScriptedFailure]] = {}
        self._outages: list[tuple[str, ScriptedFailure]] = []
        self._holds: list[HeldCall] = []
        self._ts_counter = itertools.count(1)
        self._file_counter = itertools.count(1)
        self._server: LoopbackServer | None = None
        # OAuth: the app's credentials, the bot tokens Slack has handed out (token -> workspace), codes not yet used.
        self.client_id = client_id
        self.client_secret = client_secret
        self.app_id = app_id
        self.oauth_redirect_url: str | None = None
        self._workspace_of_token: dict[str, str] = {token: team_id}
        self._team_names: dict[str, str] = {team_id: "Fake Workspace"}
        self._next_install = PendingInstall(team_id=team_id, team_name="Fake Workspace", installer="U0INSTALLER")
        self._oauth_codes: dict[str, PendingInstall] = {}
        self._oauth_counter = itertools.count(1)
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
            "files.info": self._files_info,
            "reactions.add": self._add_reaction,
            "views.open": self.views.open,
            "chat.startStream": self._start_stream,
            "chat.appendStream": self._append_stream,
            "chat.stopStream": self._stop_stream,
        }
        self.assistant = FakeAssistantThreads(self)  # assistant.threads.setStatus, setSuggestedPrompts, setTitle
        self._handlers.update(self.assistant.handlers())
        self.app = Starlette(routes=[
            Route("/api/{method}", self._api, methods=["GET", "POST"]),
            Route("/oauth/v2/authorize", self._authorize, methods=["GET"]),
            Route("/upload/v1/{file_id}", self._upload, methods=["POST"]),
            Route("/files-pri/{team_file}/download/{filename}", self._file_host, methods=["GET"]),
            Route("/files-pri/{team_file}/{filename}", self._file_host, methods=["GET"]),
        ])

    # --- lifecycle -------------------------------------------------------------------------------


    @property
    def api_url(self) -> str:
        """The base URL to configure as SLACK_API_URL (ends with `/`)."""
        return f"{self.url}/api/"

    @property
    def authorize_url(self) -> str:
        """The OAuth approval page to configure as SLACK_AUTHORIZE_URL."""
        return f"{self.url}/oauth/v2/authorize"

    @property
    def file_host(self) -> str:
        """The file host's origin (Slack's files.slack.com) to configure as SLACK_FILE_HOSTS."""
        return self.url

    # --- OAuth installs --------------------------------------------------------------------------

    def installing(self, team_id: str, team_name: str, installer: str = "U0INSTALLER") -> None:
        """The next approval on the authorize page installs the app in workspace `team_id`, by `installer`."""
        with self._lock:
            self._next_install = PendingInstall(team_id=team_id, team_name=team_name, installer=installer)

    def tokens_of(self, team_id: str) -> list[str]:
        """The bot tokens handed out for workspace `team_id` that still work, oldest first."""
        with self._lock:
            return [token for token, team in self._workspace_of_token.items() if team == team_id]

    def uninstall(self, team_id: str) -> None:
        """What uninstalling does on Slack's side: the workspace's tokens stop working (`invalid_auth`)."""
        with self._lock:
            for token in self.tokens_of(team_id):
                del self._workspace_of_token[token]

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

    def add_file(self, name: str, data: bytes, *, channel: str, user: str = "U0SOMEONE", mimetype: str | None = None,
                 title: str | None = None, external: bool = False, external_type: str = "gdrive",
                 user_team: str | None = None, file_access: str = "visible",
                 download_url: str | None = None) -> dict[str, Any]:
        """A file `user` shared in `channel`; returns its file object as files.info describes it. `external`: a link
        to a file stored outside Slack (`external_type`); `user_team`: the uploader's workspace (another one's for a
        Slack Connect file); `download_url`: the url_private_download files.info gives, in place of the file host's."""
        with self._lock:
            file = SharedFile(id=f"F{next(self._file_counter):08d}", name=name, data=data, channel=channel, user=user,
                              user_team=user_team or self.team_id,
                              mimetype=mimetype or mimetypes.guess_type(name)[0] or "application/octet-stream",
                              title=title or name, created=FIRST_TS_SECONDS + next(self._ts_counter),
                              external_type=external_type if external else None, file_access=file_access,
                              download_url=download_url)
            self._shared_files[file.id] = file
            return self._shared_file_json(file)

    def delete_file(self, file_id: str) -> None:
        """Delete a shared file: files.info answers `file_deleted`, the file host 404."""
        with self._lock:
            self._shared_files[file_id].deleted = True

    def redirect_downloads(self, location: str, *, times: int = 1) -> None:
        """Answer the next `times` requests to the file host with a 302 to `location`, whatever their token."""
        with self._lock:
            self._download_redirects.append([location, times])

    def person_posts(self, channel: str, text: str, *, user: str, ts: str | None = None,
                     thread_ts: str | None = None) -> str:
        """A message a person posted (the one an event about it names), so that the bot can answer in its thread;
        returns its ts."""
        with self._lock:
            message = SlackMessage(channel=channel, ts=ts or self._next_ts(), text=text, blocks=None,
                                   thread_ts=thread_ts, user=user, bot_id=None, params={}, posted_at=time.monotonic())
            self._channels.setdefault(channel, []).append(message)
            return message.ts

    def add_user(self, user_id: str, name: str, **fields: Any) -> None:
        """A user that `users.info` knows by this name (with the time zone `tz` when given)."""
        with self._lock:
            self.users[user_id] = {"id": user_id, "name": name, "real_name": name, **fields}

    def set_timezone(self, user_id: str, timezone: str) -> None:
        """The IANA zone `users.info` says `user_id` is in (`tz`), adding the user when new."""
        with self._lock:
            known = self.users.get(user_id) or {"id": user_id, "name": user_id.lower(), "real_name": f"User {user_id}"}
            self.users[user_id] = {**known, "tz": timezone}

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

    @staticmethod
    def _presented_token(request: Request, params: dict[str, Any]) -> str | None:
        """The token a call came with: the Bearer header first, else the `token` field."""
        authorization = request.headers.get("authorization", "")
        return authorization.removeprefix("Bearer ").strip() if authorization.startswith("Bearer ") else params.get("token")

    def _token_error(self, request: Request, params: dict[str, Any]) -> str | None:
        token = self._presented_token(request, params)
        params.pop("token", None)
        if not token:
            return "not_authed"
        with self._lock:
            return None if token in self._workspace_of_token else "invalid_auth"

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

    def _record(self, method: str, params: dict[str, Any], status: int, error: str | None, token: str | None = None) -> None:
        with self._lock:
            self._calls.append(SlackCall(method=method, params=params, at=time.monotonic(), wall_time=time.time(),
                                         status=status, error=error, token=token))

    async def _api(self, request: Request) -> Response:
        method = request.path_params["method"]
        body = await self._record_request(request)
        params = await self._params(request, body)
        if method == OAUTH_ACCESS_METHOD:  # authenticated with the app's client id and secret, not a token
            with self._lock:
                answer = self._oauth_access(request, params)
            self._record(method, params, 200, None if answer.get("ok") else answer.get("error"))
            return JSONResponse(answer)
        token = self._presented_token(request, params)
        token_error = self._token_error(request, params)
        if token_error:
            self._record(method, params, 200, token_error, token)
            return JSONResponse({"ok": False, "error": token_error})
        await self._hold_if_asked(method, params)
        script = self._scripted(method, params)
        if script is not None:
            self._record(method, params, script.status, script.error, token)
            return JSONResponse({"ok": False, "error": script.error}, status_code=script.status, headers=script.headers)
        handler = self._handlers.get(method)
        if handler is None:
            self._record(method, params, 200, "unknown_method", token)
            return JSONResponse({"ok": False, "error": "unknown_method"})
        with self._lock:
            # auth.test describes the workspace of the token it was called with.
            answer = self._auth_test_of(str(token)) if method == "auth.test" else handler(params)
        self._record(method, params, 200, None if answer.get("ok") else answer.get("error"), token)
        return JSONResponse(answer)

    async def _file_host(self, request: Request) -> Response:
        """Slack's file host: a shared file's bytes to a request bearing a working bot token (Authorization: Bearer),
        a redirect to the sign-in page to any other, 404 for a file it does not have."""
        recorded = RecordedRequest(method=request.method, host=request.headers.get("host", ""), path=request.url.path,
                                   query=dict(request.query_params), headers=dict(request.headers),
                                   body=await request.body())
        self.requests.add(recorded)
        self.file_requests.add(recorded)
        with self._lock:
            redirect = self._download_redirects[0] if self._download_redirects else None
            if redirect is not None:
                redirect[1] -= 1
                if redirect[1] <= 0:
                    self._download_redirects.pop(0)
                return Response(status_code=302, headers={"Location": str(redirect[0])})
            token = self._presented_token(request, {})
            if not token or token not in self._workspace_of_token:
                return Response(status_code=302, headers={"Location": f"{SIGN_IN_URL}?{urlencode({'redir': request.url.path})}"})
            team, _, file_id = request.path_params["team_file"].partition("-")
            file = self._shared_files.get(file_id)
            if file is None or file.deleted or file.external_type or file.user_team != team:
                return PlainTextResponse("File not found", status_code=404)
            return Response(file.data, media_type=file.mimetype,
                            headers={"Content-Disposition": f"attachment; filename*=UTF-8''{quote(file.name)}"})

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
        return self._auth_test_of(self.token)

    async def _authorize(self, request: Request) -> Response:
        """Slack's approval page, approved at once: back to the redirect URL with a one-time code and the state."""
        await self._record_request(request)
        query = request.query_params
        if query.get("client_id") != self.client_id:
            return PlainTextResponse("invalid_client_id", status_code=400)
        redirect_url = query.get("redirect_uri") or self.oauth_redirect_url
        if not redirect_url:
            return PlainTextResponse("no redirect URL configured for the app", status_code=400)
        with self._lock:
            code = f"{next(self._oauth_counter)}.fake-oauth-code"
            self._oauth_codes[code] = dataclasses.replace(self._next_install, scopes=query.get("scope", ""))
            self._calls.append(SlackCall(method="oauth.v2.authorize", params=dict(query), at=time.monotonic(),
                                         wall_time=time.time()))
        location = f"{redirect_url}?{urlencode({'code': code, 'state': query.get('state', '')})}"
        return Response(status_code=302, headers={"Location": location})

    def _oauth_access(self, request: Request, params: dict[str, Any]) -> dict[str, Any]:
        """`oauth.v2.access`: a code from the authorize page for a new bot token, in Slack's answer format."""
        client_id, client_secret = _basic_credentials(request.headers.get("authorization", ""))
        client_id = client_id or params.get("client_id")
        client_secret = client_secret or params.get("client_secret")
        if client_id != self.client_id:
            return {"ok": False, "error": "invalid_client_id"}
        if client_secret != self.client_secret:
            return {"ok": False, "error": "bad_client_secret"}
        install = self._oauth_codes.pop(str(params.get("code", "")), None)
        if install is None:
            return {"ok": False, "error": "invalid_code"}
        token = f"xoxb-{install.team_id.lower()}-{next(self._oauth_counter)}-fake"
        self._workspace_of_token[token] = install.team_id
        self._team_names[install.team_id] = install.team_name
        return {
            "ok": True, "access_token": token, "token_type": "bot", "scope": install.scopes,
            "bot_user_id": self.bot_user_id, "app_id": self.app_id,
            "team": {"id": install.team_id, "name": install.team_name}, "enterprise": None,
            "authed_user": {"id": install.installer}, "is_enterprise_install": False,
        }

    def _auth_test_of(self, token: str) -> dict[str, Any]:
        team_id = self._workspace_of_token.get(token, self.team_id)
        return {"ok": True, "url": "https://fake-workspace.slack.com/", "team": self._team_names.get(team_id, team_id),
                "user": "deepthread", "team_id": team_id, "user_id": self.bot_user_id, "bot_id": self.bot_id,
                "is_enterprise_install": False}

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
        stream = self._streams.get((channel, message.ts))
        if stream is not None and stream.state == "streaming":
            stream.state = "stopped"  # an edited message is a finished one
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
        if channel.startswith("D"):
            return {"id": channel, "created": FIRST_TS_SECONDS, "is_im": True, "is_org_shared": False,
                    "user": "U0SOMEONE", "is_user_deleted": False, "priority": 0}
        private = channel in self.private_channels
        return {"id": channel, "name": f"channel-{channel.lower()}", "is_channel": True, "is_group": private,
                "is_im": False, "is_mpim": False, "is_private": private, "is_archived": False,
                "is_member": channel in self._joined or not self.require_join}

    def add_private_channel(self, channel: str, *, bot_invited: bool = True) -> None:
        """A private channel, with the bot invited into it unless told otherwise."""
        with self._lock:
            self.private_channels.add(channel)
            if bot_invited:
                self._joined.add(channel)

    def _join(self, params: dict[str, Any]) -> dict[str, Any]:
        channel = str(params.get("channel", ""))
        if not channel:
            return {"ok": False, "error": "channel_not_found"}
        self._joined.add(channel)
        return {"ok": True, "channel": self._channel_json(channel)}

    def _conversation_info(self, params: dict[str, Any]) -> dict[str, Any]:
        channel = str(params.get("channel", ""))
        if not channel or (channel in self.private_channels and channel not in self._joined):
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
        user = self.users.get(str(params.get("user", "")))
        if user is None:
            return {"ok": False, "error": "user_not_found"}
        timezone = str(user.get("tz") or DEFAULT_TIMEZONE)
        offset = dt.datetime.now(zoneinfo.ZoneInfo(timezone)).utcoffset() or dt.timedelta()
        profile = {"display_name": user["name"], "real_name": user["real_name"]}
        return {"ok": True, "user": {"team_id": self.team_id, "deleted": False, "is_bot": False, "tz": timezone,
                                     "tz_label": timezone, "tz_offset": int(offset.total_seconds()),
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

    def _shared_file_json(self, file: SharedFile) -> dict[str, Any]:
        """A shared file as Slack's file object (files.info's `file`)."""
        extension = file.name.rsplit(".", 1)[-1].lower() if "." in file.name else "binary"
        private = file.channel in self.private_channels or file.channel.startswith("G")
        where = {"ims": [file.channel]} if file.channel.startswith("D") else \
            {"groups": [file.channel]} if private else {"channels": [file.channel]}
        share_kind = "public" if "channels" in where else "private"
        described: dict[str, Any] = {
            "id": file.id, "created": file.created, "timestamp": file.created, "name": file.name, "title": file.title,
            "mimetype": file.mimetype, "filetype": extension, "pretty_type": extension.upper(), "user": file.user,
            "user_team": file.user_team, "editable": False, "size": len(file.data), "mode": "hosted",
            "is_external": False, "external_type": "", "is_public": share_kind == "public", "public_url_shared": False,
            "display_as_bot": False, "username": "",
            "url_private": f"{self.url}/files-pri/{file.user_team}-{file.id}/{quote(file.name)}",
            "url_private_download": file.download_url or f"{self.url}/files-pri/{file.user_team}-{file.id}/download/{quote(file.name)}",
            "permalink": f"https://fake-workspace.slack.com/files/{file.user}/{file.id}/{quote(file.name)}",
            "permalink_public": f"https://slack-files.com/{file.user_team}-{file.id}-{file.id.lower()[-6:]}",
            "comments_count": 0, "is_starred": False,
            "shares": {share_kind: {file.channel: [{"ts": f"{file.created}.000000", "reply_users": [],
                                                    "reply_count": 0, "channel_name": f"channel-{file.channel.lower()}",
                                                    "team_id": self.team_id}]}},
            "channels": [], "groups": [], "ims": [], **where, "has_more_shares": False, "has_rich_preview": False,
            "file_access": file.file_access,
        }
        if file.external_type:
            external_url = f"https://docs.google.com/document/d/{file.id}/edit"
            described.update(mode="external", is_external=True, external_type=file.external_type, size=0,
                             url_private=external_url, external_url=external_url, external_id=file.id)
            del described["url_private_download"]
        return described

    def _files_info(self, params: dict[str, Any]) -> dict[str, Any]:
        file = self._shared_files.get(str(params.get("file", "")))
        if file is None:
            return {"ok": False, "error": "file_not_found"}
        if file.deleted:
            return {"ok": False, "error": "file_deleted"}
        if self.require_join and not file.channel.startswith("D") and file.channel not in self._joined:
            return {"ok": False, "error": "file_not_found"}  # a bot sees the files of the channels it is in
        return {"ok": True, "file": self._shared_file_json(file), "comments": [],
                "response_metadata": {"next_cursor": ""}}

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

    # --- streamed messages (chat.startStream / appendStream / stopStream) --------------------------

    def stream(self, channel: str, ts: str) -> SlackStream:
        """The stream that wrote the message at `ts`; raises KeyError if none did."""
        with self._lock:
            return self._streams[(channel, ts)]

    def streams(self) -> list[SlackStream]:
        """Every stream started, in order."""
        with self._lock:
            return list(self._streams.values())

    def expire_streams(self) -> None:
        """End every open stream as Slack does after a pause: appends and stops answer `message_not_in_streaming_state`."""
        with self._lock:
            for stream in self._streams.values():
                if stream.state == "streaming":
                    stream.state = "expired"

    def _open_stream(self, channel: str, ts: str) -> SlackStream | str:
        """The open stream at `ts`, or the error Slack answers for it (expiring it when idle too long)."""
        message = self._find(channel, ts)
        stream = self._streams.get((channel, ts))
        if message is None:
            return "message_not_found"
        if stream is None:
            return "message_not_in_streaming_state"
        if stream.state == "streaming" and self.clock() - stream.last_active > self.stream_idle_seconds:
            stream.state = "expired"
        return stream if stream.state == "streaming" else "message_not_in_streaming_state"

    @staticmethod
    def _stream_text(params: dict[str, Any]) -> str | None:
        """The Markdown a stream call adds: `markdown_text`, then the `markdown_text` chunks (None: malformed chunks)."""
        chunks = decoded_chunks(params.get("chunks"))
        if chunks_error(chunks) is not None:
            return None
        texts = [str(chunk.get("text", "")) for chunk in chunks or [] if chunk.get("type") == "markdown_text"]
        return str(params.get("markdown_text") or "") + "".join(texts)

    def _show_stream(self, message: SlackMessage, stream: SlackStream) -> None:
        message.text = stream.markdown
        message.blocks = [{"type": "markdown", "text": stream.markdown}, *(stream.stop_blocks or [])]

    def _start_stream(self, params: dict[str, Any]) -> dict[str, Any]:
        channel, thread_ts = str(params.get("channel", "")), str(params.get("thread_ts") or "")
        if not channel:
            return {"ok": False, "error": "channel_not_found"}
        if not thread_ts:
            return {"ok": False, "error": "invalid_arguments"}
        if not channel.startswith("D"):
            # In channels Slack needs to know whom the stream is for.
            for name in ("recipient_team_id", "recipient_user_id"):
                if not params.get(name):
                    return {"ok": False, "error": f"missing_{name}"}
        if self._find(channel, thread_ts) is None:
            return {"ok": False, "error": "thread_not_found"}
        text = self._stream_text(params)
        if text is None:
            return {"ok": False, "error": "invalid_chunks"}
        if len(text) > STREAM_TEXT_LIMIT:
            return {"ok": False, "error": "msg_too_long"}
        if params.get("task_display_mode") not in (None, *TASK_DISPLAY_MODES):
            return {"ok": False, "error": "invalid_arguments"}
        message = SlackMessage(channel=channel, ts=self._next_ts(), text="", blocks=None, thread_ts=thread_ts,
                               user=self.bot_user_id, bot_id=self.bot_id, params=params, posted_at=time.monotonic())
        stream = SlackStream(channel=channel, ts=message.ts, recipient_user_id=params.get("recipient_user_id"),
                             recipient_team_id=params.get("recipient_team_id"), pieces=[text] if text else [],
                             last_active=self.clock(), task_display_mode=params.get("task_display_mode"))
        stream.streamed_tasks.add(decoded_chunks(params.get("chunks")))
        self._streams[(channel, message.ts)] = stream
        self._show_stream(message, stream)
        self._channels.setdefault(channel, []).append(message)
        return {"ok": True, "channel": channel, "ts": message.ts}

    def _stream_call(self, params: dict[str, Any]) -> tuple[str, str, SlackStream, str] | dict[str, Any]:
        """The channel, ts, open stream and text an append or stop names, or Slack's error answer."""
        channel, ts = str(params.get("channel", "")), str(params.get("ts", ""))
        stream = self._open_stream(channel, ts)
        if isinstance(stream, str):
            return {"ok": False, "error": stream}
        text = self._stream_text(params)
        if text is None:
            return {"ok": False, "error": "invalid_chunks"}
        return channel, ts, stream, text

    def _append_stream(self, params: dict[str, Any]) -> dict[str, Any]:
        call = self._stream_call(params)
        if isinstance(call, dict):
            return call
        channel, ts, stream, text = call
        chunks = decoded_chunks(params.get("chunks"))
        if not text and not chunks:
            return {"ok": False, "error": "no_text"}
        if len(text) > STREAM_TEXT_LIMIT:
            return {"ok": False, "error": "msg_too_long"}
        if text:
            stream.pieces.append(text)
        stream.streamed_tasks.add(chunks)
        stream.last_active = self.clock()
        self._show_stream(self._find(channel, ts), stream)  # type: ignore[arg-type]
        return {"ok": True, "channel": channel, "ts": ts}

    def _stop_stream(self, params: dict[str, Any]) -> dict[str, Any]:
        call = self._stream_call(params)
        if isinstance(call, dict):
            return call
        channel, ts, stream, text = call
        blocks = params.get("blocks")
        if blocks is not None and (not isinstance(blocks, list) or blocks_error(blocks)):
            return {"ok": False, "error": "invalid_blocks"}
        if text:
            stream.pieces.append(text)
        stream.streamed_tasks.add(decoded_chunks(params.get("chunks")))
        stream.stop_blocks = blocks or None
        stream.state = "stopped"
        message = self._find(channel, ts)
        self._show_stream(message, stream)  # type: ignore[arg-type]
        return {"ok": True, "channel": channel, "ts": ts, "message": message.as_api()}  # type: ignore[union-attr]


def _basic_credentials(authorization: str) -> tuple[str | None, str | None]:
    """The client id and secret of an `Authorization: Basic …` header (how slack-sdk sends them), or Nones."""
    if not authorization.startswith("Basic "):
        return None, None
    try:
        decoded = base64.b64decode(authorization.removeprefix("Basic ").strip()).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return None, None
    client_id, _, client_secret = decoded.partition(":")
    return client_id, client_secret


def entry_title(entries: list[dict[str, Any]], file_id: str) -> str | None:
    """The title given for `file_id` in a `files.completeUploadExternal` request."""
    return next((entry.get("title") for entry in entries if str(entry.get("id")) == file_id), None)
