"""`deepthread chat` shows answers as the model writes them: a pseudo-terminal, a real worker and Redis, the fake model
streaming its answer as server-sent events."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sqlalchemy import select

from storage.models import Run
from tests.fakes.corpus import QUESTION, Corpus
from tests.fakes.llm import UNRELATED_SENTENCE, ChatRequest, HandlerResult, cite, passages_in, sentences
from tests.fakes.terminal import screen_left_by
from tests.integration.streamed_answers import CHAT_ANSWER, CHAT_QUESTION, FOLLOW_UP, honest_judge_model
from tests.integration.terminal_chat import chat_with_a_worker
from tests.integration.workers import Cluster

pytestmark = pytest.mark.integration

# A word every 40 ms: each answer takes a few seconds to write, far longer than the draft takes to reach the screen.
CHUNK_DELAY_SECONDS = 0.04
# The model's own passage ids: only its draft shows them, the audited answer numbers its sources.
RAW_CITATION = re.compile(r"\[p\d+\]")


def brief_follow_ups(request: ChatRequest) -> HandlerResult:
    """`honest_judge_model` with a short follow-up answer: first a sentence its passage does not support (which the
    audit flags), then two the passages say."""
    if request.schema_name is None and "Follow-up question" in request.text:
        shown = list(passages_in(request).items())
        first_id = shown[0][0]
        supported = [cite(sentences(text)[0], passage_id) for passage_id, text in shown[:2] if sentences(text)]
        return "\n\n".join([cite(UNRELATED_SENTENCE, first_id), *supported])
    return honest_judge_model(request)


def newest_run(cluster: Cluster) -> Run:
    with cluster.sessions() as session:
        return session.scalars(select(Run).order_by(Run.id.desc())).first()


def test_the_terminal_shows_answers_as_they_are_written_then_the_audited_answer(tmp_path: Path,
                                                                                redis_url: str) -> None:
    with (Corpus(llm_handler=brief_follow_ups, llm_chunk_delay=CHUNK_DELAY_SECONDS) as corpus,
          chat_with_a_worker(corpus, tmp_path, redis_url) as (cluster, child)):
        child.sendline(f"/ask {CHAT_QUESTION}")
        child.expect("the Moon pulls")  # the answer's first sentence, still being written
        chat = newest_run(cluster)
        assert chat.mode == "chat" and chat.state == "running", "the first words appear before the run ends"
        child.expect("› ")
        assert " ".join(CHAT_ANSWER.split()[-6:]) in screen_left_by(child.before)

        child.sendline(f"/research {QUESTION}")
        child.expect("sentences verified")
        child.expect("› ")

        child.sendline(FOLLOW_UP)
        child.expect(RAW_CITATION)  # the draft, cited as the model writes it
        follow_up = newest_run(cluster)
        assert follow_up.mode == "followup" and follow_up.state == "running", "the draft appears before the run ends"
        child.expect("unverified")
        child.expect("› ")
        child.logfile_read.flush()
        follow_up = cluster.run(follow_up.id)
        assert follow_up.state == "done", follow_up.error
    # Read as bytes: text mode would turn each carriage return of a redraw into a line feed.
    screen = screen_left_by((tmp_path / "chat.log").read_bytes().decode("utf-8", errors="replace"))
    answer = screen[screen.rindex(f"› {FOLLOW_UP}"):]  # all the follow-up left on screen, from its prompt on
    assert not RAW_CITATION.search(answer), "the draft was replaced, not left above the audited answer"
    assert answer.count(UNRELATED_SENTENCE.rstrip(".")) == 1
    assert re.search(re.escape(UNRELATED_SENTENCE.rstrip(".")) + r".{0,40}unverified", answer)
