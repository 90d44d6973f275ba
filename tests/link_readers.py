"""The links a reader of each output follows, read the way that reader reads them, for the tests of the link rule
(issue 24: a report links only to its sources, a streamed answer to nothing).

Each `hidden_*` function returns the links of one kind of output that go elsewhere than `sources` behind a label other
than their own address, as `(address, label)` pairs; a link that shows its address (an autolink, a bare URL made a
link) hides nothing. Markdown is read by deepthread's reader and by one that reads raw HTML and indented code (rich in
the terminal, most viewers of a .md file); HTML by an HTML parser; Slack mrkdwn as `<url|label>`; Discord as
simple-markdown reads masked links; the terminal from the hyperlinks rich draws.
"""

from __future__ import annotations

import html
import io
import re
from collections.abc import Collection
from html.parser import HTMLParser
from urllib.parse import unquote

from markdown_it import MarkdownIt
from rich.console import Console

from chat.console.messenger import renderable_for
from chat.message import Content
from research.markdown import PARSERS, links, read

Found = list[tuple[str, str]]


class _EveryTarget(MarkdownIt):
    """A CommonMark reader that follows a link wherever it points."""

    def validateLink(self, url: str) -> bool:
        return True


MARKDOWN_READERS = (PARSERS.every_link, _EveryTarget("commonmark", {"html": True}).enable(["table", "strikethrough"]))


def comparable(url: str) -> str:
    return unquote(html.unescape(url)).strip().rstrip("/").lower()


def hides(target: str, shown: str, sources: Collection[str] = ()) -> bool:
    """Whether a link to `target` showing `shown` hides where it goes: it goes to none of `sources` and shows
    something else than its address."""
    goes_to_a_source = comparable(target) in {comparable(source) for source in sources}
    shows_its_address = comparable(target) in (comparable(shown), comparable("mailto:" + shown))
    return not goes_to_a_source and not shows_its_address


def hidden_markdown_links(markdown: str, sources: Collection[str] = ()) -> Found:
    """Links, images and references of a Markdown text, as any of `MARKDOWN_READERS` reads it."""
    return [(link.target, link.text) for parser in MARKDOWN_READERS for link in links(read(markdown, parser))
            if link.kind != "autolink" and hides(link.target, link.text, sources)]


class Anchors(HTMLParser):
    """Each `<a>` of an HTML page: where it goes and the text it shows; and every tag seen."""

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


def anchors(page: str) -> Anchors:
    parser = Anchors()
    parser.feed(page)
    return parser


def hidden_anchors(page: str, sources: Collection[str] = ()) -> Found:
    """The `<a>`s of an HTML page (a link to a place in the page hides nothing)."""
    return [(href, shown) for href, shown in anchors(page).anchors
            if not href.startswith("#") and hides(href, shown, sources)]


_MRKDWN_LINK = re.compile(r"<([^<>|]*)\|([^<>]*)>")


def hidden_mrkdwn_links(text: str, sources: Collection[str] = ()) -> Found:
    """Slack mrkdwn links with a label, `<url|label>`."""
    return [(url, label) for url, label in _MRKDWN_LINK.findall(text) if hides(url, label, sources)]


# simple-markdown's masked link: a `[` not escaped, a label whose brackets need not balance, `](`, the address (in
# `<>` or not) and a quoted title. Code is not left out: Discord's code is not CommonMark's (no `~~~` fences, an
# unclosed fence is text, a code span may run over a blank line).
_MASKED_LINK = re.compile(
    r"\[((?:\[[^\]]*\]|[^\[\]]|\](?=[^\[]*\]))*)\]\(\s*<?((?:\([^)]*\)|[^\s\\]|\\.)*?)>?(?:\s+['\"]([\s\S]*?)['\"])?\s*\)")
_UNESCAPED = re.compile(r"\\([^0-9A-Za-z\s])")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")


def hidden_discord_links(text: str, sources: Collection[str] = ()) -> Found:
    """Discord's masked links `[label](url)` to an address with a scheme."""
    found = []
    for start, character in enumerate(text):
        before = text[:start]
        if character != "[" or (len(before) - len(before.rstrip("\\"))) % 2:
            continue
        if (match := _MASKED_LINK.match(text, start)) is None:
            continue
        url = _UNESCAPED.sub(r"\1", match.group(2))
        if _SCHEME.match(url) and hides(url, match.group(1), sources):
            found.append((url, match.group(1)))
    return found


def terminal_links(content: Content) -> Found:
    """The hyperlinks rich draws for a terminal message: where each goes and the text it shows."""
    console = Console(file=io.StringIO(), width=120, force_terminal=True, color_system="truecolor")
    shown: Found = []
    previous = None  # the link id of the segment before: a segment of the same link continues it
    for line in console.render_lines(renderable_for(content), pad=False):
        for segment in line:
            link = segment.style.link if segment.style is not None else None
            link_id = segment.style.link_id if link and segment.style is not None else None
            if link and link_id == previous:
                shown[-1] = (link, shown[-1][1] + segment.text)
            elif link:
                shown.append((link, segment.text))
            previous = link_id
    return shown


def hidden_terminal_links(content: Content, sources: Collection[str] = ()) -> Found:
    return [(link, text) for link, text in terminal_links(content) if hides(link, text.strip(), sources)]
