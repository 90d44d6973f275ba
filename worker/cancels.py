"""One watcher per worker process that turns cancel requests into cancelled runs.

The bot marks a run cancelled on its row, then in Redis when it can. Rather than each run polling
its own flag four times a second, one thread reads the flags of every run the process is executing
in one round trip and cancels the matching tokens, each in the event loop it belongs to. It also
reads the rows, every few polls (and at every poll while Redis cannot be read), so a cancel whose
flag never reached Redis, or that Redis lost, still arrives.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

import redis

from research.budget import CancelToken
from storage.admission import cancellers
from storage.db import Sessions
from storage.shared_limits import CANCEL_FLAG, read_cancel_flags

logger = logging.getLogger(__name__)

POLL_SECONDS = 0.25
# The rows are read every this many polls (once a second) while Redis answers.
ROWS_EVERY_POLLS = 4

ReadFlags = Callable[[list[int]], Mapping[int, str]]


def redis_flags(client: redis.Redis, key: str = CANCEL_FLAG) -> ReadFlags:
    """Who stopped each of the runs, from their Redis flags (one MGET); raises redis errors."""
    return lambda run_ids: read_cancel_flags(client, run_ids, key=key)


def row_flags(sessions: Sessions) -> ReadFlags:
    """Who stopped each of the runs, from their rows."""
    return functools.partial(cancellers, sessions)


class CancelWatcher:
    """Polls the cancel flags (Redis, and the run rows) of the runs being executed and cancels their tokens in their own loops."""

    def __init__(self, flags: ReadFlags, rows: ReadFlags, *, interval: float = POLL_SECONDS,
                 rows_every: int = ROWS_EVERY_POLLS) -> None:
        self._flags = flags
        self._rows = rows
        self._interval = interval
        self._rows_every = rows_every
        self._polls = 0
        self._redis_unreadable = False
        self._watched: dict[int, tuple[asyncio.AbstractEventLoop, CancelToken]] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    @contextmanager
    def watching(self, run_id: int, token: CancelToken) -> Iterator[CancelToken]:
        """Cancel `token` (from the running loop's thread) when someone stops run `run_id`, while in the block."""
        loop = asyncio.get_running_loop()
        with self._lock:
            self._watched[run_id] = (loop, token)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="deepthread-cancel-watcher", daemon=True)
                self._thread.start()
        try:
            yield token
        finally:
            with self._lock:
                if self._watched.get(run_id, (None, None))[1] is token:
                    del self._watched[run_id]

    def poll(self) -> None:
        """Read every watched run's flag once (and, every few polls, its row) and cancel the flagged ones."""
        with self._lock:
            watched = dict(self._watched)
        if not watched:
            return
        run_ids = sorted(watched)
        self._polls += 1
        stopped: dict[int, str] = {}
        try:
            stopped.update(self._flags(run_ids))
        except Exception:  # a flaky flag store must not blind the runs to cancels
            if not self._redis_unreadable:
                logger.warning("cancel flags unreadable in Redis; reading the run rows", exc_info=True)
            self._redis_unreadable = True
        else:
            self._redis_unreadable = False
        if self._redis_unreadable or self._polls % self._rows_every == 0:
            try:
                stopped = {**self._rows(run_ids), **stopped}
            except Exception:
                logger.warning("cancel flags unreadable in the database", exc_info=True)
        for run_id, by in stopped.items():
            loop, token = watched[run_id]
            if not token.cancelled:
                token.cancel_from_thread(loop, by)

    def stop(self) -> None:
        self._stopping.set()

    def _loop(self) -> None:
        while not self._stopping.wait(self._interval):
            self.poll()
