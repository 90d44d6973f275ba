"""Every deepthread process stops cleanly on SIGTERM and SIGINT, as a service manager or Docker stops it: exit 0, a
line in its log saying so, and the last one using the embedded Redis stops it, so no redis-server is left behind."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from bot.supervisor import Child, Supervisor
from tests.fakes.discord_api import FakeDiscord
from tests.fakes.server import free_port
from tests.fakes.slack_api import FakeSlack
from tests.integration.process_tree import Commands, base_environment, embedded_redis_pid, gone, redis_servers_in
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

LEFT_RUNNING = "left the embedded Redis running for 1 other deepthread processes"
STOPPED_REDIS = "stopped the embedded Redis: no other deepthread process uses it"


@pytest.fixture
def commands(tmp_path: Path) -> Iterator[Commands]:
    workdir = tmp_path.resolve()
    with FakeSlack() as slack, FakeDiscord() as discord_api:
        environment = base_environment(workdir, slack_bot_token=slack.token, slack_api_url=slack.api_url,
                                       slack_signing_secret="test-secret", discord_bot_token=discord_api.token,
                                       discord_api_url=discord_api.api_url)
        started = Commands(workdir, environment)
        try:
            yield started
        finally:
            started.kill_leftovers()


def start_bot(commands: Commands, bot: str) -> None:
    """`deepthread slack` (HTTP mode) or `deepthread discord`, once it serves."""
    if bot == "slack":
        port = free_port()
        commands.start("slack", "slack", "--port", str(port))
        wait_for(lambda: _answers(f"http://127.0.0.1:{port}/healthz") or commands.started["slack"].poll() is not None,
                 "the Slack app to serve", 90, interval=0.05)
        assert commands.started["slack"].poll() is None, commands.log("slack")
    else:
        commands.start("discord", "discord")
        commands.wait_for_log("discord", "discord bot connected as")


def _answers(url: str) -> bool:
    try:
        httpx.get(url, timeout=1.0)
    except httpx.HTTPError:
        return False
    return True


@pytest.mark.parametrize("sent", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("bot", ["slack", "discord"])
def test_the_worker_then_the_bot_stop_cleanly_on_a_signal_and_the_last_stops_the_embedded_redis(
        commands: Commands, bot: str, sent: signal.Signals) -> None:
    commands.start("worker", "worker", "--concurrency=1")
    commands.wait_for_log("worker", " ready.")
    redis_pid = embedded_redis_pid(commands.workdir / "data")
    start_bot(commands, bot)

    assert commands.stop("worker", sent) == 0, commands.log("worker")
    assert LEFT_RUNNING in commands.log("worker")
    assert not gone(redis_pid), "the bot still uses the embedded Redis"

    assert commands.stop(bot, sent) == 0, commands.log(bot)
    log = commands.log(bot)
    assert f"{bot} bot stopping ({sent.name})" in log and f"{bot} bot stopped" in log
    assert STOPPED_REDIS in log
    wait_for(lambda: gone(redis_pid), "the embedded Redis to exit", 30)
    assert redis_servers_in(commands.workdir / "data") == []


def test_a_worker_stopped_while_it_starts_still_stops_the_embedded_redis(commands: Commands) -> None:
    commands.start("worker", "worker", "--concurrency=1")
    redis_pid = embedded_redis_pid(commands.workdir / "data")

    # Celery may not handle SIGTERM yet: deepthread's own handling until then exits 143 through the clean-up.
    assert commands.stop("worker", signal.SIGTERM) in (0, 143), commands.log("worker")
    wait_for(lambda: gone(redis_pid), "the embedded Redis to exit", 30)
    assert redis_servers_in(commands.workdir / "data") == []


def test_the_terminal_chat_stops_cleanly_on_sigterm_while_it_waits_for_a_line_and_stops_the_embedded_redis(
        commands: Commands) -> None:
    # Its input is a pipe that stays open and silent: the line being read when the signal comes never arrives.
    chat = commands.start("chat", "chat", stdin=subprocess.PIPE)
    commands.wait_for_log("chat", "› ")
    redis_pid = embedded_redis_pid(commands.workdir / "data")

    assert commands.stop("chat", signal.SIGTERM) == 0, commands.log("chat")
    assert "Fatal Python error" not in commands.log("chat") and "Traceback" not in commands.log("chat")
    wait_for(lambda: gone(redis_pid), "the embedded Redis to exit", 30)
    assert redis_servers_in(commands.workdir / "data") == []
    assert chat.stdin is not None
    chat.stdin.close()


def test_up_without_a_terminal_stops_its_worker_before_it_exits_on_sigterm_and_leaves_nothing_running(
        commands: Commands) -> None:
    # No platform configured: `up` runs the worker alone.
    commands.environment = {name: value for name, value in commands.environment.items()
                            if not name.startswith(("SLACK_", "DISCORD_BOT_TOKEN"))}
    up = commands.start("up", "up")
    commands.wait_for_log("up", " ready.")  # the worker's output, under `up` without a terminal
    redis_pid = embedded_redis_pid(commands.workdir / "data")
    worker = wait_for(lambda: [child for child in _children(up.pid) if "worker" in " ".join(child.cmdline())],
                      "up's worker", 30)[0]

    assert commands.stop("up", signal.SIGTERM) == 0, commands.log("up")
    # Under a service manager `up` exits only once its children have.
    assert gone(worker.pid)
    assert "Stopping worker, beat…" in commands.log("up")
    wait_for(lambda: gone(redis_pid), "the embedded Redis to exit", 30)
    assert redis_servers_in(commands.workdir / "data") == []


def _children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def test_a_worker_killed_after_the_grace_leaves_no_embedded_redis_behind(tmp_path: Path) -> None:
    """Killed, a child cannot let go of the embedded Redis: the reaper of `up`'s background stop stops it then."""
    data_dir = tmp_path.resolve() / "data"
    stubborn = Child("worker", log_path=tmp_path / "worker.log", argv=[sys.executable, "-c", (
        "import signal, time\n"
        "from storage.redis import resolve_redis_url\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"resolve_redis_url('', {str(data_dir)!r})\n"
        "print('holding the embedded Redis', flush=True)\n"
        "time.sleep(120)\n")])
    supervisor = Supervisor([stubborn], check_every=3600).start()
    try:
        wait_for(lambda: "holding" in (tmp_path / "worker.log").read_text(), "the worker to hold the Redis", 60)
        redis_pid = embedded_redis_pid(data_dir)

        reaper = supervisor.stop_in_background(data_dir=str(data_dir), log_path=tmp_path / "worker.log", grace=1.0)
        assert reaper is not None
        # This test is the worker's parent, so it collects it, as init does once `up` has exited.
        assert stubborn.process is not None and stubborn.process.wait(timeout=30) == -signal.SIGKILL
        assert reaper.wait(timeout=60) == 0
        wait_for(lambda: gone(redis_pid), "the embedded Redis to exit", 30)
        assert redis_servers_in(data_dir) == []
    finally:
        supervisor.stop(grace=0)
        for server in redis_servers_in(data_dir):
            server.kill()
