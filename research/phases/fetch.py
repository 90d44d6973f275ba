"""Fetch: the chosen sources concurrently through the run's fetcher; every outcome recorded, none fatal."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol

from research.models import FetchResult, SearchResult


class PageFetcher(Protocol):
    """What the phase needs of a fetcher: research.fetch.SafeFetcher, or the FallbackFetcher a run wraps it in."""

    async def fetch(self, url: str) -> FetchResult:
        """The recorded outcome of fetching `url`: a problem with the page is an outcome, not an exception."""
        ...


def choose_sources(sources: list[SearchResult], *, already_fetched: set[str], limit: int) -> list[SearchResult]:
    """Sources not fetched yet, in id order (priority URLs first), up to `limit`."""
    return [source for source in sources if source.id not in already_fetched][:max(0, limit)]


async def fetch_sources(
    sources: list[SearchResult],
    *,
    fetcher: PageFetcher,
    on_fetched: Callable[[SearchResult, FetchResult], Awaitable[None]],
) -> dict[str, FetchResult]:
    """Fetch every source at once (the fetcher bounds concurrency overall and per host)."""

    async def fetch_one(source: SearchResult) -> tuple[str, FetchResult]:
        result = await fetcher.fetch(source.url)
        await on_fetched(source, result)
        return source.id, result

    return dict(await asyncio.gather(*(fetch_one(source) for source in sources)))
