"""RESEARCH_BLOCKED_DOMAINS holds however a host is written, wherever a URL comes from: search results, URLs in the
question, and every hop of a redirect chain; subdomains of a blocked domain are blocked too."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit

import pytest

from research import engine
from research.budget import ResearchOptions
from research.engine import ResearchTools
from research.fetch import FetchConfig, SafeFetcher, build_fetch_client
from research.llm import LLMClient
from research.models import SearchResult
from research.netguard import normalise_host
from research.sources import SourceRegistry
from research.urls import host_of, url_matches
from tests.fakes.llm import ChatRequest, FakeLLM, HandlerResult, decomposition, default_research_model
from tests.fakes.resolver import DictResolver
from tests.fakes.search_api import FakeSearchAPI
from tests.fakes.web import FakeWeb, Page

BLOCKED = ["spam.com"]
PUBLIC_ADDRESSES = {"ok.example": ["93.184.216.34"], "hop.example": ["93.184.216.35"], "spam.com": ["93.184.216.36"],
                    "www.spam.com": ["93.184.216.36"], "news.spam.com": ["93.184.216.36"]}

WRITINGS_OF_A_BLOCKED_HOST = [
    "https://spam.com/a",
    "https://SPAM.COM/a",
    "https://spam.com./a",
    "https://ｓｐａｍ．ｃｏｍ/a",
    "https://ＳＰＡＭ.com./a",
    "https://www.spam.com/a",
    "https://ｗｗｗ。spam.com/a",
    "https://deep.WWW.Spam.Com.:8443/a",
]


@pytest.mark.parametrize("url", WRITINGS_OF_A_BLOCKED_HOST)
def test_blocked_domain_matches_however_the_host_is_written(url: str) -> None:
    assert SourceRegistry(blocked_domains=BLOCKED).is_blocked(url)


@pytest.mark.parametrize("entry", ["SPAM.com", "*.spam.com", ".spam.com", "ｓｐａｍ.com.", "https://Spam.com/any/path"])
def test_blocked_list_entries_are_read_like_hosts(entry: str) -> None:
    assert url_matches("https://www.spam.com/a", [entry])


@pytest.mark.parametrize("url", ["https://notspam.com/a", "https://spam.com.evil.org/a", "https://spam.co/a",
                                 "https://ok.example/spam.com", "https://ok.example/?next=https://spam.com/"])
def test_names_that_only_resemble_a_blocked_domain_are_not_blocked(url: str) -> None:
    assert not SourceRegistry(blocked_domains=BLOCKED).is_blocked(url)


@pytest.mark.parametrize("url", ["https://ＷＷＷ.Example.com./x", "https://bücher.de/x", "https://xn--bcher-kva.de/x",
                                 "https://Ｅｘａｍｐｌｅ。ｃｏｍ/x", "https://[2001:DB8::1]/x", "http://0x7f.1/x"])
def test_the_filter_reads_a_host_exactly_as_the_fetcher_does(url: str) -> None:
    assert host_of(url) == normalise_host(urlsplit(url).hostname or "")


def test_search_results_on_a_blocked_domain_or_its_subdomains_are_dropped() -> None:
    registry = SourceRegistry(blocked_domains=BLOCKED)
    results = [SearchResult(provider="brave", title=url, url=url) for url in WRITINGS_OF_A_BLOCKED_HOST]
    kept = registry.add_results([*results, SearchResult(provider="brave", title="ok", url="https://ok.example/a")])
    assert [source.url for source in kept] == ["https://ok.example/a"]


def page(text: str = "<html><p>fine</p></html>") -> Page:
    return Page(text.encode(), content_type="text/html")


def redirect(location: str) -> Page:
    # Some servers send a raw UTF-8 Location header.
    return Page(content_type=None, status=302, headers={"location": location.encode("utf-8")})


def fetcher_for(site: FakeWeb, resolver: DictResolver) -> SafeFetcher:
    config = FetchConfig(blocked_domains=tuple(BLOCKED), respect_robots=False, page_timeout_seconds=2)
    return SafeFetcher(build_fetch_client(config, transport=site.transport()), resolver, config)


@pytest.mark.parametrize("url", WRITINGS_OF_A_BLOCKED_HOST)
async def test_fetcher_refuses_a_blocked_domain_before_resolving_or_connecting(url: str) -> None:
    site, resolver = FakeWeb(), DictResolver(PUBLIC_ADDRESSES)
    result = await fetcher_for(site, resolver).fetch(url)
    assert result.status == "refused" and "blocked domain" in (result.reason or "")
    assert resolver.lookups == [] and site.requested_hosts() == []


@pytest.mark.parametrize("location", ["https://news.SPAM.com./story", "//WWW.Spam.Com./story", "https://hop.example/next"])
async def test_a_redirect_hop_to_a_blocked_domain_is_refused_and_never_requested(location: str) -> None:
    site = FakeWeb({
        "https://ok.example/start": redirect(location),
        "https://hop.example/next": redirect("https://www.spam.com/story"),
    })
    resolver = DictResolver(PUBLIC_ADDRESSES)
    result = await fetcher_for(site, resolver).fetch("https://ok.example/start")

    assert result.status == "refused"
    assert "blocked domain" in (result.reason or "") and "after redirect" in (result.reason or "")
    assert not [host for host in site.requested_hosts() if "spam" in host]
    assert not [name for name in resolver.lookups if "spam" in name]


async def test_a_redirect_to_a_full_width_blocked_host_is_never_followed() -> None:
    # httpx itself refuses a Location whose host is not plain IDNA, before our check sees it; either way no request leaves.
    site = FakeWeb({"https://ok.example/start": redirect("https://ｗｗｗ.ｓｐａｍ．com/story")})
    resolver = DictResolver(PUBLIC_ADDRESSES)
    result = await fetcher_for(site, resolver).fetch("https://ok.example/start")
    assert result.status != "ok"
    assert site.requested_hosts() == ["ok.example"] and resolver.lookups == ["ok.example"]


async def test_a_redirect_to_an_allowed_domain_is_still_followed() -> None:
    site = FakeWeb({"https://ok.example/start": redirect("https://hop.example/end"), "https://hop.example/end": page()})
    result = await fetcher_for(site, DictResolver(PUBLIC_ADDRESSES)).fetch("https://ok.example/start")
    assert result.status == "ok" and result.final_url == "https://hop.example/end"


class Recorder:
    """Keeps the events the engine sends."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    async def __call__(self, event: Any) -> None:
        self.events.append(event)


def test_urls_in_the_question_on_a_blocked_domain_are_neither_sources_nor_fetched() -> None:
    question = ("Compare https://www.spam.com/report with https://ｓｐａｍ．com/other and "
                "https://ok.example/report please")

    def one_query(request: ChatRequest) -> HandlerResult:
        if request.schema_name == "decomposition":
            return decomposition(["blocked domain comparison"])(request)
        return default_research_model(request)

    search = FakeSearchAPI(results_for=lambda provider, query: [])
    model = FakeLLM(one_query)
    site = FakeWeb({"https://ok.example/report": page("<html><p>The allowed report says the tide is high.</p></html>")})
    tools = ResearchTools(
        llm=LLMClient(model.config(), http_client=model.http_client()),
        search_config=search.search_config(providers=["brave"], blocked_domains=BLOCKED),
        search_http=search.client(),
        resolver=DictResolver(PUBLIC_ADDRESSES),
        fetch_config=FetchConfig(respect_robots=False),
        fetch_transport=site.transport(),
    )
    recorder = Recorder()
    options = ResearchOptions(max_seconds=30, max_rounds=1, max_sources=4, max_searches=2)
    report = asyncio.run(engine.research(question, options=options, tools=tools, events=recorder))

    assert report is not None
    assert site.requested_hosts() == ["ok.example"]
    assert not [source for source in report.sources if "spam" in host_of(source.url)]
    warnings = [(event.phase, event.message) for event in recorder.events if event.type == "warning"]
    assert [phase for phase, message in warnings if "spam" in message or "ｓｐａｍ" in message] == ["decompose", "decompose"]
    assert any("https://www.spam.com/report" in message and "blocked" in message for _, message in warnings)
    assert any("https://ｓｐａｍ．com/other" in message and "blocked" in message for _, message in warnings)
