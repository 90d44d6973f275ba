"""Slack rendering: status messages and reports as Block Kit within Slack's limits, where untrusted text never pings.

Slack parses `&`, `<` and `>` as control characters in every text field (`<!channel>`, `<@U123>`, `<url|text>`), so
all untrusted text (questions, page titles, model output) goes through `escape_text`; the only `<…>` sequences in our
output are the links and the requester mention that this module writes itself. A bare `@here` is not a mention for
messages posted through the Web API (Slack only links it with `link_names`/`parse=full`, which the messenger never
sets), so it is left as text.

A report goes out as one message with a `markdown` block when the whole document fits (12,000 characters), otherwise
as `section` blocks of Slack mrkdwn (3,000 characters each, at most 50 blocks and `MESSAGE_TEXT_BUDGET` characters per
message) split at paragraph boundaries, and when that would take more than `max_messages` messages, as a short summary
message plus the full Markdown in `report.md`. Nothing in a report is ever cut off (a status message shortens a
very long question with a visible "…").

Inside a `markdown` block the same characters are written as the entities `&amp; &lt; &gt;`, which standard Markdown
shows as the characters themselves. Code is the exception (Markdown shows entities in code literally), so a report
whose code holds `& < >` is sent as mrkdwn sections instead, where Slack always decodes them.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable
from typing import Any

from bot.messenger.base import Content, FileUpload
from bot.render.base import ReportDelivery
from bot.render.state import RunProgress
from research.report import (
    AUTOLINK,
    CODE_SPAN,
    MARKDOWN_LINK,
    SNIPPET_LABEL,
    STOPPED_BY_USER_LINE,
    Report,
    ReportSource,
    audit_line,
    partial_notice,
    render_inline,
    render_markdown,
    safe_http_url,
    split_title,
    usage_line,
)

SECTION_TEXT_LIMIT = 3_000
MARKDOWN_BLOCK_LIMIT = 12_000
BLOCKS_PER_MESSAGE = 50
# Slack truncates `text` at 40,000 characters; a smaller budget per message keeps the plain-text fallback whole.
MESSAGE_TEXT_BUDGET = 12_000
DEFAULT_MAX_MESSAGES = 4
REPORT_FILENAME = "report.md"
# Escaping can make text up to five times longer (`&` → `&amp;`), so 500 characters always fit a section.
QUESTION_DISPLAY_LIMIT = 500
STATUS_LINE_LIMIT = 500
PROGRESS_BAR_CELLS = 10

PHASE_MARKS = {"done": "✅", "current": "⏳", "waiting": "▫️", "failed": "❌"}
COUNT_LABELS = (("sub_questions", "sub-question", "sub-questions"), ("results", "result", "results"),
                ("pages_read", "page read", "pages read"), ("passages", "passage", "passages"))
SEPARATOR = " · "

_SLACK_USER_ID = re.compile(r"^[UW][A-Z0-9]{2,}$")


# --- escaping and links ----------------------------------------------------------------------------

def escape_text(text: str) -> str:
    """`text` with Slack's control characters `& < >` as `&amp; &lt; &gt;`, so it can neither ping nor link."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_link_url(url: str) -> str:
    """A URL made safe inside Slack's `<url|text>` syntax (`|`, `<`, `>` percent-encoded, `&` escaped)."""
    return url.replace("|", "%7C").replace("<", "%3C").replace(">", "%3E").replace("&", "&amp;")


def mrkdwn_link(url: str, label: str) -> str:
    """A Slack mrkdwn link to an http(s) `url` showing the (untrusted) `label`; anything else becomes plain text."""
    safe_url = safe_http_url(url)
    if safe_url is None:
        return escape_text(f"{label} ({url})" if url and label != url else label or url)
    return f"<{slack_link_url(safe_url)}|{escape_text(label or safe_url)}>"


def user_mention(user_id: str) -> str:
    """`<@U123>` for a Slack user id (a `slack:` prefix is allowed); any other value is shown as escaped text."""
    bare = user_id.removeprefix("slack:")
    return f"<@{bare}>" if _SLACK_USER_ID.match(bare) else escape_text(user_id)


def single_line(text: str) -> str:
    """`text` with every run of whitespace (newlines included) collapsed to one space."""
    return " ".join(text.split())


def shortened(text: str, limit: int) -> str:
    """`text`, or its first `limit` characters followed by a visible "…"."""
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


# --- Markdown paragraphs ---------------------------------------------------------------------------

_FENCE = re.compile(r"^\s*(```|~~~)")


def markdown_paragraphs(markdown: str) -> list[str]:
    """Block-level paragraphs of `markdown`, split at blank lines; a fenced code block stays in one paragraph."""
    paragraphs: list[str] = []
    current: list[str] = []
    fence: str | None = None
    for line in markdown.splitlines():
        marker = _FENCE.match(line)
        if fence is not None:
            current.append(line)
            if marker and marker.group(1) == fence:
                fence = None
            continue
        if marker:
            fence = marker.group(1)
            current.append(line)
        elif line.strip():
            current.append(line)
        elif current:
            paragraphs.append("\n".join(current))
            current = []
    if current:
        paragraphs.append("\n".join(current))
    return paragraphs


# --- Markdown to Slack mrkdwn ----------------------------------------------------------------------

# A bare URL ends at `|` too, which would split a Slack link.
_BARE_URL = re.compile(r"\bhttps?://[^\s<>()\[\]\"'`|]+", re.IGNORECASE)
_BOLD = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*|__(?=\S)(.+?)(?<=\S)__")
_ITALIC_STAR = re.compile(r"(?<![\w*])\*(?=[^\s*])(.+?)(?<=[^\s*])\*(?![\w*])")
_STRIKE = re.compile(r"~~(?=\S)(.+?)(?<=\S)~~")
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$")
_RULE = re.compile(r"^\s{0,3}([-*_])(?:\s*\1){2,}\s*$")
_BULLET = re.compile(r"^(\s*)[-*+]\s+(.*)$")
_QUOTE = re.compile(r"^\s{0,3}>\s?(.*)$")
_BOLD_MARK = "\x01"


def inline_to_mrkdwn(text: str) -> str:
    """Markdown inline text as escaped Slack mrkdwn: code, http(s) links, bold, italic and strikethrough."""

    def link(url: str, label: str | None) -> str:
        return f"<{slack_link_url(url)}>" if label is None else f"<{slack_link_url(url)}|{label}>"

    def emphasis(escaped: str) -> str:
        # Bold is marked apart first: its `*` would otherwise be read as italic.
        escaped = _BOLD.sub(lambda match: f"{_BOLD_MARK}{match.group(1) or match.group(2)}{_BOLD_MARK}", escaped)
        escaped = _ITALIC_STAR.sub(lambda match: f"_{match.group(1)}_", escaped)
        escaped = _STRIKE.sub(lambda match: f"~{match.group(1)}~", escaped)
        return escaped.replace(_BOLD_MARK, "*")

    return render_inline(text.replace(_BOLD_MARK, ""), escape=escape_text, code=lambda escaped: f"`{escaped}`",
                         link=link, emphasis=emphasis, bare_url=_BARE_URL)


def _code_block_to_mrkdwn(paragraph: str) -> str:
    lines = paragraph.splitlines()
    fence = _FENCE.match(lines[0]).group(1)  # type: ignore[union-attr]
    body = lines[1:]
    if body and body[-1].strip().startswith(fence):
        body = body[:-1]
    return "```\n" + escape_text("\n".join(body)) + "\n```"


def _line_to_mrkdwn(line: str) -> str:
    if heading := _HEADING.match(line):
        return f"*{inline_to_mrkdwn(heading.group(1)).replace('*', '')}*"
    if _RULE.match(line):
        return "──────────"
    if bullet := _BULLET.match(line):
        return f"{bullet.group(1)}• {inline_to_mrkdwn(bullet.group(2))}"
    if quote := _QUOTE.match(line):
        # A raw `>` at the start of a line is Slack's quote syntax; it cannot form a mention without a `<`.
        return f"> {inline_to_mrkdwn(quote.group(1))}"
    return inline_to_mrkdwn(line.rstrip())


def paragraph_to_mrkdwn(paragraph: str) -> str:
    """One Markdown paragraph (or fenced code block) as Slack mrkdwn, line breaks kept."""
    if _FENCE.match(paragraph):
        return _code_block_to_mrkdwn(paragraph)
    return "\n".join(_line_to_mrkdwn(line) for line in paragraph.splitlines())


# --- Markdown for Slack's `markdown` block -----------------------------------------------------------

def _escape_markdown_label(text: str) -> str:
    return text.replace("\\", "\\\\").replace("[", "\\[").replace("]", "\\]")


def paragraph_to_slack_markdown(paragraph: str) -> str:
    """One Markdown paragraph for a `markdown` block: `& < >` escaped as entities, only http(s) links kept as links."""
    def markdown_link(match: re.Match[str]) -> str:
        if safe_http_url(match.group(2)) is None:
            # Escaped brackets keep the text as it was written without making it a link.
            return "\\[" + match.group(1) + "\\]" + match.group(0)[len(match.group(1)) + 2:]
        return match.group(0)

    if not _FENCE.match(paragraph):
        paragraph = AUTOLINK.sub(lambda match: match.group(1), paragraph)
        paragraph = MARKDOWN_LINK.sub(markdown_link, paragraph)
    return escape_text(paragraph)


def _has_code_with_control_characters(markdown: str) -> bool:
    """Whether code spans or fences hold `& < >`, which a `markdown` block might show as entities."""
    for paragraph in markdown_paragraphs(markdown):
        code = paragraph if _FENCE.match(paragraph) else " ".join(CODE_SPAN.findall(paragraph))
        if any(character in code for character in "&<>"):
            return True
    return False


# --- splitting within limits ---------------------------------------------------------------------

def _tokens(text: str, separator: str) -> list[str]:
    """`text` cut after each `separator`, the separator kept on the left piece, so joining them gives `text` back."""
    pieces = text.split(separator)
    return [piece + separator for piece in pieces[:-1]] + [pieces[-1]]


def _hard_cut(text: str, limit: int) -> list[str]:
    pieces: list[str] = []
    while len(text) > limit:
        cut = limit
        entity_start = text.rfind("&", max(0, cut - 6), cut)
        if entity_start != -1 and ";" not in text[entity_start:cut]:
            cut = entity_start or limit
        pieces.append(text[:cut])
        text = text[cut:]
    return pieces + ([text] if text else [])


_SEPARATORS = ("\n", ". ", " ")


def _split_source(source: str, convert: Callable[[str], str], limit: int, separators: tuple[str, ...]) -> list[str]:
    """Converted pieces of `source`, each within `limit`, cut at the coarsest separator that works."""
    converted = convert(source)
    if len(converted) <= limit:
        return [converted]
    if not separators:
        return _hard_cut(converted, limit)
    tokens = _tokens(source, separators[0])
    # Escaping is what makes converted text longer, so it estimates a token's size without converting it.
    sizes = [len(escape_text(token)) for token in tokens]
    pieces: list[str] = []
    start = 0
    while start < len(tokens):
        if sizes[start] > limit:
            if tokens[start].strip():
                pieces.extend(_split_source(tokens[start].strip(), convert, limit, separators[1:]))
            start += 1
            continue
        end, estimate = start, 0
        while end < len(tokens) and sizes[end] <= limit and estimate + sizes[end] <= limit:
            estimate += sizes[end]
            end += 1
        chunk = convert("".join(tokens[start:end]).strip())
        while len(chunk) > limit and end - start > 1:
            end = start + max(1, min(end - start - 1, int((end - start) * limit / len(chunk) * 0.95)))
            chunk = convert("".join(tokens[start:end]).strip())
        if len(chunk) > limit:
            pieces.extend(_split_source(tokens[start].strip(), convert, limit, separators[1:]))
        elif chunk:
            pieces.append(chunk)
        start = end
    return pieces


def split_text(text: str, limit: int) -> list[str]:
    """`text` in pieces of at most `limit` characters, cut at paragraphs, then lines, sentences, words."""
    return _split_source(text, _unchanged, limit, ("\n\n", *_SEPARATORS))


def _split_code_block(paragraph: str, limit: int) -> list[str]:
    """A fenced code block too long for one section, as several fenced blocks cut at line ends."""
    lines = paragraph.splitlines()
    fence = _FENCE.match(lines[0]).group(1)  # type: ignore[union-attr]
    body = lines[1:-1] if len(lines) > 1 and lines[-1].strip().startswith(fence) else lines[1:]
    wrap = len("```\n\n```")
    inner = _split_source("\n".join(body), escape_text, limit - wrap, ("\n", " "))
    return ["```\n" + piece + "\n```" for piece in inner]


def mrkdwn_pieces(paragraph: str, limit: int = SECTION_TEXT_LIMIT) -> list[str]:
    """One Markdown paragraph as mrkdwn pieces of at most `limit` characters; long ones cut at lines, sentences, words."""
    if _FENCE.match(paragraph):
        whole = paragraph_to_mrkdwn(paragraph)
        return [whole] if len(whole) <= limit else _split_code_block(paragraph, limit)
    return _split_source(paragraph, paragraph_to_mrkdwn, limit, _SEPARATORS)


def pack_sections(pieces: list[str], limit: int = SECTION_TEXT_LIMIT) -> list[str]:
    """Pieces joined by blank lines into as few section texts as fit in `limit` characters each."""
    sections: list[str] = []
    for piece in pieces:
        if sections and len(sections[-1]) + 2 + len(piece) <= limit:
            sections[-1] += "\n\n" + piece
        else:
            sections.append(piece)
    return sections


def section_block(text: str) -> dict[str, Any]:
    """A `section` block with mrkdwn text (at most 3,000 characters)."""
    return {"type": "section", "text": {"type": "mrkdwn", "text": text}}


def context_block(text: str) -> dict[str, Any]:
    """A `context` block with one mrkdwn element."""
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": text}]}


def markdown_block(text: str) -> dict[str, Any]:
    """A `markdown` block (standard Markdown, at most 12,000 characters per message)."""
    return {"type": "markdown", "text": text}


RETRY_ACTION_ID = "deepthread_retry"
CONTINUE_ACTION_ID = "deepthread_continue"
EXPORT_ACTION_ID = "deepthread_export"
UNFINISHED_STATES = frozenset({"failed", "timed_out", "cancelled"})


def button(action_id: str, label: str, value: str) -> dict[str, Any]:
    """A Block Kit button whose click reaches the adapter as `action_id` with `value`."""
    return {"type": "button", "action_id": action_id, "text": {"type": "plain_text", "text": label}, "value": value}


def actions_block(buttons: list[dict[str, Any]]) -> dict[str, Any]:
    """An `actions` block holding `buttons`."""
    return {"type": "actions", "elements": buttons}


def run_buttons(progress: RunProgress) -> dict[str, Any] | None:
    """Retry (and, for research, Continue) under a run that ended without finishing; None for any other run."""
    unfinished = progress.state in UNFINISHED_STATES or (progress.state == "done" and progress.partial)
    if not unfinished:
        return None
    value = str(progress.run_id)
    buttons = [button(RETRY_ACTION_ID, "Retry", value)]
    if progress.mode == "research":
        buttons.append(button(CONTINUE_ACTION_ID, "Continue", value))
    return actions_block(buttons)


def export_buttons(run_id: int) -> dict[str, Any]:
    """The "Export Markdown" button under a delivered report."""
    return actions_block([button(EXPORT_ACTION_ID, "Export Markdown", str(run_id))])


def with_export_button(delivery: ReportDelivery, run_id: int) -> ReportDelivery:
    """`delivery` with the export button under its last message (in a message of its own when that one is full)."""
    messages = list(delivery.messages)
    last = messages[-1]
    if last.blocks is not None and len(last.blocks) < BLOCKS_PER_MESSAGE:
        messages[-1] = last.model_copy(update={"blocks": [*last.blocks, export_buttons(run_id)]})
    else:
        text = "Export this report as Markdown:"
        messages.append(Content(text=text, blocks=[section_block(text), export_buttons(run_id)]))
    return delivery.model_copy(update={"messages": messages})


def _content_from_sections(sections: list[str]) -> Content:
    return Content(text="\n\n".join(sections), blocks=[section_block(section) for section in sections])


def pack_messages(sections: list[str], *, first_message_blocks: int = 0) -> list[list[str]]:
    """Section texts grouped into messages of at most 50 blocks and `MESSAGE_TEXT_BUDGET` characters."""
    messages: list[list[str]] = [[]]
    used_blocks, used_characters = first_message_blocks, 0
    for section in sections:
        if messages[-1] and (used_blocks + 1 > BLOCKS_PER_MESSAGE or used_characters + len(section) > MESSAGE_TEXT_BUDGET):
            messages.append([])
            used_blocks, used_characters = 0, 0
        messages[-1].append(section)
        used_blocks += 1
        used_characters += len(section) + 2
    return [message for message in messages if message]


# --- the report document -------------------------------------------------------------------------

def _title_and_body(report: Report) -> tuple[str, str]:
    own_title, rest = split_title(report.body_markdown)
    return single_line(own_title or report.title), (rest if own_title else report.body_markdown).strip("\n")


def _source_line_mrkdwn(source: ReportSource) -> str:
    title = single_line(source.title) or source.url
    line = f"[{source.number}] " + (mrkdwn_link(source.url, title) if source.url else escape_text(title))
    return f"{line} _({SNIPPET_LABEL})_" if source.snippet_only else line


def _source_line_markdown(source: ReportSource) -> str:
    title = _escape_markdown_label(single_line(source.title) or source.url)
    url = safe_http_url(source.url)
    link = f"[{title}]({url.replace('(', '%28').replace(')', '%29')})" if url else (
        f"{title} ({source.url})" if source.url else title)
    line = f"- \\[{source.number}\\] {link}"
    return escape_text(f"{line} ({SNIPPET_LABEL})" if source.snippet_only else line)


def _unchanged(text: str) -> str:
    return text


def _footer_lines(report: Report) -> list[str]:
    return [line for line in (partial_notice(report), audit_line(report), usage_line(report)) if line]


def report_mrkdwn_paragraphs(report: Report) -> list[str]:
    """The report as mrkdwn pieces in reading order (title, body, sources, footer), each within one section."""
    title, body = _title_and_body(report)
    pieces = _split_source(f"*{title}*", escape_text, SECTION_TEXT_LIMIT, _SEPARATORS)
    for paragraph in markdown_paragraphs(body):
        pieces.extend(mrkdwn_pieces(paragraph))
    if report.sources:
        sources = "\n".join(["*Sources*"] + [_source_line_mrkdwn(source) for source in report.sources])
        pieces.extend(_split_source(sources, _unchanged, SECTION_TEXT_LIMIT, _SEPARATORS))
    footer = "──────────\n" + "\n".join(f"_{escape_text(line)}_" for line in _footer_lines(report))
    pieces.extend(_split_source(footer, _unchanged, SECTION_TEXT_LIMIT, _SEPARATORS))
    if report.stopped_by_user:
        pieces.append(f"*{escape_text(STOPPED_BY_USER_LINE)}*")
    return pieces


def report_slack_markdown(report: Report) -> str:
    """The whole report as escaped Markdown for one `markdown` block."""
    title, body = _title_and_body(report)
    parts = [f"# {escape_text(title)}"]
    parts.extend(paragraph_to_slack_markdown(paragraph) for paragraph in markdown_paragraphs(body))
    if report.sources:
        parts.append("## Sources\n\n" + "\n".join(_source_line_markdown(source) for source in report.sources))
    parts.append("---\n\n" + "\n\n".join(f"_{escape_text(line)}_" for line in _footer_lines(report)))
    if report.stopped_by_user:
        parts.append(f"**{escape_text(STOPPED_BY_USER_LINE)}**")
    return "\n\n".join(parts)


# --- status --------------------------------------------------------------------------------------

def progress_bar(percent: float, cells: int = PROGRESS_BAR_CELLS) -> str:
    """A text progress bar such as `▰▰▰▰▱▱▱▱▱▱ 40%`."""
    bounded = max(0.0, min(100.0, percent))
    filled = round(bounded / 100 * cells)
    return "▰" * filled + "▱" * (cells - filled) + f" {bounded:.0f}%"


def format_elapsed(seconds: float) -> str:
    """`42 s`, `3 min 05 s` or `1 h 02 min`."""
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    minutes, rest = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes} min {rest:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def counts_line(counts: dict[str, int]) -> str:
    """`3 sub-questions · 24 results · 9 pages read · 120 passages`, leaving out counts not reached yet."""
    parts = [f"{counts[key]:,} {singular if counts[key] == 1 else plural}"
             for key, singular, plural in COUNT_LABELS if counts.get(key)]
    return SEPARATOR.join(parts)


def phase_checklist(progress: RunProgress) -> str:
    """One line per phase: a mark for done, current, waiting or failed, and the phase's label (current in bold)."""
    lines = []
    for line in progress.phases:
        label = escape_text(line.label)
        lines.append(f"{PHASE_MARKS[line.status]} {f'*{label}*' if line.status == 'current' else label}")
    return "\n".join(lines)


def emoji_code(name: str) -> str:
    """`:x:` for an emoji name, or the emoji itself when it is given as a character (`❌`)."""
    return f":{name.strip(':')}:" if name.isascii() else name


def _ending(progress: RunProgress, cancel_emoji: str) -> str:
    state = progress.state
    if state == "queued":
        position = f" — position {progress.queue_position} in the queue" if progress.queue_position else ""
        return f"🕒 *Queued*{position}. React with {emoji_code(cancel_emoji)} to cancel."
    if state == "running":
        return f"React with {emoji_code(cancel_emoji)} to stop the research and keep what it found."
    if state == "done":
        audit = escape_text(shortened(single_line(progress.audit_line or ""), STATUS_LINE_LIMIT))
        lines = ["✅ *Done*" + (f" — {audit}" if audit else "")]
        if progress.partial:
            reason = escape_text(shortened(single_line(progress.partial_reason or ""), STATUS_LINE_LIMIT)).rstrip(".")
            lines.append(f"⚠️ Partial report{': ' + reason if reason else ''}.")
        return "\n".join(lines)
    if state == "cancelled":
        return "🛑 *Stopped*" + (f" by {user_mention(progress.cancelled_by)}" if progress.cancelled_by else "")
    if state == "timed_out":
        reason = escape_text(shortened(single_line(progress.error or ""), STATUS_LINE_LIMIT)) or "the run took too long and was stopped"
        return f"⌛ *Timed out*: {reason}"
    if state == "failed":
        reason = escape_text(shortened(single_line(progress.error or ""), STATUS_LINE_LIMIT)) or "an unexpected error"
        return f"❌ *Failed*: {reason}"
    return escape_text(state)


def _headline(progress: RunProgress) -> str:
    question = escape_text(shortened(single_line(progress.question), QUESTION_DISPLAY_LIMIT))
    verb = {"plan": "Planning", "chat": "Answering", "followup": "Answering"}.get(progress.mode, "Researching")
    return f"*{verb}:* {question}\nasked by {user_mention(progress.requested_by)}"


def _measures(progress: RunProgress, now: dt.datetime) -> str:
    parts = [part for part in (counts_line(progress.counts),) if part]
    if progress.state in ("running", "done"):
        parts.append(progress_bar(progress.percent))
    if progress.started_at is not None:
        parts.append(f"⏱ {format_elapsed(progress.elapsed_seconds(now))}")
    return SEPARATOR.join(parts)


# --- the renderer --------------------------------------------------------------------------------

class SlackRenderer:
    """Status messages, reports and notices as Slack Block Kit, within Slack's limits."""

    platform = "slack"

    def __init__(self, *, cancel_emoji: str = "x", max_messages: int = DEFAULT_MAX_MESSAGES,
                 use_markdown_blocks: bool = True) -> None:
        self.cancel_emoji = cancel_emoji
        self.max_messages = max_messages
        self.use_markdown_blocks = use_markdown_blocks

    def status(self, progress: RunProgress, *, now: dt.datetime) -> Content:
        """The status message: question, requester, phase checklist, counts, progress bar, elapsed time and ending."""
        headline = _headline(progress)
        checklist = phase_checklist(progress)
        measures = _measures(progress, now)
        ending = _ending(progress, self.cancel_emoji)
        blocks = [section_block(headline)]
        if checklist and progress.state != "queued":
            blocks.append(section_block(checklist))
        if measures:
            blocks.append(context_block(measures))
        blocks.append(section_block(ending) if progress.state not in ("running", "queued") else context_block(ending))
        buttons = run_buttons(progress)
        if buttons is not None:
            blocks.append(buttons)
        text = "\n\n".join(part for part in (headline, checklist if progress.state != "queued" else "", measures, ending) if part)
        return Content(text=text, blocks=blocks)

    def report(self, report: Report, *, requester: str, run_id: int | None = None) -> ReportDelivery:
        """The report's messages, the first mentioning the requester, the last with an export button when `run_id`
        is given; as a summary plus `report.md` when too long."""
        delivery = self._report_messages(report, requester)
        return with_export_button(delivery, run_id) if run_id is not None and delivery.messages else delivery

    def _report_messages(self, report: Report, requester: str) -> ReportDelivery:
        greeting = self._greeting(report, requester)
        if self.use_markdown_blocks:
            markdown = report_slack_markdown(report)
            if len(markdown) <= MARKDOWN_BLOCK_LIMIT and not _has_code_with_control_characters(report.body_markdown):
                fallback = "\n\n".join([greeting, *report_mrkdwn_paragraphs(report)])
                return ReportDelivery(messages=[Content(text=fallback, blocks=[section_block(greeting), markdown_block(markdown)])])
        sections = pack_sections(report_mrkdwn_paragraphs(report))
        grouped = pack_messages(sections, first_message_blocks=1)
        if len(grouped) > self.max_messages:
            return self._as_file(report, greeting)
        messages = [_content_from_sections(group) for group in grouped]
        first = messages[0]
        messages[0] = Content(text=f"{greeting}\n\n{first.text}", blocks=[section_block(greeting), *(first.blocks or [])])
        return ReportDelivery(messages=messages)

    def notice(self, text: str) -> Content:
        """A short notice in the thread; the text is treated as untrusted."""
        escaped = escape_text(text)
        sections = _split_source(text, escape_text, SECTION_TEXT_LIMIT, _SEPARATORS)
        # Too many sections for one message: the plain text carries it whole rather than cutting blocks off.
        blocks = [section_block(section) for section in sections] if len(sections) <= BLOCKS_PER_MESSAGE else None
        return Content(text=escaped, blocks=blocks)

    def _greeting(self, report: Report, requester: str) -> str:
        question = escape_text(shortened(single_line(report.question) or _title_and_body(report)[0], 300))
        if report.mode == "plan":
            return (f"{user_mention(requester)} here is a research plan for “{question}”. Reply *go* (or react "
                    f"✅ on the status message) to run it, or reply with what to change.")
        if report.mode in ("chat", "followup"):
            return f"{user_mention(requester)} on “{question}”:"
        return f"{user_mention(requester)} here is your report on “{question}”."

    def _as_file(self, report: Report, greeting: str) -> ReportDelivery:
        title, _ = _title_and_body(report)
        lines = [greeting, f"*{escape_text(title)}*",
                 f"The report is too long for Slack messages, so the full text is in `{REPORT_FILENAME}` below "
                 f"({len(report.sources)} sources)."]
        lines.extend(f"_{escape_text(line)}_" for line in _footer_lines(report))
        if report.stopped_by_user:
            lines.append(f"*{escape_text(STOPPED_BY_USER_LINE)}*")
        summary = "\n\n".join(lines)
        sections = pack_sections([piece for line in lines
                                  for piece in _split_source(line, _unchanged, SECTION_TEXT_LIMIT, _SEPARATORS)])
        upload = FileUpload(filename=REPORT_FILENAME, data=render_markdown(report).encode("utf-8"),
                            title=shortened(single_line(title), 200).replace("<", "‹").replace(">", "›"))
        return ReportDelivery(messages=[Content(text=summary, blocks=[section_block(section) for section in sections])],
                              file=upload)
