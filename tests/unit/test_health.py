"""Health checks: each part's state, a hung part answered within the timeout, the bots' worker heartbeat, and the
`/healthz` answers of the threaded server and the Slack app."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator

import fakeredis
import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from bot.slack.server import build_http_app
from ops.health import HealthChecker, HealthProblem, WorkerHeartbeatCheck, database_check, health_engine, redis_check
from ops.server import OpsServer, start_ops_server
from storage.redis import connect
from storage.shared_limits import beat
from tests.fakes.server import free_port

SECRET_PASSWORD = "hunter2-never-shown"


def healthy() -> None:
    return None


def failing_with(reason: str):  # type: ignore[no-untyped-def]
    def check() -> None:
        raise HealthProblem(reason)
    return check


class ManualClock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def fake_redis() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis()


def test_every_part_answering_is_ok() -> None:
    report = HealthChecker({"database": healthy, "redis": healthy}).check()
    assert report.ok and report.parts == {"database": "ok", "redis": "ok"} and report.failing == []


def test_a_stopped_redis_fails_the_redis_part_by_name() -> None:
    stopped = connect(f"redis://:{SECRET_PASSWORD}@127.0.0.1:{free_port()}/0", fail_fast=True)
    report = HealthChecker({"database": healthy, "redis": redis_check(stopped)}).check()
    assert not report.ok and report.failing == ["redis"]
    assert report.parts["redis"] == "unreachable (ConnectionError)" and report.parts["database"] == "ok"


def test_a_database_that_refuses_connections_fails_without_showing_its_url() -> None:
    engine = health_engine(f"postgresql+psycopg://deepthread:{SECRET_PASSWORD}@127.0.0.1:{free_port()}/deepthread")
    report = HealthChecker({"database": database_check(engine)}).check()
    assert report.failing == ["database"] and report.parts["database"].startswith("unreachable (")
    assert SECRET_PASSWORD not in report.model_dump_json()


def test_select_one_on_a_working_database_is_ok(tmp_path) -> None:  # type: ignore[no-untyped-def]
    report = HealthChecker({"database": database_check(health_engine(f"sqlite:///{tmp_path}/health.db"))}).check()
    assert report.ok


def test_a_hung_part_is_reported_failing_when_the_timeout_passes_while_the_others_answer() -> None:
    release = threading.Event()
    try:
        report = HealthChecker({"redis": lambda: release.wait(), "database": healthy}, timeout_seconds=0.05).check()
    finally:
        release.set()
    assert report.failing == ["redis"] and report.parts["redis"] == "no answer within 0.05 s"
    assert report.parts["database"] == "ok"


def test_no_worker_heartbeat_ever_seen_fails(fake_redis: fakeredis.FakeRedis) -> None:
    check = WorkerHeartbeatCheck(fake_redis, clock=ManualClock())
    with pytest.raises(HealthProblem, match="no worker heartbeat in the last 60 s"):
        check()


def test_a_worker_heartbeat_counts_for_a_minute_after_it_was_last_seen(fake_redis: fakeredis.FakeRedis) -> None:
    clock = ManualClock()
    check = WorkerHeartbeatCheck(fake_redis, clock=clock)
    beat(fake_redis, "worker1@host")
    check()
    fake_redis.flushall()  # the heartbeat key expired: the worker stopped beating
    clock.now += 59
    check()
    clock.now += 2
    with pytest.raises(HealthProblem):
        check()


def test_the_heartbeat_part_relies_on_what_it_saw_while_redis_is_away(fake_redis: fakeredis.FakeRedis) -> None:
    clock = ManualClock()
    beat(fake_redis, "worker1@host")
    check = WorkerHeartbeatCheck(fake_redis, clock=clock)
    check()
    check.client = connect(f"redis://127.0.0.1:{free_port()}/0", fail_fast=True)
    clock.now += 30
    check()


# --- /healthz and /metrics ------------------------------------------------------------------------------------------

@pytest.fixture
def registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("deepthread_probe", "A sample to find in /metrics.", registry=registry).inc(3)
    return registry


@pytest.fixture
def failing_redis_server(registry: CollectorRegistry) -> Iterator[OpsServer]:
    health = HealthChecker({"database": healthy, "redis": failing_with("unreachable (ConnectionError)")})
    server = OpsServer(health, port=0, host="127.0.0.1", registry=registry).start()
    try:
        yield server
    finally:
        server.stop()


def test_the_threaded_server_answers_503_naming_the_failing_part(failing_redis_server: OpsServer) -> None:
    response = httpx.get(f"http://127.0.0.1:{failing_redis_server.port}/healthz")
    assert response.status_code == 503
    assert response.json() == {"ok": False, "parts": {"database": "ok", "redis": "unreachable (ConnectionError)"},
                               "failing": ["redis"]}


def test_the_threaded_server_serves_its_registry_at_metrics(failing_redis_server: OpsServer) -> None:
    response = httpx.get(f"http://127.0.0.1:{failing_redis_server.port}/metrics")
    samples = {sample.name: sample.value for family in text_string_to_metric_families(response.text)
               for sample in family.samples}
    assert response.status_code == 200 and samples["deepthread_probe_total"] == 3


def test_the_threaded_server_answers_200_when_every_part_is_ok(registry: CollectorRegistry) -> None:
    server = OpsServer(HealthChecker({"database": healthy}), port=0, host="127.0.0.1", registry=registry).start()
    try:
        response = httpx.get(f"http://127.0.0.1:{server.port}/healthz")
    finally:
        server.stop()
    assert response.status_code == 200 and response.json()["parts"] == {"database": "ok"}


def test_port_zero_setting_serves_nothing() -> None:
    assert start_ops_server(0, None) is None


def test_a_taken_port_is_logged_and_the_process_goes_on(caplog: pytest.LogCaptureFixture,
                                                       failing_redis_server: OpsServer) -> None:
    with caplog.at_level(logging.WARNING, logger="ops.server"):
        assert start_ops_server(failing_redis_server.port, None, host="127.0.0.1", setting="WORKER_HTTP_PORT") is None
    assert "WORKER_HTTP_PORT" in caplog.text


def test_the_slack_app_answers_healthz_from_its_checks_and_serves_metrics_when_asked(
        registry: CollectorRegistry) -> None:
    health = HealthChecker({"database": healthy, "redis": healthy,
                            "worker_heartbeat": failing_with("no worker heartbeat in the last 60 s")})
    with TestClient(build_http_app(None, health=health, registry=registry, serve_metrics=True)) as client:
        health_response = client.get("/healthz")
        metrics_response = client.get("/metrics")
    assert health_response.status_code == 503 and health_response.json()["failing"] == ["worker_heartbeat"]
    assert json.loads(health_response.text)["parts"]["worker_heartbeat"] == "no worker heartbeat in the last 60 s"
    names = {family.name for family in text_string_to_metric_families(metrics_response.text)}
    assert "deepthread_probe" in names


def test_the_slack_app_keeps_metrics_off_its_public_port_by_default(registry: CollectorRegistry) -> None:
    with TestClient(build_http_app(None, health=HealthChecker({"database": healthy}), registry=registry)) as client:
        assert client.get("/healthz").status_code == 200
        metrics_response = client.get("/metrics")
    assert metrics_response.status_code == 404 and "deepthread_probe" not in metrics_response.text


def test_the_slack_app_without_checks_answers_liveness() -> None:
    with TestClient(build_http_app(None)) as client:
        response = client.get("/healthz")
    assert response.status_code == 200 and response.json() == {"ok": True}
