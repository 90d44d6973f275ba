"""Runs outside a chat thread (the terminal): creating them, listing them, exporting their reports."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from chat.message import Place
from research.report import EXPORTERS, Report
from storage.feedback import FeedbackCounts, feedback_counts
from storage.models import Conversation, Message, Run

def create_run(sessions: sessionmaker[Session], *, place: Place, requester: str, mode: str, question: str,
               options: dict[str, Any], plan: dict[str, Any] | None = None) -> int:
    """A conversation of its own in `place`'s channel and a queued run in it; returns the run id."""
    with sessions.begin() as session:
        conversation = Conversation(platform=place.platform, workspace=place.workspace, channel=place.channel,
                                    thread=uuid.uuid4().hex, created_by=requester)
        run = Run(conversation=conversation, workspace=place.workspace, mode=mode, question=question,
                  options=options, plan=plan, requested_by=requester)
        session.add_all([conversation, run,
                         Message(conversation=conversation, role="user", author=requester, text=question, mode=mode)])
        session.flush()
        return run.id


def export_run(sessions: sessionmaker[Session], run_id: int, output_format: str) -> str | None:
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


def recent_runs(sessions: sessionmaker[Session], limit: int) -> list[str]:
    """One line per run, newest first, with its 👍/👎 counts."""
    with sessions() as session:
        rows = session.scalars(select(Run).order_by(Run.id.desc()).limit(limit)).all()
        counts = feedback_counts(session, [run.id for run in rows])
        return [f"{run.id:>5}  {run.state:<9}  {run.mode:<8}  {run.created_at:%Y-%m-%d %H:%M}  "
                f"{feedback_column(counts.get(run.id)):<10}  {run.question[:70]}" for run in rows]
