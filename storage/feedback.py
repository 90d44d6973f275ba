"""People's 👍/👎 on runs: one verdict per person and run, the latest click winning, and the counts per run."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel
from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from storage.models import Feedback

Verdict = Literal["good", "bad"]
VALUES: dict[Verdict, int] = {"good": 1, "bad": -1}
MAX_COMMENT_CHARS = 3_000


class FeedbackCounts(BaseModel):
    """How many people gave a run 👍 and 👎."""

    good: int = 0
    bad: int = 0


def record_verdict(session: Session, *, run_id: int, user: str, verdict: Verdict, now: dt.datetime) -> Feedback:
    """Store `user`'s verdict on the run, replacing an earlier one (its comment kept); returns the row."""
    row = session.scalar(select(Feedback).where(Feedback.run_id == run_id, Feedback.user == user))
    if row is None:
        row = Feedback(run_id=run_id, user=user, value=VALUES[verdict], created_at=now, updated_at=now)
        session.add(row)
    else:
        row.value, row.updated_at = VALUES[verdict], now
    session.flush()
    return row


def record_comment(session: Session, *, run_id: int, user: str, comment: str, now: dt.datetime) -> Feedback:
    """Store what `user` said was wrong with the run on their feedback row (a 👎 row when they had none)."""
    row = session.scalar(select(Feedback).where(Feedback.run_id == run_id, Feedback.user == user))
    if row is None:
        row = record_verdict(session, run_id=run_id, user=user, verdict="bad", now=now)
    row.comment, row.updated_at = comment.strip()[:MAX_COMMENT_CHARS] or None, now
    session.flush()
    return row


def feedback_counts(session: Session, run_ids: Iterable[int]) -> dict[int, FeedbackCounts]:
    """The 👍 and 👎 counts of each of `run_ids` that has any feedback."""
    ids = list(run_ids)
    if not ids:
        return {}
    rows = session.execute(
        select(Feedback.run_id, func.sum(case((Feedback.value > 0, 1), else_=0)),
               func.sum(case((Feedback.value < 0, 1), else_=0)))
        .where(Feedback.run_id.in_(ids)).group_by(Feedback.run_id))
    return {run_id: FeedbackCounts(good=int(good or 0), bad=int(bad or 0)) for run_id, good, bad in rows}
