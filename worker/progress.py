"""Status edits of one message, coalesced (at most one a second, the latest state last) and drawn from a per-workspace budget."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from config import setting_default
from chat.state import RunProgress
from ops.metrics import StatusEdit, record_status_edit
from storage.shared_limits import EditBucketRules

logger = logging.getLogger(__name__)

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]
SendStatus = Callable[[RunProgress], Awaitable[None]]

# The shortest pause between two asks for a token while the final edit waits, so a tiny wait cannot spin.
SHORTEST_BUCKET_POLL_SECONDS = 0.05
# The least time between two edits of one message while the process is overloaded (the latest state still wins).
OVERLOADED_MIN_INTERVAL_SECONDS = 3.0


class EditBudget(Protocol):
    """A per-workspace allowance of status edits (storage.shared_limits.EditBucket in production)."""

    async def take(self, workspace: str, *, priority: bool = False) -> bool:
        """Take a token for one edit if the budget allows it now."""
        ...

    async def wait_time(self, workspace: str, *, priority: bool = False) -> float:
        """Seconds until `take` with this priority would succeed, without taking."""
        ...


class InMemoryEditBucket(EditBucketRules):
    """The per-workspace token bucket of storage.shared_limits.EditBucket for one process (tests, the console)."""

    def __init__(
        self,
        *,
        capacity: int = setting_default("status_edits_per_minute"),
        per_seconds: float = 60.0,
        reserve_fraction: float = 0.25,
        clock: Clock = time.monotonic,
    ) -> None:
        super().__init__(capacity=capacity, per_seconds=per_seconds, reserve_fraction=reserve_fraction)
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}

    def tokens(self, workspace: str) -> float:
        """The tokens `workspace` has now."""
        now = self._clock()
        tokens, updated = self._buckets.get(workspace, (float(self.capacity), now))
        return min(float(self.capacity), tokens + max(0.0, now - updated) * self.tokens_per_second)

    async def take(self, workspace: str, *, priority: bool = False) -> bool:
        """Take a token if one is there (for an ordinary edit: if more than the reserve is there)."""
        tokens = self.tokens(workspace)
        granted = tokens >= self._tokens_needed(priority)
        self._buckets[workspace] = (tokens - 1 if granted else tokens, self._clock())
        return granted

    async def wait_time(self, workspace: str, *, priority: bool = False) -> float:
        """Seconds until `take` with this priority would succeed (0 when it would now)."""
        missing = self._tokens_needed(priority) - self.tokens(workspace)
        return max(0.0, missing / self.tokens_per_second)


class StatusEditor:
    """Coalesces the status edits of one message: at most one per `min_interval`, the latest state wins, the final state is the last edit.

    `update` only records the state and returns; one background task sends, in order, so a slow
    send can never let an older state overwrite a newer one. A phase or run-state change is a
    priority edit for the workspace budget; an ordinary edit the budget refuses, or one made while
    `busy()` says the process is overloaded, is skipped and the latest state tried again an interval
    later.
    """

    def __init__(
        self,
        send: SendStatus,
        *,
        bucket: EditBudget,
        workspace: str,
        min_interval: float = 1.0,
        final_wait: float = 60.0,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
        count_edit: Callable[[StatusEdit], None] = record_status_edit,
        busy: Callable[[], bool] = lambda: False,
    ) -> None:
        self._send = send
        self._busy = busy  # whether the process is too busy for ordinary edits (its delivery loop lags)
        self._count_edit = count_edit
        self._bucket = bucket
        self._workspace = workspace
        self._min_interval = min_interval
        self._final_wait = final_wait
        self._clock = clock
        self._sleep = sleep
        self._pending: RunProgress | None = None
        self._final: RunProgress | None = None
        self._closed = False
        self._last_sent: RunProgress | None = None
        self._next_edit_at = -math.inf
        self._wake = asyncio.Event()
        self._attempted = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def last_sent(self) -> RunProgress | None:
        """The state the message shows, as far as this editor knows."""
        return self._last_sent

    async def update(self, progress: RunProgress, *, wait_seconds: float = 0.0) -> None:
        """Make `progress` the state to show next (ignored after `close`).

        Returns at once, or, given `wait_seconds`, once the sender has tried to show it (or a newer
        state): sent, or skipped because the budget refused it; at the latest after `wait_seconds`.
        """
        if self._closed:
            return
        self._pending = progress
        self._attempted.clear()
        task = self._wake_sender()
        if wait_seconds > 0:
            waiter = asyncio.create_task(self._attempted.wait())
            # The bound runs on the editor's own sleep, so a test's clock can reach it (any awaitable: ensure_future).
            bound = asyncio.ensure_future(self._sleep(wait_seconds))
            try:
                await asyncio.wait((waiter, task, bound), return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
                bound.cancel()

    async def close(self, final_progress: RunProgress) -> None:
        """Send `final_progress` as the last edit, after the interval and a token (waiting at most `final_wait` for one); raises what the send raised."""
        if self._closed:
            raise RuntimeError("the status editor is already closed")
        self._closed = True
        self._final = final_progress
        self._pending = None
        await self._wake_sender()

    async def stop(self) -> None:
        """Stop editing without a final edit (a stale attempt must not deliver)."""
        self._closed = True
        if self._task is not None and not self._task.done():
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    def _wake_sender(self) -> asyncio.Task[None]:
        if self._task is None:
            self._task = asyncio.create_task(self._send_until_final(), name=f"status-editor-{self._workspace}")
        self._wake.set()
        return self._task

    async def _send_until_final(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending is not None or self._final is not None:
                await self._wait_until(self._next_edit_at)
                if self._final is not None:
                    await self._send_final(self._final)
                    return
                # Whatever arrived while waiting replaces what was pending: only the latest state goes out.
                progress, self._pending = self._pending, None
                if progress is not None:
                    await self._send_if_budget_allows(progress)
                    self._attempted.set()

    async def _send_if_budget_allows(self, progress: RunProgress) -> None:
        priority = self._is_phase_change(progress)
        busy = self._busy()
        if not priority and busy:
            # Shed while the process is overloaded: a count moving is the edit least missed, and every run's phase
            # changes, first and final states, and reports go out sooner without it. The latest state waits its turn.
            granted = False
        else:
            try:
                granted = await self._bucket.take(self._workspace, priority=priority)
            except Exception:
                logger.warning("edit budget unavailable; status edit skipped", exc_info=True)
                granted = False
        # Under load, a message is edited less often: fewer edits, each showing the latest state, phase changes too.
        interval = max(self._min_interval, OVERLOADED_MIN_INTERVAL_SECONDS) if busy else self._min_interval
        self._next_edit_at = self._clock() + interval
        if not granted:
            self._count_edit(StatusEdit.SKIPPED)
            if self._pending is None:
                self._pending = progress
            return
        try:
            await self._send(progress)
        except Exception:
            # The next state (or the final one) repairs the message; the run must not fail for a status edit.
            self._count_edit(StatusEdit.FAILED)
            logger.warning("status edit failed", exc_info=True)
            return
        self._count_edit(StatusEdit.SENT)
        self._last_sent = progress

    async def _send_final(self, final_progress: RunProgress) -> None:
        await self._wait_for_final_token()
        self._next_edit_at = self._clock() + self._min_interval
        try:
            await self._send(final_progress)
        except Exception:
            self._count_edit(StatusEdit.FAILED)
            raise
        self._count_edit(StatusEdit.SENT)
        self._last_sent = final_progress

    async def _wait_for_final_token(self) -> None:
        deadline = self._clock() + self._final_wait
        while True:
            try:
                if await self._bucket.take(self._workspace, priority=True):
                    return
                wait = await self._bucket.wait_time(self._workspace, priority=True)
            except Exception:
                logger.warning("edit budget unavailable; sending the final status anyway", exc_info=True)
                return
            remaining = deadline - self._clock()
            if remaining <= 0:
                # Only a wait that ran out is worth a warning; an editor told not to wait (final_wait 0) expects this.
                log = logger.warning if self._final_wait > 0 else logger.debug
                log("edit budget still empty after %.0f s; sending the final status anyway", self._final_wait)
                return
            await self._sleep(min(max(wait, SHORTEST_BUCKET_POLL_SECONDS), remaining))

    async def _wait_until(self, moment: float) -> None:
        delay = moment - self._clock()
        if delay > 0:
            await self._sleep(delay)

    def _is_phase_change(self, progress: RunProgress) -> bool:
        last = self._last_sent
        return last is None or (progress.current_phase, progress.state) != (last.current_phase, last.state)
