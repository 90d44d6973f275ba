"""A host's pace: up to FETCH_MAX_PER_HOST at once, one at a time spaced by a robots.txt crawl delay, slowed by a 429.

The fetcher runs on a hand-moved clock against one host behind httpx.MockTransport, so every wait is seen at the
wire (when each request arrived, how many were in flight) without waiting in real time.
"""

from __future__ import annotations

import asyncio
import httpx

from config import load_settings
from research.fetch import FetchConfig, SafeFetcher, build_fetch_client
from research.models import FetchResult
from tests.fakes.clock import ManualClock, settle
from tests.fakes.resolver import DictResolver
from tests.fakes.scripted_site import ScriptedSite
from worker.toolkit import build_research_tools

HOST = "polite.example"
ADDRESS = "93.184.216.34"


def paced_fetcher(site: ScriptedSite, clock: ManualClock, **overrides: object) -> SafeFetcher:
    config = FetchConfig.model_validate({"page_timeout_seconds": 30.0, **overrides})
    client = build_fetch_client(config, transport=site.transport())
    return SafeFetcher(client, DictResolver({HOST: [ADDRESS]}), config, clock=clock, sleep=clock.sleep)


def fetch_pages(fetcher: SafeFetcher, paths: list[str]) -> list[asyncio.Task[FetchResult]]:
    return [asyncio.create_task(fetcher.fetch(f"http://{HOST}{path}")) for path in paths]


def test_fetch_max_per_host_setting_reaches_the_fetcher() -> None:
    assert load_settings().fetch_max_per_host == 6
    assert FetchConfig().max_per_host == 6
    assert build_research_tools(load_settings(llm_model="fake-model", fetch_max_per_host=3)).fetch_config.max_per_host == 3


async def test_without_a_crawl_delay_six_pages_of_one_host_are_in_flight_at_once() -> None:
    clock = ManualClock()
    site = ScriptedSite(clock, robots="User-agent: *\nDisallow: /private\n")
    paths = [f"/page/{number}" for number in range(8)]
    for path in paths:
        site.hold(path)
    fetcher = paced_fetcher(site, clock)

    tasks = fetch_pages(fetcher, paths)
    await site.wait_for_pages(6)
    await settle(lambda: fetcher.pace_of(HOST).waiting == 2)
    for path in paths:
        site.release(path)
    results = await asyncio.gather(*tasks)

    assert all(result.ok for result in results)
    assert site.most_in_flight == 6


async def test_robots_crawl_delay_sends_a_hosts_pages_one_at_a_time_spaced_by_the_delay() -> None:
    clock = ManualClock()
    site = ScriptedSite(clock, robots="User-agent: *\nCrawl-delay: 3\n")
    fetcher = paced_fetcher(site, clock)
    started = clock()

    tasks = fetch_pages(fetcher, ["/a", "/b", "/c"])
    await site.wait_for_pages(1)
    await clock.wait_for_sleepers(started + 6)
    # The other two pages are asleep until their turns (3 s and 6 s on): nothing else was asked.
    assert site.page_times() == [started]
    clock.advance(3)
    await site.wait_for_pages(2)
    clock.advance(3)
    results = await asyncio.gather(*tasks)

    assert [result.status for result in results] == ["ok", "ok", "ok"]
    assert [at - started for at in site.page_times()] == [0, 3, 6]
    assert site.most_in_flight == 1


async def test_a_page_whose_crawl_delay_turn_comes_after_its_deadline_is_given_up_at_once_and_the_delay_is_capped() -> None:
    clock = ManualClock()
    site = ScriptedSite(clock, robots="User-agent: *\nCrawl-delay: 60\n")
    fetcher = paced_fetcher(site, clock, page_timeout_seconds=15.0, max_host_wait_seconds=10.0)
    started = clock()

    first, second, third = fetch_pages(fetcher, ["/a", "/b", "/c"])
    given_up = await third  # its turn, 20 s on, is past its 15 s deadline: it does not wait for it
    await clock.wait_for_sleepers(started + 10)
    clock.advance(10)
    results = [await first, await second]

    assert [result.status for result in results] == ["ok", "ok"]
    assert [at - started for at in site.page_times()] == [0, 10]
    assert given_up.status == "skipped"
    assert given_up.reason == ("robots.txt asks for 10 s between requests, so this page's turn would come after "
                               "its 15 s deadline")
    assert site.page_paths() == ["/a", "/b"]


async def test_a_429_pauses_the_host_for_its_retry_after_halves_its_concurrency_and_asks_the_page_again() -> None:
    clock = ManualClock()
    site = ScriptedSite(clock)
    site.answers["/limited"] = [httpx.Response(429, text="slow down", headers={"retry-after": "4"})]
    held = [f"/page/{number}" for number in range(4)]
    for path in held:
        site.hold(path)
    fetcher = paced_fetcher(site, clock, max_per_host=4, respect_robots=False)
    started = clock()

    [limited] = fetch_pages(fetcher, ["/limited"])
    await clock.wait_for_sleepers(started + 4)
    others = fetch_pages(fetcher, held)
    await clock.wait_for_sleepers(started + 4, count=5)
    # Every request waits out the Retry-After: only the first answer has been asked for.
    assert site.page_paths() == ["/limited"]
    clock.advance(4)
    pace = fetcher.pace_of(HOST)
    await settle(lambda: site.in_flight == 2 and pace.waiting == 2)
    for path in held:
        site.release(path)
    results = [await limited, *await asyncio.gather(*others)]

    assert all(result.ok for result in results)
    assert site.page_times()[:2] == [started, started + 4]
    assert site.page_paths().count("/limited") == 2
    assert site.most_in_flight == 2
    assert pace.max_in_flight == 2


async def test_a_429_whose_wait_passes_the_deadline_is_kept_as_the_pages_outcome() -> None:
    clock = ManualClock()
    site = ScriptedSite(clock)
    site.answers["/limited"] = [httpx.Response(429, text="slow down", headers={"retry-after": "120"})]
    fetcher = paced_fetcher(site, clock, page_timeout_seconds=5.0, respect_robots=False)

    result = await fetcher.fetch(f"http://{HOST}/limited")

    assert result.status == "failed"
    assert result.http_status == 429 and result.reason == "HTTP 429"
    assert site.page_paths() == ["/limited"]
    assert fetcher.pace_of(HOST).max_in_flight == 3
