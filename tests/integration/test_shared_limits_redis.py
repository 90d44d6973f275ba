"""Shared limits on a real Redis, held across separate OS processes: rate limits, breakers, the edit budget, cancel flags, locks."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
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
    MICROSECONDS,
    EditBucket,
    RedisCircuitBreaker,
    RedisRateLimiter,
    connect_async,
    redis_lock,
)
from storage.redis import connect
from worker.cancels import CancelWatcher, redis_flags
from tests.waiting import eventually, wait_for
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
# The time every child's limiter reads in the rate scenario: it stands still, so each wait is the slot given.
FROZEN_SECONDS = 1_000.0


# ---------------------------------------------------------------- the child processes' side


async def _wait_for_go(client: redis.asyncio.Redis, prefix: str) -> None:
    """Report ready, then wait until the test lets every child start at once."""
    await client.incr(prefix + "ready")
    await eventually(lambda: client.exists(prefix + "go"), "the test's go", CHILD_TIMEOUT_SECONDS)


async def _child_rate(client: redis.asyncio.Redis, prefix: str, interval: float, calls: int) -> list[float]:
    """The waits this process's limiter asked for (none for a slot that is free at once), on the frozen clock every child shares."""
    waits: list[float] = []

    async def note_wait(seconds: float) -> None:
        waits.append(seconds)

    limiter = RedisRateLimiter(client, {"brave": interval}, prefix=prefix + "rate:", sleep=note_wait,
                               clock=lambda: FROZEN_SECONDS)
    await _wait_for_go(client, prefix)
    for _ in range(calls):
        await limiter.acquire("brave")
    return waits


async def _child_breaker(client: redis.asyncio.Redis, prefix: str, cooldown: float, now: float,
                         operations: str) -> list[Any]:
    breaker = RedisCircuitBreaker(client, failure_threshold=3, cooldown=cooldown, prefix=prefix + "breaker:",
                                  clock=lambda: now)
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


async def server_seconds(client: redis.asyncio.Redis) -> float:
    """The Redis server's clock, the one the edit bucket's script reads."""
    seconds, microseconds = await client.time()
    return seconds + microseconds / MICROSECONDS


class BracketedEditBucket(EditBucket):
    """The shared edit bucket, noting for each token it grants the server's time just before and just after the grant."""

    def __init__(self, client: redis.asyncio.Redis, grants: list[list[float]], **options: Any) -> None:
        super().__init__(client, **options)
        self._client = client
        self._grants = grants

    async def take(self, workspace: str, *, priority: bool = False) -> bool:
        before = await server_seconds(self._client)
        granted = await super().take(workspace, priority=priority)
        if granted:
            self._grants.append([before, await server_seconds(self._client)])
        return granted


async def _child_edits(client: redis.asyncio.Redis, prefix: str, first_run_id: int) -> list[dict[str, Any]]:
    """Per run: the edits sent, in order, and the server-time bracket of each token its editor was granted."""
    runs: list[dict[str, Any]] = [{"run": run_id, "edits": [], "grants": []}
                                  for run_id in range(first_run_id, first_run_id + RUNS_PER_PROCESS)]

    def sender_for(edits: list[dict[str, Any]]) -> Any:
        async def send(progress: RunProgress) -> None:
            edits.append({"step": progress.counts.get("step"), "state": progress.state, "phase": progress.current_phase})
        return send

    # One bucket object per run, all on the one Redis key of the workspace, so each run's grants are its own.
    editors = [StatusEditor(sender_for(run["edits"]), workspace="T1", final_wait=30.0,
                            bucket=BracketedEditBucket(client, run["grants"], capacity=EDIT_CAPACITY,
                                                       per_seconds=EDIT_PER_SECONDS, prefix=prefix + "edits:"))
               for run in runs]
    await _wait_for_go(client, prefix)
    await asyncio.gather(*(_one_run(editor, run["run"]) for editor, run in zip(editors, runs)))
    return runs


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
    return {"by": token.cancelled_by}


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
            return await _child_breaker(client, prefix, float(arguments[0]), float(arguments[1]), arguments[2])
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

    def all_ready() -> bool:
        ready = int(client.get(prefix + "ready") or 0) >= len(children)
        assert ready or all(child.poll() is None for child in children), [child.communicate()[1] for child in children]
        return ready

    wait_for(all_ready, "the children to get ready", CHILD_TIMEOUT_SECONDS)
    client.set(prefix + "go", "1")


@pytest.fixture
def prefix() -> str:
    return f"test-{uuid.uuid4().hex[:8]}:"


@pytest.fixture
def client(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url)


def test_rate_limit_holds_across_two_processes_hammering_one_key(redis_url: str, client: redis.Redis, prefix: str) -> None:
    interval, calls = 0.2, 50
    children = [start_child("rate", redis_url, prefix, interval, calls) for _ in range(2)]
    release_when_ready(client, prefix, children)
    per_process = [result_of(child) for child in children]

    # With time standing still, a wait is the caller's slot: across both processes every slot is given out once,
    # one interval after the other (the first call of all goes at once, without waiting).
    assert sorted(wait for waits in per_process for wait in waits) == pytest.approx(
        [slot * interval for slot in range(1, 2 * calls)])
    assert all(waits == sorted(waits) for waits in per_process)


def test_breaker_opened_in_one_process_is_open_in_another_and_allows_one_probe(redis_url: str, prefix: str) -> None:
    # Every process is handed the moment it acts at, so the cool-down passes without waiting for it.
    cooldown, opened_at = 60.0, 1_000.0
    assert run_child("breaker", redis_url, prefix, cooldown, opened_at, "fail,fail,fail,state") == ["open"]
    assert run_child("breaker", redis_url, prefix, cooldown, opened_at + cooldown - 1, "allow,state") == [False, "open"]

    async def probe_here_after_the_cooldown() -> bool:
        here = connect_async(redis_url)
        try:
            breaker = RedisCircuitBreaker(here, failure_threshold=3, cooldown=cooldown, prefix=prefix + "breaker:",
                                          clock=lambda: opened_at + cooldown)
            return await breaker.allow("brave")
        finally:
            await here.aclose()

    assert asyncio.run(probe_here_after_the_cooldown()) is True
    assert run_child("breaker", redis_url, prefix, cooldown, opened_at + cooldown + 1, "allow") == [False]


def test_ten_runs_in_one_workspace_across_processes_stay_within_the_edit_budget(
    redis_url: str, client: redis.Redis, prefix: str
) -> None:
    children = [start_child("edits", redis_url, prefix, index * RUNS_PER_PROCESS) for index in range(EDIT_PROCESSES)]
    release_when_ready(client, prefix, children)
    runs = [run for child in children for run in result_of(child)]
    grants = [grant for run in runs for grant in run["grants"]]

    # Each grant happened, on the server's clock, within its bracket; so the grants bracketed inside any span
    # [start, end] can be no more than the bucket holds plus what it refills over that span.
    tokens_per_second = EDIT_CAPACITY / EDIT_PER_SECONDS
    for start in {before for before, _ in grants}:
        for end in {after for _, after in grants if after >= start}:
            inside = sum(1 for before, after in grants if start <= before and after <= end)
            assert inside <= EDIT_CAPACITY + tokens_per_second * (end - start) + 1e-6, (start, end, sorted(grants))
    # The budget was binding: ten runs wanted about one edit a second each and got far fewer.
    assert len(grants) < EDIT_PROCESSES * RUNS_PER_PROCESS * (UPDATE_SECONDS + 1)
    assert sorted(run["run"] for run in runs) == list(range(EDIT_PROCESSES * RUNS_PER_PROCESS))
    for run in runs:
        # Every edit went out on a token of its own, the final one included.
        assert len(run["edits"]) == len(run["grants"])
        # A run's editor asks again only its interval (1 s, on its monotonic clock) after its last answer.
        assert all(later[0] - earlier[1] >= 0.99 for earlier, later in zip(run["grants"], run["grants"][1:]))
        assert run["edits"][-1]["state"] == "done" and run["edits"][-1]["step"] == -1
        assert [edit["state"] for edit in run["edits"]].count("done") == 1


def test_cancel_flag_set_in_one_process_is_seen_by_another(
    redis_url: str, client: redis.Redis, prefix: str
) -> None:
    child = start_child("cancel", redis_url, prefix)

    def child_watching() -> bool:
        seen = bool(client.exists(prefix + "watching"))
        assert seen or child.poll() is None, child.communicate()[1]
        return seen

    wait_for(child_watching, "the child to watch the cancel flag", CHILD_TIMEOUT_SECONDS)

    client.set(prefix + "cancel:7", "slack:U1", ex=60)
    assert result_of(child) == {"by": "slack:U1"}


def test_lock_serialises_a_read_modify_write_across_processes(redis_url: str, client: redis.Redis, prefix: str) -> None:
    rounds = 5
    children = [start_child("lock", redis_url, prefix, rounds) for _ in range(2)]
    release_when_ready(client, prefix, children)
    held = sorted(span for child in children for span in result_of(child))

    assert int(client.get(prefix + "counter") or 0) == 2 * rounds
    assert all(later[0] >= earlier[1] for earlier, later in zip(held, held[1:]))


def test_scripts_run_on_the_real_server_on_its_own_clock(redis_url: str, prefix: str) -> None:
    async def exercise() -> tuple[bool, bool, float, float]:
        here = connect_async(redis_url)
        try:
            bucket = EditBucket(here, capacity=1, per_seconds=60.0, reserve_fraction=0.0, prefix=prefix)
            started = await server_seconds(here)
            first, second, wait = await bucket.take("T1"), await bucket.take("T1"), await bucket.wait_time("T1")
            return first, second, wait, await server_seconds(here) - started
        finally:
            await here.aclose()

    first, second, wait, elapsed = asyncio.run(exercise())
    assert (first, second) == (True, False)
    # The token comes back 60 s after it was taken, less what passed (on the server's clock) before the question.
    assert 60 - elapsed <= wait <= 60


def test_more_calls_at_once_than_pooled_connections_wait_for_one_instead_of_failing(redis_url: str, prefix: str) -> None:
    async def burst() -> list[bool]:
        client = connect_async(redis_url, max_connections=2)
        bucket = EditBucket(client, capacity=100, per_seconds=60.0, reserve_fraction=0.0, prefix=prefix + "edits:")
        try:
            return await asyncio.gather(*(bucket.take(f"T{index % 5}") for index in range(40)))
        finally:
            await client.aclose()

    assert asyncio.run(burst()) == [True] * 40


def test_the_synchronous_client_waits_for_a_pooled_connection_instead_of_failing(redis_url: str, prefix: str) -> None:
    # The worker's synchronous client (admission's lock, heartbeats) ran out of redis-py's default pool when a burst
    # of finishing runs each took the admission lock at once: MaxConnectionsError, and those admissions were lost.
    client = connect(redis_url, max_connections=2)
    try:
        held = [client.connection_pool.get_connection(), client.connection_pool.get_connection()]
        answered = threading.Event()
        waiter = threading.Thread(target=lambda: (client.set(prefix + "waited", "1"), answered.set()), daemon=True)
        waiter.start()  # both connections are out: the call can only wait (redis-py's default pool raised here)
        client.connection_pool.release(held.pop())
        assert answered.wait(10), "the waiting call never got the released connection"
        assert client.get(prefix + "waited") == b"1"
        client.connection_pool.release(held.pop())
        waiter.join(5)
    finally:
        client.close()
