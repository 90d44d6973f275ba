"""`deepthread up`'s children: their own process group, restarted when they die, stopped whole."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from bot.supervisor import STABLE_AFTER_SECONDS, Child, Supervisor, reap
from tests.waiting import wait_for


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_child_that_dies_is_started_again_with_a_growing_pause(tmp_path: Path) -> None:
    pauses: list[float] = []

    def record_pause(seconds: float) -> bool:
        pauses.append(seconds)
        return False  # not stopped meanwhile

    child = Child("worker", log_path=tmp_path / "worker.log", argv=python("print('started', flush=True)"))
    supervisor = Supervisor([child], check_every=3600, pause=record_pause)  # the test drives the checks itself
    child.start()
    child.process.wait()
    assert supervisor.restart_if_dead(child)
    child.process.wait()
    assert supervisor.restart_if_dead(child)
    assert child.restarts == 2 and pauses == [1.0, 2.0] and child.pause == 4.0
    child.process.wait()
    assert (tmp_path / "worker.log").read_text().count("started") == 3, "every run appends to the same log"
    supervisor.stop()


def test_a_child_that_ran_a_long_time_before_dying_restarts_after_the_first_pause_again() -> None:
    pauses: list[float] = []
    child = Child("worker", argv=python("pass"), pause=8.0)
    supervisor = Supervisor([child], check_every=3600, clock=lambda: child.started_at + STABLE_AFTER_SECONDS,
                            pause=lambda seconds: bool(pauses.append(seconds)))
    child.start()
    child.process.wait()
    assert supervisor.restart_if_dead(child)
    assert pauses == [child.first_pause]
    supervisor.stop()


def test_a_stop_during_the_restart_pause_starts_nothing() -> None:
    child = Child("worker", argv=python("pass"))
    supervisor = Supervisor([child], check_every=3600, pause=lambda seconds: True)
    child.start()
    child.process.wait()
    assert not supervisor.restart_if_dead(child) and child.restarts == 0


def test_a_child_that_keeps_running_is_left_alone() -> None:
    child = Child("worker", argv=python("import time; time.sleep(30)"))
    supervisor = Supervisor([child], check_every=3600)
    child.start()
    assert not supervisor.restart_if_dead(child) and child.restarts == 0
    supervisor.stop()
    assert child.process.returncode is not None


def test_stop_ends_the_child_s_whole_process_group(tmp_path: Path) -> None:
    grandchild = tmp_path / "grandchild.pid"
    code = ("import subprocess, sys, time; "
            f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            f"open({str(grandchild)!r}, 'w').write(str(p.pid)); time.sleep(60)")
    child = Child("worker", argv=python(code))
    supervisor = Supervisor([child], check_every=3600).start()
    wait_for(lambda: grandchild.exists() and grandchild.read_text(), "the grandchild's pid", 10.0, interval=0.02)
    pid = int(grandchild.read_text())
    supervisor.stop()
    wait_for(lambda: not alive(pid) or _is_zombie(pid), "the grandchild to end", 10.0, interval=0.02)


def test_a_child_does_not_get_the_terminal_s_ctrl_c() -> None:
    child = Child("worker", argv=python("import time; time.sleep(60)"))
    child.start()
    try:
        assert os.getpgid(child.process.pid) != os.getpgid(0), "its own process group"
        assert child.alive
    finally:
        child.stop()


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] == "Z"
    except FileNotFoundError:
        return True


def test_sigterm_is_what_asks_a_child_to_stop(tmp_path: Path) -> None:
    marker = tmp_path / "stopped"
    code = ("import signal, sys, time\n"
            "def stop(*_):\n"
            f"    open({str(marker)!r}, 'w').write('clean'); sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, stop)\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n")
    child = Child("worker", log_path=tmp_path / "log", argv=python(code))
    child.start()
    wait_for(lambda: "ready" in (tmp_path / "log").read_text(), "the child to be ready", 10.0, interval=0.02)
    child.stop()
    assert marker.read_text() == "clean" and child.process.returncode == 0


def test_a_stop_that_comes_as_the_restart_pause_ends_starts_nothing() -> None:
    child = Child("worker", argv=python("pass"))
    # The stop comes in as the pause runs out (the pause says it was not cut short).
    supervisor = Supervisor([child], check_every=3600, pause=lambda seconds: bool(supervisor.stop()))

    child.start()
    child.process.wait()
    assert not supervisor.restart_if_dead(child) and child.restarts == 0


def test_stop_asks_every_child_at_once_then_waits_for_them(tmp_path: Path) -> None:
    # Each child, asked to stop, waits to see the other asked too before it exits cleanly: one at a time, the first
    # would wait in vain and fail.
    def waits_for(other: str, mine: str) -> list[str]:
        return python("import os, signal, sys, time\n"
                      "def stop(*_):\n"
                      f"    open({str(tmp_path / mine)!r}, 'w').close()\n"
                      "    for _ in range(300):\n"
                      f"        if os.path.exists({str(tmp_path / other)!r}):\n"
                      "            sys.exit(0)\n"
                      "        time.sleep(0.01)\n"
                      "    sys.exit(1)\n"
                      "signal.signal(signal.SIGTERM, stop)\n"
                      "print('ready', flush=True)\n"
                      "time.sleep(60)\n")

    first = Child("worker", log_path=tmp_path / "first.log", argv=waits_for("second-asked", "first-asked"))
    second = Child("slack", log_path=tmp_path / "second.log", argv=waits_for("first-asked", "second-asked"))
    supervisor = Supervisor([first, second], check_every=3600).start()
    for log in ("first.log", "second.log"):
        wait_for(lambda log=log: "ready" in (tmp_path / log).read_text(), "the children to be ready", 10.0)
    supervisor.stop()
    assert (first.process.returncode, second.process.returncode) == (0, 0)


def test_the_reaper_waits_for_a_group_that_stops_and_kills_one_that_will_not() -> None:
    stops = subprocess.Popen(python("import time; time.sleep(60)"), start_new_session=True)
    stubborn = subprocess.Popen(python("import signal, time\n"
                                       "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                                       "print('ready', flush=True)\n"
                                       "time.sleep(60)\n"), stdout=subprocess.PIPE, start_new_session=True)
    assert stubborn.stdout is not None and stubborn.stdout.readline() == b"ready\n"
    for process in (stops, stubborn):
        os.killpg(process.pid, signal.SIGTERM)
    # Their parent (this test) collects them as soon as they exit, as init would once `up` has gone.
    collector = threading.Thread(target=lambda: [process.wait() for process in (stops, stubborn)], daemon=True)
    collector.start()

    killed = reap([stops.pid, stubborn.pid], grace=1.0)
    assert killed == [stubborn.pid]
    collector.join(timeout=10)
    assert stops.returncode == -signal.SIGTERM and stubborn.returncode == -signal.SIGKILL


def test_stop_in_background_returns_before_the_child_has_stopped_and_the_reaper_finishes_the_job(
        tmp_path: Path) -> None:
    child = Child("worker", log_path=tmp_path / "worker.log", argv=python(
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"))
    supervisor = Supervisor([child], check_every=3600).start()
    wait_for(lambda: "ready" in (tmp_path / "worker.log").read_text(), "the child to be ready", 10.0)

    reaper = supervisor.stop_in_background(log_path=tmp_path / "worker.log", grace=1.0)
    assert reaper is not None and child.alive, "stop_in_background waited for the child"
    assert reaper.wait(timeout=30) == 0
    assert child.process.wait(timeout=10) == -signal.SIGKILL
    assert "did not stop within 1 s of SIGTERM: killed" in (tmp_path / "worker.log").read_text()
