"""Redis stopped and started again on the same port (empty, as after a crash) under a real worker, and clients facing a silent server."""

from __future__ import annotations

import asyncio
import socket
import threading
from pathlib import Path

import pytest
import redis
import redis.asyncio

from storage.redis import broker_transport_options, connect
from storage.shared_limits import connect_async
from tests.fakes.corpus import QUESTION, Corpus
from tests.fakes.slack_api import FakeSlack
from tests.integration.restartable_redis import RestartableRedis
from tests.integration.workers import Cluster

pytestmark = pytest.mark.integration

ENDED = {"done", "failed", "cancelled", "timed_out"}


def slow_corpus() -> Corpus:
    """Fakes slow enough that a research run is still working while Redis is away."""
    return Corpus(llm_latency=1.0, search_latency=1.0, page_latency=1.0)


def outage_cluster(tmp_path: Path, redis_url: str, corpus: Corpus, slack: FakeSlack) -> Cluster:
    # A short lease makes the reaper (and its admission pass) come round every second.
    return Cluster(database_url=f"sqlite:///{tmp_path}/deepthread.db", redis_url=redis_url, corpus=corpus,
                   slack=slack, workdir=tmp_path, worker_lease_seconds="3", max_runs_per_user="2")


def wait_until_running(cluster: Cluster, run_id: int) -> None:
    cluster.wait_for(lambda: cluster.run(run_id).state == "running", 30, f"run {run_id} to start")


def test_a_worker_survives_the_broker_going_away_mid_run_and_starts_a_run_asked_for_meanwhile(
        tmp_path: Path, outage_redis: RestartableRedis, slack: FakeSlack) -> None:
    with slow_corpus() as corpus:
        cluster = outage_cluster(tmp_path, outage_redis.url, corpus, slack)
        try:
            worker = cluster.start_worker("w1")
            in_flight, _ = cluster.start_run(QUESTION, user="U0ALICE1")
            wait_until_running(cluster, in_flight)
            outage_redis.stop()
            # Asked for while Redis is away: stored and queued with its position, no error for the requester.
            during_outage, position = cluster.start_run(QUESTION + " (during the outage)", user="U0BOB001")
            assert position == 1
            assert cluster.run(during_outage).state == "queued"
            cluster.wait_for(lambda: "Connection to broker lost" in cluster.log("w1"), 20, "the worker to lose the broker")
            outage_redis.start()
            assert cluster.wait_for_state(in_flight, ENDED, timeout=60).state == "done"
            assert cluster.wait_for_state(during_outage, ENDED, timeout=60).state == "done"
            assert worker.poll() is None, cluster.log("w1")[-3000:]
            assert "Unrecoverable error" not in cluster.log("w1")
        finally:
            cluster.stop()


def test_a_cancel_asked_for_while_redis_is_away_is_recorded_and_stops_the_run(
        tmp_path: Path, outage_redis: RestartableRedis, slack: FakeSlack) -> None:
    with slow_corpus() as corpus:
        cluster = outage_cluster(tmp_path, outage_redis.url, corpus, slack)
        try:
            cluster.start_worker("w1")
            run_id, _ = cluster.start_run(QUESTION, user="U0ALICE1")
            wait_until_running(cluster, run_id)
            outage_redis.stop()
            assert cluster.queue().cancel(run_id, "slack:U0ALICE1") == "running"
            assert cluster.run(run_id).cancelled_by == "slack:U0ALICE1"
            outage_redis.start()  # empty: the flag was never written, the row is what the worker reads
            run = cluster.wait_for_state(run_id, ENDED, timeout=60)
            assert (run.state, run.cancelled_by) == ("cancelled", "slack:U0ALICE1")
        finally:
            cluster.stop()


class SilentServer:
    """Accepts connections on loopback and never answers: a hung Redis."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self._listener.getsockname()[1]}/0"
        self._accepted: list[socket.socket] = []
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                self._accepted.append(self._listener.accept()[0])
            except OSError:
                return

    def __enter__(self) -> SilentServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self._closed.set()
        self._listener.close()
        for connection in self._accepted:
            connection.close()


def test_a_client_of_a_server_that_never_answers_gives_up_with_a_timeout() -> None:
    with SilentServer() as server:
        with pytest.raises(redis.TimeoutError):
            connect(server.url, socket_timeout=0.2).get("deepthread:anything")


def test_an_asyncio_client_of_a_server_that_never_answers_gives_up_with_a_timeout() -> None:
    async def ask() -> None:
        client = connect_async(server.url, socket_timeout=0.2)
        try:
            await client.get("deepthread:anything")
        finally:
            await client.aclose()

    with SilentServer() as server:
        with pytest.raises(redis.TimeoutError):
            asyncio.run(ask())


def test_every_redis_client_and_the_broker_are_built_with_socket_timeouts() -> None:
    from worker.tasks import app

    sync_options = connect("redis://127.0.0.1:1/0").connection_pool.connection_kwargs
    async_options = connect_async("redis://127.0.0.1:1/0").connection_pool.connection_kwargs
    for options in (sync_options, async_options, broker_transport_options(), app.conf.broker_transport_options):
        assert options["socket_timeout"] and options["socket_connect_timeout"], options
