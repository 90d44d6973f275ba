"""The Gateway half of the fake Discord: a WebSocket at `/gateway` that speaks Discord's Gateway protocol (API v10).

`FakeDiscord` (tests/fakes/discord_api.py) mounts `FakeGateway.endpoint` next to its REST routes and is its host: it
owns the token, the application's privileged intents and the guild payloads. A connection goes as on Discord:

    client -> GET ws://127.0.0.1:PORT/gateway?v=10&encoding=json&compress=zlib-stream
    server -> HELLO (op 10)                     client -> HEARTBEAT (op 1) ... server -> HEARTBEAT_ACK (op 11)
    client -> IDENTIFY (op 2)                   server -> READY, GUILD_CREATE per guild (op 0, s = 1, 2, ...)
    server -> any dispatch from `FakeGateway.dispatch(...)`, filtered by the session's intents

Transport compression is Discord's: `compress=zlib-stream` sends binary frames from one zlib stream per connection,
each payload flushed with Z_SYNC_FLUSH (so it ends with 00 00 ff ff); `compress=zstd-stream` does the same with one
streaming zstandard compressor (only when the `zstandard` module is importable); without `compress`, text frames.
A session outlives its connection (unless the client closed it with 1000/1001), so RESUME (op 6) replays the missed
dispatches and then sends RESUMED.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import json
import secrets
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Protocol

from starlette.websockets import WebSocket, WebSocketDisconnect

try:
    import zstandard
except ImportError:  # pragma: no cover - depends on the environment
    zstandard = None

INTENT_GUILDS = 1 << 0
INTENT_GUILD_MEMBERS = 1 << 1
INTENT_GUILD_PRESENCES = 1 << 8
INTENT_GUILD_MESSAGES = 1 << 9
INTENT_GUILD_MESSAGE_REACTIONS = 1 << 10
INTENT_DIRECT_MESSAGES = 1 << 12
INTENT_DIRECT_MESSAGE_REACTIONS = 1 << 13
INTENT_MESSAGE_CONTENT = 1 << 15

OP_DISPATCH, OP_HEARTBEAT, OP_IDENTIFY, OP_PRESENCE_UPDATE, OP_VOICE_STATE_UPDATE = 0, 1, 2, 3, 4
OP_RESUME, OP_RECONNECT, OP_REQUEST_GUILD_MEMBERS, OP_INVALID_SESSION, OP_HELLO, OP_HEARTBEAT_ACK = 6, 7, 8, 9, 10, 11

CLOSE_UNKNOWN_ERROR = 4000
CLOSE_UNKNOWN_OPCODE = 4001
CLOSE_DECODE_ERROR = 4002
CLOSE_NOT_AUTHENTICATED = 4003
CLOSE_AUTHENTICATION_FAILED = 4004
CLOSE_ALREADY_AUTHENTICATED = 4005
CLOSE_INVALID_SHARD = 4010
CLOSE_INVALID_API_VERSION = 4012
CLOSE_INVALID_INTENTS = 4013
CLOSE_DISALLOWED_INTENTS = 4014

COMPRESSIONS = ("zlib-stream", "zstd-stream")
# Closing with these ends the session on Discord; any other close code leaves it resumable.
SESSION_ENDING_CLOSE_CODES = frozenset({1000, 1001})
CONTENT_FIELDS = {"content": "", "embeds": [], "attachments": [], "components": [], "poll": None}


class GatewayHost(Protocol):
    """What the gateway needs from the fake Discord it belongs to."""

    token: str
    heartbeat_interval: int
    changed: threading.Condition

    def privileged_intents_allowed(self) -> int: ...

    def ready_payload(self, session_id: str, shard: list[int] | None) -> dict[str, Any]: ...

    def guild_create_payloads(self) -> list[dict[str, Any]]: ...

    def guild_member_payloads(self, guild_id: int) -> list[dict[str, Any]]: ...


@dataclass
class GatewayClose:
    """A close frame queued behind the payloads sent before it."""

    code: int
    reason: str


@dataclass
class GatewayConnection:
    """One WebSocket connection to `/gateway`: its query, what it was sent and received, and how it ended."""

    id: int
    query: dict[str, str]
    compress: str | None
    opened_at: float
    heartbeats: int = 0
    heartbeat_acks: int = 0
    frames_sent: int = 0
    binary_frames_sent: int = 0
    identified: bool = False
    resumed: bool = False
    session_id: str | None = None
    close_code: int | None = None
    close_reason: str = ""
    closed_by: str | None = None
    _loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False)
    _queue: asyncio.Queue[dict[str, Any] | GatewayClose] | None = field(default=None, repr=False)

    @property
    def open(self) -> bool:
        return self.closed_by is None

    def enqueue(self, item: dict[str, Any] | GatewayClose) -> None:
        """Queue a payload or a close for the sender task; safe from any thread."""
        if self._loop is None or self._queue is None or self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._queue.put_nowait, item)


@dataclass
class GatewaySession:
    """A session started by IDENTIFY: its intents, its sequence and every dispatch sent in it (for RESUME)."""

    id: str
    intents: int
    shard: list[int] | None
    seq: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    connection: GatewayConnection | None = None


class TransportCompressor:
    """Discord's transport compression: one stream per connection, each payload flushed so it decodes on its own."""

    def __init__(self, kind: str | None) -> None:
        self.kind = kind
        self._zlib = zlib.compressobj() if kind == "zlib-stream" else None
        self._zstd = zstandard.ZstdCompressor().compressobj() if kind == "zstd-stream" and zstandard else None

    def frame(self, text: str) -> str | bytes:
        data = text.encode("utf-8")
        if self._zlib is not None:
            return self._zlib.compress(data) + self._zlib.flush(zlib.Z_SYNC_FLUSH)
        if self._zstd is not None:
            return self._zstd.compress(data) + self._zstd.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
        return text


def without_content(data: dict[str, Any]) -> dict[str, Any]:
    """A message payload as an app without the MESSAGE_CONTENT intent receives it: the content fields emptied."""
    stripped = copy.deepcopy(data)
    for name, empty in CONTENT_FIELDS.items():
        if name in stripped:
            stripped[name] = copy.copy(empty)
    return stripped


class FakeGateway:
    """Sessions and connections of the Gateway; `endpoint` is the starlette WebSocket route."""

    def __init__(self, host: GatewayHost) -> None:
        self._host = host
        self._lock = host.changed
        self._connections: list[GatewayConnection] = []
        self._sessions: dict[str, GatewaySession] = {}
        self._identify_payloads: list[dict[str, Any]] = []
        self._resume_payloads: list[dict[str, Any]] = []
        self._connection_ids = itertools.count(1)

    # --- reading what happened (thread-safe) -----------------------------------------------------

    def connections(self) -> list[GatewayConnection]:
        with self._lock:
            return list(self._connections)

    def identify_payloads(self) -> list[dict[str, Any]]:
        with self._lock:
            return [copy.deepcopy(payload) for payload in self._identify_payloads]

    def resume_payloads(self) -> list[dict[str, Any]]:
        with self._lock:
            return [copy.deepcopy(payload) for payload in self._resume_payloads]

    def live_sessions(self) -> list[GatewaySession]:
        """Sessions with an open, identified connection."""
        with self._lock:
            return [session for session in self._sessions.values()
                    if session.connection is not None and session.connection.open]

    # --- sending (thread-safe) -------------------------------------------------------------------

    def dispatch(self, event: str, data: dict[str, Any], *, intent: int = 0, content_gated: bool = False) -> int:
        """Send `event` to every session subscribed to `intent` (0: to all); returns how many sessions got it.

        With `content_gated`, sessions that did not ask for MESSAGE_CONTENT get the content fields emptied.
        """
        delivered = 0
        with self._lock:
            for session in list(self._sessions.values()):
                if intent and not session.intents & intent:
                    continue
                gated = content_gated and not session.intents & INTENT_MESSAGE_CONTENT
                self._emit(session, event, without_content(data) if gated else copy.deepcopy(data))
                delivered += 1
            self._lock.notify_all()
        return delivered

    def request_reconnect(self) -> None:
        """Send RECONNECT (op 7) on every open connection, as Discord does before moving a session."""
        with self._lock:
            for connection in self._connections:
                if connection.open:
                    connection.enqueue({"op": OP_RECONNECT, "d": None, "s": None, "t": None})

    def close_connections(self, code: int = CLOSE_UNKNOWN_ERROR, reason: str = "") -> None:
        """Close every open connection with `code` (sessions stay resumable)."""
        with self._lock:
            for connection in self._connections:
                if connection.open:
                    connection.enqueue(GatewayClose(code, reason))

    def _emit(self, session: GatewaySession, event: str, data: Any) -> None:
        session.seq += 1
        payload = {"op": OP_DISPATCH, "t": event, "s": session.seq, "d": data}
        session.history.append(payload)
        if session.connection is not None and session.connection.open:
            session.connection.enqueue(payload)

    # --- the WebSocket ---------------------------------------------------------------------------

    async def endpoint(self, websocket: WebSocket) -> None:
        query = dict(websocket.query_params)
        await websocket.accept()
        connection = GatewayConnection(id=next(self._connection_ids), query=query, compress=query.get("compress"),
                                       opened_at=time.monotonic(), _loop=asyncio.get_running_loop(),
                                       _queue=asyncio.Queue())
        with self._lock:
            self._connections.append(connection)
            self._lock.notify_all()
        sender = asyncio.create_task(self._send_loop(websocket, connection))
        problem = self._query_problem(query)
        connection.enqueue({"op": OP_HELLO, "d": {"heartbeat_interval": self._host.heartbeat_interval,
                                                  "_trace": ["[\"fake-gateway\",{\"micros\":0}]"]},
                            "s": None, "t": None})
        if problem is not None:
            connection.enqueue(problem)
        client_code: int | None = None
        try:
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    client_code = message.get("code")
                    break
                text = message.get("text")
                if text is None:
                    text = (message.get("bytes") or b"").decode("utf-8", "replace")
                with self._lock:
                    self._receive(connection, text)
                    self._lock.notify_all()
        except WebSocketDisconnect as disconnect:
            client_code = disconnect.code
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await sender
            with self._lock:
                self._connection_ended(connection, client_code)
                self._lock.notify_all()

    def _query_problem(self, query: dict[str, str]) -> GatewayClose | None:
        if query.get("v", "10") != "10":
            return GatewayClose(CLOSE_INVALID_API_VERSION, "Invalid API version.")
        if query.get("encoding", "json") != "json":
            return GatewayClose(CLOSE_DECODE_ERROR, "This fake speaks encoding=json only.")
        compress = query.get("compress")
        if compress is not None and (compress not in COMPRESSIONS or (compress == "zstd-stream" and zstandard is None)):
            return GatewayClose(CLOSE_UNKNOWN_ERROR, f"Unsupported compress={compress}.")
        return None

    async def _send_loop(self, websocket: WebSocket, connection: GatewayConnection) -> None:
        compressor = TransportCompressor(connection.compress)
        assert connection._queue is not None
        while True:
            item = await connection._queue.get()
            if isinstance(item, GatewayClose):
                with self._lock:
                    connection.close_code, connection.close_reason = item.code, item.reason
                    connection.closed_by = connection.closed_by or "server"
                    self._lock.notify_all()
                with contextlib.suppress(Exception):
                    await websocket.close(code=item.code, reason=item.reason)
                return
            frame = compressor.frame(json.dumps(item, separators=(",", ":"), ensure_ascii=False))
            try:
                if isinstance(frame, bytes):
                    await websocket.send_bytes(frame)
                else:
                    await websocket.send_text(frame)
            except (WebSocketDisconnect, RuntimeError, OSError):
                return
            with self._lock:
                connection.frames_sent += 1
                connection.binary_frames_sent += isinstance(frame, bytes)
                connection.heartbeat_acks += item.get("op") == OP_HEARTBEAT_ACK
                self._lock.notify_all()

    def _connection_ended(self, connection: GatewayConnection, client_code: int | None) -> None:
        if connection.closed_by is None:
            connection.closed_by, connection.close_code = "client", client_code
        session = self._sessions.get(connection.session_id or "")
        if session is None or session.connection is not connection:
            return
        session.connection = None
        if connection.closed_by == "client" and client_code in SESSION_ENDING_CLOSE_CODES:
            del self._sessions[session.id]

    # --- opcodes (called under the lock, on the server's loop) -----------------------------------

    def _receive(self, connection: GatewayConnection, text: str) -> None:
        if not connection.open:
            return
        try:
            payload = json.loads(text)
            op, data = payload["op"], payload.get("d")
        except (ValueError, TypeError, KeyError):
            connection.enqueue(GatewayClose(CLOSE_DECODE_ERROR, "Error while decoding payload."))
            return
        if op == OP_HEARTBEAT:
            connection.heartbeats += 1
            connection.enqueue({"op": OP_HEARTBEAT_ACK, "d": None, "s": None, "t": None})
        elif op == OP_IDENTIFY:
            self._identify(connection, data or {})
        elif op == OP_RESUME:
            self._resume(connection, data or {})
        elif connection.session_id is None:
            connection.enqueue(GatewayClose(CLOSE_NOT_AUTHENTICATED, "Not authenticated."))
        elif op == OP_REQUEST_GUILD_MEMBERS:
            self._member_chunk(connection, data or {})
        elif op not in (OP_PRESENCE_UPDATE, OP_VOICE_STATE_UPDATE):
            connection.enqueue(GatewayClose(CLOSE_UNKNOWN_OPCODE, "Unknown opcode."))

    def _identify(self, connection: GatewayConnection, data: dict[str, Any]) -> None:
        self._identify_payloads.append(copy.deepcopy(data))
        if connection.session_id is not None:
            connection.enqueue(GatewayClose(CLOSE_ALREADY_AUTHENTICATED, "Already authenticated."))
            return
        if data.get("token") != self._host.token:
            connection.enqueue(GatewayClose(CLOSE_AUTHENTICATION_FAILED, "Authentication failed."))
            return
        intents = data.get("intents")
        if not isinstance(intents, int) or intents < 0 or intents >= 1 << 26:
            connection.enqueue(GatewayClose(CLOSE_INVALID_INTENTS, "Invalid intent(s)."))
            return
        privileged = INTENT_GUILD_MEMBERS | INTENT_GUILD_PRESENCES | INTENT_MESSAGE_CONTENT
        if intents & privileged & ~self._host.privileged_intents_allowed():
            connection.enqueue(GatewayClose(CLOSE_DISALLOWED_INTENTS, "Disallowed intent(s)."))
            return
        shard = data.get("shard")
        if shard is not None and not (isinstance(shard, list) and len(shard) == 2 and 0 <= shard[0] < shard[1]):
            connection.enqueue(GatewayClose(CLOSE_INVALID_SHARD, "Invalid shard."))
            return
        session = GatewaySession(id=secrets.token_hex(16), intents=intents, shard=shard, connection=connection)
        self._sessions[session.id] = session
        connection.identified, connection.session_id = True, session.id
        self._emit(session, "READY", self._host.ready_payload(session.id, shard))
        if intents & INTENT_GUILDS:
            for guild in self._host.guild_create_payloads():
                self._emit(session, "GUILD_CREATE", guild)

    def _resume(self, connection: GatewayConnection, data: dict[str, Any]) -> None:
        self._resume_payloads.append(copy.deepcopy(data))
        if data.get("token") != self._host.token:
            connection.enqueue(GatewayClose(CLOSE_AUTHENTICATION_FAILED, "Authentication failed."))
            return
        session = self._sessions.get(str(data.get("session_id")))
        if session is None:
            connection.enqueue({"op": OP_INVALID_SESSION, "d": False, "s": None, "t": None})
            return
        if session.connection is not None and session.connection.open:
            session.connection.enqueue(GatewayClose(CLOSE_UNKNOWN_ERROR, "Session resumed elsewhere."))
        session.connection = connection
        connection.resumed, connection.session_id = True, session.id
        last_seen = data.get("seq") or 0
        for payload in session.history:
            if payload["s"] > last_seen:
                connection.enqueue(payload)
        self._emit(session, "RESUMED", {"_trace": ["[\"fake-gateway\",{\"micros\":0}]"]})

    def _member_chunk(self, connection: GatewayConnection, data: dict[str, Any]) -> None:
        session = self._sessions.get(connection.session_id or "")
        if session is None:
            return
        guild_ids = data.get("guild_id")
        for guild_id in guild_ids if isinstance(guild_ids, list) else [guild_ids]:
            members = self._host.guild_member_payloads(int(guild_id))
            wanted = {str(user_id) for user_id in data.get("user_ids") or []}
            if wanted:
                members = [member for member in members if member["user"]["id"] in wanted]
            chunk = {"guild_id": str(guild_id), "members": members, "chunk_index": 0, "chunk_count": 1,
                     "not_found": sorted(wanted - {member["user"]["id"] for member in members})}
            if data.get("nonce") is not None:
                chunk["nonce"] = data["nonce"]
            self._emit(session, "GUILD_MEMBERS_CHUNK", chunk)
