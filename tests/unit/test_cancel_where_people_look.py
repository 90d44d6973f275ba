"""Cancelling from where people look, without Slack: ❌ on the message that started a run (the thread's root or the
question), and the Stop button on the status message."""

from __future__ import annotations

import json
from urllib.parse import parse_qs

from bot.slack.app import action_event
from tests.fakes.slack_events import SlackEventSender
from tests.unit.conversation_world import ALICE, BOB, World, research

QUESTION = "research: Why is the sea salty?"


def react(world: World, message_id: str, user: str = ALICE, reaction: str = "x"):
    return world.handle(kind="reaction", reaction=reaction, message_id=message_id, user=user)


def test_a_cancel_reaction_on_the_mention_that_started_a_run_cancels_it(world: World) -> None:
    outcome = world.handle(kind="mention", text=QUESTION, message_id="100.1")
    assert react(world, "100.1").cancelled_run_id == outcome.run_id
    assert world.run(outcome.run_id).cancelled_by == ALICE


def test_a_cancel_reaction_on_a_direct_message_question_cancels_its_run(world: World) -> None:
    outcome = world.handle(kind="direct", channel="D1", text=QUESTION, message_id="100.2")
    result = world.handle(kind="reaction", reaction="❌", channel="D1", message_id="100.2")
    assert result.cancelled_run_id == outcome.run_id


def test_a_cancel_reaction_on_the_title_a_slash_command_opened_cancels_its_run(world: World) -> None:
    outcome = research(world)
    assert react(world, outcome.thread).cancelled_run_id == outcome.run_id


def test_a_cancel_reaction_on_the_root_by_someone_else_is_refused_privately(world: World) -> None:
    outcome = world.handle(kind="mention", text=QUESTION, message_id="100.3")
    result = react(world, "100.3", user=BOB)
    assert result.cancelled_run_id is None and result.replies[0].private
    assert (world.run(outcome.run_id).state, world.run(outcome.run_id).cancelled_by) == ("queued", None)


def test_a_cancel_reaction_on_an_older_question_of_the_thread_leaves_the_current_run_alone(world: World) -> None:
    first = world.handle(kind="mention", text=QUESTION, message_id="200.1")
    world.finish(first.run_id)
    second = world.handle(kind="message", text="chat: and lakes?", thread="200.1", message_id="200.2")
    world.finish(second.run_id)
    third = world.handle(kind="message", text="chat: and rivers?", thread="200.1", message_id="200.3")
    assert react(world, "200.2").cancelled_run_id is None
    assert world.run(third.run_id).state == "queued"
    assert react(world, "200.3").cancelled_run_id == third.run_id


def test_other_reactions_on_the_root_do_nothing(world: World) -> None:
    outcome = world.handle(kind="mention", text=QUESTION, message_id="300.1")
    assert react(world, "300.1", reaction="eyes").replies == []
    assert world.run(outcome.run_id).state == "queued"


def test_a_stop_click_is_a_cancel_of_the_run_it_names_or_of_its_status_message() -> None:
    sender = SlackEventSender("http://127.0.0.1:9/slack/events", "secret")

    def body(value: str) -> dict:
        request = sender.block_action("deepthread_stop", value, user="U1", channel="C1", message_ts="5.5")
        return json.loads(parse_qs(request.body)["payload"][0])

    named = action_event(body("42"))
    assert (named.action, named.action_run_id, named.message_id) == ("cancel", 42, "5.5")
    unnamed = action_event(body(""))
    assert (unnamed.action, unnamed.action_run_id) == ("cancel", None)
