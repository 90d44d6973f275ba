"""Stored runs read back for people: the recent runs one line each with their 👍/👎 counts, a run's report exported."""

from __future__ import annotations

from sqlalchemy import select

from research.report import EXPORTERS, ExportFormat, Report
from storage.db import Sessions, off_loop
from storage.feedback import FeedbackCounts, feedback_counts
from storage.models import Run


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


RUNS_HEADER = f"{'ID':>5}  {'STATE':<9}  {'MODE':<8}  {'CREATED':<16}  {'FEEDBACK':<10}  QUESTION"


def feedback_column(counts: FeedbackCounts | None) -> str:
    """`👍 3 👎 1` for a run people rated, `-` for one nobody did."""
    return f"👍 {counts.good} 👎 {counts.bad}" if counts is not None else "-"


def recent_runs(sessions: Sessions, limit: int) -> list[str]:
    """One line per run, newest first, with its 👍/👎 counts."""
    with sessions() as session:
        rows = session.scalars(select(Run).order_by(Run.id.desc()).limit(limit)).all()
        counts = feedback_counts(session, [run.id for run in rows])
        return [f"{run.id:>5}  {run.state:<9}  {run.mode:<8}  {run.created_at:%Y-%m-%d %H:%M}  "
                f"{feedback_column(counts.get(run.id)):<10}  {run.question[:70]}" for run in rows]


aexport_run = off_loop(export_run)
arecent_runs = off_loop(recent_runs)
