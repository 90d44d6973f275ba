"""A host's pace: up to FETCH_MAX_PER_HOST at once, one at a time spaced by a robots.txt crawl delay, slowed by a 429.

The fetcher runs on a hand-moved clock against one host of the fake web, in process, so every wait is seen at the
wire (when each request arrived, how many were in flight) without waiting in real time.
"""

from __future__ import annotations

import asyncio

from config import load_settings
from research.fetch import FetchConfig, SafeFetcher, build_fetch_client
from research.models import FetchResult
from tests.fakes.clock import ManualClock
from tests.fakes.resolver import DictResolver
from tests.fakes.web import FakeWeb, Page
from tests.waiting import eventually, settle
from worker.toolkit import build_research_tools

HOST = "polite.example"
ADDRESS = "93.184.216.34"
ARTICLE = "<html><head><title>Tides</title></head><body><p>The spring tide reached 6.8 metres.</p></body></html>"


def polite_site(clock: ManualClock, paths: list[str], *, robots: str | None = None,
                held: list[str] | tuple[str, ...] = ()) -> FakeWeb:
    """The host's article at each of `paths`, its robots.txt if given, the `held` ones kept back until released."""
    web = FakeWeb(clock=clock)
    for path in paths:
        web.add(url(path), Page(ARTICLE))
    for path in held:
        web.hold(url(path))
    if robots is not None:
        web.set_robots(HOST, robots)
    return web


def url(path: str) -> str:
    return f"http://{HOST}{path}"


def too_many_requests(*, retry_after: str) -> Page:
    """The host's 429, asking for `retry_after` seconds."""
    return Page("slow down", content_type="text/plain; charset=utf-8", status=429, headers={"retry-after": retry_after})


def page_requests(web: FakeWeb) -> list[tuple[str, float]]:
    """Each page request (robots.txt left out), in order: its path and the clock's time when it arrived."""
    return [(request.path, request.at) for request in web.requests_to(HOST) if request.path != "/robots.txt"]


def page_times(web: FakeWeb) -> list[float]:
    return [at for _path, at in page_requests(web)]


def page_paths(web: FakeWeb) -> list[str]:
    return [path for path, _at in page_requests(web)]


async def pages_arrived(web: FakeWeb, count: int) -> None:
    await eventually(lambda: len(page_requests(web)) >= count, f"{count} page requests")


def paced_fetcher(web: FakeWeb, clock: ManualClock, **overrides: object) -> SafeFetcher:
    config = FetchConfig.model_validate({"page_timeout_seconds": 30.0, **overrides})
    client = build_fetch_client(config, transport=web.transport())
    return SafeFetcher(client, DictResolver({HOST: [ADDRESS]}), config, clock=clock, sleep=clock.sleep)


def fetch_pages(fetcher: SafeFetcher, paths: list[str]) -> list[asyncio.Task[FetchResult]]:
    return [asyncio.create_task(fetcher.fetch(url(path))) for path in paths]


def test_fetch_max_per_host_setting_reaches_the_fetcher() -> None:
    assert load_settings().fetch_max_per_host == 6
    assert FetchConfig().max_per_host == 6
    assert build_research_tools(load_settings(llm_model="fake-model", fetch_max_per_host=3)).fetch_config.max_per_host == 3


async def test_without_a_crawl_delay_six_pages_of_one_host_are_in_flight_at_once() -> None:
    clock = ManualClock()
    paths = [f"/page/{number}" for number in range(8)]
    site = polite_site(clock, paths, robots="User-agent: *\nDisallow: /private\n", held=paths)
    fetcher = paced_fetcher(site, clock)

    tasks = fetch_pages(fetcher, paths)
    await pages_arrived(site, 6)
    await settle(lambda: fetcher.pace_of(HOST).waiting == 2)
    for path in paths:
        site.release(url(path))
    results = await asyncio.gather(*tasks)

    assert all(result.ok for result in results)
    assert site.most_in_flight(HOST) == 6


async def test_robots_crawl_delay_sends_a_hosts_pages_one_at_a_time_spaced_by_the_delay() -> None:
    clock = ManualClock()
    site = polite_site(clock, ["/a", "/b", "/c"], robots="User-agent: *\nCrawl-delay: 3\n")
    fetcher = paced_fetcher(site, clock)
    started = clock()

    tasks = fetch_pages(fetcher, ["/a", "/b", "/c"])
    await pages_arrived(site, 1)
    await clock.wait_for_sleepers(started + 6)
    # The other two pages are asleep until their turns (3 s and 6 s on): nothing else was asked.
    assert page_times(site) == [started]
    clock.advance(3)
    await pages_arrived(site, 2)
    clock.advance(3)
    results = await asyncio.gather(*tasks)

    assert [result.status for result in results] == ["ok", "ok", "ok"]
    assert [at - started for at in page_times(site)] == [0, 3, 6]
    assert site.most_in_flight(HOST) == 1


async def test_a_page_whose_crawl_delay_turn_comes_after_its_deadline_is_given_up_at_once_and_the_delay_is_capped() -> None:
    clock = ManualClock()
    site = polite_site(clock, ["/a", "/b", "/c"], robots="User-agent: *\nCrawl-delay: 60\n")
    fetcher = paced_fetcher(site, clock, page_timeout_seconds=15.0, max_host_wait_seconds=10.0)
    started = clock()

    first, second, third = fetch_pages(fetcher, ["/a", "/b", "/c"])
    given_up = await third  # its turn, 20 s on, is past its 15 s deadline: it does not wait for it
    await clock.wait_for_sleepers(started + 10)
    clock.advance(10)
    results = [await first, await second]

    assert [result.status for result in results] == ["ok", "ok"]
    assert [at - started for at in page_times(site)] == [0, 10]
    assert given_up.status == "skipped"
    assert given_up.reason == ("robots.txt asks for 10 s between requests, so this page's turn would come after "
                               "its 15 s deadline")
    assert page_paths(site) == ["/a", "/b"]


async def test_a_429_pauses_the_host_for_its_retry_after_halves_its_concurrency_and_asks_the_page_again() -> None:
    clock = ManualClock()
    held = [f"/page/{number}" for number in range(4)]
    site = polite_site(clock, ["/limited", *held], held=held)
    site.answer_next(url("/limited"), too_many_requests(retry_after="4"))
    fetcher = paced_fetcher(site, clock, max_per_host=4, respect_robots=False)
    started = clock()

    [limited] = fetch_pages(fetcher, ["/limited"])
    await clock.wait_for_sleepers(started + 4)
    others = fetch_pages(fetcher, held)
    await clock.wait_for_sleepers(started + 4, count=5)
    # Every request waits out the Retry-After: only the first answer has been asked for.
    assert page_paths(site) == ["/limited"]
    clock.advance(4)
    pace = fetcher.pace_of(HOST)
    await settle(lambda: site.in_flight(HOST) == 2 and pace.waiting == 2)
    for path in held:
        site.release(url(path))
    results = [await limited, *await asyncio.gather(*others)]

    assert all(result.ok for result in results)
    assert page_times(site)[:2] == [started, started + 4]
    assert page_paths(site).count("/limited") == 2
    assert site.most_in_flight(HOST) == 2
    assert pace.max_in_flight == 2


async def test_a_429_whose_wait_passes_the_deadline_is_kept_as_the_pages_outcome() -> None:
    clock = ManualClock()
    site = polite_site(clock, ["/limited"])
    site.answer_next(url("/limited"), too_many_requests(retry_after="120"))
    fetcher = paced_fetcher(site, clock, page_timeout_seconds=5.0, respect_robots=False)

    result = await fetcher.fetch(url("/limited"))

    assert result.status == "failed"
    assert result.http_status == 429 and result.reason == "HTTP 429"
    assert page_paths(site) == ["/limited"]
    assert fetcher.pace_of(HOST).max_in_flight == 3
