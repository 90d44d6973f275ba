"""History and exports in the terminal chat: the core's listing, and `export html` for this session's report."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from bot.console.chat import chat_command
from research.report import render_html
from tests.unit.terminal_harness import SLACK_CHANNEL, Terminal, a_report, finishing_after


@pytest.fixture
def terminal(session_factory: sessionmaker[Session], tmp_path: Path) -> Terminal:
    return Terminal(session_factory, tmp_path / "data" / "exports")


@pytest.mark.parametrize("line", ["export html", "export JSON", "/export md"])
def test_export_with_a_format_alone_is_the_terminals_command(line: str) -> None:
    command = chat_command(line)
    assert command is not None and command.name == "export"


async def test_export_html_alone_saves_this_sessions_latest_report(terminal: Terminal) -> None:
    finish = finishing_after(terminal, 0.2, state="done", report=a_report("Tides explained"))
    session_runs: list[int] = []

    async def sleep(wait: float) -> None:
        await finish(wait)
        if not session_runs and terminal.newest_run().state == "done":
            session_runs.append(terminal.newest_run().id)
            # Another session's report, newer than this session's: `export html` must not pick it.
            terminal.add_run("Another session's question", report=a_report("Another report"))

    screen = await terminal.type("What is a tidal turbine?", "export html", sleep=sleep)
    [run_id] = session_runs
    assert terminal.newest_run().id > run_id
    path = terminal.exports / f"deepthread-report-{run_id}.html"
    assert str(path.resolve()) in screen
    assert path.read_text(encoding="utf-8") == render_html(a_report("Tides explained").model_copy(update={"run_id": run_id}))
    assert [file.name for file in terminal.exports.iterdir()] == [path.name]


async def test_export_with_a_format_before_any_report_in_this_session_says_so(terminal: Terminal) -> None:
    terminal.add_run("An earlier session's question", report=a_report())
    screen = await terminal.type("export md")
    assert "No report in this session yet" in screen and not terminal.exports.exists()


async def test_history_uses_the_cores_listing_and_leaves_out_other_platforms(terminal: Terminal) -> None:
    mine = terminal.add_run("Asked in the terminal")
    terminal.add_run("Asked in Slack", place=SLACK_CHANNEL, requester="slack:U1")
    screen = await terminal.type("history")
    assert "Asked in the terminal" in screen and str(mine) in screen and "Asked in Slack" not in screen
