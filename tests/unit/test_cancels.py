"""The worker's one cancel watcher: flags read for every run at once, tokens cancelled in their own loops."""

from __future__ import annotations

import asyncio
import threading

import fakeredis
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from research.budget import CancelToken
from sqlalchemy.orm import Session, sessionmaker

from storage.models import Conversation, Run
from worker.cancels import CancelWatcher, redis_flags, row_flags
from storage.shared_limits import CANCEL_FLAG, read_cancel_flags, set_cancel_flag
from worker.queue import Limits, Queue


def run_in_own_loop(watcher: CancelWatcher, run_id: int, seen: dict[int, str | None], ready: threading.Event) -> None:
    """What a worker thread does: its own event loop, its token watched while the run executes."""

    async def execute() -> None:
        with watcher.watching(run_id, CancelToken()) as token:
            ready.set()
            try:
                await asyncio.wait_for(token.wait(), timeout=1.0)
            except TimeoutError:
                pass
            seen[run_id] = token.cancelled_by

    asyncio.run(execute())


def test_each_flagged_run_is_cancelled_in_its_own_loop_and_only_it() -> None:
    client = fakeredis.FakeRedis()
    reads: list[list[int]] = []

    def flags(run_ids: list[int]) -> dict[int, str]:
        reads.append(run_ids)
        return redis_flags(client)(run_ids)

    watcher = CancelWatcher(flags, rows=lambda run_ids: {}, interval=0.02)
    seen: dict[int, str | None] = {}
    readies = {run_id: threading.Event() for run_id in (1, 2, 3)}
    threads = [threading.Thread(target=run_in_own_loop, args=(watcher, run_id, seen, readies[run_id]))
               for run_id in readies]
    for thread in threads:
        thread.start()
    for ready in readies.values():
        assert ready.wait(2.0)
    client.set(CANCEL_FLAG.format(run_id=2), "slack:U2")
    for thread in threads:
        thread.join(5.0)
    watcher.stop()
    assert seen == {1: None, 2: "slack:U2", 3: None}
    # One read covers every run being executed, not one read per run.
    assert [1, 2, 3] in reads


def test_the_run_rows_are_read_when_redis_cannot_be(session_factory: sessionmaker[Session]) -> None:
    sessions = session_factory
    with sessions.begin() as session:
        runs = []
        for n in range(2):
            conversation = Conversation(platform="slack", workspace="T1", channel="C1", thread=f"{n}.0", created_by="slack:U0")
            session.add(conversation)
            session.flush()
            runs.append(Run(conversation_id=conversation.id, mode="research", question="q", state="running",
                            requested_by=f"slack:U{n}", workspace="T1"))
        session.add_all(runs)
    broken = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    # The bot flags the run in Redis (here another, working, Redis) and on its row.
    queue = Queue(sessions, fakeredis.FakeRedis(), Limits(3, 10), send_task=lambda *args: None)
    assert queue.cancel(runs[0].id, "slack:U0") == "running"
    watcher = CancelWatcher(redis_flags(broken), row_flags(sessions))

    async def watch_both() -> tuple[CancelToken, CancelToken]:
        first, second = CancelToken(), CancelToken()
        with watcher.watching(runs[0].id, first), watcher.watching(runs[1].id, second):
            watcher.poll()
            await asyncio.sleep(0)  # the cancel arrives through the loop, as from the watcher's thread
        return first, second

    first, second = asyncio.run(watch_both())
    watcher.stop()
    assert (first.cancelled_by, second.cancelled) == ("slack:U0", False)


def test_a_token_outside_its_block_is_not_cancelled() -> None:
    client = fakeredis.FakeRedis()
    watcher = CancelWatcher(redis_flags(client), rows=lambda run_ids: {}, interval=60)

    async def watch_then_leave() -> CancelToken:
        with watcher.watching(9, CancelToken()) as token:
            pass
        client.set(CANCEL_FLAG.format(run_id=9), "slack:U9")
        watcher.poll()
        await asyncio.sleep(0)
        return token

    token = asyncio.run(watch_then_leave())
    watcher.stop()
    assert not token.cancelled


@pytest.mark.parametrize("broken_too", [False, True])
def test_unreadable_flags_never_stop_the_watcher(broken_too: bool) -> None:
    def failing(run_ids: list[int]) -> dict[int, str]:
        raise redis.ConnectionError("down")

    answers = iter([{}])
    fallback = failing if broken_too else (lambda run_ids: next(answers, {5: "slack:U5"}))
    watcher = CancelWatcher(failing, fallback)

    async def poll_twice() -> CancelToken:
        with watcher.watching(5, CancelToken()) as token:
            watcher.poll()
            watcher.poll()
            await asyncio.sleep(0)
        return token

    token = asyncio.run(poll_twice())
    watcher.stop()
    assert token.cancelled_by == (None if broken_too else "slack:U5")


def test_a_cancel_flag_is_read_back_for_its_run_only_and_lives_for_a_day() -> None:
    client = fakeredis.FakeRedis()
    set_cancel_flag(client, 7, "slack:U1")
    assert read_cancel_flags(client, [6, 7, 8]) == {7: "slack:U1"}
    assert read_cancel_flags(client, []) == {}
    assert 24 * 3600 - 5 <= client.ttl(CANCEL_FLAG.format(run_id=7)) <= 24 * 3600


def test_a_cancel_only_on_the_run_row_is_noticed_while_redis_answers_without_its_flag() -> None:
    # Redis came back empty after an outage during which the bot could write only the row.
    client = fakeredis.FakeRedis()
    watcher = CancelWatcher(redis_flags(client), rows=lambda run_ids: {4: "slack:U4"}, interval=60, rows_every=2)

    async def poll_twice() -> tuple[bool, CancelToken]:
        with watcher.watching(4, CancelToken()) as token:
            watcher.poll()
            await asyncio.sleep(0)
            after_first = token.cancelled
            watcher.poll()
            await asyncio.sleep(0)
        return after_first, token

    after_first, token = asyncio.run(poll_twice())
    watcher.stop()
    assert after_first is False  # the rows are read every other poll here, the flags at every one
    assert token.cancelled_by == "slack:U4"
