"""The Slack adapter: signed requests through the real bolt app into a recording core, against the fake Slack Web API."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import re
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import yaml
from slack_bolt.async_app import AsyncApp
from slack_bolt.context.respond.async_respond import AsyncRespond

from bot.conversation.events import ChatEvent, Outcome, Reply
from chat.render import ReportDelivery
from chat.slack.render import (
    BLOCKS_PER_MESSAGE,
    CONTINUE_ACTION_ID,
    EXPORT_ACTION_ID,
    RETRY_ACTION_ID,
    WATCH_ACTION_ID,
    SlackRenderer,
    blocks_of,
    slack_content,
    section_block,
    with_export_button,
)
from chat.state import initial_progress
from bot.slack.app import COMMANDS, build_slack_app, history_before, respond_sender, without_bot_mention
from chat.slack.messenger import ResponseUrlPoster
from bot.slack.watches import WATCHES_COMMAND
from bot.slack.dedupe import CLAIM_SECONDS, EVENT_KEY, MemoryEventDeduper, RedisEventDeduper
from config import load_settings
from research.report import Report, ReportSource
from tests.fakes.slack_api import FakeSlack, SlackMessage
from tests.fakes.recording_core import RecordingCore
from tests.fakes.slack_events import ResponseUrlCatcher, SlackEventSender
from tests.unit.slack_adapter import SECRET, dispatch, listeners_finished, make_app
from tests.waiting import HANG_GUARD_SECONDS, eventually

CHANNEL = "C0RESEARCH"
USER = "U0ASKER"
BOT = "U0BOT"


class SlackWithPrivateChannels(FakeSlack):
    """The fake Slack Web API plus private channels the bot cannot see, and messages written by people."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.private_channels: set[str] = set()

    def add_person_message(self, channel: str, text: str, *, user: str, ts: str, thread_ts: str | None = None) -> None:
        with self._lock:
            self._channels.setdefault(channel, []).append(SlackMessage(
                channel=channel, ts=ts, text=text, blocks=None, thread_ts=thread_ts, user=user, bot_id=None, params={},
                posted_at=time.monotonic()))

    def _conversation_info(self, params: dict[str, Any]) -> dict[str, Any]:
        # Slack hides a private channel from a bot that is not in it.
        if params.get("channel") in self.private_channels and params.get("channel") not in self._joined:
            return {"ok": False, "error": "channel_not_found"}
        return super()._conversation_info(params)


class FailingCore:
    async def handle(self, event: ChatEvent) -> Outcome:
        raise RuntimeError("database is down")


@pytest.fixture(scope="module")
def slack() -> Iterator[SlackWithPrivateChannels]:
    with SlackWithPrivateChannels() as fake:
        yield fake


@pytest.fixture(scope="module")
def catcher() -> Iterator[ResponseUrlCatcher]:
    with ResponseUrlCatcher() as running:
        yield running


@pytest.fixture
def sender(catcher: ResponseUrlCatcher) -> SlackEventSender:
    return SlackEventSender("http://bot.invalid/slack/events", SECRET, response_url=catcher.url)


@pytest.fixture
def core() -> RecordingCore:
    return RecordingCore()


@pytest.fixture
def app(slack: FakeSlack, core: RecordingCore) -> AsyncApp:
    return make_app(slack, core)


# --- events into ChatEvents ------------------------------------------------------------------------

async def test_research_command_becomes_a_command_event(app: AsyncApp, sender: SlackEventSender, core: RecordingCore) -> None:
    response = await dispatch(app, sender, sender.command("/research", "  why is the sky blue --since 2024-01-01 ",
                                                           user=USER, channel=CHANNEL))
    assert response.status == 200 and response.body == ""
    await eventually(lambda: core.events)
    event = core.events[0]
    assert (event.platform, event.workspace, event.channel, event.user) == ("slack", "T0FAKE", CHANNEL, f"slack:{USER}")
    assert (event.kind, event.command, event.text) == ("command", "research", "why is the sky blue --since 2024-01-01")
    assert event.thread is None and event.message_id is None


@pytest.mark.parametrize(("command", "name"), [("/plan", "plan"), ("/ask", "ask")])
async def test_plan_and_ask_commands_name_their_command(app: AsyncApp, sender: SlackEventSender, core: RecordingCore,
                                                         command: str, name: str) -> None:
    await dispatch(app, sender, sender.command(command, "help", user=USER, channel=CHANNEL))
    await eventually(lambda: core.events)
    assert (core.events[0].command, core.events[0].text) == (name, "help")


async def test_command_is_acknowledged_before_the_core_finishes(app: AsyncApp, sender: SlackEventSender,
                                                                core: RecordingCore) -> None:
    core.release.clear()
    acknowledged = asyncio.ensure_future(dispatch(app, sender, sender.command("/research", "slow question", user=USER,
                                                                              channel=CHANNEL)))
    try:
        # The core stays blocked until Slack has its answer: an ack that waited for the core never comes.
        done, _ = await asyncio.wait({acknowledged}, timeout=HANG_GUARD_SECONDS)
        assert done, "the command was not acknowledged while the core was still working"
    finally:
        core.release.set()
    assert acknowledged.result().status == 200
    await eventually(lambda: core.events)
    assert core.events[0].text == "slow question"


async def test_private_reply_to_a_command_goes_to_its_response_url_as_ephemeral(
        slack: FakeSlack, sender: SlackEventSender, catcher: ResponseUrlCatcher) -> None:
    core = RecordingCore(lambda event: Outcome(replies=[Reply(text="Usage: `/research <question>`", private=True)]))
    app = make_app(slack, core)
    request = sender.command("/ask", "help", user=USER, channel=CHANNEL)
    await dispatch(app, sender, request)
    await eventually(lambda: any(caught.payload.get("text", "").startswith("Usage") for caught in catcher.responses()))
    caught = [caught for caught in catcher.responses() if caught.payload.get("text", "").startswith("Usage")][-1]
    assert caught.payload["response_type"] == "ephemeral"
    assert caught.payload["text"] == "Usage: `/research &lt;question&gt;`"


async def test_top_level_mention_loses_the_bot_mention_and_is_answered_in_its_thread(
        slack: SlackWithPrivateChannels, sender: SlackEventSender) -> None:
    core = RecordingCore(lambda event: Outcome(replies=[Reply(text="On it.")]))
    app = make_app(slack, core)
    ts = sender.next_ts()
    slack.add_person_message(CHANNEL, f"<@{BOT}> what is   new in <@U0OTHER>'s field?", user=USER, ts=ts)
    request = sender.event(sender.app_mention(f"<@{BOT}> what is   new in <@U0OTHER>'s field?", user=USER, channel=CHANNEL, ts=ts))
    await dispatch(app, sender, request)
    await eventually(lambda: slack.messages(CHANNEL, thread_ts=ts)[1:])
    event = core.events[0]
    assert (event.kind, event.text) == ("mention", "what is new in <@U0OTHER>'s field?")
    assert (event.thread, event.message_id, event.event_id) == (None, ts, request.event_id)
    assert event.thread_history == []
    reply = slack.messages(CHANNEL, thread_ts=ts)[-1]
    assert (reply.text, reply.thread_ts) == ("On it.", ts)


async def test_mention_inside_a_thread_brings_the_earlier_messages_of_the_thread(
        app: AsyncApp, slack: SlackWithPrivateChannels, sender: SlackEventSender, core: RecordingCore) -> None:
    parent, answer, mention, later = (sender.next_ts() for _ in range(4))
    slack.add_person_message(CHANNEL, "Which heat pump should we buy?", user="U0FIRST", ts=parent)
    slack.add_person_message(CHANNEL, "The quiet one.", user="U0SECOND", ts=answer, thread_ts=parent)
    slack.add_person_message(CHANNEL, f"<@{BOT}> compare them", user=USER, ts=mention, thread_ts=parent)
    slack.add_person_message(CHANNEL, "written after the mention", user="U0FIRST", ts=later, thread_ts=parent)
    await dispatch(app, sender, sender.event(sender.app_mention(f"<@{BOT}> compare them", user=USER, channel=CHANNEL,
                                                                ts=mention, thread_ts=parent)))
    await eventually(lambda: core.events)
    event = core.events[0]
    assert (event.thread, event.message_id, event.text) == (parent, mention, "compare them")
    assert [(item.user, item.text, item.is_bot) for item in event.thread_history] == [
        ("slack:U0FIRST", "Which heat pump should we buy?", False), ("slack:U0SECOND", "The quiet one.", False)]


async def test_direct_message_becomes_a_direct_event(app: AsyncApp, sender: SlackEventSender, core: RecordingCore) -> None:
    request = sender.event(sender.message("how do tides work?", user=USER, channel="D0DIRECT", channel_type="im"))
    await dispatch(app, sender, request)
    await eventually(lambda: core.events)
    event = core.events[0]
    assert (event.kind, event.channel, event.text, event.thread) == ("direct", "D0DIRECT", "how do tides work?", None)
    assert event.event_id == request.event_id


async def test_reply_in_a_channel_thread_becomes_a_message_event(app: AsyncApp, sender: SlackEventSender,
                                                                 core: RecordingCore) -> None:
    parent, reply = sender.next_ts(), sender.next_ts()
    await dispatch(app, sender, sender.event(sender.message("what about 2020?", user=USER, channel=CHANNEL,
                                                            ts=reply, thread_ts=parent)))
    await eventually(lambda: core.events)
    event = core.events[0]
    assert (event.kind, event.thread, event.message_id, event.text) == ("message", parent, reply, "what about 2020?")


@pytest.mark.parametrize("event_of", [
    pytest.param(lambda sender: sender.message("top-level chatter", user=USER, channel=CHANNEL), id="top-level"),
    pytest.param(lambda sender: sender.message(f"<@{BOT}> again", user=USER, channel=CHANNEL, thread_ts="1.000001"),
                 id="thread-reply-mentioning-the-bot"),
    pytest.param(lambda sender: sender.message("edited", user=USER, channel=CHANNEL, thread_ts="1.000001",
                                               subtype="message_changed"), id="edit"),
    pytest.param(lambda sender: sender.message("joined", user=USER, channel=CHANNEL, subtype="channel_join"), id="join"),
    pytest.param(lambda sender: sender.message("beep", user="U0OTHERBOT", channel=CHANNEL, thread_ts="1.000001",
                                               bot_id="B0OTHER"), id="another-bot"),
])
async def test_messages_that_are_not_for_the_bot_are_ignored(app: AsyncApp, sender: SlackEventSender, core: RecordingCore,
                                                             event_of: Callable[[SlackEventSender], dict[str, Any]]) -> None:
    response = await dispatch(app, sender, sender.event(event_of(sender)))
    await listeners_finished()
    assert response.status == 200
    assert core.events == []


async def test_the_bots_own_messages_are_ignored(app: AsyncApp, slack: FakeSlack, sender: SlackEventSender,
                                                 core: RecordingCore) -> None:
    own = sender.message("status update", user=BOT, channel="D0DIRECT", channel_type="im", bot_id=slack.bot_id)
    own_reply = sender.message("the report", user=BOT, channel=CHANNEL, thread_ts="1.000001", bot_id=slack.bot_id)
    own_reaction = sender.reaction_added("x", user=BOT, channel=CHANNEL, message_ts="1.000001", item_user=BOT)
    for event in (own, own_reply, own_reaction):
        assert (await dispatch(app, sender, sender.event(event))).status == 200
    await listeners_finished()
    assert core.events == []


async def test_reaction_on_a_message_becomes_a_reaction_event(app: AsyncApp, sender: SlackEventSender,
                                                              core: RecordingCore) -> None:
    status_ts = sender.next_ts()
    await dispatch(app, sender, sender.event(sender.reaction_added("octagonal_sign", user=USER, channel=CHANNEL,
                                                                   message_ts=status_ts, item_user=BOT)))
    await eventually(lambda: core.events)
    event = core.events[0]
    assert (event.kind, event.reaction, event.channel, event.message_id, event.user) == (
        "reaction", "octagonal_sign", CHANNEL, status_ts, f"slack:{USER}")


async def test_button_click_becomes_an_action_event_in_the_messages_thread(
        app: AsyncApp, sender: SlackEventSender, core: RecordingCore) -> None:
    thread, status_ts = sender.next_ts(), sender.next_ts()
    response = await dispatch(app, sender, sender.block_action(RETRY_ACTION_ID, "42", user=USER, channel=CHANNEL,
                                                               message_ts=status_ts, thread_ts=thread))
    assert response.status == 200
    await eventually(lambda: core.events)
    event = core.events[0]
    assert (event.kind, event.action, event.action_run_id) == ("action", "retry", 42)
    assert (event.channel, event.thread, event.message_id, event.user) == (CHANNEL, thread, status_ts, f"slack:{USER}")


@pytest.mark.parametrize(("action_id", "action"), [(CONTINUE_ACTION_ID, "continue"), (EXPORT_ACTION_ID, "export")])
async def test_continue_and_export_buttons_name_their_action(app: AsyncApp, sender: SlackEventSender, core: RecordingCore,
                                                             action_id: str, action: str) -> None:
    await dispatch(app, sender, sender.block_action(action_id, "7", user=USER, channel=CHANNEL, message_ts=sender.next_ts()))
    await eventually(lambda: core.events)
    assert (core.events[0].action, core.events[0].action_run_id) == (action, 7)


async def test_private_reply_to_a_button_is_ephemeral_and_keeps_the_original_message(
        slack: FakeSlack, sender: SlackEventSender, catcher: ResponseUrlCatcher) -> None:
    core = RecordingCore(lambda event: Outcome(replies=[Reply(text="That run no longer exists.", private=True)]))
    app = make_app(slack, core)
    await dispatch(app, sender, sender.block_action(EXPORT_ACTION_ID, "999", user=USER, channel=CHANNEL,
                                                    message_ts=sender.next_ts()))
    await eventually(lambda: any(caught.payload.get("text") == "That run no longer exists." for caught in catcher.responses()))
    caught = [caught for caught in catcher.responses() if caught.payload.get("text") == "That run no longer exists."][-1]
    assert caught.path.startswith("/actions/")
    assert caught.payload["response_type"] == "ephemeral" and caught.payload["replace_original"] is False


# --- retries, membership, failures ---------------------------------------------------------------

async def test_a_retried_event_delivery_is_handled_once(app: AsyncApp, sender: SlackEventSender, core: RecordingCore) -> None:
    request = sender.event(sender.message("hello", user=USER, channel="D0DIRECT", channel_type="im"))
    first = await dispatch(app, sender, request)
    retry = await dispatch(app, sender, request, retry_num=1)
    await listeners_finished()
    assert (first.status, retry.status) == (200, 200)
    assert len(core.events) == 1


async def test_command_in_a_public_channel_the_bot_is_not_in_joins_it_first(sender: SlackEventSender,
                                                                           core: RecordingCore) -> None:
    with FakeSlack(require_join=True) as slack:
        app = make_app(slack, core)
        await dispatch(app, sender, sender.command("/research", "question one", user=USER, channel="C0PUBLIC"))
        await eventually(lambda: core.events)
        assert slack.joined_channels() == {"C0PUBLIC"}
        assert [call.method for call in slack.calls() if call.method.startswith("conversations.")] == [
            "conversations.info", "conversations.join"]
        await dispatch(app, sender, sender.command("/research", "question two", user=USER, channel="C0PUBLIC"))
        await eventually(lambda: len(core.events) == 2)
        assert len(slack.calls("conversations.info")) == 1, "membership is remembered"


async def test_command_in_a_private_channel_the_bot_is_not_in_asks_privately_to_invite_it(
        slack: SlackWithPrivateChannels, sender: SlackEventSender, catcher: ResponseUrlCatcher, core: RecordingCore) -> None:
    slack.private_channels.add("G0SECRET")
    app = make_app(slack, core)
    request = sender.command("/research", "secret question", user=USER, channel="G0SECRET", channel_name="privategroup")
    await dispatch(app, sender, request)
    await eventually(lambda: any("/invite" in caught.payload.get("text", "") for caught in catcher.responses()))
    caught = [caught for caught in catcher.responses() if "/invite" in caught.payload.get("text", "")][-1]
    assert caught.payload["response_type"] == "ephemeral"
    assert f"/invite <@{BOT}>" in caught.payload["text"]
    await listeners_finished()
    assert core.events == []
    assert "G0SECRET" not in slack.joined_channels()


async def test_when_the_core_fails_the_person_is_told_privately(slack: FakeSlack, sender: SlackEventSender) -> None:
    app = make_app(slack, FailingCore())
    request = sender.event(sender.message("hello", user=USER, channel="D0FAILING", channel_type="im"))
    await dispatch(app, sender, request)
    await eventually(lambda: any(message["channel"] == "D0FAILING" for message in slack.ephemeral_messages()))
    ephemeral = [message for message in slack.ephemeral_messages() if message["channel"] == "D0FAILING"][-1]
    assert ephemeral["user"] == USER and "went wrong" in ephemeral["text"]


def test_reply_text_cannot_ping_the_channel_but_mentions_the_person_it_names() -> None:
    text = SlackRenderer().reply("Only {person} can stop it. <!channel> <@U0OTHER> & **now**", person="slack:U0OWNER").text
    assert text == "Only <@U0OWNER> can stop it. &lt;!channel&gt; &lt;@U0OTHER&gt; &amp; *now*"


def test_a_person_slot_typed_into_a_reply_without_a_person_stays_text() -> None:
    assert SlackRenderer().reply("you said {person}").text == "you said {person}"


def test_bot_mention_is_removed_wherever_it_is() -> None:
    assert without_bot_mention(f"<@{BOT}> hi", BOT) == "hi"
    assert without_bot_mention(f"hey <@{BOT}|deepthread>  what now", BOT) == "hey what now"
    assert without_bot_mention("<@U0OTHER> hi", BOT) == "<@U0OTHER> hi"


def test_history_keeps_only_messages_before_the_mention_and_marks_the_bots() -> None:
    messages = [{"ts": "10.0", "user": "U1", "text": "q"}, {"ts": "11.0", "user": BOT, "bot_id": "B0BOT", "text": "a"},
                {"ts": "12.0", "user": "U1", "text": "mention"}, {"ts": "13.0", "user": "U2", "text": "later"}]
    history = history_before(messages, "12.0", BOT)
    assert [(item.user, item.is_bot) for item in history] == [("slack:U1", False), (f"slack:{BOT}", True)]


def test_http_mode_without_a_signing_secret_refuses_to_build() -> None:
    settings = load_settings(slack_bot_token="xoxb-x")
    with pytest.raises(ValueError, match="SLACK_SIGNING_SECRET"):
        build_slack_app(settings, RecordingCore(), dedupe=MemoryEventDeduper())


# --- dedupe --------------------------------------------------------------------------------------

async def test_memory_deduper_forgets_an_event_after_its_claim_expires() -> None:
    now = [0.0]
    dedupe = MemoryEventDeduper(claim_seconds=60, clock=lambda: now[0])
    assert await dedupe.first_delivery("Ev1") is True
    assert await dedupe.first_delivery("Ev1") is False
    now[0] = 61.0
    assert await dedupe.first_delivery("Ev1") is True


@pytest.fixture
async def fake_redis() -> AsyncIterator[fakeredis.FakeAsyncRedis]:
    client = fakeredis.FakeAsyncRedis()
    yield client
    await client.aclose()


async def test_redis_deduper_claims_each_event_id_once_for_an_hour(fake_redis: fakeredis.FakeAsyncRedis) -> None:
    dedupe = RedisEventDeduper(fake_redis)
    assert await dedupe.first_delivery("Ev1") is True
    assert await dedupe.first_delivery("Ev1") is False
    assert await dedupe.first_delivery("Ev2") is True
    ttl = await fake_redis.ttl(EVENT_KEY.format(event_id="Ev1"))
    assert CLAIM_SECONDS - 5 <= ttl <= CLAIM_SECONDS


async def test_redis_deduper_lets_events_through_when_redis_is_down() -> None:
    server = fakeredis.FakeServer()
    server.connected = False
    dedupe = RedisEventDeduper(fakeredis.FakeAsyncRedis(server=server))
    assert await dedupe.first_delivery("Ev1") is True
    assert await dedupe.first_delivery("Ev1") is True
    await dedupe.aclose()


# --- buttons in rendered messages ----------------------------------------------------------------

NOW = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.timezone.utc)


def buttons_of(blocks: list[dict[str, Any]] | None) -> list[tuple[str, str]]:
    return [(element["action_id"], element["value"]) for block in blocks or [] if block["type"] == "actions"
            for element in block["elements"]]


@pytest.mark.parametrize("state", ["failed", "timed_out", "cancelled"])
def test_unfinished_research_status_offers_retry_and_continue(state: str) -> None:
    progress = initial_progress(run_id=42, mode="research", question="q", requested_by="slack:U1").model_copy(
        update={"state": state})
    content = SlackRenderer().status(progress, now=NOW)
    assert buttons_of(blocks_of(content)) == [(RETRY_ACTION_ID, "42"), (CONTINUE_ACTION_ID, "42")]


def test_partial_done_status_offers_retry_and_continue_but_a_whole_one_does_not() -> None:
    done = initial_progress(run_id=5, mode="research", question="q", requested_by="slack:U1").model_copy(
        update={"state": "done"})
    assert buttons_of(blocks_of(SlackRenderer().status(done, now=NOW))) == []
    partial = done.model_copy(update={"partial": True, "partial_reason": "time budget"})
    assert buttons_of(blocks_of(SlackRenderer().status(partial, now=NOW))) == [(RETRY_ACTION_ID, "5"), (CONTINUE_ACTION_ID, "5")]


@pytest.mark.parametrize("state", ["queued", "running"])
def test_status_of_a_run_in_flight_offers_only_stop(state: str) -> None:
    progress = initial_progress(run_id=1, mode="research", question="q", requested_by="slack:U1", state=state)
    assert buttons_of(blocks_of(SlackRenderer().status(progress, now=NOW))) == [("deepthread_stop", "1")]


def test_failed_plan_offers_retry_only() -> None:
    progress = initial_progress(run_id=3, mode="plan", question="q", requested_by="slack:U1").model_copy(
        update={"state": "failed"})
    assert buttons_of(blocks_of(SlackRenderer().status(progress, now=NOW))) == [(RETRY_ACTION_ID, "3")]


def small_report() -> Report:
    return Report(question="Why?", title="Why", body_markdown="## Why\n\nBecause [1].",
                  sources=[ReportSource(number=1, source_id="s1", title="A source", url="https://example.com/a")])


@pytest.mark.parametrize("use_markdown_blocks", [True, False])
def test_delivered_report_ends_with_an_export_button(use_markdown_blocks: bool) -> None:
    delivery = SlackRenderer(use_markdown_blocks=use_markdown_blocks).report(small_report(), requester="slack:U1", run_id=9)
    # A research report can be watched: "Watch this" sits beside the export button.
    assert buttons_of(blocks_of(delivery.messages[-1])) == [(EXPORT_ACTION_ID, "9"), (WATCH_ACTION_ID, "9")]
    assert all(buttons_of(blocks_of(message)) == [] for message in delivery.messages[:-1])


def test_report_without_a_run_id_has_no_button() -> None:
    delivery = SlackRenderer().report(small_report(), requester="slack:U1")
    assert all(buttons_of(blocks_of(message)) == [] for message in delivery.messages)


def test_export_button_gets_a_message_of_its_own_when_the_last_one_is_full() -> None:
    full = slack_content("x", [section_block(f"part {index}") for index in range(BLOCKS_PER_MESSAGE)])
    delivery = with_export_button(ReportDelivery(messages=[full]), 4)
    assert len(delivery.messages) == 2 and len(blocks_of(delivery.messages[0]) or []) == BLOCKS_PER_MESSAGE
    assert buttons_of(blocks_of(delivery.messages[1])) == [(EXPORT_ACTION_ID, "4")]


# --- the app manifest ----------------------------------------------------------------------------

def test_manifest_declares_every_command_event_and_button_the_app_handles() -> None:
    manifest = yaml.safe_load((Path(__file__).resolve().parents[2] / "slack" / "manifest.yml").read_text())
    assert {command["command"] for command in manifest["features"]["slash_commands"]} == {*COMMANDS, WATCHES_COMMAND}
    events = set(manifest["settings"]["event_subscriptions"]["bot_events"])
    assert {"app_mention", "message.channels", "message.groups", "message.im", "reaction_added"} <= events
    assert manifest["settings"]["interactivity"]["is_enabled"] is True
    scopes = set(manifest["oauth_config"]["scopes"]["bot"])
    assert {"commands", "chat:write", "app_mentions:read", "channels:join", "channels:read", "reactions:read",
            "files:write", "im:history", "channels:history", "groups:history"} <= scopes
    assert manifest["features"]["app_home"]["messages_tab_enabled"] is True


async def test_private_replies_go_over_one_connection_kept_open() -> None:
    # bolt's `respond` opened (and closed) a connection, TLS included, for each private reply: under a burst of
    # commands refused by a queue cap, that work held up the next commands' acknowledgements.
    connections, bodies = 0, []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(re.search(rb"content-length: *(\d+)", head, re.IGNORECASE).group(1))
                bodies.append(json.loads(await reader.readexactly(length)))
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
        except asyncio.IncompleteReadError:
            writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/commands/T1/1/secret"
    poster = ResponseUrlPoster()
    async with server:
        for text in ("one", "two", "three"):
            await respond_sender(AsyncRespond(response_url=url), poster)(text)
        await poster.sessions.aclose()

    assert [(body["text"], body["response_type"], body["replace_original"]) for body in bodies] == [
        ("one", "ephemeral", False), ("two", "ephemeral", False), ("three", "ephemeral", False)]
    assert connections == 1
