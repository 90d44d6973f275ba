"""robots.txt: RFC 9309 status handling, product-token matching, per-origin caching, and the fetcher's use of it."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from research.fetch import FetchConfig, SafeFetcher, build_fetch_client
from research.robots import (
    RobotsAnswer,
    RobotsCache,
    product_token_of,
    robots_url_for,
    rules_from_answer,
)
from tests.fakes.resolver import DictResolver

USER_AGENT = "deepthread/0.1 (research bot; +https://example.org/bot)"
ROBOTS = """
User-agent: *
Disallow: /private
Allow: /private/press

User-agent: deepthread
Disallow: /drafts
"""


def test_product_token_is_the_first_word_of_the_user_agent() -> None:
    assert product_token_of(USER_AGENT) == "deepthread"
    assert product_token_of("ExampleBot") == "examplebot"


def test_robots_url_keeps_scheme_host_and_port() -> None:
    assert robots_url_for("https://Example.org:8443/a/b?c=d#e") == "https://example.org:8443/robots.txt"


def test_parsed_rules_use_our_group_over_the_wildcard() -> None:
    rules = rules_from_answer(RobotsAnswer(http_status=200, body=ROBOTS))

    assert rules.refusal("http://site.example/drafts/1", "deepthread") == "robots.txt disallows /drafts/1"
    assert rules.refusal("http://site.example/private/x", "deepthread") is None
    assert rules.refusal("http://site.example/private/x", "otherbot") == "robots.txt disallows /private/x"
    assert rules.refusal("http://site.example/private/press/release", "otherbot") is None


def test_crawl_delay_is_read_for_our_group_and_absent_when_not_asked() -> None:
    rules = rules_from_answer(RobotsAnswer(http_status=200, body="User-agent: *\nCrawl-delay: 2.5\n\nUser-agent: deepthread\nCrawl-delay: 7\n"))

    assert rules.crawl_delay("deepthread") == 7.0
    assert rules.crawl_delay("otherbot") == 2.5
    assert rules_from_answer(RobotsAnswer(http_status=200, body=ROBOTS)).crawl_delay("deepthread") is None
    assert rules_from_answer(RobotsAnswer(http_status=404)).crawl_delay("deepthread") is None


@pytest.mark.parametrize("status", [400, 401, 403, 404, 410])
def test_client_error_robots_allows_everything(status: int) -> None:
    rules = rules_from_answer(RobotsAnswer(http_status=status))

    assert rules.refusal("http://site.example/anything", "deepthread") is None


@pytest.mark.parametrize("status", [500, 502, 503])
def test_server_error_robots_disallows_everything(status: int) -> None:
    rules = rules_from_answer(RobotsAnswer(http_status=status))

    assert rules.refusal("http://site.example/", "deepthread") == f"robots.txt answered HTTP {status}, so every path is disallowed"


def test_unreachable_robots_disallows_everything_with_the_problem() -> None:
    rules = rules_from_answer(RobotsAnswer(problem="connection failed (ConnectError)"))

    assert rules.refusal("http://site.example/a", "deepthread") == (
        "robots.txt unreachable (connection failed (ConnectError)), so every path is disallowed"
    )


async def test_cache_fetches_each_origin_once_even_for_concurrent_callers() -> None:
    fetched: list[str] = []
    both_origins_asked = asyncio.Event()

    async def fetch_robots(url: str) -> RobotsAnswer:
        fetched.append(url)
        if len(fetched) == 2:
            both_origins_asked.set()
        # No answer until two fetches are in flight, so every caller arrives while the first is pending.
        await both_origins_asked.wait()
        return RobotsAnswer(http_status=200, body=ROBOTS)

    cache = RobotsCache(fetch_robots, USER_AGENT)
    refusals = await asyncio.gather(
        cache.refusal("http://site.example/a"),
        cache.refusal("http://site.example/drafts/b"),
        cache.refusal("http://site.example/c"),
        cache.refusal("https://site.example/d"),
    )

    assert refusals == [None, "robots.txt disallows /drafts/b", None, None]
    assert fetched == ["http://site.example/robots.txt", "https://site.example/robots.txt"]


async def test_robots_fetch_that_raises_counts_as_unreachable() -> None:
    async def broken_fetch(url: str) -> RobotsAnswer:
        raise RuntimeError("bug")

    cache = RobotsCache(broken_fetch, USER_AGENT)

    assert await cache.refusal("http://site.example/a") == "robots.txt unreachable (RuntimeError), so every path is disallowed"


async def test_robots_txt_itself_is_never_refused() -> None:
    async def never_called(url: str) -> RobotsAnswer:
        raise AssertionError("robots.txt must not need robots.txt")

    assert await RobotsCache(never_called, USER_AGENT).refusal("http://site.example/robots.txt") is None


def fetcher_with_site(site: httpx.MockTransport, **overrides: object) -> SafeFetcher:
    config = FetchConfig.model_validate({"user_agent": USER_AGENT, **overrides})
    resolver = DictResolver({"site.example": ["93.184.216.34"], "cdn.example": ["93.184.216.40"]})
    return SafeFetcher(build_fetch_client(config, transport=site), resolver, config)


async def test_unreachable_robots_makes_the_fetcher_skip_the_page() -> None:
    requested: list[str] = []

    def site(request: httpx.Request) -> httpx.Response:
        requested.append(request.url.path)
        if request.url.path == "/robots.txt":
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(200, headers={"content-type": "text/html"}, content=b"<p>hi</p>")

    result = await fetcher_with_site(httpx.MockTransport(site)).fetch("http://site.example/page")

    assert result.status == "skipped"
    assert result.reason == "robots.txt unreachable (connection failed (ConnectError)), so every path is disallowed"
    assert requested == ["/robots.txt"]


async def test_robots_redirect_is_followed_through_the_guard() -> None:
    def site(request: httpx.Request) -> httpx.Response:
        if request.headers["host"] == "site.example" and request.url.path == "/robots.txt":
            return httpx.Response(301, headers={"location": "http://cdn.example/site-robots.txt"})
        if request.url.path == "/site-robots.txt":
            return httpx.Response(200, headers={"content-type": "text/plain"}, content=ROBOTS.encode())
        return httpx.Response(200, headers={"content-type": "text/html"}, content=b"<p>hi</p>")

    fetcher = fetcher_with_site(httpx.MockTransport(site))

    assert (await fetcher.fetch("http://site.example/drafts/new")).reason == "robots.txt disallows /drafts/new"
    assert (await fetcher.fetch("http://site.example/published")).status == "ok"


async def test_robots_redirect_to_private_address_disallows_everything() -> None:
    def site(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/robots.txt":
            return httpx.Response(302, headers={"location": "http://127.0.0.1/robots.txt"})
        return httpx.Response(200, headers={"content-type": "text/html"}, content=b"<p>hi</p>")

    result = await fetcher_with_site(httpx.MockTransport(site)).fetch("http://site.example/page")

    assert result.status == "skipped"
    assert "loopback address 127.0.0.1" in (result.reason or "")


async def test_rules_past_the_robots_size_cap_are_ignored_not_fatal() -> None:
    long_robots = "User-agent: *\n" + "# padding\n" * 500 + "Disallow: /late\n"

    def site(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/robots.txt":
            return httpx.Response(200, headers={"content-type": "text/plain"}, content=long_robots.encode())
        return httpx.Response(200, headers={"content-type": "text/html"}, content=b"<p>hi</p>")

    result = await fetcher_with_site(httpx.MockTransport(site), max_robots_bytes=1024).fetch("http://site.example/late")

    assert result.status == "ok"
