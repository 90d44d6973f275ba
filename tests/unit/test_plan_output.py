"""A research plan as people read it: its title once, each search with the kind of source it looks for (nothing when
it looks for any), and `deepthread research` refusing what it cannot run."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from bot.cli import app
from research.plan import ResearchPlan, render_plan_markdown
from research.report import Report, render_html, render_markdown

PLAN = ResearchPlan(query="Tidal power costs", key_questions=["What does a tidal turbine cost?"],
                    search_strategy=[{"query": "tidal power cost"}, {"query": "tidal LCOE", "source_type": "news"},
                                     {"query": "tidal turbine maintenance", "source_type": " Any "}],
                    deliverable="A short report")


def plan_report() -> Report:
    return Report(question="Tidal power", title=f"Research plan: {PLAN.query}", mode="plan",
                  body_markdown=render_plan_markdown(PLAN), plan=PLAN.model_dump(mode="json"))


def test_a_plan_shows_its_title_once() -> None:
    markdown = render_markdown(plan_report())
    assert markdown.startswith("# Research plan: Tidal power costs\n")
    assert markdown.count("Tidal power costs") == 1
    assert render_html(plan_report()).count("Tidal power costs") == 2  # the page's <title> and its <h1>


def test_a_search_says_what_kind_of_source_it_looks_for_and_nothing_when_any_will_do() -> None:
    searches = [line for line in render_plan_markdown(PLAN).splitlines() if line.startswith("- ")]
    assert searches == ["- `tidal power cost`", "- `tidal LCOE` — looking for news", "- `tidal turbine maintenance`"]
    assert "→" not in render_markdown(plan_report())


def test_research_wants_a_question_or_a_plan_but_not_both(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path}/never.db")
    for arguments in ([], ["Why?", "--plan", "3"]):
        result = CliRunner().invoke(app, ["research", *arguments])
        assert result.exit_code == 2 and "deepthread research --plan RUN_ID" in result.output
    assert not (tmp_path / "never.db").exists()


def test_research_refuses_a_plan_that_is_not_a_finished_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bot.console.bundle import TERMINAL, TERMINAL_USER
    from tests.run_rows import finish_run, migrated_sqlite
    from worker.headless import create_run

    with migrated_sqlite(tmp_path) as (url, sessions):
        research_run = create_run(sessions, place=TERMINAL, requester=TERMINAL_USER, mode="research", question="Why?",
                                  options={})
        unfinished_plan = create_run(sessions, place=TERMINAL, requester=TERMINAL_USER, mode="plan", question="Why?",
                                     options={})
        finish_run(sessions, research_run, "done", plan_report())
    monkeypatch.setenv("DATABASE_URL", url)
    for run_id in (research_run, unfinished_plan, 999):
        result = CliRunner().invoke(app, ["research", "--plan", str(run_id)])
        assert result.exit_code == 1 and f"Run {run_id} is not a finished plan" in result.output
