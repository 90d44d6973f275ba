"""Files shared on Slack are sources, end to end: the real bolt app (signed requests), the conversation core, a real
worker, real Redis, the fake Slack Web API and its file host, and the fake LLM, search provider and web."""

from __future__ import annotations

import re
from typing import Any

import pytest

from storage.models import Run
from tests.fakes.corpus import QUESTION
from tests.fakes.bombs import pdf_bomb
from tests.fakes.shared_files import pdf_of_pages, proposal_docx, survey_pdf, word_zip_bomb
from tests.integration.process_tree import TreePeaks
from tests.integration.slack_harness import ASKER, CHANNEL, SlackWorld

pytestmark = pytest.mark.integration

FINISHED = {"done", "failed", "cancelled", "timed_out"}
SURVEY = survey_pdf()
PROPOSAL = proposal_docx()
NOTES = b"# Field notes\n\nThe Zorblax pilot array delivered 41 megawatt hours in its first tidal month.\n"


def mention(world: SlackWorld, text: str, files: list[dict[str, Any]], *, thread_ts: str | None = None) -> str:
    typed = f"<@{world.slack.bot_user_id}> {text}".strip()
    ts = world.slack.person_posts(CHANNEL, typed, user=ASKER, thread_ts=thread_ts)
    event = world.sender.app_mention(typed, user=ASKER, channel=CHANNEL, ts=ts, thread_ts=thread_ts)
    event["files"] = files
    assert world.sender.send(world.sender.event(event)).status_code == 200
    return str(event["ts"])


def reply_with_files(world: SlackWorld, thread_ts: str, text: str, files: list[dict[str, Any]]) -> None:
    event = world.sender.message(text, user=ASKER, channel=CHANNEL, thread_ts=thread_ts, subtype="file_share")
    event["files"] = files
    assert world.sender.send(world.sender.event(event)).status_code == 200


def finished(world: SlackWorld, count: int) -> Run:
    run = world.wait_for_runs(count)[count - 1]
    return world.cluster.wait_for_state(run.id, FINISHED, 90)


def report_text(world: SlackWorld, run: Run) -> str:
    messages = world.cluster.wait_for(lambda: world.report_messages(run, "Sources"), 30, "the report in the thread")
    return "\n".join(message.visible_text for message in messages)


def test_a_mention_with_a_pdf_and_a_docx_cites_both_files_and_the_web(world: SlackWorld) -> None:
    survey = world.slack.add_file("survey.pdf", SURVEY, channel=CHANNEL, user=ASKER)
    proposal = world.slack.add_file("proposal.docx", PROPOSAL, channel=CHANNEL, user=ASKER)
    # A person's thread in the channel, which the bot joins when mentioned there with the files and the question.
    root = world.slack.person_posts(CHANNEL, "Can someone check the vendor's claims?", user=ASKER)
    mention(world, f"{QUESTION} Compare the proposal and the survey with what is public.", [survey, proposal],
            thread_ts=root)
    run = finished(world, 1)
    assert run.mode == "research"
    assert run.state == "done", run.error

    sources = run.report_json["sources"]
    files = {source["file"]["name"]: source for source in sources if source.get("file")}
    assert set(files) == {"survey.pdf", "proposal.docx"}
    assert [source for source in sources if not source.get("file")], "web sources are cited beside the files"
    assert files["survey.pdf"]["url"] == survey["permalink"] and 2 in files["survey.pdf"]["pages"]
    cited = {passage["source_id"] for passage in run.report_json["cited_passages"]}
    assert {source["source_id"] for source in files.values()} <= cited
    audit = run.report_json["audit"]
    assert audit["citations_checked"] == audit["citations_supported"] >= len(sources)

    text = report_text(world, run)
    assert "survey.pdf (PDF, p" in text and "proposal.docx (Word document" in text
    # Downloads went to the file host with the bot token; files.info was asked first for each.
    assert {call.params["file"] for call in world.slack.calls("files.info")} >= {survey["id"], proposal["id"]}
    downloads = [request for request in world.slack.file_requests.all() if request.path.endswith(("survey.pdf", "proposal.docx"))]
    assert downloads and all(request.headers.get("authorization") == f"Bearer {world.slack.token}" for request in downloads)


def test_a_reply_that_only_shares_a_file_is_acknowledged_and_files_only_searches_nothing(world: SlackWorld) -> None:
    world.command("/research", QUESTION)
    first = finished(world, 1)
    assert first.state == "done", first.error
    report_text(world, first)
    thread_ts = first.status_message["thread"]
    notes = world.slack.add_file("field-notes.md", NOTES, channel=CHANNEL, user=ASKER)

    reply_with_files(world, thread_ts, "", [notes])
    acknowledged = world.cluster.wait_for(
        lambda: [message for message in world.slack.messages(CHANNEL, thread_ts=thread_ts)
                 if "I'll use field-notes.md in this thread" in message.visible_text], 20, "the acknowledgement")
    assert len(acknowledged) == 1
    assert len(world.runs()) == 1, "a reply that only shares a file starts no run"

    searches = len(world.corpus.search.requests("brave"))
    world.reply(first, "files only: how much energy did the pilot array deliver?")
    second = finished(world, 2)
    assert second.state == "done", second.error
    assert second.options.files_only
    assert len(world.corpus.search.requests("brave")) == searches, "files only calls no search provider"
    sources = second.report_json["sources"]
    assert [source["file"]["name"] for source in sources] == ["field-notes.md"]
    assert re.search(r"41 megawatt hours", second.report_markdown or "")

    # A follow-up draws on the file's passages as on the web's, and names the file as its source.
    report_text(world, second)
    world.reply(first, "How much did the pilot array deliver in its first month?")
    third = finished(world, 3)
    assert third.mode == "followup" and third.state == "done", third.error
    assert [source["file"]["name"] for source in third.report_json["sources"] if source.get("file")] == ["field-notes.md"]


POOL_LIMIT_MIB = 512


@pytest.mark.world(file_max_bytes=str(2 * 1024 * 1024), extract_memory_limit_mb=str(POOL_LIMIT_MIB))
def test_each_unusable_file_is_named_in_the_thread_and_the_run_goes_on_within_the_pool_s_memory(world: SlackWorld) -> None:
    shared = [
        world.slack.add_file("too-big.txt", b"Zorblax tides. " * 200_000, channel=CHANNEL, user=ASKER),
        # An unknown type, declared as no type in particular: judged by its content, and refused by it.
        world.slack.add_file("diagram.dwg", b"AC1032" + bytes(4096), channel=CHANNEL, user=ASKER,
                             mimetype="application/octet-stream"),
        # A picture is not even sent to the run: the person is told at once.
        world.slack.add_file("screenshot.png", b"\x89PNG\r\n\x1a\n" + bytes(64), channel=CHANNEL, user=ASKER),
        world.slack.add_file("scan.pdf", pdf_of_pages([[]]), channel=CHANNEL, user=ASKER),
        world.slack.add_file("contract.docx", word_zip_bomb(300 * 1024 * 1024), channel=CHANNEL, user=ASKER),
        world.slack.add_file("appendix.pdf", pdf_bomb(200 * 1024 * 1024), channel=CHANNEL, user=ASKER),
        world.slack.add_file("field-notes.md", NOTES, channel=CHANNEL, user=ASKER),
    ]
    with TreePeaks(world.cluster.workers["w1"].pid) as memory:
        mention(world, f"research: {QUESTION}", shared)
        run = finished(world, 1)
    assert run.state == "done", run.error
    text = report_text(world, run)
    for name in ("too-big.txt", "diagram.dwg", "scan.pdf", "contract.docx", "appendix.pdf"):
        assert f"{name} was not used" in text, name
        assert any(note.startswith(f"{name} was not used") for note in run.report_json["notes"]), name
    assert "larger than the 2 MB limit" in text and "no text layer" in text
    assert any("I can't read screenshot.png" in str(message) for message in world.slack.ephemeral_messages())
    assert [source["file"]["name"] for source in run.report_json["sources"] if source.get("file")] == ["field-notes.md"]
    assert memory.peaks and max(memory.peaks.values()) < POOL_LIMIT_MIB * 1024 * 1024, memory.peaks
