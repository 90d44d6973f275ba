"""The search router over the wire-level fake: order, fallback, retries, fan-out, diagnostics, breakers, filters."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from research.events import ProviderCall, ProviderResult
from research.limits import InMemoryCircuitBreaker
from research.models import SearchQuery
from research.providers import NoSearchProviderError, SearchRouter, build_router
from research.sources import SourceRegistry
from tests.fakes.clock import FakeClock
from tests.fakes.event_recorder import EventRecorder
from tests.fakes.search_api import FakeSearchAPI


@pytest.fixture
def recorder() -> EventRecorder:
    return EventRecorder()


def make_router(api: FakeSearchAPI, http: httpx.AsyncClient, recorder: EventRecorder, **overrides: Any) -> SearchRouter:
    """A router over the fake with no rate-limit spacing (unless overridden) and instant sleeps."""
    extra = {name: overrides.pop(name) for name in ("breaker", "ddgs_search", "registry", "limiter") if name in overrides}
    extra.setdefault("ddgs_search", no_real_duckduckgo)
    config = api.search_config(**{"min_interval_seconds": {}, **overrides})
    return build_router(config, http=http, emit=recorder.emit, sleep=recorder.sleep, **extra)


def no_real_duckduckgo(query: str, *, max_results: int, timelimit: str | None) -> list[dict[str, Any]]:
    raise AssertionError("a router test reached DuckDuckGo without injecting a search function")


def hits(*urls: str, published: str | None = None) -> list[dict[str, Any]]:
    return [{"url": url, "title": url, "snippet": f"about {url}", "published": published} for url in urls]


# -- order and fallback ---------------------------------------------------------------------------------------------


async def test_first_configured_provider_answers_and_later_ones_are_not_called(
    api: FakeSearchAPI, http: httpx.AsyncClient, recorder: EventRecorder,
) -> None:
    router = make_router(api, http, recorder, providers=["brave", "tavily", "exa"])
    results = await router.search([SearchQuery(text="heat pumps")])
    assert {result.provider for result in results} == {"brave"}
    assert recorder.calls() == ["brave"]
    assert api.requests("tavily") == [] and api.requests("exa") == []


async def test_failing_provider_falls_back_to_the_next_in_order(
    api: FakeSearchAPI, http: httpx.AsyncClient, recorder: EventRecorder,
) -> None:
    api.set_failure("tavily", status=500, times=None)
    api.set_response("brave", body="<html>gateway</html>")
    router = make_router(api, http, recorder, providers=["tavily", "brave", "exa", "searxng"])
    results = await router.search([SearchQuery(text="heat pumps")])
    assert {result.provider for result in results} == {"exa"}
    assert recorder.calls() == ["tavily", "tavily", "tavily", "brave", "exa"]
    assert recorder.errors(skipped=False) == [("tavily", "server error (HTTP 500)"), ("brave", "malformed response")]
    assert api.requests("searxng") == []


async def test_duckduckgo_is_the_last_fallback(api: FakeSearchAPI, http: httpx.AsyncClient, recorder: EventRecorder) -> None:
    def ddgs_search(query: str, *, max_results: int, timelimit: str | None) -> list[dict[str, Any]]:
        return [{"title": "From DDG", "href": "https://ddg.example/x", "body": "ddg snippet"}]

    api.set_failure("searxng", status=502, times=None)
    router = make_router(api, http, recorder, providers="searxng,duckduckgo", ddgs_search=ddgs_search)
    results = await router.search([SearchQuery(text="q")])
    assert [(result.id, result.provider, result.url) for result in results] == [("s1", "duckduckgo", "https://ddg.example/x")]


async def test_auto_uses_configured_providers_in_documented_order(api: FakeSearchAPI, http: httpx.AsyncClient, recorder: EventRecorder) -> None:
    router = make_router(api, http, recorder, providers="auto", tavily_api_key=None, exa_api_key="")
    assert router.provider_names == ["brave", "searxng", "duckduckgo"]
    await router.search([SearchQuery(text="q")])
    assert recorder.errors(skipped=True) == [], "auto mode does not report providers it never meant to use"


async def test_empty_answer_counts_as_an_answer(api: FakeSearchAPI, http: httpx.AsyncClient, recorder: EventRecorder) -> None:
    api.set_results("tavily", [])
    router = make_router(api, http, recorder, providers=["tavily", "brave"])
    assert await router.search([SearchQuery(text="q")]) == []
    assert recorder.calls() == ["tavily"]


async def test_every_provider_failing_raises_with_the_reasons(api: FakeSearchAPI, http: httpx.AsyncClient, recorder: EventRecorder) -> None:
    api.set_failure("tavily", status=401)
    api.set_failure("brave", status=429, headers={"Retry-After": "999"})
    router = make_router(api, http, recorder, providers=["tavily", "brave"])
    with pytest.raises(NoSearchProviderError) as caught:
        await router.search([SearchQuery(text="q")])
    assert "tavily: authentication failed (HTTP 401)" in str(caught.value)
    assert "brave: rate limited" in str(caught.value)


async def test_no_usable_provider_raises(api: FakeSearchAPI, http: httpx.AsyncClient, recorder: EventRecorder) -> None:
    router = make_router(api, http, recorder, providers=["tavily"], tavily_api_key=None)
    with pytest.raises(NoSearchProviderError):
        await router.search([SearchQuery(text="q")])


async def test_providers_without_their_settings_are_named_with_the_setting_to_set(
        api: FakeSearchAPI, http: httpx.AsyncClient, recorder: EventRecorder) -> None:
    api.set_failure("brave", status=429, headers={"Retry-After": "999"})
    router = make_router(api, http, recorder, providers=["tavily", "brave", "searxng"], tavily_api_key=None,
                         searxng_url=None)
    with pytest.raises(NoSearchProviderError) as caught:
        await router.search([SearchQuery(text="q")])
    reason = caught.value.plain_reason
    assert reason.startswith("No search provider could answer (") and "brave: rate limited" in reason
    assert "Set TAVILY_API_KEY or SEARXNG_URL in .env" in reason and "all search providers failed" not in reason


async def test_one_query_failing_everywhere_does_not_sink_the_others(
    api: FakeSearchAPI, http: httpx.AsyncClient, recorder: EventRecorder,
) -> None:
    api.set_results("brave", lambda query: [] if query == "bad" else hits("https://a.org/good"))
    api.set_failure("brave", status=422, times=1)
    router = make_router(api, http, recorder, providers=["brave"], concurrency=1)
    results = await router.search([SearchQuery(text="bad"), SearchQuery(text="good")])
    assert [result.url for result in results] == ["https://a.org/good"]


# -- retries --------------------------------------------------------------------------------------------------------


async def test_brave_429_retry_after_is_honoured(api: FakeSearchAPI, http: httpx.AsyncClient, recorder: EventRecorder) -> None:
    api.set_failure("brave", status=429, headers={"Retry-After": "2"}, times=2)
    router = make_router(api, http, recorder, providers=["brave", "exa"])
    results = await router.search([SearchQuery(text="q")])
    assert recorder.sleeps == [2.0, 2.0]
    assert {result.provider for result in results} == {"brave"}
    assert router.calls["brave"] == 3 and router.calls["exa"] == 0


async def test_5xx_is_retried_with_exponential_backoff(api: FakeSearchAPI, http: httpx.AsyncClient, recorder: EventRecorder) -> None:
    api.set_failure("tavily", status=503, times=3)
    router = make_router(api, http, recorder, providers=["tavily", "brave"], max_attempts=4, backoff_base_seconds=0.5)
    results = await router.search([SearchQuery(text="q")])
    assert recorder.sleeps == [0.5, 1.0, 2.0]
    assert {result.provider for result in results} == {"tavily"}


async def test_backoff_is_capped(api: FakeSearchAPI, http: httpx.AsyncClient, recorder: EventRecorder) -> None:
    api.set_failure("tavily", status=500, times=None)
    router = make_router(api, http, recorder, providers=["tavily", "brave"], max_attempts=5,
                         backoff_base_seconds=4, max_retry_wait_seconds=10)
    await router.search([SearchQuery(text="q")])
    assert recorder.sleeps == [4, 8, 10, 10]


async def test_retry_after_beyond_the_cap_falls_back_without_waiting(
    api: FakeSearchAPI, http: httpx.AsyncClient, recorder: EventRecorder,
) -> None:
    api.set_failure("brave", status=429, headers={"Retry-After": "3600"})
    router = make_router(api, http, recorder, providers=["brave", "exa"], max_retry_wait_seconds=30)
    results = await router.search([SearchQuery(text="q")])
    assert recorder.sleeps == []
    assert {result.provider for result in results} == {"exa"}
    assert router.skipped == {"brave": "rate limited"}


@pytest.mark.parametrize("status", [400, 401, 403])
async def test_client_errors_are_not_retried(status: int, api: FakeSearchAPI, http: httpx.AsyncClient, recorder: EventRecorder) -> None:
    api.set_failure("exa", status=status)
    router = make_router(api, http, recorder, providers=["exa", "brave"])
    await router.search([SearchQuery(text="q")])
    assert recorder.calls() == ["exa", "brave"]
    assert recorder.sleeps == []


# -- fan-out --------------------------------------------------------------------------------------------------------


async def test_fanout_sends_each_query_to_every_provider_and_merges_duplicates(
    api: FakeSearchAPI, http: httpx.AsyncClient, recorder: EventRecorder,
) -> None:
    router = make_router(api, http, recorder, providers=["tavily", "brave", "exa", "searxng"], fanout=True)
    results = await router.search([SearchQuery(text="heat pumps")])
    assert sorted(recorder.calls()) == ["brave", "exa", "searxng", "tavily"]
    assert [result.url for result in results] == [f"https://example.com/heat-pumps/{index}" for index in (1, 2, 3)]
    first = results[0]
    assert (first.id, first.provider, first.snippet) == ("s1", "tavily", "tavily snippet 1 about heat pumps")
    assert first.extra_snippets == ["brave snippet 1 about heat pumps", "searxng snippet 1 about heat pumps"]


async def test_fanout_keeps_the_answers_of_providers_that_did_not_fail(
    api: FakeSearchAPI, http: httpx.AsyncClient, recorder: EventRecorder,
) -> None:
    api.set_failure("tavily", status=401)
    api.set_results("brave", hits("https://brave.example/1"))
    api.set_results("searxng", hits("https://searx.example/1"))
    router = make_router(api, http, recorder, providers=["tavily", "brave", "searxng"], fanout=True)
    results = await router.search([SearchQuery(text="q")])
    assert [(result.id, result.url) for result in results] == [("s1", "https://brave.example/1"), ("s2", "https://searx.example/1")]
    assert router.skipped == {"tavily": "authentication failed (HTTP 401)"}


async def test_fanout_over_several_queries_assigns_ids_in_query_then_provider_order(
    api: FakeSearchAPI, http: httpx.AsyncClient, recorder: EventRecorder,
) -> None:
    api.set_latency("brave", 0.02)  # brave answers last, yet its hits for the first query come before the second query's
    api.set_results("brave", lambda query: hits(f"https://brave.example/{query}"))
    api.set_results("searxng", lambda query: hits(f"https://searx.example/{query}"))
    router = make_router(api, http, recorder, providers=["brave", "searxng"], fanout=True)
    results = await router.search([SearchQuery(text="one"), SearchQuery(text="two")])
    assert [(result.id, result.url) for result in results] == [
        ("s1", "https://brave.example/one"), ("s2", "https://searx.example/one"),
        ("s3", "https://brave.example/two"), ("s4", "https://searx.example/two"),
    ]


# -- diagnostics and usage ------------------------------------------------------------------------------------------


async def test_unconfigured_providers_are_reported_skipped_once_per_run(
    api: FakeSearchAPI, http: httpx.AsyncClient, recorder: EventRecorder,
) -> None:
    router = make_router(api, http, recorder, providers=["tavily", "brave", "searxng"], tavily_api_key=None, searxng_url=None)
    await router.search([SearchQuery(text="one")])
    await router.search([SearchQuery(text="two")])
    assert recorder.errors(skipped=True) == [("tavily", "not configured"), ("searxng", "not configured")]
    assert router.skipped == {"tavily": "not configured", "searxng": "not configured"}
    assert router.provider_names == ["brave"]
    assert set(recorder.calls()) == {"brave"}


async def test_events_describe_each_call_and_its_result(api: FakeSearchAPI, http: httpx.AsyncClient, recorder: EventRecorder) -> None:
    router = make_router(api, http, recorder, providers=["brave"])
    await router.search([SearchQuery(text="heat pumps")])
    call, result = recorder.events
    assert isinstance(call, ProviderCall) and (call.provider, call.query, call.phase) == ("brave", "heat pumps", "search")
    assert isinstance(result, ProviderResult) and (result.provider, result.results, result.phase) == ("brave", 3, "search")


async def test_usage_counts_every_attempt_and_result(api: FakeSearchAPI, http: httpx.AsyncClient, recorder: EventRecorder) -> None:
    api.set_failure("brave", status=500, times=1)
    router = make_router(api, http, recorder, providers=["brave", "exa"])
    await router.search([SearchQuery(text="one"), SearchQuery(text="two")])
    usage = router.usage
    assert (usage["brave"].calls, usage["brave"].results, usage["brave"].errors) == (3, 6, [])
    assert router.total_calls == 3
    assert router.calls == {"brave": 3, "exa": 0}


async def test_rejected_key_disables_the_provider_for_the_run(api: FakeSearchAPI, http: httpx.AsyncClient, recorder: EventRecorder) -> None:
    api.set_failure("tavily", status=401, times=None)
    router = make_router(api, http, recorder, providers=["tavily", "brave"])
    await router.search([SearchQuery(text="one")])
    await router.search([SearchQuery(text="two")])
    assert len(api.requests("tavily")) == 1
    assert recorder.errors(skipped=True) == [("tavily", "authentication failed (HTTP 401)")]


async def test_brave_calls_are_spaced_by_the_rate_limiter(api: FakeSearchAPI, http: httpx.AsyncClient, recorder: EventRecorder) -> None:
    router = make_router(api, http, recorder, providers=["brave"], min_interval_seconds={"brave": 1.0})
    await router.search([SearchQuery(text=f"query {index}") for index in range(3)])
    assert recorder.sleeps == [pytest.approx(1.0, abs=0.2), pytest.approx(2.0, abs=0.2)]


# -- circuit breaker ------------------------------------------------------------------------------------------------


async def test_circuit_breaker_opens_after_repeated_failures_and_closes_after_a_good_probe(
    api: FakeSearchAPI, http: httpx.AsyncClient, recorder: EventRecorder,
) -> None:
    clock = FakeClock(start=0.0)
    breaker = InMemoryCircuitBreaker(failure_threshold=2, cooldown=60, clock=clock)
    api.set_failure("exa", status=500, times=2)
    router = make_router(api, http, recorder, providers=["exa", "brave"], max_attempts=1, breaker=breaker, concurrency=1)

    await router.search([SearchQuery(text=text) for text in ("one", "two", "three", "four")])
    assert len(api.requests("exa")) == 2, "later queries skip exa: its circuit is open"
    assert recorder.errors(skipped=True) == [("exa", "circuit open")], "the skip is reported once"
    assert breaker.state("exa") == "open"

    clock.now += 60
    results = await router.search([SearchQuery(text="five")])
    assert len(api.requests("exa")) == 3
    assert {result.provider for result in results} == {"exa"}
    assert breaker.state("exa") == "closed"


async def test_breaker_is_shared_across_routers(api: FakeSearchAPI, http: httpx.AsyncClient, recorder: EventRecorder) -> None:
    breaker = InMemoryCircuitBreaker(failure_threshold=1, cooldown=60, clock=FakeClock(start=0.0))
    api.set_failure("exa", status=500)
    await make_router(api, http, recorder, providers=["exa", "brave"], max_attempts=1, breaker=breaker).search([SearchQuery(text="a")])
    second_run = make_router(api, http, recorder, providers=["exa", "brave"], breaker=breaker)
    await second_run.search([SearchQuery(text="b")])
    assert len(api.requests("exa")) == 1
    assert second_run.skipped == {"exa": "circuit open"}


# -- deduplication and filters --------------------------------------------------------------------------------------


async def test_results_are_deduplicated_across_queries_and_url_variants(
    api: FakeSearchAPI, http: httpx.AsyncClient, recorder: EventRecorder,
) -> None:
    api.set_results("brave", lambda query: hits("https://a.org/x?utm_source=" + query, "https://A.org/x#" + query, f"https://b.org/{query}"))
    router = make_router(api, http, recorder, providers=["brave"])
    results = await router.search([SearchQuery(text="one"), SearchQuery(text="two")])
    assert [(result.id, result.url) for result in results] == [
        ("s1", "https://a.org/x"), ("s2", "https://b.org/one"), ("s3", "https://b.org/two"),
    ]
    again = await router.search([SearchQuery(text="one")])
    assert [result.id for result in again] == ["s1", "s2"], "a later round sees known sources under their ids"
    assert len(router.registry) == 3


async def test_blocked_domains_are_sent_to_providers_and_enforced_on_results(
    api: FakeSearchAPI, http: httpx.AsyncClient, recorder: EventRecorder,
) -> None:
    api.set_results("tavily", hits("https://spam.com/a", "https://www.spam.com/b", "https://junk.net/c", "https://ok.org/d"))
    router = make_router(api, http, recorder, providers=["tavily"], blocked_domains=["spam.com"])
    results = await router.search([SearchQuery(text="q", blocked_domains=["junk.net"])])
    assert [result.url for result in results] == ["https://ok.org/d"]
    assert api.last_request_data("tavily")["exclude_domains"] == ["spam.com", "junk.net"]


async def test_preferred_domains_rank_first(api: FakeSearchAPI, http: httpx.AsyncClient, recorder: EventRecorder) -> None:
    api.set_results("brave", hits("https://blog.com/a", "https://www.nature.com/b", "https://news.com/c"))
    router = make_router(api, http, recorder, providers=["brave"], preferred_domains=["nature.com"])
    results = await router.search([SearchQuery(text="q")])
    assert [(result.id, result.url) for result in results] == [
        ("s1", "https://www.nature.com/b"), ("s2", "https://blog.com/a"), ("s3", "https://news.com/c"),
    ]


async def test_restricting_to_preferred_domains_drops_the_rest(api: FakeSearchAPI, http: httpx.AsyncClient, recorder: EventRecorder) -> None:
    api.set_results("searxng", hits("https://blog.com/a", "https://www.nature.com/b"))
    router = make_router(api, http, recorder, providers=["searxng"], preferred_domains=["nature.com"], restrict_to_preferred=True)
    assert [result.url for result in await router.search([SearchQuery(text="q")])] == ["https://www.nature.com/b"]


async def test_time_range_is_sent_and_older_results_dropped(api: FakeSearchAPI, http: httpx.AsyncClient, recorder: EventRecorder) -> None:
    api.set_results("exa", lambda query: [
        *hits("https://a.org/old", published="2019-05-01T00:00:00.000Z"),
        *hits("https://a.org/new", published="2024-05-01T00:00:00.000Z"),
        *hits("https://a.org/undated"),
    ])
    router = make_router(api, http, recorder, providers=["exa"])
    results = await router.search([SearchQuery(text="q", since=dt.date(2024, 1, 1))])
    assert [result.url for result in results] == ["https://a.org/new", "https://a.org/undated"]
    assert api.last_request_data("exa")["startPublishedDate"] == "2024-01-01"


async def test_configured_result_count_applies_unless_the_query_sets_one(
    api: FakeSearchAPI, http: httpx.AsyncClient, recorder: EventRecorder,
) -> None:
    router = make_router(api, http, recorder, providers=["brave"], max_results=12)
    await router.search([SearchQuery(text="q")])
    assert api.requests("brave")[-1].query["count"] == "12"
    await router.search([SearchQuery(text="q", max_results=3)])
    assert api.requests("brave")[-1].query["count"] == "3"


async def test_search_one_returns_a_querys_sources_in_rank_order(api: FakeSearchAPI, http: httpx.AsyncClient, recorder: EventRecorder) -> None:
    registry = SourceRegistry()
    registry.add_results([])
    api.set_results("brave", lambda query: hits("https://b.org/2", "https://a.org/1") if query == "second" else hits("https://a.org/1"))
    router = make_router(api, http, recorder, providers=["brave"], registry=registry)
    await router.search_one(SearchQuery(text="first"))
    results = await router.search_one(SearchQuery(text="second"))
    assert [(result.id, result.url) for result in results] == [("s2", "https://b.org/2"), ("s1", "https://a.org/1")]
    assert router.registry is registry


# -- answers as they come -------------------------------------------------------------------------------------------


async def test_each_query_s_sources_are_handed_over_as_soon_as_it_and_those_before_it_answered(
    api: FakeSearchAPI, http: httpx.AsyncClient, recorder: EventRecorder,
) -> None:
    api.set_results("brave", lambda query: hits(*(f"https://{word}.example/" for word in query.split()[:2])))
    slow_second = api.hold("second")
    slow_first = api.hold("first")
    router = make_router(api, http, recorder, providers=["brave"])
    handed: list[list[str]] = []
    queries = [SearchQuery(text="first alpha"), SearchQuery(text="second beta"), SearchQuery(text="third gamma")]
    searching = asyncio.create_task(router.search(queries, on_found=lambda found: handed.append(
        [f"{source.id} {source.url}" for source in found])))

    await wait_until(lambda: len(api.requests("brave")) == 3)
    slow_first.set()
    # The first query answered: its sources are handed over while the second still searches (the third, answered
    # already, waits for the second, so that ids follow the queries' order whatever the timing).
    await wait_until(lambda: handed)
    assert handed == [["s1 https://first.example/", "s2 https://alpha.example/"]]
    assert not searching.done()
    slow_second.set()
    found = await searching
    assert handed[1:] == [["s3 https://second.example/", "s4 https://beta.example/"],
                          ["s5 https://third.example/", "s6 https://gamma.example/"]]
    assert [source.id for source in found] == ["s1", "s2", "s3", "s4", "s5", "s6"]


async def wait_until(condition: Callable[[], object], timeout: float = 5.0) -> None:
    """Until `condition()` is true, letting the loop run the fake and the router meanwhile."""
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)
