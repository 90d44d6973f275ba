"""The worker's shared event loop: runs from many threads on one loop, each cleaned up as asyncio.run would."""

from __future__ import annotations

import asyncio
import threading

import pytest

from worker.loop import RunLoop


@pytest.fixture
def run_loop() -> RunLoop:
    loop = RunLoop(blocking_threads=8)
    yield loop
    loop.stop()


def test_runs_from_many_threads_share_one_loop_and_overlap(run_loop: RunLoop) -> None:
    seen: dict[int, tuple[int, threading.Thread]] = {}
    arrived = 0
    all_arrived = asyncio.Event()

    async def one_run(index: int) -> int:
        nonlocal arrived
        seen[index] = (id(asyncio.get_running_loop()), threading.current_thread())
        arrived += 1
        if arrived == 20:
            all_arrived.set()
        # Each run finishes only once all twenty are in flight at the same time.
        await asyncio.wait_for(all_arrived.wait(), timeout=30)
        return index * 10

    results: dict[int, int] = {}
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, run_loop.run(one_run(i)))) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert results == {i: i * 10 for i in range(20)}
    assert len({loop_id for loop_id, _ in seen.values()}) == 1
    assert len({thread for _, thread in seen.values()}) == 1
    assert all(thread is not threading.current_thread() for _, thread in seen.values())


def test_a_runs_exception_reaches_its_caller_and_the_loop_goes_on(run_loop: RunLoop) -> None:
    async def failing() -> None:
        await asyncio.sleep(0)
        raise ValueError("the run broke")

    async def fine() -> str:
        return "still serving"

    with pytest.raises(ValueError, match="the run broke"):
        run_loop.run(failing())
    assert run_loop.run(fine()) == "still serving"


def test_tasks_a_run_leaves_behind_are_cancelled_when_it_ends_and_only_its_own(run_loop: RunLoop) -> None:
    cancelled: list[str] = []
    waiting: list[str] = []
    leftovers_waiting = asyncio.Event()
    other_started = threading.Event()
    release_other = asyncio.Event()
    kept: list[asyncio.Task[None]] = []

    async def forever(name: str) -> None:
        waiting.append(name)
        if {"child", "grandchild"} <= set(waiting):
            leftovers_waiting.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(name)
            raise

    async def leaky() -> None:
        # A task of a task: both belong to this run.
        async def spawner() -> None:
            kept.append(asyncio.create_task(forever("grandchild")))
            await forever("child")

        kept.append(asyncio.create_task(spawner()))
        await leftovers_waiting.wait()  # both are running when the run ends, not merely scheduled

    async def other_run() -> str:
        task = asyncio.create_task(forever("other run's child"))
        other_started.set()
        await release_other.wait()
        task.cancel()
        return "other done"

    outcome: dict[str, str] = {}
    other = threading.Thread(target=lambda: outcome.setdefault("other", run_loop.run(other_run())))
    other.start()
    assert other_started.wait(5)
    run_loop.run(leaky())
    assert sorted(cancelled) == ["child", "grandchild"]
    assert all(task.done() for task in kept)
    run_loop.loop.call_soon_threadsafe(release_other.set)
    other.join(5)
    assert outcome == {"other": "other done"}


def test_blocking_calls_share_a_pool_as_large_as_asked(run_loop: RunLoop) -> None:
    # Eight blocking calls that each return only once all eight are running: a smaller pool breaks the barrier.
    all_running = threading.Barrier(8, timeout=30)

    async def blocking_at_once() -> list[int]:
        return await asyncio.gather(*(asyncio.to_thread(all_running.wait) for _ in range(8)))

    assert sorted(run_loop.run(blocking_at_once())) == list(range(8))


def test_running_on_the_loops_own_thread_is_refused(run_loop: RunLoop) -> None:
    async def nested() -> None:
        run_loop.run(asyncio.sleep(0))

    with pytest.raises(RuntimeError, match="own thread"):
        run_loop.run(nested())


def test_work_handed_to_another_loop_outlives_the_jobs_there_that_share_its_number(run_loop: RunLoop) -> None:
    # The worker's runs hand status edits to the delivery loop: an editor task started there from run 1
    # must not be taken for a leftover of the delivery loop's own job 1 and cancelled when that job ends.
    delivery = RunLoop(blocking_threads=2, name="test-delivery")
    try:
        release_job = threading.Event()
        job_started = threading.Event()
        editor: dict[str, asyncio.Task[None]] = {}

        async def delivery_job() -> None:
            job_started.set()
            await asyncio.to_thread(release_job.wait, 30)

        async def start_editor() -> None:
            editor["task"] = asyncio.create_task(asyncio.sleep(3600))

        async def a_run() -> None:
            await delivery.bridged(start_editor())

        other = threading.Thread(target=lambda: delivery.run(delivery_job()))
        other.start()
        assert job_started.wait(30)
        run_loop.run(a_run())
        release_job.set()
        other.join(30)
        assert not editor["task"].done()
        delivery.call(stop_task(editor["task"])).result(30)
    finally:
        delivery.stop()


def test_a_stopped_loop_refuses_new_runs_without_leaving_them_unawaited() -> None:
    loop = RunLoop(blocking_threads=1)
    loop.stop()
    coroutine = asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="stopped"):
        loop.run(coroutine)
    assert coroutine.cr_frame is None  # closed, so no "never awaited" warning


async def stop_task(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def test_a_loop_held_up_reads_as_overloaded_until_it_keeps_up_again(run_loop: RunLoop) -> None:
    # What sheds a worker's optional work (ordinary status edits, frequent event writes) under a burst of runs.
    held = threading.Event()

    async def hold_up() -> None:
        held.wait(30)  # blocks the loop's thread: nothing due runs on time

    assert not run_loop.overloaded()
    run_loop.call(hold_up())
    try:
        # The probe can only measure once the loop runs again: release it after its due time has long passed.
        deadline = threading.Event()
        deadline.wait(0.6)
    finally:
        held.set()
    assert wait_for(run_loop.overloaded), "a loop held up for 0.6 s reads as overloaded"
    assert run_loop.lag >= 0.25
    assert wait_for(lambda: not run_loop.overloaded()), "a loop that keeps up again does not"


def wait_for(condition, timeout: float = 10.0) -> bool:
    """Whether `condition()` comes true within `timeout` seconds (checked every hundredth of a second)."""
    ended = threading.Event()
    for _ in range(int(timeout * 100)):
        if condition():
            return True
        ended.wait(0.01)
    return condition()
