"""Discord's side of "Watch this": the private form a click under a research report opens — how often, at what hour,
and where each run posts — known by its custom ids alone.

Every component of the form carries the whole form in its custom id (`deepthread:watch-form:hour:42:weekly:9:20260522`:
the part, the run, the cadence, the hour, and the day the form was opened, whose weekday and day of the month the
weekly and monthly choices use). A choice is answered by drawing the form again with the choice in every custom id, and
a Watch button by handing the schedule to the core, so nothing is kept in memory: a form opened before the bot
restarted still works. The day is the server's today (its watches' time zone, `/watches timezone`), so the weekly
choice names the weekday the watch will run on there.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from chat.discord.render import (
    BUTTON_PRIMARY,
    BUTTON_SECONDARY,
    WATCH_THIS_PREFIX,
    action_row,
    button,
    escape_text,
)
from storage.vocabulary import WEEKDAYS, Cadence, WatchSchedule

WATCH_FORM_PREFIX = "deepthread:watch-form:"
# The parts of the form: two selects (how often, at what hour) and two buttons (a new thread each run, or this one).
FormPart = Literal["how", "hour", "new", "one"]
FORM_PARTS: tuple[FormPart, ...] = ("how", "hour", "new", "one")
CADENCES: tuple[Cadence, ...] = ("daily", "weekly", "monthly")
DEFAULT_CADENCE: Cadence = "weekly"
DEFAULT_HOUR = 9
SELECT_MENU = 3
NEW_THREAD_LABEL = "Watch, new thread each run"
THIS_THREAD_LABEL = "Watch in this thread"

# A workspace (a guild's id) → the IANA time zone its watches use.
TimeZoneLookup = Callable[[str], Awaitable[str]]


@dataclass(frozen=True)
class WatchForm:
    """The form's choices so far: the run watched, how often, at what hour, and the day it was opened."""

    run_id: int
    cadence: Cadence
    hour: int
    opened_on: dt.date

    @classmethod
    def opened(cls, run_id: int, today: dt.date) -> WatchForm:
        """The form as a "Watch this" click opens it: weekly on today's weekday, at 09:00."""
        return cls(run_id=run_id, cadence=DEFAULT_CADENCE, hour=DEFAULT_HOUR, opened_on=today)

    def custom_id(self, part: FormPart) -> str:
        """`deepthread:watch-form:<part>:<run>:<cadence>:<hour>:<yyyymmdd>`, at most 60 characters."""
        return f"{WATCH_FORM_PREFIX}{part}:{self.run_id}:{self.cadence}:{self.hour}:{self.opened_on:%Y%m%d}"

    def chosen(self, part: FormPart, values: Sequence[str]) -> WatchForm:
        """The form with what a select of it was set to (`values`); unchanged for a button or a value it does not
        offer."""
        value = values[0] if values else ""
        if part == "how":
            cadence = next((known for known in CADENCES if known == value), None)
            return replace(self, cadence=cadence) if cadence else self
        if part == "hour" and value.isdigit() and 0 <= int(value) <= 23:
            return replace(self, hour=int(value))
        return self

    def schedule(self) -> WatchSchedule:
        """The schedule chosen; its time zone is the core's to set (the server's)."""
        if self.cadence == "weekly":
            return WatchSchedule(cadence="weekly", hour=self.hour, weekday=self.opened_on.weekday())
        if self.cadence == "monthly":
            return WatchSchedule(cadence="monthly", hour=self.hour, day=self.opened_on.day)
        return WatchSchedule(cadence="daily", hour=self.hour)

    def components(self) -> list[dict[str, Any]]:
        """Two select menus (how often; the 24 hours, within Discord's 25 options) and the two Watch buttons."""
        cadences = [_option(cadence_label(cadence, self.opened_on), cadence, self.cadence == cadence)
                    for cadence in CADENCES]
        hours = [_option(f"{hour:02d}:00", str(hour), self.hour == hour) for hour in range(24)]
        return [action_row(_select(self.custom_id("how"), "How often", cadences)),
                action_row(_select(self.custom_id("hour"), "At what hour", hours)),
                action_row(button(NEW_THREAD_LABEL, self.custom_id("new"), BUTTON_PRIMARY),
                           button(THIS_THREAD_LABEL, self.custom_id("one"), BUTTON_SECONDARY))]


def cadence_label(cadence: Cadence, day: dt.date) -> str:
    """`Daily`, `Weekly on Friday`, `Monthly on day 22`, the day being the one the form was opened on."""
    if cadence == "weekly":
        return f"Weekly on {WEEKDAYS[day.weekday()]}"
    if cadence == "monthly":
        shorter = " (the last day in shorter months)" if day.day > 28 else ""
        return f"Monthly on day {day.day}{shorter}"
    return "Daily"


def form_text(timezone: str) -> str:
    """What the form says above its choices."""
    return (f"🔭 **Watch this question**: it runs again on its own, and each run opens with what changed.\n"
            f"Choose how often and at what hour ({escape_text(timezone)} time, this server's; `/watches timezone` "
            "changes it), then where each run posts.")


def watched_run(custom_id: str) -> int | None:
    """The run a "Watch this" button names (`deepthread:watch:42`); None for any other custom id."""
    run = custom_id.removeprefix(WATCH_THIS_PREFIX) if custom_id.startswith(WATCH_THIS_PREFIX) else ""
    return int(run) if run.isdigit() else None


def form_click(custom_id: str, values: Sequence[str]) -> tuple[FormPart, WatchForm] | None:
    """Which part of a watch form was used and the form with its choice made; None for any other custom id (or one
    that does not read as a form's)."""
    if not custom_id.startswith(WATCH_FORM_PREFIX):
        return None
    words = custom_id.removeprefix(WATCH_FORM_PREFIX).split(":")
    if len(words) != 5:
        return None
    written_part, run, written_cadence, hour, opened_on = words
    part = next((known for known in FORM_PARTS if known == written_part), None)
    cadence = next((known for known in CADENCES if known == written_cadence), None)
    if part is None or cadence is None or not run.isdigit() or not hour.isdigit() or not 0 <= int(hour) <= 23:
        return None
    try:
        day = dt.datetime.strptime(opened_on, "%Y%m%d").date()
    except ValueError:
        return None
    form = WatchForm(run_id=int(run), cadence=cadence, hour=int(hour), opened_on=day)
    return part, form.chosen(part, values)


def _option(label: str, value: str, default: bool) -> dict[str, Any]:
    return {"label": label, "value": value, "default": default}


def _select(custom_id: str, placeholder: str, options: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": SELECT_MENU, "custom_id": custom_id, "placeholder": placeholder, "options": options,
            "min_values": 1, "max_values": 1}
