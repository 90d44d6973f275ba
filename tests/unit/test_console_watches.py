"""Watches in the terminal chat: `/watch` and `/watches` through the core, the machine's time zone, the watches table,
and the runs of the terminal's watches shown as they end while the chat is open."""

from __future__ import annotations

import asyncio
import datetime as dt
import io
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.cells import cell_len
from rich.console import Console
from sqlalchemy.orm import Session, sessionmaker

from bot.console.bundle import TERMINAL, TERMINAL_USER
from bot.console.chat import (
    WATCH_USAGE,
    WATCHES_USAGE,
    TerminalChat,
    WatchRequest,
    local_timezone,
    watch_request,
)
from bot.conversation.events import ChatEvent
from chat.console.messenger import renderable_for
from chat.console.render import NO_WATCHES_HERE, ConsoleRenderer
from chat.watches import WatchListing, WatchSummary
from research.changes import Change
from research.report import Report, WatchComparison
from storage.quotas import DailyQuotas
from storage.runs import WATCHES_HEADER
from storage.vocabulary import WatchSchedule
from storage.watches import (
    FiringLimits,
    WatchLimits,
    all_watches,
    claim_due,
    create_watch,
    fire_claimed,
    watch_of,
)
from tests.unit.terminal_harness import SLACK_CHANNEL, Sleep, Terminal, a_report, finishing_after

ZONE = "Asia/Tokyo"
# 23:30 UTC on Thursday 26 November 2026 is already Friday 27 November in Tokyo: "today" is the person's day.
THURSDAY_NIGHT_UTC = dt.datetime(2026, 11, 26, 23, 30, tzinfo=dt.timezone.utc)
QUESTION = "What is a tidal turbine?"
LIMITS = WatchLimits(5, "daily")
NO_QUOTAS = FiringLimits(DailyQuotas(runs_per_user=0, cost_per_workspace=0))


@pytest.fixture
def terminal(session_factory: sessionmaker[Session], tmp_path: Path) -> Terminal:
    return Terminal(session_factory, tmp_path / "data" / "exports")


async def typed(terminal: Terminal, *lines: str, sleep: Sleep | None = None,
                read_line: Callable[[str], str] | None = None, watch_sleep: Sleep = asyncio.sleep) -> str:
    """`terminal.type` in Tokyo late on a Thursday night (UTC), the looks for ended watch runs paced by `watch_sleep`:
    `lines` typed at the prompt (or read by `read_line`), then Ctrl-D; the screen's words, one space apart."""
    pending = list(lines)

    def next_line(prompt: str) -> str:
        if not pending:
            raise EOFError
        return pending.pop(0)

    chat = TerminalChat(terminal.core, terminal.sessions, terminal.messenger, terminal.console,
                        read_line or next_line, exports=terminal.exports, clock=terminal.clock,
                        sleep=sleep or terminal.clock.sleep, timezone=ZONE, now=lambda: THURSDAY_NIGHT_UTC,
                        watch_sleep=watch_sleep)
    await chat.run()
    return " ".join(terminal.console.export_text().split())


def fire(sessions: sessionmaker[Session], watch_id: int) -> int:
    """One tick at the watch's due time, as the beat's would run it; the run it stored."""
    watch = watch_of(sessions, watch_id)
    assert watch is not None
    moment = watch.next_due_at + dt.timedelta(seconds=1)
    assert claim_due(sessions, "test-tick", claim_seconds=60, now=moment) == [watch_id]
    fired = fire_claimed(sessions, watch_id, "test-tick", limits=NO_QUOTAS, now=moment)
    assert fired is not None and fired.run_id is not None, fired
    return fired.run_id


def watch_report(previous_run_id: int, changes: list[Change], marker: str) -> Report:
    """A watch run's report, opening with its changes (as the worker writes it) when there are some."""
    opening = f"**What changed since 1 Nov 2026** {marker}\n\n- 1,200 → 1,500 [1]\n\n" if changes else ""
    return Report(title="Tidal turbines", question=QUESTION, body_markdown=f"{opening}A turbine turns with the tide.",
                  watch=WatchComparison(previous_run_id=previous_run_id, changes=changes,
                                        since=dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc)))


A_FIGURE_MOVED = [Change(kind="figure", url="https://example.org/tides", title="Tides", before="1,200", after="1,500")]


# -- the machine's time zone ------------------------------------------------------------------------------------------

def test_the_time_zone_is_tz_when_it_names_one_else_where_localtime_links_else_utc(tmp_path: Path) -> None:
    localtime = tmp_path / "localtime"
    os.symlink("/usr/share/zoneinfo/America/Sao_Paulo", localtime)
    assert local_timezone({"TZ": "Europe/Paris"}, localtime) == "Europe/Paris"
    assert local_timezone({"TZ": ":Pacific/Auckland"}, localtime) == "Pacific/Auckland"
    assert local_timezone({"TZ": "CET-1CEST"}, localtime) == "America/Sao_Paulo"  # a POSIX rule, not an IANA name
    assert local_timezone({}, localtime) == "America/Sao_Paulo"
    os.symlink("../var/db/timezone/zoneinfo/posix/Asia/Tokyo", tmp_path / "posix")
    assert local_timezone({}, tmp_path / "posix") == "Asia/Tokyo"
    (tmp_path / "copied").write_bytes(b"TZif")  # a copy of the zone's file, not a link: no name to read
    assert local_timezone({}, tmp_path / "copied") == "UTC"
    assert local_timezone({"TZ": "Nowhere/Atlantis"}, tmp_path / "missing") == "UTC"


# -- reading /watch ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("arguments", "expected"), [
    (("daily",), WatchRequest("daily")),
    (("Weekly", "18:30"), WatchRequest("weekly", 18, 30)),
    (("monthly", "7:05", "--thread"), WatchRequest("monthly", 7, 5, one_thread=True)),
    (("12", "daily", "00:00"), WatchRequest("daily", 0, 0, run_id=12)),
    (("--thread", "#12", "weekly"), WatchRequest("weekly", run_id=12, one_thread=True)),
])
def test_watch_reads_its_cadence_time_run_and_thread(arguments: tuple[str, ...], expected: WatchRequest) -> None:
    assert watch_request(arguments) == expected


@pytest.mark.parametrize("arguments", [(), ("fortnightly",), ("daily", "25:00"), ("daily", "9"), ("daily", "09:60"),
                                       ("12",), ("daily", "09:00", "extra"), ("weekly", "monday")])
def test_watch_refuses_other_forms(arguments: tuple[str, ...]) -> None:
    with pytest.raises(ValueError):
        watch_request(arguments)


def test_weekly_runs_on_todays_weekday_and_monthly_on_todays_date() -> None:
    friday = dt.date(2026, 11, 27)
    assert WatchRequest("weekly", 9).schedule(friday, ZONE) == WatchSchedule(cadence="weekly", hour=9, weekday=4,
                                                                             timezone=ZONE)
    assert WatchRequest("monthly", 9).schedule(friday, ZONE) == WatchSchedule(cadence="monthly", hour=9, day=27,
                                                                              timezone=ZONE)
    assert WatchRequest("daily", 9).schedule(friday, ZONE).describe() == f"every day at 09:00 ({ZONE})"


# -- /watch and /watches through the core -----------------------------------------------------------------------------

async def test_watch_after_a_report_makes_a_watch_in_the_persons_zone_on_their_weekday_and_watches_changes_it(
        terminal: Terminal) -> None:
    sleep = finishing_after(terminal, 0.2, state="done", report=a_report())
    screen = await typed(terminal, f"/research {QUESTION}", "/watch weekly 18:30", "/watches", "/runs",
                         "/watches pause 1", "/watches resume #1", "/watches frobnicate 1", "/watches delete 1",
                         "/watches", sleep=sleep)
    assert all_watches(terminal.sessions) == []  # deleted at the end
    assert f"Watching “{QUESTION}” every Friday at 18:30 ({ZONE})" in screen
    assert "It runs on Fridays, today's weekday." in screen and "Its runs show here while this chat is open" in screen
    assert "#1 active every Friday at 18:30 (Asia/Tokyo)" in screen and "Question" in screen
    assert WATCHES_HEADER.split()[0] in screen and f"every Friday at 18:30 ({ZONE}) · {QUESTION}" in screen
    assert "Watch #1 paused" in screen and "Watch #1 resumed" in screen and WATCHES_USAGE in screen
    assert "Watch #1 is deleted" in screen and screen.rstrip().endswith(NO_WATCHES_HERE)


async def test_watch_stores_the_schedule_the_core_was_handed(terminal: Terminal) -> None:
    sleep = finishing_after(terminal, 0.2, state="done", report=a_report())
    await typed(terminal, f"/research {QUESTION}", "/watch monthly 07:05 --thread", sleep=sleep)
    [watch] = all_watches(terminal.sessions)
    assert watch.schedule == WatchSchedule(cadence="monthly", hour=7, minute=5, day=27, timezone=ZONE)
    assert watch.one_thread and watch.created_by == TERMINAL_USER and watch.platform == TERMINAL.platform
    assert watch.question == QUESTION


@pytest.mark.parametrize("line", ["/watch", "/watch fortnightly", "/watch daily 25:00", "watch"])
async def test_a_bad_watch_prints_the_usage_and_makes_nothing(terminal: Terminal, line: str) -> None:
    terminal.add_run(QUESTION, report=a_report())
    screen = await typed(terminal, line)
    assert " ".join(WATCH_USAGE.split()) in screen and all_watches(terminal.sessions) == []


async def test_watch_before_any_report_in_this_session_says_so(terminal: Terminal) -> None:
    terminal.add_run("An earlier session's question", report=a_report())
    screen = await typed(terminal, "/watch daily")
    assert "No research report in this session yet to watch." in screen and all_watches(terminal.sessions) == []


async def test_watch_of_a_run_id_takes_this_terminals_runs_only(terminal: Terminal) -> None:
    mine = terminal.add_run(QUESTION, report=a_report())
    slacks = terminal.add_run("Asked in Slack", place=SLACK_CHANNEL, requester="slack:U1", report=a_report())
    screen = await typed(terminal, f"/watch {slacks} daily", f"/watch {mine} daily 06:00")
    assert f"There is no run {slacks} in this terminal" in screen
    [watch] = all_watches(terminal.sessions)
    assert watch.question == QUESTION and watch.platform == TERMINAL.platform
    assert watch.schedule == WatchSchedule(cadence="daily", hour=6, timezone=ZONE)


async def test_another_persons_pause_or_delete_is_refused_by_the_core(terminal: Terminal) -> None:
    origin = terminal.add_run(QUESTION, report=a_report())
    watch = create_watch(terminal.sessions, run_id=origin, by=TERMINAL_USER, one_thread=False, limits=LIMITS,
                         schedule=WatchSchedule(cadence="daily", hour=9, timezone=ZONE))
    for verb in ("pause", "delete"):
        outcome = await terminal.core.handle(ChatEvent(
            platform=TERMINAL.platform, workspace=TERMINAL.workspace, channel=TERMINAL.channel, user="cli:someone-else",
            kind="command", command="watches", text=f"{verb} {watch.id}"))
        assert [reply.text for reply in outcome.replies] == [
            f"Only the person who made this watch, or an admin, can {verb} it."]
    assert watch_of(terminal.sessions, watch.id) == watch


# -- the watches table ------------------------------------------------------------------------------------------------

def summary(watch_id: int, state: str = "active", question: str = QUESTION) -> WatchSummary:
    return WatchSummary(watch_id=watch_id, question=question, state=state,  # type: ignore[arg-type]
                        schedule=WatchSchedule(cadence="weekly", hour=9, weekday=0, timezone="Europe/Paris"),
                        next_due_at=dt.datetime(2026, 11, 30, 8, 0, tzinfo=dt.timezone.utc), created_by=TERMINAL_USER,
                        stopped_reason="its channel can no longer be posted in" if state == "stopped" else None)


def drawn(listing: WatchListing, width: int) -> list[str]:
    console = Console(record=True, width=width, file=io.StringIO())
    console.print(renderable_for(ConsoleRenderer().watches(listing)))
    return [line.rstrip() for line in console.export_text().splitlines()]


def test_the_watches_table_shows_number_state_schedule_next_run_in_its_zone_and_question() -> None:
    listing = WatchListing(watches=[summary(1), summary(12, "paused", "How fast do tidal lagoons silt up in winter?"),
                                    summary(123, "stopped")])
    lines = drawn(listing, 160)
    assert lines[0].split() == ["Watch", "State", "Schedule", "Next", "run", "Question"]
    assert lines[1].split()[:2] == ["#1", "active"] and "every Monday at 09:00 (Europe/Paris)" in lines[1]
    assert "30 Nov 2026 09:00 CET" in lines[1] and lines[1].endswith(QUESTION)
    assert lines[2].split()[:2] == ["#12", "paused"] and " - " in lines[2]
    assert "stopped: its channel can no longer be posted in" in lines[3]
    plain = ConsoleRenderer().watches(listing).text.splitlines()
    assert plain[0].startswith("#1  active  every Monday at 09:00 (Europe/Paris)  next 30 Nov 2026 09:00")


@pytest.mark.parametrize("width", [80, 60, 40])
def test_the_watches_table_fits_the_console_and_never_cuts_the_number_or_the_state(width: int) -> None:
    listing = WatchListing(watches=[summary(1), summary(123, "paused")])
    lines = drawn(listing, width)
    assert all(cell_len(line) <= width for line in lines), lines
    assert lines[1].split()[:2] == ["#1", "active"] and lines[2].split()[:2] == ["#123", "paused"]


def test_no_watches_says_how_to_make_one_in_the_terminal() -> None:
    content = ConsoleRenderer().watches(WatchListing())
    assert content.text == NO_WATCHES_HERE and "/watch weekly" in content.text and "**" not in content.text


# -- watch runs shown as they end -------------------------------------------------------------------------------------

async def test_the_runs_of_the_terminals_watches_are_shown_once_each_as_they_end(
        file_sessions: sessionmaker[Session], tmp_path: Path) -> None:
    terminal = Terminal(file_sessions, tmp_path / "exports")
    origin = terminal.add_run(QUESTION, report=a_report())
    watch = create_watch(file_sessions, run_id=origin, by=TERMINAL_USER, one_thread=False, limits=LIMITS,
                         schedule=WatchSchedule(cadence="daily", hour=9, timezone=ZONE))
    before_the_chat = fire(file_sessions, watch.id)
    terminal.finish(before_the_chat, "done", watch_report(origin, A_FIGURE_MOVED, "(ended before the chat)"))
    fired: list[int] = []

    def fire_one() -> None:  # queued: nothing to show until it ends
        fired.append(fire(file_sessions, watch.id))

    def end_with_a_change() -> None:
        terminal.finish(fired[-1], "done", watch_report(before_the_chat, A_FIGURE_MOVED, "(while open)"))

    def fire_and_end_unchanged() -> None:
        fire_one()
        terminal.finish(fired[-1], "done", watch_report(fired[0], [], ""))

    def fire_and_fail() -> None:
        fire_one()
        terminal.finish(fired[-1], "failed", error="The search provider refused the key")

    steps = iter([fire_one, end_with_a_change, fire_and_end_unchanged, fire_and_fail])
    every_step_looked_at = threading.Event()

    async def watch_sleep(seconds: float) -> None:
        step = next(steps, None)
        if step is not None:
            step()
            return
        every_step_looked_at.set()
        await asyncio.Event().wait()  # until the chat leaves

    def read_line(prompt: str) -> str:
        if not every_step_looked_at.wait(timeout=30):
            raise AssertionError("the chat never looked after every step")
        raise EOFError

    screen = await typed(terminal, read_line=read_line, watch_sleep=watch_sleep)
    assert "(ended before the chat)" not in screen
    assert screen.count("(while open)") == 1
    assert screen.count(f"🔭 Watch: {QUESTION} — 1 change since 1 Nov 2026 · watch #{watch.id}, run {fired[0]}") == 1
    assert screen.count("🔭 Checked again: nothing changed since the report of") == 1
    assert f"(Watch #{watch.id}, run {fired[1]}: {QUESTION})" in screen
    assert screen.count("🔭 This watch's run failed: The search provider refused the key.") == 1
