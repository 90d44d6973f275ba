"""`deepthread research` through every model in the zoo: whatever a real model wraps around its report, however it
spells its citations, wherever it stops, the delivered report keeps the citation promise."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bot.cli import app
from research.report import Report, parse_report_json, render_markdown
from tests.fakes.corpus import QUESTION, Corpus
from tests.fakes.llm import passages_in
from tests.fakes.model_zoo import CLOSING_CHATTER, MODEL_ZOO, OPENING_CHATTER, ZooModel, is_continuation, zoo_model

pytestmark = pytest.mark.integration

# Each behaviour with what its report may do differently from a well-behaved one.
CUT_OFF_FOR_GOOD = {"truncated_always"}
ESTIMATED_USAGE = {"no_usage", "kitchen_sink"}
# The model keeps thinking past a small limit; given twice the room it writes (LLM_MAX_OUTPUT_TOKENS below 12,000).
SETTINGS = {"thinks_until_limit": {"LLM_MAX_OUTPUT_TOKENS": "8000"}}
RAW_MARKER = re.compile(r"\[\s*\^|【|\(\s*p\d+|\[\s*(?:source:\s*)?p\d+|</?think", re.IGNORECASE)
LEAKED_REASONING = ("Let me work out", "[p999]", "Draft title", "I must not cite")


@pytest.fixture
def research(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator:
    def run(model: ZooModel) -> tuple[Report, Corpus, int]:
        with Corpus(llm_handler=model.handler) as corpus:
            for option, value in model.fake_options.items():
                setattr(corpus.llm, option, value)
            environment = {**corpus.environment(), "DATABASE_URL": f"sqlite:///{tmp_path}/{model.name}.db",
                           "DATA_DIR": str(tmp_path), "RESEARCH_MAX_ROUNDS": "1", **SETTINGS.get(model.name, {})}
            for name, value in environment.items():
                monkeypatch.setenv(name, value)
            result = CliRunner().invoke(app, ["research", QUESTION, "--format", "json"])
            assert result.exit_code == 0, result.output
            return parse_report_json(result.stdout), corpus, result.exit_code
    yield run


def claims_shown(corpus: Corpus) -> int:
    """How many claims a faithful report makes: the fakes restate one sentence per passage shown for the report."""
    reports = [request for request in corpus.llm.chat_requests
               if request.schema_name is None and passages_in(request) and not is_continuation(request)]
    return len(passages_in(reports[-1]))


@pytest.mark.parametrize("name", sorted(MODEL_ZOO))
def test_the_citation_promise_holds_whatever_the_model(name: str, research) -> None:
    report, corpus, _ = research(zoo_model(name))
    markdown = render_markdown(report)
    body = markdown.split("\n## Sources\n")[0]

    if name in CUT_OFF_FOR_GOOD:
        assert report.partial and "cut off at its output limit" in (report.partial_reason or "")
    else:
        assert not report.partial, report.partial_reason
    for leaked in LEAKED_REASONING:
        assert leaked not in markdown, f"reasoning leaked: {leaked!r}"
    assert OPENING_CHATTER not in markdown and CLOSING_CHATTER not in markdown and "```" not in markdown

    listed = {source.number for source in report.sources}
    cited = {int(number) for number in re.findall(r"\[(\d+)\]", body)}
    assert listed and cited == listed, f"cited {cited}, listed {listed}"
    assert not RAW_MARKER.search(markdown), RAW_MARKER.search(markdown)

    assert len(re.findall(r"^#\s", markdown, re.MULTILINE)) == 1, "one title"
    source_sections = re.findall(r"^(?:#+\s*|\*\*)(?:sources|references)\b", markdown, re.MULTILINE | re.IGNORECASE)
    assert len(source_sections) == 1, "one source section"

    figures = report.audit
    if name in CUT_OFF_FOR_GOOD:
        assert 0 < figures.sentences_total <= claims_shown(corpus)
    else:
        assert figures.sentences_total == claims_shown(corpus), "the audit counts the claims and nothing else"
        assert figures.sentences_verified == figures.sentences_total
    assert report.usage.tokens_estimated is (name in ESTIMATED_USAGE)
    assert ("(estimated)" in markdown) is (name in ESTIMATED_USAGE)


def test_an_empty_answer_is_never_delivered_as_a_report(research) -> None:
    empty = ZooModel(name="empty", handler=lambda request: "" if request.schema_name is None and passages_in(request)
                     else MODEL_ZOO["well_behaved"].handler(request), fake_options={}, description="says nothing")
    report, _, _ = research(empty)
    assert report.partial and report.partial_reason == "the model returned no report text"
    assert "These" in report.body_markdown and "sources had been found" in report.body_markdown
