"""The report model and its Markdown, HTML and JSON renderings."""

from __future__ import annotations

import datetime as dt
import json
from html.parser import HTMLParser

import pydantic
import pytest

from research.audit import verify_draft
from research.llm import ModelUsage
from research.models import Passage, SearchResult
from research.report import (
    STOPPED_BY_USER_LINE,
    AuditFigures,
    CitedPassage,
    Report,
    ReportSource,
    UsageSummary,
    audit_line,
    parse_report_json,
    render_html,
    render_json,
    render_markdown,
    split_title,
    unfinished_title,
)
from research.report_html import markdown_to_html


def make_report(**changes: object) -> Report:
    usage = UsageSummary(
        llm={"big-model": ModelUsage(calls=1, prompt_tokens=10_000, completion_tokens=2_000, cost=0.0100),
             "fast-model": ModelUsage(calls=1, prompt_tokens=300, completion_tokens=45, cost=0.0023)},
        total_tokens=12_345, cost=0.0123, search_calls={"tavily": 3}, pages_fetched=8, bytes_fetched=123_456, seconds=41.2)
    report = Report(
        title="Solar power in 2023",
        question="How fast did solar grow?",
        body_markdown="## Summary\n\nSolar capacity grew by 45% in 2023 [1]. The tower opened in 1889 [2].",
        sources=[
            ReportSource(number=1, source_id="s2", title="Renewables 2024", url="https://energy.example/report",
                         provider="tavily", passages_used=["p2"]),
            ReportSource(number=2, source_id="s1", title="Tower history", url="https://tower.example/history",
                         provider="duckduckgo", passages_used=["p1"], snippet_only=True),
        ],
        cited_passages=[
            CitedPassage(id="p2", source_id="s2", source_number=1, text="Solar grew by 45% in 2023."),
            CitedPassage(id="p1", source_id="s1", source_number=2, text="Opened in 1889.", is_snippet=True),
        ],
        audit=AuditFigures(sentences_total=20, sentences_verified=18, sentences_unverified=2, citations_checked=22,
                           citations_supported=20, citations_removed=1, fabricated_removed=1, judged_by_llm=3),
        usage=usage,
        phase_seconds={"search": 3.5, "verify": 0.2},
        skipped_providers={"brave": "rate limited"},
    )
    return report.model_copy(update=changes)


class TagCollector(HTMLParser):
    """Every start tag with its attributes, as a browser's parser would see them."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse_html(document: str) -> TagCollector:
    collector = TagCollector()
    collector.feed(document)
    collector.close()
    return collector


def assert_html_is_inert(document: str) -> None:
    parsed = parse_html(document)
    assert "<script" not in document.lower()
    for tag, attributes in parsed.tags:
        assert tag not in {"script", "iframe", "object", "embed", "img", "svg", "form", "base"}
        assert not [name for name in attributes if name.startswith("on")]
        href = attributes.get("href")
        if href is not None:
            assert href.startswith(("https://", "http://", "#")), href


def test_usage_records_calls_per_model_and_totals() -> None:
    usage = make_report().usage
    assert usage.llm["big-model"].calls == 1 and usage.llm["fast-model"].completion_tokens == 45
    assert usage.total_tokens == 12_345
    assert usage.cost == pytest.approx(0.0123)


def test_markdown_has_title_body_sources_and_footer() -> None:
    markdown = render_markdown(make_report())
    assert markdown.startswith("# Solar power in 2023\n\n## Summary\n\nSolar capacity grew by 45% in 2023 [1].")
    assert "## Sources\n\n[1] Renewables 2024 — https://energy.example/report  \n" in markdown
    assert "[2] Tower history — https://tower.example/history (search snippet)" in markdown
    assert markdown.rstrip().endswith(
        "18 of 20 sentences verified · 1 citation removed · 1 fabricated citation removed · 2 sentences unverified"
        " · brave skipped: rate limited  \n12,345 tokens · $0.0123 · 41 s"
    )
    assert "Partial" not in markdown and STOPPED_BY_USER_LINE not in markdown


def test_markdown_does_not_repeat_a_title_the_body_already_has() -> None:
    markdown = render_markdown(make_report(body_markdown="# Own title\n\nText [1]."))
    assert markdown.startswith("# Own title\n\nText [1].")
    assert "Solar power in 2023" not in markdown


def test_clean_audit_footer_omits_zero_counts() -> None:
    report = make_report(audit=AuditFigures(sentences_total=3, sentences_verified=3), skipped_providers={})
    assert "3 of 3 sentences verified  \n" in render_markdown(report)
    assert "removed" not in render_markdown(report)


def test_partial_report_says_why() -> None:
    markdown = render_markdown(make_report(partial=True, partial_reason="time budget reached"))
    assert "⚠️ Partial report: time budget reached." in markdown
    assert "Partial report: time budget reached." in render_html(make_report(partial=True, partial_reason="time budget reached"))


def test_stopped_report_ends_with_the_stopped_line() -> None:
    report = make_report(stopped_by_user=True, partial=True, partial_reason="stopped by user")
    assert render_markdown(report).rstrip().endswith(STOPPED_BY_USER_LINE)
    html_document = render_html(report)
    footer = html_document[html_document.index("<footer>"):]
    assert footer.index("usage") < footer.index(STOPPED_BY_USER_LINE)


def test_report_whose_title_says_it_was_stopped_has_no_stopped_line() -> None:
    report = make_report(title=unfinished_title("How fast did solar grow?", stopped_by_user=True),
                         body_markdown="The research was stopped before the report was written.",
                         stopped_by_user=True, partial=True, partial_reason="stopped by user")
    assert render_markdown(report).startswith("# Research stopped: How fast did solar grow?\n")
    assert STOPPED_BY_USER_LINE not in render_markdown(report)
    assert STOPPED_BY_USER_LINE not in render_html(report)


def test_unfinished_title_names_the_question_shortened_to_one_line() -> None:
    assert unfinished_title("Why is the sky blue?", stopped_by_user=True) == "Research stopped: Why is the sky blue?"
    assert unfinished_title("Why is the sky blue?", stopped_by_user=False) == "Research incomplete: Why is the sky blue?"
    long_title = unfinished_title("What changed in\nEuropean grid storage " + "and pumped hydro " * 20, stopped_by_user=True)
    assert "\n" not in long_title and long_title.endswith("…") and len(long_title) <= len("Research stopped: ") + 80
    assert unfinished_title("", stopped_by_user=True) == "Research stopped"


def test_audit_line_says_nothing_when_no_sentence_was_audited() -> None:
    report = make_report(audit=AuditFigures(), skipped_providers={})
    assert audit_line(report) == ""
    assert "verified" not in render_markdown(report)
    assert "verified" not in render_html(report) and 'class="audit"' not in render_html(report)
    assert audit_line(make_report(audit=AuditFigures())) == "brave skipped: rate limited"


def test_html_numbers_each_source_once() -> None:
    document = render_html(make_report())
    parsed = parse_html(document)
    assert "ol" not in {tag for tag, _ in parsed.tags}, "a browser-numbered list would show '1. [1]'"
    assert '<li id="source-1"><span class="number">[1]</span> ' in document
    assert '<li id="source-2"><span class="number">[2]</span> ' in document


def test_html_does_not_repeat_a_question_equal_to_the_title() -> None:
    same = render_html(make_report(title="How fast did solar grow?"))
    assert 'class="question"' not in same
    assert same.count("How fast did solar grow?") == 2  # <title> and <h1>
    assert '<p class="question">How fast did solar grow?</p>' in render_html(make_report())


def test_html_shows_each_sources_cited_passages_in_a_collapsed_list() -> None:
    report = make_report(cited_passages=[
        CitedPassage(id="p2", source_id="s2", source_number=1, text="Solar grew by 45% in 2023."),
        CitedPassage(id="p3", source_id="s2", source_number=1, text='Wind <script>alert("w")</script> grew\ntoo.'),
        CitedPassage(id="p1", source_id="s1", source_number=2, text="Opened in 1889.", is_snippet=True),
    ])
    document = render_html(report)
    assert_html_is_inert(document)
    first = document[document.index('<li id="source-1">'):document.index('<li id="source-2">')]
    second = document[document.index('<li id="source-2">'):document.index("</ul>", document.index('<li id="source-2">'))]
    assert '<details class="passages"><summary>2 cited passages</summary>' in first
    assert "<blockquote>Solar grew by 45% in 2023.</blockquote>" in first
    assert "<blockquote>Wind &lt;script&gt;alert(&quot;w&quot;)&lt;/script&gt; grew too.</blockquote>" in first
    assert "<summary>Cited passage</summary>" in second and "Opened in 1889." in second and "Solar grew" not in second
    assert "<details" not in render_html(make_report(cited_passages=[]))


def test_html_links_citations_to_source_anchors() -> None:
    document = render_html(make_report())
    parsed = parse_html(document)
    cite_targets = [attributes["href"] for tag, attributes in parsed.tags if attributes.get("class") == "cite"]
    assert cite_targets == ["#source-1", "#source-2"]
    anchors = {attributes.get("id") for tag, attributes in parsed.tags if tag == "li"}
    assert {"source-1", "source-2"} <= anchors
    assert '<a href="https://energy.example/report" rel="noopener noreferrer nofollow">Renewables 2024</a>' in document
    assert '<span class="snippet">search snippet</span>' in document
    assert "18 of 20 sentences verified" in document


def test_html_escapes_hostile_title_body_and_urls() -> None:
    hostile = make_report(
        title='<script>alert("t")</script>',
        question='<img src=x onerror=alert(1)>',
        body_markdown=(
            "Text <script>alert('b')</script> and <a href=\"javascript:alert(2)\" onclick=\"x()\">link</a> [1].\n\n"
            "- [click](javascript:alert(3)) and [data](data:text/html,<script>alert(4)</script>)\n"
            "- <svg onload=alert(5)> **bold** _it_\n\n"
            "```\n<script>alert(6)</script>\n```"
        ),
        sources=[
            ReportSource(number=1, source_id="s1", title='"><script>alert(7)</script>', url="javascript:alert(8)"),
            ReportSource(number=2, source_id="s2", title="ok", url='https://x.example/"onmouseover="alert(9)'),
        ],
        skipped_providers={"brave": "<b>rate</b> limited"},
    )
    document = render_html(hostile)
    assert_html_is_inert(document)
    text = "".join(parse_html(document).text)
    assert '<script>alert("t")</script>' in text
    assert "<img src=x onerror=alert(1)>" in text
    assert "<svg onload=alert(5)>" in text
    assert "<b>rate</b> limited" in text


def test_html_renders_the_markdown_subset() -> None:
    fragment = markdown_to_html(
        "## Findings\n\nSome **bold** and *italic* and `code` text, see [docs](https://docs.example/a_b_(c)).\n\n"
        "- first\n- second\n\n3. third\n4. fourth\n\n> quoted\n\n| A | B |\n|---|---|\n| 1 | 2 |\n\n---\n"
        "Visit https://site.example/path_with_underscores. Done [12]."
    )
    assert "<h2>Findings</h2>" in fragment
    assert "<strong>bold</strong>" in fragment and "<em>italic</em>" in fragment and "<code>code</code>" in fragment
    assert '<a href="https://docs.example/a_b_(c)" rel="noopener noreferrer nofollow">docs</a>' in fragment
    assert "<ul><li>first</li><li>second</li></ul>" in fragment
    assert '<ol start="3"><li>third</li><li>fourth</li></ol>' in fragment
    assert "<blockquote><p>quoted</p></blockquote>" in fragment
    assert "<thead><tr><th>A</th><th>B</th></tr></thead><tbody><tr><td>1</td><td>2</td></tr></tbody>" in fragment
    assert "<hr>" in fragment
    assert '>https://site.example/path_with_underscores</a>.' in fragment
    assert '<a class="cite" href="#source-12">[12]</a>' in fragment


def test_json_round_trips_to_an_equal_report() -> None:
    report = make_report(partial=True, partial_reason="token budget", created_at=dt.datetime(2024, 5, 1, 12, tzinfo=dt.timezone.utc))
    text = render_json(report)
    assert parse_report_json(text) == report
    assert "Solar grew by 45% in 2023." in text


def test_json_includes_the_run_id_when_known() -> None:
    assert json.loads(render_json(make_report(run_id=42)))["run_id"] == 42
    assert parse_report_json(render_json(make_report(run_id=42))).run_id == 42
    assert json.loads(render_json(make_report()))["run_id"] is None


async def test_json_export_marks_the_citations_the_audit_added() -> None:
    stated = "Global solar capacity grew by 45% in 2023, reaching 1,400 gigawatts."
    passages = {"p1": Passage(id="p1", source_id="s1", text="The tower opened in 1889.", start=0, end=25),
                "p2": Passage(id="p2", source_id="s2", text=stated, start=0, end=len(stated))}
    sources = {"s1": SearchResult(id="s1", provider="brave", title="Tower", url="https://tower.example/"),
               "s2": SearchResult(id="s2", provider="brave", title="Solar", url="https://solar.example/")}
    audited = await verify_draft(f"The tower opened in 1889 [p1]. {stated}", passages=passages, sources=sources)
    report = make_report(body_markdown=audited.body_markdown, sources=audited.sources,
                         cited_passages=audited.cited_passages, audit=audited.audit)
    exported = json.loads(render_json(report))
    assert [(passage["id"], passage["added_by_audit"], passage["added_to"]) for passage in exported["cited_passages"]] == [
        ("p1", False, []), ("p2", True, [stated])]
    assert exported["audit"]["citations_added"] == 1
    assert parse_report_json(render_json(report)) == report


def test_a_report_stored_before_the_audit_added_citations_still_loads() -> None:
    stored = json.loads(render_json(make_report()))
    for passage in stored["cited_passages"]:
        del passage["added_by_audit"], passage["added_to"]
    del stored["audit"]["citations_added"]
    report = parse_report_json(json.dumps(stored))
    assert report.audit.citations_added == 0 and not any(passage.added_by_audit for passage in report.cited_passages)


def test_audit_line_counts_the_citations_the_audit_added() -> None:
    report = make_report(audit=AuditFigures(sentences_total=3, sentences_verified=3, citations_added=2),
                         skipped_providers={})
    assert audit_line(report) == "3 of 3 sentences verified · 2 citations added by the audit"


def test_json_parser_rejects_what_is_not_a_report() -> None:
    with pytest.raises(pydantic.ValidationError):
        parse_report_json('{"title": "no body"}')


def test_split_title_takes_the_leading_heading() -> None:
    assert split_title("\n# A title\n\n## Summary\n\nText.") == ("A title", "## Summary\n\nText.")
    assert split_title("## Summary\n\nText.") == (None, "## Summary\n\nText.")


def test_only_links_to_the_report_s_sources_stay_links() -> None:
    from research.report import ReportSource, only_source_links

    body = ("See [the agency](https://energy.example/report) and [your bank](https://evil.example/login) [1]. "
            "Code `[x](https://evil.example)` stays.\n\n```\n[a](https://evil.example)\n```")
    report = Report(title="t", body_markdown=body,
                    sources=[ReportSource(number=1, source_id="s1", title="A", url="https://energy.example/report/")])
    assert "[the agency](https://energy.example/report)" in report.body_markdown, "a source's link stays live"
    assert "your bank (https://evil.example/login)" in report.body_markdown, "any other shows where it goes"
    assert "`[x](https://evil.example)`" in report.body_markdown and "\n[a](https://evil.example)\n" in report.body_markdown
    assert Report.model_validate(report.model_dump()).body_markdown == report.body_markdown
    assert only_source_links("[x](https://a.example)", []) == "x (https://a.example)"


def test_a_phishing_link_in_a_report_is_not_live_on_any_platform() -> None:
    from chat.discord.render import DiscordRenderer
    from chat.slack.render import SlackRenderer

    report = Report(title="t", body_markdown="Log in at [your bank](https://evil.example/login) now.")
    shown = "\n".join(content.text for renderer in (SlackRenderer(), SlackRenderer(use_markdown_blocks=False),
                                                   DiscordRenderer())
                      for content in renderer.report(report, requester="u").messages)
    assert "](https://evil.example" not in shown and "|your bank>" not in shown
    assert ">your bank</a>" not in render_html(report), "a link may show its own address, never a disguise"


def test_notes_on_how_a_report_was_made_are_in_every_footer() -> None:
    from research.report import Report, footer_lines, render_html, render_markdown

    report = Report(title="T", body_markdown="Body.", notes=["4 of the 12 best passages were left out to fit the "
                                                             "model's context window (8,192 tokens)."])

    assert any("left out to fit" in line for line in footer_lines(report))
    assert "left out to fit" in render_markdown(report) and "left out to fit" in render_html(report)


# -- what the exported page says about itself ------------------------------------------------------------------------

def test_html_says_when_the_report_was_written() -> None:
    written = dt.datetime(2025, 3, 1, 14, 5, 30, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    document = render_html(make_report(created_at=written))
    assert '<p class="written">Written <time datetime="2025-03-01T12:05Z">1 March 2025, 12:05 UTC</time></p>' in document
    assert document.index('class="written"') < document.index("<h2>Summary</h2>")


def test_a_cited_passage_is_shown_without_the_page_title_its_text_starts_with() -> None:
    report = make_report(cited_passages=[
        CitedPassage(id="p2", source_id="s2", source_number=1, text="Renewables 2024\nSolar grew by 45% in 2023."),
        CitedPassage(id="p3", source_id="s2", source_number=1, text="Renewables\nWind grew by 9% in 2023."),
        CitedPassage(id="p1", source_id="s1", source_number=2, text="Tower history of Paris\nOpened in 1889."),
    ])
    document = render_html(report)
    assert "<blockquote>Solar grew by 45% in 2023.</blockquote>" in document
    assert "<blockquote>Wind grew by 9% in 2023.</blockquote>" in document  # the heading is the title's first words
    # A first line that is not the source's title is the passage's own text.
    assert "<blockquote>Tower history of Paris Opened in 1889.</blockquote>" in document
    assert "Renewables 2024 Solar" not in document


def test_a_passage_that_is_only_the_title_keeps_it() -> None:
    report = make_report(cited_passages=[CitedPassage(id="p2", source_id="s2", source_number=1,
                                                      text="Renewables 2024")])
    assert "<blockquote>Renewables 2024</blockquote>" in render_html(report)


def test_no_cost_is_shown_when_the_run_cost_nothing_as_when_no_price_is_set() -> None:
    free = make_report(usage=UsageSummary(total_tokens=12_345, cost=0.0, seconds=41.2))
    for document in (render_markdown(free), render_html(free)):
        assert "12,345 tokens · 41 s" in document and "$" not in document
    assert "12,345 tokens · $0.0123 · 41 s" in render_html(make_report())
