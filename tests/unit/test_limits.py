"""The in-memory rate limiter and circuit breaker, on a fake clock."""

from __future__ import annotations

import asyncio

import pytest

from research.limits import CircuitBreaker, InMemoryCircuitBreaker, InMemoryRateLimiter, RateLimiter
from tests.fakes.clock import FakeClock



@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def test_in_memory_defaults_satisfy_the_protocols() -> None:
    limiter: RateLimiter = InMemoryRateLimiter()
    breaker: CircuitBreaker = InMemoryCircuitBreaker()
    assert asyncio.iscoroutinefunction(limiter.acquire)
    assert all(asyncio.iscoroutinefunction(method) for method in (breaker.allow, breaker.record_success, breaker.record_failure))


async def test_first_call_under_a_key_does_not_wait(clock: FakeClock) -> None:
    limiter = InMemoryRateLimiter({"brave": 1.0}, clock=clock, sleep=clock.sleep)
    await limiter.acquire("brave")
    assert clock.sleeps == []


async def test_calls_under_a_limited_key_are_spaced_by_the_interval(clock: FakeClock) -> None:
    limiter = InMemoryRateLimiter({"brave": 1.0}, clock=clock, sleep=clock.sleep)
    started = clock.now
    for _ in range(3):
        await limiter.acquire("brave")
    assert clock.sleeps == [1.0, 1.0]
    assert clock.now - started == pytest.approx(2.0)


async def test_limiter_waits_only_for_what_remains_of_the_interval(clock: FakeClock) -> None:
    limiter = InMemoryRateLimiter({"brave": 1.0}, clock=clock, sleep=clock.sleep)
    await limiter.acquire("brave")
    clock.advance(0.75)
    await limiter.acquire("brave")
    assert clock.sleeps == [pytest.approx(0.25)]


async def test_keys_are_limited_independently(clock: FakeClock) -> None:
    limiter = InMemoryRateLimiter({"brave": 1.0, "duckduckgo": 1.0}, clock=clock, sleep=clock.sleep)
    await limiter.acquire("brave")
    await limiter.acquire("duckduckgo")
    assert clock.sleeps == []


async def test_keys_without_an_interval_are_not_limited(clock: FakeClock) -> None:
    limiter = InMemoryRateLimiter({"brave": 1.0}, clock=clock, sleep=clock.sleep)
    for _ in range(5):
        await limiter.acquire("tavily")
    assert clock.sleeps == []


async def test_concurrent_callers_get_distinct_slots() -> None:
    recorded: list[float] = []

    async def record_sleep(seconds: float) -> None:
        recorded.append(seconds)

    limiter = InMemoryRateLimiter({"brave": 1.0}, clock=lambda: 50.0, sleep=record_sleep)
    await asyncio.gather(*(limiter.acquire("brave") for _ in range(4)))
    assert sorted(recorded) == [1.0, 2.0, 3.0]


async def test_breaker_stays_closed_below_the_threshold(clock: FakeClock) -> None:
    breaker = InMemoryCircuitBreaker(failure_threshold=3, cooldown=30, clock=clock)
    await breaker.record_failure("exa")
    await breaker.record_failure("exa")
    assert await breaker.allow("exa")
    assert breaker.state("exa") == "closed"


async def test_breaker_opens_after_consecutive_failures(clock: FakeClock) -> None:
    breaker = InMemoryCircuitBreaker(failure_threshold=3, cooldown=30, clock=clock)
    for _ in range(3):
        await breaker.record_failure("exa")
    assert breaker.state("exa") == "open"
    assert not await breaker.allow("exa")


async def test_a_success_resets_the_failure_count(clock: FakeClock) -> None:
    breaker = InMemoryCircuitBreaker(failure_threshold=3, cooldown=30, clock=clock)
    await breaker.record_failure("exa")
    await breaker.record_failure("exa")
    await breaker.record_success("exa")
    await breaker.record_failure("exa")
    await breaker.record_failure("exa")
    assert await breaker.allow("exa")


async def test_open_breaker_lets_one_probe_through_after_the_cooldown(clock: FakeClock) -> None:
    breaker = InMemoryCircuitBreaker(failure_threshold=1, cooldown=30, clock=clock)
    await breaker.record_failure("exa")
    clock.advance(29)
    assert not await breaker.allow("exa")
    clock.advance(1)
    assert breaker.state("exa") == "half_open"
    assert await breaker.allow("exa")
    assert not await breaker.allow("exa"), "only one probe while half-open"


async def test_successful_probe_closes_the_breaker(clock: FakeClock) -> None:
    breaker = InMemoryCircuitBreaker(failure_threshold=1, cooldown=30, clock=clock)
    await breaker.record_failure("exa")
    clock.advance(30)
    assert await breaker.allow("exa")
    await breaker.record_success("exa")
    assert breaker.state("exa") == "closed"
    assert await breaker.allow("exa")
    assert await breaker.allow("exa")


async def test_failed_probe_reopens_the_breaker_for_a_new_cooldown(clock: FakeClock) -> None:
    breaker = InMemoryCircuitBreaker(failure_threshold=3, cooldown=30, clock=clock)
    for _ in range(3):
        await breaker.record_failure("exa")
    clock.advance(30)
    assert await breaker.allow("exa")
    await breaker.record_failure("exa")
    assert breaker.state("exa") == "open"
    clock.advance(29)
    assert not await breaker.allow("exa")
    clock.advance(1)
    assert await breaker.allow("exa")


async def test_breakers_are_per_key(clock: FakeClock) -> None:
    breaker = InMemoryCircuitBreaker(failure_threshold=1, cooldown=30, clock=clock)
    await breaker.record_failure("exa")
    assert not await breaker.allow("exa")
    assert await breaker.allow("brave")


def test_breaker_threshold_must_be_positive() -> None:
    with pytest.raises(ValueError):
        InMemoryCircuitBreaker(failure_threshold=0)
