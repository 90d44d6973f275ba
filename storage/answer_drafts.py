"""An answer's draft while the model writes it, kept in Redis for the platforms that follow their runs themselves.

The worker has nothing to deliver to such a platform (the terminal reads its runs from the database), so the words of
a chat or follow-up answer reach it through one short-lived key per run, `deepthread:answer:{run_id}`, holding the
latest visible text. Both sides fail open: without Redis the answer simply appears whole when the run ends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import redis
import redis.asyncio

from storage.shared_limits import REDIS_ERRORS

logger = logging.getLogger(__name__)

# The reader polls about as often; more frequent writes would only be overwritten unread.
WRITE_INTERVAL_SECONDS = 0.2
# Refreshed by every write: long enough for any answer, short enough that abandoned drafts vanish.
DRAFT_TTL_SECONDS = 600

Sleep = Callable[[float], Awaitable[None]]


def answer_draft_key(run_id: int) -> str:
    """The Redis key holding run `run_id`'s answer draft."""
    return f"deepthread:answer:{run_id}"


class AnswerDraftWriter:
    """Keeps one run's latest visible answer in Redis, written at most every `interval` seconds; `show` never waits."""

    def __init__(self, redis_client: redis.asyncio.Redis, run_id: int, *, interval: float = WRITE_INTERVAL_SECONDS,
                 ttl_seconds: int = DRAFT_TTL_SECONDS, sleep: Sleep = asyncio.sleep) -> None:
        self.redis = redis_client
        self.key = answer_draft_key(run_id)
        self.interval = interval
        self.ttl_seconds = ttl_seconds
        self.sleep = sleep
        self._latest = ""
        self._changed = asyncio.Event()
        self._pump_task: asyncio.Task[None] | None = None
        self.failed = False

    def show(self, visible_text: str) -> None:
        """Make `visible_text` (the whole answer so far) the next draft written; call on the writer's event loop."""
        self._latest = visible_text
        self._changed.set()
        if self._pump_task is None and not self.failed:
            self._pump_task = asyncio.ensure_future(self._pump())

    async def close(self) -> None:
        """Stop writing (the stored answer replaces the draft; the key expires by itself)."""
        if self._pump_task is not None:
            self._pump_task.cancel()
            await asyncio.gather(self._pump_task, return_exceptions=True)

    async def _pump(self) -> None:
        while True:
            await self._changed.wait()
            self._changed.clear()
            try:
                await self.redis.set(self.key, self._latest.encode("utf-8"), ex=self.ttl_seconds)
            except REDIS_ERRORS as error:  # a draft is a courtesy: the answer is stored and shown whole anyway
                self.failed = True
                logger.info("stopped writing the answer draft (%s)", type(error).__name__)
                return
            await self.sleep(self.interval)


class AnswerDraftReader:
    """Reads runs' answer drafts; after a Redis error it reads no more, so a Redis that hangs slows nothing twice."""

    def __init__(self, redis_client: redis.Redis) -> None:
        self.redis = redis_client
        self.failed = False

    def __call__(self, run_id: int) -> str | None:
        """Run `run_id`'s latest draft, or None when there is none (yet) or Redis cannot be read (blocking)."""
        if self.failed:
            return None
        try:
            value = self.redis.get(answer_draft_key(run_id))
        except REDIS_ERRORS as error:
            self.failed = True
            logger.info("stopped reading answer drafts (%s)", type(error).__name__)
            return None
        if value is None:
            return None
        return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)
