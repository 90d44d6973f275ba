"""A watch's runs in the fake world, end to end: a real worker process, real Redis, the fake Slack, LLM, search and web.

Between the report a watch was made from and its first run, one page's figure changes and a new page appears: the
change list deepthread computes has exactly those two entries, and the run's report, in a thread of its own under a
headline, opens with them, cited. A second run with nothing changed posts one quiet line in the previous run's
thread, and no new thread: that run is fired by two real beats through Celery, once for all their ticks.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from sqlalchemy import select, update

from research.report import Report
from storage.models import Run, Watch
from storage.vocabulary import WatchLimits, WatchSchedule
from storage.watches import create_watch, watch_of
from tests.fakes.corpus import QUESTION, Corpus
from tests.fakes.slack_api import FakeSlack
from tests.integration.test_worker import make_cluster

pytestmark = pytest.mark.integration

ENDED = {"done", "failed", "cancelled", "timed_out"}
CHANNEL = "C1"


def watch_runs(cluster, watch_id: int) -> list[Run]:
    with cluster.sessions() as session:
        return list(session.scalars(select(Run).where(Run.watch_id == watch_id).order_by(Run.id)))


def delivered(cluster, run_id: int) -> Run:
    cluster.wait_for(lambda: (run := cluster.run(run_id)).state in ENDED and run.delivered_at is not None, 90,
                     f"run {run_id} to end and be delivered")
    return cluster.run(run_id)


def thread_of(cluster, run_id: int) -> str:
    with cluster.sessions() as session:
        return session.get(Run, run_id).conversation.thread


def top_level(slack: FakeSlack) -> list[str]:
    return [message.ts for message in slack.messages(CHANNEL) if message.thread_ts in (None, message.ts)]


def test_a_watch_reports_exactly_what_changed_then_says_in_one_line_when_nothing_did(
        tmp_path: Path, redis_url: str, slack: FakeSlack) -> None:
    with Corpus(hosts=("alpha.example", "beta.example", "gamma.example")) as corpus:
        cluster = make_cluster(tmp_path, redis_url, corpus, slack, watch_tick_seconds="0.5")
        try:
            cluster.start_worker("w1")
            origin_id, _ = cluster.start_run(QUESTION, user="U0OWNER1", channel=CHANNEL)
            origin = delivered(cluster, origin_id)
            assert origin.state == "done", origin.error
            watch = create_watch(cluster.sessions, run_id=origin_id, by="slack:U0OWNER1",
                                 schedule=WatchSchedule(cadence="weekly", hour=9, weekday=0, timezone="Europe/Paris"),
                                 one_thread=False, limits=WatchLimits(5, "daily"))

            # The web changes: one figure on beta's page, and a new page on gamma.
            beta = corpus.pages[1]
            old_figure = beta.numbers[0]
            new_figure = "9,999"
            corpus.change_figure(beta, old_figure, new_figure)
            added = corpus.add_page(2, 1)
            threads_before = top_level(slack)

            second = delivered(cluster, cluster.fire_watch(watch.id))
            assert second.state == "done", second.error
            report = Report.model_validate(second.report_json)
            assert report.watch is not None and report.watch.previous_run_id == origin_id
            changes = [(change.kind, change.url, change.before, change.after) for change in report.watch.changes]
            assert changes == [("new", added.url, None, None), ("figure", beta.url, old_figure, new_figure)]

            # Its own thread, under a headline naming the two changes; the report opens with them, each cited.
            headline_ts = thread_of(cluster, second.id)
            assert headline_ts in top_level(slack) and headline_ts not in threads_before
            headline = next(message for message in slack.messages(CHANNEL) if message.ts == headline_ts)
            assert "2 changes since" in headline.text
            assert second.report_markdown is not None
            opening = report.body_markdown.split("\n\n", 2)
            assert opening[0].startswith("**What changed since")
            items = opening[1].splitlines()
            cited = {source.number: source for source in report.sources}
            assert len(items) == 2
            assert "New source" in items[0] and f"{old_figure} → {new_figure}" in items[1]
            for item, url in zip(items, (added.url, beta.url), strict=True):
                number = int(item.rsplit("[", 1)[1].rstrip("]"))
                assert cited[number].url == url
            thread_text = "\n".join(message.visible_text for message in slack.messages(CHANNEL, thread_ts=headline_ts))
            assert "What changed since" in thread_text and new_figure in thread_text

            # Nothing changes before the next run, which two real beats fire through Celery (ticking every half
            # second, the worker running their ticks): once, with one quiet line in the second run's thread.
            threads_before = top_level(slack)
            with cluster.sessions.begin() as session:  # due a minute ago, by the database's clock
                session.execute(update(Watch).where(Watch.id == watch.id).values(
                    next_due_at=dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=1)))
            cluster.start_beat("beat1")
            cluster.start_beat("beat2")
            fired = cluster.wait_for(lambda: (runs := watch_runs(cluster, watch.id)) and len(runs) == 2 and runs[-1],
                                     60, "the run the beats' tick fired")
            third = delivered(cluster, fired.id)
            assert third.state == "done", third.error
            third_report = Report.model_validate(third.report_json)
            assert third_report.watch is not None and third_report.watch.previous_run_id == second.id
            assert third_report.watch.changes == []
            cluster.wait_for(lambda: cluster.redis.llen("deepthread") == 0, 30, "the ticks to be taken")
            quiet = [message.visible_text for message in slack.messages(CHANNEL, thread_ts=headline_ts)
                     if "nothing changed" in message.visible_text]
            assert len(quiet) == 1 and top_level(slack) == threads_before
            assert [run.id for run in watch_runs(cluster, watch.id)] == [second.id, third.id]  # once, for every tick
            assert watch_of(cluster.sessions, watch.id).next_due_at > dt.datetime.now(dt.timezone.utc)
        finally:
            cluster.stop()

