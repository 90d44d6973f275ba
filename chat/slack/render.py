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
from collections.abc import Iterator
from typing import Any

from config import setting_default
from chat.history import NO_RUNS, RunHistory, RunSummary, history_listing, mode_name
from chat.message import Content, FileUpload, Place
from chat.slack.feedback import with_feedback_buttons
from chat.slack.thread_status import with_thread_status
from chat.render import ReportDelivery, with_person
from chat.watches import NO_WATCHES, WatchListing, WatchSummary
from chat.state import RunProgress
from chat.status import Markup, ending, headline, is_unfinished, measures_line, phase_checklist
from chat.text import (
    markdown_source_link,
    Convert,
    footer_lines,
    shortened,
    single_line,
    split_source,
    title_and_body,
    unchanged,
)
from markdown_it.token import Token

from research.markdown import (
    PARSERS,
    Document,
    closing,
    fence_code,
    fenced_block,
    inline_lines,
    inline_text,
    is_code_block,
    links,
    markdown_paragraphs,
    read,
    replaced,
)
from research.report import (
    SNIPPET_LABEL,
    Report,
    ReportSource,
    only_source_links,
    render_markdown,
    safe_http_url,
    stopped_line,
    url_pieces,
)
from storage.vocabulary import ACTIVE_STATES

SECTION_TEXT_LIMIT = 3_000
MARKDOWN_BLOCK_LIMIT = 12_000
BLOCKS_PER_MESSAGE = 50
# Slack truncates `text` at 40,000 characters; a smaller budget per message keeps the plain-text fallback whole.
MESSAGE_TEXT_BUDGET = 12_000
DEFAULT_MAX_MESSAGES = 4
REPORT_FILENAME = "report.md"
# Escaping can make text up to five times longer (`&` → `&amp;`), so 500 characters always fit a section.
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


KEY = "slack"


def slack_content(text: str, blocks: list[dict[str, Any]] | None) -> Content:
    """A Slack message: `text` (the notification and plain-text fallback) and its Block Kit `blocks`."""
    return Content(text=text, extra={KEY: {"blocks": blocks}} if blocks is not None else {})


def blocks_of(content: Content) -> list[dict[str, Any]] | None:
    """The Block Kit blocks of a Slack message, or None for plain text."""
    return (content.extra.get(KEY) or {}).get("blocks")


def _escaped_length(text: str) -> int:
    return len(escape_text(text))


def _split(source: str, convert: Convert, limit: int, separators: tuple[str, ...] = ("\n", ". ", " ")) -> list[str]:
    """`split_source` measuring pieces as escaped text, which is what makes Slack text longer."""
    return split_source(source, convert, limit, separators, measure=_escaped_length)


MARKUP = Markup(escape=escape_text, bold=lambda escaped: f"*{escaped}*", mention=user_mention)


# --- Markdown to Slack mrkdwn ----------------------------------------------------------------------

# A bare URL ends at `|` too, which would split a Slack link.
_BARE_URL = re.compile(r"\bhttps?://[^\s<>()\[\]\"'`|]+", re.IGNORECASE)
_MRKDWN_MARKS = {"strong": "*", "em": "_", "s": "~"}
RULE = "──────────"


def _text_mrkdwn(text: str) -> str:
    return "".join(f"<{slack_link_url(url)}>" if url else escape_text(piece) for piece, url in url_pieces(text, _BARE_URL))


def _link_mrkdwn(link_open: Token, label: list[Token]) -> str:
    target = str(link_open.attrs.get("href") or link_open.attrs.get("src") or "")
    if link_open.markup == "autolink":
        url = safe_http_url(target)
        return f"<{slack_link_url(url)}>" if url else escape_text(f"<{inline_text(label)}>")
    return mrkdwn_link(target, inline_text(label))


def _inline_mrkdwn(children: list[Token]) -> str:
    """Inline tokens as escaped Slack mrkdwn: code, http(s) links, bold, italic and strikethrough."""
    pieces: list[str] = []
    index = 0
    while index < len(children):
        child = children[index]
        mark = _MRKDWN_MARKS.get(child.type.removesuffix("_open").removesuffix("_close"))
        if child.type == "text":
            pieces.append(_text_mrkdwn(child.content))
        elif child.type == "code_inline":
            pieces.append(f"`{escape_text(child.content)}`")
        elif child.type in ("softbreak", "hardbreak"):
            pieces.append("\n")
        elif mark is not None:
            pieces.append(mark)
        elif child.type == "image":
            pieces.append(_link_mrkdwn(child, child.children or []))
        elif child.type == "link_open":
            end = closing(children, index)
            pieces.append(_link_mrkdwn(child, children[index + 1:end]))
            index = end
        index += 1
    return "".join(pieces)


def inline_to_mrkdwn(text: str) -> str:
    """Markdown inline text as escaped Slack mrkdwn: code, http(s) links, bold, italic and strikethrough."""
    tokens = PARSERS.markdown.parseInline(text)
    return _inline_mrkdwn(tokens[0].children or []) if tokens else ""


class _MrkdwnLines:
    """A Markdown text as Slack mrkdwn line by line: each source line becomes one line (a fenced block one block),
    with `•` for bullets, `>` for quotes, headings bold and rules a line."""

    def __init__(self, document: Document) -> None:
        self.document = document
        self.written: dict[int, str | None] = {}  # None: the line is written with an earlier one
        self.quoted = 0
        self.item_marker: str | None = None  # for the first line of the list item just opened

    def text(self) -> str:
        lines = self.document.lines
        for index, token in enumerate(self.document.tokens):
            self._read(index, token)
        shown = [self.written.get(number, escape_text(line.rstrip()) if line.strip() else "")
                 for number, line in enumerate(lines)]
        return "\n".join(line for line in shown if line is not None)

    def _prefix(self, number: int, *, first: bool) -> str:
        line = self.document.lines[number]
        if self.quoted:
            # A raw `>` at the start of a line is Slack's quote syntax; it cannot form a mention without a `<`.
            prefix = "> "
        else:
            prefix = line[:len(line) - len(line.lstrip(" \t"))]
        if first and self.item_marker is not None:
            prefix, self.item_marker = prefix + self.item_marker, None
        return prefix

    def _read(self, index: int, token: Token) -> None:
        tokens, kind = self.document.tokens, token.type
        if kind in ("blockquote_open", "blockquote_close"):
            self.quoted += token.nesting
        elif kind == "list_item_open":
            self.item_marker = "• " if token.markup in ("-", "*", "+") else f"{token.info}{token.markup} "
        elif token.map is None:
            return
        elif kind == "hr":
            self.written[token.map[0]] = RULE
        elif kind == "fence":
            _, code = fence_code(token)
            self._write_block(token.map, "```\n" + escape_text("\n".join(code)) + "\n```")
        elif kind == "heading_open":
            heading = _inline_mrkdwn(tokens[index + 1].children or []).replace("*", "").replace("\n", " ").strip()
            self._write_block(token.map, self._prefix(token.map[0], first=True) + (f"*{heading}*" if heading else ""))
        elif kind == "paragraph_open":
            first, count = token.map[0], token.map[1] - token.map[0]
            lines = inline_lines(tokens[index + 1].children or [])
            for number in range(count):
                # A code span or link written across lines leaves fewer lines than it took: its lines are one.
                shown = lines[number:] if number == count - 1 else lines[number:number + 1]
                self.written[first + number] = (self._prefix(first + number, first=number == 0)
                                                + "\n".join(_inline_mrkdwn(line) for line in shown) if shown else None)
        elif kind == "tr_open":
            cells = [_inline_mrkdwn(tokens[position].children or []) for position in range(index, closing(tokens, index))
                     if tokens[position].type == "inline"]
            self.written[token.map[0]] = self._prefix(token.map[0], first=True) + "| " + " | ".join(cells) + " |"

    def _write_block(self, lines: list[int], text: str) -> None:
        self.written[lines[0]] = text
        self.written.update({number: None for number in range(lines[0] + 1, lines[1])})


def paragraph_to_mrkdwn(paragraph: str) -> str:
    """One Markdown paragraph (or fenced code block) as Slack mrkdwn, line breaks kept."""
    return _MrkdwnLines(read(paragraph)).text()


# --- Markdown for Slack's `markdown` block -----------------------------------------------------------

def _escape_markdown_label(text: str) -> str:
    return text.replace("\\", "\\\\").replace("[", "\\[").replace("]", "\\]")


def paragraph_to_slack_markdown(paragraph: str) -> str:
    """One Markdown paragraph for a `markdown` block: `& < >` escaped as entities, only http(s) links kept as links,
    each written `[label](address)` (an autolink becomes its bare address, and an address in `<>` loses them: their
    `<` `>` would be escaped)."""
    document = read(paragraph, PARSERS.every_link)
    edits: list[tuple[int, int, str]] = []
    for link in links(document):
        url = safe_http_url(link.target)
        if link.span is None or link.label is None:
            continue
        label = document.source[link.label[0]:link.label[1]]
        if link.kind == "autolink":
            if url is not None:
                edits.append((link.span[0], link.span[1], label))
        elif url is None:
            # Escaped brackets keep the text as it was written without making it a link.
            edits.extend([(link.label[0] - 1, link.label[0], "\\["), (link.label[1], link.label[1] + 1, "\\]")])
        else:
            bang = "!" if link.kind == "image" else ""
            edits.append((link.span[0], link.span[1], f"{bang}[{label}]({url.replace('(', '%28').replace(')', '%29')})"))
    return escape_text(replaced(document.source, edits) if edits else paragraph)


def stream_markdown(text: str, *, after: str = "") -> str:
    """Streamed Markdown (`markdown_text`) for `text`, the model's words as they come, following `after` (the words
    already streamed): `& < >` escaped as in a `markdown` block, and every `[` not yet escaped escaped, so that no
    link, image or reference can form however the text goes on.

    A streamed answer has no audited sources, so none of its links may link; and since a stream cannot take words
    back, each character is rendered by what came before it alone: the rendering of `after + text` is the rendering
    of `after` followed by this. Code shows the escapes until the audited answer replaces the stream.
    """
    return "".join(stream_markdown_characters(text, after=after))


def stream_markdown_characters(text: str, *, after: str = "") -> Iterator[str]:
    """`stream_markdown(text, after=after)` a character of `text` at a time."""
    backslashes = len(after) - len(after.rstrip("\\"))
    for character in text:
        yield "\\[" if character == "[" and backslashes % 2 == 0 else escape_text(character)
        backslashes = backslashes + 1 if character == "\\" else 0


def _has_code_with_control_characters(markdown: str) -> bool:
    """Whether code spans or fences hold `& < >`, which a `markdown` block might show as entities."""
    for token in read(markdown).tokens:
        code = token.content if token.type == "fence" else " ".join(
            child.content for child in token.children or [] if child.type == "code_inline")
        if any(character in code for character in "&<>"):
            return True
    return False


# --- splitting within limits ---------------------------------------------------------------------

def _split_code_block(paragraph: str, limit: int) -> list[str]:
    """A fenced code block too long for one section, as several fenced blocks cut at line ends."""
    _, _, body = fenced_block(paragraph)
    wrap = len("```\n\n```")
    inner = _split("\n".join(body), escape_text, limit - wrap, ("\n", " "))
    return ["```\n" + piece + "\n```" for piece in inner]


def mrkdwn_pieces(paragraph: str, limit: int = SECTION_TEXT_LIMIT) -> list[str]:
    """One Markdown paragraph as mrkdwn pieces of at most `limit` characters; long ones cut at lines, sentences, words."""
    if is_code_block(paragraph):
        whole = paragraph_to_mrkdwn(paragraph)
        return [whole] if len(whole) <= limit else _split_code_block(paragraph, limit)
    return _split(paragraph, paragraph_to_mrkdwn, limit)


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
STOP_ACTION_ID = "deepthread_stop"
# "Watch this" under a research report (value: the run id), and a watch listing's buttons (value: the watch id).
WATCH_ACTION_ID = "deepthread_watch"
WATCH_PAUSE_ACTION_ID = "deepthread_watch_pause"
WATCH_RESUME_ACTION_ID = "deepthread_watch_resume"
WATCH_DELETE_ACTION_ID = "deepthread_watch_delete"


def button(action_id: str, label: str, value: str) -> dict[str, Any]:
    """A Block Kit button whose click reaches the adapter as `action_id` with `value`."""
    return {"type": "button", "action_id": action_id, "text": {"type": "plain_text", "text": label}, "value": value}


def actions_block(buttons: list[dict[str, Any]]) -> dict[str, Any]:
    """An `actions` block holding `buttons`."""
    return {"type": "actions", "elements": buttons}


def stop_button(run_id: int) -> dict[str, Any]:
    """The red Stop button of a run in flight (a run not stored yet names no run: its status message says which)."""
    stop = {**button(STOP_ACTION_ID, "Stop", str(run_id)), "style": "danger"}
    if not run_id:
        del stop["value"]
    return stop


def run_buttons(progress: RunProgress) -> dict[str, Any] | None:
    """Stop while a run is queued or running; Retry (and, for research, Continue) once it ended without finishing."""
    if progress.state in ACTIVE_STATES:
        return actions_block([stop_button(progress.run_id)])
    if not is_unfinished(progress):
        return None
    value = str(progress.run_id)
    buttons = [button(RETRY_ACTION_ID, "Retry", value)]
    if progress.mode == "research":
        buttons.append(button(CONTINUE_ACTION_ID, "Continue", value))
    return actions_block(buttons)


def export_buttons(run_id: int, *, watchable: bool = False) -> dict[str, Any]:
    """The "Export Markdown" button under a delivered report, and "Watch this" beside it when it may be watched."""
    buttons = [button(EXPORT_ACTION_ID, "Export Markdown", str(run_id))]
    if watchable:
        buttons.append(button(WATCH_ACTION_ID, "Watch this", str(run_id)))
    return actions_block(buttons)


def is_watchable(report: Report) -> bool:
    """Whether "Watch this" goes under `report`: a research report a person asked for (not a plan, quick answer or
    follow-up, nor a watch's own run), not stopped half way."""
    return report.mode == "research" and report.watch is None and not report.stopped_by_user


def with_export_button(delivery: ReportDelivery, run_id: int, *, watchable: bool = False) -> ReportDelivery:
    """`delivery` with the export button (and "Watch this" when `watchable`) under its last message (in a message of
    its own when that one is full)."""
    messages = list(delivery.messages)
    last = messages[-1]
    last_blocks = blocks_of(last)
    buttons = export_buttons(run_id, watchable=watchable)
    if last_blocks is not None and len(last_blocks) < BLOCKS_PER_MESSAGE:
        messages[-1] = slack_content(last.text, [*last_blocks, buttons])
    else:
        text = "Export this report as Markdown:"
        messages.append(slack_content(text, [section_block(text), buttons]))
    return delivery.model_copy(update={"messages": messages})


def _content_from_sections(sections: list[str]) -> Content:
    return slack_content("\n\n".join(sections), [section_block(section) for section in sections])


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

def _source_line_mrkdwn(source: ReportSource) -> str:
    title = single_line(source.title) or source.url
    line = f"[{source.number}] " + (mrkdwn_link(source.url, title) if source.url else escape_text(title))
    return f"{line} _({SNIPPET_LABEL})_" if source.snippet_only else line


def _source_line_markdown(source: ReportSource) -> str:
    line = f"- \\[{source.number}\\] {markdown_source_link(source, _escape_markdown_label)}"
    return escape_text(f"{line} ({SNIPPET_LABEL})" if source.snippet_only else line)


def report_mrkdwn_paragraphs(report: Report) -> list[str]:
    """The report as mrkdwn pieces in reading order (title, body, sources, footer), each within one section."""
    title, body = title_and_body(report)
    pieces = _split(f"*{title}*", escape_text, SECTION_TEXT_LIMIT)
    for paragraph in markdown_paragraphs(body):
        pieces.extend(mrkdwn_pieces(paragraph))
    if report.sources:
        sources = "\n".join(["*Sources*"] + [_source_line_mrkdwn(source) for source in report.sources])
        pieces.extend(_split(sources, unchanged, SECTION_TEXT_LIMIT))
    footer = "──────────\n" + "\n".join(f"_{escape_text(line)}_" for line in footer_lines(report))
    pieces.extend(_split(footer, unchanged, SECTION_TEXT_LIMIT))
    if stopped := stopped_line(report):
        pieces.append(f"*{escape_text(stopped)}*")
    return pieces


def report_slack_markdown(report: Report) -> str:
    """The whole report as escaped Markdown for one `markdown` block, linking only to its sources."""
    title, body = title_and_body(report)
    parts = [f"# {escape_text(title)}"]
    parts.extend(paragraph_to_slack_markdown(paragraph) for paragraph in markdown_paragraphs(body))
    if report.sources:
        parts.append("## Sources\n\n" + "\n".join(_source_line_markdown(source) for source in report.sources))
    parts.append("---\n\n" + "\n\n".join(f"_{escape_text(line)}_" for line in footer_lines(report)))
    if stopped := stopped_line(report):
        parts.append(f"**{escape_text(stopped)}**")
    return escaped_linking_only_to("\n\n".join(parts), [source.url for source in report.sources])


_LINK_RULE_PASSES = 4


def escaped_linking_only_to(escaped: str, urls: list[str]) -> str:
    """Escaped Markdown for a `markdown` block with the link rule applied again, both as it is written and with its
    `&amp; &lt; &gt;` read as the characters: escaping changes what Markdown reads (`[x]: <a>*` defines no link,
    `[x]: &lt;a&gt;*` does; `> [x]: a` is a quoted definition, `&gt; [x]: a` is text)."""
    for _ in range(_LINK_RULE_PASSES):
        escaped = only_source_links(escaped, urls)
        decoded = escaped.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
        linked = only_source_links(decoded, urls)
        if linked == decoded:
            return escaped
        escaped = escape_text(linked)
    return only_source_links(escaped, urls)


# --- status --------------------------------------------------------------------------------------

def emoji_code(name: str) -> str:
    """`:x:` for an emoji name, or the emoji itself when it is given as a character (`❌`)."""
    return f":{name.strip(':')}:" if name.isascii() else name


# --- the renderer --------------------------------------------------------------------------------

class SlackRenderer:
    """Status messages, reports and notices as Slack Block Kit, within Slack's limits."""

    platform = "slack"

    def __init__(self, *, cancel_emoji: str = setting_default("cancel_emoji")[0], max_messages: int = DEFAULT_MAX_MESSAGES,
                 use_markdown_blocks: bool = True) -> None:
        self.cancel_emoji = cancel_emoji
        self.max_messages = max_messages
        self.use_markdown_blocks = use_markdown_blocks

    def status(self, progress: RunProgress, *, now: dt.datetime) -> Content:
        """The status message: question, requester, phase checklist, counts, progress bar, elapsed time and ending."""
        top = headline(progress, MARKUP)
        checklist = phase_checklist(progress, MARKUP)
        measures = measures_line(progress, now)
        last = ending(progress, MARKUP, stop_hint=f"React with {emoji_code(self.cancel_emoji)}")
        blocks = [section_block(top)]
        if checklist and progress.state != "queued":
            blocks.append(section_block(checklist))
        if measures:
            blocks.append(context_block(measures))
        blocks.append(section_block(last) if progress.state not in ACTIVE_STATES else context_block(last))
        buttons = run_buttons(progress)
        if buttons is not None:
            blocks.append(buttons)
        text = "\n\n".join(part for part in (top, checklist if progress.state != "queued" else "", measures, last) if part)
        return with_thread_status(slack_content(text, blocks), progress)

    def report(self, report: Report, *, requester: str, run_id: int | None = None) -> ReportDelivery:
        """The report's messages, the first mentioning the requester, the last with an export button (and "Watch this"
        under a research report) and 👍/👎 feedback buttons when `run_id` is given; as a summary plus `report.md` when
        too long."""
        delivery = self._report_messages(report, requester)
        if run_id is None or not delivery.messages:
            return delivery
        return with_feedback_buttons(with_export_button(delivery, run_id, watchable=is_watchable(report)), run_id)

    def _report_messages(self, report: Report, requester: str) -> ReportDelivery:
        greeting = self._greeting(report, requester)
        if self.use_markdown_blocks:
            markdown = report_slack_markdown(report)
            if len(markdown) <= MARKDOWN_BLOCK_LIMIT and not _has_code_with_control_characters(report.body_markdown):
                fallback = "\n\n".join([greeting, *report_mrkdwn_paragraphs(report)])
                return ReportDelivery(messages=[slack_content(fallback, [section_block(greeting), markdown_block(markdown)])])
        sections = pack_sections(report_mrkdwn_paragraphs(report))
        grouped = pack_messages(sections, first_message_blocks=1)
        if len(grouped) > self.max_messages:
            return self._as_file(report, greeting)
        messages = [_content_from_sections(group) for group in grouped]
        first = messages[0]
        messages[0] = slack_content(f"{greeting}\n\n{first.text}", [section_block(greeting), *(blocks_of(first) or [])])
        return ReportDelivery(messages=messages)

    def notice(self, text: str) -> Content:
        """A short notice in the thread; the text is treated as untrusted."""
        escaped = escape_text(text)
        sections = _split(text, escape_text, SECTION_TEXT_LIMIT)
        # Too many sections for one message: the plain text carries it whole rather than cutting blocks off.
        blocks = [section_block(section) for section in sections] if len(sections) <= BLOCKS_PER_MESSAGE else None
        return slack_content(escaped, blocks)

    def reply(self, text: str, *, person: str | None = None) -> Content:
        """A core reply as mrkdwn: its `**bold**` and code converted, `& < >` escaped so nothing quoted can ping."""
        return Content(text=with_person(text, person, paragraph_to_mrkdwn, user_mention))

    def history(self, history: RunHistory) -> Content:
        """The history as mrkdwn: each question a link to its thread, dates in the reader's own time zone."""
        if history.empty:
            return Content(text=paragraph_to_mrkdwn(NO_RUNS))
        return Content(text=history_listing(history, heading=lambda title: f"*{title}*", line=_history_line))

    def watches(self, listing: WatchListing) -> Content:
        """The channel's watches, a section each with Pause or Resume and Delete buttons on those the person may
        change; as text alone (changed with `/watches pause N` and the like) when they take more than one message's
        blocks."""
        if not listing.watches:
            return Content(text=paragraph_to_mrkdwn(NO_WATCHES))
        text = _watches_text(listing)
        blocks = [section_block(WATCHES_HEADING)]
        for watch in listing.watches:
            blocks.append(section_block(_watch_mrkdwn(watch, separator="\n")))
            if watch.may_change:
                blocks.append(watch_buttons(watch))
        if len(blocks) > BLOCKS_PER_MESSAGE:
            return Content(text=f"{text}\n{WATCHES_WITHOUT_BUTTONS}")
        return slack_content(text, blocks)

    def _greeting(self, report: Report, requester: str) -> str:
        question = escape_text(shortened(single_line(report.question) or title_and_body(report)[0], 300))
        if report.mode == "plan":
            return (f"{user_mention(requester)} here is a research plan for “{question}”. Reply *go* (or react "
                    f"✅ on the status message) to run it, or reply with what to change.")
        if report.mode in ("chat", "followup"):
            return f"{user_mention(requester)} on “{question}”:"
        return f"{user_mention(requester)} here is your report on “{question}”."

    def _as_file(self, report: Report, greeting: str) -> ReportDelivery:
        title, _ = title_and_body(report)
        lines = [greeting, f"*{escape_text(title)}*",
                 f"The report is too long for Slack messages, so the full text is in `{REPORT_FILENAME}` below "
                 f"({len(report.sources)} sources)."]
        lines.extend(f"_{escape_text(line)}_" for line in footer_lines(report))
        if stopped := stopped_line(report):
            lines.append(f"*{escape_text(stopped)}*")
        summary = "\n\n".join(lines)
        sections = pack_sections([piece for line in lines
                                  for piece in _split(line, unchanged, SECTION_TEXT_LIMIT)])
        upload = FileUpload(filename=REPORT_FILENAME, data=render_markdown(report).encode("utf-8"),
                            title=shortened(single_line(title), 200).replace("<", "‹").replace(">", "›"))
        return ReportDelivery(messages=[slack_content(summary, [section_block(section) for section in sections])],
                              file=upload)


SLACK_CLIENT_URL = "https://app.slack.com/client"
HISTORY_QUESTION_LIMIT = 80


def thread_link(thread: Place) -> str:
    """The Slack client's address of a thread, from the workspace, channel and thread timestamp alone."""
    ts = thread.thread or ""
    return f"{SLACK_CLIENT_URL}/{thread.workspace}/{thread.channel}/thread/{thread.channel}-{ts}"


def slack_date(moment: dt.datetime) -> str:
    """A date Slack shows in the reader's time zone, with the UTC time as the fallback text."""
    fallback = f"{moment:%Y-%m-%d %H:%M} UTC"
    return f"<!date^{int(moment.timestamp())}^{{date_short_pretty}} {{time}}|{fallback}>"


def _history_line(run: RunSummary) -> str:
    question = shortened(single_line(run.question), HISTORY_QUESTION_LIMIT)
    return (f"• {mrkdwn_link(thread_link(run.thread), question)} — {run.state} · {mode_name(run.mode)} · "
            f"{slack_date(run.created_at)} · run {run.run_id}")


WATCHES_HEADING = "*Watches in this channel*"
WATCHES_WITHOUT_BUTTONS = "_Too many to show with buttons: `/watches pause N`, `resume N` or `delete N` changes watch N._"
WATCH_QUESTION_LIMIT = 120
# Slack cuts `text` at 40,000 characters; the closing lines always fit under this.
WATCHES_TEXT_BUDGET = 38_000


def _watch_mrkdwn(watch: WatchSummary, *, separator: str) -> str:
    """One watch as mrkdwn: number and question (escaped: it may neither ping nor link), schedule, next run, owner."""
    question = escape_text(shortened(single_line(watch.question), WATCH_QUESTION_LIMIT))
    parts = [f"*#{watch.watch_id}* {question}", escape_text(watch.when)]
    if watch.state == "active":
        parts.append(f"next {slack_date(watch.next_due_at)}")
    parts.append(f"by {user_mention(watch.created_by)}")
    return separator.join(parts)


def _watches_text(listing: WatchListing) -> str:
    """The listing as mrkdwn lines, as many as Slack's text field holds, the rest counted."""
    lines = [WATCHES_HEADING]
    used = len(WATCHES_HEADING)
    for shown, watch in enumerate(listing.watches):
        line = f"• {_watch_mrkdwn(watch, separator=' · ')}"
        if used + len(line) + 1 > WATCHES_TEXT_BUDGET:
            lines.append(f"…and {len(listing.watches) - shown} more.")
            break
        lines.append(line)
        used += len(line) + 1
    return "\n".join(lines)


def watch_buttons(watch: WatchSummary) -> dict[str, Any]:
    """Pause (an active watch) or Resume (a paused or stopped one), and Delete behind a confirmation; each button's
    value is the watch id, its block named for the watch so that the action ids stay unique within it."""
    value = str(watch.watch_id)
    toggle = (button(WATCH_PAUSE_ACTION_ID, "Pause", value) if watch.state == "active"
              else button(WATCH_RESUME_ACTION_ID, "Resume", value))
    delete = {**button(WATCH_DELETE_ACTION_ID, "Delete", value), "style": "danger", "confirm": {
        "title": {"type": "plain_text", "text": f"Delete watch #{watch.watch_id}?"},
        "text": {"type": "plain_text", "text": "It will not run again. Its past reports stay in their threads."},
        "confirm": {"type": "plain_text", "text": "Delete"}, "deny": {"type": "plain_text", "text": "Keep it"},
        "style": "danger"}}
    return {**actions_block([toggle, delete]), "block_id": f"deepthread_watch_{watch.watch_id}"}
