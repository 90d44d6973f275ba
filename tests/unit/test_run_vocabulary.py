"""The run vocabulary (storage/vocabulary.py) names every state and mode the code stores, and is the one place
that spells out which states are active or terminal."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest

from bot.conversation.suggestions import PREFIX_BY_MODE
from chat.history import RunSummary
from chat.state import PHASES_BY_MODE, RunProgress
from storage.models import Run
from storage.vocabulary import ACTIVE_STATES, TERMINAL_STATES, RunMode, RunState, run_mode, run_state
from worker.runner import TERMINAL_STATE_OF_EVENT

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("worker", "bot", "chat", "storage", "research", "ops", "config", "bench")
VOCABULARY = ROOT / "storage" / "vocabulary.py"
STATE_NAMES = {"state", "final_state"}


def python_files(*packages: str) -> list[Path]:
    return [path for package in packages for path in sorted((ROOT / package).rglob("*.py"))]


def _target_names(target: ast.expr) -> list[str | None]:
    if isinstance(target, ast.Tuple):
        return [name for element in target.elts for name in _target_names(element)]
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, ast.Attribute):
        return [target.attr]
    return [None]


def states_written_in(paths: list[Path]) -> set[str]:
    """The string constants given to a `state=` keyword or assigned to a `state`/`final_state` name or attribute."""
    found: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "state" and isinstance(node.value, ast.Constant):
                found.add(node.value.value)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    names = _target_names(target)
                    values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
                    for name, value in zip(names, values, strict=False):
                        if name in STATE_NAMES and isinstance(value, ast.Constant) and isinstance(value.value, str):
                            found.add(value.value)
    return found


def spelled_out_state_sets(paths: list[Path]) -> list[str]:
    """Tuple, list and set literals of only state words that equal the active or the terminal states."""
    named = {frozenset(ACTIVE_STATES): "active", frozenset(TERMINAL_STATES): "terminal"}
    hits = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Tuple | ast.List | ast.Set) and node.elts and all(
                    isinstance(element, ast.Constant) and isinstance(element.value, str) for element in node.elts):
                words = frozenset(element.value for element in node.elts)  # type: ignore[attr-defined]
                if words in named:
                    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
                    hits.append(f"{where}:{node.lineno}: the {named[words]} states")
    return hits


def test_the_state_literal_lists_exactly_the_states_the_worker_and_bot_store() -> None:
    stored = (states_written_in(python_files("worker", "bot", "storage")) | set(TERMINAL_STATE_OF_EVENT.values())
              | {Run.__table__.c.state.default.arg})
    assert stored == set(get_args(RunState))


def test_active_and_terminal_states_split_the_states_between_them() -> None:
    assert ACTIVE_STATES == {"queued", "running"}
    assert not ACTIVE_STATES & TERMINAL_STATES
    assert ACTIVE_STATES | TERMINAL_STATES == set(get_args(RunState))


def test_every_state_the_status_model_can_reach_is_a_run_state() -> None:
    assert states_written_in(python_files("chat")) <= set(get_args(RunState))


def test_the_mode_literal_lists_exactly_the_modes_that_have_phases_and_prompts() -> None:
    assert set(PHASES_BY_MODE) == set(get_args(RunMode))
    assert set(PREFIX_BY_MODE) == set(get_args(RunMode))


def test_no_module_outside_the_vocabulary_spells_out_the_active_or_terminal_states() -> None:
    paths = [path for path in python_files(*PACKAGES) if path != VOCABULARY]
    assert spelled_out_state_sets(paths) == []


def test_the_guard_finds_spelled_out_active_and_terminal_sets(tmp_path: Path) -> None:
    module = tmp_path / "spelled_out.py"
    module.write_text('IN_FLIGHT = ("queued", "running")\nENDED = frozenset({"done", "failed", "cancelled", "timed_out"})\n')
    assert spelled_out_state_sets([module]) == ["spelled_out.py:1: the active states", "spelled_out.py:2: the terminal states"]


def test_a_string_from_outside_is_narrowed_once_or_refused() -> None:
    assert run_state("timed_out") == "timed_out" and run_mode("followup") == "followup"
    with pytest.raises(ValueError, match="not a run state"):
        run_state("finished")
    with pytest.raises(ValueError, match="not a run mode"):
        run_mode("ask")


def test_status_models_refuse_a_state_or_mode_outside_the_vocabulary() -> None:
    with pytest.raises(ValueError):
        RunProgress(run_id=1, mode="research", question="q", requested_by="u", state="finished")
    with pytest.raises(ValueError):
        RunSummary.model_validate({"run_id": 1, "mode": "ask", "state": "done", "question": "q", "requested_by": "u",
                                   "created_at": "2026-01-01T00:00:00Z",
                                   "thread": {"platform": "console", "workspace": "w", "channel": "c", "thread": "t"}})


def test_a_watch_s_time_zone_is_known_without_the_system_s_zone_database() -> None:
    # A slim image (python:3.11-slim on Debian 13) has no /usr/share/zoneinfo: zoneinfo then reads the tzdata package.
    script = ("import zoneinfo, datetime as dt\n"
              "from storage.vocabulary import zone_of\n"
              "assert zoneinfo.TZPATH == ()\n"
              "print(dt.datetime(2026, 7, 1, 12, tzinfo=zone_of('Europe/Paris')).utcoffset())\n")
    ran = subprocess.run([sys.executable, "-c", script], env={**os.environ, "PYTHONTZPATH": ""}, cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert (ran.returncode, ran.stdout.strip()) == (0, "2:00:00"), ran.stderr
