"""The delivered report and its renderings: Markdown, self-contained HTML (no script) and JSON."""

from __future__ import annotations

from typing import Any, Literal

import datetime as dt
import html
import re
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, computed_field, model_validator

from research.markdown import code_fences

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


class ReportSource(BaseModel):
    """A source as the reader sees it: its number `[n]` in order of first use, and the passages cited from it."""

    number: int
    source_id: str
    title: str
    url: str
    provider: str = ""
    passages_used: list[str] = Field(default_factory=list)
    snippet_only: bool = False


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

    @computed_field  # type: ignore[prop-decorator]
    @property
    def tokens_estimated(self) -> bool:
        """Whether some token counts were estimated from text length (the endpoint sent no `usage`)."""
        return any(usage.estimated_calls for usage in self.llm.values())


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
    # What the reader should know about how it was made, in plain words (e.g. passages left out to fit the model).
    notes: list[str] = Field(default_factory=list)
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
    in plain text (`label (https://…)`); links to the sources, and anything in code, stay as they are."""
    allowed = {_comparable_url(url) for url in source_urls if url}

    def as_text(link: re.Match[str]) -> str:
        label, url = link.group(1), link.group(2)
        return link.group(0) if _comparable_url(url) in allowed else f"{label} ({url})"

    def outside_code(line: str) -> str:
        pieces, position = [], 0
        for span in CODE_SPAN.finditer(line):
            pieces.append(MARKDOWN_LINK.sub(as_text, line[position:span.start()]))
            pieces.append(span.group(0))
            position = span.end()
        pieces.append(MARKDOWN_LINK.sub(as_text, line[position:]))
        return "".join(pieces)

    lines = markdown.splitlines()
    return "\n".join(line if fence is not None else outside_code(line) for line, fence in zip(lines, code_fences(lines)))


# --- shared pieces -------------------------------------------------------------------------------

_H1_LINE = re.compile(r"^#\s+(.+?)\s*#*\s*$")


def split_title(markdown: str) -> tuple[str | None, str]:
    """The text of the Markdown's leading `# ` heading (if its first non-blank line is one) and the rest."""
    lines = markdown.splitlines()
    for index, line in enumerate(lines):
        if not line.strip():
            continue
        match = _H1_LINE.match(line.strip())
        if match is None:
            return None, markdown
        return match.group(1), "\n".join(lines[index + 1:]).strip("\n")
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
    endpoint did not report usage)."""
    usage = report.usage
    tokens = _plural(usage.total_tokens, "token")
    if usage.tokens_estimated:
        tokens = f"≈{tokens} (estimated)"
    return SEPARATOR.join([tokens, f"${usage.cost:,.4f}", _format_seconds(usage.seconds)])


def ai_framing_line(report: Report) -> str:
    """The line that says an AI wrote this (naming the model when known) and what it was written from: the sources
    listed; pages the run read but the report does not cite; or no web source at all."""
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
                              usage_line(report)) if line]


def partial_notice(report: Report) -> str | None:
    """The sentence that says the report is partial and why, or None for a complete report."""
    if not report.partial:
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

def _markdown_source_line(source: ReportSource) -> str:
    title = _single_line(source.title) or source.url
    line = f"[{source.number}] {title} — {source.url}" if source.url else f"[{source.number}] {title}"
    return f"{line} ({SNIPPET_LABEL})" if source.snippet_only else line


def render_markdown(report: Report) -> str:
    """The report as Markdown: title, body, numbered sources, then the audit and usage footer."""
    has_own_title, body = _body_without_duplicate_title(report)
    sections: list[str] = []
    if not has_own_title:
        sections.append(f"# {_single_line(report.title)}")
    if body:
        sections.append(body)
    if report.sources:
        # Two trailing spaces make a hard line break, so each source stays on its own line everywhere.
        sections.append("## Sources\n\n" + "  \n".join(_markdown_source_line(source) for source in report.sources))
    sections.append("---\n\n" + "  \n".join(footer_lines(report)))
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


CODE_SPAN = re.compile(r"`([^`\n]+)`")
MARKDOWN_LINK = re.compile(r"\[([^\[\]\n]+)\]\(\s*((?:[^()\s]|\([^()\s]*\))+)(?:\s+\"[^\"\n]*\")?\s*\)")
AUTOLINK = re.compile(r"<(https?://[^\s<>]+)>", re.IGNORECASE)
BARE_URL = re.compile(r"\bhttps?://[^\s<>()\[\]\"'`]+", re.IGNORECASE)
_CITATION = re.compile(r"\[(\d{1,4})\]")
_BOLD = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*|__(?=\S)(.+?)(?<=\S)__")
_ITALIC = re.compile(r"(?<![\w*])\*(?=[^\s*])(.+?)(?<=[^\s*])\*(?![\w*])|(?<![\w_])_(?=[^\s_])(.+?)(?<=[^\s_])_(?![\w_])")
_PLACEHOLDER = re.compile(r"\x00(\d+)\x00")
_TRAILING_URL_PUNCTUATION = ".,;:!?"


def render_inline(
    text: str,
    *,
    escape: Callable[[str], str],
    code: Callable[[str], str],
    link: Callable[[str, str | None], str],
    emphasis: Callable[[str], str],
    held_apart: Sequence[tuple[re.Pattern[str], Callable[[re.Match[str]], str]]] = (),
    bare_url: re.Pattern[str] = BARE_URL,
) -> str:
    """Markdown inline text in another markup, for any target (HTML here, Slack mrkdwn in chat.slack.render).

    Code spans, http(s) links (Markdown, `<url>` and bare) and whatever `held_apart` matches are
    rendered first and held apart from the rest, which is escaped and then given `emphasis`; the
    held pieces go back last, so no markup can be smuggled in through them. `code` gets escaped
    code; `link` a safe URL and its escaped label (None: the URL is its own label). A link whose
    URL is not a safe http(s) one stays text.
    """
    held: list[str] = []

    def hold(fragment: str) -> str:
        held.append(fragment)
        return f"\x00{len(held) - 1}\x00"

    def markdown_link(match: re.Match[str]) -> str:
        url = safe_http_url(match.group(2))
        return hold(link(url, escape(match.group(1))) if url else escape(match.group(0)))

    def autolink(match: re.Match[str]) -> str:
        url = safe_http_url(match.group(1))
        return hold(link(url, None) if url else escape(match.group(0)))

    def bare(match: re.Match[str]) -> str:
        raw = match.group(0)
        trimmed = raw.rstrip(_TRAILING_URL_PUNCTUATION)
        url = safe_http_url(trimmed)
        return hold(link(url, None) if url else escape(trimmed)) + escape(raw[len(trimmed):])

    text = text.replace("\x00", "")
    text = CODE_SPAN.sub(lambda match: hold(code(escape(match.group(1)))), text)
    text = MARKDOWN_LINK.sub(markdown_link, text)
    text = AUTOLINK.sub(autolink, text)
    text = bare_url.sub(bare, text)
    for pattern, render in held_apart:
        text = pattern.sub(lambda match, render=render: hold(render(match)), text)
    text = emphasis(escape(text))
    # A held piece can hold another (a code span in link text): restore until none is left.
    while _PLACEHOLDER.search(text):
        text = _PLACEHOLDER.sub(lambda match: held[int(match.group(1))], text)
    return text


def _inline_html(text: str) -> str:
    """Markdown inline text as escaped HTML: code, http(s) links, `[n]` citations, bold and italic."""

    def emphasis(escaped: str) -> str:
        escaped = _BOLD.sub(lambda match: f"<strong>{match.group(1) or match.group(2)}</strong>", escaped)
        return _ITALIC.sub(lambda match: f"<em>{match.group(1) or match.group(2)}</em>", escaped)

    return render_inline(
        text, escape=_escape, code=lambda escaped: f"<code>{escaped}</code>",
        link=lambda url, label: _link(url, label if label is not None else _escape(url)), emphasis=emphasis,
        held_apart=[(_CITATION, lambda match: _link_to_source(int(match.group(1))))],
    )


def _link_to_source(number: int) -> str:
    return f'<a class="cite" href="#source-{number}">[{number}]</a>'


_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_RULE = re.compile(r"^\s{0,3}([-*_])(?:\s*\1){2,}\s*$")
_BULLET_ITEM = re.compile(r"^(\s*)[-*+]\s+(.*)$")
_NUMBERED_ITEM = re.compile(r"^(\s*)(\d{1,9})[.)]\s+(.*)$")
_QUOTE = re.compile(r"^\s{0,3}>\s?(.*)$")
_TABLE_ROW = re.compile(r"^\s*\|(.*)\|?\s*$")
_TABLE_SEPARATOR = re.compile(r"^\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*$")


class _HtmlBuilder:
    """Turns Markdown lines into HTML blocks; every piece of text goes through `_inline_html` or `_escape`."""

    def __init__(self) -> None:
        self.output: list[str] = []
        self.paragraph: list[str] = []
        self.list_kind: str | None = None
        self.list_items: list[str] = []
        self.list_start = 1
        self.quote: list[str] = []
        self.table: list[list[str]] = []

    def flush(self) -> None:
        if self.paragraph:
            self.output.append(f"<p>{_inline_html(' '.join(line.strip() for line in self.paragraph))}</p>")
            self.paragraph = []
        if self.list_kind is not None:
            items = "".join(f"<li>{_inline_html(item)}</li>" for item in self.list_items)
            start = f' start="{self.list_start}"' if self.list_kind == "ol" and self.list_start != 1 else ""
            self.output.append(f"<{self.list_kind}{start}>{items}</{self.list_kind}>")
            self.list_kind, self.list_items = None, []
        if self.quote:
            self.output.append(f"<blockquote><p>{_inline_html(' '.join(self.quote))}</p></blockquote>")
            self.quote = []
        if self.table:
            self.output.append(self._table_html())
            self.table = []

    def _table_html(self) -> str:
        header, *rows = self.table
        head = "".join(f"<th>{_inline_html(cell)}</th>" for cell in header)
        body = "".join("<tr>" + "".join(f"<td>{_inline_html(cell)}</td>" for cell in row) + "</tr>" for row in rows)
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"

    def add_list_item(self, kind: str, text: str, start: int = 1) -> None:
        if self.list_kind != kind:
            self.flush()
            self.list_kind, self.list_start = kind, start
        self.list_items.append(text)

    def convert(self, markdown: str) -> str:
        lines = markdown.splitlines()
        index = 0
        while index < len(lines):
            line = lines[index]
            if _FENCE.match(line):
                self.flush()
                fence = _FENCE.match(line).group(1)  # type: ignore[union-attr]
                code: list[str] = []
                index += 1
                while index < len(lines) and not lines[index].strip().startswith(fence):
                    code.append(lines[index])
                    index += 1
                self.output.append(f"<pre><code>{_escape(chr(10).join(code))}</code></pre>")
            else:
                self._convert_line(line)
            index += 1
        self.flush()
        return "\n".join(self.output)

    def _convert_line(self, line: str) -> None:
        if not line.strip():
            self.flush()
            return
        if heading := _HEADING.match(line):
            self.flush()
            level = len(heading.group(1))
            self.output.append(f"<h{level}>{_inline_html(heading.group(2))}</h{level}>")
        elif _RULE.match(line):
            self.flush()
            self.output.append("<hr>")
        elif bullet := _BULLET_ITEM.match(line):
            self.add_list_item("ul", bullet.group(2))
        elif numbered := _NUMBERED_ITEM.match(line):
            self.add_list_item("ol", numbered.group(3), int(numbered.group(2)))
        elif quote := _QUOTE.match(line):
            if not self.quote:
                self.flush()
            self.quote.append(quote.group(1).strip())
        elif _TABLE_ROW.match(line):
            if not self.table:
                self.flush()
            if not _TABLE_SEPARATOR.match(line):
                self.table.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif self.list_kind is not None and line[:1].isspace():
            self.list_items[-1] += " " + line.strip()
        else:
            if self.list_kind is not None or self.quote or self.table:
                self.flush()
            self.paragraph.append(line)


def markdown_to_html(markdown: str) -> str:
    """A safe HTML fragment for the Markdown subset reports use; raw HTML is shown as text, only http(s) links."""
    return _HtmlBuilder().convert(markdown)


def _html_cited_passages(passages: Sequence[CitedPassage]) -> str:
    """A collapsed list of the passages the report cites from one source, so a reader can check the claims."""
    if not passages:
        return ""
    items = "".join(
        f"<li><blockquote>{_escape(_single_line(passage.text))}</blockquote>"
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
    if source.provider:
        parts.append(f'<span class="provider">via {_escape(source.provider)}</span>')
    if source.snippet_only:
        parts.append(f'<span class="snippet">{SNIPPET_LABEL}</span>')
    # The list is not numbered by the browser: "[n]" is the number, as in the body's citations.
    return (f'<li id="source-{source.number}"><span class="number">[{source.number}]</span> ' + " ".join(parts)
            + _html_cited_passages(passages) + "</li>")


def _html_footer(report: Report) -> str:
    lines = [f'<p class="ai-framing">{_escape(ai_framing_line(report))}</p>']
    lines.extend(f'<p class="partial">{_escape(notice)}</p>' for notice in [partial_notice(report)] if notice)
    lines.extend(f'<p class="note">{_escape(note)}</p>' for note in note_lines(report))
    if audit_line(report):
        lines.append(f'<p class="audit">{_escape(audit_line(report))}</p>')
    lines.append(f'<p class="usage">{_escape(usage_line(report))}</p>')
    if stopped := stopped_line(report):
        lines.append(f'<p class="stopped"><strong>{_escape(stopped)}</strong></p>')
    return "<footer>\n" + "\n".join(lines) + "\n</footer>"


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
