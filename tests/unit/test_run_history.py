"""Run history and in-thread exports in the conversation core: who sees which runs where, and each export format."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from typing import Any

import fakeredis
import pytest
from sqlalchemy.orm import Session, sessionmaker

from bot.conversation.commands import export_format, is_history
from bot.conversation.core import ConversationCore, CoreSettings
from bot.conversation.events import ChatEvent, Outcome
from bot.conversation.history import run_history
from chat.discord.render import CONTENT_LIMIT, DiscordRenderer, jump_url
from chat.history import RunHistory, RunSummary
from chat.message import Place
from chat.slack.render import SlackRenderer, thread_link
from research.report import Report, ReportSource
from storage.models import Conversation, Run
from tests.fakes.messenger import RecordingMessenger
from worker.queue import Limits, Queue

ALICE, BOB = "slack:U0ALICE01", "slack:U0BOB0001"
PUBLIC, OTHER_PUBLIC, SECRET = "C0PUBLIC", "C0ELSEWHERE", "C0SECRET"


class World:
    """The core over SQLite and fakeredis; runs are finished by hand, as a worker would."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.sessions = sessions
        self.messenger = RecordingMessenger()
        queue = Queue(sessions, fakeredis.FakeRedis(), Limits(per_user=10, per_workspace=10), lambda *sent: None)
        self.core = ConversationCore(sessions=sessions, queue=queue, messenger=self.messenger,
                                     renderer=SlackRenderer(), settings=CoreSettings())

    def handle(self, **fields: Any) -> Outcome:
        defaults = {"platform": "slack", "workspace": "T1", "channel": PUBLIC, "user": ALICE}
        return asyncio.run(self.core.handle(ChatEvent(**{**defaults, **fields})))

    def research(self, question: str, *, channel: str = PUBLIC, user: str = ALICE,
                 visibility: str | None = "public", workspace: str = "T1") -> int:
        outcome = self.handle(kind="command", command="research", text=question, channel=channel, user=user,
                              channel_visibility=visibility, workspace=workspace)
        assert outcome.run_id is not None, outcome
        with self.sessions.begin() as session:
            run = session.get(Run, outcome.run_id)
            run.state = "done"
            run.report_json = Report(title=f"On {question}", question=question, body_markdown=f"About {question} [1].",
                                     sources=[ReportSource(number=1, source_id="s1", url="https://example.org/a", title="A")]
                                     ).model_dump(mode="json")
        return outcome.run_id

    def history(self, *, channel: str, user: str = ALICE, workspace: str = "T1") -> RunHistory:
        return run_history(self.sessions, platform="slack", workspace=workspace, channel=channel, user=user)

    def thread_of(self, run_id: int) -> str:
        with self.sessions() as session:
            return session.get(Conversation, session.get(Run, run_id).conversation_id).thread


@pytest.fixture
def world(session_factory: sessionmaker[Session]) -> World:
    return World(session_factory)


def questions(runs: list[RunSummary]) -> list[str]:
    return [run.question for run in runs]


# -- who sees what where -----------------------------------------------------------------------------

def test_history_lists_the_callers_runs_and_the_channels_others_newest_first(world: World) -> None:
    first = world.research("first question")
    world.research("bob's question", user=BOB)
    world.research("second question", channel=OTHER_PUBLIC)
    history = world.history(channel=PUBLIC)
    assert questions(history.yours) == ["second question", "first question"]
    assert questions(history.channel) == ["bob's question"]
    assert history.yours[1].thread == Place(platform="slack", workspace="T1", channel=PUBLIC, thread=world.thread_of(first))
    assert history.yours[1].state == "done" and history.yours[1].created_at.tzinfo is not None


def test_a_private_channels_run_is_listed_only_in_that_channel(world: World) -> None:
    world.research("public question")
    world.research("secret question", channel=SECRET, visibility="private")
    world.research("bob's secret", channel=SECRET, user=BOB, visibility="private")
    elsewhere = world.history(channel=OTHER_PUBLIC)
    assert questions(elsewhere.yours) == ["public question"] and elsewhere.channel == []
    in_public = world.history(channel=PUBLIC, user=BOB)
    assert questions(in_public.yours) == [] and questions(in_public.channel) == ["public question"]
    inside = world.history(channel=SECRET)
    assert questions(inside.yours) == ["secret question", "public question"]
    assert questions(inside.channel) == ["bob's secret"]


def test_a_run_whose_channel_visibility_is_unknown_is_taken_as_private(world: World) -> None:
    world.research("unknown channel question", channel="C0UNKNOWN", visibility=None)
    assert world.history(channel=OTHER_PUBLIC).yours == []
    assert questions(world.history(channel="C0UNKNOWN").yours) == ["unknown channel question"]


def test_a_channel_made_private_stops_listing_its_earlier_runs_elsewhere(world: World) -> None:
    world.research("asked while it was public", channel=SECRET, visibility="public")
    assert questions(world.history(channel=OTHER_PUBLIC).yours) == ["asked while it was public"]
    world.research("asked once it was private", channel=SECRET, visibility="private")
    assert world.history(channel=OTHER_PUBLIC).yours == []


def test_runs_of_another_workspace_are_never_listed(world: World) -> None:
    world.research("asked in another workspace", workspace="T2")
    assert world.history(channel=PUBLIC).yours == []


def test_history_reply_is_private_and_rendered_for_the_platform(world: World) -> None:
    world.research("Is <!channel> & the tide *high*?")
    outcome = world.handle(kind="command", command="research", text="history")
    [reply] = outcome.replies
    assert reply.private and reply.content is not None and outcome.run_id is None
    assert "&lt;!channel&gt; &amp;" in reply.content.text and "<!channel>" not in reply.content.text
    assert "https://app.slack.com/client/T1/C0PUBLIC/thread/C0PUBLIC-" in reply.content.text


def test_history_said_in_a_direct_message_or_a_thread_we_own_lists_runs_instead_of_starting_one(world: World) -> None:
    run_id = world.research("a question")
    in_thread = world.handle(kind="message", text="history", thread=world.thread_of(run_id))
    direct = world.handle(kind="direct", text="History", channel="D0ALICE", channel_visibility="private")
    for outcome in (in_thread, direct):
        assert outcome.run_id is None and outcome.replies[0].content is not None
        assert "a question" in outcome.replies[0].content.text


# -- exports in a thread -----------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "expected"), [("export html", "html"), ("Export JSON", "json"), ("export md", "md"),
                                                ("export", "md"), ("export as markdown", "md"), ("export html.", "html")])
def test_export_words_name_their_format(text: str, expected: str) -> None:
    assert export_format(text) == expected


@pytest.mark.parametrize("text", ["export controls on turbines", "export pdf", "please export html", "exports"])
def test_other_sentences_with_export_are_not_exports(text: str) -> None:
    assert export_format(text) is None


def test_history_is_the_word_alone() -> None:
    assert is_history("history") and is_history(" History? ")
    assert not is_history("history of tidal power")


def test_export_in_a_reports_thread_uploads_the_report_in_each_format(world: World) -> None:
    run_id = world.research("Why is the sea salty?")
    thread = world.thread_of(run_id)
    for text in ("export html", "export json", "export md"):
        outcome = world.handle(kind="message", text=text, thread=thread)
        assert outcome.run_id is None and outcome.replies == []
    uploads = {upload.filename: (place, upload.data.decode()) for place, upload in world.messenger.uploads}
    assert set(uploads) == {f"deepthread-report-{run_id}.{suffix}" for suffix in ("html", "json", "md")}
    assert {place.thread for place, _ in uploads.values()} == {thread}
    assert uploads[f"deepthread-report-{run_id}.html"][1].startswith("<!DOCTYPE html>")
    assert json.loads(uploads[f"deepthread-report-{run_id}.json"][1])["run_id"] == run_id
    assert "About Why is the sea salty?" in uploads[f"deepthread-report-{run_id}.md"][1]


def test_export_in_a_thread_without_a_report_says_so_privately(world: World) -> None:
    outcome = world.handle(kind="command", command="ask", text="What is a tidal turbine?")
    outcome = world.handle(kind="message", text="export html", thread=outcome.thread)
    assert outcome.replies[0].private and "no report" in outcome.replies[0].text
    assert world.messenger.uploads == []


# -- rendering ----------------------------------------------------------------------------------------

def summary(run_id: int, question: str, *, workspace: str = "1234", thread: str = "5678") -> RunSummary:
    return RunSummary(run_id=run_id, mode="research", state="done", question=question, requested_by="discord:1",
                      created_at=dt.datetime(2026, 1, 2, 3, 4, tzinfo=dt.timezone.utc),
                      thread=Place(platform="discord", workspace=workspace, channel="42", thread=thread))


def test_discord_history_links_each_thread_escapes_questions_and_fits_one_message() -> None:
    long_question = "Why **is** [the](https://evil.example) sea salty @everyone " + "and why " * 20
    history = RunHistory(yours=[summary(index, long_question) for index in range(10)],
                         channel=[summary(100 + index, long_question) for index in range(10)])
    text = DiscordRenderer().history(history).text
    assert len(text) <= CONTENT_LIMIT and text.rstrip().endswith("more.")
    assert f"]({jump_url(history.yours[0].thread)})" in text and "<t:1767323040:f>" in text
    assert "[the](https://evil.example)" not in text and "\\*\\*is\\*\\*" in text


def test_discord_jump_url_of_a_direct_message_is_the_dm_itself() -> None:
    assert jump_url(Place(platform="discord", workspace="@me", channel="77", thread="77")) == \
        "https://discord.com/channels/@me/77"


def test_slack_thread_link_is_built_from_workspace_channel_and_thread_ts() -> None:
    place = Place(platform="slack", workspace="T1", channel="C2", thread="1700000001.000001")
    assert thread_link(place) == "https://app.slack.com/client/T1/C2/thread/C2-1700000001.000001"
