"""Requests as Slack sends them to a bot: to its Request URL, signed with the signing secret, or as Socket Mode
envelopes over a fake WebSocket; and a catcher for replies sent to `response_url`.

    sender = SlackEventSender(f"{bot.url}/slack/events", "signing-secret", response_url=catcher.url)
    sender.send(sender.command("/research", "why is the sky blue", user="U1", channel="C1"))
    sender.send(sender.event(sender.app_mention("<@U0BOT> hi", user="U1", channel="C1")), retry_num=1)
    await sender.asend(client, sender.block_action("deepthread_retry", "42", user="U1", channel="C1", message_ts=ts))

Signing is Slack's v0 scheme: `v0=` + hex HMAC-SHA256 of `v0:{timestamp}:{body}` with the signing secret, in
`X-Slack-Signature`, with the timestamp in `X-Slack-Request-Timestamp`.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import httpx
from aiohttp import WSMsgType, web
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from tests.fakes.server import LoopbackFake, LoopbackServer, free_port
from tests.fakes.slack_api import FakeSlack
from tests.fakes.slack_interactivity import Choice, submission_state

FORM = "application/x-www-form-urlencoded"
JSON = "application/json"
DEFAULT_TEAM = "T0FAKE"
DEFAULT_BOT_USER = "U0BOT"
DEFAULT_APP = "A0DEEPTHREAD"
VERIFICATION_TOKEN = "legacy-verification-token"
FAKE_APP_TOKEN = "xapp-1-fake-app-token"
# Shared by every sender in the process, so that message timestamps never repeat within a test session.
_numbers = itertools.count(1)


def sign_slack_request(secret: str, body: str | bytes, timestamp: int | str) -> str:
    """The `X-Slack-Signature` Slack sends: `v0=` + hex HMAC-SHA256 of `v0:{timestamp}:{body}`."""
    text = body.decode("utf-8") if isinstance(body, bytes) else body
    digest = hmac.new(secret.encode("utf-8"), f"v0:{timestamp}:{text}".encode("utf-8"), hashlib.sha256).hexdigest()
    return f"v0={digest}"


@dataclass(frozen=True)
class SlackRequest:
    """One request body as Slack would post it, with its content type."""

    body: str
    content_type: str
    event_id: str | None = None


class SlackEventSender:
    """Builds Slack's request bodies (url_verification, slash commands, event callbacks, block actions) and posts
    them signed to the bot's Request URL."""

    def __init__(self, url: str, signing_secret: str, *, team_id: str = DEFAULT_TEAM, bot_user_id: str = DEFAULT_BOT_USER,
                 api_app_id: str = DEFAULT_APP, response_url: str = "http://127.0.0.1:9/response") -> None:
        self.url = url
        self.signing_secret = signing_secret
        self.team_id = team_id
        self.bot_user_id = bot_user_id
        self.api_app_id = api_app_id
        self.response_url = response_url.rstrip("/")
        self._client: httpx.Client | None = None

    # --- bodies ----------------------------------------------------------------------------------

    @staticmethod
    def next_number() -> int:
        return next(_numbers)

    def next_ts(self) -> str:
        """A message timestamp like Slack's (`seconds.microseconds`), increasing."""
        number = self.next_number()
        return f"{1_710_000_000 + number}.{number:06d}"

    def url_verification(self, challenge: str) -> SlackRequest:
        """The handshake Slack sends when the Request URL is saved."""
        body = {"token": VERIFICATION_TOKEN, "challenge": challenge, "type": "url_verification"}
        return SlackRequest(body=json.dumps(body), content_type=JSON)

    def command(self, command: str, text: str, *, user: str, channel: str, channel_name: str = "research",
                user_name: str | None = None) -> SlackRequest:
        """A slash command as Slack posts it (form-encoded), its `response_url` pointing at `response_url`."""
        fields = self.command_payload(command, text, user=user, channel=channel, channel_name=channel_name,
                                      user_name=user_name)
        return SlackRequest(body=urlencode(fields), content_type=FORM)

    def command_payload(self, command: str, text: str, *, user: str, channel: str, channel_name: str = "research",
                        user_name: str | None = None) -> dict[str, str]:
        """A slash command's fields (form fields over HTTP, the envelope's payload in Socket Mode)."""
        number = self.next_number()
        return {
            "token": VERIFICATION_TOKEN, "team_id": self.team_id, "team_domain": "fake-workspace",
            "channel_id": channel, "channel_name": channel_name, "user_id": user, "user_name": user_name or user.lower(),
            "command": command, "text": text, "api_app_id": self.api_app_id, "is_enterprise_install": "false",
            "response_url": f"{self.response_url}/commands/{number}", "trigger_id": f"{number}.{number}.trigger",
        }

    def event(self, event: dict[str, Any], *, event_id: str | None = None) -> SlackRequest:
        """An Events API `event_callback` wrapping `event`, with a fresh `event_id` unless one is given."""
        body = self.event_payload(event, event_id=event_id)
        return SlackRequest(body=json.dumps(body), content_type=JSON, event_id=body["event_id"])

    def event_payload(self, event: dict[str, Any], *, event_id: str | None = None) -> dict[str, Any]:
        """An `event_callback` body as a dict (the envelope's payload in Socket Mode)."""
        event_id = event_id or f"Ev{self.next_number():010d}"
        return {
            "token": VERIFICATION_TOKEN, "team_id": self.team_id, "context_team_id": self.team_id,
            "api_app_id": self.api_app_id, "event": event, "type": "event_callback", "event_id": event_id,
            "event_time": int(time.time()),
            "authorizations": [{"enterprise_id": None, "team_id": self.team_id, "user_id": self.bot_user_id,
                                "is_bot": True, "is_enterprise_install": False}],
            "is_ext_shared_channel": False, "event_context": f"4-{event_id}",
        }

    @staticmethod
    def socket_envelope(request_type: str, payload: dict[str, Any], *, retry_attempt: int = 0) -> dict[str, Any]:
        """A Socket Mode envelope (`slash_commands`, `events_api`, `interactive`) carrying `payload`."""
        envelope: dict[str, Any] = {"envelope_id": f"envelope-{SlackEventSender.next_number()}", "type": request_type,
                                    "payload": payload, "accepts_response_payload": request_type != "events_api"}
        if request_type == "events_api":
            envelope.update(retry_attempt=retry_attempt, retry_reason="timeout" if retry_attempt else "")
        return envelope

    def app_mention(self, text: str, *, user: str, channel: str, ts: str | None = None,
                    thread_ts: str | None = None) -> dict[str, Any]:
        """An `app_mention` event (text as typed, e.g. `<@U0BOT> question`)."""
        ts = ts or self.next_ts()
        event = {"type": "app_mention", "user": user, "text": text, "ts": ts, "channel": channel, "event_ts": ts,
                 "team": self.team_id, "client_msg_id": f"msg-{ts}"}
        if thread_ts:
            event["thread_ts"] = thread_ts
        return event

    def message(self, text: str, *, user: str | None, channel: str, channel_type: str = "channel", ts: str | None = None,
                thread_ts: str | None = None, subtype: str | None = None, bot_id: str | None = None) -> dict[str, Any]:
        """A `message` event (a DM when `channel_type` is `im`, a thread reply when `thread_ts` is given)."""
        ts = ts or self.next_ts()
        event: dict[str, Any] = {"type": "message", "text": text, "ts": ts, "channel": channel, "event_ts": ts,
                                 "channel_type": channel_type, "team": self.team_id}
        if user is not None:
            event["user"] = user
        if thread_ts:
            event["thread_ts"] = thread_ts
        if subtype:
            event["subtype"] = subtype
        if bot_id:
            event["bot_id"] = bot_id
        return event

    def reaction_added(self, reaction: str, *, user: str, channel: str, message_ts: str,
                       item_user: str | None = None) -> dict[str, Any]:
        """A `reaction_added` event on a message."""
        event_ts = self.next_ts()
        event = {"type": "reaction_added", "user": user, "reaction": reaction,
                 "item": {"type": "message", "channel": channel, "ts": message_ts}, "event_ts": event_ts}
        if item_user:
            event["item_user"] = item_user
        return event

    def assistant_thread(self, event_type: str, *, user: str, channel: str, thread_ts: str,
                         context_channel: str | None = None) -> dict[str, Any]:
        """An `assistant_thread_started` or `assistant_thread_context_changed` event for the DM thread `thread_ts`,
        with the channel the person is looking at as its context."""
        context: dict[str, Any] = {"team_id": self.team_id, "enterprise_id": None}
        if context_channel:
            context["channel_id"] = context_channel
        return {"type": event_type, "assistant_thread": {"user_id": user, "context": context, "channel_id": channel,
                                                         "thread_ts": thread_ts}, "event_ts": self.next_ts()}

    def block_action(self, action_id: str, value: str, *, user: str, channel: str, message_ts: str,
                     thread_ts: str | None = None, label: str = "Button", trigger_id: str | None = None,
                     element_type: str = "button", block_id: str = "deepthread_run",
                     ephemeral: bool = False) -> SlackRequest:
        """A `block_actions` payload for a button click on the bot's message (form field `payload`); `trigger_id` as
        the fake Web API issued it (`FakeSlack.views.issue_trigger_id`) when the bot is to open a modal with it. A
        click on an `ephemeral` message (a reply only the person saw) carries no `message`, only its container."""
        number = self.next_number()
        message: dict[str, Any] = {"type": "message", "user": self.bot_user_id, "bot_id": "B0BOT", "ts": message_ts,
                                   "text": "status", "team": self.team_id}
        container: dict[str, Any] = {"type": "message", "message_ts": message_ts, "channel_id": channel,
                                     "is_ephemeral": ephemeral}
        if thread_ts:
            message["thread_ts"] = thread_ts
            container["thread_ts"] = thread_ts
        payload: dict[str, Any] = {
            "type": "block_actions", "user": {"id": user, "username": user.lower(), "name": user.lower(), "team_id": self.team_id},
            "api_app_id": self.api_app_id, "token": VERIFICATION_TOKEN, "container": container,
            "trigger_id": trigger_id or f"{number}.{number}.trigger", "team": {"id": self.team_id, "domain": "fake-workspace"},
            "enterprise": None, "is_enterprise_install": False, "channel": {"id": channel, "name": "research"},
            "message": message, "state": {"values": {}}, "response_url": f"{self.response_url}/actions/{number}",
            "actions": [{"action_id": action_id, "block_id": block_id, "text": {"type": "plain_text", "text": label},
                         "value": value, "type": element_type, "action_ts": f"{time.time():.6f}"}],
        }
        if ephemeral:
            del payload["message"]
        return SlackRequest(body=urlencode({"payload": json.dumps(payload)}), content_type=FORM)

    def feedback_click(self, value: str, *, user: str, channel: str, message_ts: str, thread_ts: str | None = None,
                       trigger_id: str | None = None, action_id: str = "deepthread_feedback") -> SlackRequest:
        """A click on a `feedback_buttons` element: a `block_actions` whose action carries the clicked button's value."""
        return self.block_action(action_id, value, user=user, channel=channel, message_ts=message_ts, thread_ts=thread_ts,
                                 label="👎" if value.startswith("bad") else "👍", trigger_id=trigger_id,
                                 element_type="feedback_buttons")

    def view_submission(self, view: dict[str, Any], values: dict[str, dict[str, Choice]], *, user: str) -> SlackRequest:
        """A modal submitted: `view` as `views.open` answered it, the person's choices as {block_id: {action_id:
        choice}} (a text, a select's option value, checkboxes' option values, None for an input emptied); the inputs
        left alone keep their initial values, as Slack sends them (`submission_state`)."""
        number = self.next_number()
        payload = {
            "type": "view_submission", "team": {"id": self.team_id, "domain": "fake-workspace"},
            "user": {"id": user, "username": user.lower(), "name": user.lower(), "team_id": self.team_id},
            "api_app_id": self.api_app_id, "token": VERIFICATION_TOKEN, "trigger_id": f"{number}.{number}.trigger",
            "view": {**view, "state": submission_state(view, values)}, "response_urls": [], "is_enterprise_install": False,
            "enterprise": None,
        }
        return SlackRequest(body=urlencode({"payload": json.dumps(payload)}), content_type=FORM)

    # --- sending ---------------------------------------------------------------------------------

    def headers(self, request: SlackRequest, *, timestamp: int | None = None, retry_num: int | None = None,
                signature: str | None = None) -> dict[str, str]:
        """Slack's headers for `request`: content type, timestamp, signature (and the retry headers on a retry)."""
        timestamp = int(time.time()) if timestamp is None else timestamp
        headers = {
            "Content-Type": request.content_type,
            "X-Slack-Request-Timestamp": str(timestamp),
            "X-Slack-Signature": signature or sign_slack_request(self.signing_secret, request.body, timestamp),
            "User-Agent": "Slackbot 1.0 (+https://api.slack.com/robots)",
        }
        if retry_num is not None:
            headers["X-Slack-Retry-Num"] = str(retry_num)
            headers["X-Slack-Retry-Reason"] = "http_timeout"
        return headers

    def send(self, request: SlackRequest, *, timestamp: int | None = None, retry_num: int | None = None,
             signature: str | None = None) -> httpx.Response:
        """Post `request` signed (or with the given bad `signature`/old `timestamp`) over a kept-alive connection."""
        if self._client is None:
            self._client = httpx.Client(timeout=10.0)
        return self._client.post(self.url, content=request.body.encode("utf-8"),
                                 headers=self.headers(request, timestamp=timestamp, retry_num=retry_num, signature=signature))

    async def asend(self, client: httpx.AsyncClient, request: SlackRequest, *, timestamp: int | None = None,
                    retry_num: int | None = None, signature: str | None = None) -> httpx.Response:
        """`send` with the caller's async client."""
        return await client.post(self.url, content=request.body.encode("utf-8"),
                                 headers=self.headers(request, timestamp=timestamp, retry_num=retry_num, signature=signature))

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


@dataclass
class CaughtResponse:
    """One message the bot posted to a `response_url`."""

    path: str
    payload: dict[str, Any]
    at: float


class ResponseUrlCatcher(LoopbackFake):
    """A loopback server standing in for Slack's `response_url`s: records what the bot posts there and answers `ok`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._caught: list[CaughtResponse] = []
        self._server: LoopbackServer | None = None
        self.app = Starlette(routes=[Route("/{kind}/{number}", self._catch, methods=["POST"])])

    async def _catch(self, request: Request) -> Response:
        payload = json.loads(await request.body() or b"{}")
        with self._lock:
            self._caught.append(CaughtResponse(path=request.url.path, payload=payload, at=time.monotonic()))
        return PlainTextResponse("ok")


    def responses(self) -> list[CaughtResponse]:
        with self._lock:
            return list(self._caught)


class SocketModeSlack(FakeSlack):
    """The fake Slack Web API plus `apps.connections.open`, which answers the app token with `socket_url`."""

    def __init__(self, *, app_token: str = FAKE_APP_TOKEN, **options: Any) -> None:
        super().__init__(**options)
        self.app_token = app_token
        self.socket_url = ""
        self._handlers["apps.connections.open"] = self._connections_open

    def _token_error(self, request: Request, params: dict[str, Any]) -> str | None:
        authorization = request.headers.get("authorization", "")
        if authorization == f"Bearer {self.app_token}":
            params.pop("token", None)
            return None
        return super()._token_error(request, params)

    def _connections_open(self, params: dict[str, Any]) -> dict[str, Any]:
        if not self.socket_url:
            return {"ok": False, "error": "internal_error"}
        return {"ok": True, "url": self.socket_url}


class FakeSocketModeServer:
    """Slack's Socket Mode WebSocket on 127.0.0.1 (aiohttp): says hello, pushes envelopes, records the acks."""

    def __init__(self) -> None:
        self.port = free_port()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._socket: web.WebSocketResponse | None = None
        self._connected = threading.Event()
        self._lock = threading.Lock()
        self._acks: list[dict[str, Any]] = []

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/link"

    def start(self) -> "FakeSocketModeServer":
        ready = threading.Event()

        def serve() -> None:
            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(self._start_site())
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=serve, daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("fake Socket Mode server did not start")
        return self

    async def _start_site(self) -> None:
        app = web.Application()
        app.router.add_get("/link", self._link)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _link(self, request: web.Request) -> web.WebSocketResponse:
        socket = web.WebSocketResponse(autoping=True)
        await socket.prepare(request)
        self._socket = socket
        await socket.send_json({"type": "hello", "num_connections": 1, "debug_info": {"host": "fake"},
                                "connection_info": {"app_id": DEFAULT_APP}})
        self._connected.set()
        async for message in socket:
            if message.type == WSMsgType.TEXT:
                with self._lock:
                    self._acks.append(json.loads(message.data))
        return socket

    def wait_connected(self, timeout: float = 10.0) -> None:
        if not self._connected.wait(timeout):
            raise AssertionError("the bot did not connect to the Socket Mode server")

    def push(self, envelope: dict[str, Any]) -> None:
        """Send one envelope to the connected bot."""
        if self._loop is None or self._socket is None:
            raise RuntimeError("no bot is connected")
        asyncio.run_coroutine_threadsafe(self._socket.send_json(envelope), self._loop).result(5)

    def acks(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._acks)

    def stop(self) -> None:
        if self._loop is None:
            return

        async def shutdown() -> None:
            if self._socket is not None:
                await self._socket.close()
            if self._runner is not None:
                await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._loop = None

    def __enter__(self) -> "FakeSocketModeServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
