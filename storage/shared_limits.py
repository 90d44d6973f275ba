"""Limits shared by every worker through Redis: rate limiters, circuit breakers, the status-edit bucket, cancel flags, locks.

Every script reads the Redis server's own clock (`TIME`), so processes on machines whose clocks
disagree still share one timeline; a limiter, breaker or bucket given a `clock` (tests) passes its
time to the scripts instead.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal, cast, overload

import redis
import redis.asyncio
import redis.asyncio.lock
import redis.lock
from redis.backoff import ExponentialBackoff
from redis.driver_info import DriverInfo
from redis.retry import Retry

from storage.pools import PoolWaits
from storage.redis import DEFAULT_MAX_CONNECTIONS, POOL_WAIT_SECONDS, SOCKET_TIMEOUT_SECONDS, client_options

logger = logging.getLogger(__name__)

BreakerState = Literal["closed", "open", "half_open"]
Sleep = Callable[[float], Awaitable[None]]
Clock = Callable[[], float]

MICROSECONDS = 1_000_000
ONE_DAY_SECONDS = 24 * 60 * 60

# Shared prelude: `now` is ARGV[1] (µs) when given, else the server's time in microseconds; `as_integer` writes
# numbers without exponent notation.
_PRELUDE = """
local now = tonumber(ARGV[1])
if not now then
  local server_time = redis.call('TIME')
  now = tonumber(server_time[1]) * 1000000 + tonumber(server_time[2])
end
local function as_integer(value) return string.format('%.0f', value) end
"""

# KEYS[1]: the key's next free slot; ARGV: now, interval (µs). Returns how long the caller waits for its slot (µs).
_RESERVE_SLOT = _PRELUDE + """
local interval = tonumber(ARGV[2])
local slot = math.max(now, tonumber(redis.call('GET', KEYS[1]) or now))
local following = slot + interval
redis.call('SET', KEYS[1], as_integer(following), 'PX', math.ceil((following - now) / 1000) + 1000)
return slot - now
"""

# KEYS[1]: the circuit hash; ARGV: now, cool-down (µs). Returns 1 when a call may go ahead.
_BREAKER_ALLOW = _PRELUDE + """
local cooldown = tonumber(ARGV[2])
local state = redis.call('HGET', KEYS[1], 'state') or 'closed'
if state == 'closed' then return 1 end
if state == 'open' then
  local opened_at = tonumber(redis.call('HGET', KEYS[1], 'opened_at') or '0')
  if now - opened_at < cooldown then return 0 end
  redis.call('HSET', KEYS[1], 'state', 'half_open', 'probe_at', as_integer(now))
  return 1
end
-- Half-open allows one probe; a probe whose worker died is given up after another cool-down.
local probe_at = tonumber(redis.call('HGET', KEYS[1], 'probe_at') or '0')
if now - probe_at < cooldown then return 0 end
redis.call('HSET', KEYS[1], 'probe_at', as_integer(now))
return 1
"""

# KEYS[1]: the circuit hash; ARGV: now, failure threshold, time to keep the hash (ms). Returns the state after the failure.
_BREAKER_FAILURE = _PRELUDE + """
local failures = redis.call('HINCRBY', KEYS[1], 'failures', 1)
local state = redis.call('HGET', KEYS[1], 'state') or 'closed'
if state == 'half_open' or failures >= tonumber(ARGV[2]) then
  state = 'open'
  redis.call('HSET', KEYS[1], 'state', 'open', 'opened_at', as_integer(now), 'probe_at', '0')
else
  redis.call('HSET', KEYS[1], 'state', state)
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return state
"""

# KEYS[1]: the circuit hash; ARGV: now, cool-down (µs). Returns the state as of now (open past its cool-down reads half-open).
_BREAKER_STATE = _PRELUDE + """
local state = redis.call('HGET', KEYS[1], 'state') or 'closed'
if state == 'open' then
  local opened_at = tonumber(redis.call('HGET', KEYS[1], 'opened_at') or '0')
  if now - opened_at >= tonumber(ARGV[2]) then return 'half_open' end
end
return state
"""

# KEYS[1]: the bucket hash; ARGV: now, capacity, tokens per second, tokens needed, 1 to take one (0 to only ask).
# Returns {1 if granted, µs until the tokens needed are there}.
_BUCKET_TAKE = _PRELUDE + """
local capacity = tonumber(ARGV[2])
local rate = tonumber(ARGV[3])
local needed = tonumber(ARGV[4])
local tokens = tonumber(redis.call('HGET', KEYS[1], 'tokens') or capacity)
local updated = tonumber(redis.call('HGET', KEYS[1], 'updated') or now)
tokens = math.min(capacity, tokens + math.max(0, now - updated) / 1000000 * rate)
local granted = 0
local wait = 0
if tokens >= needed then
  if ARGV[5] == '1' then
    tokens = tokens - 1
    granted = 1
  end
else
  wait = math.ceil((needed - tokens) / rate * 1000000)
end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.6f', tokens), 'updated', as_integer(now))
-- A full bucket reads the same as a missing one, so the hash may expire once it would be full again.
redis.call('PEXPIRE', KEYS[1], math.ceil((capacity - tokens) / rate * 1000) + 1000)
return {granted, wait}
"""


# What a Redis outage raises: redis-py's errors (connection, timeout, no pooled connection) and the OS's.
REDIS_ERRORS = (redis.RedisError, OSError)
@functools.cache
def _driver_info() -> DriverInfo:
    # Made once: by default every new connection reads redis-py's version from the installed package's metadata
    # (a directory scan), on the event loop, which a burst of runs opening connections pays hundreds of times.
    return DriverInfo()


class WaitSayingAsyncRedisPool(redis.asyncio.BlockingConnectionPool):
    """redis-py's asyncio blocking pool (`max_connections`, `timeout` to wait), saying when callers wait."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.waits = PoolWaits("Redis")

    async def get_connection(self, *args: Any, **options: Any) -> Any:
        full = not self.can_get_connection()
        started = time.monotonic()
        try:
            connection = await super().get_connection(*args, **options)
        except redis.ConnectionError:
            if full and time.monotonic() - started >= (self.timeout or 0):
                self.waits.gave_up(time.monotonic() - started, self.max_connections)
            raise
        if full:
            self.waits.waited(time.monotonic() - started, self.max_connections)
        return connection


def connect_async(redis_url: str, *, max_connections: int = DEFAULT_MAX_CONNECTIONS,
                  socket_timeout: float = SOCKET_TIMEOUT_SECONDS) -> redis.asyncio.Redis:
    """An asyncio client for `redis_url` (redis://, rediss:// or unix://) with at most `max_connections`
    connections, giving up on a silent server after `socket_timeout` seconds; a call finding every connection
    busy waits for one (up to POOL_WAIT_SECONDS) instead of failing."""
    pool = WaitSayingAsyncRedisPool.from_url(
        redis_url, decode_responses=False, max_connections=max_connections, timeout=POOL_WAIT_SECONDS,
        retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 1), driver_info=_driver_info(),
        **client_options(socket_timeout=socket_timeout))
    return redis.asyncio.Redis.from_pool(pool)


class RedisOutage:
    """Says once, at WARNING, that Redis is unreachable and the shared limits let calls through, and once that it is back."""

    def __init__(self) -> None:
        self._down = False
        self._lock = threading.Lock()

    @property
    def down(self) -> bool:
        return self._down

    def failed(self, what: str, error: BaseException) -> None:
        with self._lock:
            first, self._down = not self._down, True
        if first:
            logger.warning("Redis unreachable (%s: %s); rate limits and circuit breakers let calls through until it "
                           "is back", what, type(error).__name__)

    def answered(self) -> None:
        with self._lock:
            was_down, self._down = self._down, False
        if was_down:
            logger.warning("Redis reachable again; rate limits and circuit breakers apply again")


# One per process: every run's limiter and breaker report the same outage once.
REDIS_OUTAGE = RedisOutage()


def script_now(clock: Clock | None) -> str:
    """The `now` argument of a script: `clock`'s time in microseconds, or empty for the Redis server's own clock."""
    return "" if clock is None else str(round(clock() * MICROSECONDS))


class RedisRateLimiter:
    """A per-key minimum interval between calls, held across every process sharing the Redis server.

    Satisfies `research.limits.RateLimiter`; keys without an interval are not limited.
    """

    def __init__(
        self,
        redis_client: redis.asyncio.Redis,
        intervals: Mapping[str, float],
        *,
        default_interval: float = 0.0,
        prefix: str = "deepthread:rate:",
        sleep: Sleep = asyncio.sleep,
        outage: RedisOutage = REDIS_OUTAGE,
        # None: the Redis server's clock, which every worker shares even when the machines' clocks disagree.
        clock: Clock | None = None,
    ) -> None:
        self._intervals = dict(intervals)
        self._clock = clock
        self._outage = outage
        self._default_interval = default_interval
        self._prefix = prefix
        self._sleep = sleep
        self._reserve_slot = redis_client.register_script(_RESERVE_SLOT)

    def interval_for(self, key: str) -> float:
        """The minimum number of seconds between two calls under `key`."""
        return self._intervals.get(key, self._default_interval)

    async def acquire(self, key: str) -> None:
        """Reserve the next free slot for `key` in Redis and wait until it comes; with Redis unreachable, go at once."""
        interval = self.interval_for(key)
        if interval <= 0:
            return
        try:
            wait_microseconds = await self._reserve_slot(keys=[self._prefix + key],
                                                         args=[script_now(self._clock), round(interval * MICROSECONDS)])
        except REDIS_ERRORS as error:
            self._outage.failed("rate limiter", error)
            return
        self._outage.answered()
        if int(wait_microseconds) > 0:
            await self._sleep(int(wait_microseconds) / MICROSECONDS)


class RedisCircuitBreaker:
    """Closed, open after `failure_threshold` consecutive failures, half-open (one probe) after `cooldown` seconds, closed on success; shared by every process.

    Satisfies `research.limits.CircuitBreaker`.
    """

    def __init__(
        self,
        redis_client: redis.asyncio.Redis,
        *,
        failure_threshold: int = 3,
        cooldown: float = 60.0,
        prefix: str = "deepthread:breaker:",
        outage: RedisOutage = REDIS_OUTAGE,
        # None: the Redis server's clock, which every worker shares even when the machines' clocks disagree.
        clock: Clock | None = None,
    ) -> None:
        if failure_threshold < 1:
            raise ValueError("failure_threshold must be at least 1")
        self._redis = redis_client
        self._clock = clock
        self._outage = outage
        self._failure_threshold = failure_threshold
        self._cooldown_microseconds = round(cooldown * MICROSECONDS)
        # Consecutive failures are forgotten after a quiet day (or two cool-downs, if longer).
        self._keep_milliseconds = max(ONE_DAY_SECONDS * 1000, round(cooldown * 2000))
        self._prefix = prefix
        self._allow = redis_client.register_script(_BREAKER_ALLOW)
        self._failure = redis_client.register_script(_BREAKER_FAILURE)
        self._state = redis_client.register_script(_BREAKER_STATE)

    async def state(self, key: str) -> BreakerState:
        """The circuit's state for `key` as of now (an open circuit past its cool-down reads half-open; closed while Redis is unreachable)."""
        state = await self._fail_open("state", self._state(keys=[self._prefix + key],
                                                              args=[script_now(self._clock), self._cooldown_microseconds]))
        if not isinstance(state, (bytes, str)):  # None: Redis could not be reached
            return "closed"
        return cast(BreakerState, _as_text(state))

    async def allow(self, key: str) -> bool:
        """Allow calls while closed, and a single probe (across all processes) once an open circuit has cooled down;
        allow every call while Redis is unreachable."""
        allowed = await self._fail_open("allow", self._allow(keys=[self._prefix + key],
                                                              args=[script_now(self._clock), self._cooldown_microseconds]))
        return True if allowed is None else bool(allowed)

    async def record_success(self, key: str) -> None:
        """Close the circuit and forget earlier failures."""
        await self._fail_open("record_success", self._redis.delete(self._prefix + key))

    async def record_failure(self, key: str) -> None:
        """Count a failure; open the circuit at the threshold, or again at once after a failed probe."""
        await self._fail_open("record_failure", self._failure(keys=[self._prefix + key],
                                                             args=[script_now(self._clock), self._failure_threshold,
                                                                   self._keep_milliseconds]))

    async def _fail_open(self, what: str, call: Awaitable[object]) -> object | None:
        """The call's answer, or None when Redis could not be reached (noted once per outage)."""
        try:
            answer = await call
        except REDIS_ERRORS as error:
            self._outage.failed(f"circuit breaker {what}", error)
            return None
        self._outage.answered()
        return answer


class EditBucketRules:
    """What every edit bucket shares: `capacity` tokens refilled at `capacity` per `per_seconds`, and a reserve
    (`reserve_fraction` of capacity) that only priority edits may take; raises ValueError for bad values."""

    def __init__(self, *, capacity: int, per_seconds: float, reserve_fraction: float) -> None:
        if capacity < 1 or per_seconds <= 0:
            raise ValueError("capacity must be at least 1 and per_seconds positive")
        if not 0 <= reserve_fraction < 1:
            raise ValueError("reserve_fraction must be in [0, 1)")
        self.capacity = capacity
        self.per_seconds = per_seconds
        self.reserve = capacity * reserve_fraction

    @property
    def tokens_per_second(self) -> float:
        return self.capacity / self.per_seconds

    def _tokens_needed(self, priority: bool) -> float:
        return 1.0 if priority else self.reserve + 1.0


class EditBucket(EditBucketRules):
    """A per-workspace token bucket in Redis for status edits, shared by every worker; phase changes get a reserve.

    Holds `capacity` tokens, refilled at `capacity` per `per_seconds`; an ordinary edit takes a token
    only while more than the reserve (`reserve_fraction` of capacity) remains, so a priority edit
    (a phase change, the final state) finds one first.
    """

    def __init__(
        self,
        redis_client: redis.asyncio.Redis,
        *,
        capacity: int = 40,
        per_seconds: float = 60.0,
        reserve_fraction: float = 0.25,
        prefix: str = "deepthread:edits:",
        # None: the Redis server's clock, which every worker shares even when the machines' clocks disagree.
        clock: Clock | None = None,
    ) -> None:
        super().__init__(capacity=capacity, per_seconds=per_seconds, reserve_fraction=reserve_fraction)
        self._prefix = prefix
        self._clock = clock
        self._take = redis_client.register_script(_BUCKET_TAKE)

    async def _call(self, workspace: str, priority: bool, take: bool) -> tuple[bool, float]:
        granted, wait_microseconds = await self._take(
            keys=[self._prefix + workspace],
            args=[script_now(self._clock), self.capacity, repr(self.tokens_per_second),
                  repr(self._tokens_needed(priority)), "1" if take else "0"],
        )
        return bool(granted), int(wait_microseconds) / MICROSECONDS

    async def take(self, workspace: str, *, priority: bool = False) -> bool:
        """Take a token for one edit in `workspace` if the bucket allows it now; raises redis errors."""
        granted, _ = await self._call(workspace, priority, take=True)
        return granted

    async def wait_time(self, workspace: str, *, priority: bool = False) -> float:
        """Seconds until `take` with this priority would succeed (0 when it would now), without taking."""
        _, wait = await self._call(workspace, priority, take=False)
        return wait


CANCEL_FLAG = "deepthread:cancel:{run_id}"


def set_cancel_flag(redis_client: redis.Redis, run_id: int, by: str, *, key: str = CANCEL_FLAG) -> None:
    """Mark run `run_id` as stopped by `by` (kept for a day, long after any run has ended)."""
    redis_client.set(key.format(run_id=run_id), by, ex=ONE_DAY_SECONDS)


def read_cancel_flags(redis_client: redis.Redis, run_ids: list[int], *, key: str = CANCEL_FLAG) -> dict[int, str]:
    """Who stopped each of `run_ids` that someone stopped, in one round trip; raises redis errors."""
    values = redis_client.mget([key.format(run_id=run_id) for run_id in run_ids]) if run_ids else []
    return {run_id: _as_text(value) for run_id, value in zip(run_ids, values) if value is not None}


LOCK_POLL_SECONDS = 0.005


@overload
def redis_lock(redis_client: redis.asyncio.Redis, name: str, *, timeout: float,
               blocking_timeout: float | None = None) -> redis.asyncio.lock.Lock: ...


@overload
def redis_lock(redis_client: redis.Redis, name: str, *, timeout: float,
               blocking_timeout: float | None = None) -> redis.lock.Lock: ...


def redis_lock(redis_client: redis.Redis | redis.asyncio.Redis, name: str, *, timeout: float,
               blocking_timeout: float | None = None) -> redis.lock.Lock | redis.asyncio.lock.Lock:
    """A lock named `name` that expires after `timeout` seconds (use with `with`/`async with`); acquiring raises
    redis.exceptions.LockError after `blocking_timeout`. A waiter polls every LOCK_POLL_SECONDS (redis-py's default,
    0.1 s, would add up to a tenth of a second to every wait for a lock held a few milliseconds)."""
    return redis_client.lock(f"deepthread:lock:{name}", timeout=timeout, blocking_timeout=blocking_timeout,
                             sleep=LOCK_POLL_SECONDS)


def _as_text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


WORKER_HEARTBEAT = "deepthread:worker:{name}"
# A worker beats every HEARTBEAT_SECONDS; one silent for HEARTBEAT_TTL_SECONDS is gone.
HEARTBEAT_SECONDS = 2.0
HEARTBEAT_TTL_SECONDS = 6


def beat(redis_client: redis.Redis, name: str, *, ttl: int = HEARTBEAT_TTL_SECONDS) -> None:
    """Say that worker `name` is alive for the next `ttl` seconds."""
    redis_client.set(WORKER_HEARTBEAT.format(name=name), "1", ex=ttl)


def live_workers(redis_client: redis.Redis) -> list[str]:
    """The names of the workers that beat within the last heartbeat TTL."""
    prefix = WORKER_HEARTBEAT.format(name="")
    return sorted(_as_text(key)[len(prefix):] for key in redis_client.scan_iter(match=prefix + "*", count=100))
