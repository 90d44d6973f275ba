"""Streamed answers in Slack end to end: the real bolt app, signed requests, a real worker, the fake Slack Web API's
chat.startStream/appendStream/stopStream, and the fake model streaming its answer as server-sent events."""

from __future__ import annotations

import pytest

from tests.fakes.corpus import QUESTION
from tests.fakes.llm import UNRELATED_SENTENCE
from tests.integration.slack_harness import ASKER, CHANNEL, SlackWorld
from tests.integration.streamed_answers import CHAT_ANSWER, CHAT_QUESTION, FOLLOW_UP, honest_judge_model

# A word every 40 ms: the answer takes a couple of seconds to write, long enough for several appends. Research
# progress as edits: the only stream here is the answer's (tests/integration/test_slack_progress_stream.py).
pytestmark = [pytest.mark.integration,
              pytest.mark.world(corpus={"llm_handler": honest_judge_model, "llm_chunk_delay": 0.04},
                                slack_progress="edit")]


def answer_messages(world: SlackWorld, run, marker: str):
    return [message for message in world.thread_messages(run) if marker in message.visible_text]


def test_a_follow_up_streams_and_ends_as_the_audited_answer_in_the_same_message(world: SlackWorld) -> None:
    world.command("/research", QUESTION)
    research = world.cluster.wait_for_state(world.wait_for_runs(1)[0].id, {"done"}, 60)
    world.cluster.wait_for(lambda: world.report_messages(research), 20, "the report")
    world.reply(research, FOLLOW_UP)
    follow_up = world.cluster.wait_for_state(world.wait_for_runs(2)[1].id, {"done", "failed"}, 60)
    assert follow_up.mode == "followup" and follow_up.state == "done", follow_up.error
    world.cluster.wait_for(lambda: world.cluster.run(follow_up.id).delivered_at, 20, "the answer delivered")

    starts = world.slack.calls("chat.startStream")
    assert len(starts) == 1 and starts[0].error is None
    assert starts[0].params["recipient_user_id"] == ASKER
    assert starts[0].params["recipient_team_id"] == follow_up.workspace
    assert starts[0].params["thread_ts"] == research.status_message["thread"]
    stream = world.slack.streams()[0]
    assert len(world.slack.calls("chat.appendStream")) >= 1 and stream.state == "stopped"
    # What streamed was the model's draft: the unsupported sentence, not yet flagged.
    assert UNRELATED_SENTENCE.rstrip(".") in stream.markdown and "unverified" not in stream.markdown

    answers = answer_messages(world, follow_up, "on “How much energy")
    assert [message.ts for message in answers] == [stream.ts], "the answer is the streamed message, posted once"
    final = world.slack.message(CHANNEL, stream.ts)
    assert "unverified" in final.visible_text and UNRELATED_SENTENCE.rstrip(".") in final.visible_text
    assert [call.params["ts"] for call in world.slack.calls("chat.update")
            if call.params["ts"] != research.status_message["message_id"]
            and call.params["ts"] != follow_up.status_message["message_id"]] == [stream.ts]
    delivered = world.cluster.run(follow_up.id).delivered_messages
    assert delivered[0].ref["message_id"] == stream.ts


def test_an_answer_whose_stream_expired_is_finished_with_an_edit_of_the_same_message(world: SlackWorld) -> None:
    first_append = world.slack.hold_next("chat.appendStream", lambda params: True)
    world.command("/ask", CHAT_QUESTION)
    run = world.wait_for_runs(1)[0]
    assert first_append.arrived.wait(30), "the answer never streamed"
    world.slack.expire_streams()  # a pause as long as Slack's: the stream is over
    first_append.release.set()
    run = world.cluster.wait_for_state(run.id, {"done", "failed"}, 30)
    assert run.mode == "chat" and run.state == "done", run.error
    world.cluster.wait_for(lambda: world.cluster.run(run.id).delivered_at, 20, "the answer delivered")

    stream = world.slack.streams()[0]
    assert stream.state == "expired"
    refused = [call.error for call in world.slack.calls() if call.method in ("chat.appendStream", "chat.stopStream")]
    assert refused and set(refused) == {"message_not_in_streaming_state"}
    assert len(world.slack.calls("chat.appendStream")) == 1, "no appends after the stream was found expired"
    final = world.slack.message(CHANNEL, stream.ts)
    assert CHAT_ANSWER in final.visible_text.replace("\n", " ")
    assert final.edits and final.edits[-1].text == final.text
    answers = answer_messages(world, run, "the Moon pulls the ocean")
    assert [message.ts for message in answers] == [stream.ts], "the answer is in the thread once"
