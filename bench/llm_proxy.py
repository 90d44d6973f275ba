"""A loopback proxy in front of a real model server that records what deepthread sends it, for `bench/local_model.py`.

It forwards every request to the upstream server as it is (streamed answers streamed back chunk by chunk) and
notes, per chat-completions request: when it arrived, when the upstream answer ended, whether the client went away
before that (a timeout on deepthread's side), and a digest of its body. A request is *resent while busy* when the
same body arrives again while an earlier copy is still in the upstream's hands, or after deepthread abandoned an
earlier copy that the upstream had not finished: on a server that works on one request at a time, such a copy waits
behind the abandoned one.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.fakes.server import LoopbackServer, free_port, read_body


@dataclass
class ProxiedCall:
    """One chat-completions request through the proxy."""

    digest: str
    arrived: float
    finished: float | None = None
    abandoned: bool = False  # the client went away before the upstream's answer ended
    status: int | None = None


@dataclass
class ModelProxy:
    """Forwards `/v1/...` to `upstream` (a base URL ending in /v1) and records the chat calls."""

    upstream: str
    calls: list[ProxiedCall] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._server: LoopbackServer | None = None

    @property
    def base_url(self) -> str:
        assert self._server is not None, "start the proxy first"
        return f"{self._server.url}/v1"

    def start(self) -> "ModelProxy":
        self._server = LoopbackServer(self._app(), port=free_port()).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()

    def resent_while_busy(self) -> int:
        """Requests whose body was already sent and not yet answered, or abandoned before its answer ended."""
        with self._lock:
            calls = sorted(self.calls, key=lambda call: call.arrived)
        count = 0
        for index, call in enumerate(calls):
            earlier = [other for other in calls[:index] if other.digest == call.digest]
            if any(other.abandoned or other.finished is None or other.finished > call.arrived for other in earlier):
                count += 1
        return count

    def _app(self) -> Callable[..., Any]:
        root = self.upstream.rstrip("/").removesuffix("/v1")

        async def app(scope: dict[str, Any], receive: Callable[[], Any], send: Callable[[dict[str, Any]], Any]) -> None:
            if scope["type"] != "http":
                return
            body = await read_body(receive)
            call = None
            if scope["path"].endswith("/chat/completions"):
                call = ProxiedCall(digest=hashlib.sha256(body).hexdigest(), arrived=time.monotonic())
                with self._lock:
                    self.calls.append(call)
            headers = [(key.decode("latin-1"), value.decode("latin-1")) for key, value in scope["headers"]
                       if key.lower() not in (b"host", b"content-length")]
            url = root + scope["path"] + (("?" + scope["query_string"].decode()) if scope.get("query_string") else "")
            disconnected = asyncio.Event()

            async def watch() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                disconnected.set()

            watcher = asyncio.create_task(watch())
            try:
                async with httpx.AsyncClient(timeout=None) as client:
                    async with client.stream(scope["method"], url, content=body, headers=headers) as upstream:
                        if call is not None:
                            call.status = upstream.status_code
                        await send({"type": "http.response.start", "status": upstream.status_code,
                                    "headers": [(key.encode("latin-1"), value.encode("latin-1"))
                                                for key, value in upstream.headers.items()
                                                if key.lower() not in ("content-length", "transfer-encoding")]})
                        async for chunk in upstream.aiter_raw():
                            if disconnected.is_set():
                                break
                            await send({"type": "http.response.body", "body": chunk, "more_body": True})
                        if call is not None:
                            # Gone before the upstream's answer ended: the client gave up on a request in work.
                            call.abandoned = disconnected.is_set()
                        await send({"type": "http.response.body", "body": b"", "more_body": False})
            except (httpx.HTTPError, OSError):
                if call is not None and call.status is None:
                    call.status = 502
            finally:
                watcher.cancel()
                if call is not None:
                    call.finished = time.monotonic()
        return app
