"""The run's sources: search results deduplicated by canonical URL, filtered by domain and date, with ids `s1, s2, …`."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator

from research.models import SearchResult
from research.urls import canonicalize_url, url_matches


class SourceRegistry:
    """Run-scoped record of every source found, in order of first appearance.

    Blocked domains are dropped, results published before a query's `since` are dropped, and with
    `restrict_to_preferred` only preferred domains are kept; otherwise preferred domains rank first.
    """

    def __init__(
        self,
        *,
        blocked_domains: Iterable[str] = (),
        preferred_domains: Iterable[str] = (),
        restrict_to_preferred: bool = False,
    ) -> None:
        self.blocked_domains = list(blocked_domains)
        self.preferred_domains = list(preferred_domains)
        self.restrict_to_preferred = restrict_to_preferred
        self._by_url: dict[str, SearchResult] = {}
        self._by_id: dict[str, SearchResult] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def __iter__(self) -> Iterator[SearchResult]:
        return iter(list(self._by_id.values()))

    def all(self) -> list[SearchResult]:
        """Every registered source, in id order."""
        return list(self._by_id.values())

    def get(self, source_id: str) -> SearchResult | None:
        """The source with id `source_id`, if registered."""
        return self._by_id.get(source_id)

    def find(self, url: str) -> SearchResult | None:
        """The source registered under `url`'s canonical form, if any."""
        return self._by_url.get(canonicalize_url(url))

    def is_preferred(self, url: str, preferred_domains: Iterable[str] = ()) -> bool:
        """Whether `url` is on a preferred domain (the run's or the extra ones given)."""
        return url_matches(url, [*self.preferred_domains, *preferred_domains])

    def is_blocked(self, url: str, blocked_domains: Iterable[str] = ()) -> bool:
        """Whether `url` is on a blocked domain or a subdomain of one (the run's or the extra ones given)."""
        return url_matches(url, [*self.blocked_domains, *blocked_domains])

    def is_allowed(
        self,
        result: SearchResult,
        *,
        blocked_domains: Iterable[str] = (),
        preferred_domains: Iterable[str] = (),
        since: dt.date | None = None,
    ) -> bool:
        """Whether `result` passes the domain lists and the date limit (an unknown date passes)."""
        if self.is_blocked(result.url, blocked_domains):
            return False
        if self.restrict_to_preferred and not self.is_preferred(result.url, preferred_domains):
            return False
        return since is None or result.published is None or result.published >= since

    def rank_preferred_first(self, results: list[SearchResult], preferred_domains: Iterable[str] = ()) -> list[SearchResult]:
        """`results` with those on preferred domains moved to the front, order otherwise kept."""
        extra = list(preferred_domains)
        preferred = [result for result in results if self.is_preferred(result.url, extra)]
        others = [result for result in results if not self.is_preferred(result.url, extra)]
        return preferred + others

    def add(self, result: SearchResult) -> SearchResult:
        """Register `result` under its canonical URL and return the registered source (the earlier one when a duplicate).

        A duplicate's snippets join the first one's `extra_snippets` (or fill its empty snippet), and its date fills an unknown one.
        """
        canonical_url = canonicalize_url(result.url)
        existing = self._by_url.get(canonical_url)
        if existing is not None:
            self._merge(existing, result)
            return existing
        source_id = f"s{len(self._by_id) + 1}"
        registered = result.model_copy(update={"id": source_id, "url": canonical_url, "extra_snippets": list(result.extra_snippets)})
        self._by_url[canonical_url] = registered
        self._by_id[source_id] = registered
        return registered

    def add_file(self, result: SearchResult, *, key: str) -> SearchResult:
        """Register a shared file's source under `key` (its platform id: a file has no canonical URL, and in the
        terminal no URL at all); the earlier one when the same file is registered again."""
        existing = self._by_url.get(key)
        if existing is not None:
            return existing
        registered = result.model_copy(update={"id": f"s{len(self._by_id) + 1}"})
        self._by_url[key] = registered
        self._by_id[registered.id] = registered
        return registered

    def add_results(
        self,
        results: Iterable[SearchResult],
        *,
        blocked_domains: Iterable[str] = (),
        preferred_domains: Iterable[str] = (),
        since: dt.date | None = None,
    ) -> list[SearchResult]:
        """Filter, rank preferred domains first, and register `results`; returns the registered sources, each once."""
        blocked, preferred = list(blocked_domains), list(preferred_domains)
        allowed = [
            result for result in results
            if self.is_allowed(result, blocked_domains=blocked, preferred_domains=preferred, since=since)
        ]
        registered: dict[str, SearchResult] = {}
        for result in self.rank_preferred_first(allowed, preferred):
            source = self.add(result)
            registered.setdefault(source.id, source)
        return list(registered.values())

    @staticmethod
    def _merge(existing: SearchResult, duplicate: SearchResult) -> None:
        """Fold a duplicate's snippets and date into the first registered copy."""
        incoming = [duplicate.snippet, *duplicate.extra_snippets]
        if not existing.snippet and duplicate.snippet:
            existing.snippet = incoming.pop(0)
        known = {existing.snippet, *existing.extra_snippets}
        for snippet in incoming:
            if snippet and snippet not in known:
                existing.extra_snippets.append(snippet)
                known.add(snippet)
        if existing.published is None and duplicate.published is not None:
            existing.published = duplicate.published
