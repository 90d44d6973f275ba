"""Tavily search through its REST API (`POST /search`) with httpx.

tavily-python is not used: its client sent the same JSON through the caller's httpx client, and importing it took
a third of a second of a run's start-up (it pulls in `requests` and httpx's command-line tool).
"""

from __future__ import annotations

from typing import Any

import httpx

from research.models import ProviderName, SearchQuery, SearchResult
from research.providers.base import (
    DEFAULT_TAVILY_BASE_URL,
    build_results,
    results_list,
    send_for_json,
)

# Tavily's own limit on a search's wait (tavily-python caps it the same way).
MAX_TIMEOUT_SECONDS = 120.0


class TavilyProvider:
    """Tavily's `/search`, with domain lists and a start date passed through."""

    name: ProviderName = "tavily"

    def __init__(
        self,
        http: httpx.AsyncClient,
        *,
        api_key: str,
        base_url: str = DEFAULT_TAVILY_BASE_URL,
        timeout_seconds: float = 20.0,
        restrict_to_preferred: bool = False,
    ) -> None:
        if not api_key:
            # Tavily without a key is its keyless mode, with other limits: an unkeyed Tavily is "not configured".
            raise ValueError("TavilyProvider needs an API key")
        self._http = http
        self._api_key = api_key
        self._endpoint = base_url.rstrip("/") + "/search"
        self._timeout_seconds = min(timeout_seconds, MAX_TIMEOUT_SECONDS)
        self._restrict_to_preferred = restrict_to_preferred

    def _search_body(self, query: SearchQuery) -> dict[str, Any]:
        """The JSON body asking Tavily for `query`."""
        body: dict[str, Any] = {
            "query": query.text,
            "max_results": query.max_results,
            "search_depth": "basic",
            "include_answer": False,
            "include_raw_content": False,
        }
        if query.blocked_domains:
            body["exclude_domains"] = query.blocked_domains
        if query.preferred_domains:
            body["include_domains"] = query.preferred_domains
            body["include_domains_mode"] = "restrict" if self._restrict_to_preferred else "prefer"
        if query.since is not None:
            body["start_date"] = query.since.isoformat()
        return body

    def build_request(self, query: SearchQuery) -> httpx.Request:
        """The HTTP request for `query`."""
        headers = {"Authorization": f"Bearer {self._api_key}", "Content-Type": "application/json",
                   "X-Client-Source": "deepthread"}
        return self._http.build_request("POST", self._endpoint, json=self._search_body(query), headers=headers,
                                        timeout=self._timeout_seconds)

    async def search(self, query: SearchQuery) -> list[SearchResult]:
        """Search Tavily for `query`; raises SearchProviderError on any failure."""
        return self.parse(await send_for_json(self.name, self._http, self.build_request(query)))

    def parse(self, payload: Any) -> list[SearchResult]:
        """SearchResults from a Tavily `/search` reply; raises SearchProviderError (malformed) when it is not one."""
        return build_results(self.name, results_list(self.name, payload, "results"), url="url", title="title",
                             snippet="content", published="published_date", score="score")
