"""A worker's database pool: sized by its runs, never past WORKER_DATABASE_CONNECTIONS, and a burst waits its turn."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy import text

from config import load_settings
from storage.db import make_session_factory
from worker.service import worker_engine


def test_a_worker_with_many_runs_opens_no_more_connections_than_its_cap(tmp_path) -> None:
    settings = load_settings(database_url=f"sqlite:///{tmp_path}/deepthread.db", worker_concurrency="500",
                             worker_database_connections="3")
    engine = worker_engine(settings)
    sessions = make_session_factory(engine)
    held_at_once: list[int] = []
    three_held = threading.Event()  # then the first ones let go, and the rest take their turns
    burst = 12
    all_in = threading.Barrier(burst)

    def one_statement(_: int) -> int:
        all_in.wait()
        with sessions() as session:
            value = session.execute(text("SELECT 1")).scalar_one()  # a connection is held from here to the end
            held = engine.pool.checkedout()  # type: ignore[attr-defined]
            held_at_once.append(held)
            if held >= 3:
                three_held.set()
            assert three_held.wait(timeout=30), "a hang guard, not a timing bound"
            return value

    try:
        with ThreadPoolExecutor(max_workers=burst) as pool:
            answers = list(pool.map(one_statement, range(burst)))
        assert answers == [1] * burst  # every one of the burst was answered: waiting, not failing
        assert max(held_at_once) <= 3
        assert engine.pool.size() + engine.pool._max_overflow <= 3  # type: ignore[attr-defined]
    finally:
        engine.dispose()


def test_a_worker_opens_one_connection_a_run_below_the_cap(tmp_path) -> None:
    settings = load_settings(database_url=f"sqlite:///{tmp_path}/deepthread.db", worker_concurrency="8")
    engine = worker_engine(settings)
    try:
        assert engine.pool.size() == 8 + 4  # a run each, and the runs' other blocking calls
    finally:
        engine.dispose()
