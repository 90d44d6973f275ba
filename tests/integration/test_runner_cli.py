"""The runner and the headless CLI against the fakes: what a finished run stores, and its exports."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from bot.cli import app
from config import load_settings
from research.report import Report, parse_report_json
from storage.db import make_engine, make_session_factory
from storage.migrate import upgrade
from storage.models import Citation, Event, Passage, Run, Source
from tests.fakes.corpus import QUESTION, Corpus
from bot.console.bundle import TERMINAL, TERMINAL_USER
from worker.headless import create_run
from tests.attempts import execute_stored
from tests.waiting import wait_for
from worker.runner import RunnerServices
from worker.toolkit import research_options

pytestmark = pytest.mark.integration


@pytest.fixture
def corpus() -> Iterator[Corpus]:
    with Corpus() as running:
        yield running


@pytest.fixture
def environment(corpus: Corpus, tmp_path, monkeypatch: pytest.MonkeyPatch) -> str:
    url = f"sqlite:///{tmp_path}/deepthread.db"
    for name, value in {**corpus.environment(), "DATABASE_URL": url, "RESEARCH_MAX_ROUNDS": "2"}.items():
        monkeypatch.setenv(name, value)
    return url


def sessions_for(url: str):
    engine = make_engine(url)
    upgrade(url, engine=engine)
    return make_session_factory(engine)


def execute_run(corpus: Corpus, url: str, mode: str, question: str = QUESTION) -> tuple[int, list]:
    sessions = sessions_for(url)
    run_id = create_run(sessions, place=TERMINAL, requester=TERMINAL_USER, mode=mode, question=question, options={})
    states = []

    async def on_state(progress) -> None:
        states.append(progress)

    services = RunnerServices(sessions=sessions, tools=corpus.tools(), options=research_options(load_settings()))
    asyncio.run(execute_stored(run_id, services, on_state=on_state))
    return run_id, states


def test_runner_stores_a_done_run_with_everything_it_gathered(corpus: Corpus, environment: str) -> None:
    run_id, states = execute_run(corpus, environment, "research")
    with sessions_for(environment)() as session:
        run = session.get(Run, run_id)
        assert run.state == "done"
        assert run.attempt == 1 and run.started_at and run.finished_at
        assert run.report_markdown and "## Sources" in run.report_markdown
        assert Report.model_validate(run.report_json).sources
        assert run.phase_timings and run.usage["total_tokens"] > 0
        sources = session.scalars(select(Source).where(Source.run_id == run_id)).all()
        assert {source.fetch_status for source in sources} == {"ok"}
        assert session.scalars(select(Passage).where(Passage.run_id == run_id)).all()
        citations = session.scalars(select(Citation).where(Citation.run_id == run_id)).all()
        assert citations and all(citation.verdict == "supported" for citation in citations)
        assert all(citation.passage is not None for citation in citations)
        events = session.scalars(select(Event).where(Event.run_id == run_id).order_by(Event.seq)).all()
        assert [event.seq for event in events] == list(range(1, len(events) + 1))
        assert events[-1].type == "complete"
    assert states[-1].state == "done"
    seen_phases = {progress.current_phase for progress in states if progress.current_phase}
    assert {"decompose", "search", "fetch", "read", "synthesize", "verify"} <= seen_phases


def test_plan_run_with_a_model_that_never_answers_json_ends_failed(corpus: Corpus, environment: str) -> None:
    corpus.llm.handler = lambda request: "Here is my plan in prose, no JSON at all."
    run_id, states = execute_run(corpus, environment, "plan")
    with sessions_for(environment)() as session:
        run = session.get(Run, run_id)
        assert run.state == "failed"
        assert "did not return a valid answer" in run.error
        assert session.scalars(select(Event).where(Event.run_id == run_id).order_by(Event.seq.desc())).first().type == "error"
    assert states[-1].state == "failed"


def test_cli_research_stores_a_done_run_whose_exports_round_trip(corpus: Corpus, environment: str, tmp_path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["research", QUESTION, "--out", str(tmp_path / "report.md")])
    assert result.exit_code == 0, result.output
    assert re.search(r"(?m)^Run \d+ ended done; report written to ", result.stderr), "the panel ends its line first"
    assert "## Sources" in (tmp_path / "report.md").read_text()
    with sessions_for(environment)() as session:
        run = session.scalars(select(Run)).one()
        assert run.state == "done"
        run_id = run.id

    listed = runner.invoke(app, ["runs"])
    assert listed.exit_code == 0 and f"{run_id}" in listed.output and "done" in listed.output

    as_json = runner.invoke(app, ["export", str(run_id), "--format", "json"])
    report = parse_report_json(as_json.stdout)
    assert report.sources and report.cited_passages
    assert json.loads(as_json.stdout)["audit"]["sentences_total"] == report.audit.sentences_total

    as_html = runner.invoke(app, ["export", str(run_id), "--format", "html"]).stdout
    assert "<html" in as_html.lower() and "<script" not in as_html.lower()
    for source in report.sources:
        assert f'href="{source.url}"' in as_html

    as_markdown = runner.invoke(app, ["export", str(run_id), "--format", "md"]).stdout
    assert as_markdown.strip() == (tmp_path / "report.md").read_text().strip()


def test_cli_plan_ends_with_the_command_that_runs_it_and_that_command_follows_the_plan(
        corpus: Corpus, environment: str, tmp_path) -> None:
    runner = CliRunner()
    planned = runner.invoke(app, ["plan", QUESTION])
    assert planned.exit_code == 0, planned.output
    assert planned.stdout.count("Research plan:") == 1 and "→" not in planned.stdout
    assert "latest` — looking for news" in planned.stdout
    last_line = planned.stderr.strip().splitlines()[-1]
    match = re.fullmatch(r"Run this plan: deepthread research --plan (\d+)", last_line)
    assert match, planned.stderr
    plan_id = int(match.group(1))

    researched = runner.invoke(app, ["research", "--plan", str(plan_id), "--out", str(tmp_path / "report.md")])
    assert researched.exit_code == 0, researched.output
    with sessions_for(environment)() as session:
        plan_run = session.get(Run, plan_id)
        run = session.scalars(select(Run).order_by(Run.id.desc())).first()
        assert (run.mode, run.state, run.question) == ("research", "done", QUESTION)
        assert run.plan == plan_run.report_json["plan"]
    assert "## Sources" in (tmp_path / "report.md").read_text()


def test_cli_rejects_an_empty_question_and_a_bad_date(environment: str) -> None:
    runner = CliRunner()
    assert runner.invoke(app, ["research", "   "]).exit_code == 2
    result = runner.invoke(app, ["research", "x", "--since", "last week"])
    assert result.exit_code == 2 and "--since" in result.output


def test_ctrl_c_stops_cli_research_and_keeps_the_partial_run(tmp_path) -> None:
    import os
    import signal
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path}/deepthread.db"
    with Corpus(page_latency=5.0) as slow:
        env = {**os.environ, **slow.environment(), "DATABASE_URL": url}
        process = subprocess.Popen([sys.executable, "-m", "bot.cli", "research", QUESTION], env=env, cwd=tmp_path,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            sessions = None

            def fetching() -> bool:
                nonlocal sessions
                if not os.path.exists(tmp_path / "deepthread.db"):
                    return False
                sessions = sessions or sessions_for(url)
                with sessions() as session:
                    return session.scalars(select(Event).where(Event.type == "phase_started",
                                                               Event.phase == "fetch")).first() is not None

            wait_for(fetching, "the run to reach the fetch phase", 60, interval=0.1)
            process.send_signal(signal.SIGINT)
            stdout, _ = process.communicate(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
    assert process.returncode == 1
    assert f"# Research stopped: {QUESTION}" in stdout and "[Research stopped by user]" not in stdout
    with sessions() as session:
        run = session.scalars(select(Run)).one()
        assert run.state == "cancelled"
        assert session.scalars(select(Source).where(Source.run_id == run.id)).all()
        assert session.scalars(select(Event).where(Event.run_id == run.id).order_by(Event.seq.desc())).first().type == "aborted"
