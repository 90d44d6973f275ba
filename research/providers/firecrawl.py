"""Firecrawl's v2 REST API with httpx: `POST /v2/search` as a search provider and `POST /v2/scrape` for hard pages.

firecrawl-py is not used: it builds its own httpx client (and retries on its own clock), which would bypass the
caller's client, its limits and the wire fakes. Every call, searches and scrapes alike, waits for a slot in one
concurrency gate per Firecrawl endpoint and event loop: Firecrawl's plans limit concurrent requests, and past the
limit it answers 429 or empty pages.

Firecrawl is an untrusted proxy: it follows redirects, runs the page's scripts and resolves names itself. So it is
asked for no page actions, headers or waits, and frames are left out of its Markdown (a frame's page can be anywhere,
and Firecrawl never says where); every page keeps the URLs Firecrawl reports for it (`ScrapedPage.reported_urls`),
and a search hit's Markdown is kept only when Firecrawl's page stayed on the hit's own origin.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from pydantic import BaseModel

from research.models import ProviderName, SearchQuery, SearchResult
from research.netguard import same_origin
from research.providers.base import (
    DEFAULT_FIRECRAWL_BASE_URL,
    SearchProviderError,
    build_result,
    results_list,
    send_for_json,
)
from research.providers.searxng import coarse_time_range

Sleep = Callable[[float], Awaitable[None]]
Clock = Callable[[], float]

FIRECRAWL_MAX_LIMIT = 100
# Google-style `tbs` values that Firecrawl's search passes on, for SearXNG's coarse ranges.
TIME_FILTERS = {"day": "qdr:d", "week": "qdr:w", "month": "qdr:m", "year": "qdr:y"}
# Firecrawl refuses a scrape timeout under one second.
MIN_SCRAPE_TIMEOUT_MS = 1000
# What every page is asked for: its main content as Markdown, without the frames Firecrawl would inline.
PAGE_OPTIONS: dict[str, Any] = {"formats": ["markdown"], "onlyMainContent": True, "excludeTags": ["iframe"]}

_gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Semaphore]] = weakref.WeakKeyDictionary()


def concurrency_gate(base_url: str, limit: int) -> asyncio.Semaphore:
    """The semaphore that every Firecrawl call to `base_url` in this event loop (this worker's runs) shares."""
    gates = _gates.setdefault(asyncio.get_running_loop(), {})
    return gates.setdefault(f"{base_url.rstrip('/')}#{limit}", asyncio.Semaphore(limit))


def _payload_data(provider: str, payload: Any) -> Any:
    """The `data` of a Firecrawl reply; raises SearchProviderError when the reply says it failed or is not one."""
    if not isinstance(payload, dict):
        raise SearchProviderError(provider, "malformed", "expected a JSON object")
    if payload.get("success") is False:
        raise SearchProviderError(provider, "rejected", str(payload.get("error") or "success is false")[:200])
    if "data" not in payload:
        raise SearchProviderError(provider, "malformed", "no 'data' in the reply")
    return payload["data"]


def _reported_urls(document: dict[str, Any], metadata: dict[str, Any]) -> tuple[str, ...] | None:
    """Every URL a Firecrawl document names for its page, where the page ended first; None when it does not say where
    the page ended or names one that is not text."""
    # `metadata.url` is where Firecrawl ended up (after redirects and the page's own navigation); the document's `url`
    # and `metadata.sourceURL` say where it started. `metadata.ogUrl` is only what the page claims about itself.
    final = metadata.get("url")
    if not isinstance(final, str) or not final.strip():
        return None
    urls = [final.strip()]
    for value in (document.get("url"), metadata.get("sourceURL")):
        if value is None:
            continue
        if not isinstance(value, str):
            return None
        if value.strip() and value.strip() not in urls:
            urls.append(value.strip())
    return tuple(urls)


def _stayed_on(url: Any, document: dict[str, Any], metadata: dict[str, Any]) -> bool:
    """Whether every URL Firecrawl reports for a search hit's page is on the hit's own origin."""
    urls = _reported_urls(document, metadata)
    return isinstance(url, str) and urls is not None and all(same_origin(url, reported) for reported in urls)


def _origin_status(metadata: Any) -> int | None:
    """The HTTP status the page itself answered Firecrawl with, when reported."""
    status = metadata.get("statusCode") if isinstance(metadata, dict) else None
    return status if isinstance(status, int) and not isinstance(status, bool) else None


class _FirecrawlEndpoint:
    """What search and scrape share: the key, the base URL, the request's form and the one concurrency gate."""

    name: ProviderName = "firecrawl"

    def __init__(self, http: httpx.AsyncClient, *, api_key: str, base_url: str, max_concurrency: int) -> None:
        if not api_key:
            raise ValueError(f"{type(self).__name__} needs an API key")
        self._http = http
        self._api_key = api_key
        self._base_url = base_url.rstrip("/")
        self._max_concurrency = max_concurrency

    def _post(self, path: str, body: dict[str, Any], *, timeout: float) -> httpx.Request:
        return self._http.build_request(
            "POST", f"{self._base_url}{path}", json=body,
            headers={"Authorization": f"Bearer {self._api_key}", "Accept": "application/json"},
            timeout=timeout,
        )

    async def _send(self, request: httpx.Request) -> Any:
        """The reply's JSON once the gate lets the call through; raises SearchProviderError on any failure."""
        async with concurrency_gate(self._base_url, self._max_concurrency):
            return await send_for_json(self.name, self._http, request)


class FirecrawlProvider(_FirecrawlEndpoint):
    """Firecrawl's web search, asking for each hit's main content as Markdown (kept as the result's `content`)."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        *,
        api_key: str,
        base_url: str = DEFAULT_FIRECRAWL_BASE_URL,
        timeout_seconds: float = 20.0,
        max_concurrency: int = 2,
        restrict_to_preferred: bool = False,
        today: Callable[[], dt.date] = dt.date.today,
    ) -> None:
        super().__init__(http, api_key=api_key, base_url=base_url, max_concurrency=max_concurrency)
        self._timeout_seconds = timeout_seconds
        self._restrict_to_preferred = restrict_to_preferred
        self._today = today

    def build_request(self, query: SearchQuery) -> httpx.Request:
        """The HTTP request for `query`."""
        body: dict[str, Any] = {
            "query": query.text,
            "limit": min(query.max_results, FIRECRAWL_MAX_LIMIT),
            "sources": ["web"],
            "scrapeOptions": dict(PAGE_OPTIONS),
            "timeout": int(self._timeout_seconds * 1000),
        }
        # Firecrawl takes one of the two lists; blocked domains are filtered from the results anyway.
        if query.preferred_domains and self._restrict_to_preferred:
            body["includeDomains"] = query.preferred_domains
        elif query.blocked_domains:
            body["excludeDomains"] = query.blocked_domains
        if query.since is not None and (time_range := coarse_time_range(query.since, self._today())):
            body["tbs"] = TIME_FILTERS[time_range]
        return self._post("/v2/search", body, timeout=self._timeout_seconds)

    async def search(self, query: SearchQuery) -> list[SearchResult]:
        """Search Firecrawl for `query`; raises SearchProviderError on any failure."""
        return self.parse(await self._send(self.build_request(query)))

    def parse(self, payload: Any) -> list[SearchResult]:
        """SearchResults from a Firecrawl `/v2/search` reply; raises SearchProviderError when it is not one."""
        hits = results_list(self.name, {"data": _payload_data(self.name, payload)}, "data", "web", missing_is_empty=True)
        results: list[SearchResult] = []
        for hit in hits:
            if not isinstance(hit, dict):
                continue
            metadata = hit.get("metadata")
            if not isinstance(metadata, dict):
                metadata = {}
            origin_status = _origin_status(metadata)
            url = hit.get("url") or metadata.get("sourceURL") or metadata.get("url")
            # A page that answered Firecrawl with an error gives an error page's Markdown: not the page's text; nor is
            # a page Firecrawl was led to off the hit's origin (the fetcher reads that hit itself, under its checks).
            content = (hit.get("markdown") if (origin_status is None or origin_status < 400)
                       and _stayed_on(url, hit, metadata) else None)
            result = build_result(
                self.name,
                url=url,
                title=hit.get("title") or metadata.get("title"),
                snippet=hit.get("description") or metadata.get("description"),
                published=metadata.get("publishedTime"),
                content=content,
            )
            if result is not None:
                results.append(result)
        return results


class ScrapedPage(BaseModel):
    """One page as Firecrawl's scrape returned it: its main content as Markdown, and the URLs Firecrawl reports for it."""

    url: str
    markdown: str
    # Where Firecrawl says the page ended (first) and started; never empty.
    reported_urls: tuple[str, ...]
    title: str | None = None
    status_code: int | None = None


class FirecrawlScraper(_FirecrawlEndpoint):
    """Firecrawl's `/v2/scrape` for one URL at a time, within a per-page deadline.

    A 429 or 5xx is retried after Retry-After (or a short backoff) when that wait still fits in the page's
    deadline; an empty page is asked for once more, since Firecrawl returns them under load.
    """

    def __init__(
        self,
        http: httpx.AsyncClient,
        *,
        api_key: str,
        base_url: str = DEFAULT_FIRECRAWL_BASE_URL,
        max_concurrency: int = 2,
        page_timeout_seconds: float = 30.0,
        max_attempts: int = 3,
        backoff_seconds: float = 1.0,
        sleep: Sleep = asyncio.sleep,
        clock: Clock = time.monotonic,
    ) -> None:
        super().__init__(http, api_key=api_key, base_url=base_url, max_concurrency=max_concurrency)
        self.page_timeout_seconds = page_timeout_seconds
        self._max_attempts = max_attempts
        self._backoff_seconds = backoff_seconds
        self._sleep = sleep
        self._clock = clock

    def build_request(self, url: str, *, timeout_seconds: float) -> httpx.Request:
        """The HTTP request that scrapes `url`, asking Firecrawl to give up within `timeout_seconds`."""
        timeout_ms = max(MIN_SCRAPE_TIMEOUT_MS, int(timeout_seconds * 1000))
        # No `actions`, `headers` or `waitFor`. Firecrawl's scrape has no option to stop redirects (or the page's own
        # navigation): the check of the final URL it reports (research.scrape_fallback) is what keeps a scrape on the
        # checked origin.
        body = {"url": url, **PAGE_OPTIONS, "timeout": timeout_ms}
        # Our own wait is a little longer than Firecrawl's, so its timeout error arrives rather than ours.
        return self._post("/v2/scrape", body, timeout=timeout_ms / 1000 + 5)

    async def scrape(self, url: str) -> ScrapedPage:
        """`url`'s main content as Markdown; raises SearchProviderError when Firecrawl cannot give it within the deadline."""
        deadline = self._clock() + self.page_timeout_seconds
        asked_again_for_empty = False
        attempt = 0
        while True:
            attempt += 1
            remaining = deadline - self._clock()
            try:
                return self.parse(url, await self._send(self.build_request(url, timeout_seconds=remaining)))
            except SearchProviderError as error:
                if error.kind == "empty" and not asked_again_for_empty:
                    asked_again_for_empty = True
                    continue
                wait = self._retry_wait(error, attempt, deadline - self._clock())
                if wait is None:
                    raise
                await self._sleep(wait)

    def _retry_wait(self, error: SearchProviderError, attempt: int, remaining: float) -> float | None:
        """Seconds to wait before the next attempt, or None to give up (not retryable, out of attempts or of time)."""
        if not error.retryable or attempt >= self._max_attempts:
            return None
        wait = error.retry_after if error.retry_after is not None else self._backoff_seconds * 2 ** (attempt - 1)
        # Waiting past the page's deadline would leave no time for the scrape itself.
        return wait if wait < remaining else None

    def parse(self, url: str, payload: Any) -> ScrapedPage:
        """The page in a Firecrawl `/v2/scrape` reply; raises SearchProviderError when it holds no usable page."""
        data = _payload_data(self.name, payload)
        if not isinstance(data, dict):
            raise SearchProviderError(self.name, "malformed", "'data' is not an object")
        metadata = data.get("metadata")
        if not isinstance(metadata, dict):
            metadata = {}
        origin_status = _origin_status(metadata)
        if origin_status is not None and origin_status >= 400:
            raise SearchProviderError(self.name, "rejected", f"the page answered Firecrawl with HTTP {origin_status}")
        markdown = data.get("markdown")
        if not isinstance(markdown, str) or not markdown.strip():
            raise SearchProviderError(self.name, "empty", "no Markdown in the reply")
        urls = _reported_urls(data, metadata)
        if urls is None:
            raise SearchProviderError(self.name, "malformed", "the reply does not say where the page ended")
        title = metadata.get("title")
        return ScrapedPage(url=url, markdown=markdown, reported_urls=urls,
                           title=title if isinstance(title, str) and title.strip() else None, status_code=origin_status)
