"""Running the Slack bot: Socket Mode when SLACK_APP_TOKEN is set, otherwise HTTP mode behind a public URL.

HTTP mode serves `POST /slack/events` (events, slash commands and interactivity all use this one Request URL; bolt
verifies each request's signature and timestamp) and `GET /healthz` with uvicorn, on HTTP_BIND_ADDRESS unless
`--host` says otherwise; `GET /metrics` too only with SLACK_SERVE_METRICS (the port is the public one). A body over
`MAX_BODY_BYTES` is answered 413 as soon as that is known (from Content-Length, else while reading), before any
signature check, so an unsigned sender cannot make the bot buffer a large body; a signed request seen before is refused
(see `dedupe.py`). Socket Mode opens a WebSocket from `apps.connections.open` (on SLACK_API_URL) and needs no public
URL; `/healthz` (and `/metrics` with SLACK_SERVE_METRICS) is still served for the orchestrator and Prometheus.

SIGTERM and SIGINT stop the bot cleanly (exit 0): the server winds down and the process exits through its clean-up,
as the last user of the embedded Redis must to stop it. uvicorn's own handling raised the signal again once it had
stopped, which ended the process by SIGTERM, past every exit hook.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import uvicorn
from prometheus_client import REGISTRY, CollectorRegistry
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.adapter.starlette.async_handler import AsyncSlackRequestHandler
from slack_bolt.async_app import AsyncApp
from slack_sdk.web.async_client import AsyncWebClient
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import Message, Receive

from bot.slack.app import ConversationHandler, build_slack_app
from bot.slack.bundle import missing_adapter_setting, web_client
from bot.slack.dedupe import EventDeduper, RedisEventDeduper, RedisReplayGuard, ReplayGuard, claims_client
from config import Settings
from ops.health import HealthChecker, HealthMonitor, process_health
from ops.server import HEALTH_PATH, METRICS_PATH, starlette_health_endpoint, starlette_metrics_endpoint
from storage.redis import resolve_redis_url

logger = logging.getLogger(__name__)

EVENTS_PATH = "/slack/events"
# Far above any real Slack payload (a slash command or a big block_actions body is tens of KiB).
MAX_BODY_BYTES = 1024 * 1024


async def body_within(request: Request, limit: int) -> bytes | None:
    """The request's body, or None as soon as it is known to be over `limit` bytes (the rest is never read)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            return None
    return bytes(body)


def replaying(body: bytes, receive: Receive) -> Receive:
    """A `receive` that hands over `body` (already read) first, then defers to the connection's own."""
    delivered = False

    async def receive_body() -> Message:
        nonlocal delivered
        if delivered:
            return await receive()
        delivered = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive_body


def build_http_app(app: AsyncApp | None, *, max_body_bytes: int = MAX_BODY_BYTES, health: HealthChecker | None = None,
                   registry: CollectorRegistry = REGISTRY, serve_metrics: bool = False) -> Starlette:
    """The ASGI app: `GET /healthz` (liveness only without `health`; from a `HealthMonitor`'s latest report, which
    stops with the app's lifespan), `GET /metrics` only with `serve_metrics`, and `POST /slack/events` into the bolt
    `app` when one is given (HTTP mode), bodies over `max_body_bytes` refused with 413."""
    monitor = HealthMonitor(health) if health is not None else None
    routes = [Route(HEALTH_PATH, starlette_health_endpoint(monitor), methods=["GET"])]
    if serve_metrics:
        routes.append(Route(METRICS_PATH, starlette_metrics_endpoint(registry), methods=["GET"]))
    if app is not None:
        handler = AsyncSlackRequestHandler(app)

        async def slack_events(request: Request) -> Response:
            body = await body_within(request, max_body_bytes)
            if body is None:
                logger.info("refused a request body over %d bytes", max_body_bytes)
                return PlainTextResponse("request body too large", status_code=413)
            return await handler.handle(Request(request.scope, receive=replaying(body, request.receive)))

        routes.append(Route(EVENTS_PATH, slack_events, methods=["POST"]))
        if app.oauth_flow is not None:  # OAuth installs: bolt's /slack/install and /slack/oauth_redirect
            for path in (app.oauth_flow.install_path, app.oauth_flow.redirect_uri_path):
                routes.append(Route(path, handler.handle, methods=["GET"]))

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if monitor is not None:
                monitor.close()

    return Starlette(routes=routes, lifespan=lifespan)


def slack_client(settings: Settings) -> AsyncWebClient:
    """The Web API client for SLACK_API_URL with SLACK_BOT_TOKEN; raises ValueError naming what is missing."""
    problem = missing_adapter_setting(settings)
    if problem is not None:
        raise ValueError(problem)
    return web_client(settings, settings.secret("slack_bot_token") or "")


class _Server(uvicorn.Server):
    """uvicorn's server without its signal handling (SlackBot.run has its own, see the module's docstring)."""

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class SlackBot:
    """The running bot: the bolt app behind Socket Mode (with an app token) or HTTP mode, `/healthz` either way."""

    def __init__(self, settings: Settings, core: ConversationHandler, *, client: AsyncWebClient | None = None,
                 dedupe: EventDeduper | None = None, replay_guard: ReplayGuard | None = None,
                 health: HealthChecker | None = None) -> None:
        self.client = client or slack_client(settings)
        if dedupe is None or replay_guard is None:
            claims = claims_client(resolve_redis_url(settings.redis_url, settings.data_dir))  # one client serves both
            dedupe = dedupe or RedisEventDeduper(claims)
            replay_guard = replay_guard or RedisReplayGuard(claims)
        self.dedupe = dedupe
        self.replay_guard = replay_guard
        self.app = build_slack_app(settings, core, client=self.client, dedupe=self.dedupe, replay_guard=self.replay_guard)
        self.app_token = settings.secret("slack_app_token")
        self.http_app = build_http_app(None if self.app_token else self.app, health=health,
                                       serve_metrics=settings.slack_serve_metrics)
        self.socket_mode: AsyncSocketModeHandler | None = None
        self._server: uvicorn.Server | None = None
        self._connecting: asyncio.Future[None] | None = None

    async def run(self, *, host: str, port: int) -> None:
        """Serve until `stop()` or a signal; in Socket Mode, connect to Slack first (slack-sdk retries until it can)."""
        # lifespan "on": the app's lifespan closes its health monitor (its thread, its database connection) at shutdown.
        config = uvicorn.Config(self.http_app, host=host, port=port, lifespan="on", access_log=False, log_config=None)
        self._server = _Server(config)
        stop_signals = (signal.SIGTERM, signal.SIGINT) if threading.current_thread() is threading.main_thread() else ()
        loop = asyncio.get_running_loop()
        for sent in stop_signals:
            loop.add_signal_handler(sent, self._stop_on, sent)
        try:
            if self.app_token is not None:
                # The Socket Mode client opens its aiohttp session on creation, so it is made inside the running loop.
                self.socket_mode = AsyncSocketModeHandler(self.app, self.app_token)
                self._connecting = asyncio.ensure_future(self.socket_mode.connect_async())
                try:
                    await self._connecting
                except asyncio.CancelledError:
                    if not self._server.should_exit:
                        raise
                else:
                    logger.info("slack bot connected in Socket Mode; /healthz on port %d", port)
            else:
                logger.info("slack bot serving HTTP mode: POST %s on port %d", EVENTS_PATH, port)
            await self._server.serve()
        finally:
            if self.socket_mode is not None:
                await self.socket_mode.close_async()
            for closable in (self.dedupe, self.replay_guard):  # a shared client's second close does nothing
                aclose = getattr(closable, "aclose", None)
                if aclose is not None:
                    await aclose()
            for sent in stop_signals:
                loop.remove_signal_handler(sent)
        logger.info("slack bot stopped")

    def _stop_on(self, sent: signal.Signals) -> None:
        logger.info("slack bot stopping (%s)", sent.name)
        self.stop()
        if self._connecting is not None:
            self._connecting.cancel()  # slack-sdk retries a connection for as long as Slack cannot be reached

    def stop(self) -> None:
        """Ask the server to shut down (safe from another thread)."""
        if self._server is not None:
            self._server.should_exit = True


def run(settings: Settings, core: ConversationHandler, *, host: str, port: int) -> None:
    """Run the bot with `core` in this process until interrupted (see `SlackBot`)."""
    health = process_health(settings, watch_workers=True)
    asyncio.run(SlackBot(settings, core, health=health).run(host=host, port=port))
