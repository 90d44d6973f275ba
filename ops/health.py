"""Is this process fit to serve? Its database, its Redis and, for the bots, a worker seen lately.

Each part is a blocking check run in a daemon thread of its own, all at once, and the answer comes
within `timeout_seconds` whatever hangs: a part that has not answered by then is failing (and is not
started again while its last check still hangs). Reasons name the part and the error's type only, so
no address or credential reaches a probe's output.

Probes never run the checks: a `HealthMonitor` runs them in one background thread every few seconds
and `/healthz` answers its latest report, so a flood of probes costs the database nothing. The
database part holds one connection at most, reused, and names itself `deepthread-health` in
`pg_stat_activity`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping

import redis
from pydantic import BaseModel
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

from config import Settings
from research.errors import DeepthreadError
from storage.db import make_engine, normalise_url
from storage.redis import connect, resolve_redis_url
from storage.shared_limits import live_workers

logger = logging.getLogger(__name__)

Clock = Callable[[], float]
PartCheck = Callable[[], None]  # returns when the part is healthy, raises when it is not
Closer = Callable[[], None]

HEALTH_TIMEOUT_SECONDS = 2.0
# How often the monitor runs the checks; a probe's answer is at most this old (plus a check's time).
HEALTH_REFRESH_SECONDS = 5.0
# The health check's connections, as PostgreSQL's pg_stat_activity shows them.
HEALTH_APPLICATION_NAME = "deepthread-health"
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
    """Checks every part at once and reports within `timeout_seconds`; `close()` releases what the parts hold
    (`closers`: the database engine, the Redis client)."""

    def __init__(self, parts: Mapping[str, PartCheck], *, timeout_seconds: float = HEALTH_TIMEOUT_SECONDS,
                 closers: Iterable[Closer] = ()) -> None:
        self.parts = dict(parts)
        self.timeout_seconds = timeout_seconds
        self._closers = list(closers)
        self._lock = threading.Lock()
        self._running: dict[str, threading.Thread] = {}

    def check(self) -> HealthReport:
        """Each part's state (blocking for at most about `timeout_seconds`: call from a thread in async code)."""
        answers: dict[str, str] = {}

        def run(name: str, check: PartCheck) -> None:
            answers[name] = _outcome(check)

        threads: dict[str, threading.Thread] = {}
        with self._lock:
            for name, check in self.parts.items():
                if (previous := self._running.get(name)) is not None and previous.is_alive():
                    continue  # still hung since an earlier check: one thread (and connection) a part at most
                thread = threading.Thread(target=run, args=(name, check), name=f"health-{name}", daemon=True)
                thread.start()
                threads[name] = self._running[name] = thread
        deadline = time.monotonic() + self.timeout_seconds
        for thread in threads.values():
            thread.join(max(0.0, deadline - time.monotonic()))
        # A part still busy past the deadline is hung; its thread is left to finish on its own.
        parts = {name: answers.get(name, f"no answer within {self.timeout_seconds:g} s") for name in self.parts}
        failing = [name for name, state in parts.items() if state != OK]
        return HealthReport(ok=not failing, parts=parts, failing=failing)

    def close(self) -> None:
        """Release the parts' connections (a later check opens them again)."""
        for closer in self._closers:
            try:
                closer()
            except Exception:  # closing is best effort: the process is stopping its health checks
                logger.debug("closing a health check's resource failed", exc_info=True)


class HealthMonitor:
    """The latest report of `checker`, refreshed by one background thread every `interval_seconds`.

    A probe reads the report and never runs a check, so any number of probes cost one check every few seconds:
    one database connection at most, reused. The thread starts with `start()` or the first `latest()`.
    """

    def __init__(self, checker: HealthChecker, *, interval_seconds: float = HEALTH_REFRESH_SECONDS) -> None:
        self.checker = checker
        self.interval_seconds = interval_seconds
        self._latest: HealthReport | None = None
        self._checked = threading.Event()
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def checked(self) -> bool:
        """Whether a report is in (until then `latest()` may wait for the first one)."""
        return self._checked.is_set()

    @property
    def first_report_seconds(self) -> float:
        """How long the first check may take: a probe before it waits this long at most."""
        return self.checker.timeout_seconds + 1.0

    def start(self) -> HealthMonitor:
        with self._lock:
            if self._thread is None and not self._stopping.is_set():
                self._thread = threading.Thread(target=self._refresh, name="deepthread-health", daemon=True)
                self._thread.start()
        return self

    def latest(self, wait_seconds: float = 0.0) -> HealthReport:
        """The latest report; before the first one, wait up to `wait_seconds` for it, then report every part as
        not checked yet."""
        self.start()
        if wait_seconds > 0:
            self._checked.wait(wait_seconds)
        report = self._latest
        if report is not None:
            return report
        parts = {name: "not checked yet" for name in self.checker.parts}
        return HealthReport(ok=False, parts=parts, failing=list(parts))

    def close(self) -> None:
        """Stop refreshing; the thread releases the checker's connections as it ends (at once if it never ran)."""
        with self._lock:
            self._stopping.set()
            running = self._thread is not None
        if not running:
            self.checker.close()

    def _refresh(self) -> None:
        try:
            while not self._stopping.is_set():
                self._latest = self.checker.check()
                self._checked.set()
                self._stopping.wait(self.interval_seconds)
        finally:
            self.checker.close()


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
    """An engine for health checks only: one connection at most, kept between checks and tested before each
    (a lost one is replaced), connecting within 2 s, named `HEALTH_APPLICATION_NAME` on PostgreSQL."""
    url = normalise_url(database_url)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database in (None, "", ":memory:"):
        return make_engine(url)  # one shared connection already
    options: dict[str, object] = {"pool_size": 1, "max_overflow": 0, "pool_timeout": HEALTH_TIMEOUT_SECONDS,
                                  "pool_pre_ping": True}
    if parsed.get_backend_name() == "postgresql":
        options["connect_args"] = {"connect_timeout": DATABASE_CONNECT_TIMEOUT_SECONDS,
                                   "application_name": HEALTH_APPLICATION_NAME}
    return make_engine(url, **options)


def process_health(settings: Settings, *, watch_workers: bool, redis_url: str | None = None) -> HealthChecker:
    """The checks of a deepthread process: database and Redis, and with `watch_workers` (the bots) a live worker."""
    client = connect(redis_url or resolve_redis_url(settings.redis_url, settings.data_dir), fail_fast=True)
    engine = health_engine(settings.database_url)
    parts: dict[str, PartCheck] = {"database": database_check(engine), "redis": redis_check(client)}
    if watch_workers:
        parts["worker_heartbeat"] = WorkerHeartbeatCheck(client)
    return HealthChecker(parts, closers=(engine.dispose, client.close))
