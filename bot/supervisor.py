"""`deepthread up`'s children: each `deepthread` subcommand in its own process group, restarted when it dies.

Its own process group keeps a terminal's Ctrl-C (meant for the chat's run) away from the worker; a child that
dies (a crash, the OOM killer) is started again with a growing pause, and on exit every child's group is asked
to stop and, if it will not, killed.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

logger = logging.getLogger(__name__)

FIRST_RESTART_PAUSE_SECONDS = 1.0
LONGEST_RESTART_PAUSE_SECONDS = 30.0
# A child that ran this long before dying is not in a crash loop: its next restart pauses briefly again.
STABLE_AFTER_SECONDS = 60.0
STOP_GRACE_SECONDS = 15.0


@dataclass
class Child:
    """One `deepthread <command>` child; its output goes to `log_path` (appended) or, without one, to ours."""

    command: str
    log_path: Path | None = None
    argv: list[str] | None = None  # what to run instead of `deepthread <command>` (tests)
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    started_at: float = 0.0
    pause: float = FIRST_RESTART_PAUSE_SECONDS
    first_pause: float = FIRST_RESTART_PAUSE_SECONDS
    _log: IO[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        if self.log_path is not None and self._log is None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(self.log_path, "ab")  # noqa: SIM115  (kept open for the child's life)
        self.process = subprocess.Popen(
            self.argv or [sys.executable, "-m", "bot.cli", self.command], stdin=subprocess.DEVNULL, stdout=self._log,
            stderr=subprocess.STDOUT if self._log is not None else None, start_new_session=True)
        self.started_at = time.monotonic()

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, grace: float = STOP_GRACE_SECONDS) -> None:
        """Ask the child's process group to stop (SIGTERM), then kill it if it has not within `grace` seconds."""
        process = self.process
        if process is not None and process.poll() is None:
            _signal_group(process, signal.SIGTERM)
            try:
                process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                _signal_group(process, signal.SIGKILL)
                process.wait(timeout=5)
        if self._log is not None:
            self._log.close()
            self._log = None


def _signal_group(process: subprocess.Popen[bytes], sent: signal.Signals) -> None:
    try:
        os.killpg(process.pid, sent)
    except ProcessLookupError:
        pass


class Supervisor:
    """Starts the children, restarts any that dies (a growing pause between restarts), and stops them all."""

    def __init__(self, children: list[Child], *, check_every: float = 1.0, clock: Callable[[], float] = time.monotonic,
                 on_restart: Callable[[Child, int | None], None] | None = None,
                 pause: Callable[[float], bool] | None = None) -> None:
        self.children = children
        self.check_every = check_every
        self.clock = clock
        self.on_restart = on_restart
        self._stopping = threading.Event()
        # Waits out a restart pause; True when `stop()` came first.
        self._pause = pause or self._stopping.wait
        self._thread: threading.Thread | None = None

    def start(self) -> "Supervisor":
        for child in self.children:
            child.start()
        self._thread = threading.Thread(target=self._watch, name="deepthread-supervisor", daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._stopping.wait(self.check_every):
            for child in self.children:
                self.restart_if_dead(child)

    def restart_if_dead(self, child: Child) -> bool:
        """Start `child` again if it died and its pause is over; True when it was restarted."""
        if child.process is None or child.alive or self._stopping.is_set():
            return False
        died_after = self.clock() - child.started_at
        if died_after >= STABLE_AFTER_SECONDS:
            child.pause = child.first_pause
        if self._pause(child.pause):
            return False
        code = child.process.returncode
        logger.warning("deepthread %s exited (code %s); starting it again", child.command, code)
        child.pause = min(LONGEST_RESTART_PAUSE_SECONDS, child.pause * 2)
        child.restarts += 1
        child.start()
        if self.on_restart is not None:
            self.on_restart(child, code)
        return True

    def wait(self) -> None:
        """Block until `stop()` (a signal or KeyboardInterrupt ends the wait in the main thread)."""
        while not self._stopping.wait(1.0):
            pass

    def stop(self) -> None:
        self._stopping.set()
        for child in self.children:
            child.stop()
