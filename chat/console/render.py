"""The run's state and reports drawn for a terminal with rich."""

from __future__ import annotations

import datetime as dt

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.markup import escape
from rich.padding import Padding
from rich.progress_bar import ProgressBar
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from chat.history import RunHistory, RunSummary, mode_name
from chat.message import Content
from chat.render import ReportDelivery, with_person
from chat.watches import WatchListing, WatchSummary
from chat.state import RunProgress
from chat.status import counts_line, format_elapsed
from chat.text import platform_user, shortened, single_line
from research.markdown import PARSERS
from research.report import Report, only_source_links, render_markdown
from storage.vocabulary import ACTIVE_STATES, zone_of

MARKS = {"done": "[green]✔[/]", "current": "[yellow]▶[/]", "waiting": "[dim]·[/]", "failed": "[red]✘[/]"}
ENDINGS = {"done": "[green]Done[/]", "cancelled": "[yellow]Stopped[/]", "failed": "[red]Failed[/]",
           "timed_out": "[red]Timed out[/]"}
WARNING_DISPLAY_LIMIT = 160
WAITING_FOR_A_WORKER = "Waiting for a worker"
# Lines of the live region kept for the run's status above a growing answer draft.
STATUS_ROOM_LINES = 12
MIN_DRAFT_LINES = 3


def render_progress(progress: RunProgress, now: dt.datetime | None = None, *, you: str | None = None) -> RenderableType:
    """The status panel: question, phase checklist, bar, counts (or, while no worker has taken the run, that it waits
    for one) and the time since it was asked for, the latest warning, and a footer with the run's id and how to stop
    it (or how it ended, "by you" when `you` stopped it)."""
    now = now or dt.datetime.now(dt.timezone.utc)
    table = Table.grid(padding=(0, 1))
    for line in progress.phases:
        style = "bold" if line.status == "current" else ""
        table.add_row(MARKS[line.status], Text(line.label, style=style))
    elapsed = format_elapsed(progress.elapsed_seconds(now))
    lines: list[RenderableType] = [
        Text.from_markup(f"[bold]{escape(progress.question)}[/]"),
        table,
        ProgressBar(total=100, completed=progress.percent, width=40),
        Text.from_markup(f"{_measures(progress)}  [dim]{elapsed}[/]".lstrip()),
    ]
    if progress.last_warning:
        warning = shortened(single_line(progress.last_warning), WARNING_DISPLAY_LIMIT)
        lines.append(Text(f"⚠ {warning}", style="dim", no_wrap=True, overflow="ellipsis"))
    lines.append(Text.from_markup(_footer(progress, you)))
    return Group(*lines)


def _measures(progress: RunProgress) -> str:
    """What the run has done so far (its counts, as markup), or, while no worker has taken it, that it waits."""
    if progress.state == "queued":
        position = f" (position {progress.queue_position} in the queue)" if progress.queue_position else ""
        return f"[yellow]{WAITING_FOR_A_WORKER}[/]{position}"
    return escape(counts_line(progress.counts))


def _footer(progress: RunProgress, you: str | None) -> str:
    """`Run 12 · ` and how to stop the run while it is in flight, or how it ended."""
    state = progress.state
    if state == "queued":
        footer = "[dim]Ctrl-C cancels.[/]"
    elif state == "running":
        footer = "[dim]Ctrl-C stops the run and keeps what was found.[/]"
    elif state == "done" and progress.partial:
        # A partial run did not finish what was asked: it never reads "Done".
        footer = "[yellow]⚠ Partial[/]" + (f" — {escape(progress.partial_reason)}" if progress.partial_reason else "")
    else:
        footer = ENDINGS.get(state, escape(state))
    if state in ("failed", "timed_out") and progress.error:
        footer += f": {escape(progress.error)}"
    if state == "cancelled" and progress.cancelled_by:
        footer += " by you" if progress.cancelled_by == you else f" by {escape(platform_user(progress.cancelled_by))}"
    # A stopped or timed-out run is partial by nature ("Stopped by you" says it once); a failed one kept what it found.
    if progress.partial and progress.partial_reason and state == "failed":
        footer += f" (partial: {escape(progress.partial_reason)})"
    # A status redrawn before its run is stored has no id yet (0).
    return f"[dim]Run {progress.run_id} ·[/] {footer}" if progress.run_id else footer


class ConsoleRenderer:
    """Renders for the terminal: a live status panel, reports as Markdown; `you` is the user at this terminal."""

    platform = "cli"

    def __init__(self, *, you: str | None = None) -> None:
        self.you = you

    def status(self, progress: RunProgress, *, now: dt.datetime) -> Content:
        return Content(text=f"{progress.state}: {progress.question}",
                       extra={"live": progress.state in ACTIVE_STATES,
                              "rich": render_progress(progress, now, you=self.you)})

    def report(self, report: Report, *, requester: str, run_id: int | None = None) -> ReportDelivery:
        return ReportDelivery(messages=[Content(text=render_markdown(report), extra={"format": "markdown"})])

    def notice(self, text: str) -> Content:
        return Content(text=text)

    def draft(self, text: str) -> Content:
        """An answer still being written, shown live below its status: its newest lines that fit the screen. It has
        no audited sources yet, so by the link rule every link in it is its label and address as text."""
        from rich.markdown import Markdown  # here: `deepthread research` draws no draft, and its status panel no Markdown

        safe = only_source_links(text, [])
        return Content(text=safe, extra={"live": True, "rich": LatestLines(Padding(Markdown(safe), (1, 0, 0, 0)))})

    def reply(self, text: str, *, person: str | None = None) -> Content:
        """A core reply with its `**bold**` and `code` drawn by rich; the person named by their id."""
        markup = with_person(text, person, _rich_markup, _bare_user_markup)
        return Content(text=with_person(text, person, _without_markers, platform_user),
                       extra={"rich": Text.from_markup(markup)})

    def history(self, history: RunHistory) -> Content:
        """The history as a table (run id, state, mode, date, question): the run id is what `/export` takes."""
        runs = [*history.yours, *history.channel]
        if not runs:
            return Content(text=NO_RUNS_HERE)
        return Content(text="\n".join(_history_row(run) for run in runs), extra={"rich": HistoryTable(runs)})

    def watches(self, listing: WatchListing) -> Content:
        """The terminal's watches as a table (number, state, schedule, next run in the schedule's zone, question): the
        number is what `/watches pause N` takes."""
        if not listing.watches:
            return Content(text=NO_WATCHES_HERE)
        return Content(text="\n".join(_watch_row(watch) for watch in listing.watches),
                       extra={"rich": WatchesTable(listing.watches)})


def _neutral_pieces(text: str) -> list[tuple[str, str | None]]:
    """The neutral markup of a core reply read by markdown-it-py: its pieces of text, each with its rich style
    ("bold", "cyan" for code, None); an emphasis mark other than `**` stays as it was typed."""
    tokens = PARSERS.neutral_markup.parseInline(text)
    pieces: list[tuple[str, str | None]] = []
    bold = 0
    for token in tokens[0].children or [] if tokens else []:
        if token.type in ("strong_open", "strong_close"):
            bold += token.nesting
        elif token.type == "code_inline":
            pieces.append((token.content, "cyan"))
        elif token.content or token.markup:
            pieces.append((token.content or token.markup, "bold" if bold else None))
    return pieces


def _without_markers(text: str) -> str:
    return "".join(piece for piece, _ in _neutral_pieces(text))


def _rich_markup(text: str) -> str:
    """Neutral `**bold**` and `code` as rich markup, everything else escaped."""
    return "".join(f"[{style}]{escape(piece)}[/]" if style else escape(piece) for piece, style in _neutral_pieces(text))


def _bare_user_markup(user: str) -> str:
    return escape(platform_user(user))


NO_RUNS_HERE = "No runs yet in this terminal: ask a question to start one."
# Columns left out, in this order, when the table does not fit: the question first (narrower than this it says too
# little), then the date, then the mode. The run id (what `/export` takes) and the state always stay, never cut.
QUESTION_MIN_CELLS = 12
DROPPED_FIRST = ("When (UTC)", "Mode")
COLUMN_GAP = 2


def _history_row(run: RunSummary) -> str:
    return f"{run.run_id}  {run.state}  {mode_name(run.mode)}  {run.created_at:%Y-%m-%d %H:%M}  {single_line(run.question)}"


class HistoryTable:
    """The history as a table as wide as the console allows: one line a run, the question cut with "…" to fit (or
    left out), then the date and the mode; the run id and the state are never cut or wrapped."""

    def __init__(self, runs: list[RunSummary]) -> None:
        self.runs = runs

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield _history_table(self.runs, options.max_width)


def _history_table(runs: list[RunSummary], width: int) -> Table:
    cells: dict[str, list[str]] = {
        "Run": [str(run.run_id) for run in runs],
        "State": [run.state for run in runs],
        "Mode": [mode_name(run.mode) for run in runs],
        "When (UTC)": [f"{run.created_at:%Y-%m-%d %H:%M}" for run in runs],
    }
    widths = {heading: max(cell_len(text) for text in [heading, *column]) for heading, column in cells.items()}

    def used(headings: list[str]) -> int:
        return sum(widths[heading] for heading in headings) + COLUMN_GAP * (len(headings) - 1)

    kept = list(cells)
    questions = [single_line(run.question) for run in runs]
    # The room left decides whether the column stays; short questions only make it narrower.
    room = width - used(kept) - COLUMN_GAP
    question_width = min(room, max(cell_len(text) for text in ["Question", *questions]))
    if room < QUESTION_MIN_CELLS:
        question_width = 0
        for heading in DROPPED_FIRST:
            if used(kept) > width:
                kept.remove(heading)
    table = Table(box=None, header_style="dim", pad_edge=False, padding=(0, COLUMN_GAP // 2))
    for heading in kept:
        table.add_column(heading, no_wrap=True, width=widths[heading])
    if question_width:
        table.add_column("Question", no_wrap=True, overflow="ellipsis", width=question_width)
    for index, question in enumerate(questions):
        row = [cells[heading][index] for heading in kept]
        table.add_row(*row, *([Text(question)] if question_width else []))
    return table


class LatestLines:
    """A renderable cut to its last lines that fit the screen with `room_for_others` lines to spare: a live region
    cannot scroll, and the newest words of a growing answer are the ones to see."""

    def __init__(self, renderable: RenderableType, *, room_for_others: int = STATUS_ROOM_LINES) -> None:
        self.renderable = renderable
        self.room_for_others = room_for_others

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        lines = console.render_lines(self.renderable, options.update(height=None), pad=False)
        fits = max(MIN_DRAFT_LINES, console.size.height - self.room_for_others)
        if len(lines) > fits:
            lines = [[Segment("…")], *lines[len(lines) - fits + 1:]]
        for line in lines:
            yield from line
            yield Segment.line()



NO_WATCHES_HERE = ("No watches in this terminal yet: after a research report, /watch weekly 09:00 has it come back on "
                   "its own.")
# Left out, in this order, when the table does not fit: the next run, then the question (narrower than
# QUESTION_MIN_CELLS it says too little); the watch's number and its state always stay, never cut.
WATCH_DROPPED_FIRST = ("Next run",)


def _watch_schedule(watch: WatchSummary) -> str:
    """The schedule in words, or why the watch no longer runs."""
    return watch.when if watch.state == "stopped" else watch.schedule.describe()


def _watch_next_run(watch: WatchSummary) -> str:
    """`30 Nov 2026 09:00 CET` in the schedule's own zone; `-` unless the watch is active."""
    if watch.state != "active":
        return "-"
    return watch.next_due_at.astimezone(zone_of(watch.schedule.timezone)).strftime("%-d %b %Y %H:%M %Z")


def _watch_row(watch: WatchSummary) -> str:
    next_run = watch.next_run_words()
    return "  ".join(part for part in (f"#{watch.watch_id}", watch.state, _watch_schedule(watch), next_run,
                                       single_line(watch.question)) if part)


class WatchesTable:
    """The watches as a table as wide as the console allows: one line a watch, the question cut with "…" to fit
    (or left out after the next run), the schedule cut last; the number and the state are never cut or wrapped."""

    def __init__(self, watches: list[WatchSummary]) -> None:
        self.watches = watches

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield _watches_table(self.watches, options.max_width)


def _watches_table(watches: list[WatchSummary], width: int) -> Table:
    cells: dict[str, list[str]] = {
        "Watch": [f"#{watch.watch_id}" for watch in watches],
        "State": [watch.state for watch in watches],
        "Schedule": [_watch_schedule(watch) for watch in watches],
        "Next run": [_watch_next_run(watch) for watch in watches],
    }
    widths = {heading: max(cell_len(text) for text in [heading, *column]) for heading, column in cells.items()}

    def used(headings: list[str]) -> int:
        return sum(widths[heading] for heading in headings) + COLUMN_GAP * (len(headings) - 1)

    kept = list(cells)
    questions = [single_line(watch.question) for watch in watches]
    for heading in WATCH_DROPPED_FIRST:
        if width - used(kept) - COLUMN_GAP >= QUESTION_MIN_CELLS:
            break
        kept.remove(heading)
    room = width - used(kept) - COLUMN_GAP
    question_width = min(room, max(cell_len(text) for text in ["Question", *questions]))
    if room < QUESTION_MIN_CELLS:
        question_width = 0
    # What is left of the width once the number and the state have theirs: the schedule is cut to it, never them.
    schedule_width = max(1, min(widths["Schedule"], width - used(["Watch", "State"]) - COLUMN_GAP))
    table = Table(box=None, header_style="dim", pad_edge=False, padding=(0, COLUMN_GAP // 2))
    for heading in kept:
        table.add_column(heading, no_wrap=True, overflow="ellipsis",
                         width=schedule_width if heading == "Schedule" else widths[heading])
    if question_width:
        table.add_column("Question", no_wrap=True, overflow="ellipsis", width=question_width)
    for index, question in enumerate(questions):
        row = [cells[heading][index] for heading in kept]
        table.add_row(*row, *([Text(question)] if question_width else []))
    return table
