"""Tavily search through tavily-python's AsyncTavilyClient, sending through the caller's httpx client."""

from __future__ import annotations

from typing import Any

import httpx
from tavily import AsyncTavilyClient
from tavily.errors import TimeoutError as TavilyTimeoutError

from research.models import ProviderName, SearchQuery, SearchResult
from research.providers.base import (
    DEFAULT_TAVILY_BASE_URL,
    ResponseRecordingClient,
    build_results,
    decode_json,
    error_from_sdk_failure,
    results_list,
)


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
            # Without a key the SDK silently switches to keyless mode; an unkeyed Tavily is "not configured".
            raise ValueError("TavilyProvider needs an API key")
        self._recorder = ResponseRecordingClient(http)
        self._client = AsyncTavilyClient(api_key=api_key, api_base_url=base_url, client=self._recorder)
        self._timeout_seconds = timeout_seconds
        self._restrict_to_preferred = restrict_to_preferred

    def _search_arguments(self, query: SearchQuery) -> dict[str, Any]:
        """The SDK keyword arguments for `query`."""
        arguments: dict[str, Any] = {
            "max_results": query.max_results,
            "search_depth": "basic",
            "include_answer": False,
            "include_raw_content": False,
            "timeout": self._timeout_seconds,
        }
        if query.blocked_domains:
            arguments["exclude_domains"] = query.blocked_domains
        if query.preferred_domains:
            arguments["include_domains"] = query.preferred_domains
            arguments["include_domains_mode"] = "restrict" if self._restrict_to_preferred else "prefer"
        if query.since is not None:
            arguments["start_date"] = query.since.isoformat()
        return arguments

    async def search(self, query: SearchQuery) -> list[SearchResult]:
        """Search Tavily for `query`; raises SearchProviderError on any failure."""
        self._recorder.forget_last_response()
        try:
            payload = await self._client.search(query.text, **self._search_arguments(query))
        except Exception as error:  # the SDK raises its own classes, httpx's and json's: all are classified here
            raise error_from_sdk_failure(
                self.name, error, self._recorder.last_response(), timeout_types=(TavilyTimeoutError,),
            ) from error
        raw_response = self._recorder.last_response()
        # The SDK turns a reply without "results" into an empty list; read what Tavily actually sent.
        return self.parse(decode_json(self.name, raw_response) if raw_response is not None else payload)

    def parse(self, payload: Any) -> list[SearchResult]:
        """SearchResults from a Tavily `/search` reply; raises SearchProviderError (malformed) when it is not one."""
        return build_results(self.name, results_list(self.name, payload, "results"), url="url", title="title",
                             snippet="content", published="published_date", score="score")
