"""The engine with Firecrawl as its search provider and scrape fallback, all on loopback fakes: a page behind a bot
wall (403) and a JavaScript shell are read through Firecrawl and cited; a private address, a loopback literal and a
robots.txt-disallowed page are never sent to Firecrawl, Markdown that Firecrawl's search sent for a private
address is never read, and a bot wall that led Firecrawl to the cloud metadata address is reported unread."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from research import engine
from research.budget import ResearchOptions
from research.engine import ResearchTools
from research.fetch import FetchConfig
from research.llm import LLMClient
from research.report import Report
from tests.fakes.llm import FakeLLM, default_research_model
from tests.fakes.search_api import FakeSearchAPI
from tests.fakes.web import FakeWeb, Page, article_html

pytestmark = pytest.mark.integration

QUESTION = "What is known about the Zorblax tidal turbines?"
WALLED_FACT = "The walled Zorblax tidal turbine report recorded 7,717 kilowatt hours from the Zorblax turbines."
SHELL_FACT = "The Zorblax tidal turbines dashboard showed 6,161 kilowatt hours on the Zorblax turbine array."
PROVIDED_FACT = "Firecrawl search found that the Zorblax tidal turbines delivered 5,353 kilowatt hours."
OPEN_FACT = "The open Zorblax tidal turbines page lists 4,141 kilowatt hours for the Zorblax turbines."
STALE_TEXT = "A stale Zorblax tidal turbines page that claims 1,001 kilowatt hours for the Zorblax turbines."
PRIVATE_TEXT = "Internal Zorblax tidal turbines memo: 9,999 kilowatt hours, do not publish."
METADATA_URL = "http://169.254.169.254/latest/meta-data/iam/security-credentials/deepthread"
CREDENTIALS = ('Zorblax tidal turbines {"AccessKeyId": "ASIAZORBLAXFAKE", '
               '"SecretAccessKey": "zorblax-fake-secret-8,888"} kilowatt hours')
SHELL_HTML = ('<!doctype html><html><head><title>Dashboard</title><script src="/bundle.js"></script></head>'
              '<body><div id="root"></div><noscript>Enable JavaScript to see the Zorblax dashboard.</noscript></body></html>')


def markdown(fact: str) -> str:
    return f"# Zorblax tidal turbines\n\n{fact} Engineers measured the Zorblax turbines over a full season of tides."


class World:
    """The fake web, Firecrawl (search and scrape) and the model, started together."""

    def __init__(self) -> None:
        self.web = FakeWeb()
        self.walled = self.web.add("http://walled.example/report",
                                   Page("<html><body><h1>Access denied</h1><p>Checking your browser.</p></body></html>", status=403))
        self.shell = self.web.add("http://shell.example/dashboard", Page(SHELL_HTML))
        self.open = self.web.add("http://open.example/zorblax", Page(article_html(
            "Zorblax tidal turbines", [OPEN_FACT, "The Zorblax turbines were inspected by engineers every month, and "
                                       "the moorings, cables and monitoring equipment were all checked each time."])))
        self.disallowed = self.web.add("http://robots.example/zorblax", Page("<html>denied</html>", status=403))
        # A 403 that chooses the fallback, then redirects Firecrawl to the cloud metadata service.
        self.bait = self.web.add("http://bait.example/zorblax", Page("<html><body>Forbidden</body></html>", status=403))
        self.web.set_robots("robots.example", "User-agent: *\nDisallow: /zorblax\n")
        # Served too, so that a fetch (which must not happen) would read this page's own, different text.
        self.provided = self.web.add("http://provided.example/zorblax", Page(article_html("Stale", [STALE_TEXT])))
        self.private = "http://intranet.example/zorblax"
        self.private_with_text = "http://intranet.example/memo"
        self.loopback = f"http://127.0.0.1:{self.web.port}/zorblax"
        hits = [
            {"url": self.walled, "title": "Walled Zorblax report", "snippet": "access denied"},
            {"url": self.shell, "title": "Zorblax dashboard", "snippet": "dashboard"},
            {"url": self.private, "title": "Intranet Zorblax", "snippet": "intranet"},
            {"url": self.loopback, "title": "Loopback Zorblax", "snippet": "loopback"},
            {"url": self.disallowed, "title": "Robots Zorblax", "snippet": "robots"},
            {"url": self.bait, "title": "Bait Zorblax", "snippet": "bait"},
            {"url": self.provided, "title": "Provided Zorblax", "snippet": "provided", "markdown": markdown(PROVIDED_FACT)},
            {"url": self.private_with_text, "title": "Intranet memo", "snippet": "memo", "markdown": PRIVATE_TEXT},
            {"url": self.open, "title": "Open Zorblax", "snippet": "open"},
        ]
        self.firecrawl = FakeSearchAPI(results_for=lambda provider, query: hits)
        self.firecrawl.set_scraped_pages({self.walled: markdown(WALLED_FACT), self.shell: markdown(SHELL_FACT),
                                          self.private: PRIVATE_TEXT, self.loopback: PRIVATE_TEXT,
                                          self.disallowed: PRIVATE_TEXT, self.bait: CREDENTIALS})
        self.firecrawl.set_scrape_endings({self.bait: METADATA_URL})
        self.llm = FakeLLM(default_research_model)

    def __enter__(self) -> "World":
        self.web.start()
        self.firecrawl.start()
        self.llm.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for fake in (self.llm, self.firecrawl, self.web):
            fake.stop()

    def tools(self) -> ResearchTools:
        return ResearchTools(
            llm=LLMClient(self.llm.config(max_retries=0)),
            search_config=self.firecrawl.search_config(providers=["firecrawl"], firecrawl_api_key="fc-fake-key"),
            search_http=httpx.AsyncClient(timeout=10),
            resolver=self.web.resolver(extra={"intranet.example": ["10.20.30.40"]}),
            fetch_config=FetchConfig(allow_private=self.web.allow_list(), page_timeout_seconds=10),
            today=lambda: dt.date(2026, 11, 22),
        )


@pytest.fixture
def world() -> Iterator[World]:
    with World() as running:
        yield running


def research(world: World) -> tuple[Report | None, engine.ResearchState, list[Any]]:
    events: list[Any] = []

    async def record(event: Any) -> None:
        events.append(event)

    state = engine.ResearchState()
    options = ResearchOptions(max_seconds=60, max_rounds=1, max_sources=10, max_searches=10, results_per_query=10,
                              passages_per_question=12)
    report = asyncio.run(engine.research(QUESTION, options=options, tools=world.tools(), events=record, state=state))
    return report, state, events


def test_pages_the_fetcher_cannot_read_are_cited_from_firecrawl_and_unsafe_urls_never_reach_it(world: World) -> None:
    report, state, events = research(world)
    assert report is not None and events[-1].type == "complete"

    cited_urls = {source.url for source in report.sources
                  if any(passage.source_number == source.number for passage in report.cited_passages)}
    assert {world.walled, world.shell, world.provided, world.open} <= cited_urls
    cited_text = " ".join(passage.text for passage in report.cited_passages)
    assert all(number in cited_text for number in ("7,717", "6,161", "5,353", "4,141"))

    scraped = world.firecrawl.scraped_urls()
    assert sorted(scraped) == sorted([world.walled, world.shell, world.bait])
    for never in (world.private, world.loopback, world.disallowed, world.private_with_text, world.provided):
        assert never not in scraped
    assert "9,999" not in " ".join(passage.text for passage in state.passages), "no private text was read"
    by_url = {source.url: source_id for source_id, source in state.sources.items()}
    assert state.fetches[by_url[world.private_with_text]].status == "refused"
    assert state.fetches[by_url[world.disallowed]].status == "skipped"
    bait = state.fetches[by_url[world.bait]]
    assert (bait.status, bait.body) == ("refused", b""), "a scrape that ended at the metadata address is not read"
    assert "link-local address 169.254.169.254" in (bait.reason or "")
    assert any(event.type == "warning" and event.message.startswith(f"Skipped {world.bait}: ") for event in events), \
        "the page is reported as not read"
    assert "8,888" not in " ".join(passage.text for passage in state.passages), "no credentials were read"
    assert world.web.requests_to("provided.example", "/zorblax") == [], "text Firecrawl's search sent is not fetched again"
    assert "1,001" not in cited_text

    searches = len(world.firecrawl.requests("firecrawl"))
    assert report.usage.search_calls["firecrawl"] == searches + 3, "each scrape counts as a provider call"
