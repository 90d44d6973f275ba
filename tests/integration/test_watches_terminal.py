"""Watches in `deepthread chat`, end to end: a pseudo-terminal, a real worker process, Redis and the fake LLM, search and
web. A watch is made with `/watch` on the session's report in the machine's time zone (TZ), listed, paused and resumed
with `/watches`; its runs, fired by the beat's tick while the chat is open, show in the chat as they end — the report
opening with what changed on the web, then one quiet line when nothing did — and in `/history`, `/runs` and
`deepthread runs`."""

from __future__ import annotations

import datetime as dt
import re
import subprocess
import sys
import zoneinfo
from pathlib import Path

import pexpect
import pytest

from bot.console.chat import local_timezone
from research.report import Report
from storage.runs import WATCHES_HEADER
from storage.vocabulary import WEEKDAYS
from storage.watches import WatchView, all_watches
from tests.fakes.corpus import QUESTION, Corpus
from tests.integration.terminal_chat import chat_with_a_worker
from tests.integration.workers import Cluster
from tests.run_rows import all_runs

pytestmark = pytest.mark.integration

ZONE = "Pacific/Auckland"
ENDED = ("done", "failed", "cancelled", "timed_out")
# Long enough for a watch's run to be fired, researched by the worker and seen by the chat's next look.
RUN_SECONDS = 120


def said(child: pexpect.spawn, line: str, *expected: str) -> None:
    """Type `line` at the prompt, expect each pattern in turn, then the next prompt."""
    child.sendline(line)
    for pattern in expected:
        child.expect(pattern)
    child.expect("› ")


def the_watch(cluster: Cluster) -> WatchView:
    [watch] = all_watches(cluster.sessions)
    return watch


def test_a_terminal_watch_is_made_listed_changed_and_its_runs_show_in_the_chat_as_they_end(
        tmp_path: Path, redis_url: str) -> None:
    assert local_timezone({"TZ": ZONE}) == ZONE
    with (Corpus(hosts=("alpha.example", "beta.example", "gamma.example")) as corpus,
          chat_with_a_worker(corpus, tmp_path, redis_url, chat_environment={"TZ": ZONE}) as (cluster, child)):
        said(child, f"/research {QUESTION}", "Sources", "sentences verified")
        [origin] = all_runs(cluster.sessions)
        assert origin.state == "done" and origin.mode == "research", origin.error

        # (a) a bad form says how; the good one watches the session's report in the machine's zone, on its weekday.
        said(child, "/watch fortnightly", re.escape("Usage: /watch daily|weekly|monthly [HH:MM] [--thread]"))
        assert all_watches(cluster.sessions) == []
        weekday_before = dt.datetime.now(zoneinfo.ZoneInfo(ZONE)).weekday()
        child.sendline("/watch weekly 09:00")
        child.expect(rf"Watching .* every (\w+day) at 09:00 \({ZONE}\)")
        said_weekday = child.match.group(1)
        child.expect(f"It runs on {said_weekday}s, today's weekday")
        child.expect("› ")
        weekday_after = dt.datetime.now(zoneinfo.ZoneInfo(ZONE)).weekday()
        watch = the_watch(cluster)
        assert watch.schedule.timezone == ZONE and watch.schedule.cadence == "weekly"
        assert (watch.schedule.hour, watch.schedule.minute) == (9, 0)
        assert watch.schedule.weekday in (weekday_before, weekday_after)
        assert watch.question == QUESTION and watch.state == "active" and watch.created_by == "cli:local"
        assert WEEKDAYS[watch.schedule.weekday or 0] == said_weekday

        # (b) listed, paused and resumed.
        said(child, "/watches", rf"#{watch.id}\s+active\s+{re.escape(watch.schedule.describe())}")
        said(child, f"/watches pause {watch.id}", f"Watch #{watch.id} paused")
        assert the_watch(cluster).state == "paused"
        said(child, f"/watches resume {watch.id}", f"Watch #{watch.id} resumed")
        assert the_watch(cluster).state == "active"

        # (d) the web changes, the watch fires while the chat is open: its report shows, opening with the changes.
        beta = corpus.pages[1]
        old_figure, new_figure = beta.numbers[0], "9,999"
        corpus.change_figure(beta, old_figure, new_figure)
        corpus.add_page(2, 1)
        changed_run = cluster.fire_watch(watch.id)
        child.expect(rf"Watch: .* — 2 changes since .* · watch #{watch.id}, run {changed_run}", timeout=RUN_SECONDS)
        child.expect("What changed since")
        child.expect(re.escape(new_figure))
        child.expect("› ")
        report = Report.model_validate(cluster.run(changed_run).report_json)
        assert report.watch is not None and len(report.watch.changes) == 2

        # Nothing changes before the next run: one quiet line.
        quiet_run = cluster.fire_watch(watch.id)
        child.expect(rf"Checked again: nothing changed since the report of .*\(Watch #{watch.id}, run {quiet_run}:",
                     timeout=RUN_SECONDS)
        child.expect("› ")
        quiet = cluster.run(quiet_run)
        quiet_comparison = Report.model_validate(quiet.report_json).watch
        assert quiet.state == "done" and quiet_comparison is not None and quiet_comparison.changes == []

        # The watch's runs are the terminal's, in /history; /runs lists the watch under the runs.
        said(child, "/history", rf"{quiet_run}\s+done\s+research", rf"{changed_run}\s+done\s+research")
        said(child, "/runs", re.escape(WATCHES_HEADER), rf"#{watch.id}\s+active\s+[\d-]+ [\d:]+\s+"
                                                        rf"{re.escape(watch.schedule.describe())} · ")
        child.sendline("/quit")
        child.expect(pexpect.EOF)

    # (e) `deepthread runs` lists the watch with its schedule under the runs.
    listed = subprocess.run([sys.executable, "-m", "bot.cli", "runs"], env={**cluster.environment, "COLUMNS": "160"},
                            cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True).stdout.splitlines()
    assert WATCHES_HEADER in listed, listed
    watch_rows = listed[listed.index(WATCHES_HEADER) + 1:]
    assert len(watch_rows) == 1 and watch_rows[0].split()[:2] == [f"#{watch.id}", "active"], watch_rows
    assert f"{watch.schedule.describe()} · {QUESTION}" in watch_rows[0]
    assert all(run.state in ENDED for run in all_runs(cluster.sessions))
