"""`GET /healthz` and `GET /metrics` for a process: a small threaded server of its own (the worker, the Discord bot),
or two Starlette endpoints for a process that already serves HTTP (the Slack app).

`/healthz` answers 200 with each part `ok`, or 503 naming the failing parts; without checks it is liveness only.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest, make_wsgi_app
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ops.health import HealthChecker

logger = logging.getLogger(__name__)

HEALTH_PATH = "/healthz"
METRICS_PATH = "/metrics"
LISTEN_ON_EVERY_ADDRESS = "0.0.0.0"  # a scraper or an orchestrator reaches the process from outside its container
# How often the serving thread looks for a stop request (shutting down waits up to this long).
SHUTDOWN_POLL_SECONDS = 0.1

StartResponse = Callable[..., Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


def health_answer(health: HealthChecker | None) -> tuple[int, dict[str, Any]]:
    """The status and JSON body of `/healthz` (blocking while the checks run)."""
    if health is None:
        return 200, {"ok": True}
    report = health.check()
    return (200 if report.ok else 503), report.model_dump()


def ops_wsgi_app(health: HealthChecker | None, registry: CollectorRegistry = REGISTRY) -> WSGIApp:
    """A WSGI app: `/healthz` from `health`, `/metrics` from `registry`, 404 for anything else."""
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == HEALTH_PATH:
            status, body = health_answer(health)
            start_response(f"{status} {'OK' if status == 200 else 'Service Unavailable'}",
                           [("Content-Type", "application/json")])
            return [json.dumps(body).encode()]
        if path == METRICS_PATH:
            return metrics(environ, start_response)
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found: try /healthz or /metrics\n"]

    return app


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a probe still running never holds the process open at exit


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  (the base class's name)
        pass  # a probe every few seconds is not worth a log line


class OpsServer:
    """`/healthz` and `/metrics` on `port` (0: a free port, read back from `port` once started), from daemon threads."""

    def __init__(self, health: HealthChecker | None, *, port: int, host: str = LISTEN_ON_EVERY_ADDRESS,
                 registry: CollectorRegistry = REGISTRY) -> None:
        self._server = make_server(host, port, ops_wsgi_app(health, registry), _ThreadingWSGIServer, _QuietHandler)
        self._thread = threading.Thread(target=self._server.serve_forever, args=(SHUTDOWN_POLL_SECONDS,),
                                        name="deepthread-ops-http", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> OpsServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and free the port."""
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()


def start_ops_server(port: int, health: HealthChecker | None, *, registry: CollectorRegistry = REGISTRY,
                     host: str = LISTEN_ON_EVERY_ADDRESS, setting: str = "the port") -> OpsServer | None:
    """Serve `/healthz` and `/metrics` on `port`; None when the port is 0 (off) or taken (logged: the process goes
    on without them)."""
    if port == 0:
        return None
    try:
        server = OpsServer(health, port=port, host=host, registry=registry).start()
    except OSError as error:
        logger.warning("cannot serve /healthz and /metrics on port %d (%s): set %s to a free port, or 0",
                       port, error.strerror or type(error).__name__, setting)
        return None
    logger.info("serving /healthz and /metrics on port %d", server.port)
    return server


def starlette_health_endpoint(health: HealthChecker | None) -> Callable[[Request], Any]:
    """`/healthz` for a Starlette app: the checks run in a thread, never on the event loop."""
    async def healthz(request: Request) -> Response:
        status, body = await asyncio.to_thread(health_answer, health)
        return JSONResponse(body, status_code=status)
    return healthz


def starlette_metrics_endpoint(registry: CollectorRegistry = REGISTRY) -> Callable[[Request], Any]:
    """`/metrics` for a Starlette app, in Prometheus's text format."""
    async def metrics(request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
    return metrics
