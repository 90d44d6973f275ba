"""A real worker process's `/healthz` and `/metrics`, and the Slack app's `/healthz`, against a real Redis.

`/healthz` answers from a report refreshed every few seconds in the background, so a change shows within a refresh."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from bot.slack.bundle import outbound as slack_outbound
from bot.slack.server import build_http_app
from chat.message import Content, Place
from chat.slack.messenger import SlackMessenger
from config import load_settings
from ops.health import process_health
from storage.migrate import upgrade
from storage.redis import connect
from storage.shared_limits import beat
from tests.fakes.corpus import QUESTION, Corpus
from tests.fakes.discord_api import FakeDiscord
from tests.fakes.server import free_port
from tests.fakes.slack_api import FakeSlack
from tests.integration.discord_harness import BotThread, discord_urls_nowhere
from tests.integration.restartable_redis import RestartableRedis
from tests.integration.workers import Cluster
from tests.waiting import wait_for

pytestmark = pytest.mark.integration


def healthz(port: int) -> tuple[int, dict[str, Any]] | None:
    """The worker's `/healthz` answer, or None while nothing listens yet."""
    try:
        response = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
    except httpx.TransportError:
        return None
    return response.status_code, response.json()


def runs_counted(port: int) -> dict[tuple[str, str], float]:
    """`deepthread_runs_total` of the worker's `/metrics`, by (mode, state), as prometheus_client's parser reads it."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return {(sample.labels["mode"], sample.labels["state"]): sample.value
            for family in text_string_to_metric_families(text) if family.name == "deepthread_runs"
            for sample in family.samples if sample.name == "deepthread_runs_total"}


def test_healthz_names_redis_while_a_real_redis_is_stopped_and_is_ok_again_after_it_restarts(
        tmp_path: Path, outage_redis: RestartableRedis) -> None:
    port = free_port()
    database_url = f"sqlite:///{tmp_path}/deepthread.db"
    with Corpus() as corpus:
        cluster = Cluster(database_url=database_url, redis_url=outage_redis.url, corpus=corpus, workdir=tmp_path,
                          worker_http_port=str(port))
        # The Slack app's checks, as `deepthread slack` builds them, on the same database and Redis.
        bot_health = process_health(load_settings(database_url=database_url, redis_url=outage_redis.url),
                                    watch_workers=True)
        try:
            cluster.start_worker("w1")
            cluster.wait_for(lambda: healthz(port) == (200, {"ok": True, "failing": [],
                                                             "parts": {"database": "ok", "redis": "ok"}}),
                             30, "the worker's /healthz to answer 200")
            with TestClient(build_http_app(None, health=bot_health)) as slack_app:
                cluster.wait_for(lambda: slack_app.get("/healthz").status_code == 200, 15,
                                 "the Slack app to see the worker's heartbeat")

                outage_redis.stop()
                status, body = cluster.wait_for(lambda: (answer := healthz(port)) and answer[0] == 503 and answer,
                                                15, "the worker's /healthz to answer 503")
                assert body["failing"] == ["redis"] and body["parts"]["database"] == "ok", body
                bot_answer = cluster.wait_for(lambda: (answer := slack_app.get("/healthz")).status_code == 503
                                              and answer, 15, "the Slack app's /healthz to answer 503")
                assert bot_answer.json()["failing"] == ["redis"], bot_answer.json()

                outage_redis.start()
                cluster.wait_for(lambda: healthz(port) == (200, {"ok": True, "failing": [],
                                                                 "parts": {"database": "ok", "redis": "ok"}}),
                                 15, "the worker's /healthz to answer 200 again")
                cluster.wait_for(lambda: slack_app.get("/healthz").status_code == 200, 15,
                                 "the Slack app's /healthz to answer 200 again")
        finally:
            cluster.stop()


def test_metrics_of_a_real_worker_count_a_finished_run_by_mode_and_state(
        tmp_path: Path, redis_url: str, slack: FakeSlack) -> None:
    port = free_port()
    with Corpus() as corpus:
        cluster = Cluster(database_url=f"sqlite:///{tmp_path}/deepthread.db", redis_url=redis_url, corpus=corpus,
                          slack=slack, workdir=tmp_path, worker_http_port=str(port))
        try:
            cluster.start_worker("w1")
            cluster.wait_for(lambda: healthz(port), 30, "the worker's metrics server")
            assert runs_counted(port) == {}
            # A chat run: the shortest path through the engine, the recorder and delivery (research's phases are
            # the same events, counted in tests/unit/test_metrics.py).
            run_id, _ = cluster.start_run(QUESTION, mode="chat")
            assert cluster.wait_for_state(run_id, {"done", "failed", "cancelled", "timed_out"}).state == "done"
            counted = cluster.wait_for(lambda: runs_counted(port), 10, "the run to be counted")
            assert counted == {("chat", "done"): 1.0}

            families = {family.name: family for family in text_string_to_metric_families(
                httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text)}
            assert [sample.value for sample in families["deepthread_queue_wait_seconds"].samples
                    if sample.name.endswith("_count")] == [1.0]
            assert any(sample.value >= 1 for sample in families["deepthread_llm_calls"].samples)
            assert any(sample.value >= 1 for sample in families["deepthread_status_edits"].samples
                       if sample.labels.get("outcome") == "sent")
        finally:
            cluster.stop()


async def test_slack_rate_limit_waits_are_counted_in_the_process_metrics(slack: FakeSlack) -> None:
    def waits() -> float:
        return REGISTRY.get_sample_value("deepthread_platform_rate_limit_waits_total", {"platform": "slack"}) or 0.0

    before = waits()
    slack.fail_next("chat.postMessage", status=429, headers={"Retry-After": "0"})
    # The worker's messenger as its platform bundle builds it: the bundle hands the client the process's metrics.
    messenger = slack_outbound(load_settings(slack_bot_token=slack.token, slack_api_url=slack.api_url)).messenger
    assert isinstance(messenger, SlackMessenger) and messenger.client is not None
    try:
        await messenger.post(Place(platform="slack", workspace="T1", channel="C1"), Content(text="hello"))
    finally:
        if messenger.client.session is not None:
            await messenger.client.session.close()
    assert waits() - before == 1


def test_the_discord_bot_serves_healthz_and_metrics_on_its_port_and_needs_a_live_worker(
        tmp_path: Path, redis_url: str) -> None:
    port = free_port()
    database_url = f"sqlite:///{tmp_path}/deepthread.db"
    upgrade(database_url)
    redis_client = connect(redis_url)
    redis_client.flushall()
    with discord_urls_nowhere(), FakeDiscord() as fake:
        settings = load_settings(database_url=database_url, redis_url=redis_url, discord_bot_token=fake.token,
                                 discord_api_url=fake.api_url, discord_guild_ids=str(fake.guild_id),
                                 discord_http_port=port)
        bot = BotThread(settings).start()
        try:
            answer = wait_for(lambda: healthz(port), "the Discord bot's /healthz", 20, interval=0.1)
            assert answer == (503, {"ok": False, "failing": ["worker_heartbeat"], "parts": {
                "database": "ok", "redis": "ok", "worker_heartbeat": "no worker heartbeat in the last 60 s"}})
            beat(redis_client, "w1@test")
            wait_for(lambda: healthz(port) == (200, {"ok": True, "failing": [], "parts": {
                "database": "ok", "redis": "ok", "worker_heartbeat": "ok"}}), "the next refresh to see the heartbeat", 20)
            metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
            assert "process_cpu_seconds" in {family.name for family in text_string_to_metric_families(metrics.text)}
        finally:
            bot.stop()
    assert healthz(port) is None  # the bot's server stopped with it
