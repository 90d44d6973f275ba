"""`deepthread doctor` on what research will use: the search providers SEARCH_PROVIDERS names (and only those), and a
model the endpoint's `/models` lists.

Every request the doctor sends goes through `Wire`, which records it: loopback ones reach the fakes (FakeLLM,
FakeSearchAPI), DuckDuckGo's address is answered (or refused) here, and anything else fails the test.
"""

from __future__ import annotations

from collections.abc import Iterator

import fakeredis
import httpx
import pytest
from typer.testing import CliRunner

from bot.doctor import DUCKDUCKGO_URL, Check, format_checks, run_checks, searched_providers
from config import load_settings
from tests.fakes.llm import FakeLLM
from tests.fakes.search_api import FAKE_KEYS, FakeSearchAPI

DUCKDUCKGO_HOST = httpx.URL(DUCKDUCKGO_URL).host


class Wire(httpx.BaseTransport):
    """The doctor's whole network: each request recorded; loopback to the fakes, DuckDuckGo answered or refused here."""

    def __init__(self, *, duckduckgo_reachable: bool = True) -> None:
        self.duckduckgo_reachable = duckduckgo_reachable
        self.urls: list[httpx.URL] = []
        self._loopback = httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.urls.append(request.url)
        if request.url.host == "127.0.0.1":
            return self._loopback.handle_request(request)
        if request.url.host == DUCKDUCKGO_HOST:
            if not self.duckduckgo_reachable:
                raise httpx.ConnectError("no route to host", request=request)
            return httpx.Response(200, text="<html><form action='/html/'></form></html>")
        raise AssertionError(f"the doctor went past the fakes: {request.url}")

    def reached(self, prefix: str) -> list[str]:
        """The URLs asked for that start with `prefix`."""
        return [str(url) for url in self.urls if str(url).startswith(prefix)]

    def close(self) -> None:
        self._loopback.close()


@pytest.fixture
def llm() -> Iterator[FakeLLM]:
    with FakeLLM(models=["gpt-test", "gpt-test-mini"]) as fake:
        yield fake


@pytest.fixture
def search_api() -> Iterator[FakeSearchAPI]:
    with FakeSearchAPI() as api:
        yield api


def doctor(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], wire: Wire) -> list[Check]:
    for name, value in {"DATABASE_URL": "sqlite://", **env}.items():
        monkeypatch.setenv(name, value)
    redis_server = fakeredis.FakeServer()
    with httpx.Client(transport=wire) as http:
        return run_checks(load_settings(), http, redis_for=lambda settings: fakeredis.FakeRedis(server=redis_server))


def by_component(checks: list[Check]) -> dict[str, Check]:
    return {check.component: check for check in checks}


def test_the_command_fails_naming_the_keys_when_no_listed_provider_can_answer(
    monkeypatch: pytest.MonkeyPatch, llm: FakeLLM,
) -> None:
    """Tavily and Brave listed without keys: research would fail "No search provider could answer", so doctor does."""
    import bot.doctor
    from bot.cli import app

    wire = Wire()
    real_client = httpx.Client
    monkeypatch.setattr(httpx, "Client", lambda **options: real_client(transport=wire, **options))
    # The embedded Redis is not what this test is about; a real one answers.
    monkeypatch.setattr(bot.doctor, "check_redis", lambda settings, redis_for: Check(
        component="redis", status="ok", detail="answers PING", required=True))
    for name, value in {"DATABASE_URL": "sqlite://", "LLM_BASE_URL": llm.base_url, "LLM_MODEL": "gpt-test",
                        "SEARCH_PROVIDERS": "tavily,brave"}.items():
        monkeypatch.setenv(name, value)

    result = CliRunner().invoke(app, ["doctor"])

    assert result.exit_code == 1, result.output
    assert "set TAVILY_API_KEY or BRAVE_API_KEY in .env" in result.output
    assert "Not ready: fix search." in result.output
    # Nothing but the model endpoint was asked: neither unkeyed provider, nor DuckDuckGo, which is not listed.
    assert [url.path for url in wire.urls] == ["/v1/models"]


def test_auto_with_no_key_and_duckduckgo_unreachable_fails_naming_every_key(
    monkeypatch: pytest.MonkeyPatch, llm: FakeLLM,
) -> None:
    wire = Wire(duckduckgo_reachable=False)
    checks = by_component(doctor(monkeypatch, {"LLM_BASE_URL": llm.base_url, "LLM_MODEL": "gpt-test"}, wire))

    assert checks["search: duckduckgo"].status == "error"
    assert checks["search"].failed
    assert checks["search"].detail.endswith(
        "check the network, or set TAVILY_API_KEY, BRAVE_API_KEY, EXA_API_KEY, SEARXNG_URL or FIRECRAWL_API_KEY in .env")
    assert wire.reached(DUCKDUCKGO_URL) == [DUCKDUCKGO_URL]


def test_only_the_providers_search_providers_lists_are_probed(
    monkeypatch: pytest.MonkeyPatch, llm: FakeLLM, search_api: FakeSearchAPI,
) -> None:
    """Tavily has a key but is not listed, DuckDuckGo is not listed: neither is asked; Brave is, and answers."""
    wire = Wire()
    env = {"LLM_BASE_URL": llm.base_url, "LLM_MODEL": "gpt-test", "SEARCH_PROVIDERS": "brave",
           "BRAVE_API_KEY": FAKE_KEYS["brave"], "BRAVE_BASE_URL": search_api.base_url("brave"),
           "TAVILY_API_KEY": FAKE_KEYS["tavily"], "TAVILY_BASE_URL": search_api.base_url("tavily")}
    checks = doctor(monkeypatch, env, wire)
    components = by_component(checks)

    assert wire.reached(search_api.base_url("brave")) == [search_api.base_url("brave")]
    assert wire.reached(search_api.base_url("tavily")) == []
    assert wire.reached(f"https://{DUCKDUCKGO_HOST}") == []
    assert {host for url in wire.urls for host in [url.host]} == {"127.0.0.1"}
    assert components["search: tavily"].detail == "TAVILY_API_KEY set, but not in SEARCH_PROVIDERS"
    assert components["search: duckduckgo"].status == "off"
    assert components["search"].status == "ok" and components["search"].detail == "research searches with brave"
    assert format_checks(checks).endswith("Ready.")


def test_a_listed_provider_without_its_key_is_reported_but_another_that_answers_is_enough(
    monkeypatch: pytest.MonkeyPatch, llm: FakeLLM,
) -> None:
    wire = Wire()
    checks = by_component(doctor(monkeypatch, {"LLM_BASE_URL": llm.base_url, "LLM_MODEL": "gpt-test",
                                               "SEARCH_PROVIDERS": "tavily,duckduckgo"}, wire))

    assert checks["search: tavily"].status == "missing" and not checks["search: tavily"].failed
    assert "TAVILY_API_KEY is not set" in checks["search: tavily"].detail
    assert checks["search"].detail == "research searches with duckduckgo (tavily cannot answer)"
    assert not any(check.failed for check in checks.values())


def test_a_model_the_endpoint_does_not_list_fails_naming_the_ones_it_lists(
    monkeypatch: pytest.MonkeyPatch, llm: FakeLLM,
) -> None:
    checks = doctor(monkeypatch, {"LLM_BASE_URL": llm.base_url, "LLM_MODEL": "gpt-tset",
                                  "SEARCH_PROVIDERS": "duckduckgo"}, Wire())
    model = by_component(checks)["llm model"]

    assert model.failed
    assert model.detail == ("LLM_MODEL=gpt-tset is not among the models the endpoint lists (gpt-test, gpt-test-mini): "
                            "set one of those in .env")
    assert "Not ready: fix llm model." in format_checks(checks)


def test_a_listed_model_passes_and_a_long_list_is_cut_to_a_few(monkeypatch: pytest.MonkeyPatch) -> None:
    many = [f"model-{number}" for number in range(1, 41)]
    with FakeLLM(models=many) as llm:
        listed = by_component(doctor(monkeypatch, {"LLM_BASE_URL": llm.base_url, "LLM_MODEL": "model-40",
                                                   "SEARCH_PROVIDERS": "duckduckgo"}, Wire()))
        unlisted = by_component(doctor(monkeypatch, {"LLM_FAST_MODEL": "model-41"}, Wire()))

    assert listed["llm model"].status == "ok" and not listed["llm model"].failed
    assert unlisted["llm model"].failed
    assert unlisted["llm model"].detail.startswith(
        "LLM_FAST_MODEL=model-41 is not among the models the endpoint lists "
        "(model-1, model-2, model-3, model-4, model-5 and 35 more)")


def test_a_server_that_serves_any_name_is_not_held_to_its_list(monkeypatch: pytest.MonkeyPatch) -> None:
    """llama.cpp's llama-server lists the file it loaded, owned by "llamacpp", and answers to any model name."""

    def llama_server(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"object": "list", "data": [
            {"id": "/models/qwen2.5-0.5b-instruct-q4_k_m.gguf", "object": "model", "owned_by": "llamacpp"}]})

    monkeypatch.setenv("DATABASE_URL", "sqlite://")
    monkeypatch.setenv("SEARCH_PROVIDERS", "duckduckgo")
    monkeypatch.setenv("LLM_BASE_URL", "http://llama.test:8080/v1")
    monkeypatch.setenv("LLM_MODEL", "qwen")
    transport = httpx.MockTransport(lambda request: llama_server(request) if request.url.host == "llama.test"
                                    else httpx.Response(200, text="<html></html>"))
    with httpx.Client(transport=transport) as http:
        checks = run_checks(load_settings(), http, redis_for=lambda settings: fakeredis.FakeRedis())

    assert "llm model" not in by_component(checks)
    assert not any(check.failed for check in checks)


@pytest.mark.parametrize("env", [
    {},
    {"TAVILY_API_KEY": "k", "SEARXNG_URL": "http://searx.test"},
    {"SEARCH_PROVIDERS": "brave,tavily", "TAVILY_API_KEY": "k"},
    {"SEARCH_PROVIDERS": "duckduckgo,exa,exa", "FIRECRAWL_API_KEY": "k"},
])
def test_the_doctor_asks_the_providers_research_would_ask(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    """The doctor's list is the router's (worker.toolkit's SearchConfig), in the same order."""
    from worker.toolkit import search_config

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = load_settings()
    assert searched_providers(settings) == search_config(settings).ordered_providers()
