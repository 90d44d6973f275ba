"""The Discord bot end to end: the real discord.py client (gateway and REST) and the real conversation core in
this process, a real worker process delivering through the REST messenger, the fake Discord on 127.0.0.1, real
Redis, and the fake LLM, search provider and web corpus. Every Discord URL comes from DISCORD_API_URL."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from bot.discord.feedback import COMMENT_INPUT_ID
from chat.discord.render import CANCEL_ID, CONTENT_LIMIT, paragraph_to_discord
from research.markdown import markdown_paragraphs
from storage.models import Feedback, Run
from tests.fakes.corpus import QUESTION, Corpus
from tests.fakes.discord_api import DiscordCall, DiscordMessage, FakeDiscord, FakeUser
from tests.fakes.llm import ChatRequest, citing_synthesis, default_research_model
from tests.integration.discord_harness import BotThread, discord_urls_nowhere
from tests.integration.workers import Cluster
from tests.run_rows import all_runs

pytestmark = pytest.mark.integration

LINK = re.compile(r"\]\((https?://[^)\s]+)\)")
FINISHED = {"done", "failed", "cancelled", "timed_out"}


def links_in(text: str) -> set[str]:
    return set(LINK.findall(text))


@dataclass
class DiscordWorld:
    cluster: Cluster
    fake: FakeDiscord
    corpus: Corpus
    asker: FakeUser
    other: FakeUser
    bot: BotThread

    def start_bot(self) -> None:
        self.bot = BotThread(self.cluster.settings).start()
        self.cluster.wait_for(self.bot.ready_or_failed, 20, "the bot's READY")
        assert self.bot.error is None, self.bot.error

    def restart_bot(self) -> None:
        """Stop the bot and start a new one, as `deepthread discord` restarted: nothing it held in memory survives."""
        self.bot.stop()
        self.start_bot()

    def runs(self) -> list[Run]:
        return all_runs(self.cluster.sessions)

    def wait_for_runs(self, count: int, timeout: float = 30) -> list[Run]:
        return self.wait(lambda: len(runs := self.runs()) >= count and runs, timeout, f"{count} runs")

    def finished(self, run: Run, timeout: float = 60) -> Run:
        return self.cluster.wait_for_state(run.id, FINISHED, timeout)

    def command(self, name: str, question: str, user: FakeUser | None = None, **options: str) -> int:
        return self.fake.send_command(user or self.asker, self.fake.channel_id, name, {"question": question, **options})

    def running_research(self) -> tuple[Run, int, int]:
        """Start `/research` and wait until it runs: the run, and its status message's channel and id."""
        self.command("research", QUESTION)
        run = self.cluster.wait_for_state(self.wait_for_runs(1)[0].id, {"running"}, 30)
        return run, int(run.status_message["channel"]), int(run.status_message["message_id"])

    def thread_of(self, run: Run) -> int:
        return int(run.status_message["thread"])

    def thread_messages(self, run: Run) -> list[DiscordMessage]:
        return self.fake.messages(self.thread_of(run))

    def report_messages(self, run: Run, marker: str = "here is your report") -> list[DiscordMessage]:
        """The messages of the report that starts with `marker`, in order (the thread holds others too)."""
        messages = [message for message in self.thread_messages(run) if message.author.id == self.fake.bot.id]
        starts = [index for index, message in enumerate(messages) if marker in message.content]
        if not starts:
            return []
        following = messages[starts[-1]:]
        ends = [index for index, message in enumerate(following) if message.components]
        return following[:ends[0] + 1] if ends else following

    def wait(self, predicate: Callable[[], Any], timeout: float, what: str) -> Any:
        try:
            return self.cluster.wait_for(predicate, timeout, what)
        except AssertionError as error:
            calls = "\n".join(f"{call.method} {call.path} → {call.status}" for call in self.fake.calls())
            raise AssertionError(f"{error}\n--- Discord calls\n{calls}") from None


def discord_world(tmp_path: Path, redis_url: str, corpus: Corpus, *, message_content: bool = True,
                  sync_globally: bool = False, rate_limit: tuple[int, float] = (50, 1.0)) -> Iterator[DiscordWorld]:
    from storage.redis import connect

    connect(redis_url).flushall()
    with discord_urls_nowhere(), FakeDiscord(message_content_intent_enabled=message_content,
                                             rate_limit=rate_limit) as fake:
        cluster = Cluster(database_url=f"sqlite:///{tmp_path}/deepthread.db", redis_url=redis_url, corpus=corpus,
                          workdir=tmp_path, discord_bot_token=fake.token, discord_api_url=fake.api_url,
                          discord_guild_ids=str(fake.guild_id))
        asker, other = fake.new_user("asker"), fake.new_user("other")
        for user in (asker, other):
            fake.add_member(user)
        cluster.start_worker("w1")
        bot = BotThread(cluster.settings, sync_globally=sync_globally)
        world = DiscordWorld(cluster, fake, corpus, asker, other, bot)
        try:
            world.bot.start()
            cluster.wait_for(world.bot.ready_or_failed, 20, "the bot's READY")
            assert world.bot.error is None, world.bot.error
            yield world
        finally:
            world.bot.stop()
            cluster.stop()


@pytest.fixture
def world(tmp_path: Path, redis_url: str) -> Iterator[DiscordWorld]:
    with Corpus(llm_latency=0.3, page_latency=0.3) as corpus:
        yield from discord_world(tmp_path, redis_url, corpus)


def pinging_synthesis(role_id: int, other: Callable[[], int]) -> Callable[[ChatRequest], Any]:
    def handler(request: ChatRequest) -> Any:
        if request.schema_name is None and "untrusted_source" in request.text:
            return citing_synthesis(request) + (f"\n\nAttention @everyone and @here and <@&{role_id}> "
                                                f"and <@{other()}>.")
        return default_research_model(request)
    return handler


def test_research_command_end_to_end(tmp_path: Path, redis_url: str) -> None:
    """Deferred within 3 s; one status message in the channel edited through the phases (a 429 on an edit ridden
    out); a thread from it; the report there with working links, pinging the requester once and nobody else;
    then a follow-up in the thread answered from the stored passages without any search."""
    other_id: list[int] = []
    # Fakes slowed so each phase outlasts the status message's one-edit-a-second coalescing.
    with Corpus(llm_latency=1.2, search_latency=1.2, page_latency=1.2,
                llm_handler=pinging_synthesis(4242, lambda: other_id[0])) as corpus:
        for world in discord_world(tmp_path, redis_url, corpus):
            fake = world.fake
            other_id.append(world.other.id)
            fake.fail_next("PATCH", r"^/channels/\d+/messages/\d+$", status=429, retry_after=1.0)
            interaction = world.command("research", QUESTION)
            # The fake, like Discord, refuses a callback after its 3 s: a recorded response was in time.
            [deferral, *_] = fake.wait_for(lambda: fake.interaction_responses(interaction))
            assert deferral.type == 5 and deferral.ephemeral

            run = world.finished(world.wait_for_runs(1)[0])
            assert run.state == "done", run.error
            status_channel, status_id = int(run.status_message["channel"]), int(run.status_message["message_id"])
            thread = world.thread_of(run)
            assert status_channel == fake.channel_id and thread == status_id, "the thread starts from the status message"
            assert fake.channel(thread).parent_id == fake.channel_id
            pointer = fake.wait_for(lambda: [message for message in fake.followups(interaction)
                                             if f"<#{thread}>" in message.content])
            assert pointer[0].ephemeral

            report = world.wait(lambda: world.report_messages(run), 20, "the report in the thread")
            edits = world.wait(lambda: (edits := fake.edits(status_channel, status_id)) and
                               "✅ **Done**" in edits[-1].content and edits, 20, "the final status")
            phases = {match.group(1) for edit in edits if (match := re.search(r"⏳ \*\*([^*\n]+)\*\*", edit.content))}
            assert len(phases) >= 3, phases
            [limited] = [call for call in fake.calls("PATCH") if call.status == 429]
            retried = next(call for call in fake.calls("PATCH") if call.path == limited.path and call.at > limited.at)
            assert retried.status == 200 and retried.json == limited.json, "the same edit, sent again"
            assert retried.at - limited.at >= 1.0, "after the retry_after Discord asked for"
            assert len([message for message in world.thread_messages(run) if "here is your report" in message.content]) == 1

            text = "\n".join(message.content for message in report)
            assert "@everyone" in text, "the model's @everyone is shown"
            pinged = [(message.id, user.id) for channel in (fake.channel_id, thread)
                      for message in fake.messages(channel) for user in message.mentions]
            assert pinged == [(report[0].id, world.asker.id)], "only the report's first message pings, only the requester"
            assert not any(message.mention_everyone or message.mention_roles
                           for channel in (fake.channel_id, thread) for message in fake.messages(channel))
            for call in fake.message_calls():
                if "/callback" in call.path and not (call.json or {}).get("data", {}).get("content"):
                    continue  # a deferral says nothing
                assert call.allowed_mentions is not None and call.allowed_mentions.get("parse") == [], call.path
                assert set(call.allowed_mentions.get("users", [])) <= {str(world.asker.id)}, call.path

            links = links_in(text)
            assert links and all(world.corpus.page_for(url) for url in links)
            for url in links:
                host_and_port, path = url.split("//", 1)[1].split("/", 1)
                host, port = host_and_port.split(":")
                assert httpx.get(f"http://127.0.0.1:{port}/{path}", headers={"Host": host}).status_code == 200

            searches, pages = len(world.corpus.search.requests("brave")), len(world.corpus.web.requests)
            fake.user_message(world.asker, thread, "How much energy did the array deliver?")
            follow_up = world.finished(world.wait_for_runs(2)[1])
            assert follow_up.mode == "followup" and follow_up.state == "done", follow_up.error
            # The answer is streamed as the model writes it, then edited into its audited text with linked citations.
            answer = world.wait(lambda: (shown := world.report_messages(follow_up, "on “How much energy"))
                                and links_in("\n".join(message.content for message in shown)) and shown, 20,
                                "the audited answer")
            cited = links_in("\n".join(message.content for message in answer))
            assert cited and cited <= {source["url"] for source in run.report_json["sources"]}
            assert len(world.corpus.search.requests("brave")) == searches
            assert len(world.corpus.web.requests) == pages
            assert {sync.guild_id for sync in fake.synced_commands} == {fake.guild_id}, "no global sync unless asked"


def test_plan_then_go_runs_research_with_the_plan_s_sub_questions(world: DiscordWorld) -> None:
    world.command("plan", QUESTION)
    plan_run = world.finished(world.wait_for_runs(1)[0], 30)
    assert plan_run.state == "done", plan_run.error
    world.wait(lambda: world.report_messages(plan_run, "research plan"), 20, "the plan in the thread")
    key_questions = plan_run.report_json["plan"]["key_questions"]
    world.fake.user_message(world.asker, world.thread_of(plan_run), "go")
    research_run = world.finished(world.wait_for_runs(2)[1])
    assert research_run.mode == "research" and research_run.state == "done", research_run.error
    assert research_run.plan["key_questions"] == key_questions
    assert research_run.status_message["thread"] == plan_run.status_message["thread"], "the run lives in the plan's thread"
    requests = list(world.corpus.llm.chat_requests)
    assert not [request for request in requests if request.schema_name == "decomposition"]
    synthesis = [request for request in requests if request.schema_name is None and "untrusted_source" in request.text]
    for question in key_questions:
        assert f"- {question}" in synthesis[-1].text


def test_cancel_reaction_works_for_the_requester_only(tmp_path: Path, redis_url: str) -> None:
    with Corpus(page_latency=6.0) as corpus:
        for world in discord_world(tmp_path, redis_url, corpus):
            fake = world.fake
            run, channel, status_id = world.running_research()
            fake.add_reaction(world.other, channel, status_id, "❌")
            refusal = world.wait(lambda: [message for dm in [fake.create_dm(world.other)]
                                          for message in fake.messages(dm) if "Only the person" in message.content],
                                 10, "the private refusal")
            assert f"<@{world.asker.id}>" in refusal[0].content and not refusal[0].mentions
            assert world.cluster.run(run.id).state == "running"
            fake.add_reaction(world.asker, channel, status_id, "❌")
            stopped = world.cluster.wait_for_state(run.id, {"cancelled", "done", "failed"}, 10)
            assert stopped.state == "cancelled" and stopped.cancelled_by == f"discord:{world.asker.id}"
            world.wait(lambda: "🛑 **Stopped**" in fake.message(channel, status_id).content, 20, "the stopped status")


def test_the_stop_button_stops_the_run_for_the_requester(tmp_path: Path, redis_url: str) -> None:
    with Corpus(page_latency=6.0) as corpus:
        for world in discord_world(tmp_path, redis_url, corpus):
            fake = world.fake
            run, channel, status_id = world.running_research()
            click = fake.click_button(world.asker, channel, status_id, "deepthread:cancel")
            [answer, *_] = fake.wait_for(lambda: fake.interaction_responses(click))  # in time, or the fake refuses it
            assert answer.type == 6
            stopped = world.cluster.wait_for_state(run.id, {"cancelled", "done", "failed"}, 10)
            assert stopped.state == "cancelled" and stopped.cancelled_by == f"discord:{world.asker.id}"


LONG_REPORT_PARAGRAPHS = [f"Paragraph {index} says the Zorblax array is steady and predictable. " * 6
                          for index in range(55)]


def long_report(request: ChatRequest) -> Any:
    """A synthesis of more than 20,000 characters: more than ten Discord messages, fewer than the fifteen after which
    the renderer attaches a report as a file instead."""
    if request.schema_name is None and "untrusted_source" in request.text:
        return citing_synthesis(request) + "\n\n" + "\n\n".join(LONG_REPORT_PARAGRAPHS)
    return default_research_model(request)


def test_a_20000_character_report_arrives_complete_within_discord_s_limits(tmp_path: Path, redis_url: str) -> None:
    assert len("\n\n".join(LONG_REPORT_PARAGRAPHS)) >= 20_000
    with Corpus(llm_handler=long_report) as corpus:
        for world in discord_world(tmp_path, redis_url, corpus):
            world.command("research", QUESTION)
            run = world.finished(world.wait_for_runs(1)[0])
            assert run.state == "done", run.error
            report = world.wait(lambda: (messages := world.report_messages(run)) and messages[-1].components
                                and messages, 30, "the whole report")
            body = run.report_json["body_markdown"]
            assert len(body) >= 20_000 and len(report) > 10
            assert all(len(message.content) <= CONTENT_LIMIT for message in report)
            delivered = "\n\n".join(message.content for message in report)
            expected = "\n\n".join(paragraph_to_discord(paragraph) for paragraph in markdown_paragraphs(body))
            assert re.sub(r"\s+", "", expected) in re.sub(r"\s+", "", delivered), "the whole stored report, in order"
            assert not [call for call in world.fake.message_calls() if call.status == 400]


def test_without_the_message_content_intent_the_bot_connects_says_so_and_answers_mentions(
        tmp_path: Path, redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="bot.discord.app"), Corpus() as corpus:
        for world in discord_world(tmp_path, redis_url, corpus, message_content=False):
            fake = world.fake
            assert not fake.identify_payloads[-1]["intents"] & (1 << 15), "the intent is not asked for"
            assert caplog.text.count("Message Content Intent") == 1
            world.command("ask", "What is a tidal turbine?")
            first = world.finished(world.wait_for_runs(1)[0], 30)
            assert first.state == "done", first.error
            thread = world.thread_of(first)
            fake.user_message(world.asker, thread, "and how big are they?")  # its text never reaches the bot
            fake.user_message(world.asker, thread, f"<@{fake.bot.id}> and how big are they?", mentions=[fake.bot])
            second = world.finished(world.wait_for_runs(2)[1], 30)
            assert second.question == "and how big are they?" and second.state == "done", second.error
            assert len(world.runs()) == 2, "the reply without a mention (its text withheld) started nothing"


def test_commands_sync_globally_only_when_asked(tmp_path: Path, redis_url: str) -> None:
    with Corpus() as corpus:
        for world in discord_world(tmp_path, redis_url, corpus, sync_globally=True):
            scopes = {sync.guild_id for sync in world.fake.synced_commands}
            assert scopes == {world.fake.guild_id, None}
            assert {command["name"] for command in world.fake.commands()} == {"research", "plan", "ask", "history", "watches"}


def test_in_a_direct_message_the_conversation_is_the_dm_itself(tmp_path: Path, redis_url: str) -> None:
    with Corpus() as corpus:
        for world in discord_world(tmp_path, redis_url, corpus):
            fake = world.fake
            dm = fake.create_dm(world.asker)
            fake.send_command(world.asker, dm, "ask", {"question": "What is a tidal turbine?"})
            first = world.finished(world.wait_for_runs(1)[0], 30)
            assert first.state == "done", first.error
            assert first.status_message["channel"] == first.status_message["thread"] == str(dm)
            assert not fake.threads(), "no thread is started in a direct message"
            world.wait(lambda: [message for message in fake.messages(dm) if "on “What is a tidal turbine?”" in message.content],
                       20, "the answer in the DM")
            fake.user_message(world.asker, dm, "and how big are they?")
            second = world.finished(world.wait_for_runs(2)[1], 30)
            assert second.state == "done" and second.status_message["thread"] == str(dm), second.error


def has_stop_button(call: DiscordCall) -> bool:
    return any(button.get("custom_id") == CANCEL_ID for row in (call.json or {}).get("components") or []
               for button in row["components"])


def test_a_long_report_s_status_reads_done_only_after_its_last_part_is_posted(tmp_path: Path, redis_url: str) -> None:
    """Discord's per-channel rate limit (five messages a window, here a window of 1 s rather than 5 s) paces the
    report's parts; the status message keeps its Stop button and does not read done until the last one is posted."""
    with Corpus(llm_handler=long_report) as corpus:
        for world in discord_world(tmp_path, redis_url, corpus, rate_limit=(5, 1.0)):
            fake = world.fake
            world.command("research", QUESTION)
            run = world.finished(world.wait_for_runs(1)[0])
            assert run.state == "done", run.error
            report = world.wait(lambda: (messages := world.report_messages(run)) and messages[-1].components
                                and messages, 30, "the whole report")
            status_path = f"/channels/{run.status_message['channel']}/messages/{run.status_message['message_id']}"
            world.wait(lambda: "✅ **Done**" in fake.message(int(run.status_message["channel"]),
                                                           int(run.status_message["message_id"])).content,
                       30, "the final status")

            calls = fake.calls()
            contents = {message.content for message in report}
            parts = [index for index, call in enumerate(calls) if call.method == "POST" and call.status == 200
                     and call.path == f"/channels/{world.thread_of(run)}/messages" and call.json["content"] in contents]
            assert len(parts) == len(report) > 10
            paced = [calls[index] for index in parts if calls[index].answer_headers.get("X-RateLimit-Remaining") == "0"]
            assert paced, "the report's parts went out at the pace Discord's per-channel limit allows"
            edits = [(index, call) for index, call in enumerate(calls)
                     if call.method == "PATCH" and call.path == status_path and call.status == 200]
            done = [index for index, call in edits if "✅ **Done**" in call.json["content"]]
            assert done and done[0] > parts[-1], "the status reads done only after the report's last part is posted"
            assert all(has_stop_button(call) for index, call in edits if index < parts[-1]), \
                "the Stop button stays until the report is all there"


def feedback_rows(world: DiscordWorld) -> list[tuple[str, int, str | None]]:
    with world.cluster.sessions() as session:
        return sorted((row.user, row.value, row.comment) for row in session.scalars(select(Feedback)))


def deepthread_runs(world: DiscordWorld) -> str:
    """What `deepthread runs` prints, run as a person runs it, on the world's database."""
    listed = subprocess.run([sys.executable, "-m", "bot.cli", "runs"], env=world.cluster.environment,
                            cwd=world.cluster.workdir, capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    return listed.stdout


WHAT_WAS_WRONG = "The capacity figure is the 2019 one, not this year's."


def test_thumbs_up_and_down_on_a_report_are_stored_across_a_restart_and_counted_by_deepthread_runs(
        world: DiscordWorld) -> None:
    """👍/👎 under the report's last message; a 👎 opens the "what was wrong?" modal, which is submitted after the
    bot restarted, and a 👍 clicked after the restart on a message posted before it is heard too."""
    fake = world.fake
    world.command("research", QUESTION)
    run = world.finished(world.wait_for_runs(1)[0])
    assert run.state == "done", run.error
    last = world.wait(lambda: world.report_messages(run), 20, "the report")[-1]
    buttons = {button["label"]: button["custom_id"] for row in last.components for button in row["components"]}
    assert {"👍", "👎"} <= set(buttons)
    thread = world.thread_of(run)

    down = fake.click_button(world.other, thread, last.id, buttons["👎"])
    [opened] = fake.wait_for(lambda: fake.interaction_responses(down))  # in time, or the fake refuses it
    modal = fake.modal(down)
    assert opened.type == 9 and modal is not None and modal["title"] == "What was wrong?"
    world.wait(lambda: feedback_rows(world), 10, "the 👎 stored")
    assert feedback_rows(world) == [(f"discord:{world.other.id}", -1, None)]

    world.restart_bot()
    submitted = fake.submit_modal(world.other, down, {COMMENT_INPUT_ID: WHAT_WAS_WRONG})
    [acknowledged] = fake.wait_for(lambda: fake.interaction_responses(submitted))
    assert acknowledged.ephemeral
    world.wait(lambda: any(comment for _, _, comment in feedback_rows(world)), 10, "the comment stored")
    up = fake.click_button(world.asker, thread, last.id, buttons["👍"])
    thanks = world.wait(lambda: [message for message in fake.followups(up) if "Thanks" in message.content], 10,
                        "the private thanks for the 👍")
    assert thanks[0].ephemeral

    assert feedback_rows(world) == sorted([(f"discord:{world.asker.id}", 1, None),
                                           (f"discord:{world.other.id}", -1, WHAT_WAS_WRONG)])
    [line] = [line for line in deepthread_runs(world).splitlines() if line.split()[:1] == [str(run.id)]]
    assert "👍 1 👎 1" in line
