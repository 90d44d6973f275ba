"""`/research history` and in-thread exports through Slack: the real bolt app in HTTP mode on 127.0.0.1 with the real
conversation core, requests signed as Slack signs them, the fake Slack Web API (files upload v2 included), and a
catcher for the `response_url` replies. Runs are finished in the database as a worker would finish them."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from bot.conversation.core import build_core
from bot.slack.app import build_slack_app
from bot.slack.dedupe import MemoryEventDeduper
from bot.slack.server import build_http_app
from chat.slack.messenger import SlackMessenger, build_slack_client
from chat.slack.render import SlackRenderer
from config import load_settings
from storage.models import Run
from tests.fakes.server import LoopbackServer
from tests.fakes.slack_api import FakeSlack
from tests.fakes.slack_events import CaughtResponse, ResponseUrlCatcher, SlackEventSender
from tests.run_rows import all_runs, finish_run, migrated_sqlite, one_source_report, queue_without_workers
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

SECRET = "history-signing-secret"
PUBLIC, ELSEWHERE, SECRET_CHANNEL = "C0PUBLIC", "C0ELSEWHERE", "C0SECRET"
ASKER, OTHER = "U0ASKER01", "U0OTHER01"


@dataclass
class SlackHistoryWorld:
    slack: FakeSlack
    catcher: ResponseUrlCatcher
    sender: SlackEventSender
    sessions: sessionmaker[Session]

    def research(self, question: str, *, channel: str, user: str = ASKER, channel_name: str = "research") -> Run:
        """`/research question`, then the run finished with a report, as a worker would."""
        before = len(self.runs())
        assert self.sender.send(self.sender.command("/research", question, user=user, channel=channel,
                                                    channel_name=channel_name)).status_code == 200
        run = wait_for(lambda: len(runs := self.runs()) > before and runs[-1].status_message and runs[-1], "run")
        finish_run(self.sessions, run.id, report=one_source_report(question))
        return run

    def runs(self) -> list[Run]:
        return all_runs(self.sessions)

    def history(self, *, channel: str, user: str = ASKER, channel_name: str = "research") -> CaughtResponse:
        """`/research history` and the private answer Slack receives at the command's response_url."""
        before = len(self.catcher.responses())
        assert self.sender.send(self.sender.command("/research", "history", user=user, channel=channel,
                                                    channel_name=channel_name)).status_code == 200
        return wait_for(lambda: (caught := self.catcher.responses()[before:]) and caught[0], "history answer")

    def reply_in_thread(self, run: Run, text: str, channel: str) -> None:
        event = self.sender.message(text, user=ASKER, channel=channel, thread_ts=run.status_message["thread"])
        assert self.sender.send(self.sender.event(event)).status_code == 200


@pytest.fixture
def world(tmp_path: Path) -> Iterator[SlackHistoryWorld]:
    with migrated_sqlite(tmp_path) as (database_url, sessions), FakeSlack() as slack, ResponseUrlCatcher() as catcher:
        slack.add_private_channel(SECRET_CHANNEL)
        settings = load_settings(slack_bot_token=slack.token, slack_signing_secret=SECRET, slack_api_url=slack.api_url,
                                 database_url=database_url)
        client = build_slack_client(slack.token, slack.api_url)
        # No worker: submitted runs are only recorded, and the test finishes them.
        core = build_core(settings, SlackMessenger(client), SlackRenderer(), sessions=sessions,
                          queue=queue_without_workers(sessions))
        app = build_slack_app(settings, core, client=client, dedupe=MemoryEventDeduper())
        with LoopbackServer(build_http_app(app)) as server:
            sender = SlackEventSender(f"{server.url}/slack/events", SECRET, response_url=catcher.url)
            yield SlackHistoryWorld(slack, catcher, sender, sessions)
            sender.close()


def test_history_is_private_links_each_thread_and_never_shows_a_private_channels_run_elsewhere(
        world: SlackHistoryWorld) -> None:
    public = world.research("How do tides work?", channel=PUBLIC)
    # A private channel with a C id and its real name: only conversations.info tells that it is private.
    world.research("What is our secret launch date?", channel=SECRET_CHANNEL, channel_name="launch-team")
    world.research("Why is the sea salty?", channel=PUBLIC, user=OTHER)

    elsewhere = world.history(channel=ELSEWHERE)
    assert elsewhere.payload["response_type"] == "ephemeral"
    text = elsewhere.payload["text"]
    thread = public.status_message["thread"]
    assert f"<https://app.slack.com/client/T0FAKE/{PUBLIC}/thread/{PUBLIC}-{thread}|How do tides work?>" in text
    assert "done" in text and re.search(r"<!date\^\d+\^", text)
    assert "secret launch" not in text, "a private channel's run is listed only there"
    assert "salty" not in text, "another person's run in another channel is not listed"

    in_public = world.history(channel=PUBLIC).payload["text"]
    assert "How do tides work?" in in_public and "Why is the sea salty?" in in_public
    assert "secret launch" not in in_public

    other_in_public = world.history(channel=PUBLIC, user=OTHER).payload["text"]
    assert "How do tides work?" in other_in_public and "secret launch" not in other_in_public

    inside = world.history(channel=SECRET_CHANNEL, channel_name="launch-team").payload["text"]
    assert "What is our secret launch date?" in inside and "How do tides work?" in inside

    nothing_posted = [call for call in world.slack.calls("chat.postMessage") if "history" in str(call.params)]
    assert nothing_posted == [] and len(world.runs()) == 3, "history starts nothing and posts nothing in public"


def test_a_direct_messages_runs_are_listed_only_in_that_direct_message(world: SlackHistoryWorld) -> None:
    world.research("A question asked in private", channel="D0ASKER", channel_name="directmessage")
    assert "asked in private" not in world.history(channel=PUBLIC).payload["text"]
    assert "asked in private" in world.history(channel="D0ASKER", channel_name="directmessage").payload["text"]


def test_export_in_a_reports_thread_uploads_html_json_and_markdown_files(world: SlackHistoryWorld) -> None:
    run = world.research("How do tides work?", channel=PUBLIC)
    thread = run.status_message["thread"]
    for output_format in ("html", "json", "md"):
        world.reply_in_thread(run, f"export {output_format}", PUBLIC)
        wait_for(lambda: any(file.filename.endswith(f".{output_format}") for file in world.slack.files(PUBLIC)),
                 f"{output_format} upload")
    files = {file.filename: file for file in world.slack.files(PUBLIC)}
    assert set(files) == {f"deepthread-report-{run.id}.{suffix}" for suffix in ("html", "json", "md")}
    assert {file.thread_ts for file in files.values()} == {thread}, "each file in the report's thread"
    assert files[f"deepthread-report-{run.id}.html"].data.decode().startswith("<!DOCTYPE html>")
    exported = json.loads(files[f"deepthread-report-{run.id}.json"].data)
    assert exported["run_id"] == run.id and exported["question"] == "How do tides work?"
    assert "What we found about How do tides work?" in files[f"deepthread-report-{run.id}.md"].data.decode()
