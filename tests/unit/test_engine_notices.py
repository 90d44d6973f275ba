"""The engine's own words (no sources found, a run that wrote no report) are never audited, and say what happened."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from research import engine
from research.budget import ResearchOptions
from research.engine import NO_SOURCES_NOTICE, ResearchState, ResearchTools, unfinished_report
from research.fetch import FetchConfig
from research.llm import LLMClient
from research.models import Document, FetchResult, Passage, SearchResult
from research.phases.digest import quote_digest, quote_of
from research.audit import UNVERIFIED_MARKER, AuditResult
from research.report import (
    STOPPED_BY_USER_LINE,
    AuditFigures,
    ReportSource,
    audit_line,
    render_html,
    render_markdown,
)
from tests.fakes.llm import ChatRequest, FakeLLM, HandlerResult, decomposition, default_research_model
from tests.fakes.resolver import DictResolver
from tests.fakes.search_api import FakeSearchAPI

QUESTION = "What is known about the Zorblax tidal turbines?"


class Recorder:
    """Keeps the events the engine sends."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    async def __call__(self, event: Any) -> None:
        self.events.append(event)


def asking_one_query(request: ChatRequest) -> HandlerResult:
    """The default model, but its plan searches the question alone (one search, no wait between two)."""
    if request.schema_name == "decomposition":
        return decomposition([QUESTION])(request)
    return default_research_model(request)


def finding_nothing() -> ResearchTools:
    """Engine tools reaching an in-process model and a search API that finds nothing, so no page is ever fetched."""
    search = FakeSearchAPI(results_for=lambda provider, query: [])
    model = FakeLLM(asking_one_query)
    return ResearchTools(
        llm=LLMClient(model.config(), http_client=model.http_client()),
        search_config=search.search_config(providers=["brave"]),
        search_http=search.client(),
        resolver=DictResolver({}),
        fetch_config=FetchConfig(),
        fetch_transport=httpx.MockTransport(lambda request: httpx.Response(404)),
    )


def test_no_sources_notice_is_reported_as_written_and_never_audited() -> None:
    recorder = Recorder()
    options = ResearchOptions(max_seconds=30, max_rounds=2, max_sources=4, max_searches=6)
    report = asyncio.run(engine.research(QUESTION, options=options, tools=finding_nothing(), events=recorder))

    assert recorder.events[-1].type == "complete"
    assert report is not None
    assert report.body_markdown == NO_SOURCES_NOTICE
    assert UNVERIFIED_MARKER.strip() not in render_markdown(report)
    assert report.audit == AuditFigures()
    assert audit_line(report) == ""
    assert "verified" not in render_markdown(report) and "verified" not in render_html(report)
    assert not [event for event in recorder.events if event.phase == "verify"], "the notice went through the audit"


def stopped_while_reading() -> ResearchState:
    """A run that had read one page, was refused another by robots.txt, and had not fetched a third."""
    read = SearchResult(id="s1", provider="brave", title="Zorblax report", url="https://alpha.example/zorblax")
    refused = SearchResult(id="s2", provider="brave", title="Beta page", url="https://beta.example/zorblax")
    unfetched = SearchResult(id="s3", provider="brave", title="Gamma page", url="https://gamma.example/zorblax")
    return ResearchState(
        question=QUESTION,
        sources={source.id: source for source in (read, refused, unfetched)},
        fetches={"s1": FetchResult(url=read.url, status="ok", bytes_read=2_000),
                 "s2": FetchResult(url=refused.url, status="refused", reason="disallowed by robots.txt")},
        documents={"s1": Document(url=read.url, kind="html", text="The Zorblax array delivered 1,011 kWh.")},
    )


def test_stopped_report_keeps_its_question_and_its_title_says_what_was_stopped() -> None:
    report = unfinished_report(stopped_while_reading(), reason="stopped by user", stopped_by_user=True)
    assert report.question == QUESTION
    assert report.title == f"Research stopped: {QUESTION}"
    assert render_markdown(report).startswith(f"# Research stopped: {QUESTION}\n")


def test_stopped_report_lists_only_the_pages_it_read_as_sources() -> None:
    report = unfinished_report(stopped_while_reading(), reason="stopped by user", stopped_by_user=True)
    assert report.sources == [ReportSource(number=1, source_id="s1", title="Zorblax report",
                                           url="https://alpha.example/zorblax", provider="brave")]
    assert "Not read: https://beta.example/zorblax (disallowed by robots.txt)." in report.body_markdown
    assert "This source had been found and read; it is listed below." in report.body_markdown
    assert "1 more search result was not fetched yet." in report.body_markdown
    sources = render_markdown(report).split("## Sources")[1]
    assert "alpha.example" in sources and "beta.example" not in sources and "gamma.example" not in sources


def test_stopped_report_without_a_written_body_is_not_audited_and_has_no_redundant_stopped_line() -> None:
    report = unfinished_report(stopped_while_reading(), reason="stopped by user", stopped_by_user=True)
    assert report.audit == AuditFigures() and audit_line(report) == ""
    for document in (render_markdown(report), render_html(report)):
        assert STOPPED_BY_USER_LINE not in document
        assert "verified" not in document and UNVERIFIED_MARKER.strip() not in document


def test_report_written_and_then_stopped_keeps_its_own_title_and_the_stopped_line() -> None:
    state = stopped_while_reading()
    state.audit = AuditResult(
        body_markdown="# Zorblax turbines\n\nThe array delivered 1,011 kWh [1].",
        sources=[ReportSource(number=1, source_id="s1", title="Zorblax report", url="https://alpha.example/zorblax")],
        audit=AuditFigures(sentences_total=1, sentences_verified=1, citations_checked=1, citations_supported=1),
    )
    report = unfinished_report(state, reason="stopped by user", stopped_by_user=True)
    assert report.title == "Zorblax turbines" and report.question == QUESTION
    assert report.body_markdown == "The array delivered 1,011 kWh [1]."
    assert render_markdown(report).rstrip().endswith(STOPPED_BY_USER_LINE)
    assert "1 of 1 sentence verified" in render_markdown(report)


def test_a_report_no_model_wrote_does_not_say_an_ai_wrote_it_nor_that_it_is_partial_twice() -> None:
    report = unfinished_report(stopped_while_reading(), reason="stopped by user", stopped_by_user=True)
    assert not report.written_by_ai
    for document in (render_markdown(report), render_html(report)):
        assert "Written by AI" not in document and "check the citations" not in document
        assert "Partial report" not in document
    assert render_markdown(report).count("stopped") == 2  # in its title, and in its first line
    timed_out = unfinished_report(stopped_while_reading(), reason="timed out")
    assert "Written by AI" not in render_markdown(timed_out) and "Partial report: timed out." in render_markdown(timed_out)


def test_a_report_the_model_wrote_before_it_was_stopped_says_an_ai_wrote_it() -> None:
    state = stopped_while_reading()
    state.audit = AuditResult(
        body_markdown="# Zorblax turbines\n\nThe array delivered 1,011 kWh [1].",
        sources=[ReportSource(number=1, source_id="s1", title="Zorblax report", url="https://alpha.example/zorblax")],
    )
    report = unfinished_report(state, reason="stopped by user", stopped_by_user=True)
    assert report.written_by_ai and "Written by AI from the sources listed" in render_markdown(report)


def test_the_no_sources_notice_does_not_say_an_ai_wrote_it() -> None:
    options = ResearchOptions(max_seconds=30, max_rounds=2, max_sources=4, max_searches=6)
    report = asyncio.run(engine.research(QUESTION, options=options, tools=finding_nothing(), events=Recorder()))
    assert report is not None and report.body_markdown == NO_SOURCES_NOTICE
    assert "Written by AI" not in render_markdown(report) and "Written by AI" not in render_html(report)


def test_a_quick_answers_title_cuts_a_long_question_with_an_ellipsis() -> None:
    import datetime as dt

    model = FakeLLM(default_research_model)
    question = "Why " * 30 + "is the sea salty?"
    report = asyncio.run(engine.chat(question, history=[], llm=LLMClient(model.config(), http_client=model.http_client()),
                                     today=dt.date(2025, 1, 1), events=Recorder()))
    assert report is not None and report.title.endswith("Why…") and len(report.title) <= 80
    assert render_markdown(report).startswith(f"# {report.title}\n")


def test_timed_out_report_says_it_is_incomplete_and_why() -> None:
    report = unfinished_report(stopped_while_reading(), reason="timed out")
    assert report.title == f"Research incomplete: {QUESTION}"
    assert report.body_markdown.startswith("The run ended before the report was written (timed out).")
    assert not report.stopped_by_user and STOPPED_BY_USER_LINE not in render_markdown(report)


# -- the digest written instead of a report when the model fails while writing -----------------------------

def passage(passage_id: str, text: str) -> Passage:
    return Passage(id=passage_id, source_id="s1", text=text, start=0, end=len(text))


def test_a_digest_quotes_a_passages_own_sentences_and_skips_those_with_markup_or_bracketed_numbers() -> None:
    found = passage("p4", "Output figures appear in table [12] of the annex. The Zorblax array delivered 1,011 kWh "
                          "during the trial.\nIts moorings held through two winter storms. See `config` for more.")

    assert quote_of(found) == ("The Zorblax array delivered 1,011 kWh during the trial. [p4] "
                               "Its moorings held through two winter storms. [p4]")


def test_a_digest_of_passages_with_nothing_quotable_is_none_so_the_run_lists_its_sources_instead() -> None:
    unquotable = [passage("p1", "See [1]."), passage("p2", "| a | b |"), passage("p3", "Short one.")]
    source = SearchResult(id="s1", provider="brave", title="Zorblax report", url="https://alpha.example/zorblax")

    digest = asyncio.run(quote_digest(QUESTION, None, unquotable, {"s1": source}, reason="the model stopped answering"))

    assert digest is None
