"""`deepthread chat` in a pseudo-terminal, against a real worker, Redis and the fakes."""

from __future__ import annotations

import sys
from pathlib import Path

import pexpect
import pytest
from sqlalchemy import select

from storage.models import Event, Run
from tests.fakes.corpus import QUESTION, Corpus
from tests.fakes.slack_api import FakeSlack
from tests.integration.workers import Cluster

pytestmark = pytest.mark.integration


def spawn_chat(cluster: Cluster, tmp_path: Path) -> pexpect.spawn:
    child = pexpect.spawn(sys.executable, ["-m", "bot.cli", "chat"], env=cluster.environment, cwd=str(tmp_path),
                          encoding="utf-8", codec_errors="replace", timeout=60,
                          dimensions=(50, 160))
    child.logfile_read = open(tmp_path / "chat.log", "w")
    child.expect("deepthread")
    child.expect("› ")
    return child


def runs(cluster: Cluster) -> list[Run]:
    with cluster.sessions() as session:
        return list(session.scalars(select(Run).order_by(Run.id)))


def test_terminal_chat_answers_plans_runs_the_plan_on_go_and_cancels_on_ctrl_c(tmp_path: Path, redis_url: str) -> None:
    from storage.redis import connect

    connect(redis_url).flushall()
    with Corpus(page_latency={"alpha.example": 0.2}) as corpus, FakeSlack() as slack:
        cluster = Cluster(database_url=f"sqlite:///{tmp_path}/deepthread.db", redis_url=redis_url, corpus=corpus,
                          slack=slack, workdir=tmp_path)
        cluster.start_worker("w1")
        child = spawn_chat(cluster, tmp_path)
        try:
            child.sendline("What is a tidal turbine?")
            child.expect("Here is a short answer")
            child.expect("› ")

            child.sendline(f"/plan {QUESTION}")
            child.expect("Search strategy")
            child.expect("to run this plan")
            child.expect("› ")

            child.sendline("go")
            child.expect("Sources")
            child.expect("sentences verified")
            child.expect("› ")
            research_runs = [run for run in runs(cluster) if run.mode == "research"]
            assert research_runs and research_runs[-1].state == "done" and research_runs[-1].plan is not None

            corpus.web.latency = 20.0
            child.sendline(f"/research {QUESTION} --site alpha.example")

            def fetching() -> bool:
                with cluster.sessions() as session:
                    newest = session.scalars(select(Run).order_by(Run.id.desc())).first()
                    return newest.mode == "research" and newest.state == "running" and session.scalars(
                        select(Event).where(Event.run_id == newest.id, Event.phase == "fetch")).first() is not None

            cluster.wait_for(fetching, 60, "the last run to be fetching")
            child.sendintr()
            child.expect("Stopped")
            child.expect("› ")
            last = runs(cluster)[-1]
            assert last.state == "cancelled" and last.cancelled_by == "cli:local"
            child.sendline("/quit")
            child.expect(pexpect.EOF)
        finally:
            if child.isalive():
                child.terminate(force=True)
            cluster.stop()
    modes = [run.mode for run in runs(cluster)]
    assert modes[:3] == ["chat", "plan", "research"]
