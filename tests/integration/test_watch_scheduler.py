"""The watch scheduler over simulated weeks: two beats and two workers whose clocks disagree fire each due time once,
an outage across due times fires one run when ticks return, and quotas and caps skip a window in plain words (in
the fake Slack thread), never admitting more than they allow."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import fakeredis
import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from chat.platform import Outbound
from chat.state import RunProgress
from chat.slack.messenger import SlackMessenger, build_slack_client
from chat.slack.render import SlackRenderer
from ops.metrics import Metrics
from research.changes import Change
from research.report import WatchComparison
from storage.conversations import NewRun, ThreadKey, store_run
from storage.models import Run, Watch
from storage.quotas import DailyQuotas
from storage.vocabulary import WatchLimits, WatchSchedule
from storage.watches import FiringLimits, change_watch, create_watch, watch_of
from tests.fakes.slack_api import FakeSlack
from tests.run_rows import finish_run, migrated_sqlite, one_source_report
from worker.delivery import DeliveryTarget, RunDelivery
from worker.progress import InMemoryEditBucket
from worker.queue import Limits, Queue
from worker.watches import WatchTick

CHANNEL, THREAD = "C0WATCH", "1700000000.000100"
OWNER = "slack:U0OWNER"
# Friday 27 November 2026, 10:00 UTC: the weekly watch below is first due on Monday 30 November, 09:00 in Paris.
START = dt.datetime(2026, 11, 27, 10, 0, tzinfo=dt.timezone.utc)
WEEKLY = WatchSchedule(cadence="weekly", hour=9, weekday=0, timezone="Europe/Paris")
DAILY = WatchSchedule(cadence="daily", hour=9, timezone="UTC")
ROOMY = FiringLimits(DailyQuotas(runs_per_user=0, cost_per_workspace=0), max_waiting=10, max_waiting_in_workspace=0)


@pytest.fixture
def sessions(tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    with migrated_sqlite(tmp_path) as (_, made):
        yield made


def finished_report_run(sessions: sessionmaker[Session], *, thread: str = THREAD, question: str = "Tide tables?",
                        at: dt.datetime = START) -> int:
    run_id = store_run(sessions, NewRun(key=ThreadKey("slack", "T0FAKE", CHANNEL, thread), mode="research",
                                        question=question, requested_by=OWNER))
    finish_run(sessions, run_id, report=one_source_report(question), finished_at=at, created_at=at)
    return run_id


def watch(sessions: sessionmaker[Session], schedule: WatchSchedule, **kwargs: object) -> int:
    made = create_watch(sessions, run_id=finished_report_run(sessions, **kwargs), by=OWNER, schedule=schedule,  # type: ignore[arg-type]
                        one_thread=False, limits=WatchLimits(5, "daily"), now=START)
    return made.id


def fired_runs(sessions: sessionmaker[Session], watch_id: int) -> list[Run]:
    with sessions() as session:
        return list(session.scalars(select(Run).where(Run.watch_id == watch_id).order_by(Run.id)))


class Worker:
    """A worker process as far as the tick goes: its own clock (off the true time by `skew`), and its tick."""

    def __init__(self, sessions: sessionmaker[Session], queue: Queue, true_time: Callable[[], dt.datetime],
                 skew: dt.timedelta, limits: FiringLimits = ROOMY, outbound: Outbound | None = None,
                 metrics: Metrics | None = None) -> None:
        self.tick = WatchTick(sessions, queue, limits, claim_seconds=120, platform_parts=lambda _: outbound,
                              metrics=metrics, clock=lambda: true_time() + skew)

    def run_tick(self) -> None:
        asyncio.run(self.tick())


def tick_together(workers: list[Worker]) -> None:
    """Every worker ticks at the same moment, each in its own thread (two beats' ticks arriving at once)."""
    start = threading.Barrier(len(workers))
    errors: list[BaseException] = []

    def run(worker: Worker) -> None:
        start.wait()
        try:
            worker.run_tick()
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=run, args=(worker,)) for worker in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors


def recording_queue(sessions: sessionmaker[Session]) -> tuple[Queue, list[int]]:
    sent: list[int] = []
    return Queue(sessions, fakeredis.FakeRedis(), Limits(per_user=10, per_workspace=10),
                 lambda _name, run_id, _task: sent.append(run_id)), sent


def delivered_with_a_change(sessions: sessionmaker[Session], slack: FakeSlack, run: Run, at: dt.datetime) -> None:
    """What the worker that took the fired run does: finish it with a report that found one change, and deliver it."""
    report = one_source_report(run.question)
    report.watch = WatchComparison(previous_run_id=1, changes=[Change(kind="new", url="https://a.example/",
                                                                       title="A", passage_id="p1")])
    finish_run(sessions, run.id, report=report, finished_at=at)
    with sessions() as session:
        stored = session.get(Run, run.id)
        progress = RunProgress.for_run(stored, state="done")
    delivery = RunDelivery(sessions, DeliveryTarget.load(sessions, run.id), messenger=slack_outbound(slack).messenger,
                           renderer=SlackRenderer(), bucket=InMemoryEditBucket(), min_interval=0.0)
    asyncio.run(delivery.finish(progress, report=report))


def test_a_weekly_watch_fires_once_a_week_with_two_beats_and_two_workers_whose_clocks_disagree(
        sessions, slack: FakeSlack) -> None:
    slack.person_posts(CHANNEL, "/research Tide tables?", user="U0OWNER", ts=THREAD)
    watch_id = watch(sessions, WEEKLY)
    queue, sent = recording_queue(sessions)
    now = [START]
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    ahead = Worker(sessions, queue, lambda: now[0], dt.timedelta(seconds=90), metrics=metrics)
    behind = Worker(sessions, queue, lambda: now[0], dt.timedelta(seconds=-90), metrics=metrics)
    # Two beats, each ticking every two hours by its own clock: their ticks land 90 s before and after the same
    # true minute, and both are carried out by both workers at once.
    step = dt.timedelta(hours=2)
    while now[0] < START + dt.timedelta(weeks=3):
        tick_together([ahead, behind])
        now[0] += dt.timedelta(seconds=90)
        tick_together([behind, ahead])
        for run in fired_runs(sessions, watch_id):
            if run.state == "queued":  # the worker that took it finished it
                delivered_with_a_change(sessions, slack, run, now[0])
        now[0] += step - dt.timedelta(seconds=90)

    runs = fired_runs(sessions, watch_id)
    paris_mondays = [dt.datetime(2026, 11, 30, 8, 0, tzinfo=dt.timezone.utc) + dt.timedelta(weeks=week)
                     for week in range(3)]
    assert len(runs) == 3
    # Each within a tick of its Monday 09:00 in Paris (08:00 UTC), by the clock of the worker that fired it.
    for run, monday in zip(runs, paris_mondays, strict=True):
        assert abs(run.created_at - monday) <= step, (run.created_at, monday)
    assert sorted(sent) == [run.id for run in runs]  # each handed to the workers once
    assert watch_of(sessions, watch_id).fired == 3
    assert registry.get_sample_value("deepthread_watch_runs_total", {"outcome": "fired"}) == 3
    assert registry.get_sample_value("deepthread_watch_runs_total", {"outcome": "failed"}) is None
    # In the fake Slack: one thread a week, each under its headline.
    headlines = [message.text for message in slack.messages(CHANNEL) if message.text.startswith("🔭 Watch:")]
    assert len(headlines) == 3, headlines


def test_an_outage_across_due_times_fires_one_run_when_ticks_return(sessions) -> None:
    watch_id = watch(sessions, DAILY)
    queue, sent = recording_queue(sessions)
    now = [START]
    worker = Worker(sessions, queue, lambda: now[0], dt.timedelta(0))
    # Up until Saturday 08:00: Saturday 09:00 has not come yet, nothing fires.
    now[0] = dt.datetime(2026, 11, 28, 8, 0, tzinfo=dt.timezone.utc)
    worker.run_tick()
    assert fired_runs(sessions, watch_id) == []
    # Everything down through Saturday's, Sunday's and Monday's 09:00; back on Monday at 12:00.
    now[0] = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.timezone.utc)
    for _ in range(5):  # several ticks as the beats come back: still one run, no catch-up burst
        worker.run_tick()
        now[0] += dt.timedelta(minutes=1)
    runs = fired_runs(sessions, watch_id)
    assert len(runs) == 1 and sent == [runs[0].id]
    assert watch_of(sessions, watch_id).next_due_at == dt.datetime(2026, 12, 1, 9, 0, tzinfo=dt.timezone.utc)


def test_a_claim_held_by_a_worker_that_died_lapses_and_another_fires_the_watch_once(sessions) -> None:
    from storage.watches import claim_due, fire_claimed

    watch_id = watch(sessions, DAILY)
    due = dt.datetime(2026, 11, 28, 9, 0, 30, tzinfo=dt.timezone.utc)
    assert claim_due(sessions, "dead-worker", claim_seconds=120, now=due) == [watch_id]
    assert claim_due(sessions, "other", claim_seconds=120, now=due + dt.timedelta(seconds=60)) == []  # still held
    later = due + dt.timedelta(seconds=121)
    assert claim_due(sessions, "other", claim_seconds=120, now=later) == [watch_id]
    fired = fire_claimed(sessions, watch_id, "other", limits=ROOMY, now=later)
    assert fired is not None and fired.outcome == "fired"
    # The dead worker's claim is no longer its own: it fires nothing if it wakes up.
    assert fire_claimed(sessions, watch_id, "dead-worker", limits=ROOMY, now=later) is None
    assert len(fired_runs(sessions, watch_id)) == 1


def test_a_paused_watch_does_not_fire_and_resumes_at_its_next_time_without_making_up_missed_ones(sessions) -> None:
    watch_id = watch(sessions, DAILY)
    queue, _ = recording_queue(sessions)
    now = [START]
    worker = Worker(sessions, queue, lambda: now[0], dt.timedelta(0))
    change_watch(sessions, watch_id, "pause", by=OWNER, admins=(), limits=WatchLimits(5, "daily"), now=START)
    now[0] = START + dt.timedelta(days=3)
    worker.run_tick()
    assert fired_runs(sessions, watch_id) == []
    resumed = change_watch(sessions, watch_id, "resume", by=OWNER, admins=(), limits=WatchLimits(5, "daily"),
                           now=now[0])
    assert resumed is not None and resumed.next_due_at == dt.datetime(2026, 12, 1, 9, 0, tzinfo=dt.timezone.utc)
    worker.run_tick()
    assert fired_runs(sessions, watch_id) == []


def slack_outbound(slack: FakeSlack) -> Outbound:
    return Outbound(messenger=SlackMessenger(build_slack_client(slack.token, slack.api_url)), renderer=SlackRenderer())


def test_a_quota_skips_the_window_in_plain_words_in_the_watchs_thread_and_counts_it(sessions) -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    watch_id = watch(sessions, DAILY)
    queue, sent = recording_queue(sessions)
    now = [dt.datetime(2026, 11, 28, 9, 1, tzinfo=dt.timezone.utc)]
    # The owner already ran one today: a daily limit of 1 run refuses the watch's run.
    finished_report_run(sessions, thread="1700000000.000200", question="Other question?", at=now[0])
    one_a_day = FiringLimits(DailyQuotas(runs_per_user=1), max_waiting=10)
    with FakeSlack() as slack:
        slack.person_posts(CHANNEL, "/research Tide tables?", user="U0OWNER", ts=THREAD)  # the report's thread
        worker = Worker(sessions, queue, lambda: now[0], dt.timedelta(0), limits=one_a_day,
                        outbound=slack_outbound(slack), metrics=metrics)
        worker.run_tick()
        lines = [message.text for message in slack.messages(CHANNEL, thread_ts=THREAD)]
    assert fired_runs(sessions, watch_id) == [] and sent == []
    assert any("did not start" in line and "daily limit of 1 runs" in line for line in lines), lines
    assert registry.get_sample_value("deepthread_watch_runs_total", {"outcome": "skipped"}) == 1
    # The window is spent: the next tick that day does not try again.
    assert watch_of(sessions, watch_id).next_due_at == dt.datetime(2026, 11, 29, 9, 0, tzinfo=dt.timezone.utc)


def test_many_watches_due_at_once_never_queue_more_than_the_workspace_cap(sessions) -> None:
    watch_ids = [watch(sessions, DAILY, thread=f"1700000000.00{index:04d}", question=f"Question {index}?")
                 for index in range(5)]
    queue, sent = recording_queue(sessions)
    # Admission sends nothing on (per-workspace limit 0 in flight would be invalid): runs stay waiting in the queue.
    queue.limits = Limits(per_user=1, per_workspace=1)
    now = [dt.datetime(2026, 11, 28, 9, 1, tzinfo=dt.timezone.utc)]
    capped = FiringLimits(DailyQuotas(runs_per_user=0), max_waiting=None, max_waiting_in_workspace=2)
    worker = Worker(sessions, queue, lambda: now[0], dt.timedelta(0), limits=capped)
    worker.run_tick()
    fired = [run for watch_id in watch_ids for run in fired_runs(sessions, watch_id)]
    # One admitted (the in-flight limit), two more waiting (the waiting cap), the other two skipped.
    assert len(fired) == 3
    assert len(sent) == 1
    with sessions() as session:
        skipped = [row for row in session.scalars(select(Watch)) if row.last_run_id is not None
                   and row.fired == 0]
    assert len(skipped) == 2
