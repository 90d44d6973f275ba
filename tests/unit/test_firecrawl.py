"""Firecrawl's scrape against the wire fake (retries, Retry-After within the page deadline, empty pages, the shared
concurrency bound), and the fallback that decides which pages it may read: never one the safe fetcher refuses, never
one Firecrawl says ended where the safe fetcher would not go, and never a page that merely timed out."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from research.events import ProviderCall, ProviderError
from research.fetch import FetchBudget, FetchConfig, SafeFetcher, build_fetch_client
from research.models import FetchResult, SearchQuery, SearchResult
from research.netguard import AllowList
from research.providers import SearchConfig, SearchProviderError, SearchRouter, build_router, build_scraper
from research.providers.firecrawl import FirecrawlProvider, FirecrawlScraper
from research.scrape_fallback import FallbackFetcher, is_script_shell, worth_scraping
from research.sources import SourceRegistry
from tests.fakes.clock import FakeClock
from tests.fakes.event_recorder import EventRecorder
from tests.fakes.resolver import DictResolver
from tests.fakes.search_api import FIRECRAWL_SCRAPE, FakeSearchAPI, firecrawl_scrape_body, firecrawl_search_body
from tests.fakes.web import FakeWeb, Page

PAGE_URL = "https://walled.example/article"
MARKDOWN = "# Tidal turbines\n\nThe array delivered 4,321 kilowatt hours during its trial."
HTML_ERROR_PAGE = "<!DOCTYPE html><html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>"
SHELL_HTML = (b'<!doctype html><html><head><title>App</title><script src="/app.js"></script></head>'
              b'<body><div id="root"></div><noscript>You need to enable JavaScript to run this app.</noscript></body></html>')
ARTICLE_HTML = ("<html><body><article>" + "<p>" + "Tidal streams turn the rotor blades slowly and steadily. " * 30
                + "</p></article></body></html>").encode()


def scraper_for(api: FakeSearchAPI, http: httpx.AsyncClient, clock: FakeClock | None = None, **overrides: Any) -> FirecrawlScraper:
    clock = clock or FakeClock()
    settings: dict[str, Any] = {"api_key": "fc-fake-key", "base_url": api.base_url("firecrawl"), "sleep": clock.sleep,
                                "clock": clock}
    settings.update(overrides)
    return FirecrawlScraper(http, **settings)


async def scrape_failure(scraper: FirecrawlScraper) -> SearchProviderError:
    with pytest.raises(SearchProviderError) as caught:
        await scraper.scrape(PAGE_URL)
    return caught.value


# -- the scraper on the wire ------------------------------------------------------------------------------------------


async def test_scrape_returns_the_pages_markdown_asking_for_main_content(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    api.set_scraped_pages({PAGE_URL: MARKDOWN})
    page = await scraper_for(api, http).scrape(PAGE_URL)
    assert (page.url, page.markdown, page.status_code) == (PAGE_URL, MARKDOWN, 200)
    request = api.requests(FIRECRAWL_SCRAPE)[-1]
    assert (request.method, request.path, request.headers["authorization"]) == ("POST", "/firecrawl/v2/scrape", "Bearer fc-fake-key")
    sent = json.loads(request.body)
    assert (sent["url"], sent["formats"], sent["onlyMainContent"]) == (PAGE_URL, ["markdown"], True)
    assert sent["timeout"] == 30_000, "Firecrawl is told the page's deadline"


async def test_429_with_retry_after_waits_that_long_then_scrapes(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    api.set_scraped_pages({PAGE_URL: MARKDOWN})
    api.set_failure(FIRECRAWL_SCRAPE, status=429, headers={"Retry-After": "4"})
    clock = FakeClock()
    page = await scraper_for(api, http, clock).scrape(PAGE_URL)
    assert page.markdown == MARKDOWN
    assert clock.sleeps == [4.0]
    assert json.loads(api.requests(FIRECRAWL_SCRAPE)[-1].body)["timeout"] == 26_000, "the wait came out of the deadline"


async def test_429_without_retry_after_backs_off(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    api.set_scraped_pages({PAGE_URL: MARKDOWN})
    api.set_failure(FIRECRAWL_SCRAPE, status=429, times=2)
    clock = FakeClock()
    assert (await scraper_for(api, http, clock).scrape(PAGE_URL)).markdown == MARKDOWN
    assert clock.sleeps == [1.0, 2.0]


async def test_retry_after_past_the_page_deadline_gives_up_without_waiting(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    api.set_failure(FIRECRAWL_SCRAPE, status=429, headers={"Retry-After": "45"})
    clock = FakeClock()
    error = await scrape_failure(scraper_for(api, http, clock, page_timeout_seconds=30))
    assert (error.kind, error.retry_after) == ("rate_limited", 45.0)
    assert clock.sleeps == [] and len(api.requests(FIRECRAWL_SCRAPE)) == 1


async def test_an_empty_page_is_asked_for_once_more(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    api.set_scraped_pages({PAGE_URL: MARKDOWN})
    api.set_response(FIRECRAWL_SCRAPE, body=firecrawl_scrape_body(PAGE_URL, ""), times=1)
    assert (await scraper_for(api, http).scrape(PAGE_URL)).markdown == MARKDOWN
    assert len(api.requests(FIRECRAWL_SCRAPE)) == 2


async def test_a_scrape_asks_for_no_page_actions_and_leaves_frames_out(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    api.set_scraped_pages({PAGE_URL: MARKDOWN})
    await scraper_for(api, http).scrape(PAGE_URL)
    sent = json.loads(api.requests(FIRECRAWL_SCRAPE)[-1].body)
    assert not {"actions", "headers", "waitFor"} & set(sent), "Firecrawl is asked to do nothing but read the page"
    assert sent["excludeTags"] == ["iframe"], "a frame's page, whose URL Firecrawl never reports, is left out"


async def test_a_scrape_keeps_where_firecrawl_says_the_page_ended(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    api.set_scraped_pages({PAGE_URL: MARKDOWN})
    api.set_scrape_endings({PAGE_URL: "https://walled.example/article/"})
    page = await scraper_for(api, http).scrape(PAGE_URL)
    assert page.reported_urls == ("https://walled.example/article/", PAGE_URL), "where it ended first, then sourceURL"


async def test_a_scrape_reply_that_does_not_say_where_the_page_ended_is_malformed(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    body = firecrawl_scrape_body(PAGE_URL, MARKDOWN)
    del body["data"]["metadata"]["url"]
    api.set_response(FIRECRAWL_SCRAPE, body=body, times=None)
    error = await scrape_failure(scraper_for(api, http))
    assert (error.kind, error.detail) == ("malformed", "the reply does not say where the page ended")


async def test_a_page_empty_twice_is_an_empty_result(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    api.set_response(FIRECRAWL_SCRAPE, body=firecrawl_scrape_body(PAGE_URL, "  \n"), times=None)
    error = await scrape_failure(scraper_for(api, http))
    assert (error.kind, error.reason) == ("empty", "empty result")
    assert len(api.requests(FIRECRAWL_SCRAPE)) == 2


async def test_a_page_that_answered_firecrawl_with_an_error_is_not_its_text(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    error = await scrape_failure(scraper_for(api, http))  # the fake answers unknown URLs as a 404 page
    assert error.kind == "rejected" and "HTTP 404" in error.detail


@pytest.mark.parametrize(("status", "kind"), [(401, "auth"), (402, "payment")])
async def test_a_rejected_key_or_spent_credits_fail_at_once(status: int, kind: str, api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    api.set_failure(FIRECRAWL_SCRAPE, status=status, times=None)
    clock = FakeClock()
    error = await scrape_failure(scraper_for(api, http, clock))
    assert (error.kind, error.disables_provider) == (kind, True)
    assert clock.sleeps == [] and len(api.requests(FIRECRAWL_SCRAPE)) == 1


async def test_5xx_is_retried_then_reported(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    api.set_failure(FIRECRAWL_SCRAPE, status=502, body=HTML_ERROR_PAGE, times=None)
    error = await scrape_failure(scraper_for(api, http, max_attempts=3))
    assert (error.kind, error.status) == ("server", 502)
    assert len(api.requests(FIRECRAWL_SCRAPE)) == 3


async def test_html_instead_of_json_is_malformed(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    api.set_response(FIRECRAWL_SCRAPE, body=HTML_ERROR_PAGE, times=None)
    assert (await scrape_failure(scraper_for(api, http))).kind == "malformed"


async def test_scrapes_and_searches_share_one_bound_on_calls_in_flight() -> None:
    in_flight, most_in_flight, entered = 0, 0, 0
    two_entered, release = asyncio.Event(), asyncio.Event()

    async def firecrawl(request: httpx.Request) -> httpx.Response:
        nonlocal in_flight, most_in_flight, entered
        in_flight += 1
        entered += 1
        most_in_flight = max(most_in_flight, in_flight)
        if entered == 2:
            two_entered.set()
        await release.wait()
        in_flight -= 1
        if request.url.path == "/v2/search":
            return httpx.Response(200, json=firecrawl_search_body([{"url": PAGE_URL, "title": "T"}], {"limit": 5}))
        return httpx.Response(200, json=firecrawl_scrape_body(PAGE_URL, MARKDOWN))

    async with httpx.AsyncClient(transport=httpx.MockTransport(firecrawl)) as http:
        scraper = FirecrawlScraper(http, api_key="fc-key", base_url="https://firecrawl.test", max_concurrency=2)
        provider = FirecrawlProvider(http, api_key="fc-key", base_url="https://firecrawl.test", max_concurrency=2)
        calls = asyncio.gather(provider.search(SearchQuery(text="q")), provider.search(SearchQuery(text="r")),
                               *(scraper.scrape(f"{PAGE_URL}/{index}") for index in range(3)))
        await two_entered.wait()
        release.set()
        answers = await calls
    assert len(answers) == 5
    assert most_in_flight == 2


async def test_search_markdown_of_a_page_firecrawl_was_led_off_the_hits_origin_is_not_kept(
    api: FakeSearchAPI, http: httpx.AsyncClient,
) -> None:
    api.set_results("firecrawl", [
        {"url": "https://a.org/x", "title": "X", "markdown": CREDENTIALS, "final_url": "http://169.254.169.254/latest/"},
        {"url": "https://c.org/z", "title": "Z", "markdown": CREDENTIALS, "final_url": "https://elsewhere.example/z"},
        {"url": "http://b.org/y", "title": "Y", "markdown": MARKDOWN, "final_url": "https://b.org/y"},
    ])
    provider = FirecrawlProvider(http, api_key="fc-fake-key", base_url=api.base_url("firecrawl"))
    results = await provider.search(SearchQuery(text="q"))
    assert [(result.url, result.content) for result in results] == [
        ("https://a.org/x", None), ("https://c.org/z", None), ("http://b.org/y", MARKDOWN),
    ], "only a page that stayed on its hit's origin (an upgrade to https included) keeps its text"


def test_the_scraper_exists_only_when_firecrawl_has_a_key(http: httpx.AsyncClient) -> None:
    assert build_scraper(SearchConfig(), http=http) is None
    assert isinstance(build_scraper(SearchConfig(firecrawl_api_key="fc-key"), http=http), FirecrawlScraper)


# -- which pages are worth scraping -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("result", "worth"),
    [
        (FetchResult(url=PAGE_URL, status="failed", reason="HTTP 403", http_status=403), True),
        (FetchResult(url=PAGE_URL, status="failed", reason="HTTP 429", http_status=429), True),
        (FetchResult(url=PAGE_URL, status="failed", reason="timed out after 10 s"), False),
        (FetchResult(url=PAGE_URL, status="failed", reason="network timeout (ReadTimeout)"), False),
        (FetchResult(url=PAGE_URL, status="failed", reason="HTTP 404", http_status=404), False),
        (FetchResult(url=PAGE_URL, status="failed", reason="could not resolve walled.example"), False),
        (FetchResult(url=PAGE_URL, status="refused", reason="private address 10.0.0.1 (resolved from walled.example)"), False),
        (FetchResult(url=PAGE_URL, status="refused", reason="scheme ftp not allowed"), False),
        (FetchResult(url=PAGE_URL, status="skipped", reason="disallowed by robots.txt"), False),
        (FetchResult(url=PAGE_URL, status="skipped", reason="fetch budget spent"), False),
    ],
)
def test_only_bot_walls_are_worth_scraping_never_a_timeout(result: FetchResult, worth: bool) -> None:
    assert worth_scraping(result) is worth


def test_a_javascript_shell_has_no_main_text_and_an_article_has() -> None:
    assert is_script_shell(PAGE_URL, SHELL_HTML, "text/html; charset=utf-8")
    assert not is_script_shell(PAGE_URL, ARTICLE_HTML, "text/html")
    assert not is_script_shell(PAGE_URL, b"short plain text", "text/plain")


# -- the fallback in front of the safe fetcher ------------------------------------------------------------------------


class Fallback:
    """A FallbackFetcher wired to the fake web in process, the wire fake's Firecrawl, and recorders for its calls and
    events."""

    def __init__(self, api: FakeSearchAPI, http: httpx.AsyncClient, site: FakeWeb | httpx.AsyncBaseTransport, *,
                 budget_bytes: int = 10_000_000, may_call: bool = True, robots: bool = False,
                 clock: FakeClock | None = None) -> None:
        self.api = api
        self.calls: list[str] = []
        self.events: list[Any] = []
        self.registry = SourceRegistry()
        config = FetchConfig(respect_robots=robots, allow_private=AllowList(hosts=frozenset({"walled.example"})),
                             page_timeout_seconds=5)
        resolver = DictResolver({"walled.example": ["93.184.216.34"], "shell.example": ["93.184.216.35"],
                                 "elsewhere.example": ["93.184.216.36"], "intranet.example": ["10.1.2.3"]})
        self.budget = FetchBudget(budget_bytes)
        transport = site.transport() if isinstance(site, FakeWeb) else site
        timing: dict[str, Any] = {"clock": clock, "sleep": clock.sleep} if clock is not None else {}
        safe = SafeFetcher(build_fetch_client(config, transport=transport), resolver, config, self.budget, **timing)
        self.fetcher = FallbackFetcher(safe, scraper=scraper_for(api, http), registry=self.registry, emit=self._record,
                                       count_call=self.calls.append, may_call=lambda: may_call)

    async def _record(self, event: Any) -> None:
        self.events.append(event)


def forbidden(body: bytes = b"<html><body>Checking your browser</body></html>") -> Page:
    return Page(body, content_type="text/html", status=403)


def html_page(body: bytes) -> Page:
    return Page(body, content_type="text/html")


async def test_a_bot_walled_page_is_read_through_firecrawl(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    api.set_scraped_pages({PAGE_URL: MARKDOWN})
    fallback = Fallback(api, http, FakeWeb({PAGE_URL: forbidden()}))
    result = await fallback.fetcher.fetch(PAGE_URL)
    assert (result.status, result.content_type, result.body.decode()) == ("ok", "text/markdown; charset=utf-8", MARKDOWN)
    assert result.reason == "read through Firecrawl (HTTP 403)"
    assert fallback.calls == ["firecrawl"], "a scrape is a provider call"
    assert fallback.budget.spent >= len(MARKDOWN.encode()), "its Markdown is charged to the run's bytes"
    assert [type(event) for event in fallback.events][:1] == [ProviderCall]


async def test_a_javascript_shell_is_read_through_firecrawl(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    shell_url = "https://shell.example/app"
    api.set_scraped_pages({shell_url: MARKDOWN})
    result = await Fallback(api, http, FakeWeb({shell_url: html_page(SHELL_HTML)})).fetcher.fetch(shell_url)
    assert (result.status, result.body.decode(), result.reason) == ("ok", MARKDOWN, "read through Firecrawl (no main text)")


async def test_an_article_that_reads_fine_is_never_scraped(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    result = await Fallback(api, http, FakeWeb({PAGE_URL: html_page(ARTICLE_HTML)})).fetcher.fetch(PAGE_URL)
    assert result.ok and result.body == ARTICLE_HTML
    assert api.scraped_urls() == []


@pytest.mark.parametrize("url", ["https://intranet.example/wiki", "http://127.0.0.1/admin", "http://[::1]/x",
                                 "http://169.254.169.254/latest/meta-data/", "ftp://walled.example/file",
                                 "http://shell.example:6379/"])
async def test_urls_the_fetcher_refuses_for_safety_never_reach_firecrawl(url: str, api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    result = await Fallback(api, http, FakeWeb({})).fetcher.fetch(url)
    assert result.status == "refused"
    assert api.scraped_urls() == []


CREDENTIALS = '{"AccessKeyId": "ASIAFAKEKEY", "SecretAccessKey": "fake-secret-from-the-metadata-service"}'


@pytest.mark.parametrize(("ended_at", "why"), [
    ("http://169.254.169.254/latest/meta-data/iam/security-credentials/deepthread", "link-local address 169.254.169.254"),
    ("http://10.0.0.5/admin", "private address 10.0.0.5"),
    ("https://intranet.example/wiki", "private address 10.1.2.3 (resolved from intranet.example)"),
    ("http://[::1]/", "loopback address ::1"),
])
async def test_a_scrape_that_firecrawl_says_ended_at_a_private_address_is_refused_as_unreadable(
    ended_at: str, why: str, api: FakeSearchAPI, http: httpx.AsyncClient,
) -> None:
    api.set_scraped_pages({PAGE_URL: CREDENTIALS})
    api.set_scrape_endings({PAGE_URL: ended_at})  # the walled page redirected Firecrawl there
    fallback = Fallback(api, http, FakeWeb({PAGE_URL: forbidden()}))
    result = await fallback.fetcher.fetch(PAGE_URL)
    assert (result.status, result.body) == ("refused", b""), "the scrape's text is not read"
    assert result.reason == f"HTTP 403; Firecrawl's page ended at {ended_at}, refused: {why}"
    assert api.scraped_urls() == [PAGE_URL]
    assert fallback.budget.spent < len(CREDENTIALS), "nothing of the scrape is charged as read"
    assert any(isinstance(event, ProviderError) and why in event.reason for event in fallback.events)


async def test_a_scrape_that_firecrawl_says_ended_on_another_port_of_a_public_host_is_refused(
    api: FakeSearchAPI, http: httpx.AsyncClient,
) -> None:
    walled = "https://shell.example/walled"
    api.set_scraped_pages({walled: CREDENTIALS})
    api.set_scrape_endings({walled: "https://shell.example:6379/"})
    result = await Fallback(api, http, FakeWeb({walled: forbidden()})).fetcher.fetch(walled)
    assert (result.status, result.body) == ("refused", b"")
    assert "port 6379 not allowed (only 80 and 443) on shell.example" in (result.reason or "")


async def test_a_scrape_that_firecrawl_says_ended_on_another_public_origin_is_refused(
    api: FakeSearchAPI, http: httpx.AsyncClient,
) -> None:
    api.set_scraped_pages({PAGE_URL: MARKDOWN})
    api.set_scrape_endings({PAGE_URL: "https://elsewhere.example/article"})
    result = await Fallback(api, http, FakeWeb({PAGE_URL: forbidden()})).fetcher.fetch(PAGE_URL)
    assert (result.status, result.body) == ("refused", b"")
    assert result.reason == (f"HTTP 403; Firecrawl's page ended at https://elsewhere.example/article, "
                             f"off {PAGE_URL}'s origin")


async def test_a_scrape_that_firecrawl_says_ended_on_a_robots_disallowed_path_is_refused(
    api: FakeSearchAPI, http: httpx.AsyncClient,
) -> None:
    robots = Page(b"User-agent: *\nDisallow: /private\n", content_type="text/plain")
    walled = FakeWeb({"https://walled.example/robots.txt": robots, PAGE_URL: forbidden()})
    api.set_scraped_pages({PAGE_URL: MARKDOWN})
    api.set_scrape_endings({PAGE_URL: "https://walled.example/private/memo"})
    result = await Fallback(api, http, walled, robots=True).fetcher.fetch(PAGE_URL)
    assert (result.status, result.body) == ("refused", b"")
    assert "robots" in (result.reason or "")


async def test_a_scrape_upgraded_from_http_to_https_on_the_same_host_is_read(
    api: FakeSearchAPI, http: httpx.AsyncClient,
) -> None:
    plain = "http://walled.example/article"
    api.set_scraped_pages({plain: MARKDOWN})
    api.set_scrape_endings({plain: PAGE_URL})
    result = await Fallback(api, http, FakeWeb({plain: forbidden()})).fetcher.fetch(plain)
    assert (result.status, result.body.decode()) == ("ok", MARKDOWN)


async def test_a_page_that_outlasts_its_deadline_is_not_sent_to_firecrawl(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    api.set_scraped_pages({PAGE_URL: MARKDOWN})
    stalling = FakeWeb({PAGE_URL: html_page(ARTICLE_HTML)})
    stalling.hold(PAGE_URL)
    try:
        result = await Fallback(api, http, stalling, clock=FakeClock()).fetcher.fetch(PAGE_URL)
    finally:
        stalling.release(PAGE_URL)
    assert (result.status, result.reason) == ("failed", "timed out after 5 s")
    assert api.scraped_urls() == [], "a server that stalls does not get to choose Firecrawl"


async def test_a_network_timeout_is_not_sent_to_firecrawl(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    def stalls(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("the server stopped sending", request=request)

    api.set_scraped_pages({PAGE_URL: MARKDOWN})
    result = await Fallback(api, http, httpx.MockTransport(stalls)).fetcher.fetch(PAGE_URL)
    assert (result.status, result.reason) == ("failed", "network timeout (ReadTimeout)")
    assert api.scraped_urls() == []


async def test_a_robots_disallowed_page_never_reaches_firecrawl(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    robots = Page(b"User-agent: *\nDisallow: /article\n", content_type="text/plain")
    walled = FakeWeb({"https://walled.example/robots.txt": robots, PAGE_URL: forbidden()})
    result = await Fallback(api, http, walled, robots=True).fetcher.fetch(PAGE_URL)
    assert result.status == "skipped" and "robots" in (result.reason or "")
    assert api.scraped_urls() == []


async def test_a_redirect_to_a_private_address_is_neither_followed_nor_scraped(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    redirect = Page(content_type=None, status=302, headers={"location": "https://intranet.example/wiki"})
    result = await Fallback(api, http, FakeWeb({PAGE_URL: redirect})).fetcher.fetch(PAGE_URL)
    assert result.status == "refused"
    assert api.scraped_urls() == []


async def test_no_scrape_once_the_search_budget_is_spent(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    fallback = Fallback(api, http, FakeWeb({PAGE_URL: forbidden()}), may_call=False)
    result = await fallback.fetcher.fetch(PAGE_URL)
    assert (result.status, result.http_status) == ("failed", 403)
    assert api.scraped_urls() == [] and fallback.calls == []


async def test_markdown_over_the_byte_budget_is_skipped(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    api.set_scraped_pages({PAGE_URL: MARKDOWN})
    fallback = Fallback(api, http, FakeWeb({PAGE_URL: forbidden(b"")}), budget_bytes=20)
    result = await fallback.fetcher.fetch(PAGE_URL)
    assert (result.status, result.reason) == ("skipped", "fetch budget spent")


async def test_a_failed_scrape_keeps_the_pages_failure_and_says_why(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    api.set_failure(FIRECRAWL_SCRAPE, status=401, times=None)
    fallback = Fallback(api, http, FakeWeb({PAGE_URL: forbidden(), "https://walled.example/other": forbidden()}))
    result = await fallback.fetcher.fetch(PAGE_URL)
    assert (result.status, result.reason) == ("failed", "HTTP 403; Firecrawl: authentication failed (HTTP 401)")
    assert any(isinstance(event, ProviderError) and event.skipped for event in fallback.events)
    await fallback.fetcher.fetch("https://walled.example/other")
    assert len(api.scraped_urls()) == 1, "a rejected key is not tried again in the run"


async def test_text_a_search_provider_sent_is_read_without_fetching(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    web = FakeWeb({})
    fallback = Fallback(api, http, web)
    fallback.registry.add(SearchResult(provider="firecrawl", title="A", url=PAGE_URL, content=MARKDOWN))
    result = await fallback.fetcher.fetch(PAGE_URL)
    assert (result.status, result.body.decode()) == ("ok", MARKDOWN)
    assert web.requested_hosts() == [] and fallback.budget.spent == len(MARKDOWN.encode())


async def test_text_a_search_provider_sent_for_a_public_host_on_another_port_is_not_read(
    api: FakeSearchAPI, http: httpx.AsyncClient,
) -> None:
    fallback = Fallback(api, http, FakeWeb({}))
    fallback.registry.add(SearchResult(provider="firecrawl", title="A", url="https://shell.example:6379/", content=MARKDOWN))
    result = await fallback.fetcher.fetch("https://shell.example:6379/")
    assert result.status == "refused" and result.body == b""


async def test_text_a_search_provider_sent_for_a_private_address_is_not_read(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    fallback = Fallback(api, http, FakeWeb({}))
    fallback.registry.add(SearchResult(provider="firecrawl", title="A", url="https://intranet.example/wiki", content=MARKDOWN))
    result = await fallback.fetcher.fetch("https://intranet.example/wiki")
    assert result.status == "refused" and result.body == b""


# -- Firecrawl in the router: order, retries, breakers, usage ---------------------------------------------------------


def firecrawl_router(api: FakeSearchAPI, http: httpx.AsyncClient, recorder: EventRecorder, **overrides: Any) -> SearchRouter:
    def no_real_duckduckgo(query: str, *, max_results: int, timelimit: str | None) -> list[dict[str, Any]]:
        return [{"title": "From DDG", "href": "https://ddg.example/x", "body": "ddg"}]

    config = api.search_config(**{"min_interval_seconds": {}, "firecrawl_api_key": "fc-fake-key", **overrides})
    return build_router(config, http=http, emit=recorder.emit, sleep=recorder.sleep, ddgs_search=no_real_duckduckgo)


async def test_auto_puts_firecrawl_after_searxng_and_before_duckduckgo(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    router = firecrawl_router(api, http, EventRecorder(), providers="auto")
    assert router.provider_names == ["tavily", "brave", "exa", "searxng", "firecrawl", "duckduckgo"]


async def test_router_honours_firecrawls_retry_after(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    api.set_failure("firecrawl", status=429, headers={"Retry-After": "3"})
    recorder = EventRecorder()
    results = await firecrawl_router(api, http, recorder, providers=["firecrawl"]).search([SearchQuery(text="q")])
    assert {result.provider for result in results} == {"firecrawl"}
    assert recorder.sleeps == [3.0]


async def test_spent_firecrawl_credits_disable_it_for_the_run(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    api.set_failure("firecrawl", status=402, times=None)
    router = firecrawl_router(api, http, EventRecorder(), providers=["firecrawl", "duckduckgo"])
    await router.search([SearchQuery(text="q")])
    await router.search([SearchQuery(text="r")])
    assert len(api.requests("firecrawl")) == 1
    assert router.skipped == {"firecrawl": "payment required (HTTP 402)"}


async def test_firecrawl_has_its_own_circuit(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    api.set_failure("firecrawl", status=500, times=None)
    router = firecrawl_router(api, http, EventRecorder(), providers=["firecrawl", "duckduckgo"], max_attempts=1,
                              breaker_failure_threshold=2)
    for text in ("a", "b", "c"):
        await router.search([SearchQuery(text=text)])
    assert len(api.requests("firecrawl")) == 2, "the third query found Firecrawl's circuit open"
    assert router.skipped["firecrawl"] == "circuit open"


async def test_scrapes_count_as_firecrawl_calls(api: FakeSearchAPI, http: httpx.AsyncClient) -> None:
    router = firecrawl_router(api, http, EventRecorder(), providers=["brave"])
    router.count_call("firecrawl")
    assert (router.calls["firecrawl"], router.total_calls) == (1, 1)


async def test_a_shell_whose_scrape_ended_off_its_origin_is_still_read_as_the_fetcher_got_it(
    api: FakeSearchAPI, http: httpx.AsyncClient,
) -> None:
    shell_url = "https://shell.example/app"
    api.set_scraped_pages({shell_url: CREDENTIALS})
    api.set_scrape_endings({shell_url: "http://169.254.169.254/latest/meta-data/"})
    fallback = Fallback(api, http, FakeWeb({shell_url: html_page(SHELL_HTML)}))
    result = await fallback.fetcher.fetch(shell_url)
    assert (result.status, result.body) == ("ok", SHELL_HTML), "the page the fetcher read safely is kept, not the scrape"
    assert any(isinstance(event, ProviderError) and "link-local" in event.reason for event in fallback.events)
