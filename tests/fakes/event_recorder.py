"""A recorder for what the engine's parts report: their events and their waits."""

from __future__ import annotations

from typing import Any

from research.events import ProviderCall, ProviderError


class EventRecorder:
    """Hand `emit` and `sleep` to the code under test: it collects the events emitted and the sleeps asked for (which return at once)."""

    def __init__(self) -> None:
        self.events: list[Any] = []
        self.sleeps: list[float] = []

    async def emit(self, event: Any) -> None:
        self.events.append(event)

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)

    def calls(self) -> list[str]:
        return [event.provider for event in self.events if isinstance(event, ProviderCall)]

    def errors(self, *, skipped: bool) -> list[tuple[str, str]]:
        return [(event.provider, event.reason) for event in self.events
                if isinstance(event, ProviderError) and event.skipped is skipped]
