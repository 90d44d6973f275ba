"""The ops server under load (security issue 24: M4, L1): probes read a cached report and never run the checks, a part
that hangs holds one thread at most, a fixed pool of threads answers while other connections wait their turn, and
every HTTP server listens on 127.0.0.1 unless HTTP_BIND_ADDRESS opts into more."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from slack_sdk.web.async_client import AsyncWebClient
from starlette.testclient import TestClient
from typer.main import get_command

from bot.cli import app
from bot.slack.dedupe import MemoryEventDeduper, MemoryReplayGuard
from bot.slack.server import SlackBot
from config import SettingsError, load_settings
from ops.health import HealthChecker, HealthMonitor
from ops.server import OpsServer
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
EVERY_ADDRESS = re.compile(r"""["']0\.0\.0\.0["']""")


class CountingCheck:
    """A part that is always healthy and counts how often it was checked."""

    def __init__(self) -> None:
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self) -> None:
        with self._lock:
            self.calls += 1


def test_probes_answer_from_the_latest_report_and_never_run_the_checks() -> None:
    check = CountingCheck()
    # A refresh far away: every probe after the first check must be answered from that one report.
    server = OpsServer(HealthChecker({"database": check}), port=0, host="127.0.0.1", registry=CollectorRegistry(),
                       refresh_seconds=3600).start()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=10) as client:
            answers = [client.get("/healthz") for _ in range(50)]
    finally:
        server.stop()
    assert {answer.status_code for answer in answers} == {200}
    assert answers[-1].json() == {"ok": True, "parts": {"database": "ok"}, "failing": []}
    assert check.calls == 1


def test_the_monitor_refreshes_in_the_background_and_releases_the_connections_when_closed() -> None:
    state = {"database": "down"}
    released = threading.Event()

    def database() -> None:
        if state["database"] != "ok":
            raise ConnectionError

    monitor = HealthMonitor(HealthChecker({"database": database}, closers=[released.set]), interval_seconds=0.01)
    try:
        first = monitor.latest(wait_seconds=monitor.first_report_seconds)
        assert first.failing == ["database"] and first.parts["database"] == "unreachable (ConnectionError)"
        state["database"] = "ok"
        wait_for(lambda: monitor.latest().ok, "a later refresh to see the database back", 5)
    finally:
        monitor.close()
    assert released.wait(5)


def test_a_part_still_hung_from_the_last_check_is_not_started_again() -> None:
    release = threading.Event()
    entered = CountingCheck()

    def hung() -> None:
        entered()
        release.wait(30)

    checker = HealthChecker({"redis": hung}, timeout_seconds=0.05)
    try:
        first, second = checker.check(), checker.check()
    finally:
        release.set()
    assert first.failing == second.failing == ["redis"]
    assert second.parts["redis"] == "no answer within 0.05 s"
    assert entered.calls == 1  # one thread (and one connection) for the hung part, not one a check


class BlockingCollector(Collector):
    """A metric whose collection waits for `release`: each `/metrics` request holds its server thread until then."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Semaphore(0)
        self.third_entered = threading.Event()
        self._lock = threading.Lock()
        self.active = 0
        self.most_active = 0
        self.count = 0

    def describe(self) -> list[GaugeMetricFamily]:
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            self.active += 1
            self.count += 1
            self.most_active = max(self.most_active, self.active)
            if self.active >= 3:
                self.third_entered.set()
        self.entered.release()
        self.release.wait(30)
        with self._lock:
            self.active -= 1
        yield GaugeMetricFamily("deepthread_probe_blocking", "Held until the test lets it go.", value=1)


@pytest.fixture
def blocking_server() -> Iterator[tuple[OpsServer, BlockingCollector]]:
    registry = CollectorRegistry()
    collector = BlockingCollector()
    registry.register(collector)
    server = OpsServer(None, port=0, host="127.0.0.1", registry=registry, threads=2, waiting=2).start()
    try:
        yield server, collector
    finally:
        collector.release.set()
        server.stop()


def server_threads() -> list[str]:
    return [thread.name for thread in threading.enumerate() if thread.name.startswith("deepthread-ops-http")]


def test_a_fixed_pool_answers_and_the_other_connections_wait_their_turn(
        blocking_server: tuple[OpsServer, BlockingCollector]) -> None:
    server, collector = blocking_server
    threads_before = sorted(server_threads())
    answers: list[int] = []

    def get_metrics() -> None:
        answers.append(httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=30).status_code)

    clients = [threading.Thread(target=get_metrics, daemon=True) for _ in range(12)]
    for client in clients:
        client.start()
    try:
        assert collector.entered.acquire(timeout=10) and collector.entered.acquire(timeout=10)
        # Both pool threads are held; a thread a connection would let a third request in at once.
        assert not collector.third_entered.wait(0.5)
        assert sorted(server_threads()) == threads_before  # the acceptor and two answering threads, no more
    finally:
        collector.release.set()
    for client in clients:
        client.join(30)
    assert answers == [200] * 12  # every connection waited its turn and was answered
    assert collector.most_active == 2 and collector.count == 12


def test_every_http_server_listens_on_the_loopback_address_unless_a_setting_says_otherwise() -> None:
    assert load_settings().http_bind_address == "127.0.0.1"
    assert load_settings(http_bind_address="0.0.0.0").http_bind_address == "0.0.0.0"
    assert load_settings(http_bind_address=" ::1 ").http_bind_address == "::1"
    with pytest.raises(SettingsError, match="^Invalid setting HTTP_BIND_ADDRESS: must be an IP address"):
        load_settings(http_bind_address="everywhere")
    server = OpsServer(None, port=0, registry=CollectorRegistry()).start()
    try:
        assert server.host == "127.0.0.1"
    finally:
        server.stop()
    slack_host = next(parameter for parameter in get_command(app).commands["slack"].params  # type: ignore[attr-defined]
                      if parameter.name == "host")
    assert slack_host.default is None and "HTTP_BIND_ADDRESS" in (slack_host.help or "")


def test_no_server_code_names_every_address() -> None:
    """Binding 0.0.0.0 is the deployment's choice (HTTP_BIND_ADDRESS in Compose), never a default in the code."""
    hits = [f"{path.relative_to(ROOT)}:{number}" for folder in ("ops", "bot", "worker", "chat")
            for path in sorted((ROOT / folder).rglob("*.py"))
            for number, line in enumerate(path.read_text().splitlines(), 1) if EVERY_ADDRESS.search(line)]
    assert hits == []


@pytest.mark.parametrize("serve_metrics", [False, True])
def test_the_slack_app_serves_metrics_on_its_public_port_only_when_slack_serve_metrics_is_set(
        serve_metrics: bool) -> None:
    settings = load_settings(slack_bot_token="xoxb-test", slack_signing_secret="secret",
                             **({"slack_serve_metrics": "true"} if serve_metrics else {}))
    bot = SlackBot(settings, object(), client=AsyncWebClient(token="xoxb-test"),  # type: ignore[arg-type]
                   dedupe=MemoryEventDeduper(), replay_guard=MemoryReplayGuard())
    with TestClient(bot.http_app) as client:
        assert client.get("/healthz").status_code == 200
        assert client.get("/metrics").status_code == (200 if serve_metrics else 404)
