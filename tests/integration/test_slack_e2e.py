"""The Slack app end to end: the real bolt app in HTTP mode on 127.0.0.1 with the real conversation core,
requests signed as Slack signs them, the fake Slack Web API, a real worker process, real Redis, and the
fake LLM, search provider and web corpus."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import pytest

from tests.fakes.corpus import QUESTION, Corpus
from tests.fakes.llm import ChatRequest, citing_synthesis, default_research_model
from tests.fakes.slack_events import sign_slack_request
from tests.integration.slack_harness import ASKER, CHANNEL, OTHER, SlackWorld, slack_world

pytestmark = pytest.mark.integration

LINK = re.compile(r"<(https?://[^|>]+)\|[^>]*>|\]\((https?://[^)\s]+)\)")


def links_in(text: str) -> set[str]:
    """URLs linked in Slack mrkdwn (`<url|text>`) or in a markdown block (`[text](url)`)."""
    return {mrkdwn or markdown for mrkdwn, markdown in LINK.findall(text)}


# Fakes slowed so each phase outlasts the status message's one-edit-a-second coalescing.
@pytest.mark.world(corpus={"llm_latency": 1.2, "search_latency": 1.2, "page_latency": 1.2})
def test_research_command_end_to_end(world: SlackWorld) -> None:
    response = world.command("/research", QUESTION)  # how fast it is acknowledged is bench/ack.py's measure
    assert response.status_code == 200
    run = world.wait_for_runs(1)[0]
    run = world.cluster.wait_for_state(run.id, {"done", "failed", "cancelled", "timed_out"}, 60)
    assert run.state == "done", run.error
    reports = world.cluster.wait_for(lambda: world.report_messages(run), 20, "the report in the thread")
    assert len(reports) == 1 and f"<@{ASKER}>" in reports[0].visible_text
    updates = world.slack.calls("chat.update")
    assert {call.params["ts"] for call in updates} == {run.status_message["message_id"]}
    phases = {match.group(1) for call in updates if (match := re.search(r"⏳ ([^\n]+)", call.params.get("text", "")))}
    assert len(phases) >= 3, phases
    links = links_in(reports[0].visible_text)
    assert links and all(world.corpus.page_for(url) for url in links)
    for url in links:
        host_and_port, path = url.split("//", 1)[1].split("/", 1)
        host, port = host_and_port.split(":")
        assert httpx.get(f"http://127.0.0.1:{port}/{path}", headers={"Host": host}).status_code == 200


def test_plan_then_go_runs_research_with_the_plan_s_sub_questions(world: SlackWorld) -> None:
    world.command("/plan", QUESTION)
    plan_run = world.cluster.wait_for_state(world.wait_for_runs(1)[0].id, {"done", "failed"}, 30)
    assert plan_run.state == "done", plan_run.error
    world.cluster.wait_for(lambda: world.report_messages(plan_run, "research plan"), 20, "the plan in the thread")
    key_questions = plan_run.report_json["plan"]["key_questions"]
    world.reply(plan_run, "go")
    research_run = world.wait_for_runs(2)[1]
    research_run = world.cluster.wait_for_state(research_run.id, {"done", "failed"}, 60)
    assert research_run.mode == "research" and research_run.state == "done"
    assert research_run.plan["key_questions"] == key_questions
    requests = [request for request in world.corpus.llm.chat_requests]
    assert not [request for request in requests if request.schema_name == "decomposition"]
    synthesis = [request for request in requests if request.schema_name is None and "untrusted_source" in request.text]
    for question in key_questions:
        assert f"- {question}" in synthesis[-1].text


def test_a_follow_up_is_answered_from_the_run_s_sources_without_searching(world: SlackWorld) -> None:
    world.command("/research", QUESTION)
    run = world.cluster.wait_for_state(world.wait_for_runs(1)[0].id, {"done"}, 60)
    world.cluster.wait_for(lambda: world.report_messages(run), 20, "the report")
    searches, pages = len(world.corpus.search.requests("brave")), len(world.corpus.web.requests)
    world.reply(run, "How much energy did the array deliver?")
    follow_up = world.cluster.wait_for_state(world.wait_for_runs(2)[1].id, {"done", "failed"}, 60)
    assert follow_up.mode == "followup" and follow_up.state == "done", follow_up.error
    answer = world.cluster.wait_for(lambda: world.report_messages(follow_up, "on “How much energy"), 20, "the answer")
    cited = links_in(answer[0].visible_text)
    sources = {source["url"] for source in run.report_json["sources"]}
    assert cited and cited <= sources
    assert len(world.corpus.search.requests("brave")) == searches
    assert len(world.corpus.web.requests) == pages


def test_cancel_reaction_works_for_the_requester_only(tmp_path: Path, redis_url: str) -> None:
    with Corpus(page_latency=6.0) as corpus:
        for world in slack_world(tmp_path, redis_url, corpus):
            world.command("/research", QUESTION)
            run = world.cluster.wait_for_state(world.wait_for_runs(1)[0].id, {"running"}, 30)
            world.react(run, "x", OTHER)
            world.cluster.wait_for(lambda: world.slack.ephemeral_messages(), 10, "the private refusal")
            assert world.slack.ephemeral_messages()[0]["user"] == OTHER
            # The refusal is sent after the core decided; a cancel would already be in the row and in Redis.
            refused = world.cluster.run(run.id)
            assert (refused.state, refused.cancelled_by) == ("running", None)
            assert world.cluster.redis.get(f"deepthread:cancel:{run.id}") is None
            world.react(run, "x", ASKER)
            stopped = world.cluster.wait_for_state(run.id, {"cancelled", "done", "failed"}, 10)
            assert stopped.state == "cancelled" and stopped.cancelled_by == f"slack:{ASKER}"


def test_forged_stale_and_retried_deliveries(world: SlackWorld) -> None:
    request = world.sender.command("/research", "forged question", user=ASKER, channel=CHANNEL)
    forged = world.sender.send(request, signature=sign_slack_request("wrong-secret", request.body, int(time.time())))
    assert forged.status_code == 401
    stale = world.sender.send(world.sender.command("/research", "stale question", user=ASKER, channel=CHANNEL),
                              timestamp=int(time.time()) - 6 * 60)
    assert stale.status_code == 401
    mention = world.sender.event(world.sender.app_mention(f"<@{world.sender.bot_user_id}> research: {QUESTION}",
                                                          user=ASKER, channel=CHANNEL))
    assert world.sender.send(mention).status_code == 200
    # Each delivery's listener runs in a task of its own once acknowledged, so two mentions may become runs in either
    # order: the retry is sent once the mention is a run, as Slack retries one it saw no answer to in 3 s.
    world.cluster.wait_for(lambda: any(run.question == QUESTION for run in world.runs()), 20, "the mention's run")
    assert world.sender.send(mention, retry_num=1).status_code == 200
    # The retry was judged a repeat before it was acknowledged; a later mention becoming a run shows that a listener
    # it might have started has had the time to make its run too.
    later = world.sender.event(world.sender.app_mention(f"<@{world.sender.bot_user_id}> research: a later question",
                                                        user=OTHER, channel=CHANNEL))
    assert world.sender.send(later).status_code == 200
    world.cluster.wait_for(lambda: any(run.question == "a later question" for run in world.runs()), 20, "the later run")
    assert sorted(run.question for run in world.runs()) == sorted([QUESTION, "a later question"])


def test_a_report_containing_channel_and_here_pings_nobody(tmp_path: Path, redis_url: str) -> None:
    def pinging(request: ChatRequest):
        if request.schema_name is None and "untrusted_source" in request.text:
            return citing_synthesis(request) + "\n\nAttention <!channel> and @here and <!everyone> and <@U0OTHER01>."
        return default_research_model(request)

    with Corpus(llm_handler=pinging) as corpus:
        for world in slack_world(tmp_path, redis_url, corpus):
            world.command("/research", QUESTION)
            run = world.cluster.wait_for_state(world.wait_for_runs(1)[0].id, {"done"}, 60)
            reports = world.cluster.wait_for(lambda: world.report_messages(run), 20, "the report")
            posts = [call for call in world.slack.calls("chat.postMessage")]
            for call in posts:
                payload = str(call.params.get("text", "")) + str(call.params.get("blocks", ""))
                assert "<!channel>" not in payload and "<!everyone>" not in payload and "<!here" not in payload
                assert "<@U0OTHER01>" not in payload
                assert str(call.params.get("link_names", "false")).lower() in ("false", "0")
            assert "&lt;!channel&gt;" in reports[0].visible_text
