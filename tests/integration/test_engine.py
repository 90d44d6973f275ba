"""The whole engine against the fakes: LLM, search provider and a web corpus on several host names."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from research import engine
from research.budget import CancelToken
from research.events import TERMINAL_TYPES
from research.models import Passage, SearchResult
from research.report import Report, audit_line, render_html, render_markdown
from research.untrusted import REMOVED_MARKER, parse_fenced_sources
from tests.fakes.corpus import INJECTION, QUESTION, Corpus, numbers_in, options
from tests.fakes.llm import (
    ChatRequest,
    FakeReply,
    default_research_model,
    passages_in,
    fabricating_synthesis,
    unrelated_citation_synthesis,
    wrong_number_synthesis,
)
from tests.waiting import eventually

pytestmark = pytest.mark.integration


class Recorder:
    """Collects events, lets a test wait for one, and checks the event contract."""

    def __init__(self) -> None:
        self.events: list[Any] = []
        self._arrived = asyncio.Event()

    async def __call__(self, event: Any) -> None:
        self.events.append(event)
        self._arrived.set()

    async def wait_for(self, matches: Callable[[Any], bool]) -> None:
        """Return once an event for which `matches` is true has been recorded."""
        while not any(matches(event) for event in self.events):
            self._arrived.clear()
            await self._arrived.wait()

    @property
    def types(self) -> list[str]:
        return [event.type for event in self.events]

    def assert_contract(self) -> Any:
        """seq increases by one from 1; exactly one terminal event, and it is the last."""
        assert [event.seq for event in self.events] == list(range(1, len(self.events) + 1))
        terminals = [event for event in self.events if event.type in TERMINAL_TYPES]
        assert len(terminals) == 1, self.types
        assert self.events[-1] is terminals[0]
        return terminals[0]


def routed(synthesis: Any) -> Any:
    """The default model, but with this synthesis for free-text requests that show passages."""

    def handler(request: ChatRequest) -> Any:
        if request.schema_name is None and "untrusted_source" in request.text and "Follow-up" not in request.text:
            return synthesis(request)
        return default_research_model(request)

    return handler


@pytest.fixture
def corpus() -> Iterator[Corpus]:
    with Corpus() as running:
        yield running


def run_research(corpus: Corpus, **option_overrides: Any) -> tuple[Report | None, Recorder, engine.ResearchState]:
    recorder = Recorder()
    state = engine.ResearchState()
    report = asyncio.run(engine.research(QUESTION, options=options(**option_overrides), tools=corpus.tools(),
                                         events=recorder, state=state))
    return report, recorder, state


def phase_started(phase: str) -> Callable[[Any], bool]:
    return lambda event: event.type == "phase_started" and event.phase == phase


def cited_pairs(report: Report) -> list[tuple[str, int]]:
    """(sentence, source number) for each `[n]` in the body."""
    import re

    pairs = []
    for line in report.body_markdown.splitlines():
        for sentence in re.split(r"(?<=\])\s+", line):
            for number in re.findall(r"\[(\d+)\]", sentence):
                pairs.append((sentence, int(number)))
    return pairs


def test_every_citation_maps_to_a_fetched_page_whose_passage_holds_the_fact(corpus: Corpus) -> None:
    report, recorder, state = run_research(corpus)
    assert recorder.assert_contract().type == "complete"
    assert report is not None and not report.partial
    fetched_paths = {(request.host, request.path) for request in corpus.web.requests.all()}
    by_number = {source.number: source for source in report.sources}
    passages_by_source: dict[int, list[str]] = {}
    for passage in report.cited_passages:
        passages_by_source.setdefault(passage.source_number, []).append(passage.text)
    pairs = cited_pairs(report)
    assert len(pairs) >= 4
    for sentence, number in pairs:
        source = by_number[number]
        page = corpus.page_for(source.url)
        assert page is not None, f"[{number}] is not a corpus page: {source.url}"
        host = urlsplit(source.url).hostname
        assert any(urlsplit(f"http://{fetched_host}").hostname == host and path == "/zorblax"
                   for fetched_host, path in fetched_paths)
        facts = [value for value in numbers_in(sentence) if value in page.numbers]
        assert facts, f"no planted fact in {sentence!r}"
        assert any(all(fact in text for fact in facts) for text in passages_by_source[number])
    assert report.audit.fabricated_removed == 0
    assert "sentences verified" in render_markdown(report)


def test_sources_are_numbered_in_order_of_first_use_with_titles_and_urls(corpus: Corpus) -> None:
    report, recorder, _ = run_research(corpus)
    recorder.assert_contract()
    first_use = list(dict.fromkeys(number for _, number in cited_pairs(report)))
    assert first_use == sorted(first_use) == list(range(1, len(first_use) + 1))
    markdown = render_markdown(report)
    for source in report.sources:
        assert f"[{source.number}] {source.title}" in markdown
        assert source.url in markdown


def test_fabricated_citation_is_removed_and_counted() -> None:
    with Corpus(llm_handler=routed(fabricating_synthesis)) as corpus:
        report, recorder, _ = run_research(corpus)
    recorder.assert_contract()
    assert report.audit.fabricated_removed == 1
    assert "p999" not in report.body_markdown
    assert "fabricated" in render_markdown(report)


def test_wrong_number_is_flagged_in_body_footer_and_figures() -> None:
    with Corpus(llm_handler=routed(wrong_number_synthesis)) as corpus:
        report, recorder, _ = run_research(corpus)
    recorder.assert_contract()
    assert report.audit.sentences_unverified >= 1
    assert report.audit.sentences_verified < report.audit.sentences_total
    assert "unverified" in report.body_markdown
    footer = render_markdown(report).split("---")[-1]
    assert f"{report.audit.sentences_verified} of {report.audit.sentences_total} sentences verified" in footer


def test_unrelated_citation_is_flagged() -> None:
    with Corpus(llm_handler=routed(unrelated_citation_synthesis)) as corpus:
        report, recorder, _ = run_research(corpus)
    recorder.assert_contract()
    assert report.audit.sentences_unverified >= 1
    assert report.audit.citations_removed + report.audit.sentences_unverified >= 1
    assert "unverified" in report.body_markdown


def test_garbage_decomposition_falls_back_to_the_question() -> None:
    def garbage_decomposition(request: ChatRequest) -> Any:
        if request.schema_name == "decomposition":
            return "I would love to help! Here are some thoughts, not JSON."
        return default_research_model(request)

    with Corpus(llm_handler=garbage_decomposition) as corpus:
        report, recorder, state = run_research(corpus)
        searched = [request.query.get("q") for request in corpus.search.requests("brave")]
    assert recorder.assert_contract().type == "complete"
    assert [sub.question for sub in state.plan.sub_questions] == [QUESTION]
    assert searched == [QUESTION]
    assert any(event.type == "warning" and event.phase == "decompose" for event in recorder.events)
    assert report is not None and report.sources


def test_model_that_never_returns_valid_json_fails_plan_with_a_clear_error(corpus: Corpus) -> None:
    corpus.llm.handler = lambda request: "Sure! Plan: search a lot."
    recorder = Recorder()
    report = asyncio.run(engine.plan(QUESTION, llm=corpus.tools().llm, today=corpus.tools().today(), events=recorder))
    terminal = recorder.assert_contract()
    assert report is None
    assert terminal.type == "error"
    assert "did not return a valid answer" in terminal.message
    assert any(event.type == "phase_failed" for event in recorder.events)


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"max_searches": 1}, "search budget"),
        ({"max_fetch_bytes": 2000}, "fetch budget"),
        ({"max_llm_tokens": 50}, "token budget"),
    ],
    ids=["searches", "bytes", "tokens"],
)
def test_budget_overrun_gives_a_partial_report_with_its_reason(corpus: Corpus, overrides: dict[str, Any], reason: str) -> None:
    report, recorder, _ = run_research(corpus, **overrides)
    terminal = recorder.assert_contract()
    assert terminal.type == "complete" and terminal.partial
    assert report is not None and report.partial
    assert reason in report.partial_reason
    assert reason in render_markdown(report)


def test_time_overrun_gives_a_partial_report_with_its_reason() -> None:
    # Every page (and robots.txt) answers after 3 s, past the 1.4 s the 2 s budget leaves for gathering.
    with Corpus(page_latency=3.0) as corpus:
        report, recorder, state = run_research(corpus, max_seconds=2.0)
    terminal = recorder.assert_contract()
    assert terminal.type == "complete" and terminal.partial
    assert "time budget" in report.partial_reason
    # The report was written without waiting for the slow pages (bench/cancel.py times the overrun).
    assert not state.documents
    assert not any(event.type == "phase_done" and event.phase == "fetch" for event in recorder.events)


def test_cancel_during_fetch_aborts_at_once_and_keeps_what_was_found() -> None:
    with Corpus(page_latency=5.0) as corpus:
        recorder = Recorder()
        state = engine.ResearchState()
        cancel = CancelToken()

        async def main() -> tuple[Report | None, int, int]:
            async def cancel_while_fetching() -> None:
                await recorder.wait_for(phase_started("fetch"))
                await eventually(lambda: corpus.web.requests.all(), "a request to the web (robots.txt first) in flight", 30,
                                 interval=0.01)
                cancel.cancel("U-requester")

            canceller = asyncio.create_task(cancel_while_fetching())
            report = await engine.research(QUESTION, options=options(), tools=corpus.tools(), events=recorder,
                                           cancel=cancel, state=state)
            requests_seen = corpus.web.requests.all()
            answered = sum(1 for request in requests_seen if request.finished_at is not None)
            await canceller
            return report, len(requests_seen), answered

        report, requests_seen, answered_before_the_run_returned = asyncio.run(main())
        count_after_return = len(recorder.events)
    terminal = recorder.assert_contract()
    assert terminal.type == "aborted"
    # Stopped while every request was still waiting for its 5 s answer (bench/cancel.py times the latency).
    assert requests_seen and answered_before_the_run_returned == 0
    assert not any(event.type == "phase_done" and event.phase == "fetch" for event in recorder.events)
    assert len(recorder.events) == count_after_return
    assert state.sources, "sources found before the cancel were lost"
    assert report is not None and report.stopped_by_user
    markdown = render_markdown(report)
    # Stopped before anything was written: the title says so, and no "[Research stopped by user]" repeats it.
    assert markdown.startswith(f"# Research stopped: {QUESTION}\n") and "[Research stopped by user]" not in markdown


def test_a_page_s_instructions_never_reach_the_model_and_its_other_text_only_inside_the_untrusted_fence() -> None:
    seen: list[str] = []

    def guarded(request: ChatRequest) -> Any:
        for message in request.raw["messages"]:
            content = message["content"]
            assert INJECTION not in content, "a page's instructions reached the model"
            if REMOVED_MARKER in content:
                outside = content
                for fenced in parse_fenced_sources(content):
                    outside = outside.replace(fenced.text, "")
                assert REMOVED_MARKER not in outside, "page text reached the model outside the fence"
                assert message["role"] == "user"
                seen.append(request.schema_name or "text")
        return default_research_model(request)

    with Corpus(llm_handler=guarded, injection_host="alpha.example") as corpus:
        report, recorder, _ = run_research(corpus)
        errors = corpus.llm.handler_errors
    recorder.assert_contract()
    assert not errors
    assert seen, "the page that carried the instructions never reached the model"
    assert report is not None


def test_plan_mode_touches_no_provider_and_no_page(corpus: Corpus) -> None:
    recorder = Recorder()
    tools = corpus.tools()
    report = asyncio.run(engine.plan(QUESTION, llm=tools.llm, today=tools.today(), events=recorder))
    assert recorder.assert_contract().type == "complete"
    assert report.plan["key_questions"]
    assert "Search strategy" in report.body_markdown
    assert corpus.search.requests("brave") == []
    assert corpus.web.requests.all() == []


def test_answer_from_passages_cites_only_the_given_passages_and_searches_nothing(corpus: Corpus) -> None:
    passages = [
        Passage(id="p1", source_id="s1", text="The Zorblax array number 7 delivered 9,191 kilowatt hours in its trial.", start=0, end=70),
        Passage(id="p2", source_id="s2", text="Maintenance of the Zorblax moorings happens every 45 days.", start=0, end=58),
    ]
    sources = {"s1": SearchResult(id="s1", provider="brave", title="One", url="https://one.example/a"),
               "s2": SearchResult(id="s2", provider="brave", title="Two", url="https://two.example/b")}
    recorder = Recorder()
    tools = corpus.tools()
    report = asyncio.run(engine.answer_from_passages("How often are the moorings maintained?", history=[],
                                                     passages=passages, sources=sources, llm=tools.llm,
                                                     today=tools.today(), events=recorder))
    assert recorder.assert_contract().type == "complete"
    assert report.sources
    assert {source.url for source in report.sources} <= {"https://one.example/a", "https://two.example/b"}
    assert {passage.id for passage in report.cited_passages} <= {"p1", "p2"}
    assert corpus.search.requests("brave") == []
    assert corpus.web.requests.all() == []


def test_progress_moves_through_every_phase_and_never_goes_backwards(corpus: Corpus) -> None:
    report, recorder, _ = run_research(corpus)
    assert recorder.assert_contract().type == "complete" and report is not None
    percents = [event.percent for event in recorder.events if event.type == "progress"]
    assert all(earlier < later for earlier, later in zip(percents, percents[1:])), percents
    assert percents[0] == 5 and percents[-1] == 90
    gathering = [percent for percent in percents if 5 < percent < 45]
    assert len(gathering) >= 3, percents
    percent_so_far = 0.0
    for event in recorder.events:
        if event.type == "progress":
            percent_so_far = event.percent
        elif event.type == "phase_started" and event.phase == "synthesize":
            assert percent_so_far == 45
        elif event.type == "phase_started" and event.phase == "verify":
            assert percent_so_far == 90


def test_stop_while_writing_keeps_the_question_and_lists_only_the_pages_read() -> None:
    writing_requested = threading.Event()

    def slow_synthesis(request: ChatRequest) -> Any:
        writing_requested.set()
        return FakeReply(content="Too late.", delay=10.0)

    with Corpus(llm_handler=routed(slow_synthesis)) as corpus:
        corpus.web.set_robots("beta.example", "User-agent: *\nDisallow: /")
        recorder = Recorder()
        cancel = CancelToken()

        async def main() -> Report | None:
            async def cancel_when_writing() -> None:
                await recorder.wait_for(phase_started("synthesize"))
                await eventually(writing_requested.is_set, "the report's model call in flight", 30, interval=0.01)
                cancel.cancel("U-requester")

            canceller = asyncio.create_task(cancel_when_writing())
            report = await engine.research(QUESTION, options=options(), tools=corpus.tools(), events=recorder, cancel=cancel)
            await canceller
            return report

        report = asyncio.run(main())
    assert recorder.assert_contract().type == "aborted"
    assert report is not None and report.stopped_by_user
    assert report.question == QUESTION and report.title == f"Research stopped: {QUESTION}"
    assert report.sources and all("beta.example" not in source.url for source in report.sources)
    assert "Not read: http://beta.example" in report.body_markdown and "robots" in report.body_markdown
    assert audit_line(report) == ""
    for document in (render_markdown(report), render_html(report)):
        assert "[Research stopped by user]" not in document and "sentences verified" not in document


def test_while_the_report_is_written_progress_counts_its_words_and_keeps_moving_without_showing_its_text() -> None:
    from chat.status import counts_line

    with Corpus() as corpus:
        corpus.llm.chunk_delay = 0.02  # a word every 20 ms: the report takes a few seconds to write
        report, recorder, _ = run_research(corpus)

    assert report is not None and not report.partial
    writing = [event for event in recorder.events if event.type == "progress" and event.counts.get("words_written")]
    words = [event.counts["words_written"] for event in writing]
    assert len(words) >= 2 and words == sorted(words) and words[0] < words[-1]
    assert "words written" in counts_line(writing[-1].counts)
    # Only counts and percents go out while writing: the unaudited text is in no event.
    cited_line = next(line for line in report.body_markdown.splitlines() if "[" in line)
    written = cited_line.split("[")[0].strip()
    assert len(written) > 20 and not any(written in str(event.model_dump()) for event in recorder.events)


def test_a_cut_off_uncited_draft_replaced_by_cited_claims_leaves_a_report_that_is_not_partial() -> None:
    from tests.fakes.model_zoo import zoo_model

    never_cites = zoo_model("never_cites").handler

    def rambling_and_uncited(request: ChatRequest) -> Any:
        answer = never_cites(request)
        if request.schema_name is None and passages_in(request):
            text = answer.content if isinstance(answer, FakeReply) else answer
            return FakeReply(text, finish_reason="length")  # stopped at its limit every time, continuations too
        return answer

    with Corpus(llm_handler=rambling_and_uncited) as corpus:
        report, _, _ = run_research(corpus)

    assert report is not None and report.audit.sentences_verified >= 3
    assert not report.partial, report.partial_reason
