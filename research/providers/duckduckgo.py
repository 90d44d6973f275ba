"""DuckDuckGo (and the other engines `ddgs` aggregates), keyless, as the last fallback; run off the event loop."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Awaitable, Callable
from typing import Any, Literal, Protocol

from research.models import ProviderName, SearchQuery, SearchResult
from research.providers.base import SearchProviderError, build_results, query_with_exclusions

TimeLimit = Literal["d", "w", "m", "y"]
# Each time limit and the days it reaches back, narrowest first.
_TIME_LIMIT_DAYS: tuple[tuple[TimeLimit, int], ...] = (("d", 1), ("w", 7), ("m", 31), ("y", 366))
NO_RESULTS_MESSAGE = "No results found."


class DdgsSearch(Protocol):
    """A synchronous text search with ddgs' `DDGS().text` keywords, returning its result dicts."""

    def __call__(self, query: str, *, max_results: int, timelimit: TimeLimit | None) -> list[dict[str, Any]]: ...


def ddgs_text_search(query: str, *, max_results: int, timelimit: TimeLimit | None) -> list[dict[str, Any]]:
    """Search with the real `ddgs` package (its own HTTP stack: blocking, and not reachable by our transports)."""
    from ddgs import DDGS

    return DDGS().text(query, max_results=max_results, timelimit=timelimit)


def coarse_time_limit(since: dt.date, today: dt.date) -> TimeLimit | None:
    """The narrowest ddgs time limit that still reaches back to `since`, or None beyond a year."""
    age_days = (today - since).days
    for time_limit, days in _TIME_LIMIT_DAYS:
        if age_days <= days:
            return time_limit
    return None


def error_from_ddgs(error: Exception) -> SearchProviderError:
    """The provider error for an exception from ddgs (rate limited, timed out, or unavailable)."""
    from ddgs.exceptions import RatelimitException, TimeoutException

    if isinstance(error, RatelimitException):
        return SearchProviderError("duckduckgo", "rate_limited", str(error)[:200])
    if isinstance(error, TimeoutException | TimeoutError):
        return SearchProviderError("duckduckgo", "timeout", str(error)[:200])
    return SearchProviderError("duckduckgo", "unavailable", f"{type(error).__name__}: {error}"[:200])


class DuckDuckGoProvider:
    """Keyless web search through `ddgs`, called in a worker thread with a deadline."""

    name: ProviderName = "duckduckgo"

    def __init__(
        self,
        *,
        search_function: DdgsSearch | None = None,
        timeout_seconds: float = 20.0,
        today: Callable[[], dt.date] = dt.date.today,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._search_function: DdgsSearch = search_function or ddgs_text_search
        self._timeout_seconds = timeout_seconds
        self._today = today
        self._sleep = sleep

    async def search(self, query: SearchQuery) -> list[SearchResult]:
        """Search through ddgs for `query`; raises SearchProviderError on any failure."""
        time_limit = coarse_time_limit(query.since, self._today()) if query.since is not None else None
        answer = asyncio.ensure_future(asyncio.to_thread(
            self._search_function, query_with_exclusions(query), max_results=query.max_results, timelimit=time_limit,
        ))
        # The deadline runs on the injected sleep, so a test's clock can reach it.
        deadline = asyncio.ensure_future(self._sleep(self._timeout_seconds))
        try:
            await asyncio.wait((answer, deadline), return_when=asyncio.FIRST_COMPLETED)
        finally:
            deadline.cancel()
            timed_out = not answer.done()
            # The thread cannot be cancelled; on timeout it finishes in the background and its answer is dropped.
            answer.cancel()
        if timed_out:
            raise SearchProviderError(self.name, "timeout", f"no answer in {self._timeout_seconds:g} s")
        try:
            items = answer.result()
        except Exception as error:
            if str(error) == NO_RESULTS_MESSAGE:
                return []  # ddgs raises rather than return an empty list
            raise error_from_ddgs(error) from error
        return self.parse(items)

    def parse(self, items: Any) -> list[SearchResult]:
        """SearchResults from ddgs' text results ({"title", "href", "body"}); raises SearchProviderError when they are not a list."""
        if not isinstance(items, list):
            raise SearchProviderError(self.name, "malformed", f"expected a list, got {type(items).__name__}")
        return build_results(self.name, items, url="href", title="title", snippet="body")
