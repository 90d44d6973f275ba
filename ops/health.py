"""Is this process fit to serve? Its database, its Redis and, for the bots, a worker seen lately.

Each part is a blocking check run in a daemon thread of its own, all at once, and the answer comes
within `timeout_seconds` whatever hangs: a part that has not answered by then is failing. Reasons
name the part and the error's type only, so no address or credential reaches a probe's output.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

import redis
from pydantic import BaseModel
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from config import Settings
from research.errors import DeepthreadError
from storage.db import make_engine, normalise_url
from storage.redis import connect, resolve_redis_url
from storage.shared_limits import live_workers

Clock = Callable[[], float]
PartCheck = Callable[[], None]  # returns when the part is healthy, raises when it is not

HEALTH_TIMEOUT_SECONDS = 2.0
# A bot is healthy while some worker beat within this long (the worker beats every two seconds).
WORKER_SEEN_WITHIN_SECONDS = 60.0
DATABASE_CONNECT_TIMEOUT_SECONDS = 2
OK = "ok"


class HealthProblem(DeepthreadError):
    """A part answered, and is not fit (its message is the reason, shown as is)."""


class HealthReport(BaseModel):
    """Each part checked, `ok` or why not; `failing` names the parts that are not."""

    ok: bool
    parts: dict[str, str]
    failing: list[str]


class HealthChecker:
    """Checks every part at once and reports within `timeout_seconds`."""

    def __init__(self, parts: Mapping[str, PartCheck], *, timeout_seconds: float = HEALTH_TIMEOUT_SECONDS) -> None:
        self.parts = dict(parts)
        self.timeout_seconds = timeout_seconds

    def check(self) -> HealthReport:
        """Each part's state (blocking for at most about `timeout_seconds`: call from a thread in async code)."""
        answers: dict[str, str] = {}

        def run(name: str, check: PartCheck) -> None:
            answers[name] = _outcome(check)

        threads = {name: threading.Thread(target=run, args=(name, check), name=f"health-{name}", daemon=True)
                   for name, check in self.parts.items()}
        for thread in threads.values():
            thread.start()
        deadline = time.monotonic() + self.timeout_seconds
        for thread in threads.values():
            thread.join(max(0.0, deadline - time.monotonic()))
        # A part still busy past the deadline is hung; its thread is left to finish on its own.
        parts = {name: answers.get(name, f"no answer within {self.timeout_seconds:g} s") for name in self.parts}
        failing = [name for name, state in parts.items() if state != OK]
        return HealthReport(ok=not failing, parts=parts, failing=failing)


def _outcome(check: PartCheck) -> str:
    try:
        check()
    except HealthProblem as problem:
        return str(problem)
    except Exception as error:
        return f"unreachable ({type(error).__name__})"
    return OK


def database_check(engine: Engine) -> PartCheck:
    """`SELECT 1` on a connection of `engine`."""
    def check() -> None:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    return check


def redis_check(client: redis.Redis) -> PartCheck:
    """`PING` (the client should give up within a second: `storage.redis.connect(url, fail_fast=True)`)."""
    def check() -> None:
        client.ping()
    return check


class WorkerHeartbeatCheck:
    """Healthy while some worker's heartbeat was seen within `within_seconds` (by this check, or in Redis now)."""

    def __init__(self, client: redis.Redis, *, within_seconds: float = WORKER_SEEN_WITHIN_SECONDS,
                 clock: Clock = time.monotonic) -> None:
        self.client = client
        self.within_seconds = within_seconds
        self._clock = clock
        self._last_seen: float | None = None

    def __call__(self) -> None:
        try:
            alive = bool(live_workers(self.client))
        except redis.RedisError:
            alive = False  # Redis is reported on its own; the heartbeat counts on what was seen before
        now = self._clock()
        if alive:
            self._last_seen = now
            return
        if self._last_seen is None or now - self._last_seen > self.within_seconds:
            raise HealthProblem(f"no worker heartbeat in the last {self.within_seconds:g} s")


def health_engine(database_url: str) -> Engine:
    """An engine for health checks only: a fresh connection a check (none held between probes), connecting within 2 s."""
    url = normalise_url(database_url)
    options: dict[str, object] = {"poolclass": NullPool}
    if make_url(url).get_backend_name() == "postgresql":
        options["connect_args"] = {"connect_timeout": DATABASE_CONNECT_TIMEOUT_SECONDS}
    return make_engine(url, **options)


def process_health(settings: Settings, *, watch_workers: bool, redis_url: str | None = None) -> HealthChecker:
    """The checks of a deepthread process: database and Redis, and with `watch_workers` (the bots) a live worker."""
    client = connect(redis_url or resolve_redis_url(settings.redis_url, settings.data_dir), fail_fast=True)
    parts: dict[str, PartCheck] = {"database": database_check(health_engine(settings.database_url)),
                                   "redis": redis_check(client)}
    if watch_workers:
        parts["worker_heartbeat"] = WorkerHeartbeatCheck(client)
    return HealthChecker(parts)
