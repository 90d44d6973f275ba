"""SearXNG through its JSON API (`GET /search?format=json`), an instance with JSON output enabled."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any, Literal

import httpx

from research.models import ProviderName, SearchQuery, SearchResult
from research.providers.base import SearchProviderError, build_results, results_list, send_for_json

TimeRange = Literal["day", "week", "month", "year"]
# Each time range and the days it reaches back, narrowest first.
_TIME_RANGE_DAYS: tuple[tuple[TimeRange, int], ...] = (("day", 1), ("week", 7), ("month", 31), ("year", 366))


def coarse_time_range(since: dt.date, today: dt.date) -> TimeRange | None:
    """The narrowest SearXNG time range that still reaches back to `since`, or None beyond a year."""
    age_days = (today - since).days
    for time_range, days in _TIME_RANGE_DAYS:
        if age_days <= days:
            return time_range
    return None


def _unresponsive_engine_names(payload: dict[str, Any]) -> list[str]:
    """Names of the engines SearXNG reports as unresponsive ([["google", "timeout"], …])."""
    names: list[str] = []
    for entry in payload.get("unresponsive_engines") or []:
        if isinstance(entry, list | tuple) and entry:
            names.append(f"{entry[0]}: {entry[1]}" if len(entry) > 1 else str(entry[0]))
        elif isinstance(entry, str):
            names.append(entry)
    return names


class SearxngProvider:
    """A SearXNG instance's JSON search; empty results with unresponsive engines count as a failure."""

    name: ProviderName = "searxng"

    def __init__(
        self,
        http: httpx.AsyncClient,
        *,
        base_url: str,
        timeout_seconds: float = 20.0,
        today: Callable[[], dt.date] = dt.date.today,
    ) -> None:
        self._http = http
        self._endpoint = base_url.rstrip("/") + "/search"
        self._timeout_seconds = timeout_seconds
        self._today = today

    def build_request(self, query: SearchQuery) -> httpx.Request:
        """The HTTP request for `query`."""
        params: dict[str, str | int] = {"q": query.text, "format": "json", "pageno": 1}
        if query.since is not None and (time_range := coarse_time_range(query.since, self._today())):
            params["time_range"] = time_range
        return self._http.build_request(
            "GET", self._endpoint, params=params, headers={"Accept": "application/json"}, timeout=self._timeout_seconds,
        )

    async def search(self, query: SearchQuery) -> list[SearchResult]:
        """Search SearXNG for `query`; raises SearchProviderError on any failure."""
        try:
            payload = await send_for_json(self.name, self._http, self.build_request(query))
        except SearchProviderError as error:
            if error.status == 403:
                # SearXNG answers 403 to format=json unless the instance lists json under search.formats.
                raise SearchProviderError(
                    self.name, "rejected", "JSON output is not enabled on this instance", status=403,
                ) from error
            raise
        return self.parse(payload)[: query.max_results]

    def parse(self, payload: Any) -> list[SearchResult]:
        """SearchResults from a SearXNG JSON reply; raises SearchProviderError when it is malformed or every engine failed."""
        items = results_list(self.name, payload, "results")
        unresponsive = _unresponsive_engine_names(payload)
        if not items and unresponsive:
            # An empty page because Google and friends timed out is not an empty web.
            raise SearchProviderError(self.name, "unavailable", "unresponsive engines: " + ", ".join(unresponsive))
        return build_results(self.name, items, url="url", title="title", snippet="content", published="publishedDate",
                             score="score")
