"""Search: each query of the round to the router (fallback or fan-out), results deduplicated as `sN`.

The question itself is searched while decomposition runs (`QuestionSearch`); its results join the first round's.
Queries a model wrote pass through `clean_query` first; the person's own question never does.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re
from collections.abc import Callable

from research.models import SearchQuery, SearchResult
from research.providers import NoSearchProviderError, SearchRouter
from research.untrusted import REMOVED_MARKER, addresses_ai, distinctive_words

# One cited id as a model copies it: `p3`, `3`, `^1`, `source 2`, `source: p3`, `4†source`.
_CITED_ID = (r"(?:\^|#)?\s*(?:(?:p|s|source|sources|passage|passages|ref|refs|cite|citation|doc|document|result)"
             r"\s*[:#.]?\s*){0,2}\d+(?:†[^\]】]*)?")
_CITED_IDS = rf"{_CITED_ID}(?:\s*(?:[,;/–—-]|and)?\s*{_CITED_ID})*"
# Bare numbers are markers inside square brackets only: `(2024)` in a query is a year.
_LABELLED_ID = r"(?:p|s|source|passage|ref)\s*[:#.]?\s*\d+"
_LABELLED_IDS = rf"{_LABELLED_ID}(?:\s*(?:[,;/–—-]|and)?\s*{_LABELLED_ID})*"
CITATION_MARKER = re.compile(
    rf"[\[［【〔〖]\s*{_CITED_IDS}\s*[\]］】〕〗]|[(（<＜〈«{{]\s*{_LABELLED_IDS}\s*[)）>＞〉»}}]",
    re.IGNORECASE,
)
# A passage's marker of removed text, copied with or without its brackets.
_REMOVED_MARKER = re.compile(rf"\[?\s*{re.escape(REMOVED_MARKER.strip('[]'))}\s*\]?", re.IGNORECASE)
_SPACE_BEFORE_PUNCTUATION = re.compile(r"\s+([?!.,;:])")  # left where a marker was cut out: "costs [p3]?"
_EDGES = " \t,;:|/-–—·•"


def clean_query(text: str, *, tainted: frozenset[str] = frozenset()) -> str | None:
    """A query a model wrote, without the citation markers it copied and with its whitespace collapsed; None when
    nothing searchable is left, when it holds words addressed to an AI, or when it carries a `tainted` word (a word
    that a page addressed to the AI reading it)."""
    query = CITATION_MARKER.sub(" ", _REMOVED_MARKER.sub(" ", text))
    query = _SPACE_BEFORE_PUNCTUATION.sub(r"\1", " ".join(query.split())).strip(_EDGES)
    if not any(character.isalpha() for character in query):
        return None
    if addresses_ai(query) or distinctive_words(query) & tainted:
        return None
    return query


_GAP_BEFORE_PUNCTUATION = re.compile(r"[ \t]+([?!.,;:])")
_SPACES = re.compile(r"[ \t]{2,}")


def without_citation_markers(text: str) -> str:
    """`text` with every citation marker removed and its lines kept: for an answer shown no source (nothing to
    cite), and for claims whose ids are given apart."""
    return _SPACES.sub(" ", _GAP_BEFORE_PUNCTUATION.sub(r"\1", CITATION_MARKER.sub("", text))).strip()


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


async def search(queries: list[SearchQuery], *, router: SearchRouter,
                 on_found: Callable[[list[SearchResult]], None] | None = None) -> list[SearchResult]:
    """The sources these queries found, each query's handed to `on_found` as soon as it (and those before it)
    answered; raises NoSearchProviderError when no provider answered."""
    return await router.search(queries, on_found=on_found)


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
