"""The terminal's status panel: counts in good English, the latest warning, the run's id and how it ended."""

from __future__ import annotations

import datetime as dt
import io
from typing import Any

import pytest
from rich.console import Console

from chat.console.render import ConsoleRenderer, render_progress
from chat.history import RunHistory, RunSummary
from chat.message import Place
from chat.state import RunProgress, apply_event, initial_progress
from research.events import Warning_

NOW = dt.datetime(2025, 3, 1, 12, 0, tzinfo=dt.timezone.utc)
YOU = "cli:local"


def progress(**changes: Any) -> RunProgress:
    start = initial_progress(run_id=12, mode="research", question="What is a tidal turbine?", requested_by=YOU,
                             state="running", started_at=NOW - dt.timedelta(seconds=42))
    return start.model_copy(update=changes)


def recording_console(**options: Any) -> Console:
    return Console(record=True, width=100, file=io.StringIO(), **options)


def screen(progress: RunProgress, *, you: str | None = YOU) -> str:
    console = recording_console()
    console.print(render_progress(progress, NOW, you=you))
    return console.export_text()


def test_counts_of_one_are_singular() -> None:
    text = screen(progress(counts={"sub_questions": 1, "results": 1, "pages_read": 1, "passages": 1}))
    assert "1 sub-question · 1 result · 1 page read · 1 passage" in text


def test_counts_of_many_are_plural_and_counts_not_reached_are_left_out() -> None:
    text = screen(progress(counts={"sub_questions": 3, "results": 24, "pages_read": 0, "passages": 1_200}))
    assert "3 sub-questions · 24 results · 1,200 passages" in text and "pages read" not in text


def test_the_latest_warning_is_shown_on_its_own_line() -> None:
    first = Warning_(seq=1, phase="fetch", message="Skipped https://alpha.example/a: robots.txt disallows it")
    second = Warning_(seq=2, phase="fetch", message="Skipped https://beta.example/b: robots.txt disallows it")
    text = screen(apply_event(apply_event(progress(), first), second))
    assert "⚠ Skipped https://beta.example/b: robots.txt disallows it" in text.splitlines()
    assert "alpha.example" not in text


def test_a_long_warning_is_shortened_to_one_line() -> None:
    text = screen(progress(last_warning="Skipped a page:\n" + "very " * 100 + "long"))
    warning_lines = [line for line in text.splitlines() if line.startswith("⚠")]
    assert len(warning_lines) == 1 and warning_lines[0].endswith("…")


def test_no_warning_line_before_any_warning() -> None:
    assert "⚠" not in screen(progress())


def test_the_warning_is_drawn_dim() -> None:
    console = recording_console(force_terminal=True, color_system="standard")
    console.print(render_progress(progress(last_warning="Skipped a page"), NOW))
    assert "\x1b[2m⚠ Skipped a page" in console.export_text(styles=True)


def test_a_run_stopped_by_the_person_at_the_terminal_says_stopped_by_you() -> None:
    text = screen(progress(state="cancelled", cancelled_by=YOU))
    assert "Run 12 · Stopped by you" in text and YOU not in text


def test_a_run_stopped_by_someone_else_names_them_without_their_platform() -> None:
    text = screen(progress(state="cancelled", cancelled_by="slack:U0ADMIN01"))
    assert "Stopped by U0ADMIN01" in text and "by you" not in text


def test_the_renderer_passes_who_is_at_the_terminal() -> None:
    content = ConsoleRenderer(you=YOU).status(progress(state="cancelled", cancelled_by=YOU), now=NOW)
    console = recording_console()
    console.print(content.extra["rich"])
    assert "Stopped by you" in console.export_text()


@pytest.mark.parametrize(("changes", "footer"), [
    ({"state": "running"}, "Run 12 · Ctrl-C stops the run and keeps what was found."),
    ({"state": "queued", "queue_position": 2}, "Run 12 · Ctrl-C cancels."),
    ({"state": "queued"}, "Run 12 · Ctrl-C cancels."),
    ({"state": "done"}, "Run 12 · Done"),
    ({"state": "failed", "error": "the model refused"}, "Run 12 · Failed: the model refused"),
    ({"state": "timed_out"}, "Run 12 · Timed out"),
])
def test_the_footer_shows_the_run_id_and_how_to_stop_or_how_it_ended(changes: dict[str, Any], footer: str) -> None:
    assert screen(progress(**changes)).splitlines()[-1] == footer


def test_a_status_drawn_before_the_run_is_stored_has_no_id() -> None:
    assert screen(progress(run_id=0)).splitlines()[-1] == "Ctrl-C stops the run and keeps what was found."


def test_the_elapsed_time_is_shown() -> None:
    assert "42 s" in screen(progress())


def test_a_narrow_terminal_shortens_the_history_but_never_a_run_id() -> None:
    run = RunSummary(run_id=123456789012, mode="research", state="done", question="What is a tidal turbine?",
                     requested_by=YOU, created_at=NOW, thread=Place(platform="cli", workspace="local", channel="t"))
    console = Console(record=True, width=30, file=io.StringIO())
    console.print(ConsoleRenderer(you=YOU).history(RunHistory(yours=[run])).extra["rich"])
    assert "123456789012" in console.export_text()


@pytest.mark.parametrize(("changes", "footer"), [
    ({"state": "done", "partial": True, "partial_reason": "time budget of 60 s reached"},
     "Run 12 · ⚠ Partial — time budget of 60 s reached"),
    ({"state": "done", "partial": True}, "Run 12 · ⚠ Partial"),
])
def test_a_partial_run_ends_reading_partial_never_done(changes: dict[str, Any], footer: str) -> None:
    text = screen(progress(**changes))
    assert text.splitlines()[-1] == footer and "Done" not in text


def queued(**changes: Any) -> RunProgress:
    """A chat question asked 30 s before NOW that no worker has taken yet."""
    start = initial_progress(run_id=12, mode="chat", question="What is a tidal turbine?", requested_by=YOU,
                             requested_at=NOW - dt.timedelta(seconds=30))
    return start.model_copy(update=changes)


def test_a_queued_run_says_it_waits_for_a_worker_and_counts_from_the_request() -> None:
    text = screen(queued())
    assert "Waiting for a worker  30 s" in text.splitlines()
    later = Console(record=True, width=100, file=io.StringIO())
    later.print(render_progress(queued(), NOW + dt.timedelta(seconds=15), you=YOU))
    assert "Waiting for a worker  45 s" in later.export_text().splitlines()


def test_a_queued_run_waiting_behind_others_says_so_with_its_place() -> None:
    assert "Waiting for a worker (position 2 in the queue)  30 s" in screen(queued(queue_position=2)).splitlines()


def test_a_run_a_worker_took_counts_its_time_from_the_request_not_from_its_start() -> None:
    taken = queued(state="running", started_at=NOW - dt.timedelta(seconds=1))
    text = screen(taken)
    assert "30 s" in text.splitlines() and "1 s" not in text.splitlines()
    assert "Waiting for a worker" not in text


def test_a_stored_runs_progress_counts_from_when_it_was_asked_for() -> None:
    from storage.models import Run

    run = Run(id=12, mode="chat", question="Why?", requested_by=YOU, attempt=0, state="queued",
              created_at=NOW - dt.timedelta(seconds=30))
    assert RunProgress.for_run(run).elapsed_seconds(NOW) == 30


def test_a_run_stopped_at_the_terminal_says_it_was_stopped_once() -> None:
    stopped = progress(state="cancelled", cancelled_by="you (Ctrl-C)", partial=True, partial_reason="stopped by user")
    footer = screen(stopped, you=None).splitlines()[-1]
    assert footer == "Run 12 · Stopped by you (Ctrl-C)"


def test_a_timed_out_run_says_why_once() -> None:
    timed_out = progress(state="timed_out", partial=True, partial_reason="timed out",
                         error="The run passed its hard deadline of 660 s and was stopped.")
    footer = screen(timed_out).splitlines()[-1]
    assert footer == "Run 12 · Timed out: The run passed its hard deadline of 660 s and was stopped."
