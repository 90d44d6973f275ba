"""The safe fetcher against the fake web: caps, bombs, drips, redirects, content types, robots, limits and the byte budget."""

from __future__ import annotations

import asyncio
import ipaddress
import tracemalloc
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from research.fetch import MIB, BoundedDecoder, FetchBudget, FetchConfig, FetchStopped, SafeFetcher, build_fetch_client
from research.models import FetchResult
from research.netguard import AllowList
from tests.fakes.clock import ManualClock
from tests.fakes.resolver import DictResolver
from tests.fakes.server import RecordedRequest, free_port
from tests.fakes.web import (
    KIB,
    FakeWeb,
    Page,
    article_html,
    drip_page,
    gzip_bomb,
    gzip_bomb_page,
    gzip_page,
    huge_page,
    pdf_page,
    redirect_page,
)
from tests.waiting import eventually, settle

ARTICLE = article_html("Tide tables", ["The spring tide at Dover reached 6.8 metres on 3 March."])
SLOW_HOSTS = [f"slow{number}.example" for number in range(6)]


def build_corpus() -> FakeWeb:
    web = FakeWeb(
        robots={
            "alpha.example": "User-agent: *\nDisallow: /private\n\nUser-agent: deepthread\nDisallow: /no-bots\nDisallow: /private\n",
            "beta.example": "User-agent: *\nDisallow: /secret\n",
        }
    )
    web.add("http://alpha.example/article", Page(ARTICLE))
    web.add("http://alpha.example/other-article", Page(ARTICLE))
    web.add("http://alpha.example/private/report", Page("<p>internal</p>"))
    web.add("http://alpha.example/no-bots/page", Page("<p>humans only</p>"))
    web.add("http://alpha.example/huge", huge_page(2 * MIB))
    web.add("http://alpha.example/huge-declared", huge_page(2 * MIB, declare_length=True))
    web.add("http://alpha.example/bomb", gzip_bomb_page(100 * MIB))
    web.add("http://alpha.example/gzipped", gzip_page(ARTICLE))
    web.add("http://alpha.example/drip", drip_page(interval=0.05))
    web.add("http://alpha.example/image", Page(b"\x89PNG\r\n\x1a\n" + bytes(100), content_type="image/png"))
    web.add("http://alpha.example/json", Page(b"{}", content_type="application/json"))
    web.add("http://alpha.example/plain", Page("plain words", content_type="text/plain; charset=utf-8"))
    web.add("http://alpha.example/xhtml", Page("<html xmlns='http://www.w3.org/1999/xhtml'/>", content_type="application/xhtml+xml"))
    web.add("http://alpha.example/unlabelled-html", Page("<!DOCTYPE html><html><p>hi</p></html>", content_type=None))
    web.add("http://alpha.example/report.pdf", pdf_page(["Annual report", "Revenue rose 12%."], content_type=None))
    web.add("http://alpha.example/download", pdf_page(["Appendix"], content_type="application/octet-stream"))
    web.add("http://alpha.example/binary", Page(bytes(range(256)) * 8, content_type="application/octet-stream"))
    web.add("http://alpha.example/broken", Page("oops", status=500))
    for hop in range(6):
        web.add(f"http://alpha.example/hop/{hop}", redirect_page(f"/hop/{hop + 1}"))
    web.add("http://alpha.example/hop/6", Page(ARTICLE))
    web.add("http://alpha.example/to-beta", redirect_page(web.url("http://beta.example/landing"), status=301))
    web.add("http://alpha.example/to-beta-secret", redirect_page(web.url("http://beta.example/secret/plans")))
    web.add("http://beta.example/landing", Page(ARTICLE))
    web.add("http://beta.example/secret/plans", Page("<p>plans</p>"))
    web.add("http://down.example/robots.txt", Page("busy", status=503, content_type="text/plain"))
    web.add("http://down.example/page", Page(ARTICLE))
    web.add("http://gamma.example/page", Page(ARTICLE))
    for number in range(6):
        web.add(f"http://{SLOW_HOSTS[0]}/page/{number}", Page(ARTICLE, latency=0.2))
    for host in SLOW_HOSTS[1:]:
        web.add(f"http://{host}/page", Page(ARTICLE, latency=0.2))
    for number in range(3):
        web.add(f"http://budget.example/page/{number}", Page(b"x" * 1000, content_type="text/plain"))
    return web


@pytest.fixture(scope="module")
def corpus() -> Iterator[FakeWeb]:
    with build_corpus() as web:
        yield web


@pytest.fixture
def web(corpus: FakeWeb) -> FakeWeb:
    corpus.requests.clear()
    return corpus


@pytest.fixture
async def make_fetcher(web: FakeWeb) -> AsyncIterator:
    clients: list[httpx.AsyncClient] = []

    def make(budget: FetchBudget | None = None, *, clock: ManualClock | None = None, **overrides: object) -> SafeFetcher:
        settings: dict[str, object] = {"allow_private": web.allow_list(), "page_timeout_seconds": 5.0, **overrides}
        config = FetchConfig.model_validate(settings)
        client = build_fetch_client(config)
        clients.append(client)
        timing = {"clock": clock, "sleep": clock.sleep} if clock is not None else {}
        return SafeFetcher(client, web.resolver(), config, budget, **timing)

    yield make
    for client in clients:
        await client.aclose()


def most_at_once(requests: list[RecordedRequest]) -> int:
    """The largest number of recorded requests the server was handling at the same moment."""
    moments = sorted(
        [(request.at, 1) for request in requests] + [(request.finished_at or request.at, -1) for request in requests],
        key=lambda moment: (moment[0], moment[1]),
    )
    in_flight = peak = 0
    for _moment, change in moments:
        in_flight += change
        peak = max(peak, in_flight)
    return peak


async def test_article_is_fetched_with_body_type_and_final_url(web: FakeWeb, make_fetcher) -> None:
    result = await make_fetcher().fetch(web.url("http://alpha.example/article"))

    assert result.status == "ok"
    assert result.http_status == 200
    assert result.content_type == "text/html; charset=utf-8"
    assert b"6.8 metres" in result.body
    assert result.bytes_read == len(ARTICLE.encode())
    assert result.final_url == web.url("http://alpha.example/article")


async def test_honest_user_agent_is_sent_and_host_header_kept(web: FakeWeb, make_fetcher) -> None:
    await make_fetcher().fetch(web.url("http://alpha.example/article"))

    [request] = web.requests_to("alpha.example", "/article")
    assert request.headers["user-agent"].startswith("deepthread/")
    assert request.headers["host"] == f"alpha.example:{web.port}"


async def test_oversized_body_is_stopped_at_the_raw_cap(web: FakeWeb, make_fetcher) -> None:
    result = await make_fetcher(max_body_bytes=256 * KIB).fetch(web.url("http://alpha.example/huge"))

    assert result.status == "refused"
    assert result.reason == "body over 256 KiB cap"
    assert 256 * KIB < result.bytes_read < 2 * MIB


async def test_declared_length_over_cap_is_refused_without_reading_the_body(web: FakeWeb, make_fetcher) -> None:
    result = await make_fetcher(max_body_bytes=256 * KIB).fetch(web.url("http://alpha.example/huge-declared"))

    assert result.status == "refused"
    assert result.reason == "body over 256 KiB cap"
    assert result.bytes_read == 0


async def test_gzip_bomb_is_stopped_at_the_decompressed_cap_without_inflating_it(web: FakeWeb, make_fetcher) -> None:
    fetcher = make_fetcher(max_decoded_bytes=1 * MIB)
    tracemalloc.start()
    try:
        result = await fetcher.fetch(web.url("http://alpha.example/bomb"))
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert result.status == "refused"
    assert result.reason == "decompressed body over 1 MiB cap"
    assert result.bytes_read <= len(gzip_bomb(100 * MIB))
    assert peak < 16 * MIB


async def test_gzip_page_is_decoded_and_charged_at_its_compressed_size(web: FakeWeb, make_fetcher) -> None:
    result = await make_fetcher().fetch(web.url("http://alpha.example/gzipped"))

    assert result.status == "ok"
    assert result.body == ARTICLE.encode()
    assert result.bytes_read < len(ARTICLE.encode())


async def test_dripping_server_is_stopped_at_the_page_timeout(web: FakeWeb, make_fetcher) -> None:
    clock = ManualClock()
    fetch = asyncio.create_task(make_fetcher(page_timeout_seconds=0.3, clock=clock).fetch(web.url("http://alpha.example/drip")))
    await eventually(lambda: web.requests_to("alpha.example", "/drip"), "the fake web to receive /drip", interval=0.01)
    clock.advance(0.3)
    result = await fetch

    assert result.status == "failed"
    # The drip goes on for 30 s: a fetch that ended on this reason stopped at its timeout, not at the page's end.
    assert result.reason == "timed out after 0.3 s"


async def test_five_redirects_are_followed_to_the_final_page(web: FakeWeb, make_fetcher) -> None:
    result = await make_fetcher().fetch(web.url("http://alpha.example/hop/1"))

    assert result.status == "ok"
    assert result.final_url == web.url("http://alpha.example/hop/6")


async def test_sixth_redirect_is_not_followed(web: FakeWeb, make_fetcher) -> None:
    result = await make_fetcher().fetch(web.url("http://alpha.example/hop/0"))

    assert result.status == "failed"
    assert result.reason == "more than 5 redirects"
    assert web.requests_to("alpha.example", "/hop/6") == []


async def test_redirect_to_another_allowed_host_is_followed(web: FakeWeb, make_fetcher) -> None:
    result = await make_fetcher().fetch(web.url("http://alpha.example/to-beta"))

    assert result.status == "ok"
    assert result.final_url == web.url("http://beta.example/landing")
    assert len(web.requests_to("beta.example", "/robots.txt")) == 1


async def test_redirect_target_disallowed_by_its_robots_is_skipped(web: FakeWeb, make_fetcher) -> None:
    result = await make_fetcher().fetch(web.url("http://alpha.example/to-beta-secret"))

    assert result.status == "skipped"
    assert result.reason == "robots.txt disallows /secret/plans"
    assert web.requests_to("beta.example", "/secret/plans") == []


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("/image", "content type image/png not accepted"),
        ("/json", "content type application/json not accepted"),
        ("/binary", "content type application/octet-stream not accepted"),
    ],
)
async def test_unaccepted_content_type_is_refused_with_the_type(web: FakeWeb, make_fetcher, path: str, reason: str) -> None:
    result = await make_fetcher().fetch(web.url(f"http://alpha.example{path}"))

    assert result.status == "refused"
    assert result.reason == reason
    assert result.body == b""


@pytest.mark.parametrize(
    ("path", "content_type"),
    [
        ("/plain", "text/plain; charset=utf-8"),
        ("/xhtml", "application/xhtml+xml"),
        ("/unlabelled-html", "text/html"),
        ("/report.pdf", "application/pdf"),
        ("/download", "application/pdf"),
    ],
)
async def test_accepted_or_sniffed_content_type_is_fetched(web: FakeWeb, make_fetcher, path: str, content_type: str) -> None:
    result = await make_fetcher().fetch(web.url(f"http://alpha.example{path}"))

    assert result.status == "ok"
    assert result.content_type == content_type


async def test_pdf_body_arrives_intact(web: FakeWeb, make_fetcher) -> None:
    result = await make_fetcher().fetch(web.url("http://alpha.example/report.pdf"))

    assert result.body.startswith(b"%PDF-")
    assert b"Revenue rose 12%." in result.body


async def test_robots_disallowed_path_is_skipped_with_its_reason_and_never_requested(web: FakeWeb, make_fetcher) -> None:
    result = await make_fetcher().fetch(web.url("http://alpha.example/private/report"))

    assert result.status == "skipped"
    assert result.reason == "robots.txt disallows /private/report"
    assert web.requests_to("alpha.example", "/private/report") == []


async def test_robots_group_for_our_product_token_applies(web: FakeWeb, make_fetcher) -> None:
    result = await make_fetcher().fetch(web.url("http://alpha.example/no-bots/page"))

    assert result.status == "skipped"
    assert result.reason == "robots.txt disallows /no-bots/page"


async def test_robots_is_fetched_once_per_host_for_concurrent_pages(web: FakeWeb, make_fetcher) -> None:
    fetcher = make_fetcher()
    urls = [web.url("http://alpha.example/article"), web.url("http://alpha.example/other-article"), web.url("http://alpha.example/plain")]

    results = await asyncio.gather(*(fetcher.fetch(url) for url in urls))

    assert [result.status for result in results] == ["ok", "ok", "ok"]
    assert len(web.requests_to("alpha.example", "/robots.txt")) == 1


async def test_robots_server_error_disallows_every_path(web: FakeWeb, make_fetcher) -> None:
    result = await make_fetcher().fetch(web.url("http://down.example/page"))

    assert result.status == "skipped"
    assert result.reason == "robots.txt answered HTTP 503, so every path is disallowed"
    assert web.requests_to("down.example", "/page") == []


async def test_missing_robots_allows_every_path(web: FakeWeb, make_fetcher) -> None:
    result = await make_fetcher().fetch(web.url("http://gamma.example/page"))

    assert result.status == "ok"
    assert len(web.requests_to("gamma.example", "/robots.txt")) == 1


async def test_http_error_status_is_a_failed_outcome(web: FakeWeb, make_fetcher) -> None:
    result = await make_fetcher().fetch(web.url("http://alpha.example/broken"))

    assert result.status == "failed"
    assert result.reason == "HTTP 500"
    assert result.http_status == 500


async def test_connection_refused_is_a_failed_outcome() -> None:
    closed_port = free_port()
    config = FetchConfig(allow_private=AllowList(hosts=frozenset({"closed.example"})), respect_robots=False)
    async with build_fetch_client(config) as client:
        fetcher = SafeFetcher(client, DictResolver({"closed.example": ["127.0.0.1"]}), config)
        result = await fetcher.fetch(f"http://closed.example:{closed_port}/")

    assert result.status == "failed"
    assert result.reason == "connection failed (ConnectError)"


async def test_resolver_crash_is_recorded_not_raised() -> None:
    class CrashingResolver:
        async def resolve(self, host: str) -> list[str]:
            raise RuntimeError("resolver bug")

    config = FetchConfig()
    async with build_fetch_client(config) as client:
        result = await SafeFetcher(client, CrashingResolver(), config).fetch("http://example.com/")

    assert result.status == "failed"
    assert result.reason == "unexpected error (RuntimeError)"


async def test_pages_of_one_host_are_fetched_at_most_per_host_limit_at_once(web: FakeWeb, make_fetcher) -> None:
    fetcher = make_fetcher(max_per_host=2, max_concurrency=8, respect_robots=False)
    urls = [web.url(f"http://{SLOW_HOSTS[0]}/page/{number}") for number in range(6)]

    results = await asyncio.gather(*(fetcher.fetch(url) for url in urls))

    assert all(result.ok for result in results)
    assert most_at_once(web.requests_to(SLOW_HOSTS[0])) == 2


async def test_pages_across_hosts_are_fetched_at_most_overall_limit_at_once(web: FakeWeb, make_fetcher) -> None:
    fetcher = make_fetcher(max_per_host=2, max_concurrency=3, respect_robots=False)
    urls = [web.url(f"http://{host}/page") for host in SLOW_HOSTS[1:]]

    results = await asyncio.gather(*(fetcher.fetch(url) for url in urls))

    assert all(result.ok for result in results)
    assert most_at_once(web.requests.all()) == 3


async def test_waiting_for_a_busy_host_does_not_count_against_the_page_timeout() -> None:
    clock = ManualClock()
    site = FakeWeb(clock=clock)
    urls = [f"http://queue.example/page/{number}" for number in range(3)]
    for url in urls:
        site.add(url, Page(ARTICLE))
        site.hold(url)
    config = FetchConfig(max_per_host=1, page_timeout_seconds=0.6, respect_robots=False)
    async with build_fetch_client(config, transport=site.transport()) as client:
        fetcher = SafeFetcher(client, DictResolver({"queue.example": ["93.184.216.34"]}), config,
                              clock=clock, sleep=clock.sleep)
        fetches = [asyncio.create_task(fetcher.fetch(url)) for url in urls]
        await settle(lambda: fetcher.pace_of("queue.example").waiting == 2)
        # Each page takes 0.5 s of the clock, so the last one waits 1 s for its turn: past 0.6 s, had it counted.
        for served, url in enumerate(urls, start=1):
            await eventually(lambda: len(site.requests_to("queue.example")) >= served, f"{served} page requests")
            clock.advance(0.5)
            site.release(url)
        results = await asyncio.gather(*fetches)

    assert [result.status for result in results] == ["ok", "ok", "ok"]
    assert site.most_in_flight("queue.example") == 1


async def test_byte_budget_cuts_the_run_and_later_fetches_are_skipped(web: FakeWeb, make_fetcher) -> None:
    budget = FetchBudget(max_bytes=1500)
    fetcher = make_fetcher(budget=budget, respect_robots=False)

    results: list[FetchResult] = []
    for number in range(3):
        results.append(await fetcher.fetch(web.url(f"http://budget.example/page/{number}")))

    assert [result.status for result in results] == ["ok", "skipped", "skipped"]
    assert results[1].reason == results[2].reason == "fetch budget spent"
    assert budget.exhausted
    assert web.requests_to("budget.example", "/page/2") == []


async def test_budget_is_shared_by_fetchers_of_the_same_run(web: FakeWeb, make_fetcher) -> None:
    budget = FetchBudget(max_bytes=1000)
    first = make_fetcher(budget=budget, respect_robots=False)
    second = make_fetcher(budget=budget, respect_robots=False)

    assert (await first.fetch(web.url("http://budget.example/page/0"))).ok
    result = await second.fetch(web.url("http://budget.example/page/1"))

    assert result.status == "skipped"
    assert budget.spent == 1000


async def test_cookies_are_neither_kept_nor_sent() -> None:
    seen_cookies: list[str | None] = []

    def site(request: httpx.Request) -> httpx.Response:
        seen_cookies.append(request.headers.get("cookie"))
        return httpx.Response(200, headers={"content-type": "text/plain", "set-cookie": "session=abc; Path=/"}, content=b"hi")

    config = FetchConfig(respect_robots=False)
    async with build_fetch_client(config, transport=httpx.MockTransport(site)) as client:
        client.cookies.set("planted", "1")
        fetcher = SafeFetcher(client, DictResolver({"shop.example": ["93.184.216.34"]}), config)
        await fetcher.fetch("http://shop.example/a")
        await fetcher.fetch("http://shop.example/b")

    assert seen_cookies == [None, None]


# -- ports: 80 and 443 on public hosts, any port on a host allowed although private -------------------------------------

PUBLIC_NAMES = {"public.example": ["93.184.216.34"], "bouncer.example": ["93.184.216.35"]}


class PublicSite:
    """A public site in process: records each request (by the Host header and path it was sent with) and answers
    it, `bouncer.example` with a redirect to `public.example` on port 6379."""

    def __init__(self) -> None:
        self.requested: list[str] = []

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.answer)

    def answer(self, request: httpx.Request) -> httpx.Response:
        self.requested.append(f"{request.headers['host']}{request.url.path}")
        if request.headers["host"] == "bouncer.example":
            return httpx.Response(302, headers={"location": "http://public.example:6379/"})
        return httpx.Response(200, headers={"content-type": "text/plain"}, content=b"public page")

    def fetcher(self, client: httpx.AsyncClient, config: FetchConfig) -> SafeFetcher:
        return SafeFetcher(client, DictResolver(PUBLIC_NAMES), config)


@pytest.mark.parametrize("url", ["http://public.example:6379/", "http://public.example:25/", "https://public.example:8443/",
                                 "http://93.184.216.34:6379/"])
async def test_a_public_host_is_refused_on_a_port_other_than_80_and_443(url: str) -> None:
    site = PublicSite()
    config = FetchConfig(respect_robots=False)
    async with build_fetch_client(config, transport=site.transport()) as client:
        result = await site.fetcher(client, config).fetch(url)

    assert result.status == "refused"
    assert result.reason is not None and result.reason.startswith(f"port {url.rsplit(':', 1)[1].rstrip('/')} not allowed")
    assert site.requested == [], "nothing was sent"


async def test_a_redirect_to_another_port_of_a_public_host_is_refused() -> None:
    site = PublicSite()
    config = FetchConfig(respect_robots=False)
    async with build_fetch_client(config, transport=site.transport()) as client:
        result = await site.fetcher(client, config).fetch("http://bouncer.example/")

    assert (result.status, result.reason) == (
        "refused", "port 6379 not allowed (only 80 and 443) on public.example (after redirect to http://public.example:6379/)")
    assert site.requested == ["bouncer.example/"]


@pytest.mark.parametrize("url", ["http://public.example:80/a", "https://public.example:443/b", "https://public.example/c"])
async def test_a_public_host_is_fetched_on_ports_80_and_443(url: str) -> None:
    site = PublicSite()
    config = FetchConfig(respect_robots=False)
    async with build_fetch_client(config, transport=site.transport()) as client:
        result = await site.fetcher(client, config).fetch(url)

    assert result.status == "ok" and result.body == b"public page"


async def test_a_host_allowed_although_private_is_fetched_on_any_port(web: FakeWeb, make_fetcher) -> None:
    url = web.url("http://alpha.example/article")
    assert not url.startswith("http://alpha.example:80/"), "the fake web listens on a random port"

    by_name = await make_fetcher().fetch(url)
    by_network = await make_fetcher(allow_private=AllowList(networks=(ipaddress.ip_network("127.0.0.0/8"),))).fetch(url)

    assert (by_name.status, by_network.status) == ("ok", "ok")
    assert b"6.8 metres" in by_name.body and b"6.8 metres" in by_network.body


async def test_a_public_network_allowed_by_cidr_keeps_any_port() -> None:
    site = PublicSite()
    config = FetchConfig(respect_robots=False, allow_private=AllowList(networks=(ipaddress.ip_network("93.184.216.0/24"),)))
    async with build_fetch_client(config, transport=site.transport()) as client:
        result = await site.fetcher(client, config).fetch("http://public.example:6379/")

    assert result.status == "ok" and site.requested == ["public.example:6379/"]


def test_bounded_decoder_stops_a_bomb_after_one_byte_over_the_limit() -> None:
    decoder = BoundedDecoder("gzip", limit=64 * KIB)

    with pytest.raises(FetchStopped) as stopped:
        decoder.feed(gzip_bomb(10 * MIB))

    assert stopped.value.reason == "decompressed body over 64 KiB cap"
    assert decoder.produced == 64 * KIB + 1


def test_unsupported_content_encoding_is_refused() -> None:
    with pytest.raises(FetchStopped) as stopped:
        BoundedDecoder("br", limit=MIB)

    assert stopped.value.reason == "content encoding br not supported"
