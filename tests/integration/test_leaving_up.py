"""Leaving `deepthread up`'s terminal chat gives the shell its prompt back at once, saying the worker is stopping; the
worker stops in the background, and once it has, nothing `up` started is left: no child, no reaper, no embedded Redis,
no zombie, and nothing still holding the terminal to write over the prompt."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from pathlib import Path

import pexpect
import psutil
import pytest

from tests.integration.process_tree import (Commands, base_environment, embedded_redis_pid, gone, holds,
                                            processes_working_in, redis_servers_in, running, terminal_of)
from tests.integration.terminal_chat import SCREEN
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

SLOW_SECONDS = 5
# A worker that holds the embedded Redis as the real one does and, asked to stop, takes SLOW_SECONDS to.
SLOW_WORKER = f"""
import os, signal, sys, time
from storage.redis import resolve_redis_url

def stop(*_):
    print("asked to stop (SIGTERM): stopping in {SLOW_SECONDS} s", flush=True)
    time.sleep({SLOW_SECONDS})
    print("stopped", flush=True)
    sys.exit(0)

signal.signal(signal.SIGTERM, stop)
resolve_redis_url("", os.environ["DATA_DIR"])
print("worker holding the embedded Redis", flush=True)
while True:
    time.sleep(1)
"""


def quit_command(chat: pexpect.spawn) -> None:
    chat.sendline("/quit")


def ctrl_c(chat: pexpect.spawn) -> None:
    chat.sendintr()


def sigterm(chat: pexpect.spawn) -> None:
    chat.kill(signal.SIGTERM)


@pytest.mark.parametrize("leave", [quit_command, ctrl_c, sigterm], ids=["/quit", "Ctrl-C", "SIGTERM"])
def test_leaving_gives_the_prompt_back_before_a_slow_worker_has_stopped_and_leaves_nothing_running_once_it_has(
        tmp_path: Path, leave: Callable[[pexpect.spawn], None]) -> None:
    workdir = tmp_path.resolve()
    environment = {**base_environment(workdir), **SCREEN}
    worker_log = workdir / "data" / "logs" / "worker.log"
    chat = pexpect.spawn(sys.executable, ["-m", "tests.integration.up_with_worker", sys.executable, "-c", SLOW_WORKER],
                         env=environment, cwd=str(workdir), encoding="utf-8", codec_errors="replace", timeout=90,
                         dimensions=(50, 160))
    chat.logfile_read = open(workdir / "screen.log", "w", encoding="utf-8")
    try:
        chat.expect_exact("/help")
        chat.expect("› ")
        wait_for(lambda: worker_log.exists() and "holding" in worker_log.read_text(), "the worker to start", 60)
        worker = next(child for child in psutil.Process(chat.pid).children() if "-c" in child.cmdline())
        redis_pid = embedded_redis_pid(workdir / "data")
        terminal = terminal_of(chat.pid)

        leave(chat)
        chat.expect_exact("Stopping the worker…")
        chat.expect(pexpect.EOF)
        chat.wait()
        # The shell has its prompt back: `up` has exited, cleanly, while the worker is still stopping.
        assert chat.exitstatus == 0
        assert running(worker.pid), "the prompt came back only after the worker had stopped"
        left = processes_working_in(workdir)
        assert worker.pid in [process.pid for process in left]
        assert [process.pid for process in left if holds(process, terminal)] == [], "still holding the terminal"

        # The worker and the reaper (and anything else `up` left) exit and are collected: none stays, not as a zombie.
        wait_for(lambda: all(gone(process.pid) for process in left), "every process up left to be gone", 20)
        assert "asked to stop (SIGTERM)" in worker_log.read_text()
        assert processes_working_in(workdir) == []
        wait_for(lambda: gone(redis_pid), "the embedded Redis to exit", 20)
        assert redis_servers_in(workdir / "data") == []
    finally:
        if chat.isalive():
            chat.terminate(force=True)
        chat.logfile_read.close()
        Commands(workdir, environment).kill_leftovers()
