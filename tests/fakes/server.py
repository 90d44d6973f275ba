"""Run an ASGI app on 127.0.0.1 in a background thread, recording every request it receives."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import uvicorn

from tests.waiting import wait_for


@dataclass
class RecordedRequest:
    """One request as a fake server saw it."""

    method: str
    host: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    at: float = field(default_factory=time.monotonic)
    finished_at: float | None = None


class RequestLog:
    """Thread-safe list of recorded requests, shared by a fake and the test reading it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[RecordedRequest] = []

    def add(self, request: RecordedRequest) -> None:
        with self._lock:
            self._items.append(request)

    def all(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._items)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


ASGIApp = Callable[[dict[str, Any], Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]


async def read_body(receive: Callable[[], Awaitable[dict[str, Any]]]) -> bytes:
    """An ASGI request's whole body, however many messages it came in."""
    body = bytearray()
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return bytes(body)


def free_port() -> int:
    """Ask the kernel for a free TCP port on 127.0.0.1."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class LoopbackServer:
    """Serve `app` with uvicorn on 127.0.0.1 at a free port until `stop()`."""

    def __init__(self, app: ASGIApp, port: int | None = None) -> None:
        self.app = app
        self.port = port or free_port()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "LoopbackServer":
        config = uvicorn.Config(
            self.app, host="127.0.0.1", port=self.port, log_level="warning",
            lifespan="off", access_log=False, timeout_keep_alive=30,
        )
        self._server = uvicorn.Server(config)
        self._server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        self._thread = threading.Thread(target=lambda: asyncio.run(self._server.serve()), daemon=True)
        self._thread.start()
        wait_for(lambda: self._server.started or not self._thread.is_alive(), f"the fake server on port {self.port}",
                 10)
        if not self._server.started:
            raise RuntimeError(f"fake server on port {self.port} did not start")
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> "LoopbackServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class LoopbackFake:
    """Start, stop and `with` for a fake whose ASGI app is `self.app`, served on 127.0.0.1."""

    app: ASGIApp
    _server: LoopbackServer | None = None

    def start(self):  # type: ignore[no-untyped-def]
        self._server = LoopbackServer(self.app).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def __enter__(self):  # type: ignore[no-untyped-def]
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError(f"{type(self).__name__} is not started")
        return self._server.url
