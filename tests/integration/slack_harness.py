"""The Slack app in HTTP mode on 127.0.0.1 (the real bolt app and conversation core, requests signed as Slack signs
them) against the fake Slack Web API, with a real worker process, real Redis, and the fake LLM, search provider and
web corpus; what the app says through a command's or a click's `response_url` is caught (`SlackWorld.responses`).

The fake knows ASKER and OTHER (users.info: their time zone, America/New_York unless a test sets another)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from bot.cli import platform_core
from bot.slack.app import build_slack_app
from bot.slack.bundle import BUNDLE as SLACK
from bot.slack.dedupe import RedisEventDeduper
from bot.slack.server import build_http_app
from chat.slack.messenger import build_slack_client
from storage.models import Run
from tests.fakes.corpus import Corpus
from tests.fakes.server import LoopbackServer
from tests.fakes.slack_api import FakeSlack, SlackMessage
from tests.fakes.slack_events import CaughtResponse, ResponseUrlCatcher, SlackEventSender
from tests.integration.workers import Cluster
from tests.run_rows import all_runs

CHANNEL = "C0RESEARCH"
ASKER, OTHER = "U0ASKER01", "U0OTHER01"


@dataclass
class SlackWorld:
    cluster: Cluster
    slack: FakeSlack
    corpus: Corpus
    sender: SlackEventSender
    catcher: ResponseUrlCatcher

    def runs(self) -> list[Run]:
        return all_runs(self.cluster.sessions)

    def thread_messages(self, run: Run):
        return self.slack.messages(CHANNEL, thread_ts=run.status_message["thread"])

    def report_messages(self, run: Run, marker: str = "here is your report"):
        return [message for message in self.thread_messages(run) if marker in message.visible_text]

    def command(self, command: str, text: str, user: str = ASKER) -> httpx.Response:
        return self.sender.send(self.sender.command(command, text, user=user, channel=CHANNEL))

    def reply(self, run: Run, text: str, user: str = ASKER) -> httpx.Response:
        return self.sender.send(self.sender.event(self.sender.message(
            text, user=user, channel=CHANNEL, thread_ts=run.status_message["thread"])))

    def react(self, run: Run, reaction: str, user: str) -> httpx.Response:
        return self.sender.send(self.sender.event(self.sender.reaction_added(
            reaction, user=user, channel=CHANNEL, message_ts=run.status_message["message_id"])))

    def wait_for_runs(self, count: int, timeout: float = 20) -> list[Run]:
        return self.cluster.wait_for(lambda: len(runs := self.runs()) >= count and runs, timeout, f"{count} runs")

    def responses(self) -> list[CaughtResponse]:
        """What the app said through `response_url`s (private replies to commands and clicks), in order."""
        return self.catcher.responses()

    def next_response(self, after: int, what: str, timeout: float = 10) -> CaughtResponse:
        """The first `response_url` reply after the first `after` ones, waited for."""
        return self.cluster.wait_for(lambda: len(caught := self.responses()) > after and caught[after], timeout, what)

    def click(self, message: SlackMessage, action_id: str, user: str = ASKER, *, trigger_id: str | None = None) -> httpx.Response:
        """A click by `user` on the button `action_id` of the bot's `message`, as Slack sends it."""
        button = next(element for block in message.blocks or [] if block["type"] == "actions"
                      for element in block["elements"] if element.get("action_id") == action_id)
        return self.sender.send(self.sender.block_action(action_id, button.get("value", ""), user=user, channel=CHANNEL,
                                                         message_ts=message.ts, thread_ts=message.thread_ts,
                                                         label=button["text"]["text"], trigger_id=trigger_id))


def slack_world(tmp_path: Path, redis_url: str, corpus: Corpus, **settings: str) -> Iterator[SlackWorld]:
    from storage.redis import connect

    connect(redis_url).flushall()
    with FakeSlack() as slack, ResponseUrlCatcher() as catcher:
        for person in (ASKER, OTHER):
            slack.add_user(person, person.lower())
        cluster = Cluster(database_url=f"sqlite:///{tmp_path}/deepthread.db", redis_url=redis_url, corpus=corpus,
                          slack=slack, workdir=tmp_path, **settings)
        cluster.start_worker("w1")
        client = build_slack_client(slack.token, slack.api_url)
        app = build_slack_app(cluster.settings, platform_core(SLACK, cluster.settings), client=client,
                              dedupe=RedisEventDeduper.from_url(redis_url))
        try:
            with LoopbackServer(build_http_app(app)) as server:
                sender = SlackEventSender(f"{server.url}/slack/events",
                                          cluster.settings.slack_signing_secret.get_secret_value(),
                                          response_url=catcher.url)
                yield SlackWorld(cluster, slack, corpus, sender, catcher)
                sender.close()
        finally:
            cluster.stop()
