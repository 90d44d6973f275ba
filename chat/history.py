"""A person's run history as the renderers show it: their recent runs and the channel's, each with its thread."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from pydantic import BaseModel, Field

from chat.message import Place
from storage.vocabulary import RunMode, RunState
from storage.vocabulary import mode_name as mode_name  # every renderer names modes with the one word list


class RunSummary(BaseModel):
    """One run in a history listing: what was asked, how it ended, when, by whom, and the thread it lives in."""

    run_id: int
    mode: RunMode
    state: RunState
    question: str
    requested_by: str
    created_at: dt.datetime
    thread: Place


class RunHistory(BaseModel):
    """The caller's recent runs that may be shown where they asked, and the other recent runs of that channel."""

    yours: list[RunSummary] = Field(default_factory=list)
    channel: list[RunSummary] = Field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.yours and not self.channel


YOURS_HEADING = "Your recent runs"
CHANNEL_HEADING = "Other recent runs in this channel"
NO_RUNS = "No runs to show here yet. Start one with `/research QUESTION`."


def history_listing(history: RunHistory, *, heading: Callable[[str], str], line: Callable[[RunSummary], str],
                    limit: int | None = None, more: Callable[[int], str] = lambda left_out: f"…and {left_out} more.") -> str:
    """Each section's heading and one line per run; with `limit`, the oldest runs (the channel's first) are left out
    until the text fits, and a last line says how many."""
    yours, channel = list(history.yours), list(history.channel)
    left_out = 0
    while True:
        lines: list[str] = []
        for title, runs in ((YOURS_HEADING, yours), (CHANNEL_HEADING, channel)):
            if runs:
                lines += [heading(title), *(line(run) for run in runs)]
        if left_out:
            lines.append(more(left_out))
        text = "\n".join(lines)
        if limit is None or len(text) <= limit or not (yours or channel):
            return text
        (channel if channel else yours).pop()
        left_out += 1
