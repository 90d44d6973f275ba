"""Connection pools that say when their callers wait for a connection (the Redis pools, built on `PoolWaits` too, are
in `storage.redis` and `storage.shared_limits`).

Every pool deepthread makes is bounded, and a call that finds every connection busy waits for one, up to a limit,
rather than opening more or failing at once: that is how a burst of runs takes turns. Waiting is normal under a
burst, so it is said at INFO, at most once every `SAY_EVERY_SECONDS` for a pool, with how many connections the pool
holds and how long the wait was; a wait that runs out is said at ERROR, and the pool's own error is raised.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.pool import QueuePool

logger = logging.getLogger(__name__)

# A wait shorter than this is a connection handed over from a caller that just finished: not worth a line.
NOTICEABLE_WAIT_SECONDS = 0.05
SAY_EVERY_SECONDS = 30.0


class PoolWaits:
    """What one pool says of its waits: a line at INFO at most every `SAY_EVERY_SECONDS`, with the waits since."""

    def __init__(self, pool: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.pool = pool
        self._clock = clock
        self._lock = threading.Lock()
        self._said_at: float | None = None
        self._unsaid = 0
        self._longest = 0.0

    def waited(self, seconds: float, capacity: int) -> None:
        """A caller waited `seconds` for one of the pool's `capacity` connections."""
        if seconds < NOTICEABLE_WAIT_SECONDS:
            return
        with self._lock:
            self._unsaid += 1
            self._longest = max(self._longest, seconds)
            now = self._clock()
            if self._said_at is not None and now - self._said_at < SAY_EVERY_SECONDS:
                return
            waits, longest = self._unsaid, self._longest
            self._said_at, self._unsaid, self._longest = now, 0, 0.0
        logger.info("all %d connections of the %s pool were busy: %d call(s) waited for one, the longest %.2f s",
                    capacity, self.pool, waits, longest)

    def gave_up(self, seconds: float, capacity: int) -> None:
        """A caller waited `seconds`, its limit, and got none of the pool's `capacity` connections."""
        logger.error("all %d connections of the %s pool stayed busy for %.0f s: a call gave up waiting for one",
                     capacity, self.pool, seconds)


class WaitSayingQueuePool(QueuePool):
    """SQLAlchemy's QueuePool (`pool_size` kept, `max_overflow` more, `timeout` to wait), saying when callers wait."""

    # SQLAlchemy names a pool's logger after its class's module: its own lines (DEBUG checkouts) stay under its name.
    _sqla_logger_namespace = "sqlalchemy.pool.impl.QueuePool"

    def __init__(self, creator: Any, **options: Any) -> None:
        super().__init__(creator, **options)
        self.waits = PoolWaits("database")

    def _capacity(self) -> int:
        return self.size() + max(self._max_overflow, 0)

    def _do_get(self) -> Any:
        full = self._max_overflow >= 0 and self.checkedout() >= self._capacity()
        started = time.monotonic()
        try:
            record = super()._do_get()
        except PoolTimeout:
            self.waits.gave_up(time.monotonic() - started, self._capacity())
            raise
        if full:
            self.waits.waited(time.monotonic() - started, self._capacity())
        return record

    def recreate(self) -> WaitSayingQueuePool:
        pool = super().recreate()
        assert isinstance(pool, WaitSayingQueuePool)
        pool.waits = self.waits
        return pool
