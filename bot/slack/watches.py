"""Slack's side of watches: the "Watch this" button's modal (how often, at what hour, on which weekday or day of the
month, in this thread or each run in its own), the modal's submission as a `watch` ChatEvent, `/watches` as a command
event, a listing's Pause, Resume and Delete clicks as events, and each person's time zone from `users.info`,
remembered for a few minutes.

The modal's `private_metadata` carries the run, channel and thread the click came from: a `view_submission` names
no channel, and the person's confirmation goes, privately, to the report's thread.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Literal

import aiohttp
from pydantic import BaseModel, ValidationError
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.models.blocks import CheckboxesElement, InputBlock, Option, SectionBlock, StaticSelectElement
from slack_sdk.models.views import View
from slack_sdk.web.async_client import AsyncWebClient

from bot.conversation.events import ChatEvent
from chat.slack.render import (
    WATCH_ACTION_ID,
    WATCH_DELETE_ACTION_ID,
    WATCH_PAUSE_ACTION_ID,
    WATCH_RESUME_ACTION_ID,
)
from storage.vocabulary import CADENCES, WEEKDAYS, Cadence, WatchSchedule, zone_of

logger = logging.getLogger(__name__)

PLATFORM = "slack"
WATCHES_COMMAND = "/watches"
WATCH_CALLBACK_ID = "deepthread_watch_form"
WATCH_BUTTON_ACTIONS: dict[str, Literal["watch_pause", "watch_resume", "watch_delete"]] = {
    WATCH_PAUSE_ACTION_ID: "watch_pause", WATCH_RESUME_ACTION_ID: "watch_resume", WATCH_DELETE_ACTION_ID: "watch_delete",
}
CADENCE_BLOCK, CADENCE_ACTION = "watch_cadence", "cadence"
HOUR_BLOCK, HOUR_ACTION = "watch_hour", "hour"
WEEKDAY_BLOCK, WEEKDAY_ACTION = "watch_weekday", "weekday"
DAY_BLOCK, DAY_ACTION = "watch_day", "day"
THREAD_BLOCK, THREAD_ACTION = "watch_thread", "one_thread"
ONE_THREAD = "one_thread"
CADENCE_OF: dict[str, Cadence] = {cadence: cadence for cadence in CADENCES}
CADENCE_LABELS: dict[Cadence, str] = {"daily": "Daily", "weekly": "Weekly", "monthly": "Monthly"}
DEFAULT_CADENCE: Cadence = "weekly"
DEFAULT_HOUR = 9
LAST_DAY = 31  # WatchSchedule fires a day past the month's end on its last day
MONTH_DAYS_OFFERED = 28  # every month has them
ZONE_CACHE_SECONDS = 300.0
ZONE_CACHE_PEOPLE = 1_000
# The modal's trigger lives three seconds: the weekday of the click is read in the person's zone only if Slack says
# it by then.
ZONE_WAIT_BEFORE_MODAL_SECONDS = 1.0

FormErrors = dict[str, str]


class WatchContext(BaseModel):
    """What the modal remembers in `private_metadata`: the run to watch, and the channel and thread of the click."""

    run_id: int
    channel: str
    thread: str | None = None


class WatchForm(BaseModel):
    """A submitted modal, read: where it was opened, the schedule chosen (time zone still to be set), one thread."""

    context: WatchContext
    schedule: WatchSchedule
    one_thread: bool = False


def _clicker(body: dict[str, Any]) -> tuple[str, str]:
    """The platform-qualified user and the workspace of an interaction payload."""
    user = body.get("user") or {}
    workspace = (body.get("team") or {}).get("id") or user.get("team_id") or ""
    return f"{PLATFORM}:{user.get('id', '')}", str(workspace)


def _clicked(body: dict[str, Any], action_ids: Any) -> dict[str, Any] | None:
    return next((action for action in body.get("actions") or [] if action.get("action_id") in action_ids), None)


def _click_place(body: dict[str, Any]) -> tuple[str, str | None, str | None]:
    """The channel, thread and message of a click (an ephemeral message has no `message`, only its container)."""
    container = body.get("container") or {}
    message = body.get("message") or {}
    channel = (body.get("channel") or {}).get("id") or container.get("channel_id") or ""
    message_ts = message.get("ts") or container.get("message_ts")
    thread = message.get("thread_ts") or container.get("thread_ts")
    return str(channel), thread, message_ts


# --- "Watch this" and its modal -------------------------------------------------------------------------

def watch_this_context(body: dict[str, Any]) -> WatchContext | None:
    """Where a click on "Watch this" (value: the run id) came from; None for any other payload."""
    action = _clicked(body, (WATCH_ACTION_ID,))
    value = str(action.get("value") or "") if action else ""
    if not value.isdigit():
        return None
    channel, thread, message_ts = _click_place(body)
    return WatchContext(run_id=int(value), channel=channel, thread=thread or message_ts)


def _option(text: str, value: str) -> Option:
    return Option(text=text, value=value)


def watch_view(context: WatchContext, *, today: dt.date) -> View:
    """The modal "Watch this" opens: cadence, hour, weekday and day of the month (defaulting to the day of the click),
    and whether every run posts in this thread; sent back with the run, channel and thread in its metadata."""
    cadences = {cadence: _option(CADENCE_LABELS[cadence], cadence) for cadence in CADENCES}
    hours = [_option(f"{hour:02d}:00", str(hour)) for hour in range(24)]
    weekdays = [_option(name, str(number)) for number, name in enumerate(WEEKDAYS)]
    days = [_option(str(day), str(day)) for day in range(1, MONTH_DAYS_OFFERED + 1)] + [_option("Last day", str(LAST_DAY))]
    today_day = today.day if today.day <= MONTH_DAYS_OFFERED else LAST_DAY
    one_thread = _option("Post every run in this thread", ONE_THREAD)
    return View(
        type="modal", callback_id=WATCH_CALLBACK_ID, private_metadata=context.model_dump_json(),
        title="Watch this question", submit="Watch", close="Cancel",
        blocks=[
            SectionBlock(text="I'll research this question again on a schedule and post what changed since the last "
                              "report."),
            InputBlock(block_id=CADENCE_BLOCK, label="How often",
                       element=StaticSelectElement(action_id=CADENCE_ACTION, options=list(cadences.values()),
                                                   initial_option=cadences[DEFAULT_CADENCE])),
            InputBlock(block_id=HOUR_BLOCK, label="At what time", hint="In your time zone, as your Slack profile says it.",
                       element=StaticSelectElement(action_id=HOUR_ACTION, options=hours,
                                                   initial_option=hours[DEFAULT_HOUR])),
            InputBlock(block_id=WEEKDAY_BLOCK, label="Day of the week (weekly)", optional=True,
                       element=StaticSelectElement(action_id=WEEKDAY_ACTION, options=weekdays,
                                                   initial_option=weekdays[today.weekday()])),
            InputBlock(block_id=DAY_BLOCK, label="Day of the month (monthly)", optional=True,
                       hint="Last day: the 28th, 29th, 30th or 31st, as the month has.",
                       element=StaticSelectElement(action_id=DAY_ACTION, options=days,
                                                   initial_option=days[-1] if today_day == LAST_DAY
                                                   else days[today_day - 1])),
            InputBlock(block_id=THREAD_BLOCK, label="Thread", optional=True,
                       hint="Otherwise each run opens a thread of its own in the channel.",
                       element=CheckboxesElement(action_id=THREAD_ACTION, options=[one_thread])),
        ])


async def open_watch_form(client: AsyncWebClient, *, trigger_id: str | None, context: WatchContext,
                          today: dt.date) -> bool:
    """Open the "Watch this" modal with the click's trigger; False (logged) when Slack refuses or is unreachable."""
    if not trigger_id:
        return False
    try:
        await client.views_open(trigger_id=trigger_id, view=watch_view(context, today=today))
    except (SlackApiError, SlackClientError, aiohttp.ClientError, asyncio.TimeoutError) as error:
        code = error.response.get("error") if isinstance(error, SlackApiError) else type(error).__name__
        logger.warning("could not open the watch modal (%s)", code)
        return False
    return True


def _selected(values: dict[str, Any], block_id: str, action_id: str) -> str | None:
    option = ((values.get(block_id) or {}).get(action_id) or {}).get("selected_option") or {}
    value = option.get("value")
    return str(value) if value is not None else None


def _number(value: str | None, low: int, high: int) -> int | None:
    return int(value) if value is not None and value.isdigit() and low <= int(value) <= high else None


def read_watch_form(view: dict[str, Any]) -> WatchForm | FormErrors:
    """The watch a submitted modal asks for, or what to say beside each input that is missing (Slack shows it
    there): a weekly watch needs its weekday, a monthly one its day."""
    try:
        context = WatchContext.model_validate(json.loads(view.get("private_metadata") or "{}"))
    except (ValueError, ValidationError):
        return {CADENCE_BLOCK: "This form has expired. Close it and press Watch this again."}
    values = (view.get("state") or {}).get("values") or {}
    cadence = CADENCE_OF.get(_selected(values, CADENCE_BLOCK, CADENCE_ACTION) or "")
    hour = _number(_selected(values, HOUR_BLOCK, HOUR_ACTION), 0, 23)
    weekday = _number(_selected(values, WEEKDAY_BLOCK, WEEKDAY_ACTION), 0, 6) if cadence == "weekly" else None
    day = _number(_selected(values, DAY_BLOCK, DAY_ACTION), 1, LAST_DAY) if cadence == "monthly" else None
    errors: FormErrors = {}
    if cadence is None:
        errors[CADENCE_BLOCK] = "Choose how often: daily, weekly or monthly."
    if hour is None:
        errors[HOUR_BLOCK] = "Choose the hour it runs at."
    if cadence == "weekly" and weekday is None:
        errors[WEEKDAY_BLOCK] = "Choose the day of the week a weekly watch runs on."
    if cadence == "monthly" and day is None:
        errors[DAY_BLOCK] = "Choose the day of the month a monthly watch runs on."
    if cadence is None or hour is None or errors:
        return errors
    chosen = (((values.get(THREAD_BLOCK) or {}).get(THREAD_ACTION) or {}).get("selected_options")) or []
    return WatchForm(context=context, schedule=WatchSchedule(cadence=cadence, hour=hour, weekday=weekday, day=day),
                     one_thread=any(option.get("value") == ONE_THREAD for option in chosen))


def watch_event(body: dict[str, Any], form: WatchForm, *, timezone: str | None) -> ChatEvent:
    """The `watch` ChatEvent of a submitted modal, with the person's time zone where Slack told it."""
    user, workspace = _clicker(body)
    return ChatEvent(platform=PLATFORM, workspace=workspace, channel=form.context.channel, user=user, kind="action",
                     action="watch", action_run_id=form.context.run_id, watch_schedule=form.schedule,
                     watch_one_thread=form.one_thread, timezone=timezone, thread=form.context.thread)


# --- /watches and a listing's buttons ---------------------------------------------------------------------

def watches_command_event(command: dict[str, Any], *, timezone: str | None) -> ChatEvent:
    """The ChatEvent of `/watches [pause|resume|delete N | timezone Zone]`."""
    return ChatEvent(platform=PLATFORM, workspace=str(command.get("team_id", "")),
                     channel=str(command.get("channel_id", "")), user=f"{PLATFORM}:{command.get('user_id', '')}",
                     kind="command", command="watches", text=str(command.get("text") or "").strip(),
                     timezone=timezone)


def watch_button_event(body: dict[str, Any]) -> ChatEvent | None:
    """The ChatEvent of a click on a listing's Pause, Resume or Delete (value: the watch id); None otherwise."""
    action = _clicked(body, WATCH_BUTTON_ACTIONS)
    value = str(action.get("value") or "") if action else ""
    if action is None or not value.isdigit():
        return None
    user, workspace = _clicker(body)
    channel, thread, message_ts = _click_place(body)
    return ChatEvent(platform=PLATFORM, workspace=workspace, channel=channel, user=user, kind="action",
                     action=WATCH_BUTTON_ACTIONS[str(action["action_id"])], watch_id=int(value), thread=thread,
                     message_id=message_ts)


# --- each person's time zone ------------------------------------------------------------------------------

class PersonZones:
    """Each person's IANA time zone as `users.info` says it (`user.tz`), remembered for `cache_seconds`, for at
    most `max_people` people at once (the longest remembered forgotten first).

    A failed lookup is None and is not remembered: a watch then takes the workspace's zone, and the next asks again.
    """

    def __init__(self, *, cache_seconds: float = ZONE_CACHE_SECONDS, max_people: int = ZONE_CACHE_PEOPLE,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cache_seconds = cache_seconds
        self.max_people = max_people
        self.clock = clock
        self._zones: OrderedDict[str, tuple[float, str | None]] = OrderedDict()

    async def of(self, client: AsyncWebClient, user_id: str) -> str | None:
        """The zone of Slack user `user_id`, or None (no zone, an unknown one, or users.info failed); never raises."""
        known = self._zones.get(user_id)
        if known is not None and known[0] > self.clock():
            return known[1]
        try:
            answer = await client.users_info(user=user_id)
        except (SlackApiError, SlackClientError, aiohttp.ClientError, asyncio.TimeoutError) as error:
            code = error.response.get("error") if isinstance(error, SlackApiError) else type(error).__name__
            logger.info("users.info failed; the person's time zone is unknown (%s)", code)
            return None
        zone = _zone_of_user(answer.get("user") or {})
        self._zones.pop(user_id, None)
        self._zones[user_id] = (self.clock() + self.cache_seconds, zone)
        while len(self._zones) > self.max_people:
            self._zones.popitem(last=False)
        return zone

    async def of_quickly(self, client: AsyncWebClient, user_id: str, *,
                         within: float = ZONE_WAIT_BEFORE_MODAL_SECONDS) -> str | None:
        """`of`, or None when Slack has not answered `within` seconds."""
        try:
            return await asyncio.wait_for(self.of(client, user_id), within)
        except asyncio.TimeoutError:
            return None


def _zone_of_user(user: dict[str, Any]) -> str | None:
    zone = user.get("tz")
    if user.get("deleted") or not isinstance(zone, str) or not zone:
        return None
    try:
        zone_of(zone)
    except ValueError:
        return None
    return zone


def today_in(zone: str | None, *, now: dt.datetime | None = None) -> dt.date:
    """Today's date in `zone` (UTC when None)."""
    moment = now or dt.datetime.now(dt.timezone.utc)
    return moment.astimezone(zone_of(zone) if zone else dt.timezone.utc).date()
