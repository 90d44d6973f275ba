"""The terminal chat's own commands and its following of a run: a recording console, SQLite, fakeredis, a fake clock."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from bot.console.bundle import TERMINAL_USER
from bot.console.chat import NO_WORKER_GRACE_SECONDS, WorkerWatch, chat_command
from research.report import Report, render_html, render_markdown
from storage.models import Conversation, Message, Run
from storage.runs import RUNS_HEADER, recent_runs
from storage.shared_limits import beat
from storage.vocabulary import RunOptions
from tests.fakes.clock import FakeClock
from tests.unit.terminal_harness import SLACK_CHANNEL, Terminal, a_report, finishing_after

NO_WORKER_WORDS = "No worker is running, so this run waits in the queue."


@pytest.fixture
def terminal(session_factory: sessionmaker[Session], tmp_path: Path) -> Terminal:
    return Terminal(session_factory, tmp_path / "data" / "exports")


# -- help, greeting, quitting ------------------------------------------------------------------------

async def test_the_greeting_names_help_and_quit(terminal: Terminal) -> None:
    screen = await terminal.type()
    assert "/help" in screen and "/quit" in screen


@pytest.mark.parametrize("line", ["help", "/help", "?", "HELP", "/Help"])
async def test_help_is_written_for_the_terminal_and_answered_without_the_core(terminal: Terminal, line: str) -> None:
    screen = await terminal.type(line)
    for words in ("/research", "/plan", "/ask", "--since DATE", "--site DOMAIN", "--deep", "--quick", "follow-up",
                  "go", "dig deeper", "retry", "continue", "Ctrl-C", "/history", "/runs", "/export ID md|html|json",
                  "/quit"):
        assert words in screen, words
    for slack_words in ("react", "Mention me", "DM me", "`", "**", "<@", ":x:", "✅", "❌"):
        assert slack_words not in screen, slack_words
    assert terminal.count(Run) == terminal.count(Message) == 0 and terminal.sent == []


@pytest.mark.parametrize("line", ["/quit", "/exit", "quit", "exit", "/QUIT"])
async def test_quit_and_exit_leave_without_reading_further(terminal: Terminal, line: str) -> None:
    await terminal.type(line, "What is a tidal turbine?")
    assert terminal.lines_read == 1 and terminal.count(Run) == 0


async def test_ctrl_d_leaves(terminal: Terminal) -> None:
    await terminal.type()
    assert terminal.lines_read == 0


# -- unknown commands --------------------------------------------------------------------------------

@pytest.mark.parametrize("line", ["/stats", "/researh tidal power", "/usr/bin/python is what?", "/Export2 3"])
async def test_an_unknown_slash_word_is_refused_and_nothing_reaches_the_core(terminal: Terminal, line: str) -> None:
    screen = await terminal.type(line)
    word = line.split()[0]
    assert f"Unknown command {word}. Type /help for the commands." in screen
    assert terminal.count(Run) == terminal.count(Message) == terminal.count(Conversation) == 0
    assert terminal.sent == [] and terminal.messenger.messages == {}


@pytest.mark.parametrize(("line", "command"), [
    ("/history", "history"), ("history", "history"), ("/runs", "runs"), ("Runs", "runs"), ("export 3", "export"),
    ("export #3 html", "export"), ("export", "export"), ("/export 3 json", "export"), ("?", "help"),
    ("/whatever", "unknown")])
def test_command_words_are_recognised(line: str, command: str) -> None:
    assert chat_command(line).name == command


@pytest.mark.parametrize("line", ["history of tidal power", "export controls on turbines", "export 12 tips for x",
                                  "/research tidal power", "/plan tidal power", "/ask what is a tide?", "go",
                                  "dig deeper", "retry"])
def test_questions_and_the_cores_words_are_not_terminal_commands(line: str) -> None:
    assert chat_command(line) is None


# -- history and runs --------------------------------------------------------------------------------

async def test_history_lists_this_terminals_last_ten_runs_newest_first(terminal: Terminal) -> None:
    ids = [terminal.add_run(f"Terminal question number {index}", mode="plan" if index == 11 else "research")
           for index in range(12)]
    terminal.add_run("A question asked in Slack", place=SLACK_CHANNEL, requester="slack:U1")
    screen = await terminal.type("/history")
    rows = [line.split() for line in screen.splitlines() if re.match(r"^\s*\d+\s", line)]
    assert [int(row[0]) for row in rows] == list(reversed(ids))[:10]
    assert rows[0][1:3] == ["done", "plan"] and rows[1][1:3] == ["done", "research"]
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d", screen)
    assert "Terminal question number 11" in screen and "Slack" not in screen
    for heading in ("Run", "State", "Mode", "When", "Question"):
        assert heading in screen


async def test_history_before_any_run_says_there_is_none(terminal: Terminal) -> None:
    assert "No runs yet in this terminal" in await terminal.type("history")


async def test_runs_before_any_run_says_there_is_none(terminal: Terminal) -> None:
    assert "No runs yet." in await terminal.type("runs")


async def test_runs_lists_every_platforms_runs_as_deepthread_runs_does(terminal: Terminal) -> None:
    terminal.add_run("In the terminal")
    terminal.add_run("In Slack", place=SLACK_CHANNEL, requester="slack:U1", state="cancelled")
    screen = await terminal.type("/runs")
    for line in [RUNS_HEADER, *recent_runs(terminal.sessions, 20)]:
        assert line.rstrip() in screen
    assert screen.index("In Slack") < screen.index("In the terminal")


# -- export ------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("line", "extension", "render"), [
    ("/export {id}", "md", render_markdown), ("/export {id} md", "md", render_markdown),
    ("/export {id} html", "html", render_html), ("export {id} HTML", "html", render_html),
    ("export #{id} json", "json", None)])
async def test_export_writes_the_report_under_the_exports_directory_and_prints_its_path(
        terminal: Terminal, line: str, extension: str, render: Callable[[Report], str] | None) -> None:
    report = a_report()
    run_id = terminal.add_run("What is a tidal turbine?", report=report)
    screen = await terminal.type(line.format(id=run_id))
    path = terminal.exports / f"deepthread-report-{run_id}.{extension}"
    assert str(path.resolve()) in screen
    written = path.read_text(encoding="utf-8")
    if render is not None:
        assert written == render(report)
    else:
        assert Report.model_validate_json(written).title == report.title
    assert terminal.count(Run) == 1 and terminal.sent == []


async def test_export_of_an_unknown_run_says_there_is_no_such_run(terminal: Terminal) -> None:
    screen = await terminal.type("/export 42")
    assert "There is no run 42." in screen and not terminal.exports.exists()


async def test_export_of_a_run_without_a_report_says_so(terminal: Terminal) -> None:
    run_id = terminal.add_run("Stopped early", state="cancelled")
    screen = await terminal.type(f"/export {run_id}")
    assert f"Run {run_id} has no report to export (it is cancelled)." in screen and not terminal.exports.exists()


async def test_export_in_an_unknown_format_names_the_formats(terminal: Terminal) -> None:
    run_id = terminal.add_run("What is a tidal turbine?", report=a_report())
    screen = await terminal.type(f"/export {run_id} pdf")
    assert "Cannot export as pdf: choose md, html or json" in screen and not terminal.exports.exists()


@pytest.mark.parametrize("line", ["/export", "/export twelve", "/export 1 md extra", "export"])
async def test_export_without_a_run_id_shows_its_usage(terminal: Terminal, line: str) -> None:
    assert "Usage: /export RUN_ID [md|html|json]" in await terminal.type(line)


# -- runs started from the terminal ------------------------------------------------------------------

async def test_a_question_starts_a_run_whose_id_is_printed_and_shown_in_the_status(terminal: Terminal) -> None:
    sleep = finishing_after(terminal, 0.5, state="done", report=a_report("Tides explained"))
    screen = await terminal.type("What is a tidal turbine?", sleep=sleep)
    run = terminal.newest_run()
    assert f"Run {run.id} · quick answer" in screen
    assert f"Run {run.id} · Done" in screen
    assert "Tides explained" in screen and "A tidal turbine turns with the tide." in screen
    assert terminal.sent == [("deepthread.chat", run.id)]


async def test_research_plan_and_ask_commands_still_reach_the_core(terminal: Terminal) -> None:
    sleep = finishing_after(terminal, 0.2, state="done", report=a_report())
    screen = await terminal.type("/research Why is the sea salty? --deep --site noaa.gov", "/plan Tidal power",
                                 "/ask What is a tide?", sleep=sleep)
    with terminal.sessions() as session:
        runs = list(session.scalars(select(Run).order_by(Run.id)))
    assert [(run.mode, run.question) for run in runs] == [
        ("research", "Why is the sea salty?"), ("plan", "Tidal power"), ("chat", "What is a tide?")]
    assert runs[0].options == RunOptions(sites=["noaa.gov"], preset="deep")
    assert f"Run {runs[0].id} · research" in screen and f"Run {runs[1].id} · plan" in screen
    assert "Unknown command" not in screen


async def test_the_no_worker_line_appears_within_ten_seconds_and_only_once(terminal: Terminal) -> None:
    start = terminal.clock.now
    said_at: list[float] = []

    async def sleep(wait: float) -> None:
        await terminal.clock.sleep(wait)
        if not said_at and NO_WORKER_WORDS in terminal.console.export_text(clear=False):
            said_at.append(terminal.clock.now)
        if terminal.clock.now - start >= 60:
            terminal.finish(terminal.newest_run().id, "cancelled", cancelled_by=TERMINAL_USER)

    screen = await terminal.type("What is a tidal turbine?", sleep=sleep)
    assert said_at and NO_WORKER_GRACE_SECONDS <= said_at[0] - start <= 10
    assert screen.count(NO_WORKER_WORDS) == 1
    assert ("Start one with deepthread worker in another terminal (deepthread up starts one for you)."
            in " ".join(screen.split()))
    assert "Stopped by you" in screen


async def test_no_worker_line_is_not_said_while_a_worker_beats(terminal: Terminal) -> None:
    beat(terminal.redis, "w1@host")
    screen = await terminal.type("What is a tidal turbine?", sleep=finishing_after(terminal, 30, state="cancelled"))
    assert NO_WORKER_WORDS not in screen and "Stopped" in screen


def test_worker_watch_tells_once_after_the_workers_were_missing_for_the_whole_grace() -> None:
    clock = FakeClock()
    watch = WorkerWatch(5.0, clock)
    told = []
    for alive in (False, False, True, False, False, False, False, False, False, False, False):
        told.append(watch.should_tell(alive))
        clock.advance(2.0)
    # Missing at 0 and 2, alive at 4 (the count starts again), missing from 6: told at the first look 5 s later.
    assert told == [False, False, False, False, False, False, True, False, False, False, False]


def test_attach_takes_the_path_as_a_shell_reads_a_pasted_one() -> None:
    from bot.console.chat import chat_command, typed_path

    command = chat_command("/attach  ~/field notes/a  b.md")
    assert command is not None and command.name == "attach" and command.rest == "~/field notes/a  b.md"
    assert typed_path("'/tmp/my notes.md'") == typed_path("/tmp/my\\ notes.md") == "/tmp/my notes.md"
    assert typed_path(command.rest) == "~/field notes/a  b.md"
