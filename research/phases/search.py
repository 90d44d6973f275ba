"""Search: each query of the round to the router (fallback or fan-out), results deduplicated as `sN`.

The question itself is searched while decomposition runs (`QuestionSearch`); its results join the first round's.
"""

from __future__ import annotations

import asyncio
import datetime as dt

from research.models import SearchQuery, SearchResult
from research.providers import NoSearchProviderError, SearchRouter


def query_key(text: str) -> str:
    """The form in which two queries count as the same: lower case, whitespace collapsed."""
    return " ".join(text.lower().split())


def build_queries(texts: list[str], *, searches_left: int, since: dt.date | None,
                  already_asked: set[str], results_per_query: int) -> list[SearchQuery]:
    """New, distinct queries for this round, as many as the search budget still allows."""
    queries: list[SearchQuery] = []
    for text in texts:
        key = query_key(text)
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


class QuestionSearch:
    """The question's own search, started before decomposition ends; its results join the first round's."""

    def __init__(self, query: SearchQuery, *, router: SearchRouter) -> None:
        self.query = query
        self._task = asyncio.create_task(router.search([query]), name="question search")

    async def results(self, *, raise_when_unanswered: bool) -> list[SearchResult]:
        """The sources the question found; [] when no provider answered, unless asked to raise NoSearchProviderError then."""
        try:
            return await self._task
        except NoSearchProviderError:
            if raise_when_unanswered:
                raise
            return []

    def cancel(self) -> None:
        """Stop the search if it is still running (the run is over), and consume its outcome."""
        if not self._task.done():
            self._task.cancel()
        elif not self._task.cancelled():
            self._task.exception()
