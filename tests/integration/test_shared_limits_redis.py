"""Shared limits on a real Redis, held across separate OS processes: rate limits, breakers, the edit budget, cancel flags, locks."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio

from chat.state import RunProgress, apply_event, initial_progress
from research.budget import CancelToken
from research.events import PhaseStarted, Progress
from storage.shared_limits import (
    EditBucket,
    RedisCircuitBreaker,
    RedisRateLimiter,
    connect_async,
    redis_lock,
)
from worker.cancels import CancelWatcher, redis_flags
from worker.progress import StatusEditor

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CHILD_TIMEOUT_SECONDS = 60

# Edit-budget scenario: 10 runs (5 in each of 2 processes) in one workspace.
EDIT_CAPACITY = 10
EDIT_PER_SECONDS = 5.0
EDIT_PROCESSES = 2
RUNS_PER_PROCESS = 5
UPDATE_SECONDS = 3.0


# ---------------------------------------------------------------- the child processes' side


async def _wait_for_go(client: redis.asyncio.Redis, prefix: str) -> None:
    """Report ready, then wait until the test lets every child start at once."""
    await client.incr(prefix + "ready")
    while not await client.exists(prefix + "go"):
        await asyncio.sleep(0.005)


async def _child_rate(client: redis.asyncio.Redis, prefix: str, interval: float, calls: int) -> list[float]:
    limiter = RedisRateLimiter(client, {"brave": interval}, prefix=prefix + "rate:")
    await _wait_for_go(client, prefix)
    acquired: list[float] = []
    for _ in range(calls):
        await limiter.acquire("brave")
        acquired.append(time.time())
    return acquired


async def _child_breaker(client: redis.asyncio.Redis, prefix: str, cooldown: float, operations: str) -> list[Any]:
    breaker = RedisCircuitBreaker(client, failure_threshold=3, cooldown=cooldown, prefix=prefix + "breaker:")
    results: list[Any] = []
    for operation in operations.split(","):
        if operation == "fail":
            await breaker.record_failure("brave")
        elif operation == "allow":
            results.append(await breaker.allow("brave"))
        elif operation == "state":
            results.append(await breaker.state("brave"))
    return results


def _run_progress(run_id: int) -> RunProgress:
    progress = initial_progress(run_id=run_id, mode="research", question="q", requested_by="slack:U1")
    return apply_event(progress, PhaseStarted(seq=1, phase="decompose"))


async def _one_run(editor: StatusEditor, run_id: int) -> None:
    progress = _run_progress(run_id)
    phases = iter(["search", "fetch", "read", "synthesize"])
    started = time.monotonic()
    step = 0
    while time.monotonic() - started < UPDATE_SECONDS:
        step += 1
        progress = apply_event(progress, Progress(seq=progress.last_seq + 1, phase="search", counts={"step": step}))
        if step % 15 == 0:
            progress = apply_event(progress, PhaseStarted(seq=progress.last_seq + 1, phase=next(phases, "verify")))
        await editor.update(progress)
        await asyncio.sleep(0.05)
    await editor.close(progress.model_copy(update={"state": "done", "counts": {"step": -1}}))


async def _child_edits(client: redis.asyncio.Redis, prefix: str, first_run_id: int) -> list[dict[str, Any]]:
    bucket = EditBucket(client, capacity=EDIT_CAPACITY, per_seconds=EDIT_PER_SECONDS, prefix=prefix + "edits:")
    edits: list[dict[str, Any]] = []

    def sender_for(run_id: int) -> Any:
        async def send(progress: RunProgress) -> None:
            edits.append({"at": time.time(), "run": run_id, "step": progress.counts.get("step"),
                          "state": progress.state, "phase": progress.current_phase})
        return send

    run_ids = range(first_run_id, first_run_id + RUNS_PER_PROCESS)
    editors = [StatusEditor(sender_for(run_id), bucket=bucket, workspace="T1", final_wait=30.0) for run_id in run_ids]
    await _wait_for_go(client, prefix)
    await asyncio.gather(*(_one_run(editor, run_id) for editor, run_id in zip(editors, run_ids)))
    return edits


async def _child_cancel(client: redis.asyncio.Redis, redis_url: str, prefix: str) -> dict[str, Any]:
    """A worker's cancel watcher in this process, watching run 7, as the worker does."""
    watcher = CancelWatcher(redis_flags(redis.Redis.from_url(redis_url), key=prefix + "cancel:{run_id}"),
                            rows=lambda run_ids: {})
    try:
        with watcher.watching(7, CancelToken()) as token:
            await client.set(prefix + "watching", "1")
            await asyncio.wait_for(token.wait(), timeout=30)
    finally:
        watcher.stop()
    return {"seen_at": time.time(), "by": token.cancelled_by}


async def _child_lock(client: redis.asyncio.Redis, prefix: str, rounds: int) -> list[list[float]]:
    await _wait_for_go(client, prefix)
    held: list[list[float]] = []
    for _ in range(rounds):
        async with redis_lock(client, prefix + "admission", timeout=10, blocking_timeout=20):
            entered = time.time()
            # A read-modify-write that loses updates unless the lock serialises it.
            count = int(await client.get(prefix + "counter") or 0)
            await asyncio.sleep(0.02)
            await client.set(prefix + "counter", count + 1)
            held.append([entered, time.time()])
    return held


async def _child(role: str, redis_url: str, prefix: str, arguments: list[str]) -> Any:
    client = connect_async(redis_url)
    try:
        if role == "rate":
            return await _child_rate(client, prefix, float(arguments[0]), int(arguments[1]))
        if role == "breaker":
            return await _child_breaker(client, prefix, float(arguments[0]), arguments[1])
        if role == "edits":
            return await _child_edits(client, prefix, int(arguments[0]))
        if role == "cancel":
            return await _child_cancel(client, redis_url, prefix)
        if role == "lock":
            return await _child_lock(client, prefix, int(arguments[0]))
        raise ValueError(f"unknown role {role}")
    finally:
        await client.aclose()


def child_main() -> None:
    """Entry point of a child process: `role redis_url prefix arguments…`; prints its findings as JSON."""
    role, redis_url, prefix, *arguments = sys.argv[1:]
    print(json.dumps(asyncio.run(_child(role, redis_url, prefix, arguments))))


# ---------------------------------------------------------------- the test's side


def start_child(role: str, redis_url: str, prefix: str, *arguments: object) -> subprocess.Popen[str]:
    code = "from tests.integration.test_shared_limits_redis import child_main; child_main()"
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", code, role, redis_url, prefix, *map(str, arguments)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment)


def result_of(child: subprocess.Popen[str]) -> Any:
    stdout, stderr = child.communicate(timeout=CHILD_TIMEOUT_SECONDS)
    assert child.returncode == 0, stderr
    return json.loads(stdout.strip().splitlines()[-1])


def run_child(role: str, redis_url: str, prefix: str, *arguments: object) -> Any:
    return result_of(start_child(role, redis_url, prefix, *arguments))


def release_when_ready(client: redis.Redis, prefix: str, children: list[subprocess.Popen[str]]) -> None:
    """Wait until every child is ready, then let them all start together."""
    deadline = time.monotonic() + CHILD_TIMEOUT_SECONDS
    while int(client.get(prefix + "ready") or 0) < len(children):
        assert all(child.poll() is None for child in children), [child.communicate()[1] for child in children]
        assert time.monotonic() < deadline, "children did not get ready"
        time.sleep(0.01)
    client.set(prefix + "go", "1")


@pytest.fixture
def prefix() -> str:
    return f"test-{uuid.uuid4().hex[:8]}:"


@pytest.fixture
def client(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url)


def test_rate_limit_holds_across_two_processes_hammering_one_key(redis_url: str, client: redis.Redis, prefix: str) -> None:
    interval, calls = 0.2, 6
    children = [start_child("rate", redis_url, prefix, interval, calls) for _ in range(2)]
    release_when_ready(client, prefix, children)
    per_process = [result_of(child) for child in children]

    acquired = sorted(moment for moments in per_process for moment in moments)
    spacing = [later - earlier for earlier, later in zip(acquired, acquired[1:])]
    assert len(acquired) == 2 * calls
    # Slots are exactly one interval apart; a little slack covers a process waking late from its sleep.
    assert min(spacing) >= interval - 0.03, spacing
    assert acquired[-1] - acquired[0] >= (2 * calls - 1) * interval - 0.03
    # The processes really competed: their slots interleave rather than one running after the other.
    first_process = set(per_process[0])
    owners = [moment in first_process for moment in acquired]
    assert sum(1 for before, after in zip(owners, owners[1:]) if before != after) >= 2


def test_breaker_opened_in_one_process_is_open_in_another_and_allows_one_probe(redis_url: str, prefix: str) -> None:
    # Long enough for a second child process to start (imports and all) on a loaded machine within it.
    cooldown = 3.0
    assert run_child("breaker", redis_url, prefix, cooldown, "fail,fail,fail,state") == ["open"]
    assert run_child("breaker", redis_url, prefix, cooldown, "allow") == [False]

    async def probe_here_after_the_cooldown() -> bool:
        here = connect_async(redis_url)
        try:
            breaker = RedisCircuitBreaker(here, failure_threshold=3, cooldown=cooldown, prefix=prefix + "breaker:")
            await asyncio.sleep(cooldown + 0.05)
            return await breaker.allow("brave")
        finally:
            await here.aclose()

    assert asyncio.run(probe_here_after_the_cooldown()) is True
    assert run_child("breaker", redis_url, prefix, cooldown, "allow") == [False]


def test_ten_runs_in_one_workspace_across_processes_stay_within_the_edit_budget(
    redis_url: str, client: redis.Redis, prefix: str
) -> None:
    children = [start_child("edits", redis_url, prefix, index * RUNS_PER_PROCESS) for index in range(EDIT_PROCESSES)]
    release_when_ready(client, prefix, children)
    edits = [edit for child in children for edit in result_of(child)]

    moments = sorted(edit["at"] for edit in edits)
    tokens_per_second = EDIT_CAPACITY / EDIT_PER_SECONDS
    # Sends follow their token by a few milliseconds at most; 50 ms of slack at either end covers it.
    for first in range(len(moments)):
        for last in range(first, len(moments)):
            allowed = EDIT_CAPACITY + tokens_per_second * (moments[last] - moments[first] + 0.1)
            assert last - first + 1 <= allowed, (first, last, moments)
    # The budget was binding: ten runs wanted about one edit a second each and got far fewer.
    assert len(edits) < EDIT_PROCESSES * RUNS_PER_PROCESS * (UPDATE_SECONDS + 1)
    for run_id in range(EDIT_PROCESSES * RUNS_PER_PROCESS):
        of_run = sorted((edit for edit in edits if edit["run"] == run_id), key=lambda edit: edit["at"])
        assert all(later["at"] - earlier["at"] >= 0.9 for earlier, later in zip(of_run, of_run[1:]))
        assert of_run[-1]["state"] == "done" and of_run[-1]["step"] == -1
        assert [edit["state"] for edit in of_run].count("done") == 1


def test_cancel_flag_set_in_one_process_is_seen_by_another_within_a_second(
    redis_url: str, client: redis.Redis, prefix: str
) -> None:
    child = start_child("cancel", redis_url, prefix)
    deadline = time.monotonic() + CHILD_TIMEOUT_SECONDS
    while not client.exists(prefix + "watching"):
        assert child.poll() is None, child.communicate()[1]
        assert time.monotonic() < deadline
        time.sleep(0.01)

    set_at = time.time()
    client.set(prefix + "cancel:7", "slack:U1", ex=60)
    seen = result_of(child)
    assert seen["by"] == "slack:U1"
    assert seen["seen_at"] - set_at < 1.0


def test_lock_serialises_a_read_modify_write_across_processes(redis_url: str, client: redis.Redis, prefix: str) -> None:
    rounds = 5
    children = [start_child("lock", redis_url, prefix, rounds) for _ in range(2)]
    release_when_ready(client, prefix, children)
    held = sorted(span for child in children for span in result_of(child))

    assert int(client.get(prefix + "counter") or 0) == 2 * rounds
    assert all(later[0] >= earlier[1] for earlier, later in zip(held, held[1:]))


def test_scripts_run_on_the_real_server(redis_url: str, prefix: str) -> None:
    async def exercise() -> tuple[bool, bool, float]:
        here = connect_async(redis_url)
        try:
            bucket = EditBucket(here, capacity=1, per_seconds=60.0, reserve_fraction=0.0, prefix=prefix)
            return await bucket.take("T1"), await bucket.take("T1"), await bucket.wait_time("T1")
        finally:
            await here.aclose()

    first, second, wait = asyncio.run(exercise())
    assert (first, second) == (True, False)
    assert 55 < wait <= 60


def test_more_calls_at_once_than_pooled_connections_wait_for_one_instead_of_failing(redis_url: str, prefix: str) -> None:
    async def burst() -> list[bool]:
        client = connect_async(redis_url, max_connections=2)
        bucket = EditBucket(client, capacity=100, per_seconds=60.0, reserve_fraction=0.0, prefix=prefix + "edits:")
        try:
            return await asyncio.gather(*(bucket.take(f"T{index % 5}") for index in range(40)))
        finally:
            await client.aclose()

    assert asyncio.run(burst()) == [True] * 40
