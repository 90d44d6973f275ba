"""Every pool is bounded and waits (issue 23, item 4): a call that finds every connection busy waits for one and says
so in a line at INFO; a wait that runs out says so at ERROR and fails with the pool's own error, never hangs."""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path

import fakeredis
import pytest
import redis
from sqlalchemy import text
from sqlalchemy.exc import TimeoutError as PoolTimeout

from storage.db import make_engine
from storage.pools import PoolWaits, WaitSayingQueuePool
from storage.redis import WaitSayingRedisPool
from storage.shared_limits import WaitSayingAsyncRedisPool

HOLD_SECONDS = 0.3  # how long the only connection is held while another caller asks for it


def pool_lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == "storage.pools" and record.levelno == level]


def test_a_caller_finding_the_database_pool_full_waits_for_a_connection_and_says_so(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="storage.pools")
    engine = make_engine(f"sqlite:///{tmp_path}/pool.db", pool_size=1, max_overflow=0, pool_timeout=10)
    assert isinstance(engine.pool, WaitSayingQueuePool)
    held = engine.connect()
    asking = threading.Event()
    answers: list[int] = []

    def ask() -> None:
        asking.set()
        with engine.connect() as connection:
            answers.append(connection.execute(text("SELECT 1")).scalar_one())

    caller = threading.Thread(target=ask)
    caller.start()
    asking.wait(5)
    threading.Event().wait(HOLD_SECONDS)  # the connection stays busy this long: the wait to be measured
    held.close()
    caller.join(10)

    assert answers == [1]
    [line] = pool_lines(caplog, logging.INFO)
    assert line.startswith("all 1 connections of the database pool were busy: 1 call(s) waited for one, the longest")
    assert float(line.rsplit(" ", 2)[-2]) >= HOLD_SECONDS * 0.9


def test_a_wait_for_the_database_pool_that_runs_out_fails_and_says_so(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="storage.pools")
    engine = make_engine(f"sqlite:///{tmp_path}/pool.db", pool_size=1, max_overflow=0, pool_timeout=0.2)
    with engine.connect(), pytest.raises(PoolTimeout):
        engine.connect()
    [line] = pool_lines(caplog, logging.ERROR)
    assert line == "all 1 connections of the database pool stayed busy for 0 s: a call gave up waiting for one"


def test_a_free_connection_is_taken_without_a_word(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="storage.pools")
    engine = make_engine(f"sqlite:///{tmp_path}/pool.db", pool_size=2, max_overflow=0)
    for _ in range(5):
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    assert pool_lines(caplog, logging.INFO) == []


def test_the_redis_pool_waits_for_a_busy_connection_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="storage.pools")
    pool = WaitSayingRedisPool(connection_class=fakeredis.FakeRedisConnection, server=fakeredis.FakeServer(),
                               max_connections=1, timeout=10)
    client = redis.Redis.from_pool(pool)
    held = pool.get_connection()
    asking = threading.Event()
    answers: list[object] = []

    def ask() -> None:
        asking.set()
        answers.append(client.ping())

    caller = threading.Thread(target=ask)
    caller.start()
    asking.wait(5)
    threading.Event().wait(HOLD_SECONDS)
    pool.release(held)
    caller.join(10)

    assert answers == [True]
    [line] = pool_lines(caplog, logging.INFO)
    assert line.startswith("all 1 connections of the Redis pool were busy: 1 call(s) waited for one")


def test_a_wait_for_the_redis_pool_that_runs_out_fails_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="storage.pools")
    pool = WaitSayingRedisPool(connection_class=fakeredis.FakeRedisConnection, server=fakeredis.FakeServer(),
                               max_connections=1, timeout=0.2)
    held = pool.get_connection()
    with pytest.raises(redis.ConnectionError, match="No connection available"):
        redis.Redis.from_pool(pool).ping()
    pool.release(held)
    assert pool_lines(caplog, logging.ERROR) == [
        "all 1 connections of the Redis pool stayed busy for 0 s: a call gave up waiting for one"]


async def test_the_asyncio_redis_pool_waits_for_a_busy_connection_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="storage.pools")
    pool = WaitSayingAsyncRedisPool(connection_class=fakeredis.FakeAsyncRedisConnection, server=fakeredis.FakeServer(),
                                    max_connections=1, timeout=10)
    client = redis.asyncio.Redis.from_pool(pool)
    held = await pool.get_connection()
    asked = asyncio.ensure_future(client.ping())
    await asyncio.sleep(HOLD_SECONDS)  # the connection stays busy this long: the wait to be measured
    await pool.release(held)
    assert await asked is True
    [line] = pool_lines(caplog, logging.INFO)
    assert line.startswith("all 1 connections of the Redis pool were busy: 1 call(s) waited for one")
    await client.aclose()


def test_waits_are_said_at_most_once_in_a_while_with_how_many_there_were(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="storage.pools")
    now = [100.0]
    waits = PoolWaits("database", clock=lambda: now[0])
    waits.waited(0.5, 4)
    waits.waited(0.7, 4)
    waits.waited(0.2, 4)
    now[0] += 31
    waits.waited(0.1, 4)
    assert pool_lines(caplog, logging.INFO) == [
        "all 4 connections of the database pool were busy: 1 call(s) waited for one, the longest 0.50 s",
        "all 4 connections of the database pool were busy: 3 call(s) waited for one, the longest 0.70 s",
    ]
