"""A report links only to its cited sources, however its Markdown writes a link (issue 24, M2): every link the
parser reads is made text unless it goes to a source, on every platform and in the HTML export."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest

from chat.discord.render import DiscordRenderer
from chat.slack.render import SlackRenderer, blocks_of
from research.markdown import links, read
from research.report import Report, ReportSource, only_source_links, render_html

SOURCE = "https://energy.example/report"
ELSEWHERE = "https://evil.example/login"


def report_with(body: str) -> Report:
    return Report(title="Solar", body_markdown=body,
                  sources=[ReportSource(number=1, source_id="s1", title="Renewables 2024", url=SOURCE)])


def link_targets(markdown: str) -> set[str]:
    """Where the links of a Markdown text go, as a CommonMark reader sees them (autolinks show their address)."""
    return {link.target for link in links(read(markdown)) if link.kind != "autolink"}


class _Anchors(HTMLParser):
    """Each `<a>` of an HTML page: where it goes and the text it shows."""

    def __init__(self) -> None:
        super().__init__()
        self.anchors: list[tuple[str, str]] = []
        self.tags: set[str] = set()
        self._open: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        if tag == "a":
            self._open = dict(attrs).get("href") or ""
            self.anchors.append((self._open, ""))

    def handle_endtag(self, tag: str) -> None:
        if tag == "a":
            self._open = None

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            href, shown = self.anchors[-1]
            self.anchors[-1] = (href, shown + data)


def html_anchors(report: Report) -> _Anchors:
    parser = _Anchors()
    parser.feed(render_html(report))
    return parser


def markdown_texts(report: Report) -> list[str]:
    """The report as the platforms that read Markdown get it: Slack's `markdown` block, Discord's messages."""
    texts = [block["text"].replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
             for content in SlackRenderer().report(report, requester="u").messages
             for block in blocks_of(content) or [] if block["type"] == "markdown"]
    texts.extend(content.text for content in DiscordRenderer().report(report, requester="u").messages)
    return texts


def mrkdwn_texts(report: Report) -> list[str]:
    """The report as Slack mrkdwn: the messages' fallback text and their sections."""
    return [text for content in SlackRenderer(use_markdown_blocks=False).report(report, requester="u").messages
            for text in [content.text, *(block["text"]["text"] for block in blocks_of(content) or []
                                         if block["type"] == "section")]]


def assert_no_disguised_link(report: Report) -> None:
    """No link anywhere goes elsewhere than a source behind a label; a link may show its own address."""
    assert link_targets(report.body_markdown) <= {SOURCE}, report.body_markdown
    for href, shown in html_anchors(report).anchors:
        assert href.startswith("#") or href == SOURCE or shown == href, (href, shown)
    for text in markdown_texts(report):
        assert link_targets(text) <= {SOURCE}, text
    for text in mrkdwn_texts(report):
        assert f"<{ELSEWHERE}|" not in text, text  # a Slack link with a label of its own


BYPASSES = {
    "nested brackets": ("Log in at [your [bank] account](https://evil.example/login) now [1].",
                        "your [bank] account (https://evil.example/login)"),
    "an escaped bracket": ("Log in at [your \\] bank](https://evil.example/login) now [1].",
                           "your \\] bank (https://evil.example/login)"),
    "a label across two lines": ("Log in at [your\nbank](https://evil.example/login) now [1].",
                                 "your\nbank (https://evil.example/login)"),
    "a quoted label across two lines": ("> Log in at [your\n> bank](https://evil.example/login) now [1].",
                                        "> Log in at your\n> bank (https://evil.example/login) now [1]."),
    "a reference-style link": ("Log in at [your bank][login] now [1].\n\n[login]: https://evil.example/login",
                               "\\[login]: https://evil.example/login"),
    "a collapsed reference": ("Log in at [your bank][] now [1].\n\n[Your Bank]: <https://evil.example/login> 'Bank'",
                              "\\[Your Bank]: <https://evil.example/login>"),
}


@pytest.mark.parametrize(("body", "shown"), list(BYPASSES.values()), ids=list(BYPASSES))
def test_a_link_elsewhere_is_made_text_however_it_is_written(body: str, shown: str) -> None:
    report = report_with(body)
    assert shown in report.body_markdown, "the reader still sees where it went"
    assert_no_disguised_link(report)


def test_a_citation_stays_a_citation_when_a_definition_names_it_elsewhere() -> None:
    report = report_with("Solar grew by 45% [1].\n\n[1]: https://evil.example/login")
    assert report.body_markdown == "Solar grew by 45% [1].\n\n\\[1]: https://evil.example/login"
    assert '<a class="cite" href="#source-1">[1]</a>' in render_html(report)
    assert_no_disguised_link(report)


def test_a_cell_a_table_drops_is_read_as_a_platform_without_tables_shows_it() -> None:
    report = report_with("| Year | Growth |\n|---|---|\n| 2023 | 45% [1] | [your bank](https://evil.example/login) |")
    assert "| [your bank](" not in report.body_markdown and "your bank (https://evil.example/login)" in report.body_markdown
    assert_no_disguised_link(report)


def test_an_image_from_elsewhere_is_its_description_and_address() -> None:
    report = report_with("Chart: ![growth](https://evil.example/pixel.png) [1].")
    assert "Chart: growth (https://evil.example/pixel.png) [1]." in report.body_markdown
    assert "img" not in html_anchors(report).tags
    assert_no_disguised_link(report)


def test_links_to_sources_and_links_in_code_stay_as_they_are() -> None:
    body = ("See [the agency][agency] and [the report](https://energy.example/report/) [1]. "
            "Code `[x](https://evil.example/login)` stays.\n\n```\n[a](https://evil.example/login)\n```\n\n"
            "[agency]: https://energy.example/report")
    assert only_source_links(body, [SOURCE]) == body
    assert only_source_links(body, []) != body


def test_a_link_that_commonmark_would_not_follow_is_made_text_too() -> None:
    report = report_with("See [click](javascript:alert(1)) and [files](ftp://files.example/x) [1].")
    assert report.body_markdown == "See click (javascript:alert(1)) and files (ftp://files.example/x) [1]."
