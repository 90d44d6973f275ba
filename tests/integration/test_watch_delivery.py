"""How a watch's run is delivered to the fake Slack: a thread of its own under a headline only when there is a report
with something to say; otherwise one quiet line in the previous run's thread; and a watch whose channel is gone
stops, saying why."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from chat.state import RunProgress
from research.changes import Change
from research.report import Report, WatchComparison
from storage.models import ConversationFile, Run
from storage.vocabulary import WatchLimits, WatchSchedule
from storage.watches import FiringLimits, claim_due, create_watch, fire_claimed, watch_of
from tests.fakes.slack_api import FakeSlack
from bot.conversation.history import run_history
from tests.integration.test_delivery_faults import (
    CHANNEL,
    WallClock,
    fetch,
    migrated_sessions,
    slack_delivery,
    slack_run,
    sweep,
)
from tests.run_rows import finish_run, one_source_report
from worker.delivery import DeliveryOutcome

DAILY = WatchSchedule(cadence="daily", hour=9)
ROOMY = FiringLimits.from_settings(type("Roomy", (), {"daily_runs_per_user": 0, "daily_cost_per_workspace": 0,
                                                      "max_queued_per_user": 10, "max_queued_per_workspace": 0})())


@pytest.fixture
def sessions(tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    yield migrated_sessions(f"sqlite:///{tmp_path}/deepthread.db")


def watched(sessions: sessionmaker[Session], slack: FakeSlack, *, one_thread: bool = False) -> tuple[int, int, str]:
    """A finished report in its Slack thread, a daily watch of it, and the watch's first run fired (not yet in any
    thread); returns the watch, the run and the report's thread."""
    origin = slack_run(sessions, slack)
    finish_run(sessions, origin, report=one_source_report("tides"), finished_at=dt.datetime.now(dt.timezone.utc))
    thread = fetch(sessions, origin).status_message["thread"]
    watch = create_watch(sessions, run_id=origin, by="slack:U0ALICE1", schedule=DAILY, one_thread=one_thread,
                         limits=WatchLimits(5, "daily"))
    due = watch.next_due_at + dt.timedelta(seconds=1)
    assert claim_due(sessions, "w", claim_seconds=60, now=due) == [watch.id]
    fired = fire_claimed(sessions, watch.id, "w", limits=ROOMY, now=due)
    assert fired is not None and fired.run_id is not None
    return watch.id, fired.run_id, thread


def ended(sessions: sessionmaker[Session], run_id: int, state: str, report: Report | None,
          error: str | None = None) -> RunProgress:
    finish_run(sessions, run_id, state, report, error=error, finished_at=dt.datetime.now(dt.timezone.utc))
    return RunProgress.for_run(fetch(sessions, run_id), state=state, error=error, attempt=0)


def compared(changes: list[Change], previous: int = 1) -> Report:
    report = one_source_report("tides")
    report.watch = WatchComparison(previous_run_id=previous, changes=changes)
    return report


def top_level(slack: FakeSlack) -> list[str]:
    return [message.ts for message in slack.messages(CHANNEL) if message.thread_ts in (None, message.ts)]


def test_a_report_with_changes_opens_a_thread_of_its_own_under_a_headline(sessions, slack: FakeSlack) -> None:
    _, run_id, origin_thread = watched(sessions, slack)
    before = top_level(slack)
    report = compared([Change(kind="new", url="https://a.example/", title="A", passage_id="p1")])
    progress = ended(sessions, run_id, "done", report)

    outcome = asyncio.run(slack_delivery(sessions, slack, run_id).finish(progress, report=report))

    assert outcome == DeliveryOutcome.DELIVERED
    run = fetch(sessions, run_id)
    [new_thread] = [ts for ts in top_level(slack) if ts not in before]
    assert run.status_message["thread"] == new_thread
    headline = next(message for message in slack.messages(CHANNEL) if message.ts == new_thread)
    assert headline.text.startswith("🔭 Watch:") and "1 change since" in headline.text
    assert any("here is your report" in message.visible_text
               for message in slack.messages(CHANNEL, thread_ts=new_thread))
    assert not any("here is your report" in message.visible_text
                   for message in slack.messages(CHANNEL, thread_ts=origin_thread)[2:])
    assert run.delivered_at is not None


@pytest.mark.parametrize(("state", "report", "words"), [
    ("done", compared([]), "nothing changed since"),
    ("failed", None, "This watch's run failed: the model was down"),
    ("timed_out", None, "ran out of time"),
])
def test_a_run_with_nothing_to_report_says_so_in_one_line_in_the_previous_thread(
        sessions, slack: FakeSlack, state: str, report: Report | None, words: str) -> None:
    _, run_id, origin_thread = watched(sessions, slack)
    before = top_level(slack)
    progress = ended(sessions, run_id, state, report, error="the model was down" if state == "failed" else None)
    delivery = slack_delivery(sessions, slack, run_id)

    assert asyncio.run(delivery.finish(progress, report=report)) == DeliveryOutcome.DELIVERED
    # A retried delivery (the sweep) does not say it twice.
    asyncio.run(slack_delivery(sessions, slack, run_id).finish(progress, report=report))

    assert top_level(slack) == before
    lines = [message.visible_text for message in slack.messages(CHANNEL, thread_ts=origin_thread) if words in
             message.visible_text]
    assert len(lines) == 1, lines
    assert fetch(sessions, run_id).delivered_at is not None


def test_a_watch_whose_channel_is_gone_stops_saying_why(sessions, slack: FakeSlack) -> None:
    watch_id, run_id, _ = watched(sessions, slack)
    report = compared([Change(kind="new", url="https://a.example/", title="A", passage_id="p1")])
    progress = ended(sessions, run_id, "done", report)
    slack.error_next("chat.postMessage", "channel_not_found", times=5, when=lambda params: params.get("channel") == CHANNEL)

    asyncio.run(slack_delivery(sessions, slack, run_id).finish(progress, report=report))

    watch = watch_of(sessions, watch_id)
    assert watch is not None and watch.state == "stopped"
    assert watch.stopped_reason is not None and "channel_not_found" in watch.stopped_reason
    # Its owner is told once, in the app's direct messages, even when the delivery is tried again.
    asyncio.run(slack_delivery(sessions, slack, run_id).finish(progress, report=report))
    told = [message.text for message in slack.messages("U0ALICE1") if "stopped" in message.text]
    assert len(told) == 1 and "channel_not_found" in told[0]


def test_a_one_thread_watch_posts_each_run_in_the_reports_own_thread(sessions, slack: FakeSlack) -> None:
    _, run_id, origin_thread = watched(sessions, slack, one_thread=True)
    assert fetch_thread(sessions, run_id) == origin_thread  # stored in that thread's conversation from the start
    before = top_level(slack)
    report = compared([Change(kind="new", url="https://a.example/", title="A", passage_id="p1")])
    progress = ended(sessions, run_id, "done", report)

    assert asyncio.run(slack_delivery(sessions, slack, run_id).finish(progress, report=report)) == \
        DeliveryOutcome.DELIVERED

    assert top_level(slack) == before
    reports = [message for message in slack.messages(CHANNEL, thread_ts=origin_thread)
               if "here is your report" in message.visible_text]
    assert len(reports) == 1


def fetch_thread(sessions: sessionmaker[Session], run_id: int) -> str:
    with sessions() as session:
        return session.get(Run, run_id).conversation.thread


def test_a_watch_run_whose_delivery_failed_is_delivered_by_the_resume_sweep(sessions, slack: FakeSlack) -> None:
    _, run_id, origin_thread = watched(sessions, slack)
    report = compared([])
    progress = ended(sessions, run_id, "done", report)
    clock = WallClock()
    slack.start_outage(["chat.postMessage"])
    try:
        outcome = asyncio.run(slack_delivery(sessions, slack, run_id, clock=clock).finish(progress, report=report))
    finally:
        slack.end_outage()
    assert outcome == DeliveryOutcome.RETRY_SCHEDULED
    assert fetch(sessions, run_id).delivered_at is None

    clock.advance(3600)
    assert sweep(sessions, slack, clock)[run_id] == DeliveryOutcome.DELIVERED  # (the report watched is swept too)
    lines = [message for message in slack.messages(CHANNEL, thread_ts=origin_thread)
             if "nothing changed" in message.visible_text]
    assert len(lines) == 1


def test_a_quiet_line_refused_in_an_old_thread_is_let_go_and_the_watch_goes_on(sessions, slack: FakeSlack) -> None:
    watch_id, run_id, origin_thread = watched(sessions, slack)
    report = compared([])
    progress = ended(sessions, run_id, "done", report)
    slack.error_next("chat.postMessage", "thread_not_found", when=lambda params: params.get("thread_ts") == origin_thread)

    outcome = asyncio.run(slack_delivery(sessions, slack, run_id).finish(progress, report=report))

    assert outcome == DeliveryOutcome.DELIVERED
    watch = watch_of(sessions, watch_id)
    assert watch is not None and watch.state == "active"
    assert slack.messages(CHANNEL)[-1].text != "" and not any(
        "could not be posted" in message.visible_text for message in slack.messages(CHANNEL))


def test_the_files_shared_where_a_watch_was_made_are_sources_of_its_runs(sessions, slack: FakeSlack) -> None:
    origin = slack_run(sessions, slack)
    finish_run(sessions, origin, report=one_source_report("tides"), finished_at=dt.datetime.now(dt.timezone.utc))
    with sessions.begin() as session:
        run = session.get(Run, origin)
        session.add(ConversationFile(conversation_id=run.conversation_id, file_id="F1", name="tides.pdf",
                                     url="https://files.example/F1", shared_by="slack:U0ALICE1"))
    watch = create_watch(sessions, run_id=origin, by="slack:U0ALICE1", schedule=DAILY, one_thread=False,
                         limits=WatchLimits(5, "daily"))
    due = watch.next_due_at + dt.timedelta(seconds=1)
    claim_due(sessions, "w", claim_seconds=60, now=due)
    fired = fire_claimed(sessions, watch.id, "w", limits=ROOMY, now=due)
    assert fired is not None and fired.run_id is not None
    with sessions() as session:
        conversation = session.get(Run, fired.run_id).conversation
        assert [(shared.file_id, shared.name) for shared in conversation.files] == [("F1", "tides.pdf")]


def test_history_lists_a_watch_run_without_a_thread_with_no_link_to_one(sessions, slack: FakeSlack) -> None:
    _, run_id, _ = watched(sessions, slack)
    history = run_history(sessions, platform="slack", workspace="T1", channel=CHANNEL, user="slack:U0ALICE1")
    [listed] = [summary for summary in history.yours if summary.run_id == run_id]
    assert listed.thread.thread is None
