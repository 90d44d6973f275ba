"""Feedback and cancelling where people look, end to end: the real bolt app in HTTP mode with the real conversation
core, requests signed as Slack signs them, the fake Slack Web API (with `views.open`), a real worker process, real
Redis, and the fake LLM, search provider and web corpus."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

from storage.models import Feedback, Run
from tests.fakes.corpus import QUESTION
from tests.fakes.slack_events import ResponseUrlCatcher, SlackEventSender
from tests.integration.slack_harness import ASKER, CHANNEL, OTHER, SlackWorld

pytestmark = pytest.mark.integration

MODEL_LINE = "Written by AI (fake-model) from the sources listed — check the citations."
WHAT_WAS_WRONG = "The capacity figure is the 2019 one, not this year's."
TERMINAL = {"done", "failed", "cancelled", "timed_out"}


# Pages slow enough that a run is still fetching when it is stopped.
SLOW_PAGES = pytest.mark.world(corpus={"page_latency": 6.0})


def feedback_rows(world: SlackWorld) -> list[tuple[str, int, str | None]]:
    with world.cluster.sessions() as session:
        return [(row.user, row.value, row.comment) for row in session.scalars(select(Feedback).order_by(Feedback.id))]


def feedback_buttons(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    block = next(block for block in reversed(blocks) if block["type"] == "context_actions")
    return next(element for element in block["elements"] if element["type"] == "feedback_buttons")


def running_research(world: SlackWorld) -> Run:
    world.command("/research", QUESTION)
    return world.cluster.wait_for_state(world.wait_for_runs(1)[0].id, {"running"}, 30)


def test_feedback_on_a_report_is_stored_and_a_thumbs_down_asks_what_was_wrong(world: SlackWorld) -> None:
    world.command("/research", QUESTION)
    run = world.cluster.wait_for_state(world.wait_for_runs(1)[0].id, TERMINAL, 60)
    assert run.state == "done", run.error
    report = world.cluster.wait_for(lambda: world.report_messages(run), 20, "the report")[-1]
    assert MODEL_LINE in report.visible_text
    buttons = feedback_buttons(report.blocks)
    thread = run.status_message["thread"]

    def click(value: str, user: str) -> None:
        trigger_id = world.slack.views.issue_trigger_id(user=user)
        response = world.sender.send(world.sender.feedback_click(value, user=user, channel=CHANNEL, message_ts=report.ts,
                                                                 thread_ts=thread, trigger_id=trigger_id))
        assert response.status_code == 200

    click(buttons["positive_button"]["value"], ASKER)
    world.cluster.wait_for(lambda: feedback_rows(world), 10, "the 👍 stored")
    click(buttons["negative_button"]["value"], OTHER)
    modal = world.cluster.wait_for(lambda: world.slack.views.opened(), 10, "the 'what was wrong?' modal")[0]
    assert modal.user == OTHER
    [(block_id, action_id)] = modal.input_ids()
    submitted = world.sender.send(world.sender.view_submission(modal.view, {block_id: {action_id: WHAT_WAS_WRONG}},
                                                               user=OTHER))
    assert submitted.status_code == 200
    world.cluster.wait_for(lambda: any(comment for _, _, comment in feedback_rows(world)), 10, "the comment stored")
    assert feedback_rows(world) == [(f"slack:{ASKER}", 1, None), (f"slack:{OTHER}", -1, WHAT_WAS_WRONG)]


@SLOW_PAGES
def test_cancel_reaction_on_the_root_message_works_for_the_requester_only(world: SlackWorld) -> None:
    run = running_research(world)
    root = run.status_message["thread"]  # the channel-visible message the slash command opened the thread under
    assert world.slack.message(CHANNEL, root).thread_ts is None
    react = world.sender.reaction_added
    world.sender.send(world.sender.event(react("x", user=OTHER, channel=CHANNEL, message_ts=root)))
    world.cluster.wait_for(lambda: world.slack.ephemeral_messages(), 10, "the private refusal")
    assert world.slack.ephemeral_messages()[0]["user"] == OTHER
    # The refusal is sent after the core decided; a cancel would already be in the row and in Redis.
    refused = world.cluster.run(run.id)
    assert (refused.state, refused.cancelled_by) == ("running", None)
    assert world.cluster.redis.get(f"deepthread:cancel:{run.id}") is None
    world.sender.send(world.sender.event(react("x", user=ASKER, channel=CHANNEL, message_ts=root)))
    stopped = world.cluster.wait_for_state(run.id, TERMINAL, 10)
    assert stopped.state == "cancelled" and stopped.cancelled_by == f"slack:{ASKER}"


@SLOW_PAGES
def test_stop_button_on_the_status_message_works_for_the_requester_only(world: SlackWorld) -> None:
    run = running_research(world)
    status = world.slack.message(CHANNEL, run.status_message["message_id"])
    stop = next(element for block in status.blocks if block["type"] == "actions" for element in block["elements"]
                if element["action_id"] == "deepthread_stop")
    with ResponseUrlCatcher() as catcher:
        sender = SlackEventSender(world.sender.url, world.sender.signing_secret, response_url=catcher.url)

        def press(user: str):
            return sender.send(sender.block_action(stop["action_id"], stop.get("value", ""), user=user, channel=CHANNEL,
                                                   message_ts=status.ts, thread_ts=status.thread_ts, label="Stop"))

        assert press(OTHER).status_code == 200
        refusal = world.cluster.wait_for(lambda: catcher.responses(), 10, "the private refusal")[0]
        assert refusal.payload["response_type"] == "ephemeral" and "can stop it" in refusal.payload["text"]
        refused = world.cluster.run(run.id)
        assert (refused.state, refused.cancelled_by) == ("running", None)
        assert press(ASKER).status_code == 200
        stopped = world.cluster.wait_for_state(run.id, TERMINAL, 10)
        sender.close()
    assert stopped.state == "cancelled" and stopped.cancelled_by == f"slack:{ASKER}"
