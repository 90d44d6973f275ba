"""Run CPU-bound steps (extraction, PDF text, chunking, ranking) off the event loop in a process pool the caller owns.

The functions sent to the pool must be top-level and take and return picklable data, as those
in `research.extract`, `research.passages` and `research.rank` do.

`SupervisedPool` isolates each task: its processes run under an address-space limit, a task that
runs past the time limit has its process killed, and a pool whose process died (killed, crashed,
out of memory) is replaced by a fresh one, so one hostile page costs that page and never the worker.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import itertools
import logging
import multiprocessing
import multiprocessing.sharedctypes
import os
import pickle
import resource
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from research.errors import DeepthreadError

Result = TypeVar("Result")

# The processes are replaced after about this many tasks each, so a leak in a parser cannot grow forever.
TASKS_PER_WORKER = 500
DEFAULT_TASK_TIMEOUT_SECONDS = 20.0
DEFAULT_MEMORY_LIMIT_BYTES = 1024 * 1024 * 1024
# Slots of the table where children record which task they started; far more than tasks in flight.
_START_TABLE_SLOTS = 4096
# How often the watchdog looks for overdue tasks; a task may overrun its limit by about this much.
_WATCHDOG_INTERVAL_SECONDS = 0.1

RetireReason = Literal["timeout", "crash"]

logger = logging.getLogger(__name__)


class CpuTaskError(DeepthreadError):
    """A task sent to a supervised pool ended without a result of its own."""


class CpuTaskTimedOut(CpuTaskError):
    """The task ran past the pool's time limit and its process was killed."""


class CpuWorkerDied(CpuTaskError):
    """The process running the task died (killed, crashed, or out of memory)."""


class _StartTable:
    """Shared memory in which a child records, per task token, its pid and when it started the task."""

    def __init__(self, context: multiprocessing.context.BaseContext) -> None:
        self.tokens = context.RawArray(ctypes.c_int64, _START_TABLE_SLOTS)
        self.pids = context.RawArray(ctypes.c_int64, _START_TABLE_SLOTS)
        self.started_at = context.RawArray(ctypes.c_double, _START_TABLE_SLOTS)

    def start_of(self, token: int) -> tuple[int, float] | None:
        """(pid, monotonic start) of a task that a child has started, or None while it waits.

        The token is read before the pid and the time, and again after: read first, a child writing the slot in
        between left its token with the slot's previous pid and time (at first 0 and 0.0: a task "started" at
        boot, long past its limit, in "process" 0, and the watchdog's kill of pid 0 was the worker's whole process
        group)."""
        slot = token % _START_TABLE_SLOTS
        if self.tokens[slot] != token:
            return None
        pid, started_at = self.pids[slot], self.started_at[slot]
        if self.tokens[slot] != token or pid <= 0:
            return None
        return pid, started_at


# Set in each child by `_prepare_child`.
_child_start_table: _StartTable | None = None


def _prepare_child(start_table: _StartTable, memory_limit_bytes: int | None) -> None:
    """Pool initializer: remember the start table and cap the child's address space."""
    global _child_start_table
    _child_start_table = start_table
    if memory_limit_bytes is not None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_limit_bytes, memory_limit_bytes))


def _run_recording_start(token: int, function: Callable[..., Result], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Result:
    """Record that this child started task `token`, then run it."""
    table = _child_start_table
    if table is not None:
        slot = token % _START_TABLE_SLOTS
        table.pids[slot] = os.getpid()
        table.started_at[slot] = time.monotonic()  # CLOCK_MONOTONIC is shared by every process on the machine
        table.tokens[slot] = token  # written last: the parent trusts pid and time only once the token matches
    try:
        return function(*args, **kwargs)
    except Exception as error:
        try:
            pickle.dumps(error)
        except Exception:
            # Some parsers' errors (lxml's, holding its error log) cannot travel back to the parent.
            raise CpuTaskError(f"{type(error).__name__}, whose details cannot be pickled") from None
        raise


@dataclass
class _Generation:
    """One ProcessPoolExecutor and its start table; replaced whole when one of its processes dies or is killed."""

    executor: ProcessPoolExecutor
    start_table: _StartTable
    retired: RetireReason | None = None
    submitted: int = 0


@dataclass
class _Call:
    """One submitted task and the future its caller holds."""

    function: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    outcome: Future[Any]
    retries_left: int = 1
    timed_out_tokens: set[int] = field(default_factory=set)


class SupervisedPool(Executor):
    """A process pool whose tasks each get a time limit and whose processes get a memory limit; it rebuilds itself after a kill or a crash.

    A task whose process was killed for its time limit raises `CpuTaskTimedOut`; a task whose
    process died under it raises `CpuWorkerDied`. Tasks that were waiting, or running beside a task
    killed for its time limit, are retried once on the fresh pool.
    """

    def __init__(
        self,
        max_workers: int,
        *,
        task_timeout_seconds: float | None = DEFAULT_TASK_TIMEOUT_SECONDS,
        memory_limit_bytes: int | None = DEFAULT_MEMORY_LIMIT_BYTES,
        tasks_per_worker: int = TASKS_PER_WORKER,
    ) -> None:
        self.max_workers = max_workers
        self.task_timeout_seconds = task_timeout_seconds
        self.memory_limit_bytes = memory_limit_bytes
        self.tasks_per_worker = tasks_per_worker
        # "spawn" because forking a process that runs threads (an event loop, a Celery worker) can deadlock the child.
        self._context = multiprocessing.get_context("spawn")
        self._tokens = itertools.count(1)
        self._lock = threading.Lock()  # one rebuild however many callers see the same dead pool
        self._generation = self._new_generation()
        self._watched: dict[int, tuple[_Generation, _Call]] = {}
        self._shut_down = threading.Event()
        self._watchdog: threading.Thread | None = None
        if task_timeout_seconds is not None:
            self._watchdog = threading.Thread(target=self._enforce_time_limits, name="cpu-pool-watchdog", daemon=True)
            self._watchdog.start()

    def submit(self, fn: Callable[..., Result], /, *args: Any, **kwargs: Any) -> Future[Result]:
        """A future of `fn(*args, **kwargs)` run in a child; raises RuntimeError after shutdown."""
        if self._shut_down.is_set():
            raise RuntimeError("cannot submit to a pool that was shut down")
        outcome: Future[Result] = Future()
        self._dispatch(_Call(fn, args, kwargs, outcome))
        return outcome

    def warm(self, load: Callable[[], None]) -> list[Future[None]]:
        """Start every process now and run `load` in each (a function whose module imports what the tasks need),
        so the first task does not wait for a process to spawn and import: a run's first pages arrived before the
        pool that reads them had started. Returns the warm-up's futures (a failure there only costs the warmth)."""
        return [self.submit(load) for _ in range(self.max_workers)]

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop the watchdog and the current processes; with `wait`, until they have exited."""
        self._shut_down.set()
        with self._lock:
            generation = self._generation
        generation.executor.shutdown(wait=wait, cancel_futures=cancel_futures)
        if wait and self._watchdog is not None:
            self._watchdog.join()

    def stop_now(self) -> None:
        """Shut down at once: queued work is dropped and the processes are terminated, not left to finish and exit
        on their own (about a second of interpreter teardown each). For a process about to exit that needs nothing
        more of its pool: a terminal's run whose report is printed."""
        self._shut_down.set()
        with self._lock:
            generation = self._generation
        # ProcessPoolExecutor names its processes nowhere public before Python 3.14's terminate_workers().
        children = list((getattr(generation.executor, "_processes", None) or {}).values())
        generation.executor.shutdown(wait=False, cancel_futures=True)
        for process in children:
            process.terminate()
        for process in children:
            process.join(timeout=5)

    def _new_generation(self) -> _Generation:
        start_table = _StartTable(self._context)
        executor = ProcessPoolExecutor(
            max_workers=self.max_workers,
            mp_context=self._context,
            initializer=_prepare_child,
            initargs=(start_table, self.memory_limit_bytes),
        )
        return _Generation(executor=executor, start_table=start_table)

    def _dispatch(self, call: _Call) -> None:
        """Send a call to the current generation, replacing it first if it is already broken."""
        for _ in range(2):
            token = next(self._tokens)
            with self._lock:
                generation = self._generation
                # Watched before it is submitted, so a task that ends at once is never left watched.
                self._watched[token] = (generation, call)
                generation.submitted += 1
                # Recycled here, not with max_tasks_per_child, which deadlocks on Python 3.11-3.13 (CPython gh-115634).
                worn_out = generation.submitted >= self.tasks_per_worker * self.max_workers
                if worn_out and not self._shut_down.is_set():
                    self._generation = self._new_generation()
            try:
                running = generation.executor.submit(_run_recording_start, token, call.function, call.args, call.kwargs)
            except BrokenProcessPool:
                self._unwatch(token)
                self._retire(generation, "crash")
                continue
            except RuntimeError as error:
                self._unwatch(token)
                if not self._shut_down.is_set():
                    continue  # that generation was recycled meanwhile: the next one takes the task
                call.outcome.set_exception(error)
                return
            running.add_done_callback(functools.partial(self._settle, call, generation, token))
            call.outcome.add_done_callback(functools.partial(self._forward_cancel, running))
            if worn_out:
                generation.executor.shutdown(wait=False)  # its processes exit once the tasks it holds are done
            return
        call.outcome.set_exception(CpuWorkerDied("the process pool broke twice while taking the task"))

    def _unwatch(self, token: int) -> None:
        with self._lock:
            self._watched.pop(token, None)

    @staticmethod
    def _forward_cancel(running: Future[Any], outcome: Future[Any]) -> None:
        # A task already in a child cannot be cancelled; its time limit still bounds it.
        if outcome.cancelled():
            running.cancel()

    def _settle(self, call: _Call, generation: _Generation, token: int, running: Future[Any]) -> None:
        """Hand a finished child task's outcome to the caller, or retry it when it died for another task's sake."""
        self._unwatch(token)
        if call.outcome.done():  # cancelled by its caller
            return
        if running.cancelled():
            call.outcome.cancel()
            return
        error = running.exception()
        if error is None:
            call.outcome.set_result(running.result())
            return
        if not isinstance(error, BrokenProcessPool):
            call.outcome.set_exception(error)
            return
        self._retire(generation, "crash")
        if token in call.timed_out_tokens:
            limit = self.task_timeout_seconds
            call.outcome.set_exception(CpuTaskTimedOut(f"the task ran past its {limit} s limit; its process was killed"))
            return
        started = generation.start_table.start_of(token) is not None
        # A task that was running when its pool died may be the one that killed it; it is not run again.
        innocent = not started or generation.retired == "timeout"
        if innocent and call.retries_left > 0 and not self._shut_down.is_set():
            call.retries_left -= 1
            self._dispatch(call)
            return
        call.outcome.set_exception(CpuWorkerDied("the process running the task died"))

    def _retire(self, generation: _Generation, reason: RetireReason, *, kill_pid: int | None = None) -> None:
        """Replace `generation` with a fresh one unless someone already did; kill `kill_pid` first when given."""
        with self._lock:
            if generation.retired is not None:
                return
            generation.retired = reason
            if generation is self._generation and not self._shut_down.is_set():
                self._generation = self._new_generation()
        if kill_pid is not None and kill_pid > 0 and kill_pid != os.getpid():  # never a group, never this process
            try:
                os.kill(kill_pid, signal.SIGKILL)  # the executor then sees a dead child and fails every task it held
            except ProcessLookupError:
                pass
        logger.warning("CPU pool replaced after a %s", reason)
        generation.executor.shutdown(wait=False)

    def _enforce_time_limits(self) -> None:
        """Watchdog thread: kill the process of every task that has run past the time limit since it started."""
        limit = self.task_timeout_seconds
        assert limit is not None
        while not self._shut_down.wait(_WATCHDOG_INTERVAL_SECONDS):
            now = time.monotonic()
            with self._lock:
                watched = list(self._watched.items())
            for token, (generation, call) in watched:
                start = generation.start_table.start_of(token)
                if start is None or now - start[1] < limit:
                    continue
                call.timed_out_tokens.add(token)
                self._unwatch(token)
                logger.warning("a CPU task ran past its %s s limit; killing its process", limit)
                self._retire(generation, "timeout", kill_pid=start[0])


def cpu_pool(
    max_workers: int | None = None,
    *,
    task_timeout_seconds: float | None = DEFAULT_TASK_TIMEOUT_SECONDS,
    memory_limit_bytes: int | None = DEFAULT_MEMORY_LIMIT_BYTES,
) -> SupervisedPool:
    """A supervised process pool for CPU-bound steps, sized to the machine's cores unless told; the caller shuts it down."""
    return SupervisedPool(
        max_workers or os.cpu_count() or 1,
        task_timeout_seconds=task_timeout_seconds,
        memory_limit_bytes=memory_limit_bytes,
    )


async def run_cpu(
    function: Callable[..., Result],
    *args: Any,
    pool: Executor | None = None,
    **kwargs: Any,
) -> Result:
    """The result of `function(*args, **kwargs)`, computed in `pool` without blocking the event loop, or inline when no pool is given.

    With a `SupervisedPool`, raises `CpuTaskTimedOut` or `CpuWorkerDied` when the task's process was killed or died.
    """
    if pool is None:
        return function(*args, **kwargs)
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(pool, functools.partial(function, *args, **kwargs))
