"""Slack's assistant pane end to end: the real bolt app in HTTP mode with the real conversation core, requests
signed as Slack signs them, the fake Slack Web API (with its assistant methods), a real worker process, real Redis,
and the fake LLM, search provider and web corpus."""

from __future__ import annotations

import pytest

from chat.state import PHASE_LABELS
from storage.models import Conversation, Run
from tests.fakes.corpus import QUESTION
from tests.integration.slack_harness import SlackWorld

pytestmark = pytest.mark.integration

DM = "D0ASSIST01"
ASKER = "U0ASKER01"
FOLLOW_UP = "How much energy did the array deliver?"


def open_assistant_thread(world: SlackWorld, user: str = ASKER) -> str:
    """A person opens a thread in the assistant pane: Slack makes its root and sends `assistant_thread_started`."""
    thread = world.slack.assistant.start_thread(DM, user=user)
    started = world.sender.assistant_thread("assistant_thread_started", user=user, channel=DM, thread_ts=thread,
                                            context_channel="C0RESEARCH")
    assert world.sender.send(world.sender.event(started)).status_code == 200
    return thread


def say_in_thread(world: SlackWorld, thread: str, text: str, user: str = ASKER) -> None:
    message = world.sender.message(text, user=user, channel=DM, channel_type="im", thread_ts=thread)
    assert world.sender.send(world.sender.event(message)).status_code == 200


def in_thread(world: SlackWorld, thread: str, marker: str) -> list:
    return [message for message in world.slack.messages(DM, thread_ts=thread) if marker in message.visible_text]


def test_a_new_assistant_thread_offers_research_plan_ask_and_the_person_s_last_question(world: SlackWorld) -> None:
    first = open_assistant_thread(world)
    prompts = world.cluster.wait_for(lambda: world.slack.assistant.prompts(DM, first), 10, "the suggested prompts")
    assert [prompt["message"].split(":")[0] for prompt in prompts] == ["research", "plan", "ask"]

    with world.cluster.sessions.begin() as session:
        conversation = Conversation(platform="slack", workspace="T0FAKE", channel="C0RESEARCH", thread="1.000001",
                                    created_by=f"slack:{ASKER}")
        session.add(Run(conversation=conversation, workspace="T0FAKE", mode="research", question=QUESTION,
                        requested_by=f"slack:{ASKER}", state="done"))
    context_changed = world.sender.assistant_thread("assistant_thread_context_changed", user=ASKER, channel=DM,
                                                    thread_ts=first, context_channel="C0ELSEWHERE")
    assert world.sender.send(world.sender.event(context_changed)).status_code == 200

    second = open_assistant_thread(world)
    prompts = world.cluster.wait_for(lambda: world.slack.assistant.prompts(DM, second), 10, "the second thread's prompts")
    assert len(prompts) == 4 and prompts[-1]["message"] == f"research: {QUESTION}"
    assert QUESTION[:20] in prompts[-1]["title"]
    assert [call.error for call in world.slack.calls("assistant.threads.setSuggestedPrompts")] == [None, None]


def test_a_question_in_the_assistant_thread_is_answered_there_titled_with_its_status_shown(world: SlackWorld) -> None:
    thread = open_assistant_thread(world)
    say_in_thread(world, thread, f"research: {QUESTION}")
    run = world.wait_for_runs(1)[0]
    run = world.cluster.wait_for_state(run.id, {"done", "failed", "cancelled", "timed_out"}, 60)
    assert (run.mode, run.state) == ("research", "done"), run.error
    assert run.status_message["channel"] == DM and run.status_message["thread"] == thread
    [report] = world.cluster.wait_for(lambda: in_thread(world, thread, "here is your report"), 20, "the report")
    assert world.slack.assistant.title(DM, thread) == QUESTION

    statuses = world.cluster.wait_for(lambda: (shown := world.slack.assistant.statuses(DM, thread))
                                      and shown[-1].status == "" and shown, 10, "the status line cleared")
    working = [status for status in statuses if status.status]
    labels = {f"{label}…" for label in PHASE_LABELS.values()}
    assert working and all(status.status == "is researching…" for status in working)
    assert len({status.loading_messages[0] for status in working}) >= 2  # refreshed as the phases changed
    # "Finishing up…" is shown when every phase is done before the run's last event has been folded in.
    assert all(status.loading_messages and status.loading_messages[0] in labels | {"Getting started…", "Finishing up…"}
               for status in working), [status.loading_messages for status in working]
    assert working[0].posted_at < report.posted_at  # shown while the run worked, not after
    assert world.slack.assistant.current_status(DM, thread) == ""

    say_in_thread(world, thread, FOLLOW_UP)
    follow_up = world.cluster.wait_for_state(world.wait_for_runs(2)[1].id, {"done", "failed"}, 60)
    assert (follow_up.mode, follow_up.state) == ("followup", "done"), follow_up.error
    world.cluster.wait_for(lambda: in_thread(world, thread, "on “How much energy"), 20, "the follow-up's answer")
    assert [call.params["title"] for call in world.slack.calls("assistant.threads.setTitle")] == [QUESTION]
    assert all(call.error is None for call in world.slack.calls("assistant.threads.setStatus"))
