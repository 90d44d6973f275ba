"""Feedback on a run's report or answer: a 👍/👎 click stored (a 👎 asks what was wrong), then the comment."""

from __future__ import annotations

import datetime as dt

from sqlalchemy.orm import Session, sessionmaker

from bot.conversation.events import ChatEvent, Outcome, Reply
from ops.metrics import Metrics, process_metrics
from storage.feedback import record_comment, record_verdict
from storage.models import Run

NO_VERDICT = "That feedback button sent nothing I understand; please click 👍 or 👎 again."


def record_feedback(sessions: sessionmaker[Session], event: ChatEvent, run: Run, now: dt.datetime,
                    metrics: Metrics | None = None) -> Outcome:
    """Store the event's verdict or comment on `run` for the event's person (and count it in `metrics`, this
    process's by default); a 👎 asks the adapter for a comment."""
    with sessions.begin() as session:
        if event.action == "feedback_comment":
            record_comment(session, run_id=run.id, user=event.user, comment=event.text, now=now)
            return Outcome()
        if event.feedback is None:
            return Outcome(replies=[Reply(text=NO_VERDICT, private=True)])
        record_verdict(session, run_id=run.id, user=event.user, verdict=event.feedback, now=now)
    (metrics or process_metrics()).record_feedback(event.feedback)
    return Outcome(ask_what_was_wrong=run.id if event.feedback == "bad" else None)
