"""`deepthread chat` in a pseudo-terminal, against a real worker, Redis and the fakes."""

from __future__ import annotations

from pathlib import Path

import pexpect
import pytest

from tests.fakes.corpus import QUESTION, Corpus
from tests.fakes.slack_api import FakeSlack
from tests.integration.terminal_chat import chat_with_a_worker
from tests.run_rows import all_runs

pytestmark = pytest.mark.integration


def test_terminal_chat_answers_plans_runs_the_plan_on_go_answers_its_commands_and_cancels_on_ctrl_c(
        tmp_path: Path, redis_url: str) -> None:
    with (Corpus(page_latency={"alpha.example": 0.2}) as corpus, FakeSlack() as slack,
          chat_with_a_worker(corpus, tmp_path, redis_url, slack=slack) as (cluster, child)):
        child.sendline("What is a tidal turbine?")
        child.expect("Here is a short answer")
        child.expect("› ")

        child.sendline(f"/plan {QUESTION}")
        child.expect("Search strategy")
        child.expect("to run this plan")
        child.expect("› ")

        child.sendline("go")
        child.expect(r"Run (\d+) · research")
        announced_run = int(child.match.group(1))
        child.expect("Sources")
        child.expect("sentences verified")
        child.expect("› ")
        research_runs = [run for run in all_runs(cluster.sessions) if run.mode == "research"]
        assert research_runs and research_runs[-1].state == "done" and research_runs[-1].plan is not None
        report_run = research_runs[-1].id
        assert report_run == announced_run

        child.sendline("/help")
        child.expect_exact("/export ID md|html|json")
        child.expect_exact("/quit")
        child.expect("› ")

        child.sendline("/history")
        child.expect(rf"{report_run}\s+done\s+research")
        child.expect("› ")

        child.sendline(f"/export {report_run} html")
        exported = tmp_path / "data" / "exports" / f"deepthread-report-{report_run}.html"
        child.expect_exact(f"Saved the report of run {report_run} to {exported}")
        child.expect("› ")
        assert exported.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")

        runs_before = len(all_runs(cluster.sessions))
        child.sendline("/frobnicate the turbines")
        child.expect_exact("Unknown command /frobnicate. Type /help for the commands.")
        child.expect("› ")
        assert len(all_runs(cluster.sessions)) == runs_before

        corpus.web.latency = 20.0
        child.sendline(f"/research {QUESTION} --site alpha.example")

        cluster.wait_for(cluster.newest_run_is_fetching, 60, "the last run to be fetching")
        child.sendintr()
        child.expect(r"Stopped(\x1b\[[\d;]*m)* by you")
        child.expect("› ")
        last = all_runs(cluster.sessions)[-1]
        assert last.state == "cancelled" and last.cancelled_by == "cli:local"
        child.sendline("/quit")
        child.expect(pexpect.EOF)
    modes = [run.mode for run in all_runs(cluster.sessions)]
    assert modes[:3] == ["chat", "plan", "research"]
