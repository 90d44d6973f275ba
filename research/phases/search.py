"""Search: each query of the round to the router (fallback or fan-out), results deduplicated as `sN`."""

from __future__ import annotations

import datetime as dt

from research.models import SearchQuery, SearchResult
from research.providers import SearchRouter


def build_queries(texts: list[str], *, searches_left: int, since: dt.date | None,
                  already_asked: set[str], results_per_query: int) -> list[SearchQuery]:
    """New, distinct queries for this round, as many as the search budget still allows."""
    queries: list[SearchQuery] = []
    for text in texts:
        key = " ".join(text.lower().split())
        if not key or key in already_asked:
            continue
        already_asked.add(key)
        queries.append(SearchQuery(text=text, max_results=results_per_query, since=since))
        if len(queries) >= searches_left:
            break
    return queries


async def search(queries: list[SearchQuery], *, router: SearchRouter) -> list[SearchResult]:
    """The sources these queries found; raises NoSearchProviderError when no provider answered."""
    return await router.search(queries)
