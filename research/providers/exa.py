"""Exa search through exa-py's AsyncExa, sending through the caller's httpx client and asking for no page text."""

from __future__ import annotations

from typing import Any

import httpx
from exa_py import AsyncExa
from exa_py.api import Result, SearchResponse
from exa_py.errors import ExaTimeoutError

from research.models import ProviderName, SearchQuery, SearchResult
from research.providers.base import (
    DEFAULT_EXA_BASE_URL,
    ResponseRecordingClient,
    build_result,
    error_from_sdk_failure,
)


class _ExaOnCallersClient(AsyncExa):
    """AsyncExa whose HTTP client is the one it is given instead of one it makes."""

    def __init__(self, *, api_key: str, base_url: str, http: httpx.AsyncClient) -> None:
        super().__init__(api_key=api_key, api_base=base_url)
        self._callers_client = http

    @property
    def client(self) -> httpx.AsyncClient:
        return self._callers_client


class ExaProvider:
    """Exa's `/search` without contents; domain lists and a start published date passed through."""

    name: ProviderName = "exa"

    def __init__(
        self,
        http: httpx.AsyncClient,
        *,
        api_key: str,
        base_url: str = DEFAULT_EXA_BASE_URL,
        timeout_seconds: float = 20.0,
        restrict_to_preferred: bool = False,
    ) -> None:
        if not api_key:
            raise ValueError("ExaProvider needs an API key")
        self._recorder = ResponseRecordingClient(http)
        self._client = _ExaOnCallersClient(api_key=api_key, base_url=base_url.rstrip("/"), http=self._recorder)
        self._timeout_seconds = timeout_seconds
        self._restrict_to_preferred = restrict_to_preferred

    def _search_arguments(self, query: SearchQuery) -> dict[str, Any]:
        """The SDK keyword arguments for `query`."""
        arguments: dict[str, Any] = {
            "num_results": query.max_results,
            # Without this the SDK asks for 10,000 characters of page text per hit; the fetcher reads pages itself.
            "contents": False,
            "timeout": self._timeout_seconds,
        }
        if query.blocked_domains:
            arguments["exclude_domains"] = query.blocked_domains
        if query.preferred_domains and self._restrict_to_preferred:
            arguments["include_domains"] = query.preferred_domains
        if query.since is not None:
            arguments["start_published_date"] = query.since.isoformat()
        return arguments

    async def search(self, query: SearchQuery) -> list[SearchResult]:
        """Search Exa for `query`; raises SearchProviderError on any failure."""
        self._recorder.forget_last_response()
        try:
            response = await self._client.search(query.text, **self._search_arguments(query))
        except Exception as error:  # the SDK raises ValueError for HTTP errors and KeyError/TypeError for odd bodies
            raise error_from_sdk_failure(
                self.name, error, self._recorder.last_response(), timeout_types=(ExaTimeoutError,),
            ) from error
        return self.parse(response)

    def parse(self, response: SearchResponse[Result]) -> list[SearchResult]:
        """SearchResults from the SDK's parsed reply, skipping hits without a URL."""
        results: list[SearchResult] = []
        for item in response.results or []:
            highlights = getattr(item, "highlights", None)
            result = build_result(
                self.name,
                url=item.url,
                title=item.title,
                snippet=getattr(item, "summary", None) or (highlights[0] if isinstance(highlights, list) and highlights else None),
                published=item.published_date,
                score=item.score,
                extra_snippets=highlights[1:] if isinstance(highlights, list) else None,
            )
            if result is not None:
                results.append(result)
        return results
