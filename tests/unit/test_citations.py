"""Citation spellings and the model's wrapping: every spelling a model writes is read or removed, never shown raw."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chat.discord.render import DiscordRenderer
from chat.slack.render import SlackRenderer
from research.audit import verify_draft
from research.audit.citations import normalise_citations
from research.audit.draft import normalise_answer
from research.models import Passage, SearchResult
from research.report import Report, render_markdown

SHOWN = ["p3", "p7", "p12", "p13"]


@pytest.mark.parametrize(("written", "read"), [
    ("A [p3].", "A [p3]."), ("A [P3].", "A [p3]."), ("A [p3, p7].", "A [p3, p7]."), ("A [p3; p7].", "A [p3, p7]."),
    ("A [p3][p7].", "A [p3][p7]."), ("A [p12-p13].", "A [p12, p13]."), ("A (p3).", "A [p3]."),
    ("A (p3, p7).", "A [p3, p7]."), ("A 【p3】.", "A [p3]."), ("A [^p3].", "A [p3]."), ("A [source: p7].", "A [p7]."),
    ("A [Sources: p3, p7].", "A [p3, p7]."), ("A [p3](https://x.example/a_(b)).", "A [p3]."),
    # Numbered cites count the passages in the order they were shown.
    ("A [1].", "A [p3]."), ("A [1, 2].", "A [p3, p7]."), ("A [2][3].", "A [p7][p12]."), ("A [1-3].", "A [p3, p7, p12]."),
    ("A 【4†source】.", "A [p13]."),
    # Past the last passage shown, a number points at nothing (the audit removes it as fabricated).
    ("A [4][5].", "A [p13][p5]."),
])
def test_every_spelling_becomes_a_run_of_passage_ids(written: str, read: str) -> None:
    assert normalise_citations(written, SHOWN) == read


@pytest.mark.parametrize("kept", ["code `a[1]` and a[1]", "```\nx = y[1]  # (p3)\n```", "In [2023] the", "- [ ] task",
                                  "[a link](https://x.example) ok", "(see figure 3)"])
def test_text_that_only_looks_like_a_citation_is_left_alone(kept: str) -> None:
    assert normalise_citations(kept, SHOWN) == kept


def test_footnote_definitions_are_dropped() -> None:
    assert normalise_citations("Fact [^p3].\n\n[^p3]: Tower history, https://x.example", SHOWN) == "Fact [p3].\n"


@pytest.mark.parametrize(("answer", "report"), [
    ("<think>cite [p999]; # Draft title; Sources</think>\n## Findings\n\nFact [p1].", "## Findings\n\nFact [p1]."),
    ("Reasoning without its opening tag [p2].</think>\n## Findings\n\nFact [p1].", "## Findings\n\nFact [p1]."),
    ("```markdown\n# Title\n\nFact [p1].\n```", "# Title\n\nFact [p1]."),
    ("Here is the research report based on the sources you provided:\n\n# Title\n\nFact [p1].\n\n"
     "I hope this helps! Let me know if you would like more detail.", "# Title\n\nFact [p1]."),
    ("Sure! Below is the report.\n\n```md\n# T\n\nFact [p1].\n```\n\nHope this helps.", "# T\n\nFact [p1]."),
    ("# Research Report: Why?\n\n**Why?**\n\n## Summary\n\nFact [p1].", "# Research Report: Why?\n\n\n## Summary\n\nFact [p1]."),
    ("## Findings\n\nFact [p1].\n\n## Sources\n1. [T](http://x) [p1]\n2. [U](http://y)\n\n## Conclusion\n\nDone [p2].",
     "## Findings\n\nFact [p1].\n\n## Conclusion\n\nDone [p2]."),
    ("Fact [p1].\n\n**References:**\n- T — http://x\n- U — http://y", "Fact [p1]."),
])
def test_what_models_wrap_around_a_report_is_removed(answer: str, report: str) -> None:
    assert normalise_answer(answer) == report


def test_a_conclusion_that_merely_mentions_help_stays() -> None:
    kept = "## Conclusion\n\nIf you have a tidal site, turbines help [p1]."
    assert normalise_answer(kept) == kept


PASSAGE_TEXTS = ["The Eiffel Tower was completed in 1889 in Paris for the world fair.",
                 "Global solar capacity grew by 45 percent in 2023 according to the agency.",
                 "Tidal turbines in the Pentland Firth delivered steady power through the winter.",
                 "The bridge carries about 40,000 vehicles a day across the river."]
PASSAGES = {f"p{number}": Passage(id=f"p{number}", source_id=f"s{number}", text=text, start=0, end=len(text))
            for number, text in zip((3, 7, 12, 13), PASSAGE_TEXTS)}
SOURCES = {f"s{number}": SearchResult(id=f"s{number}", provider="brave", title=f"Source {number}",
                                      url=f"https://s{number}.example/") for number in (3, 7, 12, 13)}
SPELLINGS = ["[{id}]", "[{ID}]", "({id})", "【{id}】", "[^{id}]", "[source: {id}]", "[{id}](https://x.example/{id})",
             "[{n}]", "【{n}†source】", "[{n}][{m}]", "[{id}, {id2}]", "[{id}-{id2}]", "[{n}, {far}]", "[{far}]", "[p999]"]
RAW_MARKER = re.compile(r"\[\s*\^|【|\((?:source:\s*)?p\d+|\[(?:source:\s*)?p\d+", re.IGNORECASE)


@st.composite
def drafts(draw: st.DrawFn) -> str:
    paragraphs = []
    for _ in range(draw(st.integers(1, 6))):
        index = draw(st.integers(0, 3))
        second = draw(st.integers(0, 3))
        marker = draw(st.sampled_from(SPELLINGS)).format(
            id=SHOWN[index], ID=SHOWN[index].upper(), id2=SHOWN[second], n=index + 1, m=second + 1,
            far=draw(st.integers(5, 60)))
        sentence = PASSAGE_TEXTS[index].rstrip(".")
        paragraphs.append(f"{sentence} {marker}.")
    return "\n\n".join(["## Findings", *paragraphs])


@settings(max_examples=80, deadline=None)
@given(draft=drafts())
async def test_no_rendered_citation_marker_is_anything_but_a_listed_source(draft: str) -> None:
    result = await verify_draft(draft, passages=PASSAGES, sources=SOURCES)
    report = Report(question="q", title="T", body_markdown=result.body_markdown, sources=result.sources)
    body = render_markdown(report).split("## Sources")[0]
    listed = {source.number for source in result.sources}
    cited = {int(number) for number in re.findall(r"\[(\d+)\]", body)}
    assert cited <= listed, f"{cited - listed} cited but not listed in:\n{body}"
    assert not RAW_MARKER.search(body), body
    for renderer in (SlackRenderer(), DiscordRenderer()):
        shown = "\n".join(content.text for content in renderer.report(report, requester="u").messages)
        assert not RAW_MARKER.search(shown), shown
        assert {int(number) for number in re.findall(r"\[(\d+)\]", shown)} <= listed


@pytest.mark.parametrize(("written", "read"), [
    ("A [2][3].", "A [p7][p12]."), ("A [p3][p7].", "A [p3][p7]."), ("A [1][3][2].", "A [p3][p12][p7]."),
    ("A [1][].", "A [p3]."), ("A [p3](https://x.example/3) [2][3].", "A [p3] [p7][p12]."),
])
def test_adjacent_cites_stay_apart_where_a_definition_makes_them_a_reference_link(written: str, read: str) -> None:
    definitions = "\n\n[1]: https://x.example/1\n[2]: https://x.example/2\n[3]: https://x.example/3\n[p7]: https://x.example/7"
    assert normalise_citations(written + definitions, SHOWN).split("\n")[0] == read
