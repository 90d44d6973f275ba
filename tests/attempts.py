"""Running a stored run to its end in a test, as the terminal does: take its lease as a new attempt, then execute."""

from __future__ import annotations

from typing import Any

from chat.state import RunProgress
from worker.attempt import RunAttempt
from worker.runner import RunnerServices


async def execute_stored(run_id: int, services: RunnerServices, **execute: Any) -> RunProgress | None:
    """Run `run_id`'s new attempt with `execute`'s arguments (on_state, cancel, on_text); None when it cannot start."""
    attempt = await RunAttempt.start(run_id, services)
    return None if attempt is None else await attempt.execute(**execute)
