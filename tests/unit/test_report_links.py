"""A report links only to its cited sources, however its Markdown writes a link (issue 24, M2): every link a
reader would follow is made text unless it goes to a source, in every output: the report's Markdown, Slack, Discord,
the terminal and the exports. Examples of the spellings first, then any spelling Hypothesis writes."""

from __future__ import annotations

import html
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chat.console.render import ConsoleRenderer
from chat.discord.render import DiscordRenderer
from chat.slack.render import SlackRenderer, blocks_of
from research.markdown import links, read
from research.report import EXPORTERS, Report, ReportSource, only_source_links, render_html
from tests.link_readers import (
    Anchors,
    anchors,
    hidden_anchors,
    hidden_discord_links,
    hidden_markdown_links,
    hidden_mrkdwn_links,
    hidden_terminal_links,
)

SOURCE = "https://energy.example/report"
ELSEWHERE = "https://evil.example/login"


def report_with(body: str) -> Report:
    return Report(title="Solar", body_markdown=body,
                  sources=[ReportSource(number=1, source_id="s1", title="Renewables 2024", url=SOURCE)])


def link_targets(markdown: str) -> set[str]:
    """Where the links of a Markdown text go, as a CommonMark reader sees them (autolinks show their address)."""
    return {link.target for link in links(read(markdown)) if link.kind != "autolink"}


def html_anchors(report: Report) -> Anchors:
    return anchors(render_html(report))


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


# --- any link spelling, every renderer ------------------------------------------------------------

FOREIGN_URLS = ("https://evil.example/login", "HTTPS://Evil.Example/a?next=%2F&x=1", "https://evil.example/a_(b)",
                "javascript:alert(1)", "https://evil.example/ä")


def every_hidden_link(report: Report) -> dict[str, list[tuple[str, str]]]:
    """Each output of a report, read the way its reader reads it, and the links in it that hide where they go."""
    sources = [source.url for source in report.sources]
    found = {
        "report body": hidden_markdown_links(report.body_markdown, sources),
        "md export": hidden_markdown_links(EXPORTERS["md"](report), sources),
        "json export": hidden_markdown_links(json.loads(EXPORTERS["json"](report))["body_markdown"], sources),
        "html export": hidden_anchors(EXPORTERS["html"](report), sources),
        "terminal": [link for content in ConsoleRenderer().report(report, requester="u").messages
                     for link in hidden_terminal_links(content, sources)],
        "discord": [link for content in DiscordRenderer().report(report, requester="u").messages
                    for link in hidden_discord_links(content.text, sources)],
    }
    for use_markdown_blocks in (True, False):
        messages = SlackRenderer(use_markdown_blocks=use_markdown_blocks).report(report, requester="u").messages
        mrkdwn = [text for content in messages for text in [content.text, *(
            block["text"]["text"] for block in blocks_of(content) or [] if block["type"] == "section")]]
        markdown = [block["text"] for content in messages for block in blocks_of(content) or []
                    if block["type"] == "markdown"]
        found[f"slack mrkdwn (markdown blocks {use_markdown_blocks})"] = [
            link for text in mrkdwn for link in hidden_mrkdwn_links(text, sources)]
        # Read as written, and with `&amp; &lt; &gt;` read as the characters.
        found[f"slack markdown block (markdown blocks {use_markdown_blocks})"] = [
            link for text in markdown for read_as in (text, html.unescape(text))
            for link in hidden_markdown_links(read_as, sources)]
    return {output: hidden for output, hidden in found.items() if hidden}


def _spelled(url: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """A link destination as CommonMark lets it be written: bare, in angle brackets, with a title."""
    title = st.sampled_from(["", ' "Bank"', " 'Bank'", " (Bank)", '\n"Bank"', '  "a \\" b"'])
    destination = st.one_of(url, url.map(lambda address: f"<{address}>"))
    return st.tuples(destination, title).map("".join)


LABEL_PIECES = st.sampled_from(["your bank", "log in", "[bank]", "\\]", "\\[", "*now*", "`code`", "\n", " ", "[",
                                "]", "![icon](https://evil.example/i.png)", "[x](https://evil.example/x)",
                                '<b title="]">', "<span>", "&#91;", "\\", "[1]"])
LABELS = st.lists(LABEL_PIECES, min_size=1, max_size=5).map("".join)
REFERENCE_LABELS = st.sampled_from(["login", "Your Bank", "your\nbank", "1", "a  b", "ÄÖ"])


@st.composite
def link_spellings(draw: st.DrawFn) -> str:
    """One link, image or reference written any way CommonMark allows, to the source or (mostly) elsewhere."""
    url = st.sampled_from([*FOREIGN_URLS, SOURCE]) if draw(st.integers(0, 4)) == 0 else st.sampled_from(FOREIGN_URLS)
    label, reference = draw(LABELS), draw(REFERENCE_LABELS)
    destination = draw(_spelled(url))
    definition = draw(st.sampled_from(["[{ref}]: {dest}", "   [{ref}]:\n{dest}", "[{ref}]: {dest}\n", "> [{ref}]: {dest}",
                                       "- [{ref}]: {dest}"]))
    form = draw(st.sampled_from(["inline", "image", "full", "collapsed", "shortcut", "autolink", "padded"]))
    if form == "inline":
        return f"[{label}]({destination})"
    if form == "padded":
        return f"[{label}](\n  {destination}\n)"
    if form == "image":
        return f"![{label}]({destination})"
    if form == "autolink":
        return f"<{draw(url)}>"
    used = {"full": f"[{label}][{reference}]", "collapsed": f"[{reference}][]", "shortcut": f"[{reference}]"}[form]
    return used + "\n\n" + definition.format(ref=reference.replace("\n", " ") if draw(st.booleans()) else reference,
                                             dest=destination)


CONTEXTS = st.sampled_from(["{}", "> {}", "- {}", "1. {}", "# {}", "*{}*", "**{}**", "[outer {}](https://evil.example/o)",
                            "| a | b |\n|---|---|\n| {} | c |", "| a |\n|---|\n| x | {} |", "    {}", "`x` {} `y`",
                            "~~~\n{}\n~~~", "```\n{}", "` {}", "{}\n===", "Text\n{}", "<div>\n{}\n</div>",
                            "\\{}", "!{}", "[{}"])
SOUP = st.lists(st.sampled_from([*"[]()<>!\\`*_ \n\"':|", "https://evil.example/x", SOURCE, "[1]", "](", "]:",
                                 '<b title="]">', "~~~", "```", "    ", "> ", "- "]), max_size=40).map("".join)


@st.composite
def bodies(draw: st.DrawFn) -> str:
    """A report body: a link to the source, then links spelled every which way and a soup of link syntax."""
    parts = [draw(CONTEXTS).format(draw(link_spellings())) for _ in range(draw(st.integers(1, 4)))]
    if draw(st.booleans()):
        parts.append(draw(SOUP))
    joiners = draw(st.lists(st.sampled_from([" ", "\n", "\n\n"]), min_size=len(parts), max_size=len(parts)))
    return KEPT_PARAGRAPH + "\n\n" + "".join(part + joiner for part, joiner in zip(parts, joiners))


KEPT_PARAGRAPH = f"See [the report]({SOURCE}) [1]."


# A page's title is the page's to write, and a report's title the model's.
TITLES = st.one_of(st.just("Renewables 2024"), st.lists(link_spellings(), min_size=1, max_size=2).map(" ".join))


def assert_links_only_to_the_source(body: str, title: str, source_title: str, mode: str) -> None:
    report = Report(title=title, body_markdown=body, mode=mode, sources=[
        ReportSource(number=1, source_id="s1", title=source_title, url=SOURCE)])
    assert every_hidden_link(report) == {}
    assert report.body_markdown.startswith(KEPT_PARAGRAPH), "a link to the source stays a link"
    assert (SOURCE, "the report") in anchors(render_html(report)).anchors
    assert f"[the report]({SOURCE})" in DiscordRenderer().report(report, requester="u").messages[0].text


@settings(max_examples=200, deadline=None)
@given(body=bodies(), title=TITLES, source_title=TITLES, mode=st.sampled_from(["research", "chat", "followup"]))
def test_no_link_spelling_hides_a_link_elsewhere_in_any_output(body: str, title: str, source_title: str,
                                                                mode: str) -> None:
    assert_links_only_to_the_source(body, title, source_title, mode)


# What Hypothesis found, each kept to be tried every time.
FOUND = {
    "Discord reads a label past a heading's end": "# [your bank](https://evil.example/login) [your bank](\n  "
                                                  "https://evil.example/login\n)",
    "a tag hides a ] from an HTML reader": '[<b title="]">](https://evil.example/login)',
    "an indented line ends a code span early": "    `x\n[your bank](https://evil.example/login)`",
    "Slack's escaping breaks a source's <address>": "[your bank](<https://energy.example/report>)",
    "Slack's escaping makes a definition": "*[your bank][login]\n\n[login]: <https://evil.example/login>*",
    "Slack's escaping unquotes a definition": "*[your bank][login]\n\n> [login]: <https://evil.example/login>*",
}


@pytest.mark.parametrize("body", list(FOUND.values()), ids=list(FOUND))
def test_a_bypass_hypothesis_found_stays_closed(body: str) -> None:
    assert_links_only_to_the_source(f"{KEPT_PARAGRAPH}\n\n{body}", "Solar", "Renewables 2024", "research")


def test_a_source_link_with_its_address_in_angle_brackets_stays_a_link_in_slack() -> None:
    report = report_with("See [the agency](<https://energy.example/report> \"IEA\") [1].")
    [block] = [block["text"] for content in SlackRenderer().report(report, requester="u").messages
               for block in blocks_of(content) or [] if block["type"] == "markdown"]
    assert "[the agency](https://energy.example/report)" in block


def test_titles_and_notes_link_nowhere_in_the_markdown_export_or_the_terminal() -> None:
    report = Report(title="[Solar](https://evil.example/t)", body_markdown=KEPT_PARAGRAPH,
                    notes=["[a note](https://evil.example/n)"], partial=True, partial_reason="[why](https://evil.example/w)",
                    sources=[ReportSource(number=1, source_id="s1", title="[your bank](https://evil.example/login)",
                                          url=SOURCE)])
    assert every_hidden_link(report) == {}
    assert "# \\[Solar\\](https://evil.example/t)" in EXPORTERS["md"](report), "a title shows as it was written"
