"""The Slack bot on 127.0.0.1 with the real bolt app and real Redis for dedupe, talking to the fake Slack Web API: in
HTTP mode (uvicorn, starlette) sent requests signed as Slack signs them, and in Socket Mode sent envelopes over a fake
Socket Mode WebSocket."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import httpx
import pytest

from chat.slack.messenger import build_slack_client
from bot.slack.app import build_slack_app
from bot.slack.dedupe import RedisEventDeduper
from bot.slack.server import SlackBot, build_http_app
from config import load_settings
from tests.fakes.server import LoopbackServer, free_port
from tests.fakes.slack_api import FakeSlack
from tests.fakes.recording_core import RecordingCore
from tests.fakes.slack_events import (
    FakeSocketModeServer,
    ResponseUrlCatcher,
    SlackEventSender,
    SlackRequest,
    SocketModeSlack,
    sign_slack_request,
)
from tests.waiting import HANG_GUARD_SECONDS, wait_for

pytestmark = pytest.mark.integration

SECRET = "integration-signing-secret"
CHANNEL = "C0RESEARCH"
USER = "U0ASKER"
FIVE_MINUTES = 5 * 60


class Bot:
    """The running HTTP-mode bot and what it talks to."""

    def __init__(self, url: str, core: RecordingCore, slack: FakeSlack, sender: SlackEventSender) -> None:
        self.url = url
        self.core = core
        self.slack = slack
        self.sender = sender


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url).status_code == 200
    except httpx.TransportError:
        return False


@pytest.fixture
def bot(redis_url: str) -> Iterator[Bot]:
    core = RecordingCore()
    with FakeSlack() as slack, ResponseUrlCatcher() as catcher:
        settings = load_settings(slack_bot_token=slack.token, slack_signing_secret=SECRET, slack_api_url=slack.api_url,
                                 redis_url=redis_url)
        dedupe = RedisEventDeduper.from_url(redis_url)
        app = build_slack_app(settings, core, client=build_slack_client(slack.token, slack.api_url), dedupe=dedupe)
        with LoopbackServer(build_http_app(app)) as server:
            sender = SlackEventSender(f"{server.url}/slack/events", SECRET, response_url=catcher.url)
            yield Bot(server.url, core, slack, sender)
            core.release.set()
            sender.close()


def test_healthz_answers_ok(bot: Bot) -> None:
    response = httpx.get(f"{bot.url}/healthz")
    assert response.status_code == 200 and response.json() == {"ok": True}


def test_url_verification_echoes_the_challenge(bot: Bot) -> None:
    response = bot.sender.send(bot.sender.url_verification("3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"))
    assert response.status_code == 200
    assert response.json() == {"challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"}


def test_slash_command_is_acknowledged_while_the_core_is_still_working(bot: Bot) -> None:
    bot.core.release.clear()
    with ThreadPoolExecutor(max_workers=1) as pool:
        answer = pool.submit(bot.sender.send, bot.sender.command("/research", "why is the sky blue", user=USER,
                                                                 channel=CHANNEL))
        try:
            # The core stays blocked until Slack has its answer: an ack that waited for the core never comes.
            response = answer.result(timeout=HANG_GUARD_SECONDS)
        except FutureTimeout:
            pytest.fail("the command was not acknowledged while the core was still working")
        finally:
            bot.core.release.set()
    assert response.status_code == 200 and response.text == ""
    wait_for(lambda: bot.core.count() == 1)
    assert bot.core.events[0].text == "why is the sky blue"


def handled_after(bot: Bot, request: SlackRequest) -> None:
    """Send a valid `request` and wait until the core has it: everything sent before it has been processed too."""
    before = bot.core.count()
    assert bot.sender.send(request).status_code == 200
    wait_for(lambda: bot.core.count() > before)


def test_bad_signature_is_refused_and_starts_nothing(bot: Bot) -> None:
    request = bot.sender.command("/research", "forged", user=USER, channel=CHANNEL)
    forged = sign_slack_request("not-the-secret", request.body, int(time.time()))
    response = bot.sender.send(request, signature=forged)
    assert response.status_code == 401
    assert bot.slack.calls() == []
    handled_after(bot, bot.sender.command("/research", "signed", user=USER, channel=CHANNEL))
    assert [event.text for event in bot.core.events] == ["signed"]


def test_timestamp_older_than_five_minutes_is_refused_even_when_signed(bot: Bot) -> None:
    request = bot.sender.event(bot.sender.app_mention("<@U0BOT> replayed", user=USER, channel=CHANNEL))
    response = bot.sender.send(request, timestamp=int(time.time()) - FIVE_MINUTES - 30)
    assert response.status_code == 401
    handled_after(bot, bot.sender.event(bot.sender.app_mention("<@U0BOT> fresh", user=USER, channel=CHANNEL)))
    assert [event.text for event in bot.core.events] == ["fresh"]


def test_the_same_mention_delivered_twice_is_handled_once(bot: Bot) -> None:
    request = bot.sender.event(bot.sender.app_mention("<@U0BOT> what changed in 2024?", user=USER, channel=CHANNEL))
    first = bot.sender.send(request)
    retry = bot.sender.send(request, retry_num=1)
    assert (first.status_code, retry.status_code) == (200, 200)
    wait_for(lambda: bot.core.count() == 1)
    handled_after(bot, bot.sender.event(bot.sender.app_mention("<@U0BOT> and since?", user=USER, channel=CHANNEL)))
    assert [event.text for event in bot.core.events] == ["what changed in 2024?", "and since?"]
    assert bot.core.events[0].event_id == request.event_id


def test_unsigned_request_is_refused(bot: Bot) -> None:
    request = bot.sender.command("/research", "no headers", user=USER, channel=CHANNEL)
    response = httpx.post(f"{bot.url}/slack/events", content=request.body,
                          headers={"Content-Type": request.content_type})
    assert response.status_code == 401


# --- Socket Mode ---------------------------------------------------------------------------------

def test_socket_mode_acknowledges_envelopes_and_hands_them_to_the_core(redis_url: str) -> None:
    core = RecordingCore()
    with SocketModeSlack() as slack, FakeSocketModeServer() as socket_server, ResponseUrlCatcher() as catcher:
        slack.socket_url = socket_server.url
        settings = load_settings(slack_bot_token=slack.token, slack_app_token=slack.app_token, slack_api_url=slack.api_url,
                                 redis_url=redis_url)
        bot = SlackBot(settings, core, client=build_slack_client(slack.token, slack.api_url),
                       dedupe=RedisEventDeduper.from_url(redis_url))
        port = free_port()
        thread = threading.Thread(target=lambda: asyncio.run(bot.run(host="127.0.0.1", port=port)), daemon=True)
        thread.start()
        try:
            socket_server.wait_connected()
            wait_for(lambda: _healthy(f"http://127.0.0.1:{port}/healthz"))
            assert httpx.post(f"http://127.0.0.1:{port}/slack/events", content=b"{}").status_code in (404, 405)
            sender = SlackEventSender("unused", "unused", response_url=catcher.url)
            command = sender.socket_envelope("slash_commands", sender.command_payload(
                "/research", "tides and the moon", user=USER, channel=CHANNEL))
            mention = sender.event_payload(sender.app_mention("<@U0BOT> and the sun?", user=USER, channel=CHANNEL))
            first = sender.socket_envelope("events_api", mention)
            retry = sender.socket_envelope("events_api", mention, retry_attempt=1)
            later = sender.socket_envelope("events_api", sender.event_payload(
                sender.app_mention("<@U0BOT> and the stars?", user=USER, channel=CHANNEL)))
            for envelope in (command, first, retry, later):
                socket_server.push(envelope)
            expected = {command["envelope_id"], first["envelope_id"], retry["envelope_id"], later["envelope_id"]}
            wait_for(lambda: expected <= {ack.get("envelope_id") for ack in socket_server.acks()})
            # Bolt decides on an envelope (dedupe included) and starts its listener before acknowledging it, and
            # envelopes are handled concurrently: once every ack is in and the three distinct requests reached the
            # core, a retry that got through would be there too, in whatever order.
            wait_for(lambda: len({event.text for event in core.events}) == 3)
            assert sorted((event.kind, event.text) for event in core.events) == [
                ("command", "tides and the moon"), ("mention", "and the stars?"), ("mention", "and the sun?")]
            assert slack.calls("apps.connections.open")
        finally:
            bot.stop()
            thread.join(timeout=10)
