"""`deepthread chat` in a pseudo-terminal of 80×24 and of 120×40: `/history`, `/runs` and `/export ID html` show
every run id, and the path of the saved report, whole on one line, and the listings fit the screen's width."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pexpect
import pytest
from rich.cells import cell_len
from sqlalchemy import update

from bot.console.bundle import TERMINAL, TERMINAL_USER
from storage.models import Run
from tests.run_rows import finish_run, migrated_sqlite, one_source_report
from worker.headless import create_run

pytestmark = pytest.mark.integration

ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
# Ids of six digits, as a deployment's runs soon have: the first run is moved there, the others follow it.
FIRST_ID = 123456
QUESTIONS = [
    ("research", "What is the state of the art in tidal turbine efficiency across the European pilot sites?"),
    ("chat", "Which tidal stream sites in Scotland have been generating power for more than five years now?"),
    ("followup", "And how do their costs per megawatt-hour compare with offshore wind farms built since 2020?"),
    ("plan", "Plan a survey of the environmental studies of tidal lagoons, barrages and stream turbines"),
]


def screen_lines(raw: str) -> list[str]:
    """What a command printed, line by line, without colours or the cursor's moves."""
    return [ESCAPE.sub("", line).rstrip() for line in raw.replace("\r\n", "\n").replace("\r", "\n").split("\n")]


def said(child: pexpect.spawn, line: str) -> list[str]:
    """Type `line` at the prompt; the lines printed before the next prompt."""
    child.sendline(line)
    child.expect_exact("› ")
    return screen_lines(child.before)


@pytest.mark.parametrize(("columns", "rows"), [(80, 24), (120, 40)])
def test_history_runs_and_export_show_every_run_id_and_the_saved_path_whole(
        tmp_path: Path, redis_url: str, columns: int, rows: int) -> None:
    workdir = tmp_path.resolve()
    with migrated_sqlite(workdir) as (database_url, sessions):
        ids: list[int] = []
        for mode, question in QUESTIONS:
            run_id = create_run(sessions, place=TERMINAL, requester=TERMINAL_USER, mode=mode, question=question,
                                options={})
            if not ids:
                with sessions.begin() as session:
                    session.execute(update(Run).where(Run.id == run_id).values(id=FIRST_ID))
                run_id = FIRST_ID
            finish_run(sessions, run_id, "timed_out" if mode == "followup" else "done",
                       one_source_report(question) if mode == "research" else None)
            ids.append(run_id)
    assert ids == list(range(FIRST_ID, FIRST_ID + len(QUESTIONS)))
    environment = {**os.environ, "DATABASE_URL": database_url, "REDIS_URL": redis_url, "DATA_DIR": str(workdir / "data"),
                   "LLM_MODEL": "never-asked", "COLUMNS": str(columns), "LINES": str(rows)}
    child = pexpect.spawn(sys.executable, ["-m", "bot.cli", "chat"], env=environment, cwd=str(workdir),
                          encoding="utf-8", codec_errors="replace", timeout=60, dimensions=(rows, columns))
    child.logfile_read = open(workdir / "screen.log", "w", encoding="utf-8")
    try:
        child.expect_exact("/help")
        child.expect_exact("› ")

        history = said(child, "/history")
        header = next(line for line in history if line.startswith("Run"))
        assert header.split()[:2] == ["Run", "State"], history
        for run_id, (mode, _) in zip(ids, QUESTIONS, strict=True):
            [row] = [line for line in history if line.split()[:1] == [str(run_id)]]
            assert row.split()[1] in ("done", "timed_out") and "…" in row, row
        assert all(cell_len(line) <= columns for line in history), history

        listed = said(child, "/runs")
        for run_id in ids:
            [row] = [line for line in listed if line.split()[:1] == [str(run_id)]]
            assert row.endswith("…"), row
        assert all(cell_len(line) <= columns for line in listed), listed

        exported = said(child, f"/export {FIRST_ID} html")
        path = workdir / "data" / "exports" / f"deepthread-report-{FIRST_ID}.html"
        assert f"Saved the report of run {FIRST_ID} to {path}" in exported, exported
        assert path.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")

        child.sendline("/quit")
        child.expect(pexpect.EOF)
    finally:
        if child.isalive():
            child.terminate(force=True)
