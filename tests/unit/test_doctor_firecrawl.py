"""`deepthread doctor` on Firecrawl: off without a key, reachable with one, and the key never printed."""

from __future__ import annotations

import fakeredis
import httpx
import pytest

from bot.doctor import Check, format_checks, run_checks
from config import load_settings

FIRECRAWL_KEY = "fc-very-secret-firecrawl"


def firecrawl_checks(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> tuple[Check, str]:
    """The doctor's Firecrawl line and its whole report, every service answering (Firecrawl echoing the auth header)."""
    for name, value in {"LLM_MODEL": "gpt", "DATABASE_URL": "sqlite://", **env}.items():
        monkeypatch.setenv(name, value)

    def services(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"seen": request.headers.get("authorization", "")})

    redis_server = fakeredis.FakeServer()
    with httpx.Client(transport=httpx.MockTransport(services)) as http:
        checks = run_checks(load_settings(), http, redis_for=lambda settings: fakeredis.FakeRedis(server=redis_server))
    return next(check for check in checks if check.component == "search: firecrawl"), format_checks(checks)


def test_firecrawl_without_a_key_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FIRECRAWL_API_KEY", raising=False)
    check, _report = firecrawl_checks(monkeypatch, {})
    assert (check.status, check.detail, check.failed) == ("off", "FIRECRAWL_API_KEY not set", False)


def test_firecrawl_with_a_key_is_checked_and_the_key_never_printed(monkeypatch: pytest.MonkeyPatch) -> None:
    check, report = firecrawl_checks(monkeypatch, {"FIRECRAWL_API_KEY": FIRECRAWL_KEY,
                                                   "FIRECRAWL_BASE_URL": "https://firecrawl.internal.test"})
    assert check.status == "ok" and "https://firecrawl.internal.test" in check.detail
    assert FIRECRAWL_KEY not in report
