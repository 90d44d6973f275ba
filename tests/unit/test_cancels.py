"""The worker's one cancel watcher: flags read for every run at once, tokens cancelled in their own loops."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

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


# Only a hang guard: every wait below ends on an event long before it on any machine.
HANG_GUARD_SECONDS = 20.0


class RunInItsOwnLoop:
    """What a worker thread does: its own event loop, its token watched while the run executes, until cancelled or ended."""

    def __init__(self, watcher: CancelWatcher, run_id: int, *, on_finish: Callable[[], None] = lambda: None) -> None:
        self.cancelled_by: str | None = None
        self.watching = threading.Event()
        self._watcher = watcher
        self._run_id = run_id
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ended: asyncio.Event | None = None
        self._on_finish = on_finish
        self._thread = threading.Thread(target=lambda: asyncio.run(self._execute()), daemon=True)
        self._thread.start()

    async def _execute(self) -> None:
        self._loop, self._ended = asyncio.get_running_loop(), asyncio.Event()
        with self._watcher.watching(self._run_id, CancelToken()) as token:
            self.watching.set()
            waits = [asyncio.create_task(token.wait()), asyncio.create_task(self._ended.wait())]
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for wait in waits:
                wait.cancel()
            self.cancelled_by = token.cancelled_by
        self._on_finish()

    def end(self) -> None:
        """Let the run finish, after every callback its loop was already handed (a cancel included)."""
        assert self._loop is not None and self._ended is not None
        try:
            self._loop.call_soon_threadsafe(self._ended.set)
        except RuntimeError:  # its loop has closed: the run already finished
            pass

    def finished(self) -> bool:
        self._thread.join(HANG_GUARD_SECONDS)
        return not self._thread.is_alive()


def test_each_flagged_run_is_cancelled_in_its_own_loop_and_only_it() -> None:
    client = fakeredis.FakeRedis()
    reads: list[list[int]] = []
    cancel_arrived = threading.Event()
    # The poll that delivered the cancel is over (a later poll started), or a run it had to spare ended.
    settled = threading.Event()

    def flags(run_ids: list[int]) -> dict[int, str]:
        if cancel_arrived.is_set():
            settled.set()
        reads.append(run_ids)
        return redis_flags(client)(run_ids)

    watcher = CancelWatcher(flags, rows=lambda run_ids: {}, interval=0.01)
    runs = {run_id: RunInItsOwnLoop(watcher, run_id, on_finish=settled.set if run_id != 2 else lambda: None)
            for run_id in (1, 2, 3)}
    assert all(run.watching.wait(HANG_GUARD_SECONDS) for run in runs.values())
    client.set(CANCEL_FLAG.format(run_id=2), "slack:U2")
    assert runs[2].finished()
    cancel_arrived.set()
    assert settled.wait(HANG_GUARD_SECONDS)
    for run_id in (1, 3):
        runs[run_id].end()
    assert runs[1].finished() and runs[3].finished()
    watcher.stop()
    assert {run_id: run.cancelled_by for run_id, run in runs.items()} == {1: None, 2: "slack:U2", 3: None}
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
