"""`GET /healthz` and `GET /metrics` for a process: a small bounded server of its own (the worker, the Discord bot),
or Starlette endpoints for a process that already serves HTTP (the Slack app, which serves `/metrics` only when
SLACK_SERVE_METRICS asks).

`/healthz` answers 200 with each part `ok`, or 503 naming the failing parts; without checks it is liveness only.
It answers from the latest report of a `HealthMonitor` (one background check every few seconds), never by running
the checks itself. Every server listens on HTTP_BIND_ADDRESS (127.0.0.1 unless a deployment such as Compose opts
into 0.0.0.0 so that Prometheus and health checks reach it from other containers).
"""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest, make_wsgi_app
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from config.settings import setting_default
from ops.health import HEALTH_REFRESH_SECONDS, HealthChecker, HealthMonitor

logger = logging.getLogger(__name__)

HEALTH_PATH = "/healthz"
METRICS_PATH = "/metrics"
# How often the serving thread looks for a stop request (shutting down waits up to this long).
SHUTDOWN_POLL_SECONDS = 0.1
# The bounded server: this many threads answer, and this many accepted connections wait in line for one. While the
# line is full nothing more is accepted: further connections wait in the listening socket's backlog (the kernel's,
# no thread, no memory of ours), and past that the kernel turns them away until the line moves.
SERVER_THREADS = 4
WAITING_CONNECTIONS = 64
LISTEN_BACKLOG = 1024
# A connection that does not send its request within this long is dropped, so a silent client holds a thread briefly.
REQUEST_READ_TIMEOUT_SECONDS = 2.0

StartResponse = Callable[..., Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


def health_answer(health: HealthMonitor | None, *, wait_seconds: float = 0.0) -> tuple[int, dict[str, Any]]:
    """The status and JSON body of `/healthz`, from the monitor's latest report (waiting up to `wait_seconds` for the
    first one)."""
    if health is None:
        return 200, {"ok": True}
    report = health.latest(wait_seconds)
    return (200 if report.ok else 503), report.model_dump()


def ops_wsgi_app(health: HealthMonitor | None, registry: CollectorRegistry = REGISTRY) -> WSGIApp:
    """A WSGI app: `/healthz` from `health`, `/metrics` from `registry`, 404 for anything else."""
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == HEALTH_PATH:
            # A pool thread waits for the first report only (a few seconds after start); later answers are instant.
            wait = health.first_report_seconds if health is not None else 0.0
            status, body = health_answer(health, wait_seconds=wait)
            start_response(f"{status} {'OK' if status == 200 else 'Service Unavailable'}",
                           [("Content-Type", "application/json")])
            return [json.dumps(body).encode()]
        if path == METRICS_PATH:
            return metrics(environ, start_response)
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found: try /healthz or /metrics\n"]

    return app


class _QuietHandler(WSGIRequestHandler):
    timeout = REQUEST_READ_TIMEOUT_SECONDS

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  (the base class's name)
        pass  # a probe every few seconds is not worth a log line


class BoundedWSGIServer(WSGIServer):
    """A WSGI server answering from `threads` threads, with at most `waiting` accepted connections in line for them:
    never a thread a connection. The serving thread only accepts; while the line is full it stops accepting."""

    request_queue_size = LISTEN_BACKLOG

    def __init__(self, address: tuple[str, int], app: WSGIApp, *, threads: int = SERVER_THREADS,
                 waiting: int = WAITING_CONNECTIONS) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, _QuietHandler)
        self.set_app(app)
        self._line: queue.Queue[tuple[Any, Any]] = queue.Queue(maxsize=waiting)
        self._stopping = threading.Event()
        self._threads = [threading.Thread(target=self._answer_in_turn, name=f"deepthread-ops-http-{number}",
                                          daemon=True) for number in range(threads)]

    def start_threads(self) -> None:
        for thread in self._threads:
            thread.start()

    def process_request(self, request: Any, client_address: Any) -> None:
        # Called by the serving thread for each accepted connection: wait for room in the line (the listening
        # socket's backlog holds the next ones meanwhile), or drop it when the server is stopping.
        while not self._stopping.is_set():
            try:
                self._line.put((request, client_address), timeout=SHUTDOWN_POLL_SECONDS)
                return
            except queue.Full:
                continue
        self.shutdown_request(request)

    def _answer_in_turn(self) -> None:
        while not self._stopping.is_set():
            try:
                request, client_address = self._line.get(timeout=SHUTDOWN_POLL_SECONDS)
            except queue.Empty:
                continue
            try:
                self.finish_request(request, client_address)
            except Exception:  # a client that went silent or away: not worth a traceback on stderr
                logger.debug("ops server: a request from %s failed", client_address, exc_info=True)
            finally:
                self.shutdown_request(request)

    def stop_threads(self) -> None:
        """Stop the answering threads and close the connections still in line."""
        self._stopping.set()
        while True:
            try:
                request, _ = self._line.get_nowait()
            except queue.Empty:
                break
            self.shutdown_request(request)


class OpsServer:
    """`/healthz` and `/metrics` on `host`:`port` (0: a free port, read back from `port` once started), answered by a
    fixed pool of threads; `/healthz` from a `HealthMonitor` over `health` that starts and stops with the server."""

    def __init__(self, health: HealthChecker | None, *, port: int, host: str | None = None,
                 registry: CollectorRegistry = REGISTRY, threads: int = SERVER_THREADS,
                 waiting: int = WAITING_CONNECTIONS, refresh_seconds: float = HEALTH_REFRESH_SECONDS) -> None:
        self.health = HealthMonitor(health, interval_seconds=refresh_seconds) if health is not None else None
        bind = host if host is not None else setting_default("http_bind_address")
        self._server = BoundedWSGIServer((bind, port), ops_wsgi_app(self.health, registry), threads=threads,
                                         waiting=waiting)
        self._thread = threading.Thread(target=self._server.serve_forever, args=(SHUTDOWN_POLL_SECONDS,),
                                        name="deepthread-ops-http", daemon=True)

    @property
    def host(self) -> str:
        return str(self._server.server_address[0])

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> OpsServer:
        if self.health is not None:
            self.health.start()  # the first report is ready by the first probe, most likely
        self._server.start_threads()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, free the port and stop the health monitor."""
        self._server.stop_threads()
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()
        if self.health is not None:
            self.health.close()


def start_ops_server(port: int, health: HealthChecker | None, *, host: str | None = None,
                     registry: CollectorRegistry = REGISTRY, setting: str = "the port") -> OpsServer | None:
    """Serve `/healthz` and `/metrics` on `host` (HTTP_BIND_ADDRESS's default when None) and `port`; None when the
    port is 0 (off) or taken (logged: the process goes on without them)."""
    if port == 0:
        return None
    try:
        server = OpsServer(health, port=port, host=host, registry=registry).start()
    except OSError as error:
        logger.warning("cannot serve /healthz and /metrics on port %d (%s): set %s to a free port, or 0",
                       port, error.strerror or type(error).__name__, setting)
        if health is not None:
            health.close()
        return None
    logger.info("serving /healthz and /metrics on %s port %d", host or setting_default("http_bind_address"),
                server.port)
    return server


def starlette_health_endpoint(health: HealthMonitor | None) -> Callable[[Request], Any]:
    """`/healthz` for a Starlette app, from the monitor's latest report (its thread starts with the first probe; only
    a probe before the first report waits, in a thread, never on the event loop)."""
    async def healthz(request: Request) -> Response:
        if health is None or health.checked:
            status, body = health_answer(health)
        else:
            status, body = await asyncio.to_thread(health_answer, health, wait_seconds=health.first_report_seconds)
        return JSONResponse(body, status_code=status)
    return healthz


def starlette_metrics_endpoint(registry: CollectorRegistry = REGISTRY) -> Callable[[Request], Any]:
    """`/metrics` for a Starlette app, in Prometheus's text format."""
    async def metrics(request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
    return metrics
