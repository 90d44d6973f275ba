"""The delivered report and its renderings: Markdown, self-contained HTML (no script) and JSON."""

from __future__ import annotations

from typing import Any, Literal

import datetime as dt
import html
import re
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, computed_field, model_validator

from research.markdown import (
    PARSERS,
    Document,
    definitions,
    is_atx,
    links,
    read,
    read_inline,
    replaced,
)

from research.changes import Change
from research.models import ModelUsage

STOPPED_BY_USER_LINE = "[Research stopped by user]"
STOPPED_TITLE = "Research stopped"
INCOMPLETE_TITLE = "Research incomplete"
# A title names its question, but a title is a line, not a paragraph.
TITLE_QUESTION_CHARS = 80
SNIPPET_LABEL = "search snippet"
SEPARATOR = " · "
# A plan or a chat answer cites nothing, so it has no audit line.
UNAUDITED_MODES = frozenset({"plan", "chat"})


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class SourceFile(BaseModel):
    """What a report says of a source that is a file shared in the conversation, not a web page."""

    name: str
    kind: str  # research.files.FileKind
    size: int
    sha256: str


class ReportSource(BaseModel):
    """A source as the reader sees it: its number `[n]` in order of first use, and the passages cited from it.

    A shared file's source has `file` set, `url` its link on its platform (empty in the terminal), and for a PDF
    the `pages` its cited passages are on; its `title` names the file, its kind and those pages.
    """

    number: int
    source_id: str
    title: str
    url: str
    provider: str = ""
    passages_used: list[str] = Field(default_factory=list)
    snippet_only: bool = False
    file: SourceFile | None = None
    pages: list[int] = Field(default_factory=list)


class CitedPassage(BaseModel):
    """The text of a passage the report cites, kept so that a reader can check the claim.

    `added_by_audit` is True when the audit, not the model, cited it for sentences the model left uncited: those
    sentences are in `added_to` (as plain text), and the passage states each of them (research.audit).
    """

    id: str
    source_id: str
    source_number: int
    text: str
    is_snippet: bool = False
    added_by_audit: bool = False
    added_to: list[str] = Field(default_factory=list)


class AuditFigures(BaseModel):
    """What the citation audit found; `sentences_total` counts claims only (research.audit.sentences says which
    lines are), `citations_added` the cites the audit gave uncited claims that a shown passage clearly states."""

    sentences_total: int = 0
    sentences_verified: int = 0
    sentences_unverified: int = 0
    citations_checked: int = 0
    citations_supported: int = 0
    citations_removed: int = 0
    fabricated_removed: int = 0
    judged_by_llm: int = 0
    citations_added: int = 0


class UsageSummary(BaseModel):
    """What the run spent: LLM calls and tokens per model, cost, searches per provider, pages, bytes, time."""

    llm: dict[str, ModelUsage] = Field(default_factory=dict)
    total_tokens: int = 0
    cost: float = 0.0
    search_calls: dict[str, int] = Field(default_factory=dict)
    pages_fetched: int = 0
    bytes_fetched: int = 0
    seconds: float = 0.0

    @computed_field  # type: ignore[prop-decorator]  # mypy cannot follow a decorator over a property (pydantic's docs)
    @property
    def tokens_estimated(self) -> bool:
        """Whether some token counts were estimated from text length (the endpoint sent no `usage`)."""
        return any(usage.estimated_calls for usage in self.llm.values())


class WatchComparison(BaseModel):
    """How a watch's run compares with the watch's previous run (`previous_run_id`, finished `since`): the changes
    deepthread computed itself (`research.changes`); the report opens with them, each cited."""

    previous_run_id: int
    since: dt.datetime | None = None
    changes: list[Change] = Field(default_factory=list)
    watch_id: int | None = None
    schedule: str = ""  # when the watch runs, in words


class Report(BaseModel):
    """A finished (or partial) report: body with `[n]` citations, sources, cited passages, audit and usage."""

    run_id: int | None = None
    title: str
    question: str = ""
    mode: str = "research"
    body_markdown: str
    sources: list[ReportSource] = Field(default_factory=list)
    cited_passages: list[CitedPassage] = Field(default_factory=list)
    audit: AuditFigures = Field(default_factory=AuditFigures)
    usage: UsageSummary = Field(default_factory=UsageSummary)
    phase_seconds: dict[str, float] = Field(default_factory=dict)
    partial: bool = False
    partial_reason: str | None = None
    skipped_providers: dict[str, str] = Field(default_factory=dict)
    stopped_by_user: bool = False
    plan: dict[str, Any] | None = None
    model: str | None = None  # the LLM that wrote it, named in the honest-framing line
    # False when no model wrote any of the body: the engine's own notice, the pages a stopped run had read, a digest
    # of quotes. Such a report does not say "Written by AI".
    written_by_ai: bool = True
    # What the reader should know about how it was made, in plain words (e.g. passages left out to fit the model).
    notes: list[str] = Field(default_factory=list)
    watch: WatchComparison | None = None  # a watch's run: what changed since its previous one
    created_at: dt.datetime = Field(default_factory=_now)

    @model_validator(mode="after")
    def _only_source_links(self) -> "Report":
        # A model, or a page steering it, must not hide where a link goes behind any label it likes.
        self.body_markdown = only_source_links(self.body_markdown, [source.url for source in self.sources])
        return self


def _comparable_url(url: str) -> str:
    return url.strip().rstrip("/").lower()


def only_source_links(markdown: str, source_urls: list[str]) -> str:
    """`markdown` with every link whose target is not one of `source_urls` written as its label and its address
    in plain text (`label (https://…)`); links to the sources, autolinks (`<https://…>`, which show their address),
    and anything in code stay as they are.

    Every link markdown-it-py reads counts, whatever its target: inline or reference-style, brackets nested or
    escaped in its label, a label across lines, an image; a reference definition to anywhere else is made text, and a
    table row is also read as one line of text, as a platform without tables (Discord) shows it. The text is read as
    deepthread reads Markdown and as a reader of raw HTML and indented code does (`LINK_READERS`).
    """
    allowed = {_comparable_url(url) for url in source_urls if url}
    allowed |= {_comparable_url(PARSERS.markdown.normalizeLink(url.strip())) for url in source_urls if url}
    # How the renderers write a source's address in a link: its parentheses encoded.
    allowed |= {_comparable_url(url.replace("(", "%28").replace(")", "%29")) for url in allowed}
    for attempt in range(_LINK_PASSES):
        # A label made text may close brackets around it into another link: read again until none is left.
        for reader in PARSERS.link_readers:
            document = read(markdown, reader)
            edits = _unlisted_link_edits(document, allowed, bluntly=attempt == _LINK_PASSES - 1)
            if edits:
                markdown = replaced(document.source, edits)
                break
        else:
            return markdown
    return markdown


_LINK_PASSES = 8


def _unlisted_link_edits(document: Document, allowed: set[str], *, bluntly: bool) -> list[tuple[int, int, str]]:
    """The edits that make every link to an address not `allowed` text: its label and address, or (`bluntly`, or
    where the parser's text was not found in the source) every `[` of its lines escaped."""
    # A definition to anywhere else is made text first: `[1]` then stays a citation rather than a link to it.
    unlisted_definitions = [line for definition in definitions(document)
                            if _comparable_url(definition.target) not in allowed
                            for line in _escaped_brackets(document, definition.lines[0], definition.lines[0] + 1)[:1]]
    if unlisted_definitions and not bluntly:
        return unlisted_definitions
    # Each link with the offset its span counts from and the source lines it is on.
    found = [(0, link.lines, link) for link in links(document)]
    for token in document.tokens:
        if token.type == "tr_open" and token.map is not None and "](" in document.lines[token.map[0]]:
            row = token.map[0]
            found.extend((document.line_starts[row], (row, row + 1), link)
                         for link in links(read_inline(document.lines[row], PARSERS.every_link)))
    edits: list[tuple[int, int, str]] = []
    for offset, lines, link in found:
        if link.kind == "autolink" or _comparable_url(link.target) in allowed:
            continue
        if link.span is None or link.label is None or bluntly:
            edits.extend(_escaped_brackets(document, *lines))
            continue
        label = document.source[offset + link.label[0]:offset + link.label[1]]
        edits.append((offset + link.span[0], offset + link.span[1], f"{label} ({link.target})"))
    return edits + unlisted_definitions


def _escaped_brackets(document: Document, first: int, end: int) -> list[tuple[int, int, str]]:
    """Every `[` of lines `first` to `end` (not included) that is not escaped yet, escaped: no link starts there."""
    start, stop = document.line_range(first, end)
    source = document.source
    edits = []
    for position in range(start, stop):
        if source[position] != "[":
            continue
        backslashes = 0
        while backslashes < position and source[position - backslashes - 1] == "\\":
            backslashes += 1
        if backslashes % 2 == 0:
            edits.append((position, position + 1, "\\["))
    return edits


# --- shared pieces -------------------------------------------------------------------------------

def split_title(markdown: str) -> tuple[str | None, str]:
    """The text of the Markdown's leading `# ` heading (if its first non-blank line is one) and the rest."""
    lines = markdown.splitlines()
    for index, line in enumerate(lines):
        if not line.strip():
            continue
        # A first line is a heading or not by itself: the rest need not be read.
        tokens = read(line.strip()).tokens
        is_title = len(tokens) > 1 and tokens[0].tag == "h1" and is_atx(tokens[0]) and tokens[1].content
        if not is_title:
            return None, markdown
        return tokens[1].content, "\n".join(lines[index + 1:]).strip("\n")
    return None, markdown


def shortened(text: str, limit: int) -> str:
    """`text` on one line, cut at a word boundary to at most `limit` characters with "…" when it was longer."""
    line = _single_line(text)
    if len(line) <= limit:
        return line
    cut = line[:limit - 1]
    if " " in cut:
        cut = cut.rsplit(" ", 1)[0]
    return cut.rstrip(" ,;:.-") + "…"


def unfinished_title(question: str, *, stopped_by_user: bool) -> str:
    """The title of a report that was never written, e.g. "Research stopped: Why is the sky blue?"."""
    prefix = STOPPED_TITLE if stopped_by_user else INCOMPLETE_TITLE
    return f"{prefix}: {shortened(question, TITLE_QUESTION_CHARS)}" if question.strip() else prefix


def shown_title(report: Report) -> str:
    """The title a reader sees: the body's own `# ` heading when it has one, else `report.title`."""
    own_title, _ = split_title(report.body_markdown)
    return _single_line(own_title or report.title)


def stopped_line(report: Report) -> str | None:
    """The "[Research stopped by user]" line under a stopped report, or None when its title already says so."""
    if not report.stopped_by_user or shown_title(report).startswith(STOPPED_TITLE):
        return None
    return STOPPED_BY_USER_LINE


def _plural(count: int, singular: str, plural: str | None = None) -> str:
    return f"{count:,} {singular if count == 1 else (plural or singular + 's')}"


def audit_line(report: Report) -> str:
    """The footer's audit line, e.g. "18 of 20 sentences verified · 1 citation removed · brave skipped: rate limited";
    empty when nothing was audited and nothing skipped."""
    if report.mode in UNAUDITED_MODES:
        return ""
    audit = report.audit
    parts: list[str] = []
    # A report that audited no sentence (an engine notice, a stopped run) has no verified count to show.
    if audit.sentences_total:
        parts.append(f"{audit.sentences_verified:,} of {_plural(audit.sentences_total, 'sentence')} verified")
    if audit.citations_removed:
        parts.append(f"{_plural(audit.citations_removed, 'citation')} removed")
    if audit.fabricated_removed:
        parts.append(f"{_plural(audit.fabricated_removed, 'fabricated citation')} removed")
    if audit.sentences_unverified:
        parts.append(f"{_plural(audit.sentences_unverified, 'sentence')} unverified")
    if audit.citations_added:
        parts.append(f"{_plural(audit.citations_added, 'citation')} added by the audit")
    parts.extend(f"{provider} skipped: {reason}" for provider, reason in report.skipped_providers.items())
    return SEPARATOR.join(parts)


def _format_seconds(seconds: float) -> str:
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    minutes, rest = divmod(whole, 60)
    return f"{minutes} min {rest} s"


def usage_line(report: Report) -> str:
    """The footer's usage line, e.g. "12,345 tokens · $0.0123 · 41 s" ("≈12,345 tokens (estimated) …" when the
    endpoint did not report usage); no cost when it cost nothing, as when no price is set (LLM_PRICE_*)."""
    usage = report.usage
    tokens = _plural(usage.total_tokens, "token")
    if usage.tokens_estimated:
        tokens = f"≈{tokens} (estimated)"
    cost = [f"${usage.cost:,.4f}"] if usage.cost > 0 else []
    return SEPARATOR.join([tokens, *cost, _format_seconds(usage.seconds)])


def ai_framing_line(report: Report) -> str:
    """The line that says an AI wrote this (naming the model when known) and what it was written from: the sources
    listed; pages the run read but the report does not cite; or no web source at all. Empty when no AI wrote any of
    it."""
    if not report.written_by_ai:
        return ""
    model = _single_line(report.model or "")
    author = f"Written by AI ({model})" if model else "Written by AI"
    if report.sources and (report.cited_passages or re.search(r"\[\d+\]", report.body_markdown)):
        return f"{author} from the sources listed — check the citations."
    read = max(report.usage.pages_fetched, len(report.sources))
    if read:
        return (f"{author} after reading {_plural(read, 'web page')}, but it cites none of them "
                "— check it before relying on it.")
    return f"{author} without web sources — check it before relying on it."


def note_lines(report: Report) -> list[str]:
    """The report's notes on how it was made (e.g. passages left out to fit the model), one line each."""
    return [f"ℹ️ {_single_line(note)}" for note in report.notes if note.strip()]


def footer_lines(report: Report) -> list[str]:
    """The lines under a report: who wrote it (an AI, which model), the partial notice, notes on how it was made,
    the citation audit, the usage."""
    return [line for line in (ai_framing_line(report), partial_notice(report), *note_lines(report), audit_line(report),
                              usage_line(report), watch_line(report)) if line]


def watch_line(report: Report) -> str | None:
    """`🔭 Watch #3, every Monday at 09:00 (Europe/Paris): compared with run 12.` under a watch's run; else None."""
    watch = report.watch
    if watch is None:
        return None
    name = f"Watch #{watch.watch_id}" if watch.watch_id is not None else "A watch"
    schedule = f", {watch.schedule}" if watch.schedule else ""
    return f"🔭 {name}{schedule}: compared with run {watch.previous_run_id}."


def partial_notice(report: Report) -> str | None:
    """The sentence that says the report is partial and why, or None for a complete report and for a stopped one
    (its title or "[Research stopped by user]" says so)."""
    if not report.partial or report.stopped_by_user:
        return None
    reason = _single_line(report.partial_reason or "").rstrip(".")
    return f"⚠️ Partial report: {reason}." if reason else "⚠️ Partial report."


def _single_line(text: str) -> str:
    return " ".join(text.split())


def _body_without_duplicate_title(report: Report) -> tuple[bool, str]:
    """Whether the body already opens with its own `# ` title, and the body stripped of edge blank lines."""
    title, _ = split_title(report.body_markdown)
    return title is not None, report.body_markdown.strip("\n")


# --- Markdown ------------------------------------------------------------------------------------

_LINK_MARKUP = re.compile(r"([\\\[\]<])")


def _as_markdown_text(text: str) -> str:
    """Plain text (a page's title, the model's) for Markdown, its backslashes, brackets and `<` escaped: a title shows
    as written and starts no link."""
    return _LINK_MARKUP.sub(r"\\\1", text)


def _markdown_source_line(source: ReportSource) -> str:
    title = _as_markdown_text(_single_line(source.title) or source.url)
    url = _as_markdown_text(source.url)
    line = f"[{source.number}] {title} — {url}" if source.url else f"[{source.number}] {title}"
    return f"{line} ({SNIPPET_LABEL})" if source.snippet_only else line


def render_markdown(report: Report) -> str:
    """The report as Markdown: title, body, numbered sources, then the audit and usage footer."""
    has_own_title, body = _body_without_duplicate_title(report)
    sections: list[str] = []
    if not has_own_title:
        sections.append(f"# {_as_markdown_text(_single_line(report.title))}")
    if body:
        sections.append(body)
    if report.sources:
        # Two trailing spaces make a hard line break, so each source stays on its own line everywhere.
        sections.append("## Sources\n\n" + "  \n".join(_markdown_source_line(source) for source in report.sources))
    sections.append("---\n\n" + "  \n".join(_as_markdown_text(line) for line in footer_lines(report)))
    if stopped := stopped_line(report):
        sections.append(stopped)
    return "\n\n".join(sections) + "\n"


# --- HTML ----------------------------------------------------------------------------------------

_STYLE = """
body { font-family: -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; line-height: 1.55;
       max-width: 46rem; margin: 2rem auto; padding: 0 1rem; color: #1f2328; }
h1, h2, h3 { line-height: 1.25; }
a { color: #0969da; }
a.cite { text-decoration: none; font-size: 0.85em; vertical-align: super; }
.question { color: #59636e; font-style: italic; }
.written { color: #59636e; font-size: 0.9em; }
.sources { list-style: none; padding-left: 0; }
.sources li { margin-bottom: 0.4rem; overflow-wrap: anywhere; }
.sources .url, .sources .provider { color: #59636e; font-size: 0.9em; }
.passages summary { cursor: pointer; color: #59636e; font-size: 0.9em; }
.passages ul { list-style: disc; padding-left: 1.25rem; }
.passages blockquote { margin: 0.25rem 0; font-size: 0.9em; }
.snippet { background: #fff8c5; border-radius: 0.25rem; padding: 0 0.3rem; font-size: 0.85em; }
.partial { background: #fff8c5; padding: 0.5rem 0.75rem; border-radius: 0.25rem; }
footer { border-top: 1px solid #d1d9e0; margin-top: 2rem; padding-top: 0.75rem; color: #59636e; font-size: 0.9em; }
pre { background: #f6f8fa; padding: 0.75rem; overflow-x: auto; }
table { border-collapse: collapse; } th, td { border: 1px solid #d1d9e0; padding: 0.25rem 0.5rem; }
blockquote { border-left: 0.25rem solid #d1d9e0; margin-left: 0; padding-left: 1rem; color: #59636e; }
"""

_ALLOWED_SCHEMES = frozenset({"http", "https"})


def safe_http_url(url: str) -> str | None:
    """`url` if it is an absolute http(s) URL without whitespace or control characters, else None."""
    candidate = url.strip()
    if not candidate or any(character.isspace() or ord(character) < 32 or ord(character) == 127 for character in candidate):
        return None
    try:
        parts = urlsplit(candidate)
    except ValueError:
        return None
    if parts.scheme.lower() not in _ALLOWED_SCHEMES or not parts.netloc:
        return None
    return candidate


def _escape(text: str) -> str:
    return html.escape(text, quote=True)


def _link(url: str, text_html: str, *, css_class: str | None = None) -> str:
    class_attribute = f' class="{css_class}"' if css_class else ""
    return f'<a{class_attribute} href="{_escape(url)}" rel="noopener noreferrer nofollow">{text_html}</a>'


BARE_URL = re.compile(r"\bhttps?://[^\s<>()\[\]\"'`]+", re.IGNORECASE)
_CITATION = re.compile(r"\[(\d{1,4})\]")
_TRAILING_URL_PUNCTUATION = ".,;:!?"


def url_pieces(text: str, bare_url: re.Pattern[str] = BARE_URL) -> list[tuple[str, str | None]]:
    """`text` cut around the bare http(s) URLs in it (trailing punctuation is not part of one): each piece with its
    URL, or with None for the text between them."""
    pieces: list[tuple[str, str | None]] = []
    position = 0
    for match in bare_url.finditer(text):
        trimmed = match.group(0).rstrip(_TRAILING_URL_PUNCTUATION)
        url = safe_http_url(trimmed)
        if url is None:
            continue
        pieces.extend([(text[position:match.start()], None), (trimmed, url)])
        position = match.start() + len(trimmed)
    pieces.append((text[position:], None))
    return [(piece, url) for piece, url in pieces if piece]


def text_html(text: str) -> str:
    """Text as HTML: escaped, with its bare http(s) URLs linked and its `[n]` citations linked to their source."""
    pieces: list[str] = []
    for piece, url in url_pieces(text):
        if url is not None:
            pieces.append(_link(url, _escape(url)))
            continue
        position = 0
        for citation in _CITATION.finditer(piece):
            pieces.extend([_escape(piece[position:citation.start()]), _link_to_source(int(citation.group(1)))])
            position = citation.end()
        pieces.append(_escape(piece[position:]))
    return "".join(pieces)


def _link_to_source(number: int) -> str:
    return f'<a class="cite" href="#source-{number}">[{number}]</a>'


def passage_without_title(text: str, title: str) -> str:
    """A passage's text without the page's title that extraction put on its first line (a page's heading is the first
    line of its text): shown under the source's title, it would read glued to the passage's first sentence."""
    first_line, _, rest = text.strip().partition("\n")
    heading, title = _single_line(first_line).casefold(), _single_line(title).casefold()
    # "Tidal power" opens the text of a page titled "Tidal power - Wikipedia" too.
    if rest.strip() and heading and (heading == title or title.startswith(heading + " ")):
        return rest.strip()
    return text


def _html_cited_passages(passages: Sequence[CitedPassage], title: str) -> str:
    """A collapsed list of the passages the report cites from one source, so a reader can check the claims."""
    if not passages:
        return ""
    items = "".join(
        f"<li><blockquote>{_escape(_single_line(passage_without_title(passage.text, title)))}</blockquote>"
        + (f' <span class="snippet">{SNIPPET_LABEL}</span>' if passage.is_snippet else "") + "</li>"
        for passage in passages)
    summary = "Cited passage" if len(passages) == 1 else f"{len(passages)} cited passages"
    return f'<details class="passages"><summary>{summary}</summary><ul>{items}</ul></details>'


def _html_source_item(source: ReportSource, passages: Sequence[CitedPassage]) -> str:
    title = _escape(_single_line(source.title) or source.url or source.source_id)
    url = safe_http_url(source.url)
    if url is not None:
        parts = [_link(url, title), f'<span class="url">{_escape(url)}</span>']
    else:
        parts = [title] + ([f'<span class="url">{_escape(source.url)}</span>'] if source.url else [])
    if source.provider and source.file is None:
        parts.append(f'<span class="provider">via {_escape(source.provider)}</span>')
    if source.snippet_only:
        parts.append(f'<span class="snippet">{SNIPPET_LABEL}</span>')
    # The list is not numbered by the browser: "[n]" is the number, as in the body's citations.
    return (f'<li id="source-{source.number}"><span class="number">[{source.number}]</span> ' + " ".join(parts)
            + _html_cited_passages(passages, source.title) + "</li>")


def _html_footer(report: Report) -> str:
    lines = [f'<p class="ai-framing">{_escape(framing)}</p>' for framing in [ai_framing_line(report)] if framing]
    lines.extend(f'<p class="partial">{_escape(notice)}</p>' for notice in [partial_notice(report)] if notice)
    lines.extend(f'<p class="note">{_escape(note)}</p>' for note in note_lines(report))
    if audit_line(report):
        lines.append(f'<p class="audit">{_escape(audit_line(report))}</p>')
    lines.append(f'<p class="usage">{_escape(usage_line(report))}</p>')
    if stopped := stopped_line(report):
        lines.append(f'<p class="stopped"><strong>{_escape(stopped)}</strong></p>')
    return "<footer>\n" + "\n".join(lines) + "\n</footer>"


def _html_written_at(created_at: dt.datetime) -> str:
    """When the report was written, in UTC, e.g. "Written 1 March 2025, 14:05 UTC"."""
    written = created_at.astimezone(dt.timezone.utc) if created_at.tzinfo else created_at
    return (f'<p class="written">Written <time datetime="{written:%Y-%m-%dT%H:%MZ}">'
            f'{written.day} {written:%B %Y, %H:%M} UTC</time></p>')


def render_html(report: Report) -> str:
    """The report as one self-contained HTML page: inline CSS, no script, every text escaped, `[n]` linked to its source."""
    has_own_title, body = _body_without_duplicate_title(report)
    title = _escape(_single_line(report.title))
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        '<meta name="referrer" content="no-referrer">',
        f"<title>{title}</title>",
        f"<style>{_STYLE}</style>",
        "</head>",
        "<body>",
        "<article>",
    ]
    if not has_own_title:
        parts.append(f"<h1>{title}</h1>")
    question = _single_line(report.question)
    if question and question.casefold() != shown_title(report).casefold():
        parts.append(f'<p class="question">{_escape(question)}</p>')
    parts.append(_html_written_at(report.created_at))
    from research.report_html import markdown_to_html

    parts.append(markdown_to_html(body))
    if report.sources:
        parts.append("<h2>Sources</h2>")
        passages_by_number: dict[int, list[CitedPassage]] = {}
        for passage in report.cited_passages:
            passages_by_number.setdefault(passage.source_number, []).append(passage)
        parts.append('<ul class="sources">' + "".join(
            _html_source_item(source, passages_by_number.get(source.number, [])) for source in report.sources) + "</ul>")
    parts.append(_html_footer(report))
    parts.extend(["</article>", "</body>", "</html>"])
    return "\n".join(parts) + "\n"


# --- JSON ----------------------------------------------------------------------------------------

def render_json(report: Report) -> str:
    """The whole report as JSON: run id (when known), cited passages, audit and usage included."""
    return report.model_dump_json(indent=2)


def parse_report_json(text: str | bytes) -> Report:
    """The report that `render_json` wrote; raises pydantic.ValidationError on anything else."""
    return Report.model_validate_json(text)


ExportFormat = Literal["md", "html", "json"]
# How a report is exported, by format: the one map the chat's export, the CLI and the history all use.
EXPORTERS: dict[ExportFormat, Callable[[Report], str]] = {"md": render_markdown, "html": render_html, "json": render_json}
