"""What a status message says, in every platform's markup: the wording is written once here, and each
renderer supplies its `Markup` (how to make bold text, escape untrusted text, mention a person).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass

from chat.state import RunProgress
from chat.text import shortened, single_line

QUESTION_DISPLAY_LIMIT = 500
STATUS_LINE_LIMIT = 500
PROGRESS_BAR_CELLS = 10
PHASE_MARKS = {"done": "✅", "current": "⏳", "waiting": "▫️", "failed": "❌"}
COUNT_LABELS = (("sub_questions", "sub-question", "sub-questions"), ("results", "result", "results"),
                ("pages_read", "page read", "pages read"), ("passages", "passage", "passages"),
                ("words_written", "word written", "words written"))
SEPARATOR = " · "
VERBS = {"plan": "Planning", "chat": "Answering", "followup": "Answering"}
PARTIAL = "Partial"


@dataclass(frozen=True)
class Markup:
    """One platform's inline markup: how untrusted text is made inert (it can neither ping, link nor format),
    how escaped text is made bold, and how a platform-qualified user id (`slack:U123`) is mentioned."""

    escape: Callable[[str], str]
    bold: Callable[[str], str]
    mention: Callable[[str], str]


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


def measures_line(progress: RunProgress, now: dt.datetime) -> str:
    """Counts, the progress bar (while running and when done) and the elapsed time, on one line."""
    parts = [part for part in (counts_line(progress.counts),) if part]
    if progress.state in ("running", "done"):
        parts.append(progress_bar(progress.percent))
    if progress.started_at is not None:
        parts.append(f"⏱ {format_elapsed(progress.elapsed_seconds(now))}")
    return SEPARATOR.join(parts)


def phase_checklist(progress: RunProgress, markup: Markup) -> str:
    """One line per phase: a mark for done, current, waiting or failed, and the phase's label (current in bold)."""
    lines = []
    for line in progress.phases:
        label = markup.escape(line.label)
        lines.append(f"{PHASE_MARKS[line.status]} {markup.bold(label) if line.status == 'current' else label}")
    return "\n".join(lines)


def headline(progress: RunProgress, markup: Markup) -> str:
    """`Researching: the question` and, on the next line, who asked."""
    question = markup.escape(shortened(single_line(progress.question), QUESTION_DISPLAY_LIMIT))
    verb = VERBS.get(progress.mode, "Researching")
    return f"{markup.bold(verb + ':')} {question}\nasked by {markup.mention(progress.requested_by)}"


def _line(text: str | None, markup: Markup) -> str:
    return markup.escape(shortened(single_line(text or ""), STATUS_LINE_LIMIT))


def ending(progress: RunProgress, markup: Markup, *, stop_hint: str) -> str:
    """The last lines: how to stop a run in flight (`stop_hint`, e.g. "React with :x:"), or how it ended."""
    state = progress.state
    if state == "queued":
        position = f" — position {progress.queue_position} in the queue" if progress.queue_position else ""
        return f"🕒 {markup.bold('Queued')}{position}. {stop_hint} to cancel."
    if state == "running":
        return f"{stop_hint} to stop the research and keep what it found."
    if state == "done":
        audit = _line(progress.audit_line, markup)
        if not progress.partial:
            return f"✅ {markup.bold('Done')}" + (f" — {audit}" if audit else "")
        # A partial run did not finish what was asked: it never reads "Done".
        reason = _line(progress.partial_reason, markup).rstrip(".")
        partial = f"⚠️ {markup.bold(PARTIAL)}" + (f" — {reason}" if reason else "")
        return f"{partial}\n{audit}" if audit else partial
    if state == "cancelled":
        return f"🛑 {markup.bold('Stopped')}" + (f" by {markup.mention(progress.cancelled_by)}" if progress.cancelled_by else "")
    if state == "timed_out":
        return f"⌛ {markup.bold('Timed out')}: " + (_line(progress.error, markup) or "the run took too long and was stopped")
    if state == "failed":
        return f"❌ {markup.bold('Failed')}: " + (_line(progress.error, markup) or "an unexpected error")
    return markup.escape(state)


def is_unfinished(progress: RunProgress) -> bool:
    """Whether a run ended without finishing (failed, timed out, stopped, or done but partial): it can be retried."""
    return progress.state in ("failed", "timed_out", "cancelled") or (progress.state == "done" and progress.partial)
