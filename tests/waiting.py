"""Waiting on a change made outside the test's reach (another thread, process or database), with a guard against a hang."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

Value = TypeVar("Value")

# Guards against a hang only; a change that comes at all comes in milliseconds here.
HANG_GUARD_SECONDS = 15.0


def wait_for(condition: Callable[[], Value], what: str = "change", timeout: float = HANG_GUARD_SECONDS,
             interval: float = 0.01) -> Value:
    """The first truthy value of `condition`, polled every `interval`; raises AssertionError when none comes within
    `timeout`."""
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} in time")
        time.sleep(interval)
    return result


async def eventually(condition: Callable[[], object], what: str = "change", timeout: float = HANG_GUARD_SECONDS) -> None:
    """Return once `condition` holds, yielding to the event loop between looks; raises AssertionError after `timeout`."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} in time")
        await asyncio.sleep(0.005)
