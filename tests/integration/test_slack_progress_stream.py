"""Research progress as Slack's native tasks, end to end: the real bolt app, signed requests, a real worker, and the
fake Slack Web API checking the `plan_update`/`task_update` chunks; an expired stream falls back to chat.update."""

from __future__ import annotations

import asyncio

import pytest

from chat.message import MessengerError, Place
from chat.slack.messenger import SlackMessenger, build_slack_client
from chat.state import initial_progress
from chat.tasks import task_list
from storage.models import Run
from tests.fakes.corpus import QUESTION
from tests.fakes.slack_api import FakeSlack
from tests.integration.slack_harness import ASKER, CHANNEL, SlackWorld

pytestmark = [pytest.mark.integration,
              pytest.mark.world(corpus={"llm_latency": 0.2, "page_latency": 0.2}, slack_progress="stream")]

PHASE_TASKS = {"decompose", "search", "fetch", "read", "synthesize", "verify"}


def delivered_run(world: SlackWorld) -> Run:
    run = world.cluster.wait_for_state(world.wait_for_runs(1)[0].id, {"done", "failed", "cancelled", "timed_out"}, 60)
    assert run.state == "done", run.error
    world.cluster.wait_for(lambda: world.cluster.run(run.id).delivered_at, 20, "the run delivered")
    return world.cluster.run(run.id)


def test_research_progress_streams_as_tasks_then_the_report_follows(world: SlackWorld) -> None:
    world.command("/research", QUESTION)
    run = delivered_run(world)

    starts = world.slack.calls("chat.startStream")
    assert len(starts) == 1 and starts[0].error is None
    assert (starts[0].params["task_display_mode"], starts[0].params["recipient_user_id"]) == ("plan", ASKER)
    assert starts[0].params["thread_ts"] == run.status_message["thread"]
    stream = world.slack.streams()[0]
    assert stream.state == "stopped" and stream.streamed_tasks.plan_title == QUESTION
    tasks = stream.streamed_tasks.tasks
    assert PHASE_TASKS <= set(tasks) and {task["status"] for task in tasks.values()} == {"complete"}
    sub_questions = [task_id for task_id in tasks if task_id.startswith("sub-question-")]
    assert sub_questions and all(tasks[task_id]["title"] for task_id in sub_questions)
    # Coalesced: some states go by unshown, but a task never goes back.
    statuses = [update["status"] for update in stream.streamed_tasks.updates_of(sub_questions[0])]
    assert statuses == sorted(statuses, key=["pending", "in_progress", "complete"].index) and len(statuses) >= 2
    read_urls = [source["url"] for source in tasks["read"]["sources"]]
    assert read_urls and all(world.corpus.page_for(url) for url in read_urls)
    assert not [call for call in world.slack.calls() if call.method.endswith("Stream") and call.error]

    thread = world.thread_messages(run)
    reports = world.report_messages(run)
    assert len(reports) == 1
    order = [message.ts for message in thread]
    assert order.index(stream.ts) < order.index(reports[0].ts), "the tasks, then the report"
    assert not world.slack.edits(CHANNEL, stream.ts), "a stream that ended normally needs no edit"
    status = world.slack.message(CHANNEL, run.status_message["message_id"])
    assert "here is your report" not in status.visible_text and status.edits
    entries = [entry.kind for entry in run.delivered_messages]
    assert entries.count("progress") == 1 and entries.count("message") >= 1


def test_an_expired_progress_stream_falls_back_to_chat_update_delivering_final_state_and_report_once(
    world: SlackWorld,
) -> None:
    first_append = world.slack.hold_next("chat.appendStream", lambda params: True)
    world.command("/research", QUESTION)
    assert first_append.arrived.wait(30), "the progress never streamed"
    run = world.cluster.run(world.wait_for_runs(1)[0].id)  # read now: its status message is stored before it runs
    world.slack.expire_streams()  # a pause as long as Slack's: the stream is over mid-run
    status_edits_at_expiry = len(world.slack.edits(CHANNEL, run.status_message["message_id"]))
    first_append.release.set()
    run = delivered_run(world)

    stream = world.slack.streams()[0]
    assert stream.state == "expired"
    refused = [call.error for call in world.slack.calls() if call.method in ("chat.appendStream", "chat.stopStream")]
    assert refused == ["message_not_in_streaming_state"], "nothing more is streamed once the stream is found expired"
    stream_edits = world.slack.edits(CHANNEL, stream.ts)
    assert len(stream_edits) == 1, "the progress message gets its final state once, by chat.update"
    final_tasks = stream_edits[0].blocks[0]["text"]["text"]
    assert ":white_check_mark: Writing the report" in final_tasks and ":hourglass" not in final_tasks
    assert any("|" in element["text"] for block in stream_edits[0].blocks[1:] for element in block["elements"]), \
        "the pages read are linked in the edited message"
    status_edits = world.slack.edits(CHANNEL, run.status_message["message_id"])
    assert len(status_edits) > status_edits_at_expiry + 1, "the status message showed the progress again"
    assert len(world.report_messages(run)) == 1
    assert sum(1 for call in world.slack.calls("chat.postMessage") if "here is your report" in str(call.params)) == 1


def test_auto_mode_remembers_a_workspace_that_refuses_streaming() -> None:
    with FakeSlack() as slack:
        place = Place(platform="slack", workspace=slack.team_id, channel=CHANNEL, thread="1700000001.000100")
        messenger = SlackMessenger(build_slack_client(slack.token, slack.api_url), progress_mode="auto")
        slack.error_next("chat.startStream", "not_allowed")
        tasks = task_list(initial_progress(run_id=1, mode="research", question=QUESTION, requested_by="slack:U1"))
        assert messenger.streams_tasks(slack.team_id)
        with pytest.raises(MessengerError, match="not_allowed"):
            asyncio.run(messenger.start_task_stream(place, tasks, recipient=ASKER))
        assert not messenger.streams_tasks(slack.team_id), "the workspace is remembered: its runs edit from now on"
        assert messenger.streams_tasks("T0ANOTHER")
