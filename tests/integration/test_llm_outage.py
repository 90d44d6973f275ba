"""The model goes down after the sources are gathered: the run still ends with a report quoted from them."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

import pytest

from chat.console.render import ConsoleRenderer
from chat.discord.render import DiscordRenderer
from chat.slack.render import SlackRenderer
from research import engine
from research.events import TERMINAL_TYPES
from research.report import Report, render_markdown
from tests.fakes.corpus import QUESTION, Corpus, options
from tests.fakes.llm import ChatRequest, FakeReply, HandlerResult, default_research_model, unavailable_while_writing

pytestmark = pytest.mark.integration

PLAIN_REASON = "The model stopped answering (HTTP 503) while writing the report"
_CITATION_NUMBER = re.compile(r"\s*\[\d+\]")


def down_after_decomposition(request: ChatRequest) -> HandlerResult:
    """Only the first step (decomposition) is answered; the gap check and the report get HTTP 503."""
    if request.schema_name == "decomposition":
        return default_research_model(request)
    return FakeReply(content="The server is overloaded, please try again later.", status=503)


@pytest.fixture
def corpus(request: pytest.FixtureRequest) -> Iterator[Corpus]:
    with Corpus(llm_handler=request.param) as running:
        yield running


def research(corpus: Corpus) -> tuple[Report | None, list[Any], engine.ResearchState]:
    events: list[Any] = []

    async def record(event: Any) -> None:
        events.append(event)

    state = engine.ResearchState()
    report = asyncio.run(engine.research(QUESTION, options=options(), tools=corpus.tools(), events=record, state=state))
    return report, events, state


def quotes_in(report: Report) -> list[tuple[str, int]]:
    """Each quoted sentence of the digest with the source number it cites."""
    quoted = []
    for line in report.body_markdown.splitlines():
        if line.startswith("> "):
            for sentence, number in re.findall(r"(.+?)\s*\[(\d+)\](?:\s+|$)", line[2:]):
                quoted.append((sentence.strip(), int(number)))
    return quoted


@pytest.mark.parametrize("corpus", [unavailable_while_writing(), down_after_decomposition], indirect=True,
                         ids=["synthesis-503", "gap-check-and-synthesis-503"])
def test_model_down_while_writing_leaves_a_report_quoting_the_gathered_passages(corpus: Corpus) -> None:
    report, events, state = research(corpus)

    terminals = [event for event in events if event.type in TERMINAL_TYPES]
    assert [event.type for event in terminals] == ["complete"] and events[-1] is terminals[0]
    assert terminals[0].partial and "HTTP 503" in terminals[0].partial_reason
    assert any(event.type == "phase_failed" and event.phase == "synthesize" for event in events)
    assert report is not None and report.partial and report.body_markdown.count("> ") >= 3
    assert report.title.startswith("Sources found, no written report")
    assert PLAIN_REASON in report.body_markdown and "not a written answer" in report.body_markdown

    passages = {passage.id: passage for passage in state.passages}
    source_of_number = {source.number: source for source in report.sources}
    quotes = quotes_in(report)
    assert len(quotes) >= 3
    for sentence, number in quotes:
        source = source_of_number[number]
        # The quote is verbatim text of one of the passages its source's citation stands for.
        assert any(sentence in " ".join(passages[passage_id].text.split()) for passage_id in source.passages_used), sentence
    assert {source.url for source in report.sources} <= {result.url for result in state.sources.values()}
    assert len(report.sources) >= 2 and report.audit.sentences_verified == report.audit.sentences_total == len(quotes)
    assert report.audit.citations_removed == report.audit.fabricated_removed == 0
    # The citations the runner stores are the audit's: each one names a passage the run kept.
    assert state.audit is not None and {verdict.passage_id for verdict in state.audit.citations} <= set(passages)
    assert {verdict.verdict for verdict in state.audit.citations} == {"supported"}


@pytest.mark.parametrize("corpus", [unavailable_while_writing()], indirect=True, ids=["synthesis-503"])
def test_every_renderer_shows_the_digest_with_the_reason_in_plain_words(corpus: Corpus) -> None:
    report, _, _ = research(corpus)
    assert report is not None
    first_source = report.sources[0]

    shown = {
        "markdown": render_markdown(report),
        "slack": "\n".join(content.text for content in SlackRenderer().report(report, requester="slack:U1").messages),
        "discord": "\n".join(content.text for content in DiscordRenderer().report(report, requester="discord:1").messages),
        "terminal": "\n".join(content.text for content in ConsoleRenderer().report(report, requester="cli:me").messages),
    }
    for platform, text in shown.items():
        assert "stopped answering (HTTP 503) while writing the report" in text, platform
        assert "Partial report" in text, platform
        assert first_source.url in text, platform
        assert "Written by AI" not in text, f"{platform}: the digest quotes the sources, no model wrote it"
