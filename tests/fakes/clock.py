"""A monotonic clock that moves only when the code under test sleeps on it (or a test advances it)."""

from __future__ import annotations


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
