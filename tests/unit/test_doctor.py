from __future__ import annotations

import json

import fakeredis
import httpx
import pytest

from bot.cli import platform_bundles
from bot.doctor import format_checks, run_checks
from config import load_settings

SECRETS = {
    "LLM_API_KEY": "sk-very-secret-llm",
    "TAVILY_API_KEY": "tvly-secret-1",
    "BRAVE_API_KEY": "brave-secret-2",
    "EXA_API_KEY": "exa-secret-3",
    "SLACK_BOT_TOKEN": "xoxb-secret-4",
    "SLACK_SIGNING_SECRET": "signing-secret-5",
    "DISCORD_BOT_TOKEN": "discord-secret-6",
}


def fake_services(request: httpx.Request) -> httpx.Response:
    """LLM, providers, Slack and Discord at the wire; echoes the auth header back like a chatty proxy."""
    echoed = request.headers.get("authorization", "")
    if request.url.path.endswith("/models"):
        return httpx.Response(200, json={"object": "list", "data": [{"id": "gpt-test"}], "seen": echoed})
    if request.url.path.endswith("/auth.test"):
        return httpx.Response(200, json={"ok": True, "user": "deepthread", "team": "Acme", "echo": echoed})
    if request.url.path.endswith("/users/@me"):
        return httpx.Response(200, json={"username": "deepthread", "echo": echoed})
    return httpx.Response(404, text=f"no route; you sent {echoed}")


def checks_with(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], handler=fake_services):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("DATABASE_URL", "sqlite://")
    redis_server = fakeredis.FakeServer()
    with httpx.Client(transport=httpx.MockTransport(handler)) as http:
        return run_checks(load_settings(), http, [bundle.doctor for bundle in platform_bundles() if bundle.doctor],
                          redis_for=lambda settings: fakeredis.FakeRedis(server=redis_server))


def test_secrets_never_appear_in_the_doctor_output(monkeypatch: pytest.MonkeyPatch) -> None:
    checks = checks_with(monkeypatch, {**SECRETS, "LLM_MODEL": "gpt-test"})
    output = format_checks(checks) + json.dumps([check.model_dump() for check in checks])
    for secret in SECRETS.values():
        assert secret not in output
    assert "Ready." in output


def test_secrets_echoed_in_an_error_are_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError(f"could not reach with {request.headers.get('authorization')}")

    checks = checks_with(monkeypatch, {**SECRETS, "LLM_MODEL": "gpt-test"}, handler=failing)
    output = format_checks(checks)
    for secret in SECRETS.values():
        assert secret not in output


def test_missing_llm_model_is_reported_and_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    checks = checks_with(monkeypatch, {})
    output = format_checks(checks)
    assert "LLM_MODEL is not set" in output
    assert any(check.failed and check.component == "llm" for check in checks)
    assert "Not ready" in output


def test_missing_api_key_is_fine_for_a_local_server(monkeypatch: pytest.MonkeyPatch) -> None:
    checks = checks_with(monkeypatch, {"LLM_MODEL": "gpt-test", "LLM_BASE_URL": "http://127.0.0.1:11434/v1"})
    endpoint = next(check for check in checks if check.component == "llm endpoint")
    assert endpoint.status == "ok"
    assert not any(check.failed for check in checks)


def test_missing_api_key_is_an_error_when_the_endpoint_answers_401(monkeypatch: pytest.MonkeyPatch) -> None:
    checks = checks_with(monkeypatch, {"LLM_MODEL": "gpt"}, handler=lambda request: httpx.Response(401, json={}))
    endpoint = next(check for check in checks if check.component == "llm endpoint")
    assert endpoint.failed
    assert "LLM_API_KEY is missing" in endpoint.detail


def test_unconfigured_platforms_and_providers_are_listed_as_off(monkeypatch: pytest.MonkeyPatch) -> None:
    checks = {check.component: check for check in checks_with(monkeypatch, {"LLM_MODEL": "gpt"})}
    for component in ("search: tavily", "search: brave", "search: exa", "search: searxng", "slack", "discord"):
        assert checks[component].status == "off"
        assert not checks[component].failed
    assert checks["database"].status == "ok"
    assert checks["redis"].status == "ok"


def test_slack_http_mode_without_signing_secret_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    checks = {check.component: check for check in checks_with(monkeypatch, {"LLM_MODEL": "gpt", "SLACK_BOT_TOKEN": "xoxb-1"})}
    assert checks["slack"].failed
    assert "SLACK_SIGNING_SECRET" in checks["slack"].detail


def test_doctor_command_exits_non_zero_when_required_part_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from bot.cli import app

    monkeypatch.setenv("DATABASE_URL", "sqlite://")
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:9/0")  # refused at once: no embedded server is started
    monkeypatch.setenv("LLM_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("LLM_API_KEY", "sk-do-not-print")
    # Search only where nothing listens, so that the doctor asks nothing beyond this machine.
    monkeypatch.setenv("SEARCH_PROVIDERS", "searxng")
    monkeypatch.setenv("SEARXNG_URL", "http://127.0.0.1:9")
    result = CliRunner().invoke(app, ["doctor"])
    assert result.exit_code == 1
    assert "LLM_MODEL is not set" in result.output
    assert "sk-do-not-print" not in result.output


def test_the_keyless_fallback_is_tried_not_assumed(monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(request: httpx.Request) -> httpx.Response:
        if request.url.host == "html.duckduckgo.com":
            raise httpx.ConnectError("no route", request=request)
        return fake_services(request)

    reachable = {check.component: check for check in checks_with(monkeypatch, {"LLM_MODEL": "m"})}
    assert reachable["search: duckduckgo"].status == "ok" and "reachable" in reachable["search: duckduckgo"].detail
    down = {check.component: check for check in checks_with(monkeypatch, {"LLM_MODEL": "m"}, offline)}
    assert down["search: duckduckgo"].status == "error"
    # DuckDuckGo was the only provider research would ask, so nothing can search: the doctor fails on `search`.
    assert down["search"].failed and "no search provider can answer" in down["search"].detail


def test_a_password_inside_a_url_is_never_printed(monkeypatch: pytest.MonkeyPatch) -> None:
    checks = checks_with(monkeypatch, {"LLM_MODEL": "m", "LLM_BASE_URL": "https://alice:hunter2@llm.example/v1",
                                       "SEARXNG_URL": "https://bob:s3cret@searx.example"})
    printed = format_checks(checks)
    assert "hunter2" not in printed and "s3cret" not in printed and "alice" not in printed
    assert "https://***@llm.example/v1" in printed
