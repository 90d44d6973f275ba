"""SQLite write transactions of one process take turns on a lock instead of sleeping in SQLite's busy handler."""

from __future__ import annotations

import sys
import threading

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, insert, select, text

from storage.db import SerialisedWriterConnection, make_engine
from tests.waiting import wait_for

metadata = MetaData()
rows = Table("rows", metadata, Column("id", Integer, primary_key=True), Column("who", String(16)))


@pytest.fixture
def engine(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path}/writers.db", pool_size=8)
    metadata.create_all(engine)
    yield engine
    engine.dispose()


def test_connections_to_a_file_share_one_writer_lock_and_memory_databases_take_none(engine, tmp_path) -> None:
    with engine.connect() as first, make_engine(f"sqlite:///{tmp_path}/writers.db").connect() as second:
        a, b = first.connection.dbapi_connection, second.connection.dbapi_connection
        assert isinstance(a, SerialisedWriterConnection) and a._writer_lock is b._writer_lock is not None
    with make_engine("sqlite://").connect() as memory:
        assert memory.connection.dbapi_connection._writer_lock is None


def waiting_for_the_writer_lock(thread: threading.Thread) -> bool:
    """Whether `thread` is inside the connection's lock-taking step, where it blocks while another writer holds the lock."""
    frame = sys._current_frames().get(thread.ident)
    return frame is not None and frame.f_code.co_name == "_statement"


def test_a_second_writer_waits_for_the_first_to_commit_then_goes_at_once(engine) -> None:
    first_wrote = threading.Event()
    events: list[str] = []

    def slow_writer() -> None:
        with engine.begin() as connection:
            connection.execute(insert(rows).values(who="slow"))
            first_wrote.set()
            # Hold the write transaction until the second writer is waiting for the lock.
            wait_for(lambda: waiting_for_the_writer_lock(threads[1]), "the second writer to wait for the lock", 10,
                     interval=0.001)
            events.append("slow commits")

    def second_writer() -> None:
        assert first_wrote.wait(5)
        with engine.begin() as connection:
            # Without the process's lock this writer would find the database locked and, with no
            # busy timeout, fail at once; with it, it waits its turn.
            connection.execute(text("PRAGMA busy_timeout=0"))
            connection.execute(insert(rows).values(who="second"))
        events.append("second committed")

    threads = [threading.Thread(target=slow_writer), threading.Thread(target=second_writer)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert events == ["slow commits", "second committed"]
    with engine.connect() as connection:
        assert sorted(connection.scalars(select(rows.c.who))) == ["second", "slow"]


@pytest.mark.parametrize("ending", ["rollback", "failed statement", "reads only"])
def test_the_lock_is_free_again_however_the_transaction_ends(engine, ending: str) -> None:
    with engine.connect() as connection:
        dbapi = connection.connection.dbapi_connection
        if ending == "rollback":
            transaction = connection.begin()
            connection.execute(insert(rows).values(who="gone"))
            assert dbapi._holds_writer_lock
            transaction.rollback()
        elif ending == "failed statement":
            with pytest.raises(Exception), connection.begin():
                connection.execute(insert(rows).values(id=1, who="a"))
                connection.execute(insert(rows).values(id=1, who="duplicate"))
        else:
            with connection.begin():
                connection.execute(select(rows)).all()
                connection.execute(text("PRAGMA user_version")).all()
                assert not dbapi._holds_writer_lock
        assert not dbapi._holds_writer_lock
    assert dbapi._writer_lock.acquire(timeout=0.1)
    dbapi._writer_lock.release()
