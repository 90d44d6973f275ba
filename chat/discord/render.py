"""Discord rendering: status messages, reports and replies as Discord Markdown within Discord's limits.

Discord shows Markdown in message content (headings up to `###`, lists, bold, masked links, code,
`-#` subtext), so a report keeps the model's Markdown and is split at paragraph boundaries into
messages of at most 2,000 characters; a report that would take more than `max_messages` messages goes
out as a short summary with the whole text attached as `report.md`. Nothing is cut off.

No message can ping anyone by accident: every message carries `allowed_mentions` with nothing to
parse, and only the report's first message lists the requester, the one person it mentions on purpose.
Untrusted text that is not Markdown by nature (questions, page titles, reasons) is escaped, so it
shows as typed. Link previews are suppressed on every message (`flags`: SUPPRESS_EMBEDS).

Discord-specific parts of a message ride in `Content.extra["discord"]`: `allowed_mentions`, `flags`
and `components` (the Stop, Retry, Continue and Export buttons, 👍/👎 and Watch this under a report, and a watch
listing's Pause, Resume and Delete), which the messenger sends as they are.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any, Literal
from urllib.parse import unquote

from chat.history import NO_RUNS, RunHistory, RunSummary, history_listing, mode_name
from chat.message import Content, FileUpload, Place
from chat.render import ReportDelivery, with_person
from chat.watches import NO_WATCHES, WatchListing, WatchSummary
from chat.state import RunProgress
from chat.status import Markup, ending, headline, is_unfinished, measures_line, phase_checklist
from chat.text import (
    markdown_source_link,
    footer_lines,
    pack_pieces,
    shortened,
    single_line,
    split_source,
    title_and_body,
    unchanged,
)
from research.markdown import fenced_block, heading_level, is_atx, is_code_block, markdown_paragraphs, read
from research.report import SNIPPET_LABEL, Report, ReportSource, render_markdown, stopped_line
from storage.vocabulary import ACTIVE_STATES

CONTENT_LIMIT = 2_000
EMBED_DESCRIPTION_LIMIT = 4_096
EMBEDS_TOTAL_LIMIT = 6_000
EMBEDS_PER_MESSAGE = 10
THREAD_NAME_LIMIT = 100
DEFAULT_MAX_MESSAGES = 15
REPORT_FILENAME = "report.md"
SUPPRESS_EMBEDS = 1 << 2
KEY = "discord"

# Button custom ids: the adapter reads the action, and the run id after the second colon where there is one.
CANCEL_ID = "deepthread:cancel"
RETRY_PREFIX = "deepthread:retry:"
CONTINUE_PREFIX = "deepthread:continue:"
EXPORT_PREFIX = "deepthread:export:"
# 👍/👎 under a report: `deepthread:feedback:good:42`, the verdict and the run, like Slack's button values.
Verdict = Literal["good", "bad"]
FEEDBACK_PREFIX = "deepthread:feedback:"
FEEDBACK_LABELS: dict[Verdict, str] = {"good": "👍", "bad": "👎"}
BUTTON_PRIMARY, BUTTON_SECONDARY, BUTTON_DANGER = 1, 2, 4
# "Watch this" under a finished research report: `deepthread:watch:42`, the run whose question is watched.
WATCH_THIS_PREFIX = "deepthread:watch:"
WATCH_THIS_LABEL = "Watch this"
# A watch listing's buttons: `deepthread:watches:pause:7`, what to do and the watch.
WatchButton = Literal["pause", "resume", "delete"]
WATCH_BUTTON_PREFIX = "deepthread:watches:"
# Discord: at most five action rows of five buttons a message; two watches a row (each has two buttons) read clearly.
ACTION_ROWS_LIMIT = 5
WATCHES_PER_ROW = 2
WATCH_QUESTION_LIMIT = 120
WATCHES_WITHOUT_BUTTONS = ("Change the others with `/watches pause N`, `/watches resume N` or `/watches delete N` "
                           "(N is the watch's number).")

_MARKDOWN_SPECIALS = re.compile(r"([\\*_~`|>#\[\]()<-])")
_DISCORD_USER_ID = re.compile(r"^\d{15,21}$")
RULE = "──────────"
# Discord shows headings `#` to `###`; a deeper one is shown bold.
_DEEPEST_HEADING = 3


# --- markup ----------------------------------------------------------------------------------------

def escape_text(text: str) -> str:
    """`text` with Discord's Markdown characters backslash-escaped, so it shows exactly as typed."""
    return _MARKDOWN_SPECIALS.sub(r"\\\1", text)


def bare_user(user: str) -> str:
    """`discord:42` → `42`: the id as Discord knows it."""
    return user.removeprefix(f"{KEY}:")


def user_mention(user: str) -> str:
    """`<@42>` for a Discord user id (a `discord:` prefix is allowed); any other value is shown as escaped text."""
    bare = bare_user(user)
    return f"<@{bare}>" if _DISCORD_USER_ID.match(bare) else escape_text(user)


MARKUP = Markup(escape=escape_text, bold=lambda escaped: f"**{escaped}**", mention=user_mention)


def no_pings(*users: str) -> dict[str, Any]:
    """`allowed_mentions` that lets nothing ping but the given users."""
    ids = [bare_user(user) for user in users if _DISCORD_USER_ID.match(bare_user(user))]
    return {"parse": [], "users": ids} if ids else {"parse": []}


def message(text: str, *, components: list[dict[str, Any]] | None = None, mention: str | None = None) -> Content:
    """One Discord message: `text` as content, link previews off, pinging nobody but `mention`."""
    payload: dict[str, Any] = {"allowed_mentions": no_pings(mention) if mention else no_pings(),
                               "flags": SUPPRESS_EMBEDS}
    if components is not None:
        payload["components"] = components
    return Content(text=text, extra={KEY: payload})


def button(label: str, custom_id: str, style: int = BUTTON_SECONDARY) -> dict[str, Any]:
    return {"type": 2, "style": style, "label": label, "custom_id": custom_id}


def action_row(*buttons: dict[str, Any]) -> dict[str, Any]:
    return {"type": 1, "components": list(buttons)}


def status_buttons(progress: RunProgress) -> list[dict[str, Any]]:
    """Stop while a run is queued or running; Retry (and Continue for research) once it ended unfinished."""
    if progress.state in ACTIVE_STATES:
        return [action_row(button("Stop", CANCEL_ID, BUTTON_DANGER))]
    if is_unfinished(progress) and progress.run_id:
        buttons = [button("Retry", f"{RETRY_PREFIX}{progress.run_id}", BUTTON_PRIMARY)]
        if progress.mode == "research":
            buttons.append(button("Continue", f"{CONTINUE_PREFIX}{progress.run_id}"))
        return [action_row(*buttons)]
    return []


def thread_name(text: str) -> str:
    """A thread name from `text`: one line, at most 100 characters."""
    return shortened(single_line(text), THREAD_NAME_LIMIT) or "deepthread"


# --- reports -------------------------------------------------------------------------------------

def paragraph_to_discord(paragraph: str) -> str:
    """One Markdown paragraph for Discord: fenced code as it is, other lines adjusted where Discord differs (a
    heading deeper than `###` bold, a rule, or the `---` under a heading, a line of `─`)."""
    document = read(paragraph)
    changed: dict[int, str] = {}
    for index, token in enumerate(document.tokens):
        if token.map is None:
            continue
        if token.type == "hr" and token.level == 0:
            changed[token.map[0]] = RULE
        elif token.type == "heading_open" and not is_atx(token) and token.markup == "-":
            changed[token.map[1] - 1] = RULE
        elif token.type == "heading_open" and heading_level(token) > _DEEPEST_HEADING and document.tokens[index + 1].content:
            line = document.lines[token.map[0]]
            changed[token.map[0]] = f"{line[:line.index('#')]}**{document.tokens[index + 1].content}**"
    if not changed:
        return paragraph
    return "\n".join(changed.get(number, line) for number, line in enumerate(document.lines))


def _split_code_block(paragraph: str, limit: int) -> list[str]:
    """A fenced code block too long for one message, as several fenced blocks cut at line ends."""
    fence, language, body = fenced_block(paragraph)
    wrap = len(fence + language) + len(fence) + 2
    pieces = split_source("\n".join(body), unchanged, limit - wrap, ("\n", " "))
    # The language is named once, on the first piece, so the pieces read back as the block that was written.
    return [f"{fence}{language if index == 0 else ''}\n{piece}\n{fence}" for index, piece in enumerate(pieces)]


def paragraph_pieces(paragraph: str, limit: int = CONTENT_LIMIT) -> list[str]:
    """One paragraph as pieces of at most `limit` characters (long ones cut at lines, sentences, words)."""
    converted = paragraph_to_discord(paragraph)
    if len(converted) <= limit:
        return [converted]
    if is_code_block(paragraph):
        return _split_code_block(paragraph, limit)
    # The conversion works line by line and escapes nothing, so the converted text can be split as it is.
    return split_source(converted, unchanged, limit)


def source_line(source: ReportSource) -> str:
    """`[1] [Title](url)`: the page's title (escaped) linked to its http(s) address."""
    line = f"\\[{source.number}\\] {markdown_source_link(source, escape_text)}"
    return f"{line} *({SNIPPET_LABEL})*" if source.snippet_only else line


# Discord reads `[label](address)` as a link wherever CommonMark does not (a label over a heading's end, brackets
# that do not balance, inside a `~~~` fence or an unclosed one); a zero-width space between `]` and `(` unmakes it.
_MASKED_LINK_JOINT = "]("
_UNMADE_JOINT = "]\u200b("


def _masked_link_target(text: str) -> str:
    """Where a masked link would point whose `](` comes just before `text`, as Discord reads it: after white space
    and a `<`, up to white space, `>` or the `)` that closes it, backslash escapes undone."""
    position = 0
    while position < len(text) and text[position].isspace():
        position += 1
    position += text.startswith("<", position)
    target: list[str] = []
    depth = 0
    while position < len(text) and not text[position].isspace() and text[position] != ">":
        character = text[position]
        if character == "\\" and position + 1 < len(text) and not text[position + 1].isalnum():
            position += 1
            character = text[position]
        elif character == ")" and depth == 0:
            break
        else:
            depth += {"(": 1, ")": -1}.get(character, 0)
        target.append(character)
        position += 1
    return "".join(target)


def _comparable_url(url: str) -> str:
    return unquote(url).strip().rstrip("/").lower()


def only_masked_links_to(text: str, urls: list[str]) -> str:
    """`text` with every masked link Discord would read that goes to an address (anything with a scheme) other than
    one of `urls` unmade; code such as `f[0](x)` stays as it is."""
    allowed = {_comparable_url(url) for url in urls if url}
    allowed |= {_comparable_url(url.replace("(", "%28").replace(")", "%29")) for url in urls if url}
    pieces = text.split(_MASKED_LINK_JOINT)
    kept = [pieces[0]]
    for piece in pieces[1:]:
        target = _masked_link_target(piece)
        goes_elsewhere = (":" in target or target.startswith("/")) and _comparable_url(target) not in allowed
        kept.append((_UNMADE_JOINT if goes_elsewhere else _MASKED_LINK_JOINT) + piece)
    return "".join(kept)


def report_pieces(report: Report) -> list[str]:
    """The report as Discord Markdown pieces in reading order (title, body, sources, footer), each ≤ 2,000."""
    title, body = title_and_body(report)
    body = only_masked_links_to(body, [source.url for source in report.sources])
    pieces = split_source(f"# {escape_text(title)}", unchanged, CONTENT_LIMIT)
    for paragraph in markdown_paragraphs(body):
        pieces.extend(paragraph_pieces(paragraph))
    if report.sources:
        pieces.extend(pack_pieces(["## Sources", *(source_line(source) for source in report.sources)],
                                  CONTENT_LIMIT, joiner="\n"))
    footer = [f"-# {escape_text(line)}" for line in footer_lines(report)]
    pieces.extend(pack_pieces(footer, CONTENT_LIMIT, joiner="\n"))
    if stopped := stopped_line(report):
        pieces.append(f"**{escape_text(stopped)}**")
    return pieces


def feedback_custom_id(verdict: Verdict, run_id: int) -> str:
    """What a 👍/👎 button sends back when clicked: `deepthread:feedback:good:42`."""
    return f"{FEEDBACK_PREFIX}{verdict}:{run_id}"


def report_row(run_id: int, *, watchable: bool = False) -> dict[str, Any]:
    """The buttons under a report: export it, say whether it was good (👍) or something was wrong (👎), and, under a
    `watchable` one, watch its question."""
    feedback = [button(label, feedback_custom_id(verdict, run_id)) for verdict, label in FEEDBACK_LABELS.items()]
    watch = [button(WATCH_THIS_LABEL, f"{WATCH_THIS_PREFIX}{run_id}", BUTTON_PRIMARY)] if watchable else []
    return action_row(button("Export Markdown", f"{EXPORT_PREFIX}{run_id}"), *feedback, *watch)


def watchable(report: Report) -> bool:
    """Whether a report offers "Watch this": a research report, not stopped, that no watch made (a watch's own run is
    watched already)."""
    return report.mode == "research" and not report.stopped_by_user and report.watch is None


def watch_custom_id(action: WatchButton, watch_id: int) -> str:
    """What a watch listing's button sends back when clicked: `deepthread:watches:pause:7`."""
    return f"{WATCH_BUTTON_PREFIX}{action}:{watch_id}"


def watch_line(watch: WatchSummary) -> str:
    """One watch of a listing: number, question (shown as typed), schedule, next run (in the reader's own time), and
    who made it (named, never pinged: the message allows no mentions)."""
    question = escape_text(shortened(single_line(watch.question), WATCH_QUESTION_LIMIT))
    parts = [f"• **#{watch.watch_id}** {question}", escape_text(watch.when)]
    if watch.state == "active":
        parts.append(f"next <t:{int(watch.next_due_at.timestamp())}:f>")
    if watch.one_thread:
        parts.append("in its thread")
    parts.append(f"by {user_mention(watch.created_by)}")
    return " · ".join(parts)


def watch_buttons(watch: WatchSummary) -> list[dict[str, Any]]:
    """Pause (an active watch) or Resume (a paused or stopped one), and Delete."""
    number = watch.watch_id
    if watch.state == "active":
        first = button(f"Pause #{number}", watch_custom_id("pause", number))
    else:
        first = button(f"Resume #{number}", watch_custom_id("resume", number), BUTTON_PRIMARY)
    return [first, button(f"Delete #{number}", watch_custom_id("delete", number), BUTTON_DANGER)]


# --- the renderer --------------------------------------------------------------------------------

class DiscordRenderer:
    """Status messages, reports, notices and replies as Discord messages, within Discord's limits."""

    platform = KEY

    def __init__(self, *, cancel_emoji: str = "❌", max_messages: int = DEFAULT_MAX_MESSAGES) -> None:
        self.cancel_emoji = cancel_emoji if not cancel_emoji.isascii() else "❌"
        self.max_messages = max_messages

    def status(self, progress: RunProgress, *, now: dt.datetime) -> Content:
        """Question, requester, phase checklist, counts, bar, elapsed time and ending; Stop or Retry buttons."""
        parts = [headline(progress, MARKUP)]
        if progress.state != "queued":
            parts.append(phase_checklist(progress, MARKUP))
        measures = measures_line(progress, now)
        if measures:
            parts.append(f"-# {measures}")
        parts.append(ending(progress, MARKUP, stop_hint=f"React with {self.cancel_emoji} or press **Stop**"))
        text = "\n".join(part for part in parts if part)
        return message(text, components=status_buttons(progress))

    def report(self, report: Report, *, requester: str, run_id: int | None = None) -> ReportDelivery:
        """The report's messages, the first mentioning the requester, the last with the export and 👍/👎 buttons
        when `run_id` is given; as a summary plus `report.md` when it would take more than `max_messages`."""
        greeting = self._greeting(report, requester)
        texts = pack_pieces([greeting, *report_pieces(report)], CONTENT_LIMIT)
        if len(texts) > self.max_messages:
            return self._as_file(report, greeting, requester, run_id)
        messages = [message(text, mention=requester if index == 0 else None) for index, text in enumerate(texts)]
        if run_id is not None:
            last = messages[-1]
            buttons = {"components": [report_row(run_id, watchable=watchable(report))]}
            messages[-1] = last.model_copy(update={"extra": {KEY: {**last.extra[KEY], **buttons}}})
        return ReportDelivery(messages=messages)

    def notice(self, text: str) -> Content:
        """A short notice in the thread; the text is untrusted and shown as typed."""
        return message(escape_text(text))

    def reply(self, text: str, *, person: str | None = None) -> Content:
        """A core reply: its neutral markup is Discord Markdown already; `person` is named without a ping."""
        return message(with_person(text, person, unchanged, user_mention))

    def history(self, history: RunHistory) -> Content:
        """The history in one message: each question a jump link to its thread, dates in the reader's time zone."""
        if history.empty:
            return message(NO_RUNS)
        return message(history_listing(history, heading=lambda title: f"**{title}**", line=_history_line,
                                       limit=CONTENT_LIMIT))

    def watches(self, listing: WatchListing) -> Content:
        """The channel's watches in one message, one line each, with Pause or Resume and Delete buttons on those the
        person may change, as many as Discord's rows hold; the others are changed with `/watches pause N` and the
        like, and watches past the message's length are counted."""
        if not listing.watches:
            return message(NO_WATCHES)
        heading = "**Watches in this channel**"
        lines = [heading]
        room = CONTENT_LIMIT - len(WATCHES_WITHOUT_BUTTONS) - 100  # the closing lines always fit
        shown: list[WatchSummary] = []
        for watch in listing.watches:
            line = watch_line(watch)
            if sum(len(kept) + 1 for kept in lines) + len(line) > room:
                break
            lines.append(line)
            shown.append(watch)
        changeable = [watch for watch in listing.watches if watch.may_change]
        with_buttons = [watch for watch in shown if watch.may_change][:ACTION_ROWS_LIMIT * WATCHES_PER_ROW]
        if len(shown) < len(listing.watches):
            lines.append(f"…and {len(listing.watches) - len(shown)} more, not shown here.")
        if len(with_buttons) < len(changeable):
            lines.append(WATCHES_WITHOUT_BUTTONS)
        rows = [action_row(*(item for watch in with_buttons[start:start + WATCHES_PER_ROW]
                             for item in watch_buttons(watch)))
                for start in range(0, len(with_buttons), WATCHES_PER_ROW)]
        return message("\n".join(lines), components=rows or None)

    def _greeting(self, report: Report, requester: str) -> str:
        question = escape_text(shortened(single_line(report.question) or title_and_body(report)[0], 300))
        if report.mode == "plan":
            return (f"{user_mention(requester)} here is a research plan for “{question}”. Reply **go** (or react ✅ "
                    "on the status message) to run it, or reply with what to change.")
        if report.mode in ("chat", "followup"):
            return f"{user_mention(requester)} on “{question}”:"
        return f"{user_mention(requester)} here is your report on “{question}”."

    def _as_file(self, report: Report, greeting: str, requester: str, run_id: int | None) -> ReportDelivery:
        title, _ = title_and_body(report)
        lines = [greeting, f"**{escape_text(shortened(title, 300))}**",
                 f"The report is too long for Discord messages, so the full text is in `{REPORT_FILENAME}` below "
                 f"({len(report.sources)} sources)."]
        lines.extend(f"-# {escape_text(shortened(line, 500))}" for line in footer_lines(report))
        if stopped := stopped_line(report):
            lines.append(f"**{escape_text(stopped)}**")
        summary = message("\n".join(lines), mention=requester,
                          components=[report_row(run_id, watchable=watchable(report))] if run_id is not None
                          else None)
        upload = FileUpload(filename=REPORT_FILENAME, data=render_markdown(report).encode("utf-8"),
                            title=thread_name(title))
        return ReportDelivery(messages=[summary], file=upload)


DISCORD_APP_URL = "https://discord.com/channels"
HISTORY_QUESTION_LIMIT = 60


def jump_url(thread: Place) -> str:
    """Discord's jump URL of a thread (in a direct message, of the DM itself: its workspace is `@me`)."""
    return f"{DISCORD_APP_URL}/{thread.workspace}/{thread.thread or thread.channel}"


def _history_line(run: RunSummary) -> str:
    question = escape_text(shortened(single_line(run.question), HISTORY_QUESTION_LIMIT))
    return (f"• [{question}]({jump_url(run.thread)}) — {run.state} · {mode_name(run.mode)} · "
            f"<t:{int(run.created_at.timestamp())}:f> · run {run.run_id}")
