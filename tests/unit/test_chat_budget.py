"""Chat and follow-ups have token budgets: the thread's context is capped by tokens, newest first, the answer's
output is capped, and a follow-up's citation check stops when its token budget is spent."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import httpx
import pytest
from sqlalchemy.orm import Session, sessionmaker

from bot.conversation.events import HistoryMessage
from config import Settings
from research import engine
from research.budget import ResearchOptions
from research.engine import ResearchTools
from research.llm import LLMClient
from research.models import Passage, SearchResult
from research.providers import SearchConfig
from research.rank import estimate_tokens
from research.thread_context import TRUNCATION_MARKER, Turn, context_tokens, fit_thread_context
from tests.fakes.llm import ChatRequest, FakeLLM, HandlerResult, default_research_model
from tests.fakes.resolver import DictResolver
from tests.unit.conversation_world import ALICE, BOB, World
from tests.attempts import execute_stored
from worker.runner import RunnerServices
from worker.toolkit import research_options

QUESTION = "So which of these options should we pick?"


def turn(number: int, words: int = 40, role: str = "user") -> Turn:
    """A thread message that names its number, about `words` words long."""
    return Turn(role=role, content=f"Message {number}: " + " ".join(f"point{number}x{index}" for index in range(words)))


# -- the thread context, capped by tokens ---------------------------------------------------------------

def test_the_newest_messages_that_fit_are_kept_in_thread_order() -> None:
    history = [turn(number) for number in range(30)]
    per_turn = estimate_tokens(history[0]["content"])

    kept = fit_thread_context(history, QUESTION, max_tokens=estimate_tokens(QUESTION) + per_turn * 5 + 5)

    assert [item["content"].split(":")[0] for item in kept] == [f"Message {number}" for number in range(25, 30)]


def test_the_question_is_counted_first_so_the_history_gets_only_what_it_leaves() -> None:
    history = [turn(number) for number in range(10)]
    per_turn = estimate_tokens(history[0]["content"])
    long_question = "Why " * 400

    with_short_question = fit_thread_context(history, "Why?", max_tokens=per_turn * 3 + 10)
    with_long_question = fit_thread_context(history, long_question, max_tokens=per_turn * 3 + 10)

    assert len(with_short_question) == 3
    assert with_long_question == []


def test_a_message_too_long_for_the_room_left_is_shortened_with_a_marker_not_dropped() -> None:
    huge = turn(1, words=20_000)

    kept = fit_thread_context([huge], QUESTION, max_tokens=1_000)

    assert len(kept) == 1 and kept[0]["role"] == "user"
    assert kept[0]["content"].endswith(TRUNCATION_MARKER)
    shortened = kept[0]["content"].removesuffix(TRUNCATION_MARKER)
    assert huge["content"].startswith(shortened) and len(shortened) > 1_000
    assert huge["content"][len(shortened)] == " ", "cut inside a word"
    assert context_tokens(kept, QUESTION) <= 1_000


def test_what_is_kept_stays_under_the_cap_by_the_shared_estimate() -> None:
    history = [turn(number, words=37 * (number % 7 + 1), role="assistant" if number % 3 else "user") for number in range(60)]

    for cap in (400, 1_234, 5_000, 12_000):
        kept = fit_thread_context(history, QUESTION, max_tokens=cap)
        assert estimate_tokens(QUESTION) + sum(estimate_tokens(item["content"]) for item in kept) <= cap
        assert kept[-1]["content"].startswith("Message 59:")


# -- through the conversation core and the runner -------------------------------------------------------

def chat_tools(model: FakeLLM) -> ResearchTools:
    """Engine tools whose model is `model`; search and fetch go nowhere (chat and follow-ups use neither)."""
    nowhere = httpx.AsyncClient(transport=httpx.MockTransport(lambda request: httpx.Response(404)))
    return ResearchTools(llm=LLMClient(model.config(), http_client=model.http_client()), search_config=SearchConfig(),
                         search_http=nowhere, resolver=DictResolver({}))


def long_thread(messages: int) -> list[HistoryMessage]:
    """A busy thread: `messages` messages of about 600 words each, people and the bot taking turns."""
    return [HistoryMessage(user=BOB if number % 2 else ALICE, text=turn(number, words=600)["content"],
                           is_bot=number % 5 == 4)
            for number in range(messages)]


def test_a_mention_in_a_long_thread_sends_the_model_a_prompt_within_the_context_budget(
        session_factory: sessionmaker[Session]) -> None:
    world = World(session_factory)
    outcome = world.handle(kind="mention", text=QUESTION, thread="1500.0", message_id="1500.9",
                           thread_history=long_thread(200))
    assert world.run(outcome.run_id).mode == "chat"
    model = FakeLLM(default_research_model)
    options = ResearchOptions()

    asyncio.run(execute_stored(outcome.run_id, RunnerServices(sessions=session_factory, tools=chat_tools(model),
                                                                     options=options)))

    assert world.run(outcome.run_id).state == "done"
    [request] = model.chat_requests
    thread_and_question = [message for message in request.messages if message["role"] != "system"]
    assert thread_and_question[-1] == {"role": "user", "content": QUESTION}
    assert sum(estimate_tokens(message["content"]) for message in thread_and_question) <= options.max_context_tokens
    assert thread_and_question[-2]["content"].startswith("Message 199:")
    assert request.max_tokens == options.chat_max_output_tokens


def test_in_a_small_context_window_the_thread_takes_at_most_a_quarter_of_it_and_the_prompt_fits(
        session_factory: sessionmaker[Session]) -> None:
    world = World(session_factory)
    outcome = world.handle(kind="mention", text=QUESTION, thread="1500.0", message_id="1500.9",
                           thread_history=long_thread(200))
    model = FakeLLM(default_research_model, context_window=4096, context_discovery="llama_cpp")
    options = ResearchOptions()

    asyncio.run(execute_stored(outcome.run_id, RunnerServices(sessions=session_factory, tools=chat_tools(model),
                                                                     options=options)))

    assert world.run(outcome.run_id).state == "done"
    [request] = model.chat_requests
    thread = [message for message in request.messages if message["role"] != "system"][:-1]
    assert thread and sum(estimate_tokens(message["content"]) for message in thread) <= 4096 // 4
    assert request.prompt_tokens + (request.max_tokens or 0) <= 4096


# -- a follow-up's token budget ---------------------------------------------------------------------------

PASSAGE_TEXT = ("The harbour entrance array of tidal turbines delivered steady output across the spring tides, "
                "according to the operator's yearly summary of the trial.")
PASSAGE = Passage(id="p1", source_id="s1", text=PASSAGE_TEXT, start=0, end=len(PASSAGE_TEXT))
DOUBTFUL_ANSWER = "The harbour entrance array delivered steady output during the winter storms and autumn gales [p1]."


def answering_doubtfully(request: ChatRequest) -> HandlerResult:
    """A follow-up answer whose one citation the words alone cannot settle, so the citation check is asked."""
    if request.schema_name is None:
        return DOUBTFUL_ANSWER
    return default_research_model(request)


def follow_up(options: ResearchOptions) -> list[ChatRequest]:
    model = FakeLLM(answering_doubtfully)
    events: list[Any] = []

    async def record(event: Any) -> None:
        events.append(event)

    source = SearchResult(id="s1", provider="brave", title="Harbour trial", url="https://harbour.example/trial")
    report = asyncio.run(engine.answer_from_passages(
        "Did it keep running in bad weather?", history=[], passages=[PASSAGE], sources={"s1": source},
        llm=chat_tools(model).llm, today=dt.date(2026, 11, 22), events=record, options=options))
    assert report is not None and events[-1].type == "complete"
    return model.chat_requests


@pytest.mark.parametrize(("budget", "judged"), [(40_000, True), (50, False)])
def test_a_follow_ups_citation_check_is_asked_only_within_its_token_budget(budget: int, judged: bool) -> None:
    requests = follow_up(ResearchOptions(chat_max_llm_tokens=budget))

    assert requests[0].max_tokens == ResearchOptions().chat_max_output_tokens
    assert any(request.schema_name == "citation_check" for request in requests) is judged


def test_the_chat_budget_settings_reach_every_runs_options(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"CHAT_MAX_CONTEXT_TOKENS": "3000", "CHAT_MAX_OUTPUT_TOKENS": "900", "CHAT_MAX_LLM_TOKENS": "7000"}.items():
        monkeypatch.setenv(name, value)

    options = research_options(Settings())

    assert (options.max_context_tokens, options.chat_max_output_tokens, options.chat_max_llm_tokens) == (3000, 900, 7000)
