"""Which run a log line belongs to: run id, conversation, platform, workspace and phase, carried by a context variable.

A run binds its context where it starts executing; asyncio tasks and `asyncio.to_thread` copy
context variables, so every line logged inside the run, by deepthread or by a library (Celery,
the OpenAI SDK, slack-sdk), carries it. The many runs sharing one event loop each see their own.
`RunContextFilter` copies the context onto each record for the formatters. Standard library only: the worker
binds runs with it and the bot's logging set-up (bot/logs.py) reads it, neither pulling in the other.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, ParamSpec, TypeVar, overload

# The names a record carries (None outside a run), in the order the JSON lines show them.
RUN_FIELDS = ("run_id", "conversation_id", "platform", "workspace", "phase")

P = ParamSpec("P")
R = TypeVar("R")


@dataclass
class RunLogContext:
    """What every log line of one run says about it; mutable, so a phase set in one task shows in all the run's tasks."""

    run_id: int
    conversation_id: int | None = None
    platform: str | None = None
    workspace: str | None = None
    phase: str | None = None


_current_run: contextvars.ContextVar[RunLogContext | None] = contextvars.ContextVar("deepthread_run_log", default=None)


def current_run_context() -> RunLogContext | None:
    """The context of the run this code executes in, or None outside any run."""
    return _current_run.get()


def bind_run(run_id: int) -> contextvars.Token[RunLogContext | None]:
    """Tag this context's log lines (and those of the tasks and threads it starts) with run `run_id`; undo with `unbind_run`.

    Binding the run already bound keeps its context, so the details one layer adds show in the lines of the others.
    """
    return _current_run.set(_context_of(run_id))


def _context_of(run_id: int) -> RunLogContext:
    current = _current_run.get()
    return current if current is not None and current.run_id == run_id else RunLogContext(run_id=run_id)


def unbind_run(token: contextvars.Token[RunLogContext | None]) -> None:
    """Restore what was bound before the `bind_run` that returned `token` (in the same thread or task)."""
    _current_run.reset(token)


@contextmanager
def run_log_context(run_id: int) -> Iterator[RunLogContext]:
    """Tag the log lines of this block with run `run_id` (see `bind_run`)."""
    context = _context_of(run_id)
    token = _current_run.set(context)
    try:
        yield context
    finally:
        unbind_run(token)


@overload
def logged_as_run(function: Callable[P, Coroutine[Any, Any, R]]) -> Callable[P, Coroutine[Any, Any, R]]: ...


@overload
def logged_as_run(function: Callable[P, R]) -> Callable[P, R]: ...


def logged_as_run(function: Callable[P, Any]) -> Callable[P, Any]:
    """Decorate a function or coroutine function that takes a `run_id` so that its log lines are tagged with that run."""
    signature = inspect.signature(function)

    def run_id_of(args: tuple[object, ...], kwargs: dict[str, object]) -> int:
        return int(signature.bind(*args, **kwargs).arguments["run_id"])

    if inspect.iscoroutinefunction(function):
        @functools.wraps(function)
        async def tagged_coroutine(*args: P.args, **kwargs: P.kwargs) -> object:
            with run_log_context(run_id_of(args, kwargs)):
                return await function(*args, **kwargs)

        return tagged_coroutine

    @functools.wraps(function)
    def tagged(*args: P.args, **kwargs: P.kwargs) -> Any:
        with run_log_context(run_id_of(args, kwargs)):
            return function(*args, **kwargs)

    return tagged


def describe_run(*, conversation_id: int | None = None, platform: str | None = None,
                 workspace: str | None = None) -> None:
    """Add the run's conversation, platform and workspace to its log lines; nothing outside a run."""
    current = _current_run.get()
    if current is None:
        return
    current.conversation_id = conversation_id if conversation_id is not None else current.conversation_id
    current.platform = platform or current.platform
    current.workspace = workspace or current.workspace


def set_run_phase(phase: str) -> None:
    """Name the phase the current run is in on its log lines from now on; nothing outside a run."""
    current = _current_run.get()
    if current is not None:
        current.phase = phase


class RunContextFilter(logging.Filter):
    """Copies the current run's context onto every record it sees (None fields outside a run); drops nothing.

    Attached to a handler, it sees the records of every logger, libraries' too, in the thread that logged them.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        current = _current_run.get()
        values = asdict(current) if current is not None else dict.fromkeys(RUN_FIELDS)
        for name in RUN_FIELDS:
            setattr(record, name, values[name])
        return True
