"""The words a run's row stores: its state and mode as literal types (stored values and JSON stay plain strings),
and the models of its JSON columns."""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict

RunState = Literal["queued", "running", "done", "failed", "cancelled", "timed_out"]
RunMode = Literal["research", "plan", "chat", "followup"]

# A run in flight: waiting for a worker or being worked on; the database allows one a thread.
ACTIVE_STATES: frozenset[RunState] = frozenset({"queued", "running"})
TERMINAL_STATES: frozenset[RunState] = frozenset({"done", "failed", "cancelled", "timed_out"})

RUN_STATES: frozenset[RunState] = frozenset(get_args(RunState))
RUN_MODES: frozenset[RunMode] = frozenset(get_args(RunMode))

# A mode as people read it, wherever runs are listed (the history, `deepthread runs`, the status lines): one word list.
MODE_NAMES: dict[RunMode, str] = {"research": "research", "plan": "plan", "chat": "quick answer",
                                  "followup": "follow-up"}


def mode_name(mode: RunMode) -> str:
    """`chat` → `quick answer`, `followup` → `follow-up`; research and plan by their own name."""
    return MODE_NAMES[mode]


def run_state(value: str) -> RunState:
    """`value` (a database row's or a request's string) as a run state; raises ValueError for any other word."""
    if value not in RUN_STATES:
        raise ValueError(f"not a run state: {value!r}")
    return value


def run_mode(value: str) -> RunMode:
    """`value` (a database row's or a request's string) as a run mode; raises ValueError for any other word."""
    if value not in RUN_MODES:
        raise ValueError(f"not a run mode: {value!r}")
    return value


class RunOptions(BaseModel):
    """The requester's narrowing of a run, stored as JSON on its row (`runs.options`).

    `since` is an ISO date; `preset` shortens (`quick`) or deepens (`deep`) the budget; `files_only` keeps the
    run to the files shared in its conversation; a follow-up names the run whose passages it answers from in
    `answer_from_run`.
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    since: str | None = None
    sites: list[str] | None = None
    preset: Literal["quick", "deep"] | None = None
    answer_from_run: int | None = None
    # Only the files shared in the conversation, no search provider called (`--files-only`, or "files only").
    files_only: bool = False

    def carried(self) -> RunOptions:
        """The narrowing a follow-on run of the same question keeps (since, sites, preset, files only), not what it
        answered from."""
        return self.model_copy(update={"answer_from_run": None})

    def merged(self, newer: RunOptions) -> RunOptions:
        """These options with each one `newer` sets taken from it."""
        return self.model_copy(update=newer.model_dump(exclude_unset=True, exclude_none=True))


DeliveredKind = Literal["message", "file", "notice", "progress"]


class DeliveredMessage(BaseModel):
    """One message a run put in its thread, recorded so a retried delivery edits it instead of posting again.

    `ref` is the platform's reference (a `chat.message.MessageRef` as JSON; storage names no chat
    type); a `file` upload may have none. `streamed`: the answer was streamed into it before its
    audit; `final`: a progress message already shows the run's final state.
    """

    model_config = ConfigDict(frozen=True)

    kind: DeliveredKind
    ref: dict[str, Any] | None = None
    streamed: bool = False
    final: bool = False
