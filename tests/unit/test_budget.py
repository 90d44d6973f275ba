from __future__ import annotations

import pytest

from research.budget import Budget, EventSink, ResearchOptions
from research.events import Complete, PhaseStarted, Progress
from research.phases.decompose import fallback, priority_urls
from research.plan import ResearchPlan, plan_as_decomposition


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_budget_names_the_first_cap_it_hits() -> None:
    clock = Clock()
    budget = Budget(ResearchOptions(max_seconds=100, max_searches=5, max_llm_tokens=1000), clock=clock)
    assert budget.overrun() is None
    budget.searches_used = lambda: 5
    assert budget.overrun() == "search budget of 5 provider calls reached"
    budget.searches_used = lambda: 0
    budget.tokens_used = lambda: 1000
    assert "token budget" in budget.overrun()
    budget.tokens_used = lambda: 0
    budget.bytes_exhausted = lambda: True
    assert "fetch budget" in budget.overrun()
    budget.bytes_exhausted = lambda: False
    clock.now = 71  # 30 s are kept back for writing the report
    assert budget.overrun() == "time budget of 100 s reached"


def test_gathering_keeps_time_back_for_writing() -> None:
    options = ResearchOptions(max_seconds=300)
    assert options.writing_reserve_seconds == 60
    assert ResearchOptions(max_seconds=10).writing_reserve_seconds == 3


async def test_event_sink_numbers_events_and_drops_anything_after_the_terminal_one() -> None:
    seen = []

    async def forward(event) -> None:
        seen.append(event)

    sink = EventSink(forward, first_seq=7)
    await sink(PhaseStarted(phase="search"))
    await sink(Progress(percent=10))
    await sink(Complete())
    await sink(Progress(percent=99))
    assert [event.seq for event in seen] == [7, 8, 9]
    assert seen[-1].type == "complete"
    assert sink.last_seq == 9


def test_urls_in_the_question_become_priority_sources() -> None:
    question = "Compare https://a.example/x, and (https://b.example/y) with https://a.example/x."
    assert priority_urls(question) == ["https://a.example/x", "https://b.example/y"]
    assert fallback(question).sub_questions[0].queries[0].startswith("Compare")


def test_an_approved_plan_replaces_decomposition() -> None:
    plan = ResearchPlan(query="q", key_questions=["A?", "B?"], deliverable="d",
                        search_strategy=[{"query": "a1", "source_type": "news"}, {"query": "b1"}, {"query": "a2"}])
    decomposition = plan_as_decomposition(plan.model_dump())
    assert [sub.question for sub in decomposition.sub_questions] == ["A?", "B?"]
    assert [sub.queries for sub in decomposition.sub_questions] == [["a1", "a2"], ["b1"]]


@pytest.mark.parametrize("bad", [{"query": "q", "key_questions": [], "search_strategy": [], "deliverable": "d"}])
def test_an_invalid_plan_is_refused(bad) -> None:
    with pytest.raises(ValueError):
        plan_as_decomposition(bad)
