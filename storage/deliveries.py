"""What a run put in its thread, as its row records it: the messages delivered (so a retried delivery edits them
instead of posting again), the streamed progress message, the failed tries of a delivery and when it ended.

Message references are kept as JSON (`DeliveredMessage.ref`); the worker turns them into its chat types.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Collection
from typing import Any, NamedTuple

from sqlalchemy import select, update
from sqlalchemy.orm import defer, joinedload

from storage.db import Sessions, changed_rows, database_now, off_loop
from storage.leases import holds_attempt
from storage.models import Event, Run, utcnow
from storage.vocabulary import DeliveredMessage


class StoredRun(NamedTuple):
    """A run and its stored events in `seq` order, detached from any session."""

    run: Run
    events: list[Event]


class FailedDeliveries(NamedTuple):
    """A run's failed delivery tries so far, and whether its delivery was given up."""

    tries: int
    given_up: bool


# A run's report, in its two forms, is most of its row: the delivery's reads and writes of the run's other columns leave
# it in the database (a report of 20 kB was parsed from JSON at each of a run's steps of delivery).
WITHOUT_REPORT = (defer(Run.report_json), defer(Run.report_markdown))


def delivery_run(sessions: Sessions, run_id: int) -> Run | None:
    """The run with its conversation (its thread), detached; None when it does not exist."""
    with sessions() as session:
        return session.get(Run, run_id, options=[joinedload(Run.conversation), *WITHOUT_REPORT])


def delivered_messages(sessions: Sessions, run_id: int) -> list[DeliveredMessage]:
    """The messages recorded as delivered for the run (none when it does not exist)."""
    with sessions() as session:
        run = session.get(Run, run_id, options=WITHOUT_REPORT)
        return list(run.delivered_messages or []) if run is not None else []


def record_delivered(sessions: Sessions, run_id: int, attempt: int, delivered: list[DeliveredMessage]) -> bool:
    """Record `delivered` as the run's delivered messages unless a newer attempt owns it; whether it was recorded."""
    with sessions.begin() as session:
        return bool(changed_rows(session.execute(
            update(Run).where(Run.id == run_id, Run.attempt == attempt).values(delivered_messages=delivered)
        )))


def may_stream_answer(sessions: Sessions, run_id: int, attempt: int) -> bool:
    """Whether `attempt` owns the run and nothing of its answer is in the thread yet (a retry edits that)."""
    with sessions() as session:
        run = session.get(Run, run_id, options=WITHOUT_REPORT)
        return run is not None and run.attempt == attempt and not run.delivered_messages


def record_streamed_answer(sessions: Sessions, run_id: int, attempt: int, ref: dict[str, Any]) -> bool:
    """Record the streamed message `ref` as the answer's first message (delivery then edits it, never reposts);
    whether it was recorded (not: a newer attempt owns the run)."""
    streamed = DeliveredMessage(kind="message", ref=ref, streamed=True)
    return record_delivered(sessions, run_id, attempt, [streamed])


def report_for_delivery(sessions: Sessions, run_id: int, attempt: int, *,
                        read_report: bool = True) -> tuple[dict[str, Any] | None, list[DeliveredMessage]] | None:
    """The run's report (as JSON, unless `read_report` is false: the caller has it) and the messages delivered so
    far, the intent to deliver recorded first; None when a newer attempt owns the run or it has no report."""
    with sessions.begin() as session:
        if not holds_attempt(session, run_id, attempt):
            return None
        run = session.get(Run, run_id, options=() if read_report else WITHOUT_REPORT)
        if run is None or (read_report and run.report_json is None):  # a caller with the report has it from the run
            return None
        run.delivery_intent_at = run.delivery_intent_at or utcnow()
        return (run.report_json if read_report else None), list(run.delivered_messages or [])


def has_report(sessions: Sessions, run_id: int, attempt: int) -> bool:
    """Whether `attempt` owns the run and the run has a report."""
    with sessions() as session:
        run = session.get(Run, run_id)
        return run is not None and run.attempt == attempt and run.report_json is not None


def mark_delivered(sessions: Sessions, run_id: int, attempt: int) -> None:
    """Record the run's delivery as done (its lease released), unless a newer attempt owns it."""
    with sessions.begin() as session:
        session.execute(update(Run).where(Run.id == run_id, Run.attempt == attempt)
                        .values(delivered_at=utcnow(), delivery_retry_at=None, lease_owner=None, lease_until=None))


def record_failed_delivery(sessions: Sessions, run_id: int, attempt: int, *, lasting: bool, max_attempts: int,
                           delay_after: Callable[[int], float],
                           now: dt.datetime | None = None) -> FailedDeliveries | None:
    """Count a failed delivery try and schedule the next one `delay_after(tries)` seconds from `now` (the database's
    clock when None), or give up: after `max_attempts` tries, or at once when the refusal is `lasting`.

    None when the run is not this attempt's to deliver (a newer attempt, or already delivered).
    """
    with sessions.begin() as session:
        run = session.get(Run, run_id, options=WITHOUT_REPORT)
        if run is None or run.attempt != attempt or run.delivered_at is not None:
            return None
        now = now or database_now(session)
        run.delivery_attempts = (run.delivery_attempts or 0) + 1
        given_up = lasting or run.delivery_attempts >= max_attempts
        run.delivery_retry_at = None if given_up else now + dt.timedelta(seconds=delay_after(run.delivery_attempts))
        run.delivery_given_up_at = now if given_up else None
        run.lease_owner, run.lease_until = None, None
        return FailedDeliveries(run.delivery_attempts, given_up)


def run_with_events(sessions: Sessions, run_id: int, *, after_seq: int = 0) -> StoredRun | None:
    """The run and its stored events numbered after `after_seq`, in order, detached, for showing its progress from
    the database (all of them, or those since what was shown); None when it does not exist."""
    with sessions() as session:
        run = session.get(Run, run_id)
        if run is None:
            return None
        events = list(session.scalars(select(Event).where(Event.run_id == run_id, Event.seq > after_seq)
                                      .order_by(Event.seq)))
        session.expunge_all()
        return StoredRun(run, events)


def still_waiting(sessions: Sessions, run_ids: Collection[int]) -> list[Run]:
    """Those of the runs that still wait in the queue and have a status message, with their conversations, detached
    (one admitted or ended since its id was read shows a more recent status of its own)."""
    with sessions() as session:
        runs = session.scalars(select(Run).where(Run.id.in_(list(run_ids))).options(joinedload(Run.conversation)))
        return [run for run in runs if run.status_message and run.state == "queued" and run.celery_task_id is None]


def progress_message(delivered: list[DeliveredMessage]) -> DeliveredMessage | None:
    """The recorded progress message among a run's delivered messages, if any."""
    return next((entry for entry in delivered if entry.kind == "progress"), None)


def may_open_progress(sessions: Sessions, run_id: int, attempt: int) -> bool:
    """Whether `attempt` owns the run and no attempt has opened a progress message yet (one per run, ever)."""
    with sessions() as session:
        run = session.get(Run, run_id, options=WITHOUT_REPORT)
        return run is not None and run.attempt == attempt and progress_message(list(run.delivered_messages or [])) is None


def record_progress_message(sessions: Sessions, run_id: int, attempt: int, ref: dict[str, Any]) -> bool:
    """Record the streamed progress message `ref` on the run (unless a newer attempt owns it); whether it was recorded."""
    with sessions.begin() as session:
        run = session.get(Run, run_id, options=WITHOUT_REPORT)
        if run is None or run.attempt != attempt:
            return False
        run.delivered_messages = [*(run.delivered_messages or []), DeliveredMessage(kind="progress", ref=ref)]
        return True


def mark_progress_final(sessions: Sessions, run_id: int, attempt: int) -> None:
    """Record that the progress message shows the run's final state, so no retry edits it again."""
    with sessions.begin() as session:
        run = session.get(Run, run_id, options=WITHOUT_REPORT)
        if run is None or run.attempt != attempt:
            return
        run.delivered_messages = [entry.model_copy(update={"final": True}) if entry.kind == "progress" else entry
                                  for entry in run.delivered_messages or []]


def unfinished_progress_message(sessions: Sessions, run_id: int) -> dict[str, Any] | None:
    """The reference of the run's progress message while it does not show the final state yet."""
    with sessions() as session:
        run = session.get(Run, run_id, options=WITHOUT_REPORT)
        entry = progress_message(list(run.delivered_messages or [])) if run is not None else None
    return entry.ref if entry is not None and not entry.final else None


adelivered_messages = off_loop(delivered_messages)
arecord_delivered = off_loop(record_delivered)
amay_stream_answer = off_loop(may_stream_answer)
arecord_streamed_answer = off_loop(record_streamed_answer)
areport_for_delivery = off_loop(report_for_delivery)
ahas_report = off_loop(has_report)
amark_delivered = off_loop(mark_delivered)
arecord_failed_delivery = off_loop(record_failed_delivery)
arun_with_events = off_loop(run_with_events)
astill_waiting = off_loop(still_waiting)
amay_open_progress = off_loop(may_open_progress)
arecord_progress_message = off_loop(record_progress_message)
amark_progress_final = off_loop(mark_progress_final)
aunfinished_progress_message = off_loop(unfinished_progress_message)
