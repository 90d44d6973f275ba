"""The words a run's row stores for its state and mode, as literal types, so stored values and JSON stay plain strings."""

from __future__ import annotations

from typing import Literal, get_args

RunState = Literal["queued", "running", "done", "failed", "cancelled", "timed_out"]
RunMode = Literal["research", "plan", "chat", "followup"]

# A run in flight: waiting for a worker or being worked on; the database allows one a thread.
ACTIVE_STATES: frozenset[RunState] = frozenset({"queued", "running"})
TERMINAL_STATES: frozenset[RunState] = frozenset({"done", "failed", "cancelled", "timed_out"})

RUN_STATES: frozenset[str] = frozenset(get_args(RunState))
RUN_MODES: frozenset[str] = frozenset(get_args(RunMode))


def run_state(value: str) -> RunState:
    """`value` (a database row's or a request's string) as a run state; raises ValueError for any other word."""
    if value not in RUN_STATES:
        raise ValueError(f"not a run state: {value!r}")
    return value  # type: ignore[return-value]  # checked against get_args(RunState) just above


def run_mode(value: str) -> RunMode:
    """`value` (a database row's or a request's string) as a run mode; raises ValueError for any other word."""
    if value not in RUN_MODES:
        raise ValueError(f"not a run mode: {value!r}")
    return value  # type: ignore[return-value]  # checked against get_args(RunMode) just above
