"""Brave web search through its REST API (`GET /res/v1/web/search`) with httpx."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import httpx

from research.models import ProviderName, SearchQuery, SearchResult
from research.providers.base import (
    DEFAULT_BRAVE_BASE_URL,
    SearchProviderError,
    build_results,
    query_with_exclusions,
    results_list,
    send_for_json,
)

BRAVE_MAX_COUNT = 20


def _numbers(header: str | None) -> list[float | None]:
    """The comma-separated numbers of a rate-limit header, None where one is unreadable."""
    values: list[float | None] = []
    for part in (header or "").split(","):
        try:
            values.append(float(part.strip()))
        except ValueError:
            values.append(None)
    return values


def retry_after_from_rate_limit_headers(response: httpx.Response) -> float | None:
    """Seconds until the exhausted rate-limit window resets, from `X-RateLimit-Remaining` and `X-RateLimit-Reset`.

    Brave reports one value per window ("1, 1419704": per second, per month); a spent monthly quota gives a wait
    far beyond any retry cap, which makes the router fall back at once.
    """
    resets = _numbers(response.headers.get("x-ratelimit-reset"))
    remaining = _numbers(response.headers.get("x-ratelimit-remaining"))
    exhausted = [reset for reset, left in zip(resets, remaining) if reset is not None and left == 0]
    if exhausted:
        return max(exhausted)
    known = [reset for reset in resets if reset is not None]
    return min(known) if known else None


class BraveProvider:
    """Brave's web search; blocked domains become `-site:` operators and a start date a `freshness` range."""

    name: ProviderName = "brave"

    def __init__(
        self,
        http: httpx.AsyncClient,
        *,
        api_key: str,
        base_url: str = DEFAULT_BRAVE_BASE_URL,
        timeout_seconds: float = 20.0,
        today: Callable[[], dt.date] = dt.date.today,
    ) -> None:
        if not api_key:
            raise ValueError("BraveProvider needs an API key")
        self._http = http
        self._api_key = api_key
        self._endpoint = base_url.rstrip("/") + "/res/v1/web/search"
        self._timeout_seconds = timeout_seconds
        self._today = today

    def build_request(self, query: SearchQuery) -> httpx.Request:
        """The HTTP request for `query`."""
        params: dict[str, str | int] = {
            "q": query_with_exclusions(query),
            "count": min(query.max_results, BRAVE_MAX_COUNT),
            "result_filter": "web",
        }
        if query.since is not None:
            params["freshness"] = f"{query.since.isoformat()}to{self._today().isoformat()}"
        headers = {"Accept": "application/json", "X-Subscription-Token": self._api_key}
        return self._http.build_request(
            "GET", self._endpoint, params=params, headers=headers, timeout=self._timeout_seconds,
        )

    async def search(self, query: SearchQuery) -> list[SearchResult]:
        """Search Brave for `query`; raises SearchProviderError on any failure."""
        payload = await send_for_json(
            self.name, self._http, self.build_request(query), retry_hint=retry_after_from_rate_limit_headers,
        )
        return self.parse(payload)

    def parse(self, payload: Any) -> list[SearchResult]:
        """SearchResults from a Brave web-search reply; raises SearchProviderError (malformed) when it is not one."""
        if not isinstance(payload, dict) or payload.get("type") != "search":
            raise SearchProviderError(self.name, "malformed", "not a Brave search reply")
        return build_results(self.name, results_list(self.name, payload, "web", "results", missing_is_empty=True),
                             url="url", title="title", snippet="description", published="page_age",
                             extra_snippets="extra_snippets")
