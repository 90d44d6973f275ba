"""Slack's assistant pane: the fake's assistant methods, the status line mirrored from status edits, the pane's
listeners in the real bolt app (signed requests, a recording core), and the core's suggestions."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.conversation.core import ConversationCore, CoreSettings
from bot.conversation.events import ChatEvent, Outcome, Reply, SuggestedPrompt
from bot.conversation.suggestions import MODE_PROMPTS, PastQuestion, suggested_prompts
from chat.message import MessageRef
from chat.slack.messenger import SlackMessenger, build_slack_client
from chat.slack.render import SlackRenderer
from chat.slack.thread_status import AssistantThreadStatus, thread_status_of
from chat.state import initial_progress, RunProgress
from storage.models import Conversation, Run
from tests.fakes.clock import ManualClock
from tests.fakes.messenger import RecordingMessenger
from tests.fakes.slack_api import FakeSlack
from tests.fakes.slack_events import SlackEventSender
from tests.fakes.recording_core import RecordingCore
from tests.unit.slack_adapter import SECRET, dispatch, listeners_finished, make_app
from tests.waiting import eventually

DM = "D0ASSIST1"
USER = "U0ASKER"
NOW = dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def slack(clock: ManualClock) -> Iterator[FakeSlack]:
    with FakeSlack(clock=clock) as fake:
        yield fake


@pytest.fixture
def sender() -> SlackEventSender:
    return SlackEventSender("http://bot.invalid/slack/events", SECRET)


def client_of(slack: FakeSlack) -> AsyncWebClient:
    return build_slack_client(slack.token, slack.api_url, rate_limit_retries=0)


def running(phase: str | None, mode: str = "research", state: str = "running") -> RunProgress:
    progress = initial_progress(run_id=7, mode=mode, question="Why is the sea salty?", requested_by=f"slack:{USER}",
                                state=state, started_at=NOW)
    if phase is None:
        return progress
    phases = [line.model_copy(update={"status": "current" if line.name == phase else "waiting"}) for line in progress.phases]
    return progress.model_copy(update={"phases": phases})


async def slack_error(call: Any) -> str:
    with pytest.raises(SlackApiError) as raised:
        await call
    return str(raised.value.response["error"])


# --- the fake's assistant methods --------------------------------------------------------------------

async def test_fake_assistant_methods_take_slack_s_arguments_and_refuse_what_slack_refuses(slack: FakeSlack) -> None:
    client = client_of(slack)
    thread = slack.assistant.start_thread(DM, user=USER)
    prompts = [{"title": f"Prompt {number}", "message": f"message {number}"} for number in range(5)]
    assert await slack_error(client.assistant_threads_setSuggestedPrompts(
        channel_id=DM, thread_ts=thread, prompts=prompts)) == "invalid_arguments"
    assert await slack_error(client.assistant_threads_setSuggestedPrompts(
        channel_id=DM, thread_ts=thread, prompts=[{"title": "no message"}])) == "invalid_arguments"
    assert await slack_error(client.assistant_threads_setSuggestedPrompts(
        channel_id="D0NOWHERE", thread_ts=thread, prompts=prompts[:1])) == "channel_not_found"
    await client.assistant_threads_setSuggestedPrompts(channel_id=DM, thread_ts=thread, prompts=prompts[:4], title="Try")
    assert slack.assistant.prompts(DM, thread) == prompts[:4] and slack.assistant.prompts_title(DM, thread) == "Try"

    too_many = [f"loading {number}" for number in range(11)]
    assert await slack_error(client.assistant_threads_setStatus(
        channel_id=DM, thread_ts=thread, status="is thinking…", loading_messages=too_many)) == "invalid_arguments"
    assert await slack_error(client.assistant_threads_setStatus(
        channel_id=DM, thread_ts="1.000001", status="is thinking…")) == "invalid_thread_ts"
    await client.assistant_threads_setStatus(channel_id=DM, thread_ts=thread, status="is thinking…",
                                             loading_messages=too_many[:10])
    assert slack.assistant.current_status(DM, thread) == "is thinking…"

    assert await slack_error(client.assistant_threads_setTitle(channel_id=DM, thread_ts=thread, title=" ")) == "invalid_arguments"
    await client.assistant_threads_setTitle(channel_id=DM, thread_ts=thread, title="Salty seas")
    assert slack.assistant.title(DM, thread) == "Salty seas"


async def test_fake_status_clears_when_the_app_posts_and_after_two_minutes(slack: FakeSlack, clock: ManualClock) -> None:
    client = client_of(slack)
    thread = slack.assistant.start_thread(DM, user=USER)
    await client.assistant_threads_setStatus(channel_id=DM, thread_ts=thread, status="is researching…")
    await client.chat_postMessage(channel=DM, thread_ts=thread, text="Here it is")
    assert slack.assistant.current_status(DM, thread) == ""
    await client.assistant_threads_setStatus(channel_id=DM, thread_ts=thread, status="is researching…")
    clock.advance(119)
    assert slack.assistant.current_status(DM, thread) == "is researching…"
    clock.advance(2)
    assert slack.assistant.current_status(DM, thread) == ""


# --- the status line from status edits -----------------------------------------------------------------

def test_status_line_names_the_mode_and_rotates_the_current_phase() -> None:
    line = thread_status_of(running("search"))
    assert line.status == "is researching…" and line.loading_messages[0] == "Searching the web…"
    assert 1 <= len(line.loading_messages) <= 10
    assert thread_status_of(running(None, mode="chat")).status == "is thinking…"
    waiting = thread_status_of(running(None, state="queued").model_copy(update={"queue_position": 2}))
    assert waiting.status and "2" in waiting.loading_messages[0]
    for ended in ("done", "failed", "cancelled", "timed_out"):
        assert thread_status_of(running("verify", state=ended)).status == ""


def test_between_phases_the_status_line_names_the_next_phase_not_a_fresh_start() -> None:
    progress = running(None)
    done_through = {"decompose"}
    between = progress.model_copy(update={"phases": [line.model_copy(update={"status": "done"})
                                                     if line.name in done_through else line for line in progress.phases]})
    assert thread_status_of(between).loading_messages[0] == "Searching the web…"
    # gap_check never ran (one round): after verify the run is finishing, not checking for gaps.
    finished = {"decompose", "search", "fetch", "read", "synthesize", "verify"}
    at_the_end = progress.model_copy(update={"phases": [line.model_copy(update={"status": "done"})
                                                        if line.name in finished else line for line in progress.phases]})
    assert thread_status_of(at_the_end).loading_messages == ["Finishing up…"]


async def test_status_edits_in_an_assistant_thread_set_the_pane_status_once_per_phase_and_clear_it_at_the_end(
        slack: FakeSlack, clock: ManualClock) -> None:
    messenger = SlackMessenger(client_of(slack), thread_status=AssistantThreadStatus(clock=clock))
    renderer = SlackRenderer()
    thread = slack.assistant.start_thread(DM, user=USER)
    status_message = (await client_of(slack).chat_postMessage(channel=DM, thread_ts=thread, text="Queued…"))["ts"]
    ref = MessageRef(platform="slack", workspace="T0FAKE", channel=DM, message_id=status_message, thread=thread)
    for progress in (running("decompose"), running("decompose"), running("search"), running("search")):
        await messenger.edit(ref, renderer.status(progress, now=NOW))
        clock.advance(1)
    shown = slack.assistant.statuses(DM, thread)
    assert [status.loading_messages[0] for status in shown] == ["Planning the research…", "Searching the web…"]
    assert slack.assistant.current_status(DM, thread) == "is researching…"
    await messenger.edit(ref, renderer.status(running(None, state="done"), now=NOW))
    assert slack.assistant.statuses(DM, thread)[-1].status == ""
    assert slack.assistant.current_status(DM, thread) == ""
    assert len(slack.edits(DM, status_message)) == 5  # every status edit still reached the status message


async def test_an_unchanged_status_line_is_sent_again_before_slack_drops_it(slack: FakeSlack, clock: ManualClock) -> None:
    messenger = SlackMessenger(client_of(slack), thread_status=AssistantThreadStatus(clock=clock))
    thread = slack.assistant.start_thread(DM, user=USER)
    status_message = (await client_of(slack).chat_postMessage(channel=DM, thread_ts=thread, text="Queued…"))["ts"]
    ref = MessageRef(platform="slack", workspace="T0FAKE", channel=DM, message_id=status_message, thread=thread)
    await messenger.edit(ref, SlackRenderer().status(running("fetch"), now=NOW))
    clock.advance(100)
    await messenger.edit(ref, SlackRenderer().status(running("fetch"), now=NOW))
    assert len(slack.assistant.statuses(DM, thread)) == 2
    assert slack.assistant.current_status(DM, thread) == "is researching…"


async def test_status_edits_outside_direct_messages_leave_the_assistant_pane_alone(slack: FakeSlack) -> None:
    messenger = SlackMessenger(client_of(slack))
    root = (await client_of(slack).chat_postMessage(channel="C0RESEARCH", text="Research: salty seas"))["ts"]
    status_message = (await client_of(slack).chat_postMessage(channel="C0RESEARCH", thread_ts=root, text="…"))["ts"]
    ref = MessageRef(platform="slack", workspace="T0FAKE", channel="C0RESEARCH", message_id=status_message, thread=root)
    await messenger.edit(ref, SlackRenderer().status(running("search"), now=NOW))
    assert slack.calls("assistant.threads.setStatus") == []
    assert len(slack.edits("C0RESEARCH", status_message)) == 1


async def test_a_thread_that_refuses_a_status_is_not_asked_again_and_its_edits_go_on(slack: FakeSlack) -> None:
    messenger = SlackMessenger(client_of(slack))
    thread = slack.assistant.start_thread(DM, user=USER)
    status_message = (await client_of(slack).chat_postMessage(channel=DM, thread_ts=thread, text="Queued…"))["ts"]
    ref = MessageRef(platform="slack", workspace="T0FAKE", channel=DM, message_id=status_message, thread=thread)
    slack.error_next("assistant.threads.setStatus", "missing_scope")
    await messenger.edit(ref, SlackRenderer().status(running("decompose"), now=NOW))
    await messenger.edit(ref, SlackRenderer().status(running("search"), now=NOW))
    assert len(slack.calls("assistant.threads.setStatus")) == 1
    assert len(slack.edits(DM, status_message)) == 2


# --- the pane's listeners in the bolt app ----------------------------------------------------------

async def test_a_new_assistant_thread_gets_the_core_s_suggestions_as_prompts(slack: FakeSlack, sender: SlackEventSender) -> None:
    suggestions = [SuggestedPrompt(title=f"Prompt {number}", message=f"research: question {number}") for number in range(5)]
    core = RecordingCore(lambda event: Outcome(suggestions=suggestions) if event.kind == "opened" else Outcome())
    app = make_app(slack, core)
    thread = slack.assistant.start_thread(DM, user=USER)
    request = sender.event(sender.assistant_thread("assistant_thread_started", user=USER, channel=DM, thread_ts=thread,
                                                   context_channel="C0RESEARCH"))
    assert (await dispatch(app, sender, request)).status == 200
    await eventually(lambda: slack.assistant.prompts(DM, thread))
    [opened] = core.events
    assert (opened.kind, opened.user, opened.channel, opened.thread, opened.workspace) == (
        "opened", f"slack:{USER}", DM, thread, "T0FAKE")
    assert slack.assistant.prompts(DM, thread) == [prompt.model_dump() for prompt in suggestions[:4]]


async def test_a_context_change_is_acknowledged_and_rewrites_nothing(slack: FakeSlack, sender: SlackEventSender) -> None:
    core = RecordingCore()
    app = make_app(slack, core)
    thread = slack.assistant.start_thread(DM, user=USER)
    before = len(slack.calls())
    request = sender.event(sender.assistant_thread("assistant_thread_context_changed", user=USER, channel=DM,
                                                   thread_ts=thread, context_channel="C0OTHER"))
    assert (await dispatch(app, sender, request)).status == 200
    await listeners_finished()
    assert core.events == []
    # bolt's own authorisation (auth.test) aside, nothing was read or written: the status message stays as it is.
    assert [call.method for call in slack.calls()[before:] if call.method != "auth.test"] == []


async def test_a_question_in_an_assistant_thread_reaches_the_core_as_a_direct_message_and_titles_the_thread(
        slack: FakeSlack, sender: SlackEventSender) -> None:
    question = "Why is the sea salty, and has it always been? " * 3
    core = RecordingCore(lambda event: Outcome(run_id=1, thread=event.thread, title=question.strip()))
    app = make_app(slack, core)
    thread = slack.assistant.start_thread(DM, user=USER)
    request = sender.event(sender.message(f"research: {question}", user=USER, channel=DM, channel_type="im",
                                          thread_ts=thread))
    assert (await dispatch(app, sender, request)).status == 200
    await eventually(lambda: slack.assistant.title(DM, thread))
    [event] = core.events
    assert (event.kind, event.thread, event.channel, event.text) == ("direct", thread, DM, f"research: {question}".strip())
    title = slack.assistant.title(DM, thread)
    assert title is not None and title.startswith("Why is the sea salty") and len(title) <= 80 and "\n" not in title


async def test_a_reply_that_starts_nothing_leaves_the_title_and_is_said_in_the_thread(
        slack: FakeSlack, sender: SlackEventSender) -> None:
    core = RecordingCore(lambda event: Outcome(replies=[Reply(text="Nothing is running in this thread.")]))
    app = make_app(slack, core)
    thread = slack.assistant.start_thread(DM, user=USER)
    await dispatch(app, sender, sender.event(sender.message("cancel", user=USER, channel=DM, channel_type="im",
                                                            thread_ts=thread)))
    await eventually(lambda: len(slack.messages(DM, thread_ts=thread)) == 2)
    await listeners_finished()
    assert slack.calls("assistant.threads.setTitle") == []
    assert "Nothing is running" in slack.messages(DM, thread_ts=thread)[1].text


# --- the core's suggestions ----------------------------------------------------------------------

def test_suggestions_offer_each_mode_and_the_last_question_in_its_mode() -> None:
    assert suggested_prompts(None) == list(MODE_PROMPTS)
    prompts = suggested_prompts(PastQuestion(mode="plan", question="How do tides\nwork near estuaries?"))
    assert len(prompts) == 4 and [prompt.message.split(":")[0] for prompt in prompts] == ["research", "plan", "ask", "plan"]
    assert prompts[-1].message == "plan: How do tides\nwork near estuaries?" and "\n" not in prompts[-1].title


def opened_world(session_factory: Any) -> ConversationCore:
    from worker.queue import Limits, Queue
    import fakeredis

    queue = Queue(session_factory, fakeredis.FakeRedis(), Limits(per_user=1, per_workspace=10), lambda *args: None)
    return ConversationCore(sessions=session_factory, queue=queue, messenger=RecordingMessenger(),
                            renderer=SlackRenderer(), settings=CoreSettings())


def store_run(session_factory: Any, *, user: str, question: str, mode: str = "research", workspace: str = "T1") -> None:
    with session_factory.begin() as session:
        conversation = Conversation(platform="slack", workspace=workspace, channel="C1", thread=f"{question[:5]}.1",
                                    created_by=user)
        session.add(Run(conversation=conversation, workspace=workspace, mode=mode, question=question, requested_by=user,
                        state="done"))


def test_an_opened_conversation_is_offered_the_person_s_latest_question(session_factory: Any) -> None:
    core = opened_world(session_factory)
    me, other = f"slack:{USER}", "slack:U0OTHER"
    store_run(session_factory, user=me, question="Old question")
    store_run(session_factory, user=me, question="How do tides work?\n\nChanges requested: add estuaries", mode="plan")
    store_run(session_factory, user=other, question="Someone else's question")
    store_run(session_factory, user=me, question="Another workspace's question", workspace="T2")
    opened = ChatEvent(platform="slack", workspace="T1", channel=DM, user=me, kind="opened", thread="1.1")
    outcome = asyncio.run(core.handle(opened))
    assert outcome.suggestions[-1].message == "plan: How do tides work?" and outcome.run_id is None
    newcomer = asyncio.run(core.handle(opened.model_copy(update={"user": "slack:U0NEW"})))
    assert newcomer.suggestions == list(MODE_PROMPTS)


def test_the_question_that_opens_a_direct_thread_titles_it_and_later_ones_do_not(session_factory: Any) -> None:
    core = opened_world(session_factory)
    event = ChatEvent(platform="slack", workspace="T1", channel=DM, user=f"slack:{USER}", kind="direct",
                      text="research: Why is the sea salty? --quick", thread="1700000001.000001", message_id="1700000002.000002")
    first = asyncio.run(core.handle(event))
    assert first.run_id is not None and first.title == "Why is the sea salty?"
    with session_factory.begin() as session:
        session.get(Run, first.run_id).state = "done"
    later = asyncio.run(core.handle(event.model_copy(update={"text": "ask: and the Dead Sea?", "message_id": "1700000003.000003"})))
    assert later.run_id is not None and later.title is None


# --- the app manifest ----------------------------------------------------------------------------

def test_manifest_turns_on_the_assistant_pane_with_its_scope_events_and_the_core_s_mode_prompts() -> None:
    manifest = yaml.safe_load((Path(__file__).resolve().parents[2] / "slack" / "manifest.yml").read_text())
    pane = manifest["features"]["assistant_view"]
    assert pane["assistant_description"]
    assert pane["suggested_prompts"] == [prompt.model_dump() for prompt in MODE_PROMPTS]
    assert {"assistant:write", "im:history", "chat:write"} <= set(manifest["oauth_config"]["scopes"]["bot"])
    events = set(manifest["settings"]["event_subscriptions"]["bot_events"])
    assert {"assistant_thread_started", "assistant_thread_context_changed", "message.im"} <= events
