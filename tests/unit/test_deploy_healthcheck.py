"""The container health probe (deploy/healthcheck.py) against a loopback /healthz."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "deploy" / "healthcheck.py"


def load_probe() -> ModuleType:
    spec = importlib.util.spec_from_file_location("deploy_healthcheck", PROBE)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


healthcheck = load_probe()


class HealthServer:
    """A loopback server whose /healthz answers with the status and body a test sets."""

    def __init__(self) -> None:
        self.status, self.body, self.paths = 200, b"ok", []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.paths.append(self.path)
                status = owner.status if self.path == "/healthz" else 404
                self.send_response(status)
                self.send_header("Content-Length", str(len(owner.body)))
                self.end_headers()
                self.wfile.write(owner.body)

            def log_message(self, *arguments: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]


@pytest.fixture
def health_server() -> Iterator[HealthServer]:
    server = HealthServer()
    thread = threading.Thread(target=server.server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    yield server
    server.server.shutdown()
    server.server.server_close()
    thread.join()


def test_a_healthy_endpoint_passes_the_probe(health_server: HealthServer) -> None:
    assert healthcheck.main([str(health_server.port)], environment={}) == 0
    assert health_server.paths == ["/healthz"]


def test_a_503_fails_the_probe_and_names_the_failing_part(health_server: HealthServer,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    health_server.status, health_server.body = 503, b'{"redis": "unreachable"}'
    assert healthcheck.main([str(health_server.port)], environment={}) == 1
    reason = capsys.readouterr().err
    assert "503" in reason and "redis" in reason


def test_nothing_listening_fails_the_probe() -> None:
    with socket.socket() as bound_but_not_listening:
        bound_but_not_listening.bind(("127.0.0.1", 0))
        port = bound_but_not_listening.getsockname()[1]
        assert healthcheck.main([str(port)], environment={}) == 1


def test_a_proxy_in_the_environment_does_not_carry_the_probe(health_server: HealthServer) -> None:
    # a fresh interpreter, as Docker runs it: urllib, for one, would read the proxy from this environment
    with socket.socket() as dead_proxy:
        dead_proxy.bind(("127.0.0.1", 0))
        proxy = f"http://127.0.0.1:{dead_proxy.getsockname()[1]}"
        environment = {"PATH": os.environ.get("PATH", ""), "http_proxy": proxy, "HTTP_PROXY": proxy,
                       "all_proxy": proxy, "ALL_PROXY": proxy}
        probe = subprocess.run([sys.executable, str(PROBE), str(health_server.port)], env=environment,
                               capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0, probe.stderr
    assert health_server.paths == ["/healthz"]


def test_port_zero_means_no_health_server_and_nothing_to_check() -> None:
    assert healthcheck.main(["0"], environment={}) == 0


def test_the_port_comes_from_the_argument_then_health_port_then_the_worker_port() -> None:
    environment = {"HEALTH_PORT": "3000", "WORKER_HTTP_PORT": "9500"}
    assert healthcheck.health_port(["9451"], environment) == 9451
    assert healthcheck.health_port([], environment) == 3000
    assert healthcheck.health_port([], {"WORKER_HTTP_PORT": "9500"}) == 9500
    assert healthcheck.health_port([], {}) == 9450
