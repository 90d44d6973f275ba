"""Watches as the renderers show them: a channel's watches with their schedules, and what each person may do."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from chat.message import DirectMessaging, Messenger
from chat.state import RunProgress
from chat.text import platform_user, shortened, single_line
from research.report import Report, WatchComparison
from storage.vocabulary import SkipReason, WatchSchedule, WatchState, zone_of

if TYPE_CHECKING:
    from storage.watches import WatchView  # storage's ORM: not on the terminal's start-up
    from chat.render import PlatformRenderer  # which imports this module's listing

logger = logging.getLogger(__name__)

NO_WATCHES = ("No watches in this channel yet. Under a finished report, press **Watch this** to have it come back on "
              "its own.")


class WatchSummary(BaseModel):
    """One watch in a listing: what it asks, when it runs, how it stands, who made it, and whether the person looking
    may pause, resume or delete it (its owner, or an admin)."""

    watch_id: int
    question: str
    schedule: WatchSchedule
    state: WatchState
    stopped_reason: str | None = None
    next_due_at: dt.datetime
    created_by: str
    one_thread: bool = False
    may_change: bool = False

    @property
    def when(self) -> str:
        """`every Monday at 09:00 (Europe/Paris)`, or why it does not run."""
        if self.state == "paused":
            return f"paused ({self.schedule.describe()})"
        if self.state == "stopped":
            return f"stopped: {self.stopped_reason or 'for good'}"
        return self.schedule.describe()

    def next_run_words(self) -> str:
        """`next 30 Nov 2026 09:00 (Europe/Paris)` in the schedule's own zone; empty unless active."""
        if self.state != "active":
            return ""
        local = self.next_due_at.astimezone(zone_of(self.schedule.timezone))
        return f"next {local.strftime('%-d %b %Y %H:%M')} ({self.schedule.timezone})"


class WatchListing(BaseModel):
    """The watches of the channel a person asked in, oldest first."""

    watches: list[WatchSummary] = Field(default_factory=list)


def watch_line(watch: WatchSummary) -> str:
    """One watch in neutral markup: number, question, schedule, next run, owner (`{owner}` marks where the platform's
    mention of `created_by` goes)."""
    parts = [f"**#{watch.watch_id}** {shortened(single_line(watch.question), 120)}", watch.when]
    if next_run := watch.next_run_words():
        parts.append(next_run)
    return " · ".join(parts)


def listing_text(listing: WatchListing, *, mention: Callable[[str], str]) -> str:
    """The whole listing in neutral markup, each watch with its owner mentioned by `mention`."""
    if not listing.watches:
        return NO_WATCHES
    lines = ["**Watches in this channel**"]
    lines += [f"• {watch_line(watch)} · by {mention(watch.created_by)}" for watch in listing.watches]
    return "\n".join(lines)


def day_words(moment: dt.datetime | None) -> str:
    """`27 Nov 2026` (UTC), or `its last run` when the moment is unknown."""
    return moment.astimezone(dt.timezone.utc).strftime("%-d %b %Y") if moment is not None else "its last run"


def watch_headline(question: str, report: Report | None) -> str:
    """The first line of a watch run's own thread: what is watched, and how much changed."""
    comparison = report.watch if report is not None else None
    if comparison is None:
        what = "a new report"
    else:
        count = len(comparison.changes)
        what = f"{count} change{'s' if count != 1 else ''} since {day_words(comparison.since)}"
    return f"🔭 Watch: {shortened(single_line(question), 150)} — {what}"


def quiet_line(progress: RunProgress, comparison: WatchComparison | None) -> str:
    """The one line a watch's run leaves in its previous thread instead of a new report: nothing changed, or the run
    ended without a report (and why, in plain words)."""
    if progress.state == "done":
        since = day_words(comparison.since) if comparison is not None else "its last run"
        return f"🔭 Checked again: nothing changed since the report of {since}."
    if progress.state == "cancelled":
        return "🔭 This watch's run was stopped before it finished; it runs again at its next time."
    if progress.state == "timed_out":
        return "🔭 This watch's run ran out of time before it could write a report; it runs again at its next time."
    reason = f": {shortened(single_line(progress.error), 200)}" if progress.error else ""
    return f"🔭 This watch's run failed{reason}. It runs again at its next time."


def skip_words(reason: SkipReason) -> str:
    """Why a watch's window started no run, in plain words."""
    match reason.kind:
        case "runs_per_user":
            return f"its owner reached the daily limit of {int(reason.figure)} runs"
        case "cost_per_workspace":
            return f"this workspace reached its daily spending limit of ${reason.figure:.2f}"
        case "workspace_queue":
            return f"{int(reason.figure)} runs were already waiting in this workspace, as many as may wait"
        case "owner_queue":
            return f"its owner already had {int(reason.figure)} runs waiting, as many as may wait"
        case "thread_busy":
            return "a run was still going in its thread"


def skipped_line(watch: WatchView, reason: SkipReason) -> str:
    """The line a watch's latest thread gets when a window started no run: why, and when it tries again."""
    return (f"⏭️ This watch's run did not start: {skip_words(reason)}. It tries again {watch.schedule.describe()} "
            f"(“{shortened(single_line(watch.question), 80)}”).")


def stopped_line(question: str, reason: str) -> str:
    """What a watch's owner is told, once, when it stops for good."""
    return (f"🔭 Your watch of “{shortened(single_line(question), 150)}” stopped: {reason}. Its past reports stay in "
            "their threads.")


async def tell_owner_stopped(messenger: Messenger, renderer: PlatformRenderer, watch: WatchView) -> None:
    """A direct message to the owner of a watch that just stopped, where the platform lets the bot write one (a
    refusal is logged, never raised)."""
    if not isinstance(messenger, DirectMessaging):
        return
    owner = platform_user(watch.created_by)
    try:
        await messenger.direct(watch.workspace, owner, renderer.notice(stopped_line(watch.question,
                                                                                  watch.stopped_reason or "")))
    except Exception as error:
        logger.warning("could not tell the owner of watch %s that it stopped (%s)", watch.id, error)
