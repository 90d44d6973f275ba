"""Run CPU-bound steps (extraction, PDF text, chunking, ranking) off the event loop in a process pool the caller owns.

The functions sent to the pool must be top-level and take and return picklable data, as those
in `research.extract`, `research.passages` and `research.rank` do.
"""

from __future__ import annotations

import asyncio
import functools
import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor
from typing import Any, TypeVar

Result = TypeVar("Result")

# Each worker process is replaced after this many tasks, so a leak in a parser cannot grow forever.
TASKS_PER_WORKER = 500


def cpu_pool(max_workers: int | None = None) -> ProcessPoolExecutor:
    """A process pool for CPU-bound steps, sized to the machine's cores unless told; the caller shuts it down."""
    workers = max_workers or os.cpu_count() or 1
    # "spawn" because forking a process that runs threads (an event loop, a Celery worker) can deadlock the child.
    return ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context("spawn"),
        max_tasks_per_child=TASKS_PER_WORKER,
    )


async def run_cpu(
    function: Callable[..., Result],
    *args: Any,
    pool: Executor | None = None,
    **kwargs: Any,
) -> Result:
    """The result of `function(*args, **kwargs)`, computed in `pool` without blocking the event loop, or inline when no pool is given."""
    if pool is None:
        return function(*args, **kwargs)
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(pool, functools.partial(function, *args, **kwargs))
