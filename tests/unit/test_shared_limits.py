"""Redis-backed limits on fakeredis (which runs the same Lua scripts through the lupa package): rate limits, breakers, the edit bucket, cancel flags, locks."""

from __future__ import annotations

import asyncio
import logging

import fakeredis
import fakeredis.aioredis
import pytest
import redis.asyncio
import redis.exceptions

from research.limits import CircuitBreaker, RateLimiter
from storage.shared_limits import (
    EditBucket,
    RedisCircuitBreaker,
    RedisOutage,
    RedisRateLimiter,
    redis_lock,
)
from tests.fakes.clock import FakeClock


class RecordedSleeps:
    """A sleep that only records how long it was asked to wait."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.seconds.append(seconds)


@pytest.fixture
def server() -> fakeredis.FakeServer:
    return fakeredis.FakeServer()


@pytest.fixture
def client(server: fakeredis.FakeServer) -> fakeredis.aioredis.FakeRedis:
    return fakeredis.aioredis.FakeRedis(server=server)


@pytest.fixture
def other_client(server: fakeredis.FakeServer) -> fakeredis.aioredis.FakeRedis:
    """A second connection to the same server, as another worker process would have."""
    return fakeredis.aioredis.FakeRedis(server=server)


def test_redis_versions_satisfy_the_engine_protocols(client: fakeredis.aioredis.FakeRedis) -> None:
    limiter: RateLimiter = RedisRateLimiter(client, {"brave": 1.0})
    breaker: CircuitBreaker = RedisCircuitBreaker(client)
    assert asyncio.iscoroutinefunction(limiter.acquire)
    assert all(asyncio.iscoroutinefunction(method) for method in (breaker.allow, breaker.record_success, breaker.record_failure))


async def test_first_call_under_a_limited_key_does_not_wait(client: fakeredis.aioredis.FakeRedis) -> None:
    sleeps = RecordedSleeps()
    await RedisRateLimiter(client, {"brave": 1.0}, sleep=sleeps).acquire("brave")
    assert sleeps.seconds == []


async def test_back_to_back_calls_are_given_slots_one_interval_apart(client: fakeredis.aioredis.FakeRedis) -> None:
    sleeps = RecordedSleeps()
    limiter = RedisRateLimiter(client, {"brave": 1.0}, sleep=sleeps, clock=FakeClock())
    for _ in range(3):
        await limiter.acquire("brave")
    assert sleeps.seconds == [1.0, 2.0]


async def test_two_limiters_on_one_server_share_the_slots_of_a_key(
    client: fakeredis.aioredis.FakeRedis, other_client: fakeredis.aioredis.FakeRedis
) -> None:
    first_sleeps, second_sleeps, clock = RecordedSleeps(), RecordedSleeps(), FakeClock()
    first = RedisRateLimiter(client, {"brave": 1.0}, sleep=first_sleeps, clock=clock)
    second = RedisRateLimiter(other_client, {"brave": 1.0}, sleep=second_sleeps, clock=clock)
    await first.acquire("brave")
    await second.acquire("brave")
    await first.acquire("brave")
    assert second_sleeps.seconds == [1.0]
    assert first_sleeps.seconds == [2.0]


async def test_limiter_waits_only_for_what_remains_of_the_interval(client: fakeredis.aioredis.FakeRedis) -> None:
    sleeps, clock = RecordedSleeps(), FakeClock()
    limiter = RedisRateLimiter(client, {"duckduckgo": 0.3}, sleep=sleeps, clock=clock)
    await limiter.acquire("duckduckgo")
    clock.advance(0.1)
    await limiter.acquire("duckduckgo")
    assert sleeps.seconds == [pytest.approx(0.2)]


async def test_keys_without_an_interval_and_other_keys_are_not_held_back(client: fakeredis.aioredis.FakeRedis) -> None:
    sleeps = RecordedSleeps()
    limiter = RedisRateLimiter(client, {"brave": 1.0}, sleep=sleeps)
    await limiter.acquire("brave")
    for _ in range(3):
        await limiter.acquire("tavily")
    await limiter.acquire("duckduckgo")
    assert sleeps.seconds == []
    assert await client.exists("deepthread:rate:tavily") == 0


async def test_slot_key_expires_once_the_interval_has_passed(client: fakeredis.aioredis.FakeRedis) -> None:
    limiter = RedisRateLimiter(client, {"brave": 1.0}, sleep=RecordedSleeps())
    await limiter.acquire("brave")
    time_to_live = await client.pttl("deepthread:rate:brave")
    assert 1000 < time_to_live <= 2000


async def test_breaker_stays_closed_below_the_threshold_and_opens_at_it(client: fakeredis.aioredis.FakeRedis) -> None:
    breaker = RedisCircuitBreaker(client, failure_threshold=3, cooldown=60)
    await breaker.record_failure("tavily")
    await breaker.record_failure("tavily")
    assert await breaker.allow("tavily") is True
    await breaker.record_failure("tavily")
    assert await breaker.state("tavily") == "open"
    assert await breaker.allow("tavily") is False
    assert await breaker.allow("brave") is True


async def test_success_forgets_earlier_failures(client: fakeredis.aioredis.FakeRedis) -> None:
    breaker = RedisCircuitBreaker(client, failure_threshold=2, cooldown=60)
    await breaker.record_failure("tavily")
    await breaker.record_success("tavily")
    await breaker.record_failure("tavily")
    assert await breaker.state("tavily") == "closed"
    assert await breaker.allow("tavily") is True


async def test_breaker_opened_by_one_client_is_open_for_another(
    client: fakeredis.aioredis.FakeRedis, other_client: fakeredis.aioredis.FakeRedis
) -> None:
    await RedisCircuitBreaker(client, failure_threshold=1, cooldown=60).record_failure("exa")
    assert await RedisCircuitBreaker(other_client, failure_threshold=1, cooldown=60).allow("exa") is False


async def test_after_the_cooldown_only_one_probe_goes_through_across_clients(
    client: fakeredis.aioredis.FakeRedis, other_client: fakeredis.aioredis.FakeRedis
) -> None:
    clock = FakeClock()
    breaker = RedisCircuitBreaker(client, failure_threshold=1, cooldown=60, clock=clock)
    other = RedisCircuitBreaker(other_client, failure_threshold=1, cooldown=60, clock=clock)
    await breaker.record_failure("exa")
    clock.advance(59.9)
    assert await breaker.state("exa") == "open"
    clock.advance(0.1)
    assert await breaker.state("exa") == "half_open"
    assert await breaker.allow("exa") is True
    assert await other.allow("exa") is False
    await other.record_success("exa")
    assert await breaker.allow("exa") is True
    assert await breaker.state("exa") == "closed"


async def test_a_failed_probe_opens_the_circuit_again_at_once(client: fakeredis.aioredis.FakeRedis) -> None:
    clock = FakeClock()
    breaker = RedisCircuitBreaker(client, failure_threshold=3, cooldown=60, clock=clock)
    for _ in range(3):
        await breaker.record_failure("exa")
    clock.advance(60)
    assert await breaker.allow("exa") is True
    await breaker.record_failure("exa")
    assert await breaker.state("exa") == "open"
    assert await breaker.allow("exa") is False


async def test_a_probe_whose_worker_vanished_is_given_up_after_another_cooldown(client: fakeredis.aioredis.FakeRedis) -> None:
    clock = FakeClock()
    breaker = RedisCircuitBreaker(client, failure_threshold=1, cooldown=60, clock=clock)
    await breaker.record_failure("exa")
    clock.advance(60)
    assert await breaker.allow("exa") is True
    clock.advance(59.9)
    assert await breaker.allow("exa") is False
    clock.advance(0.1)
    assert await breaker.allow("exa") is True


def test_breaker_refuses_a_threshold_below_one(client: fakeredis.aioredis.FakeRedis) -> None:
    with pytest.raises(ValueError):
        RedisCircuitBreaker(client, failure_threshold=0)


async def test_edit_bucket_grants_ordinary_edits_until_only_the_reserve_is_left(client: fakeredis.aioredis.FakeRedis) -> None:
    bucket = EditBucket(client, capacity=40, per_seconds=60.0, reserve_fraction=0.25, clock=FakeClock())
    granted = [await bucket.take("T1") for _ in range(35)]
    assert granted.count(True) == 30
    assert granted[:30] == [True] * 30
    assert await bucket.wait_time("T1") == pytest.approx(1.5)


async def test_priority_edits_take_the_reserve_after_ordinary_edits_are_refused(client: fakeredis.aioredis.FakeRedis) -> None:
    bucket = EditBucket(client, capacity=8, per_seconds=3600.0, reserve_fraction=0.25)
    while await bucket.take("T1"):
        pass
    assert await bucket.wait_time("T1", priority=True) == 0.0
    assert [await bucket.take("T1", priority=True) for _ in range(3)] == [True, True, False]
    assert await bucket.wait_time("T1", priority=True) > 400


async def test_wait_time_does_not_take_a_token(client: fakeredis.aioredis.FakeRedis) -> None:
    bucket = EditBucket(client, capacity=1, per_seconds=60.0, reserve_fraction=0.0)
    for _ in range(5):
        assert await bucket.wait_time("T1") == 0.0
    assert await bucket.take("T1") is True
    assert await bucket.take("T1") is False


async def test_edit_bucket_refills_over_time(client: fakeredis.aioredis.FakeRedis) -> None:
    clock = FakeClock()
    bucket = EditBucket(client, capacity=2, per_seconds=60.0, reserve_fraction=0.0, clock=clock)
    assert [await bucket.take("T1") for _ in range(3)] == [True, True, False]
    assert await bucket.wait_time("T1") == pytest.approx(30.0)
    clock.advance(29.9)
    assert await bucket.take("T1") is False
    clock.advance(0.1)
    assert await bucket.take("T1") is True
    assert await bucket.take("T1") is False


async def test_workspaces_have_separate_buckets_shared_by_all_clients(
    client: fakeredis.aioredis.FakeRedis, other_client: fakeredis.aioredis.FakeRedis
) -> None:
    bucket = EditBucket(client, capacity=2, per_seconds=3600.0, reserve_fraction=0.0)
    other = EditBucket(other_client, capacity=2, per_seconds=3600.0, reserve_fraction=0.0)
    assert await bucket.take("T1") is True
    assert await other.take("T1") is True
    assert await bucket.take("T1") is False
    assert await other.take("T2") is True


def test_edit_bucket_refuses_a_reserve_as_large_as_the_capacity(client: fakeredis.aioredis.FakeRedis) -> None:
    with pytest.raises(ValueError):
        EditBucket(client, capacity=4, reserve_fraction=1.0)


async def test_async_lock_is_held_by_one_client_at_a_time(
    client: fakeredis.aioredis.FakeRedis, other_client: fakeredis.aioredis.FakeRedis
) -> None:
    held = redis_lock(client, "admission", timeout=10)
    assert await held.acquire() is True
    assert await redis_lock(other_client, "admission", timeout=10).acquire(blocking=False) is False
    await held.release()
    async with redis_lock(other_client, "admission", timeout=10):
        assert await client.exists("deepthread:lock:admission") == 1


def test_sync_lock_gives_up_after_its_blocking_timeout(server: fakeredis.FakeServer) -> None:
    client = fakeredis.FakeRedis(server=server)
    with redis_lock(client, "admission", timeout=10):
        with pytest.raises(redis.exceptions.LockError):
            with redis_lock(fakeredis.FakeRedis(server=server), "admission", timeout=10, blocking_timeout=0.05):
                pass
    with redis_lock(client, "admission", timeout=10, blocking_timeout=0.05):
        pass


async def test_lock_is_stored_to_expire_after_its_timeout(client: fakeredis.aioredis.FakeRedis) -> None:
    # Redis itself drops the key at its expiry (a lock whose holder died); here we check the expiry it was given.
    assert await redis_lock(client, "admission", timeout=10).acquire() is True
    assert 9_000 < await client.pttl("deepthread:lock:admission") <= 10_000


def unreachable_async_redis() -> redis.asyncio.Redis:
    """A client of a loopback port nothing listens on: Redis down."""
    from storage.shared_limits import connect_async
    from tests.fakes.server import free_port

    return connect_async(f"redis://127.0.0.1:{free_port()}/0")


async def test_limiter_lets_calls_through_at_once_while_redis_is_down_and_says_so_once(
        caplog: pytest.LogCaptureFixture) -> None:
    sleeps = RecordedSleeps()
    limiter = RedisRateLimiter(unreachable_async_redis(), {"brave": 1.0}, sleep=sleeps, outage=RedisOutage())
    with caplog.at_level(logging.WARNING, logger="storage.shared_limits"):
        for _ in range(3):
            await limiter.acquire("brave")
    assert sleeps.seconds == []
    assert [record.levelname for record in caplog.records] == ["WARNING"]


async def test_breaker_allows_every_call_and_records_nothing_while_redis_is_down(caplog: pytest.LogCaptureFixture) -> None:
    outage = RedisOutage()
    breaker = RedisCircuitBreaker(unreachable_async_redis(), failure_threshold=1, outage=outage)
    with caplog.at_level(logging.WARNING, logger="storage.shared_limits"):
        await breaker.record_failure("tavily")
        assert await breaker.allow("tavily") is True
        assert await breaker.state("tavily") == "closed"
        await breaker.record_success("tavily")
    assert outage.down
    assert len(caplog.records) == 1


async def test_limits_apply_again_once_redis_answers_and_the_next_outage_is_reported_again(
        client: fakeredis.aioredis.FakeRedis, caplog: pytest.LogCaptureFixture) -> None:
    outage = RedisOutage()
    down = RedisCircuitBreaker(unreachable_async_redis(), failure_threshold=1, outage=outage)
    up = RedisCircuitBreaker(client, failure_threshold=1, outage=outage)
    with caplog.at_level(logging.WARNING, logger="storage.shared_limits"):
        await down.allow("exa")
        await up.record_failure("exa")
        assert await up.allow("exa") is False
        await down.allow("exa")
    assert outage.down
    assert [record.getMessage()[:17] for record in caplog.records] == [
        "Redis unreachable", "Redis reachable a", "Redis unreachable"]
