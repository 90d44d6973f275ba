"""An event loop on its own thread that every run of a worker process shares (and a second for their delivery).

Research is I/O-bound: a run spends its time waiting for the LLM, the search APIs and the web.
Fifty runs in fifty threads, each with its own loop, made fifty threads compete for the GIL;
every wake-up (a reply arrived, a task to hand over) waited behind the others, and the status
edits and task hand-overs of a burst of runs queued for seconds. One loop serves them all with
one thread; the Celery threads only wait for their run's result. CPU-heavy work still goes to
the process pool, and blocking calls to the loop's thread pool.

As `asyncio.run` would, each run's leftover tasks are cancelled when it ends, so a run that
failed half-way cannot leave work running in the shared loop. Status edits and reports go out from
a second RunLoop (worker.service): on a loop busy with hundreds of runs, each step of an edit
waited a whole turn behind their work.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import itertools
import logging
import threading
import weakref
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")

# How often a loop measures how late it runs what is due, and the lateness from which it counts as overloaded.
LAG_PROBE_SECONDS = 0.1
OVERLOADED_LAG_SECONDS = 0.25

class RunLoop:
    """A shared event loop on a daemon thread; `run(coroutine)` executes one job on it from any other thread."""

    def __init__(self, *, blocking_threads: int, name: str = "deepthread-runs") -> None:
        self.loop = asyncio.new_event_loop()
        # Blocking calls of every run (database checks, name lookups) share this pool; asyncio's
        # default (CPU count + 4) would make fifty runs queue behind a handful of threads.
        self.loop.set_default_executor(ThreadPoolExecutor(max_workers=blocking_threads,
                                                          thread_name_prefix=f"{name}-blocking"))
        self._tasks_of_job: dict[int, weakref.WeakSet[asyncio.Task[Any]]] = {}
        # The job (one call of `run`) that created a task, if any: its tasks inherit it. One variable per loop, since a
        # coroutine handed from another RunLoop carries that loop's context, whose job numbers mean nothing here.
        self._current_job: contextvars.ContextVar[int | None] = contextvars.ContextVar(f"{name}-job", default=None)
        self._jobs = itertools.count(1)
        self.loop.set_task_factory(self._task_factory)
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._lag = 0.0
        self._thread.start()
        self.loop.call_soon_threadsafe(lambda: self.loop.create_task(self._probe_lag(), name=f"{name}-lag-probe"))

    @property
    def lag(self) -> float:
        """How late (seconds) the loop last ran a callback that was due: near 0 while it keeps up."""
        return self._lag

    def overloaded(self) -> bool:
        """Whether the loop runs what is due late enough that optional work should wait (from any thread)."""
        return self._lag >= OVERLOADED_LAG_SECONDS

    async def _probe_lag(self) -> None:
        while True:
            asked = self.loop.time()
            await asyncio.sleep(LAG_PROBE_SECONDS)
            self._lag = max(0.0, self.loop.time() - asked - LAG_PROBE_SECONDS)

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run `coroutine` on the shared loop and return its result (raise its exception); call from another thread."""
        if threading.current_thread() is self._thread:
            coroutine.close()
            raise RuntimeError("RunLoop.run called from the loop's own thread")
        if self.loop.is_closed():
            coroutine.close()
            raise RuntimeError("the loop has stopped")
        return asyncio.run_coroutine_threadsafe(self._job(coroutine), self.loop).result()

    def call(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start `coroutine` on the loop from any thread, outside any job: tasks it starts outlive it (their owner stops them)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    async def bridged(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Await, from another event loop, `coroutine` run on this one (as `call`); cancelling the await cancels it."""
        return await asyncio.wrap_future(self.call(coroutine))

    def stop(self) -> None:
        """Stop the loop after the jobs running now; their leftover tasks are cancelled."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=30)

    async def _job(self, coroutine: Coroutine[Any, Any, T]) -> T:
        job = next(self._jobs)
        self._tasks_of_job[job] = weakref.WeakSet()
        self._current_job.set(job)  # this task runs in its own copy of the context: only its children see it
        try:
            return await coroutine
        finally:
            await self._cancel_leftovers(job)

    async def _cancel_leftovers(self, job: int) -> None:
        current = asyncio.current_task()
        leftovers = [task for task in self._tasks_of_job.pop(job, ()) if task is not current and not task.done()]
        for task in leftovers:
            task.cancel()
        if leftovers:
            results = await asyncio.gather(*leftovers, return_exceptions=True)
            for result in results:
                if isinstance(result, Exception):
                    logger.warning("a task left behind by a run failed", exc_info=result)

    def _task_factory(self, loop: asyncio.AbstractEventLoop, coroutine: Any, **kwargs: Any) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.Task(coroutine, loop=loop, **kwargs)
        context = kwargs.get("context")
        job = context.get(self._current_job) if context is not None else self._current_job.get()
        if job is not None and job in self._tasks_of_job:
            self._tasks_of_job[job].add(task)
        return task

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            pending = [task for task in asyncio.all_tasks(self.loop) if not task.done()]
            for task in pending:
                task.cancel()
            if pending:
                self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.run_until_complete(self.loop.shutdown_default_executor())
            self.loop.close()
