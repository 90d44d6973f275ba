"""The beat's tick, carried out by a worker: claim the watches that are due, fire each as a normal run, or say in its
thread why its window was skipped.

A fired run is stored queued and handed to admission like any person's run, so the per-user and per-workspace limits,
the waiting-queue caps and the daily quotas all hold for it (`storage.watches.fire_claimed` checks the last two).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass

from chat.message import Messenger, MessengerError, Place
from chat.platform import Outbound
from chat.watches import skipped_line, tell_owner_stopped
from ops.metrics import Metrics
from research.changes import Change, PassageSnapshot, SourceSnapshot, changes_markdown, compute_changes
from research.report import CitedPassage, Report, ReportSource, WatchComparison
from storage.attempts import Findings
from storage.db import Sessions
from storage.snapshots import asource_snapshots
from storage.watches import (
    Fired,
    FiringLimits,
    SkipReason,
    WatchView,
    aclaim_due,
    afire_claimed,
    alatest_thread,
    aprevious_run,
    astop_watch,
)
from worker.leases import worker_identity
from worker.queue import Queue

logger = logging.getLogger(__name__)

PlatformParts = Callable[[str], Outbound | None]


@dataclass
class WatchTick:
    """What one tick needs: the database, the queue, the caps, how to speak on each platform, and the metrics."""

    sessions: Sessions
    queue: Queue
    limits: FiringLimits
    claim_seconds: float
    platform_parts: PlatformParts
    metrics: Metrics | None = None
    clock: Callable[[], dt.datetime] | None = None  # None: the database's clock (tests inject one)

    async def __call__(self) -> list[Fired]:
        """Fire every watch that is due now; returns what became of each one this tick fired or skipped."""
        owner = worker_identity()
        now = self.clock() if self.clock is not None else None
        claimed = await aclaim_due(self.sessions, owner, claim_seconds=self.claim_seconds, now=now)
        outcomes = []
        for watch_id in claimed:
            try:
                fired = await afire_claimed(self.sessions, watch_id, owner, limits=self.limits, now=now)
            except Exception:
                logger.warning("watch %s could not be fired; its claim lapses and a later tick tries again", watch_id,
                               exc_info=True)
                self._count("failed")
                continue
            if fired is None:
                continue  # taken by another tick after this one's claim lapsed, or paused meanwhile
            self._count(fired.outcome)
            outcomes.append(fired)
            if fired.run_id is not None:
                logger.info("watch %s fired run %s", watch_id, fired.run_id)
                await asyncio.to_thread(self.queue.submit, fired.run_id)
            else:
                logger.info("watch %s skipped a window: %s", watch_id, fired.reason)
                if fired.reason is not None:
                    await self._say_skipped(fired.watch, fired.reason)
        return outcomes

    def _count(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.watch_runs.labels(outcome=outcome).inc()

    async def _say_skipped(self, watch: WatchView, reason: SkipReason) -> None:
        """One line in the watch's latest thread: this window's run did not start, why, and when it tries again."""
        try:
            parts = self.platform_parts(watch.platform)
        except LookupError:
            return
        if parts is None:
            return  # the terminal shows its watches' runs in `/history`; a skip is in the worker's log
        thread = await alatest_thread(self.sessions, watch.id, watch.thread)
        text = skipped_line(watch, reason)
        await say_in_thread(parts.messenger, Place(platform=watch.platform, workspace=watch.workspace,
                                                   channel=watch.channel, thread=thread), parts, text)


async def say_in_thread(messenger: Messenger, place: Place, parts: Outbound, text: str) -> None:
    """Post one quiet line; a platform that refuses is logged, never raised (nobody is waiting on it)."""
    try:
        await messenger.post(place, parts.renderer.notice(text))
    except Exception as error:
        logger.warning("could not post a watch's line in %s (%s)", place.channel, error)



async def stop_watch_for_good(sessions: Sessions, watch_id: int, error: BaseException, parts: Outbound) -> None:
    """The platform refused the watch's place for good (a channel gone, the app removed): stop the watch, saying why
    in `/watches`, and, once, to its owner directly where the platform lets the bot."""
    reason = error.reason if isinstance(error, MessengerError) else type(error).__name__
    stopped = await astop_watch(sessions, watch_id, f"its channel can no longer be posted in ({reason})")
    if stopped is not None:
        logger.warning("watch %s stopped: the platform refused its channel for good (%s)", watch_id, reason)
        await tell_owner_stopped(parts.messenger, parts.renderer, stopped)


# -- what changed, computed as a watch's run ends --------------------------------------------------------------------

def snapshots_of(findings: Findings) -> list[SourceSnapshot]:
    """The run's sources as `research.changes` compares them, from what the attempt gathered (in memory)."""
    passages: dict[str, list[PassageSnapshot]] = {}
    for passage in sorted(findings.passages, key=lambda found: (found.source_id, found.start)):
        passages.setdefault(passage.source_id, []).append(
            PassageSnapshot(passage.passage_id, passage.text, passage.is_snippet))
    return [SourceSnapshot.of(source.url, source.title, source.checksum, source.file, passages.get(source.source_id, []))
            for source in findings.sources]


async def compared_with_previous(sessions: Sessions, run_id: int, report: Report, findings: Findings) -> Report:
    """`report` of a watch's run, opening with what changed since the watch's previous run (computed here from the two
    runs' sources, each change cited with the passage of this run that shows it) and carrying the change list; the
    report as it was when there is no previous run to compare with."""
    previous = await aprevious_run(sessions, run_id)
    if previous is None:
        return report
    changes = compute_changes(await asource_snapshots(sessions, previous.run_id), snapshots_of(findings))
    return with_changes(report, findings, changes, WatchComparison(
        previous_run_id=previous.run_id, since=previous.finished_at, changes=changes, watch_id=previous.watch_id,
        schedule=previous.schedule))


PASSAGE_MARKER = re.compile(r"\[(p\d+)\]")


def with_changes(report: Report, findings: Findings, changes: list[Change], comparison: WatchComparison) -> Report:
    """A copy of `report` whose body opens with `changes_markdown(changes)`, each `[pN]` of it numbered as the report
    numbers its sources (a source the model did not cite joins the list, its passage among the cited ones)."""
    report = report.model_copy(deep=True, update={"watch": comparison})
    if not changes:
        return report
    passages = {passage.passage_id: passage for passage in findings.passages}
    sources = {source.source_id: source for source in findings.sources}
    listed = {source.source_id: source for source in report.sources}
    cited = {passage.id for passage in report.cited_passages}

    def number_for(marker: re.Match[str]) -> str:
        passage = passages.get(marker.group(1))
        if passage is None:
            return ""
        entry = listed.get(passage.source_id)
        if entry is None:
            found = sources.get(passage.source_id)
            entry = ReportSource(number=max((source.number for source in report.sources), default=0) + 1,
                                 source_id=passage.source_id, title=(found.title or found.url) if found else "",
                                 url=found.url if found else "", provider=(found.provider or "") if found else "",
                                 snippet_only=passage.is_snippet)
            report.sources.append(entry)
            listed[passage.source_id] = entry
        if passage.passage_id not in entry.passages_used:
            entry.passages_used.append(passage.passage_id)
        if passage.passage_id not in cited:
            report.cited_passages.append(CitedPassage(id=passage.passage_id, source_id=passage.source_id,
                                                      source_number=entry.number, text=passage.text,
                                                      is_snippet=passage.is_snippet))
            cited.add(passage.passage_id)
        return f"[{entry.number}]"

    since = comparison.since or report.created_at
    section = PASSAGE_MARKER.sub(number_for, changes_markdown(changes, since=since))
    report.body_markdown = f"{section}\n\n{report.body_markdown}"
    return report
