"""Coalesced status edits on a virtual clock: one edit a second, the latest state wins, the final state is last, the budget is kept."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Awaitable

import pytest

from chat.state import RunProgress, apply_event, initial_progress
from research.events import PhaseStarted, Progress
from worker.progress import InMemoryEditBucket, StatusEditor


class VirtualClock:
    """Time that moves only when a test advances it; `sleep` waits for virtual time, so nothing really waits."""

    def __init__(self) -> None:
        self.now = 0.0
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        wake = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.now + max(0.0, seconds), next(self._order), wake))
        await wake

    async def advance(self, seconds: float) -> None:
        """Move time forward by `seconds`, waking every sleeper due on the way, in order."""
        target = self.now + seconds
        await settle()
        while self._sleepers and self._sleepers[0][0] <= target:
            due, _, wake = heapq.heappop(self._sleepers)
            if wake.done():  # its sleeper was cancelled
                continue
            self.now = max(self.now, due)
            wake.set_result(None)
            await settle()
        self.now = target
        await settle()


async def settle() -> None:
    """Let every ready task run until it waits on something."""
    for _ in range(30):
        await asyncio.sleep(0)


async def returns_without_time_passing(call: Awaitable[None]) -> bool:
    """Whether `call` is done once the loop has settled, while the virtual clock stands still."""
    running = asyncio.ensure_future(call)
    await settle()
    if not running.done():
        running.cancel()
        return False
    running.result()
    return True


class RecordingSender:
    """A send that records what it showed and when; optionally slow (in virtual time)."""

    def __init__(self, clock: VirtualClock, *, seconds_per_edit: float = 0.0) -> None:
        self.clock = clock
        self.seconds_per_edit = seconds_per_edit
        self.edits: list[tuple[float, RunProgress]] = []
        self.finished: list[RunProgress] = []
        self.in_flight = 0
        self.most_in_flight = 0

    async def __call__(self, progress: RunProgress) -> None:
        self.edits.append((self.clock.now, progress))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        if self.seconds_per_edit:
            await self.clock.sleep(self.seconds_per_edit)
        self.in_flight -= 1
        self.finished.append(progress)

    @property
    def times(self) -> list[float]:
        return [moment for moment, _ in self.edits]

    @property
    def shown(self) -> list[RunProgress]:
        return [progress for _, progress in self.edits]


def started(run_id: int = 1) -> RunProgress:
    progress = initial_progress(run_id=run_id, mode="research", question="q", requested_by="slack:U1")
    return apply_event(progress, PhaseStarted(seq=1, phase="decompose"))


def with_count(progress: RunProgress, count: int) -> RunProgress:
    return apply_event(progress, Progress(seq=progress.last_seq + 1, phase=progress.current_phase or "search",
                                          counts={"updates": count}, percent=0.0))


def next_phase(progress: RunProgress, phase: str) -> RunProgress:
    return apply_event(progress, PhaseStarted(seq=progress.last_seq + 1, phase=phase))


def finished(progress: RunProgress) -> RunProgress:
    return progress.model_copy(update={"state": "done", "percent": 100.0})


def ample_bucket(clock: VirtualClock) -> InMemoryEditBucket:
    return InMemoryEditBucket(capacity=1000, per_seconds=1.0, clock=clock)


def gaps(times: list[float]) -> list[float]:
    return [later - earlier for earlier, later in zip(times, times[1:])]


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


async def test_first_update_is_sent_at_once(clock: VirtualClock) -> None:
    sender = RecordingSender(clock)
    editor = StatusEditor(sender, bucket=ample_bucket(clock), workspace="T1", clock=clock, sleep=clock.sleep)
    first = started()
    await editor.update(first)
    await settle()
    assert sender.edits == [(0.0, first)]
    await editor.stop()


async def test_rapid_updates_become_one_edit_a_second_showing_the_latest_state(clock: VirtualClock) -> None:
    sender = RecordingSender(clock)
    editor = StatusEditor(sender, bucket=ample_bucket(clock), workspace="T1", clock=clock, sleep=clock.sleep)
    progress = started()
    submitted: list[tuple[float, RunProgress]] = []
    for count in range(25):
        progress = with_count(progress, count)
        await editor.update(progress)
        submitted.append((clock.now, progress))
        await clock.advance(0.1)

    assert len(sender.edits) == 3
    assert all(gap >= 1.0 for gap in gaps(sender.times))
    for moment, shown in sender.edits:
        latest_then = [state for submitted_at, state in submitted if submitted_at <= moment][-1]
        assert shown == latest_then
    await editor.stop()


async def test_the_last_update_goes_out_as_a_trailing_edit_without_further_updates(clock: VirtualClock) -> None:
    sender = RecordingSender(clock)
    editor = StatusEditor(sender, bucket=ample_bucket(clock), workspace="T1", clock=clock, sleep=clock.sleep)
    first = started()
    second = with_count(first, 1)
    third = with_count(second, 2)
    await editor.update(first)
    await clock.advance(0.2)
    await editor.update(second)
    await editor.update(third)
    await clock.advance(0.5)
    assert sender.shown == [first]
    await clock.advance(0.5)
    assert sender.edits == [(0.0, first), (1.0, third)]
    await editor.stop()


async def test_final_state_is_the_last_edit_after_waiting_out_the_interval(clock: VirtualClock) -> None:
    sender = RecordingSender(clock)
    editor = StatusEditor(sender, bucket=ample_bucket(clock), workspace="T1", clock=clock, sleep=clock.sleep)
    first = started()
    await editor.update(first)
    await clock.advance(0.3)
    await editor.update(with_count(first, 1))
    final = finished(with_count(first, 2))
    closing = asyncio.create_task(editor.close(final))
    await clock.advance(0.5)
    assert not closing.done()
    await clock.advance(0.5)
    await closing
    assert sender.edits == [(0.0, first), (1.0, final)]


async def test_updates_after_close_are_ignored(clock: VirtualClock) -> None:
    sender = RecordingSender(clock)
    editor = StatusEditor(sender, bucket=ample_bucket(clock), workspace="T1", clock=clock, sleep=clock.sleep)
    final = finished(started())
    await editor.close(final)
    await editor.update(with_count(started(), 5))
    await clock.advance(5)
    assert sender.shown == [final]


async def test_closing_twice_is_refused(clock: VirtualClock) -> None:
    editor = StatusEditor(RecordingSender(clock), bucket=ample_bucket(clock), workspace="T1", clock=clock, sleep=clock.sleep)
    await editor.close(finished(started()))
    with pytest.raises(RuntimeError):
        await editor.close(finished(started()))


async def test_update_returns_at_once_while_a_send_is_stuck(clock: VirtualClock) -> None:
    release = asyncio.Event()

    async def stuck_send(progress: RunProgress) -> None:
        await release.wait()

    editor = StatusEditor(stuck_send, bucket=ample_bucket(clock), workspace="T1", clock=clock, sleep=clock.sleep)
    await editor.update(started())
    await settle()
    for count in range(100):
        assert await returns_without_time_passing(editor.update(with_count(started(), count)))
    assert clock.now == 0.0
    release.set()
    await editor.stop()


async def test_an_update_told_to_wait_returns_once_its_edit_has_gone_out(clock: VirtualClock) -> None:
    reply = asyncio.Event()
    sent = asyncio.Event()

    async def send(progress: RunProgress) -> None:
        await reply.wait()  # the platform's round trip
        sent.set()

    editor = StatusEditor(send, bucket=ample_bucket(clock), workspace="T1", clock=clock, sleep=clock.sleep)
    updating = asyncio.create_task(editor.update(started(), wait_seconds=5.0))
    await settle()
    assert not updating.done()
    reply.set()
    await settle()
    assert updating.done() and sent.is_set()
    assert clock.now == 0.0
    await editor.stop()


async def test_an_update_told_to_wait_gives_up_after_its_bound_when_the_send_is_stuck(clock: VirtualClock) -> None:
    release = asyncio.Event()

    async def stuck_send(progress: RunProgress) -> None:
        await release.wait()

    editor = StatusEditor(stuck_send, bucket=ample_bucket(clock), workspace="T1", clock=clock, sleep=clock.sleep)
    updating = asyncio.create_task(editor.update(started(), wait_seconds=0.2))
    await clock.advance(0.19)
    assert not updating.done()
    await clock.advance(0.01)
    assert updating.done(), "the update did not return at its bound while the edit was stuck"
    release.set()
    await editor.stop()


async def test_an_update_told_to_wait_returns_when_the_budget_refuses_the_edit(clock: VirtualClock) -> None:
    sender = RecordingSender(clock)
    empty = InMemoryEditBucket(capacity=4, per_seconds=3600.0, clock=clock)
    for _ in range(4):
        assert await empty.take("T1", priority=True)
    editor = StatusEditor(sender, bucket=empty, workspace="T1", clock=clock, sleep=clock.sleep)
    assert await returns_without_time_passing(editor.update(started(), wait_seconds=5.0))
    assert sender.edits == []
    await editor.stop()


async def test_slow_sender_sends_in_order_one_at_a_time_and_never_shows_an_older_state_last(clock: VirtualClock) -> None:
    sender = RecordingSender(clock, seconds_per_edit=2.5)
    editor = StatusEditor(sender, bucket=ample_bucket(clock), workspace="T1", clock=clock, sleep=clock.sleep)
    progress = started()
    for count in range(40):
        progress = with_count(progress, count)
        await editor.update(progress)
        await clock.advance(0.25)
    final = finished(progress)
    closing = asyncio.create_task(editor.close(final))
    await clock.advance(10)
    await closing

    assert sender.most_in_flight == 1
    assert sender.finished == sender.shown
    counts = [shown.counts.get("updates", -1) for shown in sender.shown]
    assert counts == sorted(counts)
    assert len(set(counts[:-1])) == len(counts) - 1
    assert sender.shown[-1] == final
    assert all(gap >= 1.0 for gap in gaps(sender.times))


async def test_a_failed_edit_does_not_stop_later_edits(clock: VirtualClock) -> None:
    shown: list[RunProgress] = []

    async def flaky_send(progress: RunProgress) -> None:
        if not shown and progress.counts.get("updates") is None:
            shown.append(progress)
            raise ConnectionError("platform unavailable")
        shown.append(progress)

    editor = StatusEditor(flaky_send, bucket=ample_bucket(clock), workspace="T1", clock=clock, sleep=clock.sleep)
    first = started()
    await editor.update(first)
    await clock.advance(0.5)
    second = with_count(first, 1)
    await editor.update(second)
    await clock.advance(1.0)
    assert shown == [first, second]
    final = finished(second)
    closing = asyncio.create_task(editor.close(final))
    await clock.advance(1.0)
    await closing
    assert shown[-1] == final


async def test_ordinary_edit_refused_by_the_bucket_is_skipped_but_a_phase_change_goes_out(clock: VirtualClock) -> None:
    # Four tokens, a reserve of two, no refill to speak of: ordinary edits need three tokens, phase changes one.
    bucket = InMemoryEditBucket(capacity=4, per_seconds=1_000_000, reserve_fraction=0.5, clock=clock)
    sender = RecordingSender(clock)
    editor = StatusEditor(sender, bucket=bucket, workspace="T1", clock=clock, sleep=clock.sleep)
    first = started()
    ordinary = with_count(first, 1)
    refused = with_count(ordinary, 2)
    phase_change = next_phase(refused, "search")

    await editor.update(first)  # the first edit is a change from nothing: priority, 3 tokens left
    await clock.advance(1.0)
    await editor.update(ordinary)  # 3 tokens > reserve: granted, 2 left
    await clock.advance(1.0)
    await editor.update(refused)  # only the reserve left: skipped
    await clock.advance(1.0)
    assert sender.shown == [first, ordinary]
    await editor.update(phase_change)  # priority: takes from the reserve
    await clock.advance(1.0)

    assert sender.shown == [first, ordinary, phase_change]
    assert refused not in sender.shown
    await editor.stop()


async def test_a_refused_state_goes_out_later_when_the_bucket_refills(clock: VirtualClock) -> None:
    # Two tokens per 10 s with a reserve of one: an ordinary edit needs two tokens.
    bucket = InMemoryEditBucket(capacity=2, per_seconds=10.0, reserve_fraction=0.5, clock=clock)
    sender = RecordingSender(clock)
    editor = StatusEditor(sender, bucket=bucket, workspace="T1", clock=clock, sleep=clock.sleep)
    first = started()
    later = with_count(first, 1)
    await editor.update(first)
    await clock.advance(1.0)
    await editor.update(later)
    await clock.advance(2.0)
    assert sender.shown == [first]
    await clock.advance(4.0)
    assert sender.shown == [first, later]
    assert 5.0 <= sender.times[-1] <= 6.0
    await editor.stop()


async def test_final_edit_waits_for_a_token_when_the_bucket_is_empty(clock: VirtualClock) -> None:
    bucket = InMemoryEditBucket(capacity=1, per_seconds=8.0, clock=clock)
    sender = RecordingSender(clock)
    editor = StatusEditor(sender, bucket=bucket, workspace="T1", clock=clock, sleep=clock.sleep)
    first = started()
    await editor.update(first)
    await settle()
    final = finished(first)
    closing = asyncio.create_task(editor.close(final))
    await clock.advance(7.0)
    assert sender.shown == [first]
    await clock.advance(1.5)
    await closing
    assert sender.shown == [first, final]
    assert sender.times[-1] == pytest.approx(8.0, abs=0.1)


async def test_final_edit_is_sent_anyway_when_no_token_comes_within_the_bound(clock: VirtualClock) -> None:
    bucket = InMemoryEditBucket(capacity=1, per_seconds=3600.0, clock=clock)
    sender = RecordingSender(clock)
    editor = StatusEditor(sender, bucket=bucket, workspace="T1", final_wait=60.0, clock=clock, sleep=clock.sleep)
    first = started()
    await editor.update(first)
    await settle()
    final = finished(first)
    closing = asyncio.create_task(editor.close(final))
    await clock.advance(59.0)
    assert not closing.done()
    await clock.advance(2.0)
    await closing
    assert sender.shown == [first, final]
    assert sender.times[-1] == pytest.approx(61.0, abs=0.1)


async def test_ten_runs_in_one_workspace_stay_within_the_workspace_budget(clock: VirtualClock) -> None:
    capacity, per_seconds = 40, 60.0
    bucket = InMemoryEditBucket(capacity=capacity, per_seconds=per_seconds, clock=clock)
    senders = [RecordingSender(clock) for _ in range(10)]
    editors = [StatusEditor(sender, bucket=bucket, workspace="T1", clock=clock, sleep=clock.sleep) for sender in senders]
    states = [started(run_id) for run_id in range(10)]
    phases = ["search", "fetch", "read", "synthesize", "verify"]
    for step in range(600):  # 120 s of updates every 0.2 s, a phase change every 24 s
        for index, editor in enumerate(editors):
            states[index] = with_count(states[index], step)
            if step % 120 == 119:
                states[index] = next_phase(states[index], phases[step // 120])
            await editor.update(states[index])
        await clock.advance(0.2)
    finals = [finished(state) for state in states]
    closing = [asyncio.create_task(editor.close(final)) for editor, final in zip(editors, finals)]
    await clock.advance(120)
    await asyncio.gather(*closing)

    all_times = sorted(moment for sender in senders for moment in sender.times)
    tokens_per_second = capacity / per_seconds
    for first in range(len(all_times)):
        for last in range(first, len(all_times)):
            in_window = last - first + 1
            assert in_window <= capacity + tokens_per_second * (all_times[last] - all_times[first]) + 1e-9
    for sender, final in zip(senders, finals):
        assert all(gap >= 1.0 for gap in gaps(sender.times))
        assert sender.shown[-1] == final
        shown_phases = {shown.current_phase for shown in sender.shown}
        assert {"search", "fetch", "read", "synthesize", "verify"} <= shown_phases


async def test_in_memory_bucket_keeps_a_reserve_for_priority_edits(clock: VirtualClock) -> None:
    bucket = InMemoryEditBucket(capacity=4, per_seconds=60.0, reserve_fraction=0.25, clock=clock)
    ordinary_granted = [await bucket.take("T1") for _ in range(4)]
    assert ordinary_granted == [True, True, True, False]
    assert await bucket.wait_time("T1") == pytest.approx(15.0)
    assert await bucket.wait_time("T1", priority=True) == 0.0
    assert await bucket.take("T1", priority=True) is True
    assert await bucket.take("T1", priority=True) is False
    assert await bucket.take("T2") is True
    await clock.advance(15.0)
    assert await bucket.take("T1", priority=True) is True


async def test_while_the_process_is_overloaded_counts_wait_and_phase_changes_come_at_most_every_three_seconds(
        clock: VirtualClock) -> None:
    busy = [False]
    sender = RecordingSender(clock)
    editor = StatusEditor(sender, bucket=ample_bucket(clock), workspace="T1", clock=clock, sleep=clock.sleep,
                          busy=lambda: busy[0])
    first = started()
    counted = with_count(first, 1)
    phase_change = next_phase(counted, "search")
    next_change = next_phase(phase_change, "fetch")
    later = with_count(next_change, 3)

    await editor.update(first)
    await clock.advance(1.0)
    busy[0] = True
    await editor.update(counted)  # t=1: a count moving is skipped, and the next edit waits three seconds
    await clock.advance(1.0)
    await editor.update(phase_change)
    await clock.advance(1.0)
    assert sender.shown == [first], "nothing more before t=4"
    await clock.advance(1.0)
    assert sender.shown == [first, phase_change] and sender.times[-1] == 4.0, "a phase change is shown at its turn"
    await editor.update(next_change)
    await clock.advance(2.0)
    assert sender.shown == [first, phase_change], "the next one waits three seconds too"
    await clock.advance(1.0)
    assert sender.shown == [first, phase_change, next_change] and sender.times[-1] == 7.0
    busy[0] = False
    await editor.update(later)  # the load has passed: a second apart again, counts included
    await clock.advance(3.0)
    assert sender.shown == [first, phase_change, next_change, later] and sender.times[-1] == 10.0
    closing = asyncio.create_task(editor.close(finished(later)))
    await clock.advance(1.0)
    await closing
    assert sender.shown[-1].state == "done" and sender.times[-1] == 11.0
