"""While the tests run on pytest-xdist workers, say which are still running when none has finished for a while.

Under xdist the controller prints a dot per test and no file names, so a run whose slowest files finish last sits at
96-99 % for minutes with no sign of life. pytest-xdist has no option to show what its workers are doing, but it hands
their pytest_runtest_logstart, pytest_runtest_logreport and pytest_runtest_logfinish to the controller's hooks. This
plugin keeps, in the controller, the tests started and not yet finished, and a thread that looks every few seconds:
once no test has finished for TEST_QUIET_SECONDS (60 by default; 0 turns it off) it prints them, with their worker
and how long each has run, and again after each further quiet period:

    No test has finished for 60 s; still running:
      gw0  tests/integration/test_worker.py::test_a_dead_worker_is_replaced (for 75 s)
      gw1  tests/integration/test_slack_e2e.py::test_report_arrives_in_the_thread (for 62 s)

Registered by tests/conftest.py (`register`), or `-p tests.quiet_notice`. In a run without xdist pytest already writes
each file's name before its dots, and a thread could not write past the capture of the test running, so it stays off.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import pytest

QUIET_SECONDS_VARIABLE = "TEST_QUIET_SECONDS"
DEFAULT_QUIET_SECONDS = 60.0


@dataclass
class Running:
    started: float
    worker: str | None = None


class QuietWatch:
    """The tests in flight and when one last finished, on the clock given; `notice` says when it is time to speak."""

    def __init__(self, quiet_seconds: float, clock: Callable[[], float]) -> None:
        self.quiet_seconds = quiet_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._running: dict[str, Running] = {}
        self._last_finish = self._last_notice = clock()  # the start counts as a finish

    def started(self, nodeid: str) -> None:
        with self._lock:
            self._running[nodeid] = Running(started=self._clock())

    def on_worker(self, nodeid: str, worker: str) -> None:
        with self._lock:
            if nodeid in self._running:
                self._running[nodeid].worker = worker

    def finished(self, nodeid: str) -> None:
        with self._lock:
            if self._running.pop(nodeid, None) is not None:
                self._last_finish = self._clock()

    def notice(self) -> str | None:
        """The lines to print when no test has finished for `quiet_seconds` (nor since the last notice) while some
        run, else None."""
        with self._lock:
            now = self._clock()
            if not self._running or now - max(self._last_finish, self._last_notice) < self.quiet_seconds:
                return None
            self._last_notice = now
            lines = [f"No test has finished for {now - self._last_finish:.0f} s; still running:"]
            for nodeid, running in sorted(self._running.items(), key=lambda item: (item[1].worker or "", item[0])):
                worker = f"{running.worker}  " if running.worker else ""
                lines.append(f"  {worker}{nodeid} (for {now - running.started:.0f} s)")
            return "\n".join(lines)


class QuietNotice:
    """The plugin: feeds a QuietWatch from the controller's hooks and prints its notices from a thread."""

    def __init__(self, config: pytest.Config, quiet_seconds: float, clock: Callable[[], float]) -> None:
        self.config = config
        self.watch = QuietWatch(quiet_seconds, clock)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        if not self.config.pluginmanager.has_plugin("dsession"):  # not the controller of an xdist run
            return
        self._thread = threading.Thread(target=self._look, name="quiet-notice", daemon=True)
        self._thread.start()

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self.watch.started(nodeid)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        node = getattr(report, "node", None)  # xdist's worker, on a report a worker sent
        worker = getattr(getattr(node, "gateway", None), "id", None)
        if worker:
            self.watch.on_worker(report.nodeid, worker)
        if report.when == "teardown":
            self.watch.finished(report.nodeid)

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        self.watch.finished(nodeid)

    def pytest_sessionfinish(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _look(self) -> None:
        interval = min(5.0, self.watch.quiet_seconds / 4)
        while not self._stop.wait(interval):
            text = self.watch.notice()
            if text is not None:
                self._write(text)

    def _write(self, text: str) -> None:
        # The controller's main thread only waits on its workers while nothing finishes, so the terminal is free.
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None:
            print(text, file=sys.stderr, flush=True)
            return
        writer = self.config.get_terminal_writer()
        if writer.width_of_current_line:
            writer.line()  # off the line of dots, which the next dot starts afresh
        writer.line(text, yellow=True)
        writer.flush()


def quiet_seconds_from(environ: Mapping[str, str]) -> float:
    """TEST_QUIET_SECONDS, or 60; 0 (or less) turns the notice off."""
    text = environ.get(QUIET_SECONDS_VARIABLE, "").strip()
    if not text:
        return DEFAULT_QUIET_SECONDS
    try:
        return float(text)
    except ValueError:
        raise pytest.UsageError(f"{QUIET_SECONDS_VARIABLE} must be a number of seconds, not {text!r}") from None


def register(config: pytest.Config, clock: Callable[[], float] | None = None) -> None:
    """Watch this run, unless this process is an xdist worker, the notice is off, or it is already registered."""
    import time

    quiet_seconds = quiet_seconds_from(os.environ)
    if hasattr(config, "workerinput") or quiet_seconds <= 0 or config.pluginmanager.has_plugin("quiet-notice"):
        return
    config.pluginmanager.register(QuietNotice(config, quiet_seconds, clock or time.monotonic), "quiet-notice")


def pytest_configure(config: pytest.Config) -> None:
    register(config)
