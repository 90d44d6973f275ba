"""Retried Slack event deliveries, recognised by their `event_id` so that each event is handled once.

Slack redelivers an event (with `X-Slack-Retry-Num`) when it did not see our answer in three seconds; the retry carries
the same `event_id`. The first delivery claims the id with Redis `SET key 1 NX EX 3600` (atomic across every bot
process); later deliveries of that id find it claimed. Slack stops retrying well within the hour the claim lasts.

Replayed signed requests (slash commands, buttons) are recognised by their signature and timestamp, which together stand
for the exact request: the signature is an HMAC of the timestamp and the body. Slack never sends one command twice, so a
second sighting within the window is a replay. Claims go to Redis (`SET NX EX`) and to this process's memory as well, so
when Redis is down a replay to the same process is still refused (failing closed would refuse every command instead).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from typing import Protocol

import redis.asyncio
from redis.exceptions import RedisError

logger = logging.getLogger(__name__)

EVENT_KEY = "deepthread:slack:event:{event_id}"
CLAIM_SECONDS = 3600
REPLAY_KEY = "deepthread:slack:request:{fingerprint}"
# Bolt accepts a timestamp up to five minutes either side of its clock, so one signature stays usable for ten minutes.
REPLAY_WINDOW_SECONDS = 600


def claims_client(redis_url: str) -> redis.asyncio.Redis:
    """The Redis client the event deduper and the replay guard share (redis://, rediss:// or unix://)."""
    # Short timeouts: a stuck Redis must not hold the ack past Slack's 3 s (both checks then fall back).
    return redis.asyncio.Redis.from_url(redis_url, socket_timeout=0.5, socket_connect_timeout=0.5)


class EventDeduper(Protocol):
    """Tells the first delivery of an event from its retries."""

    async def first_delivery(self, event_id: str) -> bool:
        """Whether `event_id` is seen here for the first time (and claim it)."""
        ...


class RedisEventDeduper:
    """Claims event ids in Redis, shared by every bot process; when Redis is down it lets events through."""

    def __init__(self, client: redis.asyncio.Redis, *, claim_seconds: int = CLAIM_SECONDS) -> None:
        self.client = client
        self.claim_seconds = claim_seconds

    @classmethod
    def from_url(cls, redis_url: str, *, claim_seconds: int = CLAIM_SECONDS) -> "RedisEventDeduper":
        """A deduper on the Redis at `redis_url` (redis://, rediss:// or unix://)."""
        return cls(claims_client(redis_url), claim_seconds=claim_seconds)

    async def first_delivery(self, event_id: str) -> bool:
        """Whether `event_id` was not claimed yet (claiming it); True when Redis cannot answer."""
        try:
            claimed = await self.client.set(EVENT_KEY.format(event_id=event_id), b"1", nx=True, ex=self.claim_seconds)
        except RedisError as error:
            # Handling a retry twice is better than dropping an event that was never handled.
            logger.warning("event dedupe unavailable (%s); handling the event anyway", type(error).__name__)
            return True
        return bool(claimed)

    async def aclose(self) -> None:
        await self.client.aclose()


class MemoryEventDeduper:
    """Claims event ids in this process's memory, for tests and a single bot process."""

    def __init__(self, *, claim_seconds: float = CLAIM_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        self.claim_seconds = claim_seconds
        self.clock = clock
        self._claimed_until: dict[str, float] = {}

    async def first_delivery(self, event_id: str) -> bool:
        """Whether `event_id` was not claimed within the last `claim_seconds` (claiming it)."""
        now = self.clock()
        self._forget_expired(now)
        if event_id in self._claimed_until:
            return False
        self._claimed_until[event_id] = now + self.claim_seconds
        return True

    def _forget_expired(self, now: float) -> None:
        # Claims are stored in the order they were made and all last as long, so the expired ones come first.
        while self._claimed_until:
            oldest = next(iter(self._claimed_until))
            if self._claimed_until[oldest] > now:
                return
            del self._claimed_until[oldest]


def request_fingerprint(signature: str, timestamp: str) -> str:
    """A short stable name for one signed request: the SHA-256 of its timestamp and signature."""
    return hashlib.sha256(f"{timestamp}:{signature}".encode("utf-8")).hexdigest()


class ReplayGuard(Protocol):
    """Tells a signed request's first sighting from a replay of it."""

    async def first_sighting(self, fingerprint: str) -> bool:
        """Whether the request named `fingerprint` is seen for the first time within the window (and claim it)."""
        ...


class MemoryReplayGuard:
    """Claims request fingerprints in this process's memory for the replay window."""

    def __init__(self, *, window_seconds: float = REPLAY_WINDOW_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        self._claims = MemoryEventDeduper(claim_seconds=window_seconds, clock=clock)

    async def first_sighting(self, fingerprint: str) -> bool:
        """Whether `fingerprint` was not claimed within the window (claiming it)."""
        return await self._claims.first_delivery(fingerprint)


class RedisReplayGuard:
    """Claims request fingerprints in Redis, shared by every bot process, and in this process's memory as a fallback."""

    def __init__(self, client: redis.asyncio.Redis, *, window_seconds: int = REPLAY_WINDOW_SECONDS,
                 memory: MemoryReplayGuard | None = None) -> None:
        self.client = client
        self.window_seconds = window_seconds
        self.memory = memory or MemoryReplayGuard(window_seconds=window_seconds)

    @classmethod
    def from_url(cls, redis_url: str, *, window_seconds: int = REPLAY_WINDOW_SECONDS) -> "RedisReplayGuard":
        """A replay guard on the Redis at `redis_url` (redis://, rediss:// or unix://)."""
        return cls(claims_client(redis_url), window_seconds=window_seconds)

    async def first_sighting(self, fingerprint: str) -> bool:
        """Whether neither Redis nor this process saw `fingerprint` within the window (claiming it in both)."""
        first_here = await self.memory.first_sighting(fingerprint)
        try:
            claimed = await self.client.set(REPLAY_KEY.format(fingerprint=fingerprint), b"1", nx=True, ex=self.window_seconds)
        except RedisError as error:
            logger.warning("replay guard's Redis unavailable (%s); checking this process's memory only", type(error).__name__)
            return first_here
        return first_here and bool(claimed)

    async def aclose(self) -> None:
        await self.client.aclose()
