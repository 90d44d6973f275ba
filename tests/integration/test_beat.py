"""`deepthread beat` puts a watch tick on the workers' queue every WATCH_TICK_SECONDS, each expiring a tick later; it
writes no file, runs beside a second beat and stops cleanly on SIGTERM; `deepthread up` supervises one."""

from __future__ import annotations

import datetime as dt
import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from bot.cli import up_children
from config import load_settings
from tests.integration.process_tree import Commands, base_environment
from tests.waiting import wait_for
from worker.beat import WATCH_TICK_TASK
from worker.queue import QUEUE_NAME

TICK_SECONDS = 0.5
# A database of the session's Redis that no other test uses: what is on its queue, the beats of this test sent.
BEAT_DATABASE = 9


@pytest.fixture
def broker_url(redis_url: str) -> Iterator[str]:
    url = f"{redis_url.rsplit('/', 1)[0]}/{BEAT_DATABASE}"
    client = redis.Redis.from_url(url)
    client.flushdb()
    try:
        yield url
    finally:
        client.flushdb()
        client.close()


def queued_messages(client: redis.Redis) -> list[dict[str, Any]]:
    """The task messages waiting on the workers' queue (Celery's Redis transport keeps them as JSON in a list)."""
    return [json.loads(message) for message in client.lrange(QUEUE_NAME, 0, -1)]


def sender_pid(message: dict[str, Any]) -> int:
    """The pid of the process that sent `message` (Celery names it gen<pid>@<host>)."""
    return int(message["headers"]["origin"].split("@")[0].removeprefix("gen"))


@pytest.mark.integration
def test_two_beats_side_by_side_queue_watch_ticks_that_expire_a_tick_later_and_write_no_file(
        tmp_path: Path, broker_url: str) -> None:
    workdir = tmp_path.resolve()
    environment = base_environment(workdir, redis_url=broker_url, watch_tick_seconds=str(TICK_SECONDS))
    commands = Commands(workdir, environment)
    client = redis.Redis.from_url(broker_url)
    try:
        first = commands.start("first", "beat")
        second = commands.start("second", "beat")

        def ticks_of_both() -> list[dict[str, Any]]:
            messages = queued_messages(client)
            senders = {sender_pid(message) for message in messages}
            both_twice = all(sum(sender_pid(message) == pid for message in messages) >= 2
                             for pid in (first.pid, second.pid))
            return messages if both_twice and senders == {first.pid, second.pid} else []

        messages = wait_for(ticks_of_both, "two ticks from each beat", interval=0.05)
        read_at = dt.datetime.now(dt.timezone.utc)

        assert {message["headers"]["task"] for message in messages} == {WATCH_TICK_TASK}
        assert all(message["properties"]["delivery_info"]["routing_key"] == QUEUE_NAME for message in messages)
        # Sent before they were read, each expires at most a tick after it was read.
        expiries = [dt.datetime.fromisoformat(message["headers"]["expires"]) for message in messages]
        assert all(expires <= read_at + dt.timedelta(seconds=TICK_SECONDS) for expires in expiries), expiries

        assert commands.stop("first", signal.SIGTERM) == 0, commands.log("first")
        assert commands.stop("second", signal.SIGTERM) == 0, commands.log("second")
        for name in ("first", "second"):
            log = commands.log(name)
            assert "ERROR" not in log and "Traceback" not in log, log
        # No schedule file, no pid file: neither in the working directory nor in DATA_DIR.
        assert sorted(path.name for path in workdir.iterdir()) == ["first.log", "second.log"]
    finally:
        commands.kill_leftovers()
        client.close()


def test_up_supervises_a_beat_beside_the_worker_and_the_adapters(tmp_path: Path) -> None:
    settings = load_settings(data_dir=str(tmp_path))

    children = up_children(settings, ["slack", "discord"], interactive=False)
    assert [child.command for child in children] == ["worker", "beat", "slack", "discord"]
    beat = children[1]
    assert beat.argv is None and beat.log_path is None, "the real `deepthread beat`, writing where `up` writes"

    with_the_chat = up_children(settings, [], interactive=True, worker_argv=["true"])
    assert {child.command: child.log_path for child in with_the_chat} == {
        "worker": tmp_path / "logs" / "worker.log", "beat": tmp_path / "logs" / "beat.log"}
    assert with_the_chat[1].argv is None, "a stand-in worker (tests) leaves the beat real"
