"""Feedback on a run's report or answer: a 👍/👎 click stored (a 👎 asks what was wrong), then the comment."""

from __future__ import annotations

import datetime as dt

from bot.conversation.events import ChatEvent, Outcome
from ops.metrics import Metrics, process_metrics
from storage.conversations import astore_feedback
from storage.db import Sessions
from storage.models import Run


async def record_feedback(sessions: Sessions, event: ChatEvent, run: Run, now: dt.datetime,
                          metrics: Metrics | None = None) -> Outcome:
    """Store the event's verdict or comment on `run` for the event's person (and count a verdict in `metrics`, this
    process's by default); a 👎 asks the adapter for a comment. The rules have refused a click with no verdict."""
    if event.action == "feedback_comment":
        await astore_feedback(sessions, run_id=run.id, user=event.user, now=now, comment=event.text)
        return Outcome()
    verdict = event.feedback
    if verdict is None:
        raise ValueError("a feedback click with no verdict reached the store")
    await astore_feedback(sessions, run_id=run.id, user=event.user, now=now, verdict=verdict)
    (metrics or process_metrics()).record_feedback(verdict)
    return Outcome(ask_what_was_wrong=run.id if verdict == "bad" else None)
