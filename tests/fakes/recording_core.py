"""A stand-in for the conversation core behind a chat adapter: it records each event and answers as the test says."""

from __future__ import annotations

import threading
from collections.abc import Callable

from bot.conversation.events import ChatEvent, Outcome
from tests.waiting import eventually


class RecordingCore:
    """Records each event (from any thread), holds it while `release` is clear, then answers with `answer(event)`."""

    def __init__(self, answer: Callable[[ChatEvent], Outcome] | None = None) -> None:
        self.events: list[ChatEvent] = []
        self.forgotten: list[tuple[str, str]] = []  # (platform, workspace) of each forget_workspace
        self.answer = answer or (lambda event: Outcome())
        self.release = threading.Event()
        self.release.set()
        self._lock = threading.Lock()

    async def handle(self, event: ChatEvent) -> Outcome:
        with self._lock:
            self.events.append(event)
        await eventually(self.release.is_set, "the test to release the core")
        return self.answer(event)

    async def forget_workspace(self, platform: str, workspace: str) -> None:
        with self._lock:
            self.forgotten.append((platform, workspace))

    def texts(self) -> list[str]:
        with self._lock:
            return [event.text for event in self.events]

    def count(self) -> int:
        with self._lock:
            return len(self.events)
