"""Watches on Discord without a gateway: the listing (escaped, pinging nobody, buttons only where the person may
change a watch, within Discord's limits), "Watch this" under research reports only, and the watch form, which is its
custom ids alone."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from bot.discord.events import Where, button_event, command_event, watch_event, watches_text
from bot.discord.watches import WatchForm, form_click, watched_run
from chat.discord.render import (
    CONTENT_LIMIT,
    WATCHES_WITHOUT_BUTTONS,
    DiscordRenderer,
    WatchButton,
    watch_custom_id,
)
from chat.message import Content
from chat.watches import NO_WATCHES, WatchListing, WatchSummary
from research.report import Report, WatchComparison
from storage.vocabulary import WatchSchedule, WatchState
from tests.fakes.discord_api import message_form_errors

OWNER = "discord:123456789012345678"
NEXT = dt.datetime(2026, 5, 25, 7, 0, tzinfo=dt.timezone.utc)
WEEKLY = WatchSchedule(cadence="weekly", hour=9, weekday=0, timezone="Europe/Paris")
FRIDAY = dt.date(2026, 5, 22)


def summary(watch_id: int, *, question: str = "How do tides work?", state: WatchState = "active",
            may_change: bool = True, **changes: Any) -> WatchSummary:
    return WatchSummary(watch_id=watch_id, question=question, schedule=WEEKLY, state=state, next_due_at=NEXT,
                        created_by=OWNER, may_change=may_change, **changes)


def buttons(content: Content) -> list[tuple[str, str]]:
    return [(component["label"], component["custom_id"]) for row in content.extra["discord"].get("components") or []
            for component in row["components"]]


def assert_sendable(content: Content) -> None:
    """Within Discord's limits as the fake Discord checks them, and able to ping nobody."""
    payload = content.extra["discord"]
    assert message_form_errors({"content": content.text, **payload}).errors == {}
    assert len(content.text) <= CONTENT_LIMIT
    assert payload["allowed_mentions"] == {"parse": []}


def test_a_listing_shows_questions_as_typed_and_names_owners_without_pinging() -> None:
    question = "**Big** news @everyone <@&42> [click](https://evil.example) `code`"
    content = DiscordRenderer().watches(WatchListing(watches=[summary(7, question=question)]))
    assert_sendable(content)
    assert "\\*\\*Big\\*\\* news @everyone <@&42>" not in content.text
    assert "\\*\\*Big\\*\\*" in content.text and "\\[click\\]\\(https://evil.example\\)" in content.text
    assert "\\<@&42\\>" in content.text and "\\`code\\`" in content.text
    assert "**#7**" in content.text and "<@123456789012345678>" in content.text
    assert f"<t:{int(NEXT.timestamp())}:f>" in content.text, "the next run in each reader's own time"
    assert "every Monday at 09:00 \\(Europe/Paris\\)" in content.text


def test_buttons_appear_only_on_watches_the_person_may_change() -> None:
    listing = WatchListing(watches=[summary(1), summary(2, state="paused"), summary(3, may_change=False),
                                    summary(4, state="stopped", stopped_reason="the report kept failing")])
    content = DiscordRenderer().watches(listing)
    assert_sendable(content)
    assert buttons(content) == [("Pause #1", watch_custom_id("pause", 1)), ("Delete #1", watch_custom_id("delete", 1)),
                                ("Resume #2", watch_custom_id("resume", 2)), ("Delete #2", watch_custom_id("delete", 2)),
                                ("Resume #4", watch_custom_id("resume", 4)), ("Delete #4", watch_custom_id("delete", 4))]
    assert "#3" in content.text and "stopped: the report kept failing" in content.text
    assert WATCHES_WITHOUT_BUTTONS not in content.text


def test_someone_who_may_change_nothing_sees_no_buttons_and_an_empty_channel_says_how_to_start() -> None:
    content = DiscordRenderer().watches(WatchListing(watches=[summary(1, may_change=False)]))
    assert "components" not in content.extra["discord"]
    assert DiscordRenderer().watches(WatchListing()).text == NO_WATCHES


def test_past_discord_s_rows_of_buttons_the_others_are_changed_with_the_command() -> None:
    content = DiscordRenderer().watches(WatchListing(watches=[summary(number) for number in range(1, 13)]))
    assert_sendable(content)
    rows = content.extra["discord"]["components"]
    assert len(rows) == 5 and all(len(row["components"]) <= 5 for row in rows)
    assert [label for label, _ in buttons(content)][-2:] == ["Pause #10", "Delete #10"]
    assert "#12" in content.text and WATCHES_WITHOUT_BUTTONS in content.text


def test_a_listing_longer_than_a_message_counts_the_watches_it_leaves_out() -> None:
    listing = WatchListing(watches=[summary(number, question="Why? " * 200) for number in range(1, 41)])
    content = DiscordRenderer().watches(listing)
    assert_sendable(content)
    shown = [number for number in range(1, 41) if f"**#{number}**" in content.text]
    assert shown == list(range(1, len(shown) + 1)) and len(shown) < 40
    assert f"…and {40 - len(shown)} more" in content.text and WATCHES_WITHOUT_BUTTONS in content.text
    assert {custom_id.rsplit(":", 1)[1] for _, custom_id in buttons(content)} <= {str(number) for number in shown}


def report(**changes: Any) -> Report:
    return Report(title="Tides", question="How do tides work?", body_markdown="They rise [1].").model_copy(
        update=changes)


def labels_under(delivered: Report) -> list[str]:
    [*_, last] = DiscordRenderer().report(delivered, requester=OWNER, run_id=9).messages
    return [label for label, _ in buttons(last)]


@pytest.mark.parametrize(("changes", "offered"), [
    ({}, True), ({"mode": "plan"}, False), ({"mode": "chat"}, False), ({"mode": "followup"}, False),
    ({"stopped_by_user": True}, False), ({"watch": WatchComparison(previous_run_id=1)}, False)])
def test_watch_this_is_offered_under_a_research_report_only(changes: dict[str, Any], offered: bool) -> None:
    assert ("Watch this" in labels_under(report(**changes))) is offered


def test_watch_this_names_its_run() -> None:
    [*_, last] = DiscordRenderer().report(report(), requester=OWNER, run_id=9).messages
    custom_id = dict(buttons(last))["Watch this"]
    assert watched_run(custom_id) == 9 and watched_run("deepthread:watch:x") is None


def test_the_watch_form_is_within_discord_s_limits_and_starts_weekly_on_today_s_weekday_at_nine() -> None:
    form = WatchForm.opened(123456789, FRIDAY)
    rows = form.components()
    assert message_form_errors({"content": "form", "components": rows}).errors == {}
    [how], [hour], buttons_row = (row["components"] for row in rows)
    assert [option["label"] for option in how["options"]] == ["Daily", "Weekly on Friday", "Monthly on day 22"]
    assert len(hour["options"]) == 24 and hour["options"][9]["default"] and hour["options"][9]["label"] == "09:00"
    custom_ids = [how["custom_id"], hour["custom_id"], *(button["custom_id"] for button in buttons_row)]
    assert all(len(custom_id) <= 100 for custom_id in custom_ids)
    assert form.schedule() == WatchSchedule(cadence="weekly", hour=9, weekday=4)


def test_a_choice_in_the_form_is_carried_by_its_custom_ids_alone() -> None:
    form = WatchForm.opened(42, FRIDAY)
    part, monthly = form_click(form.custom_id("how"), ["monthly"]) or (None, form)
    assert part == "how" and monthly.schedule() == WatchSchedule(cadence="monthly", hour=9, day=22)
    part, at_six = form_click(monthly.custom_id("hour"), ["6"]) or (None, form)
    assert part == "hour" and at_six.schedule() == WatchSchedule(cadence="monthly", hour=6, day=22)
    assert form_click(at_six.custom_id("one"), []) == ("one", at_six)
    assert form_click(form.custom_id("hour"), ["25"]) == ("hour", form), "a value the menu does not offer is ignored"
    for broken in ("deepthread:watch-form:how:42:yearly:9:20260522", "deepthread:watch-form:how:42:weekly:9:2026",
                   "deepthread:watch-form:go:42:weekly:9:20260522", "someone-else"):
        assert form_click(broken, []) is None


def test_the_last_day_of_long_months_says_what_shorter_months_do() -> None:
    [how, *_] = WatchForm.opened(1, dt.date(2026, 1, 31)).components()
    assert how["components"][0]["options"][2]["label"] == "Monthly on day 31 (the last day in shorter months)"


WHERE = Where.of(guild_id=1, channel_id=11, parent_id=10, is_thread=True)


def test_watch_events_name_the_run_or_the_watch_and_leave_the_time_zone_to_the_core() -> None:
    event = watch_event(WHERE, user_id=7, run_id=42, schedule=WEEKLY.model_copy(update={"timezone": "UTC"}),
                        one_thread=True)
    assert (event.kind, event.action, event.action_run_id, event.watch_one_thread) == ("action", "watch", 42, True)
    assert (event.user, event.workspace, event.channel, event.thread, event.timezone) == ("discord:7", "1", "10", "11",
                                                                                          None)
    actions: tuple[WatchButton, ...] = ("pause", "resume", "delete")
    for action in actions:
        clicked = button_event(WHERE, user_id=7, message_id=5, custom_id=watch_custom_id(action, 3))
        assert clicked is not None and (clicked.action, clicked.watch_id) == (f"watch_{action}", 3)
    for broken in ("deepthread:watches:stop:3", "deepthread:watches:pause:", "deepthread:watches:pause:x"):
        assert button_event(WHERE, user_id=7, message_id=5, custom_id=broken) is None


def test_the_watches_command_s_options_become_the_words_the_core_parses() -> None:
    assert watches_text(None, None) == watches_text("list", "3") == ""
    assert watches_text("pause", " 3 ") == "pause 3" and watches_text("timezone", "Europe/Paris") == "timezone Europe/Paris"
    assert watches_text(None, "resume 4") == "resume 4" and watches_text("timezone", None) == "timezone"
    event = command_event(WHERE, user_id=7, name="watches", text="delete 2", interaction_id=99)
    assert (event.kind, event.command, event.text) == ("command", "watches", "delete 2")
