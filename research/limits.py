"""Rate limiters and circuit breakers keyed by name (e.g. a provider), as Protocols with in-memory defaults."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]
BreakerState = Literal["closed", "open", "half_open"]


class RateLimiter(Protocol):
    """Spaces out calls per key; shared across workers when backed by Redis."""

    async def acquire(self, key: str) -> None:
        """Wait until one more call under `key` is allowed, and count it."""
        ...


class CircuitBreaker(Protocol):
    """Stops calling a key after repeated failures, then probes it again after a cool-down."""

    async def allow(self, key: str) -> bool:
        """Whether a call under `key` may go ahead now."""
        ...

    async def record_success(self, key: str) -> None:
        """Note that a call under `key` succeeded (closes the circuit)."""
        ...

    async def record_failure(self, key: str) -> None:
        """Note that a call under `key` failed (may open the circuit)."""
        ...


class InMemoryRateLimiter:
    """A per-key minimum interval between calls, for one process; keys without an interval are not limited."""

    def __init__(
        self,
        intervals: Mapping[str, float] | None = None,
        *,
        default_interval: float = 0.0,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self._intervals = dict(intervals or {})
        self._default_interval = default_interval
        self._clock = clock
        self._sleep = sleep
        self._next_slot: dict[str, float] = {}

    def interval_for(self, key: str) -> float:
        """The minimum number of seconds between two calls under `key`."""
        return self._intervals.get(key, self._default_interval)

    async def acquire(self, key: str) -> None:
        """Reserve the next free slot for `key` and wait until it comes."""
        interval = self.interval_for(key)
        if interval <= 0:
            return
        now = self._clock()
        # Reserving before sleeping keeps concurrent callers in distinct slots without a lock.
        slot = max(now, self._next_slot.get(key, now))
        self._next_slot[key] = slot + interval
        if slot > now:
            await self._sleep(slot - now)


@dataclass
class _Circuit:
    state: BreakerState = "closed"
    consecutive_failures: int = 0
    opened_at: float = 0.0
    probe_in_flight: bool = False


class InMemoryCircuitBreaker:
    """Closed, open after `failure_threshold` consecutive failures, half-open (one probe) after `cooldown` seconds, closed again on success."""

    def __init__(self, *, failure_threshold: int = 3, cooldown: float = 60.0, clock: Clock = time.monotonic) -> None:
        if failure_threshold < 1:
            raise ValueError("failure_threshold must be at least 1")
        self._failure_threshold = failure_threshold
        self._cooldown = cooldown
        self._clock = clock
        self._circuits: dict[str, _Circuit] = {}

    def _circuit(self, key: str) -> _Circuit:
        return self._circuits.setdefault(key, _Circuit())

    def state(self, key: str) -> BreakerState:
        """The circuit's state for `key` as of now (an open circuit past its cool-down reads half-open)."""
        circuit = self._circuit(key)
        if circuit.state == "open" and self._clock() - circuit.opened_at >= self._cooldown:
            return "half_open"
        return circuit.state

    async def allow(self, key: str) -> bool:
        """Allow calls while closed, and a single probe once an open circuit has cooled down."""
        circuit = self._circuit(key)
        state = self.state(key)
        if state == "closed":
            return True
        if state == "half_open" and not (circuit.state == "half_open" and circuit.probe_in_flight):
            circuit.state = "half_open"
            circuit.probe_in_flight = True
            return True
        return False

    async def record_success(self, key: str) -> None:
        """Close the circuit and forget earlier failures."""
        self._circuits[key] = _Circuit()

    async def record_failure(self, key: str) -> None:
        """Count a failure; open the circuit at the threshold, or again at once after a failed probe."""
        circuit = self._circuit(key)
        circuit.consecutive_failures += 1
        if circuit.state == "half_open" or circuit.consecutive_failures >= self._failure_threshold:
            circuit.state = "open"
            circuit.opened_at = self._clock()
            circuit.probe_in_flight = False
