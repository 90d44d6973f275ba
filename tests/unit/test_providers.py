"""Each search provider against the wire-level fake (in-process, and once over loopback): shapes, errors, parameters."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from ddgs.exceptions import DDGSException, RatelimitException, TimeoutException

from research.models import SearchQuery
from research.providers import (
    BraveProvider,
    DuckDuckGoProvider,
    FirecrawlProvider,
    SearchConfig,
    SearchProvider,
    SearchProviderError,
    SearxngProvider,
    build_provider,
)
from research.providers.base import parse_published, parse_retry_after
from tests.fakes.clock import FakeClock
from tests.fakes.search_api import FakeSearchAPI

HTTP_PROVIDERS = ["tavily", "brave", "exa", "searxng", "firecrawl"]
HTML_ERROR_PAGE = "<!DOCTYPE html><html><head><title>502 Bad Gateway</title></head><body>cloudflare</body></html>"


def provider_for(name: str, api: FakeSearchAPI, http: httpx.AsyncClient, **overrides: Any) -> SearchProvider:
    if name == "firecrawl":  # the fake leaves Firecrawl unconfigured unless asked, as it is also the scrape fallback
        overrides = {"firecrawl_api_key": api.api_keys["firecrawl"], **overrides}
    return build_provider(name, api.search_config(**overrides), http=http)  # type: ignore[arg-type]


async def failure_of(provider: SearchProvider, query: SearchQuery | None = None) -> SearchProviderError:
    with pytest.raises(SearchProviderError) as caught:
        await provider.search(query or SearchQuery(text="anything"))
    return caught.value


# -- shared matrix: every HTTP provider -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", HTTP_PROVIDERS)
async def test_results_are_normalised_to_search_results(name: str, api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    api.set_results(name, [
        {"url": "https://a.org/one", "title": "One", "snippet": "first", "score": 0.9},
        {"url": "https://b.org/two", "title": "Two", "snippet": "second", "score": 0.5},
    ])
    results = await provider_for(name, api, http).search(SearchQuery(text="solar panels"))
    assert [(result.provider, result.url, result.title) for result in results] == [
        (name, "https://a.org/one", "One"), (name, "https://b.org/two", "Two"),
    ]
    assert all(result.id == "" for result in results), "ids are the run's to assign"
    if name != "exa":  # Exa is asked for no page text, so it has no snippet
        assert [result.snippet for result in results] == ["first", "second"]
    if name not in ("brave", "firecrawl"):  # Brave and Firecrawl report no relevance score
        assert results[0].score == pytest.approx(0.9)


@pytest.mark.parametrize(
    ("name", "published", "expected"),
    [
        ("tavily", "Mon, 15 Jan 2024 10:00:00 GMT", dt.date(2024, 1, 15)),
        ("brave", "2024-01-15T10:00:00", dt.date(2024, 1, 15)),
        ("exa", "2024-01-15T00:00:00.000Z", dt.date(2024, 1, 15)),
        ("searxng", "2024-01-15T10:00:00+02:00", dt.date(2024, 1, 15)),
    ],
)
async def test_published_dates_are_read_in_each_providers_format(
    name: str, published: str, expected: dt.date, api: FakeSearchAPI, http: httpx.AsyncClient,
) -> None:
    api.set_results(name, [{"url": "https://a.org/x", "title": "X", "published": published}])
    [result] = await provider_for(name, api, http).search(SearchQuery(text="q"))
    assert result.published == expected


@pytest.mark.parametrize("name", HTTP_PROVIDERS)
async def test_hits_without_url_are_skipped_and_null_fields_tolerated(
    name: str, api: FakeSearchAPI, http: httpx.AsyncClient,
) -> None:
    api.set_results(name, [
        {"url": None, "title": "no url"},
        {"url": "javascript:alert(1)", "title": "not http"},
        {"url": "https://a.org/x", "title": None, "snippet": None, "score": None, "published": None},
    ])
    [result] = await provider_for(name, api, http).search(SearchQuery(text="q"))
    assert (result.url, result.title, result.snippet, result.score, result.published) == (
        "https://a.org/x", "https://a.org/x", "", None, None,
    )


@pytest.mark.parametrize("name", HTTP_PROVIDERS)
async def test_empty_results_are_an_empty_list(name: str, api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    api.set_results(name, [])
    assert await provider_for(name, api, http).search(SearchQuery(text="q")) == []


@pytest.mark.parametrize("name", HTTP_PROVIDERS)
async def test_html_page_with_status_200_is_malformed(name: str, api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    api.set_response(name, body=HTML_ERROR_PAGE, status=200)
    error = await failure_of(provider_for(name, api, http))
    assert (error.provider, error.kind, error.retryable) == (name, "malformed", False)


@pytest.mark.parametrize("name", HTTP_PROVIDERS)
@pytest.mark.parametrize("body", [{}, [], None, {"results": "nope", "type": "search", "web": {"results": "nope"}}])
async def test_json_of_the_wrong_shape_is_malformed(name: str, body: Any, api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    api.set_response(name, body=body)
    assert (await failure_of(provider_for(name, api, http))).kind == "malformed"


@pytest.mark.parametrize("name", HTTP_PROVIDERS)
async def test_401_is_an_auth_failure(name: str, api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    api.set_failure(name, status=401)
    error = await failure_of(provider_for(name, api, http))
    assert (error.kind, error.status, error.retryable) == ("auth", 401, False)
    assert error.reason == "authentication failed (HTTP 401)"


@pytest.mark.parametrize("name", HTTP_PROVIDERS)
async def test_429_is_rate_limited_with_retry_after_seconds(name: str, api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    api.set_failure(name, status=429, headers={"Retry-After": "7"})
    error = await failure_of(provider_for(name, api, http))
    assert (error.kind, error.status, error.retry_after, error.retryable) == ("rate_limited", 429, 7.0, True)
    assert error.reason == "rate limited"


@pytest.mark.parametrize("name", HTTP_PROVIDERS)
async def test_429_without_retry_after_has_no_hint(name: str, api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    api.set_failure(name, status=429)
    error = await failure_of(provider_for(name, api, http))
    assert (error.kind, error.retry_after) == ("rate_limited", None)


@pytest.mark.parametrize("name", HTTP_PROVIDERS)
@pytest.mark.parametrize("status", [500, 502, 503])
async def test_5xx_is_a_retryable_server_error(name: str, status: int, api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    api.set_failure(name, status=status, body=HTML_ERROR_PAGE)
    error = await failure_of(provider_for(name, api, http))
    assert (error.kind, error.status, error.retryable) == ("server", status, True)


@pytest.mark.parametrize("name", HTTP_PROVIDERS)
async def test_other_4xx_is_a_rejected_request(name: str, api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    api.set_failure(name, status=422, body={"error": "bad parameter"})
    error = await failure_of(provider_for(name, api, http))
    assert (error.kind, error.status, error.retryable) == ("rejected", 422, False)


@pytest.mark.parametrize("name", HTTP_PROVIDERS)
@pytest.mark.parametrize(
    ("transport_error", "kind"),
    [(httpx.ReadTimeout("slow"), "timeout"), (httpx.ConnectTimeout("slow"), "timeout"), (httpx.ConnectError("refused"), "unavailable")],
)
async def test_transport_failures_are_timeouts_or_unavailable(
    name: str, transport_error: Exception, kind: str, api: FakeSearchAPI,
) -> None:
    def fail(request: httpx.Request) -> httpx.Response:
        raise transport_error

    async with httpx.AsyncClient(transport=httpx.MockTransport(fail)) as http:
        error = await failure_of(provider_for(name, api, http))
    assert error.kind == kind


@pytest.mark.parametrize("name", ["tavily", "brave", "exa", "firecrawl"])
async def test_keyed_providers_send_their_key(name: str, api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    await provider_for(name, api, http).search(SearchQuery(text="q"))
    headers = api.requests(name)[-1].headers
    sent = {"tavily": headers.get("authorization"), "brave": headers.get("x-subscription-token"),
            "exa": headers.get("x-api-key"), "firecrawl": headers.get("authorization")}
    assert sent[name] == {"tavily": "Bearer tvly-fake-key", "brave": "brave-fake-key", "exa": "exa-fake-key",
                          "firecrawl": "Bearer fc-fake-key"}[name]


@pytest.mark.parametrize("name", ["tavily", "exa"])
async def test_providers_leave_the_shared_client_headers_alone(name: str, api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    before = dict(http.headers)
    await provider_for(name, api, http).search(SearchQuery(text="q"))
    assert dict(http.headers) == before


@pytest.mark.parametrize("name", ["tavily", "brave", "exa", "firecrawl"])
async def test_wrong_key_is_an_auth_failure(name: str) -> None:
    api = FakeSearchAPI(api_keys={name: "the-right-key"})
    async with api.client() as client:
        provider = build_provider(name, api.search_config(**{f"{name}_api_key": "a-wrong-key"}), http=client)  # type: ignore[arg-type]
        assert (await failure_of(provider)).kind == "auth"


@pytest.mark.parametrize("name", ["tavily", "brave", "exa", "firecrawl"])
@pytest.mark.parametrize("key", [None, "", "   "])
async def test_missing_or_blank_key_means_not_configured(name: str, key: str | None, http: httpx.AsyncClient) -> None:
    config = SearchConfig(**{f"{name}_api_key": key})
    assert not config.is_configured(name)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not configured"):
        build_provider(name, config, http=http)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def loopback_api() -> Iterator[FakeSearchAPI]:
    with FakeSearchAPI() as api:
        yield api


@pytest.mark.parametrize("name", HTTP_PROVIDERS)
async def test_each_provider_works_over_a_loopback_socket(name: str, loopback_api: FakeSearchAPI) -> None:
    loopback_api.reset()
    assert loopback_api.base_url(name).startswith("http://127.0.0.1:")
    async with httpx.AsyncClient() as http:
        results = await provider_for(name, loopback_api, http).search(SearchQuery(text="loopback check"))
    assert [result.url for result in results] == [f"https://example.com/loopback-check/{index}" for index in (1, 2, 3)]
    assert len(loopback_api.requests(name)) == 1


# -- Tavily ---------------------------------------------------------------------------------------------------------


async def test_tavily_request_carries_domains_dates_and_count(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    query = SearchQuery(text="heat pumps", max_results=5, blocked_domains=["spam.com"],
                        preferred_domains=["gov.uk"], since=dt.date(2024, 3, 1))
    await provider_for("tavily", api, http).search(query)
    sent = api.last_request_data("tavily")
    assert api.requests("tavily")[-1].path == "/tavily/search"
    assert sent["query"] == "heat pumps"
    assert (sent["max_results"], sent["exclude_domains"], sent["include_domains"]) == (5, ["spam.com"], ["gov.uk"])
    assert (sent["include_domains_mode"], sent["start_date"]) == ("prefer", "2024-03-01")
    assert sent["include_raw_content"] is False and sent["include_answer"] is False


async def test_tavily_restricts_to_preferred_domains_when_configured(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    provider = provider_for("tavily", api, http, restrict_to_preferred=True)
    await provider.search(SearchQuery(text="q", preferred_domains=["gov.uk"]))
    assert api.last_request_data("tavily")["include_domains_mode"] == "restrict"


async def test_tavily_provider_refuses_to_run_keyless(http: httpx.AsyncClient) -> None:
    from research.providers import TavilyProvider

    with pytest.raises(ValueError):
        TavilyProvider(http, api_key="")


# -- Brave ----------------------------------------------------------------------------------------------------------


async def test_brave_request_uses_site_operators_freshness_and_capped_count(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    provider = BraveProvider(http, api_key="brave-fake-key", base_url=api.base_url("brave"), today=lambda: dt.date(2024, 6, 30))
    await provider.search(SearchQuery(text="heat pumps", max_results=50, blocked_domains=["spam.com", "junk.net"],
                                      since=dt.date(2024, 6, 1)))
    request = api.requests("brave")[-1]
    assert (request.method, request.path) == ("GET", "/brave/res/v1/web/search")
    assert request.query["q"] == "heat pumps -site:spam.com -site:junk.net"
    assert (request.query["count"], request.query["freshness"]) == ("20", "2024-06-01to2024-06-30")
    assert request.headers["accept"] == "application/json"


async def test_brave_extra_snippets_are_kept(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    api.set_results("brave", [{"url": "https://a.org/x", "title": "X", "snippet": "main", "extra_snippets": ["more", "", 3]}])
    [result] = await provider_for("brave", api, http).search(SearchQuery(text="q"))
    assert (result.snippet, result.extra_snippets) == ("main", ["more"])


async def test_brave_reply_without_web_section_is_empty(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    api.set_response("brave", body={"type": "search", "query": {"original": "q"}, "mixed": {"type": "mixed", "main": []}})
    assert await provider_for("brave", api, http).search(SearchQuery(text="q")) == []


async def test_brave_429_without_retry_after_uses_the_rate_limit_reset_header(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    api.set_failure("brave", status=429, headers={"X-RateLimit-Limit": "1, 2000", "X-RateLimit-Remaining": "0, 1500",
                                                  "X-RateLimit-Reset": "1, 1419704"})
    error = await failure_of(provider_for("brave", api, http))
    assert (error.kind, error.retry_after) == ("rate_limited", 1.0)


async def test_brave_spent_monthly_quota_asks_for_a_long_wait(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    api.set_failure("brave", status=429, headers={"X-RateLimit-Remaining": "1, 0", "X-RateLimit-Reset": "1, 1419704"})
    assert (await failure_of(provider_for("brave", api, http))).retry_after == 1419704.0


async def test_brave_retry_after_header_wins_over_rate_limit_reset(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    api.set_failure("brave", status=429, headers={"Retry-After": "3", "X-RateLimit-Reset": "1, 99"})
    assert (await failure_of(provider_for("brave", api, http))).retry_after == 3.0


# -- Exa ------------------------------------------------------------------------------------------------------------


async def test_exa_asks_for_no_page_text_and_passes_filters(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    query = SearchQuery(text="heat pumps", max_results=6, blocked_domains=["spam.com"], preferred_domains=["gov.uk"],
                        since=dt.date(2024, 3, 1))
    await provider_for("exa", api, http).search(query)
    sent = api.last_request_data("exa")
    assert api.requests("exa")[-1].path == "/exa/search"
    assert "contents" not in sent and "text" not in sent
    assert (sent["query"], sent["numResults"], sent["excludeDomains"]) == ("heat pumps", 6, ["spam.com"])
    assert sent["startPublishedDate"] == "2024-03-01"
    assert "includeDomains" not in sent, "preferring a domain must not restrict Exa to it"


async def test_exa_restricts_to_preferred_domains_when_configured(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    await provider_for("exa", api, http, restrict_to_preferred=True).search(SearchQuery(text="q", preferred_domains=["gov.uk"]))
    assert api.last_request_data("exa")["includeDomains"] == ["gov.uk"]


async def test_exa_null_results_are_malformed(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    api.set_response("exa", body={"requestId": "r", "results": None})
    assert (await failure_of(provider_for("exa", api, http))).kind == "malformed"


# -- SearXNG --------------------------------------------------------------------------------------------------------


async def test_searxng_request_asks_for_json_with_a_time_range(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    provider = SearxngProvider(http, base_url=api.base_url("searxng"), today=lambda: dt.date(2024, 6, 30))
    await provider.search(SearchQuery(text="heat pumps", since=dt.date(2024, 6, 25)))
    request = api.requests("searxng")[-1]
    assert (request.method, request.path) == ("GET", "/searxng/search")
    assert (request.query["q"], request.query["format"], request.query["time_range"]) == ("heat pumps", "json", "week")


async def test_searxng_empty_results_with_unresponsive_engines_is_a_failure(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    api.set_response("searxng", body={"query": "q", "number_of_results": 0, "results": [], "answers": [],
                                      "unresponsive_engines": [["google", "timeout"], ["bing", "CAPTCHA"]]})
    error = await failure_of(provider_for("searxng", api, http))
    assert error.kind == "unavailable"
    assert "google: timeout" in error.detail and "bing: CAPTCHA" in error.detail


async def test_searxng_results_with_some_unresponsive_engines_are_kept(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    api.set_response("searxng", body={"query": "q", "results": [{"url": "https://a.org/x", "title": "X", "content": "c"}],
                                      "unresponsive_engines": [["google", "timeout"]]})
    assert [result.url for result in await provider_for("searxng", api, http).search(SearchQuery(text="q"))] == ["https://a.org/x"]


async def test_searxng_403_says_json_output_is_disabled(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    api.set_failure("searxng", status=403)
    error = await failure_of(provider_for("searxng", api, http))
    assert (error.kind, error.status) == ("rejected", 403)
    assert "JSON output" in error.detail


async def test_searxng_results_are_cut_to_the_requested_count(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    api.set_results("searxng", [{"url": f"https://a.org/{index}", "title": str(index)} for index in range(30)])
    assert len(await provider_for("searxng", api, http).search(SearchQuery(text="q", max_results=4))) == 4


# -- Firecrawl search ------------------------------------------------------------------------------------------------


async def test_firecrawl_request_asks_for_markdown_with_domains_and_time_filter(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    provider = FirecrawlProvider(http, api_key="fc-fake-key", base_url=api.base_url("firecrawl"),
                                 today=lambda: dt.date(2024, 6, 30))
    await provider.search(SearchQuery(text="heat pumps", max_results=7, blocked_domains=["spam.com"],
                                      preferred_domains=["gov.uk"], since=dt.date(2024, 6, 25)))
    request = api.requests("firecrawl")[-1]
    assert (request.method, request.path) == ("POST", "/firecrawl/v2/search")
    sent = api.last_request_data("firecrawl")
    assert (sent["query"], sent["limit"], sent["sources"]) == ("heat pumps", 7, ["web"])
    assert sent["scrapeOptions"] == {"formats": ["markdown"], "onlyMainContent": True, "excludeTags": ["iframe"]}
    assert (sent["excludeDomains"], sent["tbs"]) == (["spam.com"], "qdr:w")
    assert "includeDomains" not in sent, "preferring a domain must not restrict Firecrawl to it"


async def test_firecrawl_restricts_to_preferred_domains_when_configured(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    provider = provider_for("firecrawl", api, http, restrict_to_preferred=True)
    await provider.search(SearchQuery(text="q", preferred_domains=["gov.uk"], blocked_domains=["spam.com"]))
    sent = api.last_request_data("firecrawl")
    assert sent["includeDomains"] == ["gov.uk"] and "excludeDomains" not in sent, "Firecrawl refuses both lists at once"


async def test_firecrawl_markdown_is_kept_as_the_results_text(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    api.set_results("firecrawl", [
        {"url": "https://a.org/x", "title": "X", "snippet": "about x", "markdown": "# X\n\nThe whole page.",
         "published": "2024-01-15T10:00:00Z"},
        {"url": "https://b.org/y", "title": "Y", "snippet": "about y"},
        {"url": "https://c.org/gone", "title": "Gone", "markdown": "# 404 Not Found", "status_code": 404},
    ])
    results = await provider_for("firecrawl", api, http).search(SearchQuery(text="q"))
    assert [(result.url, result.content) for result in results] == [
        ("https://a.org/x", "# X\n\nThe whole page."), ("https://b.org/y", None), ("https://c.org/gone", None),
    ]
    assert (results[0].snippet, results[0].published) == ("about x", dt.date(2024, 1, 15))
    assert "content" not in results[0].model_dump(), "page text is read, never stored with the source"


async def test_firecrawl_scraped_hit_without_top_level_fields_reads_its_metadata(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    api.set_response("firecrawl", body={"success": True, "data": {"web": [
        {"markdown": "text", "metadata": {"sourceURL": "https://a.org/x", "url": "https://a.org/x", "title": "From metadata",
                                          "statusCode": 200}},
    ]}})
    [result] = await provider_for("firecrawl", api, http).search(SearchQuery(text="q"))
    assert (result.url, result.title, result.content) == ("https://a.org/x", "From metadata", "text")


async def test_firecrawl_reply_without_web_results_is_empty(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    api.set_response("firecrawl", body={"success": True, "data": {}})
    assert await provider_for("firecrawl", api, http).search(SearchQuery(text="q")) == []


async def test_firecrawl_unsuccessful_reply_is_rejected_with_its_error(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    api.set_response("firecrawl", body={"success": False, "error": "Invalid query"})
    error = await failure_of(provider_for("firecrawl", api, http))
    assert (error.kind, error.detail) == ("rejected", "Invalid query")


async def test_firecrawl_402_is_spent_credits_that_disable_it(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    api.set_failure("firecrawl", status=402)
    error = await failure_of(provider_for("firecrawl", api, http))
    assert (error.kind, error.status, error.retryable, error.disables_provider) == ("payment", 402, False, True)


# -- DuckDuckGo (ddgs, through an injected callable) ----------------------------------------------------------------


class RecordingDdgs:
    """A stand-in for `DDGS().text` that records its calls and the thread it ran on."""

    def __init__(self, answer: Any = None, error: Exception | None = None, held_until: threading.Event | None = None) -> None:
        self.answer = answer if answer is not None else []
        self.error = error
        self.held_until = held_until
        self.calls: list[dict[str, Any]] = []
        self.threads: list[int] = []

    def __call__(self, query: str, *, max_results: int, timelimit: str | None) -> Any:
        self.calls.append({"query": query, "max_results": max_results, "timelimit": timelimit})
        self.threads.append(threading.get_ident())
        if self.held_until is not None:
            self.held_until.wait(30)
        if self.error is not None:
            raise self.error
        return self.answer


async def test_duckduckgo_normalises_ddgs_results_off_the_event_loop() -> None:
    ddgs = RecordingDdgs([{"title": "X", "href": "https://a.org/x", "body": "snippet"}, {"title": "no link", "href": None}])
    provider = DuckDuckGoProvider(search_function=ddgs, today=lambda: dt.date(2024, 6, 30))
    results = await provider.search(SearchQuery(text="heat pumps", max_results=5, blocked_domains=["spam.com"],
                                                since=dt.date(2024, 6, 10)))
    assert [(result.provider, result.url, result.title, result.snippet) for result in results] == [
        ("duckduckgo", "https://a.org/x", "X", "snippet"),
    ]
    assert ddgs.calls == [{"query": "heat pumps -site:spam.com", "max_results": 5, "timelimit": "m"}]
    assert ddgs.threads != [threading.get_ident()]


async def test_duckduckgo_no_results_exception_is_an_empty_list() -> None:
    provider = DuckDuckGoProvider(search_function=RecordingDdgs(error=DDGSException("No results found.")))
    assert await provider.search(SearchQuery(text="q")) == []


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (RatelimitException("202 Ratelimit"), "rate_limited"),
        (TimeoutException("timed out"), "timeout"),
        (DDGSException("all engines failed"), "unavailable"),
        (RuntimeError("boom"), "unavailable"),
    ],
)
async def test_duckduckgo_errors_map_to_provider_errors(error: Exception, kind: str) -> None:
    provider = DuckDuckGoProvider(search_function=RecordingDdgs(error=error))
    assert (await failure_of(provider)).kind == kind


async def test_duckduckgo_that_does_not_answer_in_time_is_a_timeout() -> None:
    clock = FakeClock()
    released = threading.Event()
    provider = DuckDuckGoProvider(search_function=RecordingDdgs(held_until=released), timeout_seconds=20.0, sleep=clock.sleep)
    try:
        error = await failure_of(provider)
    finally:
        released.set()
    assert (error.kind, error.detail) == ("timeout", "no answer in 20 s")
    assert clock.sleeps == [20.0]


async def test_duckduckgo_non_list_answer_is_malformed() -> None:
    provider = DuckDuckGoProvider(search_function=RecordingDdgs(answer={"results": []}))
    assert (await failure_of(provider)).kind == "malformed"


# -- helpers --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "seconds"),
    [("5", 5.0), ("0.5", 0.5), ("-3", 0.0), ("", None), (None, None), ("soon", None),
     ("Wed, 21 Oct 2015 07:28:30 GMT", 30.0), ("Wed, 21 Oct 2015 07:27:00 GMT", 0.0)],
)
def test_retry_after_reads_seconds_and_http_dates(header: str | None, seconds: float | None) -> None:
    now = dt.datetime(2015, 10, 21, 7, 28, 0, tzinfo=dt.timezone.utc)
    assert parse_retry_after(header, now=now) == seconds


@pytest.mark.parametrize(
    ("value", "date"),
    [("2024-01-15", dt.date(2024, 1, 15)), ("2024-01-15T23:59:59Z", dt.date(2024, 1, 15)),
     ("2024-01-15T10:00:00.123456+05:00", dt.date(2024, 1, 15)), ("Mon, 15 Jan 2024 10:00:00 GMT", dt.date(2024, 1, 15)),
     ("3 days ago", None), ("", None), (None, None), (20240115, None)],
)
def test_published_dates_parse_or_are_unknown(value: Any, date: dt.date | None) -> None:
    assert parse_published(value) == date


def test_search_config_reads_comma_lists_secrets_and_trailing_slashes() -> None:
    from pydantic import SecretStr

    config = SearchConfig(providers="Brave, searxng", brave_api_key=SecretStr("k"), brave_base_url="http://127.0.0.1:9/brave/",
                          searxng_url="  ")
    assert (config.providers, config.brave_api_key, config.brave_base_url, config.searxng_url) == (
        ["brave", "searxng"], "k", "http://127.0.0.1:9/brave", None,
    )
    assert SearchConfig(providers=["auto"]).providers == "auto"
    with pytest.raises(ValueError):
        SearchConfig(providers="google")
