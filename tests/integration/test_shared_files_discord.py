"""Files shared on Discord are sources, end to end: the real discord.py client (gateway and REST) and the conversation
core on their own loop, a real worker process downloading from the fake Discord's CDN (DISCORD_FILE_HOSTS), real
Redis, and the fake LLM, search provider and web."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from storage.models import Run
from tests.fakes.corpus import QUESTION, Corpus
from tests.fakes.discord_api import DiscordMessage, FakeDiscord, FakeUser
from tests.fakes.shared_files import proposal_docx, survey_pdf
from tests.integration.discord_harness import BotThread, cluster_settings, discord_urls_nowhere
from tests.integration.workers import Cluster
from tests.run_rows import all_runs

pytestmark = pytest.mark.integration

FINISHED = {"done", "failed", "cancelled", "timed_out"}
SURVEY = survey_pdf()
PROPOSAL = proposal_docx()
DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"


@dataclass
class FilesWorld:
    cluster: Cluster
    fake: FakeDiscord
    corpus: Corpus
    asker: FakeUser

    def runs(self) -> list[Run]:
        return all_runs(self.cluster.sessions)

    def finished(self, count: int) -> Run:
        """The `count`th run, once it has finished."""
        run = self.cluster.wait_for(lambda: len(runs := self.runs()) >= count and runs, 30, f"{count} runs")[count - 1]
        return self.cluster.wait_for_state(run.id, FINISHED, 90)

    def command(self, name: str, question: str, **options: Any) -> int:
        return self.fake.send_command(self.asker, self.fake.channel_id, name, {"question": question, **options})

    def thread_of(self, run: Run) -> int:
        return int(run.status_message["thread"])

    def bot_messages(self, thread: int, containing: str) -> list[DiscordMessage]:
        return [message for message in self.fake.messages(thread)
                if message.author.id == self.fake.bot.id and containing in message.content]

    def report_text(self, run: Run) -> str:
        """The run's report posted in its thread, from its greeting to the message with the 👍/👎 buttons, as a reader
        sees it."""
        greeting = f"here is your report on “{run.question[:30]}"

        def report() -> list[str]:
            messages = [message for message in self.fake.messages(self.thread_of(run))
                        if message.author.id == self.fake.bot.id]
            starts = [index for index, message in enumerate(messages) if greeting in as_shown(message.content)]
            ends = [index for index in range(starts[-1], len(messages)) if messages[index].components] if starts else []
            return [as_shown(message.content) for message in messages[starts[-1]:ends[0] + 1]] if ends else []
        return "\n".join(self.cluster.wait_for(report, 30, f"the report of run {run.id} in the thread"))


def as_shown(content: str) -> str:
    """A message's text as Discord shows it: a backslash-escaped character as itself."""
    return re.sub(r"\\(.)", r"\1", content)


@pytest.fixture
def world(tmp_path: Path, redis_url: str) -> Iterator[FilesWorld]:
    from storage.redis import connect

    connect(redis_url).flushall()
    with (Corpus(llm_latency=0.3, page_latency=0.3) as corpus, discord_urls_nowhere(),
          FakeDiscord(message_content_intent_enabled=True) as fake):
        cluster = Cluster(database_url=f"sqlite:///{tmp_path}/deepthread.db", redis_url=redis_url, corpus=corpus,
                          workdir=tmp_path, **cluster_settings(fake))
        asker = fake.new_user("asker")
        fake.add_member(asker)
        cluster.start_worker("w1")
        bot = BotThread(cluster.settings).start()
        try:
            cluster.wait_for(bot.ready_or_failed, 20, "the bot's READY")
            assert bot.error is None, bot.error
            yield FilesWorld(cluster, fake, corpus, asker)
        finally:
            bot.stop()
            cluster.stop()


def cited_files(run: Run) -> dict[str, dict[str, Any]]:
    return {source["file"]["name"]: source for source in run.report_json["sources"] if source.get("file")}


def test_research_with_a_pdf_in_its_file_option_cites_the_file_and_the_web(world: FilesWorld) -> None:
    survey = world.fake.add_attachment("survey.pdf", SURVEY, content_type="application/pdf")
    world.command("research", f"{QUESTION} How many turbines does the survey count?", file=survey)
    run = world.finished(1)
    assert run.mode == "research"
    assert run.state == "done", run.error

    files = cited_files(run)
    assert set(files) == {"survey.pdf"}
    cited = files["survey.pdf"]
    assert cited["file"]["kind"] == "pdf" and cited["file"]["size"] == len(SURVEY) and cited["file"]["sha256"]
    assert 2 in cited["pages"], "the page that says it"
    assert cited["url"] == survey["url"], "a command's file has no message: its link is the attachment's"
    assert [source for source in run.report_json["sources"] if not source.get("file")], "web sources beside the file"
    assert cited["source_id"] in {passage["source_id"] for passage in run.report_json["cited_passages"]}
    audit = run.report_json["audit"]
    assert audit["citations_checked"] == audit["citations_supported"] >= len(run.report_json["sources"])

    assert "survey.pdf (PDF, p" in world.report_text(run)
    downloads = [request for request in world.fake.cdn_requests.all() if request.path.endswith("/survey.pdf")]
    assert downloads, "the worker downloaded the attachment from Discord's CDN"
    assert all("authorization" not in request.headers for request in downloads), "with no token"


def test_a_reply_that_only_attaches_a_docx_is_acknowledged_and_files_only_searches_nothing(world: FilesWorld) -> None:
    world.command("research", QUESTION)
    first = world.finished(1)
    assert first.state == "done", first.error
    world.report_text(first)
    thread = world.thread_of(first)

    proposal = world.fake.add_attachment("proposal.docx", PROPOSAL, content_type=DOCX, channel_id=thread)
    shared = world.fake.user_message(world.asker, thread, "", attachments=[proposal])
    acknowledged = world.cluster.wait_for(
        lambda: world.bot_messages(thread, "I'll use proposal.docx in this thread"), 20, "the acknowledgement")
    assert len(acknowledged) == 1
    assert len(world.runs()) == 1, "a reply that only shares a file starts no run"

    searches = len(world.corpus.search.requests("brave"))
    world.fake.user_message(world.asker, thread, "files only: how many turbines does the vendor offer?")
    second = world.finished(2)
    assert second.state == "done", second.error
    assert second.mode == "research" and second.options.files_only
    assert world.thread_of(second) == thread
    assert len(world.corpus.search.requests("brave")) == searches, "files only calls no search provider"
    [cited] = second.report_json["sources"]
    assert cited["file"]["name"] == "proposal.docx"
    assert cited["url"] == f"https://discord.com/channels/{world.fake.guild_id}/{thread}/{shared}", \
        "linked to the message that shared it"
    assert "12 Zorblax turbines" in (second.report_markdown or "")
    assert "proposal.docx (Word document" in world.report_text(second)


def test_ask_with_a_file_researches_the_file_only(world: FilesWorld) -> None:
    proposal = world.fake.add_attachment("proposal.docx", PROPOSAL, content_type=DOCX)
    world.command("ask", "How many turbines does the vendor offer?", file=proposal)
    run = world.finished(1)
    assert run.state == "done", run.error
    assert run.mode == "research" and run.options.files_only
    assert world.corpus.search.requests("brave") == [], "no search provider is called"
    assert list(cited_files(run)) == ["proposal.docx"] == [source["file"]["name"]
                                                           for source in run.report_json["sources"]]
    assert "proposal.docx (Word document" in world.report_text(run)
