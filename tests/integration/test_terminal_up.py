"""`deepthread up` in a pseudo-terminal: the worker it starts answers, Ctrl-C stops only the run, no log reaches
the screen, and /quit leaves nothing running."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pexpect
import pytest
from sqlalchemy import select

from storage.models import Run
from tests.fakes.corpus import QUESTION, Corpus
from tests.integration.terminal_chat import SCREEN
from tests.integration.workers import Cluster

pytestmark = pytest.mark.integration

STOPPED_BY_YOU = r"Stopped(\x1b\[[\d;]*m)* by you"
NOT_ON_SCREEN = ("INFO", "WARNING", "celery@", "Traceback")


def processes_working_in(directory: Path) -> list[str]:
    """`pid command` of every process whose working directory is `directory` (`up` and all it started)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if Path(os.readlink(entry / "cwd")) == directory:
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found.append(f"{entry.name} {command.strip()}")
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def kill_leftovers(directory: Path) -> None:
    """After a failure: no worker of this test may outlive it (an orphan would keep polling a stopped Redis)."""
    for line in processes_working_in(directory):
        try:
            os.kill(int(line.split()[0]), signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_up_answers_stops_a_run_on_ctrl_c_keeps_answering_keeps_logs_off_screen_takes_commands_and_quits_cleanly(
        tmp_path: Path, redis_url: str) -> None:
    from storage.redis import connect

    connect(redis_url).flushall()
    workdir = tmp_path.resolve()
    with Corpus() as corpus:
        cluster = Cluster(database_url=f"sqlite:///{workdir}/deepthread.db", redis_url=redis_url, corpus=corpus,
                          workdir=workdir)
        # INFO, so that a log line leaking onto the screen would show.
        environment = {**cluster.environment, **SCREEN, "DATA_DIR": str(workdir / "data"), "LOG_LEVEL": "INFO"}
        screen_path = workdir / "screen.log"
        child = pexpect.spawn(sys.executable, ["-m", "bot.cli", "up"], env=environment, cwd=str(workdir),
                              encoding="utf-8", codec_errors="replace", timeout=60, dimensions=(50, 160))
        child.logfile_read = open(screen_path, "w", encoding="utf-8")
        try:
            child.expect_exact("/help")
            child.expect("› ")

            child.sendline("What is a tidal turbine?")
            child.expect("Here is a short answer")
            child.expect("› ")
            assert any("bot.cli worker" in line for line in processes_working_in(workdir))

            corpus.web.latency = 20.0
            child.sendline(f"/research {QUESTION} --site alpha.example")

            cluster.wait_for(cluster.newest_run_is_fetching, 60, "the research run to be fetching")
            child.sendintr()
            child.expect(STOPPED_BY_YOU)
            child.expect("› ")

            corpus.web.latency = 0.0
            # /ask: a plain question here would be a follow-up on the stopped report, which read no page.
            child.sendline("/ask How much energy does a tidal turbine make?")
            child.expect("Here is a short answer")
            child.expect("› ")

            child.sendline("/help")
            child.expect_exact("/export")
            child.expect("› ")
            child.sendline("/history")
            child.expect("cancelled")
            child.expect("› ")
            child.sendline("/export 1 html")
            child.expect("Saved the report of run 1 to ")
            child.expect("› ")
            child.sendline("/frobnicate")
            child.expect_exact("Unknown command /frobnicate")
            child.expect("› ")

            child.sendline("/quit")
            child.expect(pexpect.EOF)
            child.wait()
            assert child.exitstatus == 0
            cluster.wait_for(lambda: not processes_working_in(workdir), 20, "every process `up` started to be gone")
        finally:
            if child.isalive():
                child.terminate(force=True)
            child.logfile_read.close()
            kill_leftovers(workdir)

    with cluster.sessions() as session:
        states = [(run.mode, run.state, run.cancelled_by) for run in session.scalars(select(Run).order_by(Run.id))]
    assert states == [("chat", "done", None), ("research", "cancelled", "cli:local"), ("chat", "done", None)]
    screen = screen_path.read_text(encoding="utf-8")
    assert [word for word in NOT_ON_SCREEN if word in screen] == []
    assert (workdir / "data" / "logs" / "worker.log").stat().st_size > 0
    assert (workdir / "data" / "exports" / "deepthread-report-1.html").read_text().startswith("<!DOCTYPE html>")
