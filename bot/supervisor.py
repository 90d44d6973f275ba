"""`deepthread up`'s children: each `deepthread` subcommand in its own process group, restarted when it dies.

Its own process group keeps a terminal's Ctrl-C (meant for the chat's run) away from the worker; a child that
dies (a crash, the OOM killer) is started again with a growing pause, and on exit every child's group is asked
to stop (SIGTERM) and, if it has not within STOP_GRACE_SECONDS, killed.

Stopping takes one of two shapes. Under a service manager (`stop`), `up` waits for its children, so it exits only
once they have. Leaving the terminal chat (`stop_in_background`), it signals them and exits at once, so the shell's
prompt comes back: a reaper (`python -m bot.supervisor`), in a session of its own and writing only to a log file,
kills what is still running after the grace and then stops the embedded Redis a killed child could not let go of.
The children and the reaper then belong to init, which collects them when they exit: no zombie, no orphan, and
nothing printed over the prompt.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

logger = logging.getLogger(__name__)

FIRST_RESTART_PAUSE_SECONDS = 1.0
LONGEST_RESTART_PAUSE_SECONDS = 30.0
# A child that ran this long before dying is not in a crash loop: its next restart pauses briefly again.
STABLE_AFTER_SECONDS = 60.0
# A child still running this long after SIGTERM is killed: every child is gone within 10 s of a stop.
STOP_GRACE_SECONDS = 8.0
# After SIGKILL: how long a group may take to empty before the reaper (or `stop`) gives up waiting for it.
KILL_WAIT_SECONDS = 5.0
REAP_POLL_SECONDS = 0.05


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
        self.ask_to_stop()
        self.wait_stopped(grace)

    def wait_stopped(self, grace: float) -> None:
        """Wait up to `grace` seconds for the child to exit, then kill its process group and wait for it."""
        process = self.process
        if process is None:
            return
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            _signal_group(process, signal.SIGKILL)
            process.wait(timeout=KILL_WAIT_SECONDS)

    def ask_to_stop(self) -> int | None:
        """Send SIGTERM to the child's process group without waiting; its group id when it was running."""
        process = self.process
        self.close_log()  # the child writes to its own copy of the file
        if process is None or process.poll() is not None:
            return None
        _signal_group(process, signal.SIGTERM)
        return process.pid

    def close_log(self) -> None:
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
        # Held from a restart's check to its start, so that no child is started after `stop` has signalled the rest.
        self._starting = threading.Lock()
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
        with self._starting:
            if self._stopping.is_set():
                return False
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

    def stop(self, grace: float = STOP_GRACE_SECONDS) -> None:
        """Ask every child to stop at once, then wait until each has exited (killed after `grace` seconds)."""
        with self._starting:
            self._stopping.set()
        stopping = [child for child in self.children if child.process is not None and child.alive]
        for child in stopping:
            child.ask_to_stop()
        deadline = time.monotonic() + grace
        for child in stopping:
            child.wait_stopped(max(0.0, deadline - time.monotonic()))
        for child in self.children:
            child.close_log()

    def stop_in_background(self, *, data_dir: str | None = None, log_path: Path | None = None,
                           grace: float = STOP_GRACE_SECONDS) -> subprocess.Popen[bytes] | None:
        """Ask every child to stop (SIGTERM) and return at once, leaving a detached reaper to kill any still running
        after `grace` seconds and, with `data_dir` (the embedded Redis's), to stop that Redis if a killed child held it
        last. The reaper writes to `log_path` (appended), never to the terminal; None when no child was running."""
        with self._starting:
            self._stopping.set()
        groups = [group for child in self.children if (group := child.ask_to_stop()) is not None]
        if not groups:
            return None
        argv = [sys.executable, "-m", "bot.supervisor", "--grace", str(grace)]
        if data_dir is not None:
            argv += ["--data-dir", data_dir]
        argv += [str(group) for group in groups]
        log: IO[bytes] | int = subprocess.DEVNULL
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log = open(log_path, "ab")  # noqa: SIM115  (the reaper's copy outlives ours, closed below)
        try:
            return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        finally:
            if not isinstance(log, int):
                log.close()


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def interrupt_on_stop_signals() -> None:
    """Make SIGTERM and SIGHUP raise KeyboardInterrupt in the main thread, as Ctrl-C does, so that a service manager's
    stop or a closed terminal ends `up` through its clean-up."""
    def interrupt(_signal: int, _frame: object) -> None:
        raise KeyboardInterrupt

    for sent in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sent, interrupt)


def ignore_stop_signals() -> None:
    """Ignore SIGINT, SIGTERM and SIGHUP from now on: a stop under way, bounded by its grace, is not cut short (the
    reaper, which inherits this, puts the defaults back)."""
    for sent in STOP_SIGNALS:
        signal.signal(sent, signal.SIG_IGN)


def _group_exists(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap(groups: Sequence[int], *, grace: float = STOP_GRACE_SECONDS, data_dir: str | None = None,
         clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> list[int]:
    """Wait until each process group of `groups` is empty, killing (SIGKILL) the groups still there `grace` seconds
    from now; then, with `data_dir`, stop the embedded Redis there if no live process holds it (whichever of the last
    holder and this comes later stops it). Returns the groups it killed; gives up KILL_WAIT_SECONDS after the kill."""
    deadline = clock() + grace
    killed: list[int] = []
    while remaining := [group for group in groups if _group_exists(group)]:
        now = clock()
        if now >= deadline + KILL_WAIT_SECONDS:
            logger.warning("gave up waiting for process groups %s", remaining)
            break
        if now >= deadline:
            for group in remaining:
                if group not in killed:
                    logger.warning("process group %d did not stop within %.0f s of SIGTERM: killed", group, grace)
                    try:
                        os.killpg(group, signal.SIGKILL)
                    except ProcessLookupError:  # it emptied meanwhile
                        pass
                    killed.append(group)
        sleep(REAP_POLL_SECONDS)
    if data_dir is not None:
        from storage.redis import stop_embedded_if_unheld

        stop_embedded_if_unheld(data_dir)
    return killed


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m bot.supervisor`: the reaper `stop_in_background` starts."""
    parser = argparse.ArgumentParser(prog="python -m bot.supervisor",
                                     description="Stop what `deepthread up` left stopping, after it has exited.")
    parser.add_argument("groups", nargs="*", type=int, help="process groups already sent SIGTERM")
    parser.add_argument("--grace", type=float, default=STOP_GRACE_SECONDS, help="seconds before SIGKILL")
    parser.add_argument("--data-dir", help="the embedded Redis's DATA_DIR, to stop it if no one holds it")
    arguments = parser.parse_args(argv)
    for sent in STOP_SIGNALS:  # ignored by `up` while it stopped, and inherited
        signal.signal(sent, signal.SIG_DFL)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    killed = reap(arguments.groups, grace=arguments.grace, data_dir=arguments.data_dir)
    logger.info("deepthread up's children have stopped%s", f" ({len(killed)} killed)" if killed else "")


if __name__ == "__main__":
    main()
