"""The words a run's row stores: its state and mode as literal types (stored values and JSON stay plain strings),
and the models of its JSON columns."""

from __future__ import annotations

import datetime as dt
import zoneinfo
from typing import Any, Literal, NamedTuple, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

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


WatchState = Literal["active", "paused", "stopped"]
WATCH_ACTIVE: WatchState = "active"
WATCH_PAUSED: WatchState = "paused"
WATCH_STOPPED: WatchState = "stopped"  # for good: its channel gone, its owner gone (a person may resume it)
Cadence = Literal["daily", "weekly", "monthly"]
CADENCES: tuple[Cadence, ...] = ("daily", "weekly", "monthly")
CADENCE_DAYS: dict[Cadence, int] = {"daily": 1, "weekly": 7, "monthly": 28}  # the shortest gap between two firings
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


PENDING_THREAD_PREFIX = "watch-pending:"  # a watch's fired run's conversation before its thread is opened

SkipKind = Literal["runs_per_user", "cost_per_workspace", "workspace_queue", "owner_queue", "thread_busy"]


class SkipReason(NamedTuple):
    """Why a watch's window started no run: the cap that refused it and that cap's figure (runs or dollars allowed,
    runs already waiting; none for a thread still busy). `chat.watches` puts it in words."""

    kind: SkipKind
    figure: float = 0.0


class WatchLimits(NamedTuple):
    """What a workspace may have: `max_active` active watches (0: no cap), none repeating oftener than `min_interval`."""

    max_active: int
    min_interval: Cadence

    @classmethod
    def from_settings(cls, settings: Any) -> WatchLimits:
        return cls(settings.watch_max_per_workspace, settings.watch_min_interval)


class WatchSchedule(BaseModel):
    """When a watch fires, as its owner chose it: daily, weekly (on `weekday`, 0 is Monday) or monthly (on `day`, the
    month's last day when it has fewer), at `hour`:`minute` wall-clock time in the IANA time zone `timezone`.

    Stored as JSON on the watch's row (`watches.schedule`); `next_after` is the only arithmetic of time zones.
    """

    model_config = ConfigDict(frozen=True)

    cadence: Cadence
    hour: int = Field(ge=0, le=23)
    minute: int = Field(default=0, ge=0, le=59)
    weekday: int | None = Field(default=None, ge=0, le=6)
    day: int | None = Field(default=None, ge=1, le=31)
    timezone: str = "UTC"

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        zone_of(value)
        return value

    @model_validator(mode="after")
    def _day_for_its_cadence(self) -> WatchSchedule:
        if self.cadence == "weekly" and self.weekday is None:
            raise ValueError("a weekly watch needs its weekday")
        if self.cadence == "monthly" and self.day is None:
            raise ValueError("a monthly watch needs its day of the month")
        return self

    def next_after(self, moment: dt.datetime) -> dt.datetime:
        """The first firing strictly after `moment` (aware), in UTC. A wall-clock time that a daylight-saving change
        skips fires at the same offset as before the change; one it repeats fires once, the first time."""
        zone = zone_of(self.timezone)
        day = moment.astimezone(zone).date()
        for _ in range(400):
            if self._fires_on(day):
                local = dt.datetime.combine(day, dt.time(self.hour, self.minute), tzinfo=zone)
                firing = local.astimezone(dt.timezone.utc)
                if firing > moment:
                    return firing
            day += dt.timedelta(days=1)
        raise AssertionError("no firing in 400 days")  # every cadence fires at least once a month

    def _fires_on(self, day: dt.date) -> bool:
        if self.cadence == "daily":
            return True
        if self.cadence == "weekly":
            return day.weekday() == self.weekday
        last_day = (day.replace(day=28) + dt.timedelta(days=4)).replace(day=1) - dt.timedelta(days=1)
        return day.day == min(self.day or 1, last_day.day)

    def describe(self) -> str:
        """`every Monday at 09:00 (Europe/Paris)`, as people read it."""
        at = f"{self.hour:02d}:{self.minute:02d} ({self.timezone})"
        if self.cadence == "daily":
            return f"every day at {at}"
        if self.cadence == "weekly":
            return f"every {WEEKDAYS[self.weekday or 0]} at {at}"
        return f"on day {self.day} of every month at {at}"


def zone_of(name: str) -> dt.tzinfo:
    """The IANA time zone `name`; raises ValueError naming it when there is no such zone."""
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as error:
        raise ValueError(f"unknown time zone {name!r} (an IANA name, like Europe/Paris)") from error
