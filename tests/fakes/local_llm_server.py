"""A local model server's one-at-a-time queue, as `tests.fakes.llm.FakeLLM(local_server=...)` imitates it.

llama-cpp-python's server (and llama.cpp with one slot) works on one request at a time behind a lock; the others
wait, holding their connection, in arrival order. `LocalQueue` is that lock and the record of what happened in it:
one `LocalWork` per request and the counters a test asserts (`max_in_work`, `resent_while_busy`). It is shared
by the in-process transport and the loopback server, so it is safe from any thread and any event loop.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LocalServer:
    """How fast a one-request-at-a-time local server works (llama.cpp, llama-cpp-python on a laptop), in tokens a second."""

    prompt_tokens_per_second: float = 200.0
    tokens_per_second: float = 10.0


@dataclass
class LocalWork:
    """One request's life in the local server, on the fake's clock in simulated seconds (None: not reached yet)."""

    messages_key: str
    stream: bool
    prompt_tokens: int
    queued_at: float
    started_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    completion_tokens: int = 0
    disconnected: bool = False  # the client went away (closed, timed out, cancelled) before the work finished

    @property
    def waited(self) -> float | None:
        """Seconds spent in the queue before work started."""
        return None if self.started_at is None else self.started_at - self.queued_at


@dataclass(eq=False)  # a turn is itself: two identical requests are two turns
class _Turn:
    work: LocalWork
    loop: asyncio.AbstractEventLoop
    granted: asyncio.Future[None]


class LocalQueue:
    """The local server's FIFO queue and what happened in it (`fake.local`); safe to read from any thread or loop."""

    def __init__(self, server: LocalServer) -> None:
        self.server = server
        self.max_in_work = 0
        self.resent_while_busy = 0
        self._in_work = 0
        self._works: list[LocalWork] = []
        self._waiting: deque[_Turn] = deque()
        self._holder: LocalWork | None = None
        self._changed = threading.Condition()
        self._async_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    @property
    def work(self) -> list[LocalWork]:
        """Every request that entered the queue, in arrival order."""
        with self._changed:
            return list(self._works)

    @property
    def queued(self) -> int:
        """Requests waiting for their turn now."""
        with self._changed:
            return sum(1 for work in self._works if work.started_at is None and work.finished_at is None)

    @property
    def in_work(self) -> int:
        """Requests being worked on now (0 or 1)."""
        with self._changed:
            return self._in_work

    @property
    def idle(self) -> bool:
        """Whether every request that arrived has been worked to the end."""
        with self._changed:
            return all(work.finished_at is not None for work in self._works)

    async def wait_until(self, condition: Callable[[LocalQueue], bool]) -> None:
        """Return once `condition(queue)` holds, checked at every change (arrival, start, first token, end, disconnect)."""
        loop = asyncio.get_running_loop()
        while not condition(self):
            changed: asyncio.Future[None] = loop.create_future()
            with self._changed:
                self._async_waiters.append((loop, changed))
            if condition(self):
                return
            await changed

    async def wait_idle(self) -> None:
        """Return once every request that arrived has been worked to the end."""
        await self.wait_until(lambda queue: queue.idle)

    def wait_until_blocking(self, condition: Callable[[LocalQueue], bool], timeout: float = 30.0) -> bool:
        """`wait_until` for a thread with no event loop (a loopback server in use); False if `timeout` real seconds passed."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not condition(self):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(remaining)
        return True

    # -- the server's side: FakeLLM calls these -------------------------------------------------------------

    def _notify(self) -> None:
        with self._changed:
            self._changed.notify_all()
            waiters, self._async_waiters = self._async_waiters, []
        for loop, changed in waiters:
            if not loop.is_closed():
                loop.call_soon_threadsafe(_resolve, changed)

    def arrive(self, messages_key: str, *, stream: bool, prompt_tokens: int, now: float) -> LocalWork:
        """Record a request entering the queue, counting it as resent if an identical one is queued or in work."""
        work = LocalWork(messages_key=messages_key, stream=stream, prompt_tokens=prompt_tokens, queued_at=now)
        with self._changed:
            if any(other.messages_key == work.messages_key and other.finished_at is None for other in self._works):
                self.resent_while_busy += 1
            self._works.append(work)
        self._notify()
        return work

    async def take_turn(self, work: LocalWork) -> None:
        """Wait until every request that arrived before `work` has been worked to the end; then `work` holds the turn."""
        loop = asyncio.get_running_loop()
        with self._changed:
            if self._holder is None and not self._waiting:
                self._holder = work
                return
            turn = _Turn(work, loop, loop.create_future())
            self._waiting.append(turn)
        try:
            await turn.granted
        except asyncio.CancelledError:
            with self._changed:
                still_waiting = turn in self._waiting
                if still_waiting:
                    self._waiting.remove(turn)
            if not still_waiting and turn.granted.done() and not turn.granted.cancelled():
                self.release()
            raise

    def release(self) -> None:
        """Pass the turn to the next request in the queue (a cancelled or orphaned waiter passes it on)."""
        with self._changed:
            self._holder = None
            while self._waiting:
                turn = self._waiting.popleft()
                if turn.loop.is_closed():
                    continue
                self._holder = turn.work
                turn.loop.call_soon_threadsafe(self._grant, turn)
                break

    def _grant(self, turn: _Turn) -> None:
        if turn.granted.cancelled():
            self.release()
        elif not turn.granted.done():
            turn.granted.set_result(None)

    def update(self, work: LocalWork, **values: Any) -> None:
        """Set `work`'s fields (`started_at`, `first_token_at`, `finished_at`, `completion_tokens`) and tell the waiters."""
        with self._changed:
            for name, value in values.items():
                setattr(work, name, value)
            if "started_at" in values:
                self._in_work += 1
                self.max_in_work = max(self.max_in_work, self._in_work)
            if "finished_at" in values and work.started_at is not None:
                self._in_work -= 1
        self._notify()

    def client_gone(self, work: LocalWork) -> None:
        """Record that `work`'s client went away, unless the work had already finished."""
        with self._changed:
            if work.finished_at is not None or work.disconnected:
                return
            work.disconnected = True
        self._notify()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
