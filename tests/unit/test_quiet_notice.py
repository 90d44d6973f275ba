"""The test run says which tests are still running when none has finished for a while (tests/quiet_notice.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.quiet_notice import QuietWatch

ROOT = Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_notice_comes_after_a_quiet_minute_naming_each_test_still_running() -> None:
    clock = Clock()
    watch = QuietWatch(60, clock)
    watch.started("tests/integration/test_a.py::test_slow")
    watch.started("tests/unit/test_b.py::test_quick")
    watch.on_worker("tests/integration/test_a.py::test_slow", "gw1")
    watch.on_worker("tests/unit/test_b.py::test_quick", "gw0")
    clock.now += 30
    watch.finished("tests/unit/test_b.py::test_quick")
    watch.started("tests/unit/test_b.py::test_stuck")  # its worker not known yet: setup has not reported

    clock.now += 59.9
    assert watch.notice() is None  # a test finished 59.9 s ago
    clock.now += 0.1
    assert watch.notice() == "\n".join([
        "No test has finished for 60 s; still running:",
        "  tests/unit/test_b.py::test_stuck (for 60 s)",
        "  gw1  tests/integration/test_a.py::test_slow (for 90 s)",
    ])
    assert watch.notice() is None  # once per quiet period, not at every look

    clock.now += 60
    again = watch.notice()
    assert again is not None and again.startswith("No test has finished for 120 s; still running:")


def test_a_finished_test_restarts_the_quiet_period_and_nothing_running_says_nothing() -> None:
    clock = Clock()
    watch = QuietWatch(60, clock)
    watch.started("t.py::a")
    clock.now += 50
    watch.started("t.py::b")
    watch.finished("t.py::a")
    clock.now += 50
    assert watch.notice() is None
    clock.now += 10
    assert watch.notice() == "No test has finished for 60 s; still running:\n  t.py::b (for 60 s)"
    watch.finished("t.py::b")
    clock.now += 600
    assert watch.notice() is None  # waiting on no test (workers starting, collecting) is not this notice's business


def test_an_xdist_run_prints_the_test_still_running_on_its_worker(tmp_path: Path) -> None:
    """A real run on two workers: one test waits, held until the notice has named it (no guessed sleep)."""
    release = tmp_path / "release"
    (tmp_path / "test_slow.py").write_text(textwrap.dedent(f"""
        import pathlib
        import time

        def test_waits():
            deadline = time.monotonic() + 60
            while not pathlib.Path({str(release)!r}).exists():
                assert time.monotonic() < deadline, "the notice never came"
                time.sleep(0.05)

        def test_quick():
            pass
    """))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TEST_QUIET_SECONDS": "1"}
    run = subprocess.Popen([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadfile", "-p", "tests.quiet_notice",
                            "-p", "no:cacheprovider", "-q", "test_slow.py"],
                           cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert run.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + 90
    try:
        for line in run.stdout:
            seen.append(line)
            if re.fullmatch(r"  gw\d  test_slow\.py::test_waits \(for \d+ s\)\n", line):
                release.touch()
                break
            assert time.monotonic() < deadline, "".join(seen)
        else:
            raise AssertionError("the run ended with no notice:\n" + "".join(seen))
        rest, _ = run.communicate(timeout=60)
    finally:
        release.touch()
        if run.poll() is None:
            run.kill()
    assert any(line.startswith("No test has finished for ") for line in seen), "".join(seen)
    assert "2 passed" in rest
