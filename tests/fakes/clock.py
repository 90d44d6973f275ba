"""Monotonic clocks moved only by the code under test or the test: `FakeClock` jumps when slept on; `ManualClock`
holds each sleeper until a test advances it past the sleeper's time."""

from __future__ import annotations

import asyncio


class FakeClock:
    """Call it for the time; hand `sleep` to the code under test; `sleeps` lists every wait asked for."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def advance(self, seconds: float) -> None:
        self.now += seconds


class ManualClock:
    """Call it for the time; hand `sleep` to the code under test; `advance` wakes the sleepers whose time has come."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []
        self._sleeper_added: asyncio.Event | None = None

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        entry = (self.now + seconds, asyncio.get_running_loop().create_future())
        self._sleepers.append(entry)
        self._added().set()
        try:
            await entry[1]
        finally:
            self._sleepers.remove(entry)

    def advance(self, seconds: float) -> None:
        """Move the clock on and wake every sleeper whose time it reaches."""
        self.now += seconds
        for until, wake in self._sleepers:
            if until <= self.now + 1e-9 and not wake.done():
                wake.set_result(None)

    def sleeping_until(self, moment: float) -> int:
        """How many are asleep until `moment` (absolute clock time)."""
        return sum(1 for until, wake in self._sleepers if abs(until - moment) < 1e-9 and not wake.done())

    async def wait_for_sleepers(self, moment: float, count: int = 1) -> None:
        """Return once at least `count` callers sleep until `moment`."""
        while self.sleeping_until(moment) < count:
            added = self._added()
            added.clear()
            await added.wait()

    def _added(self) -> asyncio.Event:
        if self._sleeper_added is None:
            self._sleeper_added = asyncio.Event()
        return self._sleeper_added
