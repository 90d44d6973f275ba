"""Replayed and oversized requests against the Slack bot in HTTP mode (uvicorn, starlette, the real bolt app, real
Redis), sent over loopback as an attacker would: a signed slash command or button sent again is refused and reaches
the core once; a body over the limit is answered 413 before its signature is checked and without being read whole."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from bot.slack.app import REPLAYED_REQUEST_STATUS, build_slack_app
from bot.slack.dedupe import MemoryEventDeduper, RedisEventDeduper, RedisReplayGuard, ReplayGuard
from bot.slack.server import build_http_app
from chat.slack.messenger import build_slack_client
from config import load_settings
from tests.fakes.server import LoopbackServer, free_port
from tests.fakes.slack_api import FakeSlack
from tests.fakes.recording_core import RecordingCore
from tests.fakes.slack_events import ResponseUrlCatcher, SlackEventSender, SlackRequest, sign_slack_request
from tests.waiting import HANG_GUARD_SECONDS, wait_for

pytestmark = pytest.mark.integration

SECRET = "replay-signing-secret"
CHANNEL = "C0RESEARCH"
USER = "U0ASKER"
BODY_LIMIT = 64 * 1024


@dataclass
class Bot:
    """The running HTTP-mode bot and what it talks to."""

    url: str
    port: int
    core: RecordingCore
    sender: SlackEventSender

    def marker(self, text: str) -> None:
        """Send a fresh command and wait until the core has it: everything sent before has been dealt with by then."""
        response = self.sender.send(self.sender.command("/research", text, user=USER, channel=CHANNEL))
        assert response.status_code == 200
        wait_for(lambda: text in self.core.texts())


def running_bot(replay_guard: ReplayGuard, dedupe: object) -> Iterator[Bot]:
    core = RecordingCore()
    with FakeSlack() as slack, ResponseUrlCatcher() as catcher:
        settings = load_settings(slack_bot_token=slack.token, slack_signing_secret=SECRET, slack_api_url=slack.api_url)
        app = build_slack_app(settings, core, client=build_slack_client(slack.token, slack.api_url), dedupe=dedupe,  # type: ignore[arg-type]
                              replay_guard=replay_guard)
        with LoopbackServer(build_http_app(app, max_body_bytes=BODY_LIMIT)) as server:
            sender = SlackEventSender(f"{server.url}/slack/events", SECRET, response_url=catcher.url)
            try:
                yield Bot(server.url, server.port, core, sender)
            finally:
                sender.close()


@pytest.fixture
def bot(redis_url: str) -> Iterator[Bot]:
    yield from running_bot(RedisReplayGuard.from_url(redis_url), RedisEventDeduper.from_url(redis_url))


@pytest.fixture
def bot_without_redis() -> Iterator[Bot]:
    nobody_listens = f"redis://127.0.0.1:{free_port()}/0"
    yield from running_bot(RedisReplayGuard.from_url(nobody_listens), MemoryEventDeduper())


# --- replays -----------------------------------------------------------------------------------------------------

def test_the_same_signed_slash_command_sent_twice_is_refused_the_second_time_and_reaches_the_core_once(
        bot: Bot, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="bot.slack")
    request = bot.sender.command("/research", "why is the sky blue", user=USER, channel=CHANNEL)
    timestamp = int(time.time())
    first = bot.sender.send(request, timestamp=timestamp)
    replay = bot.sender.send(request, timestamp=timestamp)

    assert first.status_code == 200
    assert replay.status_code == REPLAYED_REQUEST_STATUS and 400 <= replay.status_code < 500
    bot.marker("a later command")
    assert bot.core.texts() == ["why is the sky blue", "a later command"]
    refusals = [record for record in caplog.records if "replayed" in record.getMessage()]
    assert [record.levelno for record in refusals] == [logging.INFO]
    assert not [record for record in caplog.records if "sky blue" in record.getMessage()], "a log line quoted the body"


def test_the_same_signed_button_click_sent_twice_is_refused_the_second_time(bot: Bot) -> None:
    request = bot.sender.block_action("deepthread_retry", "42", user=USER, channel=CHANNEL, message_ts="1710000000.000100")
    timestamp = int(time.time())
    first = bot.sender.send(request, timestamp=timestamp)
    replay = bot.sender.send(request, timestamp=timestamp)

    assert first.status_code == 200
    assert replay.status_code == REPLAYED_REQUEST_STATUS
    bot.marker("after the click")
    assert [event.kind for event in bot.core.events] == ["action", "command"]


def test_two_different_commands_signed_in_the_same_second_are_both_handled(bot: Bot) -> None:
    timestamp = int(time.time())
    for text in ("first question", "second question"):
        request = bot.sender.command("/research", text, user=USER, channel=CHANNEL)
        assert bot.sender.send(request, timestamp=timestamp).status_code == 200
    wait_for(lambda: len(bot.core.texts()) == 2)
    assert sorted(bot.core.texts()) == ["first question", "second question"]


def test_slacks_retry_of_an_event_with_the_same_signature_is_acknowledged_and_handled_once(bot: Bot) -> None:
    request = bot.sender.event(bot.sender.app_mention("<@U0BOT> what changed?", user=USER, channel=CHANNEL))
    timestamp = int(time.time())
    first = bot.sender.send(request, timestamp=timestamp)
    retry = bot.sender.send(request, timestamp=timestamp, retry_num=1)

    assert (first.status_code, retry.status_code) == (200, 200)
    bot.marker("after the retry")
    assert bot.core.texts() == ["what changed?", "after the retry"]


def test_a_replay_sent_to_another_bot_process_is_refused_through_redis(bot: Bot, redis_url: str) -> None:
    other_process = running_bot(RedisReplayGuard.from_url(redis_url), RedisEventDeduper.from_url(redis_url))
    other = next(other_process)
    try:
        request = bot.sender.command("/research", "seen by the first process", user=USER, channel=CHANNEL)
        timestamp = int(time.time())
        headers = bot.sender.headers(request, timestamp=timestamp)
        first = httpx.post(f"{bot.url}/slack/events", content=request.body.encode(), headers=headers)
        replay = httpx.post(f"{other.url}/slack/events", content=request.body.encode(), headers=headers)

        assert (first.status_code, replay.status_code) == (200, REPLAYED_REQUEST_STATUS)
        other.marker("the other process is alive")
        assert other.core.texts() == ["the other process is alive"]
    finally:
        other_process.close()


def test_a_replay_is_still_refused_by_the_same_process_while_redis_is_down(bot_without_redis: Bot) -> None:
    bot = bot_without_redis
    request = bot.sender.command("/research", "is the guard still on?", user=USER, channel=CHANNEL)
    timestamp = int(time.time())
    first = bot.sender.send(request, timestamp=timestamp)
    replay = bot.sender.send(request, timestamp=timestamp)

    assert (first.status_code, replay.status_code) == (200, REPLAYED_REQUEST_STATUS)
    bot.marker("redis is still down")
    assert bot.core.texts() == ["is the guard still on?", "redis is still down"]


# --- oversized bodies ----------------------------------------------------------------------------------------------

def oversized_command(sender: SlackEventSender) -> SlackRequest:
    request = sender.command("/research", "x" * BODY_LIMIT, user=USER, channel=CHANNEL)
    assert len(request.body) > BODY_LIMIT
    return request


def test_an_oversized_body_with_a_wrong_signature_is_answered_413_not_401(bot: Bot) -> None:
    request = oversized_command(bot.sender)
    forged = sign_slack_request("not-the-secret", request.body, int(time.time()))
    response = bot.sender.send(request, signature=forged)

    assert response.status_code == 413
    bot.marker("after the big one")
    assert bot.core.texts() == ["after the big one"]


def test_an_oversized_body_correctly_signed_is_refused_too(bot: Bot) -> None:
    response = bot.sender.send(oversized_command(bot.sender))
    assert response.status_code == 413
    bot.marker("after the signed big one")
    assert bot.core.texts() == ["after the signed big one"]


def raw_exchange(port: int, head: bytes, body_parts: list[bytes]) -> bytes:
    """Send a request head and some body bytes over a plain socket, never finishing the body, and read the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=HANG_GUARD_SECONDS) as connection:
        connection.sendall(head)
        for part in body_parts:
            connection.sendall(part)
        answer = b""
        while b"\r\n\r\n" not in answer:
            received = connection.recv(4096)
            if not received:
                break
            answer += received
        return answer


def request_head(extra_headers: str) -> bytes:
    timestamp = int(time.time())
    return (f"POST /slack/events HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\n"
            f"X-Slack-Request-Timestamp: {timestamp}\r\nX-Slack-Signature: v0=forged\r\n{extra_headers}\r\n").encode()


def test_a_declared_length_over_the_limit_is_answered_413_before_the_body_is_sent(bot: Bot) -> None:
    one_gibibyte = 1024 ** 3
    answer = raw_exchange(bot.port, request_head(f"Content-Length: {one_gibibyte}\r\n"), [b"text=" + b"a" * 1024])
    assert answer.startswith(b"HTTP/1.1 413"), answer[:80]


def test_a_chunked_body_is_cut_off_with_413_once_it_passes_the_limit_without_waiting_for_its_end(bot: Bot) -> None:
    chunk = b"a" * (16 * 1024)
    chunks = [f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n" for _ in range(BODY_LIMIT // len(chunk) + 1)]
    # The terminating zero-length chunk is never sent: an answer proves the server stopped reading on its own.
    answer = raw_exchange(bot.port, request_head("Transfer-Encoding: chunked\r\n"), chunks)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:80]


def test_a_body_within_the_limit_is_handled(bot: Bot) -> None:
    text = "y" * (BODY_LIMIT // 2)
    response = bot.sender.send(bot.sender.command("/research", text, user=USER, channel=CHANNEL))
    assert response.status_code == 200
    wait_for(lambda: text in bot.core.texts())
    assert httpx.get(f"{bot.url}/healthz").status_code == 200
