"""Stored runs read back for people: the recent runs one line each with their 👍/👎 counts, a run's report exported."""

from __future__ import annotations

import unicodedata

from sqlalchemy import select

from research.report import EXPORTERS, ExportFormat, Report
from storage.db import Sessions, off_loop
from storage.feedback import FeedbackCounts, feedback_counts
from storage.models import Run
from storage.vocabulary import WATCH_STOPPED, mode_name


def export_run(sessions: Sessions, run_id: int, output_format: ExportFormat) -> str | None:
    """The run's report as md, html or json; None when it has none; raises LookupError when there is no such run."""
    with sessions() as session:
        run = session.get(Run, run_id)
        if run is None:
            raise LookupError(f"no run {run_id}")
        if run.report_json is None:
            return None
        report = Report.model_validate(run.report_json)
        report.run_id = run_id
    return EXPORTERS[output_format](report)


# `deepthread runs` and the chat's `/runs` fit a terminal of this width unless told another: one line a run.
RUNS_WIDTH = 80
RUNS_HEADER = f"{'ID':>6}  {'STATE':<9}  {'MODE':<12}  {'CREATED':<16}  {'FEEDBACK':<9}  QUESTION"
# Narrower than this, a question says too little to be worth its column: it is left out.
QUESTION_MIN_CELLS = 8


def feedback_column(counts: FeedbackCounts | None) -> str:
    """`👍 3 👎 1` for a run people rated, `-` for one nobody did."""
    return f"👍 {counts.good} 👎 {counts.bad}" if counts is not None else "-"


def recent_runs(sessions: Sessions, limit: int, width: int = RUNS_WIDTH) -> list[str]:
    """One line per run, newest first, with its 👍/👎 counts, each at most `width` terminal cells: the question is
    cut with "…" to fit (or left out on a terminal too narrow for it), never the id."""
    with sessions() as session:
        rows = session.scalars(select(Run).order_by(Run.id.desc()).limit(limit)).all()
        counts = feedback_counts(session, [run.id for run in rows])
        lines = []
        for run in rows:
            head = (f"{run.id:>6}  {run.state:<9}  {mode_name(run.mode):<12}  {run.created_at:%Y-%m-%d %H:%M}  "
                    f"{_padded(feedback_column(counts.get(run.id)), 9)}  ")
            room = width - cell_width(head)
            question = cut_to_cells(" ".join(run.question.split()), room) if room >= QUESTION_MIN_CELLS else ""
            lines.append((head + question).rstrip())
        return lines


def cell_width(text: str) -> int:
    """How many terminal cells `text` takes: two for a wide character (an emoji, a CJK ideograph), none for a
    combining mark."""
    return sum(0 if unicodedata.combining(character) else 2 if unicodedata.east_asian_width(character) in "WF" else 1
               for character in text)


def cut_to_cells(text: str, cells: int) -> str:
    """`text`, or as much of it as fits `cells` terminal cells with a visible "…" at the cut."""
    if cell_width(text) <= cells:
        return text
    kept, used = [], 1  # the "…" takes a cell
    for character in text:
        used += cell_width(character)
        if used > cells:
            break
        kept.append(character)
    return "".join(kept).rstrip() + "…"


def _padded(text: str, cells: int) -> str:
    return text + " " * max(0, cells - cell_width(text))


WATCHES_HEADER = f"{'WATCH':>6}  {'STATE':<9}  {'NEXT (UTC)':<16}  SCHEDULE · QUESTION"


def watch_lines(sessions: Sessions, width: int = RUNS_WIDTH) -> list[str]:
    """One line per watch, oldest first: its number, state, next due time and schedule, then its question, each at
    most `width` terminal cells (`deepthread runs` lists them under the runs)."""
    from storage.watches import all_watches

    lines = []
    for watch in all_watches(sessions):
        due = f"{watch.next_due_at:%Y-%m-%d %H:%M}" if watch.state == "active" else "-"
        head = f"{'#' + str(watch.id):>6}  {watch.state:<9}  {due:<16}  "
        when = watch.schedule.describe() if watch.state != WATCH_STOPPED else f"stopped: {watch.stopped_reason or '-'}"
        rest = f"{when} · {' '.join(watch.question.split())}"
        room = width - cell_width(head)
        lines.append((head + (cut_to_cells(rest, room) if room >= QUESTION_MIN_CELLS else "")).rstrip())
    return lines


aexport_run = off_loop(export_run)
arecent_runs = off_loop(recent_runs)
