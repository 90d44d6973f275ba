"""Run listings read the same everywhere and fit the terminal: `deepthread runs`, the chat's `/history` and `/runs`,
and the Slack and Discord history name modes with one vocabulary, cut questions with "…", and never cut an id."""

from __future__ import annotations

import datetime as dt
import io
from pathlib import Path

import pytest
from rich.cells import cell_len
from rich.console import Console
from typer.testing import CliRunner

from bot.cli import app
from bot.console.bundle import TERMINAL, TERMINAL_USER
from chat.console.render import ConsoleRenderer
from chat.discord.render import DiscordRenderer
from chat.history import RunHistory, RunSummary
from chat.message import Place
from chat.slack.render import SlackRenderer
from storage.feedback import record_verdict
from storage.runs import RUNS_HEADER, recent_runs
from storage.vocabulary import RunMode, mode_name
from tests.run_rows import finish_run, migrated_sqlite
from worker.headless import create_run

NOW = dt.datetime(2026, 1, 2, 3, 4, tzinfo=dt.timezone.utc)
LONG_QUESTION = ("What is the state of the art in tidal turbine efficiency across the European pilot sites since "
                 "2020, and how does it compare with offshore wind?")
MODES: list[tuple[RunMode, str]] = [("research", "research"), ("plan", "plan"), ("chat", "quick answer"),
                                    ("followup", "follow-up")]


def summary(run_id: int, mode: RunMode, place: Place, *, state: str = "done",
            question: str = LONG_QUESTION) -> RunSummary:
    return RunSummary(run_id=run_id, mode=mode, state=state, question=question, requested_by=TERMINAL_USER,
                      created_at=NOW, thread=place)


def drawn(renderable: object, width: int) -> list[str]:
    console = Console(record=True, width=width, file=io.StringIO())
    console.print(renderable)
    return console.export_text().splitlines()


# -- one vocabulary for modes ------------------------------------------------------------------------------------


def test_modes_are_named_quick_answer_follow_up_research_and_plan() -> None:
    assert [mode_name(mode) for mode, _ in MODES] == [name for _, name in MODES]


@pytest.mark.parametrize(("mode", "name"), MODES)
def test_every_listing_names_a_mode_with_the_same_words(tmp_path: Path, mode: RunMode, name: str) -> None:
    slack = Place(platform="slack", workspace="T1", channel="C2", thread="1700000001.000001")
    discord = Place(platform="discord", workspace="1234", channel="42", thread="5678")
    terminal = TERMINAL.model_copy(update={"thread": "t1"})
    listings = {
        "slack": SlackRenderer().history(RunHistory(yours=[summary(7, mode, slack)])).text,
        "discord": DiscordRenderer().history(RunHistory(yours=[summary(7, mode, discord)])).text,
        "/history": "\n".join(drawn(ConsoleRenderer().history(RunHistory(yours=[summary(7, mode, terminal)])).extra["rich"],
                                    120)),
    }
    with migrated_sqlite(tmp_path) as (_, sessions):
        create_run(sessions, place=TERMINAL, requester=TERMINAL_USER, mode=mode, question="Why?", options={})
        listings["deepthread runs"] = "\n".join(recent_runs(sessions, 20))
    for where, text in listings.items():
        assert name in text, where
    if mode in ("chat", "followup"):
        for where, text in listings.items():
            assert f" {mode} " not in text.replace("·", " "), f"{where} spells the stored word {mode!r}"


# -- deepthread runs -------------------------------------------------------------------------------------------


@pytest.fixture
def stored_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Runs of every mode (one rated 👍👍👎), the last with a long question, in the database DATABASE_URL names."""
    with migrated_sqlite(tmp_path) as (url, sessions):
        ids = []
        for mode, _ in MODES:
            run_id = create_run(sessions, place=TERMINAL, requester=TERMINAL_USER, mode=mode, question=LONG_QUESTION,
                                options={})
            finish_run(sessions, run_id, "timed_out" if mode == "plan" else "done")
            ids.append(run_id)
        with sessions.begin() as session:
            for user, verdict in (("cli:a", "good"), ("cli:b", "good"), ("cli:c", "bad")):
                record_verdict(session, run_id=ids[0], user=user, verdict=verdict, now=NOW)
    monkeypatch.setenv("DATABASE_URL", url)
    return ids


@pytest.mark.parametrize("columns", [80, 120])
def test_deepthread_runs_fits_the_terminal_one_line_a_run_the_question_cut_with_an_ellipsis(
        stored_runs: list[int], monkeypatch: pytest.MonkeyPatch, columns: int) -> None:
    monkeypatch.setenv("COLUMNS", str(columns))
    result = CliRunner().invoke(app, ["runs"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == RUNS_HEADER and len(lines) == 1 + len(stored_runs)
    for line in lines:
        assert cell_len(line) <= columns, line
    for line, run_id in zip(lines[1:], reversed(stored_runs), strict=True):
        assert line.split()[0] == str(run_id)
        assert line.endswith("…") and LONG_QUESTION[:10] in line
    assert "👍 2 👎 1" in lines[-1]


def test_deepthread_runs_on_a_wide_terminal_shows_the_whole_question(stored_runs: list[int],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    lines = CliRunner().invoke(app, ["runs"]).output.splitlines()
    assert all(line.endswith(LONG_QUESTION) for line in lines[1:])


# -- the chat's /history -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("columns", [80, 120])
def test_history_fits_the_terminal_with_every_run_id_and_state_whole(columns: int) -> None:
    place = TERMINAL.model_copy(update={"thread": "t1"})
    runs = [summary(123456, "followup", place, state="timed_out"), summary(7, "chat", place, state="cancelled"),
            summary(42, "research", place, question="Short")]
    lines = drawn(ConsoleRenderer().history(RunHistory(yours=runs)).extra["rich"], columns)
    assert lines[0].split()[:2] == ["Run", "State"] and "Question" in lines[0]
    assert [line.split()[:2] for line in lines[1:]] == [["123456", "timed_out"], ["7", "cancelled"], ["42", "done"]]
    assert all(cell_len(line.rstrip()) <= columns for line in lines)
    assert lines[1].rstrip().endswith("…") and lines[3].rstrip().endswith("Short")
    assert "follow-up" in lines[1] and "quick answer" in lines[2]


def test_a_terminal_too_narrow_for_the_question_drops_it_before_any_id() -> None:
    place = TERMINAL.model_copy(update={"thread": "t1"})
    lines = drawn(ConsoleRenderer().history(RunHistory(yours=[summary(123456789, "chat", place)])).extra["rich"], 40)
    assert "Question" not in lines[0] and lines[1].split()[:2] == ["123456789", "done"]
    assert all(cell_len(line.rstrip()) <= 40 for line in lines)


def test_short_questions_keep_their_column_on_a_wide_terminal() -> None:
    place = TERMINAL.model_copy(update={"thread": "t1"})
    runs = [summary(5, "research", place, question="what is x?")]
    lines = drawn(ConsoleRenderer().history(RunHistory(yours=runs)).extra["rich"], 120)
    assert "Question" in lines[0] and lines[1].rstrip().endswith("what is x?")
