"""Waiting on a change made outside the test's reach (another thread, process or database), with a guard against a hang.

`wait_for` blocks the calling thread between looks; `eventually` is the same wait for a coroutine, yielding to the event
loop between looks (and awaiting the condition when it is async, as a query to an async Redis is). `settle` waits on a
change inside the event loop counted in loop turns, not seconds, for code on a hand-moved clock.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

Value = TypeVar("Value")

# Guards against a hang only; a change that comes at all comes in milliseconds here.
HANG_GUARD_SECONDS = 15.0


class _Patience:
    """How long a wait may go on; `check` raises AssertionError, naming what never came, once that time has passed."""

    def __init__(self, what: str, timeout: float) -> None:
        self.what = what
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout

    def check(self) -> None:
        if time.monotonic() > self.deadline:
            raise AssertionError(f"timed out after {self.timeout:g} s waiting for {self.what}")


def wait_for(condition: Callable[[], Value], what: str = "the change", timeout: float = HANG_GUARD_SECONDS,
             interval: float = 0.01) -> Value:
    """The first truthy value of `condition`, polled every `interval`; raises AssertionError when none comes within
    `timeout`."""
    patience = _Patience(what, timeout)
    while not (result := condition()):
        patience.check()
        time.sleep(interval)
    return result


async def eventually(condition: Callable[[], Value | Awaitable[Value]], what: str = "the change",
                     timeout: float = HANG_GUARD_SECONDS, interval: float = 0.005) -> Value:
    """`wait_for` without blocking the event loop: the first truthy value of `condition` (awaited when it is a
    coroutine), looked at every `interval`; raises AssertionError when none comes within `timeout`."""
    patience = _Patience(what, timeout)
    while True:
        result = condition()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result  # type: ignore[return-value]
        patience.check()
        await asyncio.sleep(interval)


async def settle(condition: Callable[[], bool], *, turns: int = 1000) -> None:
    """Let the event loop run until `condition` holds; raises AssertionError if it never does (counted in loop turns,
    not seconds)."""
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)
    assert condition(), "the code under test never reached the expected state"
