"""Watches on Slack end to end: "Watch this" under a research report, its modal, `/watches` and a listing's buttons,
through the real bolt app in HTTP mode and the real conversation core, requests signed as Slack signs them, the fake
Slack Web API (views.open, users.info), a real worker process, real Redis, and the fake LLM, search provider and web
corpus."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import httpx
import pytest

from bot.slack.watches import (
    CADENCE_ACTION,
    CADENCE_BLOCK,
    DAY_ACTION,
    DAY_BLOCK,
    HOUR_ACTION,
    HOUR_BLOCK,
    WEEKDAY_ACTION,
    WEEKDAY_BLOCK,
)
from chat.slack.render import (
    EXPORT_ACTION_ID,
    WATCH_ACTION_ID,
    WATCH_DELETE_ACTION_ID,
    WATCH_PAUSE_ACTION_ID,
    WATCH_RESUME_ACTION_ID,
)
from storage.models import Run
from storage.vocabulary import WatchSchedule
from storage.watches import WatchView, watches_in
from tests.fakes.corpus import QUESTION
from tests.fakes.slack_api import SlackMessage
from tests.fakes.slack_events import CaughtResponse
from tests.fakes.slack_interactivity import OpenedView
from tests.integration.slack_harness import ASKER, CHANNEL, OTHER, SlackWorld

pytestmark = pytest.mark.integration

TERMINAL = {"done", "failed", "cancelled", "timed_out"}
ADMIN = "U0ADMIN01"
SECOND_QUESTION = "How much energy do the Zorblax tidal turbines deliver?"
WEEKLY_ON_MONDAY_AT_NINE = {CADENCE_BLOCK: {CADENCE_ACTION: "weekly"}, WEEKDAY_BLOCK: {WEEKDAY_ACTION: "0"},
                            HOUR_BLOCK: {HOUR_ACTION: "9"}}


# --- steps ------------------------------------------------------------------------------------------

def watches(world: SlackWorld) -> list[WatchView]:
    return watches_in(world.cluster.sessions, platform="slack", workspace=world.sender.team_id, channel=CHANNEL)


def thread_of(run: Run) -> str:
    assert run.status_message is not None
    return str(run.status_message["thread"])


def has_button(message: SlackMessage, action_id: str) -> bool:
    return any(element.get("action_id") == action_id for block in message.blocks or [] if block["type"] == "actions"
               for element in block["elements"])


def finished(world: SlackWorld, command: str, question: str, user: str = ASKER) -> tuple[Run, SlackMessage]:
    """Run `command` and wait for its report: the run, and the report's last message (the one with the buttons)."""
    world.command(command, question, user=user)
    started = world.cluster.wait_for(lambda: next((run for run in world.runs() if run.question == question), None),
                                     20, f"the run of {question!r}")
    run = world.cluster.wait_for_state(started.id, TERMINAL, 60)
    assert run.state == "done", run.error
    last = world.cluster.wait_for(lambda: [message for message in world.thread_messages(run)
                                           if has_button(message, EXPORT_ACTION_ID)], 20, "the report's buttons")
    return run, last[-1]


def open_watch_form(world: SlackWorld, report: SlackMessage, user: str = ASKER) -> OpenedView:
    """Click "Watch this" under `report` as `user`; the modal the bot opened with the click's trigger."""
    before = len(world.slack.views.opened())
    trigger_id = world.slack.views.issue_trigger_id(user=user)
    assert world.click(report, WATCH_ACTION_ID, user, trigger_id=trigger_id).status_code == 200
    return world.cluster.wait_for(lambda: len(opened := world.slack.views.opened()) > before and opened[-1], 10,
                                  "the watch modal")


def submit(world: SlackWorld, modal: OpenedView, choices: dict[str, dict[str, Any]], user: str = ASKER) -> httpx.Response:
    response = world.sender.send(world.sender.view_submission(modal.view, choices, user=user))
    assert response.status_code == 200
    return response


def ephemeral_to(world: SlackWorld, user: str, after: int, what: str) -> dict[str, Any]:
    """The first ephemeral message to `user` among those sent after the first `after`, waited for."""
    return world.cluster.wait_for(lambda: next((message for message in world.slack.ephemeral_messages()[after:]
                                                if message["user"] == user), None), 10, what)


def watch_report(world: SlackWorld, report: SlackMessage, user: str = ASKER) -> WatchView:
    """Make a weekly watch of `report` through its button and modal; the watch stored."""
    count = len(watches(world))
    submit(world, open_watch_form(world, report, user), WEEKLY_ON_MONDAY_AT_NINE, user)
    return world.cluster.wait_for(lambda: len(stored := watches(world)) > count and stored[-1], 10, "the watch stored")


def list_watches(world: SlackWorld, user: str) -> CaughtResponse:
    """`/watches` as `user`; the private listing the app answered through the command's response_url."""
    before = len(world.responses())
    assert world.command("/watches", "", user=user).status_code == 200
    return world.next_response(before, f"the listing for {user}")


def listing_buttons(listing: CaughtResponse, watch_id: int) -> dict[str, tuple[str, dict[str, Any]]]:
    """The buttons a listing shows for watch `watch_id`: action id -> (block id, button)."""
    return {element["action_id"]: (block["block_id"], element) for block in listing.payload.get("blocks") or []
            if block["type"] == "actions" for element in block["elements"] if element.get("value") == str(watch_id)}


def press(world: SlackWorld, action_id: str, watch_id: int, user: str, block_id: str = "forged") -> CaughtResponse:
    """A click on a listing's button (an ephemeral message) naming watch `watch_id`; the private reply."""
    before = len(world.responses())
    response = world.sender.send(world.sender.block_action(action_id, str(watch_id), user=user, channel=CHANNEL,
                                                           message_ts=world.sender.next_ts(), block_id=block_id,
                                                           ephemeral=True))
    assert response.status_code == 200
    return world.next_response(before, f"the reply to {action_id}")


def press_in(world: SlackWorld, listing: CaughtResponse, action_id: str, watch_id: int, user: str) -> CaughtResponse:
    block_id, _ = listing_buttons(listing, watch_id)[action_id]
    return press(world, action_id, watch_id, user, block_id)


def state_of(world: SlackWorld, watch_id: int) -> str | None:
    return next((watch.state for watch in watches(world) if watch.id == watch_id), None)


# --- the tests ----------------------------------------------------------------------------------------

def test_watch_this_opens_a_modal_and_stores_the_watch_in_the_person_s_time_zone(world: SlackWorld) -> None:
    world.slack.set_timezone(ASKER, "Asia/Tokyo")
    clicked_on = {dt.datetime.now(dt.timezone.utc).astimezone(dt.timezone(dt.timedelta(hours=9))).weekday()}
    run, report = finished(world, "/research", QUESTION)
    assert has_button(report, WATCH_ACTION_ID) and any(block["type"] == "context_actions" for block in report.blocks or [])
    modal = open_watch_form(world, report)
    clicked_on.add(dt.datetime.now(dt.timezone.utc).astimezone(dt.timezone(dt.timedelta(hours=9))).weekday())
    assert modal.user == ASKER
    assert json.loads(modal.view["private_metadata"]) == {"run_id": run.id, "channel": CHANNEL,
                                                          "thread": thread_of(run)}
    weekday = next(block for block in modal.view["blocks"] if block.get("block_id") == WEEKDAY_BLOCK)
    assert int(weekday["element"]["initial_option"]["value"]) in clicked_on  # the day of the click, in Tokyo

    refused = submit(world, modal, {CADENCE_BLOCK: {CADENCE_ACTION: "monthly"}, DAY_BLOCK: {DAY_ACTION: None}})
    assert refused.json()["response_action"] == "errors" and list(refused.json()["errors"]) == [DAY_BLOCK]
    assert watches(world) == []

    sent = len(world.slack.ephemeral_messages())
    submit(world, modal, WEEKLY_ON_MONDAY_AT_NINE)
    [watch] = world.cluster.wait_for(lambda: watches(world), 10, "the watch stored")
    assert watch.schedule == WatchSchedule(cadence="weekly", weekday=0, hour=9, timezone="Asia/Tokyo")
    assert (watch.state, watch.created_by, watch.question, watch.one_thread) == ("active", f"slack:{ASKER}", QUESTION,
                                                                                 False)
    confirmation = ephemeral_to(world, ASKER, sent, "the private confirmation")
    assert confirmation["thread_ts"] == thread_of(run) and confirmation["channel"] == CHANNEL
    assert "every Monday at 09:00 (Asia/Tokyo)" in confirmation["text"]


@pytest.mark.world(admin_user_ids=f"slack:{ADMIN}")
def test_only_the_owner_or_an_admin_may_pause_resume_or_delete_a_watch(world: SlackWorld) -> None:
    world.slack.add_user(ADMIN, "admin")
    _, report = finished(world, "/research", QUESTION)
    watch = watch_report(world, report)

    # The listing offers the owner buttons, and another person none.
    mine = list_watches(world, ASKER)
    assert mine.payload["response_type"] == "ephemeral"
    assert set(listing_buttons(mine, watch.id)) == {WATCH_PAUSE_ACTION_ID, WATCH_DELETE_ACTION_ID}
    # Another person's users.info fails: the listing comes all the same.
    world.slack.error_next("users.info", "ratelimited")
    theirs = list_watches(world, OTHER)
    assert [call.error for call in world.slack.calls("users.info") if call.params.get("user") == OTHER] == ["ratelimited"]
    assert listing_buttons(theirs, watch.id) == {}
    assert not any(block["type"] == "actions" for block in theirs.payload.get("blocks") or [])
    assert f"#{watch.id}" in theirs.payload["text"] and f"<@{ASKER}>" in theirs.payload["text"]
    # The owner's zone was asked of Slack once, for the watch; the listing took it from memory.
    assert len([call for call in world.slack.calls("users.info") if call.params.get("user") == ASKER]) == 1

    # Another person's forged Pause is refused, after the core decided: a pause would already be in the row.
    refusal = press(world, WATCH_PAUSE_ACTION_ID, watch.id, OTHER)
    assert refusal.payload["response_type"] == "ephemeral"
    assert "Only the person who made this watch, or an admin, can pause it" in refusal.payload["text"]
    assert state_of(world, watch.id) == "active"

    # An admin sees the buttons on someone else's watch, and pauses it.
    listing = list_watches(world, ADMIN)
    assert set(listing_buttons(listing, watch.id)) == {WATCH_PAUSE_ACTION_ID, WATCH_DELETE_ACTION_ID}
    paused = press_in(world, listing, WATCH_PAUSE_ACTION_ID, watch.id, ADMIN)
    assert f"Watch #{watch.id} paused" in paused.payload["text"] and state_of(world, watch.id) == "paused"

    # The owner resumes, pauses and deletes it.
    listing = list_watches(world, ASKER)
    assert set(listing_buttons(listing, watch.id)) == {WATCH_RESUME_ACTION_ID, WATCH_DELETE_ACTION_ID}
    resumed = press_in(world, listing, WATCH_RESUME_ACTION_ID, watch.id, ASKER)
    assert f"Watch #{watch.id} resumed" in resumed.payload["text"] and state_of(world, watch.id) == "active"
    paused = press_in(world, list_watches(world, ASKER), WATCH_PAUSE_ACTION_ID, watch.id, ASKER)
    assert paused.payload["response_type"] == "ephemeral" and f"Watch #{watch.id} paused" in paused.payload["text"]
    assert state_of(world, watch.id) == "paused"
    deleted = press_in(world, list_watches(world, ASKER), WATCH_DELETE_ACTION_ID, watch.id, ASKER)
    assert "deleted" in deleted.payload["text"] and watches(world) == []


@pytest.mark.world(watch_max_per_workspace="1")
def test_a_watch_past_the_workspace_s_cap_is_refused_in_plain_words(world: SlackWorld) -> None:
    _, first = finished(world, "/research", QUESTION)
    _, second = finished(world, "/research", SECOND_QUESTION, user=OTHER)
    watch_report(world, first)
    sent = len(world.slack.ephemeral_messages())
    submit(world, open_watch_form(world, second, OTHER), WEEKLY_ON_MONDAY_AT_NINE, OTHER)
    refusal = ephemeral_to(world, OTHER, sent, "the private refusal")
    assert "already has 1 active watches, the most it may have" in refusal["text"]
    assert [watch.question for watch in watches(world)] == [QUESTION]


def test_plans_and_quick_answers_have_no_watch_this_button(world: SlackWorld) -> None:
    for command in ("/plan", "/ask"):
        run, last = finished(world, command, QUESTION if command == "/plan" else "why do tides happen twice a day")
        assert run.mode in ("plan", "chat")
        assert not any(has_button(message, WATCH_ACTION_ID) for message in world.thread_messages(run)), command
