"""The run's source registry: ids, deduplication, merging, and domain and date filters."""

from __future__ import annotations

import datetime as dt

from research.models import SearchResult
from research.sources import SourceRegistry


def hit(url: str, *, provider: str = "brave", snippet: str = "", published: dt.date | None = None,
        extra: list[str] | None = None) -> SearchResult:
    return SearchResult(provider=provider, title=f"title of {url}", url=url, snippet=snippet,
                        published=published, extra_snippets=extra or [])


def test_ids_follow_order_of_first_appearance() -> None:
    registry = SourceRegistry()
    added = registry.add_results([hit("https://a.org/1"), hit("https://b.org/2"), hit("https://c.org/3")])
    assert [source.id for source in added] == ["s1", "s2", "s3"]
    assert [source.id for source in registry.add_results([hit("https://d.org/4")])] == ["s4"]


def test_registered_url_is_the_canonical_one() -> None:
    registry = SourceRegistry()
    source = registry.add(hit("HTTPS://A.org:443/page?utm_source=x#top"))
    assert source.url == "https://a.org/page"


def test_duplicate_urls_keep_the_first_result_and_its_id() -> None:
    registry = SourceRegistry()
    first = registry.add(hit("https://a.org/page", provider="tavily", snippet="from tavily"))
    again = registry.add(hit("https://A.org/page?utm_medium=email", provider="brave", snippet="from brave"))
    assert again is first
    assert (first.id, first.provider, first.snippet) == ("s1", "tavily", "from tavily")
    assert len(registry) == 1


def test_duplicate_snippets_are_added_to_extra_snippets_once() -> None:
    registry = SourceRegistry()
    registry.add(hit("https://a.org/page", snippet="one", extra=["two"]))
    registry.add(hit("https://a.org/page", snippet="three", extra=["two", "four"]))
    registry.add(hit("https://a.org/page", snippet="one"))
    source = registry.find("https://a.org/page")
    assert source is not None
    assert (source.snippet, source.extra_snippets) == ("one", ["two", "three", "four"])


def test_duplicate_fills_an_empty_snippet_and_an_unknown_date() -> None:
    registry = SourceRegistry()
    registry.add(hit("https://a.org/page", provider="exa"))
    registry.add(hit("https://a.org/page", snippet="words", published=dt.date(2024, 5, 1)))
    source = registry.find("https://a.org/page")
    assert source is not None
    assert (source.snippet, source.published, source.provider) == ("words", dt.date(2024, 5, 1), "exa")


def test_add_results_returns_each_source_once() -> None:
    registry = SourceRegistry()
    added = registry.add_results([hit("https://a.org/x"), hit("https://a.org/x#frag"), hit("https://b.org/y")])
    assert [(source.id, source.url) for source in added] == [("s1", "https://a.org/x"), ("s2", "https://b.org/y")]


def test_blocked_domains_and_their_subdomains_are_dropped() -> None:
    registry = SourceRegistry(blocked_domains=["spam.com"])
    added = registry.add_results(
        [hit("https://spam.com/a"), hit("https://www.spam.com/b"), hit("https://ok.org/c")],
        blocked_domains=["other.net"],
    )
    assert [source.url for source in added] == ["https://ok.org/c"]
    assert registry.add_results([hit("https://other.net/d")], blocked_domains=["other.net"]) == []
    assert registry.find("https://spam.com/a") is None


def test_preferred_domains_rank_first_and_get_the_lower_ids() -> None:
    registry = SourceRegistry(preferred_domains=["gov.uk"])
    added = registry.add_results([hit("https://blog.com/a"), hit("https://www.gov.uk/b"), hit("https://news.com/c")])
    assert [source.url for source in added] == ["https://www.gov.uk/b", "https://blog.com/a", "https://news.com/c"]
    assert added[0].id == "s1"


def test_restrict_to_preferred_keeps_only_preferred_domains() -> None:
    registry = SourceRegistry(preferred_domains=["nature.com"], restrict_to_preferred=True)
    added = registry.add_results([hit("https://blog.com/a"), hit("https://www.nature.com/b")], preferred_domains=["arxiv.org"])
    assert [source.url for source in added] == ["https://www.nature.com/b"]
    assert [source.url for source in registry.add_results([hit("https://arxiv.org/abs/1")], preferred_domains=["arxiv.org"])] == [
        "https://arxiv.org/abs/1"
    ]


def test_results_published_before_since_are_dropped_but_undated_ones_kept() -> None:
    registry = SourceRegistry()
    added = registry.add_results(
        [
            hit("https://a.org/old", published=dt.date(2020, 1, 1)),
            hit("https://a.org/new", published=dt.date(2024, 6, 1)),
            hit("https://a.org/undated"),
            hit("https://a.org/same-day", published=dt.date(2024, 1, 1)),
        ],
        since=dt.date(2024, 1, 1),
    )
    assert [source.url for source in added] == ["https://a.org/new", "https://a.org/undated", "https://a.org/same-day"]


def test_lookup_by_id_and_by_any_url_variant() -> None:
    registry = SourceRegistry()
    source = registry.add(hit("https://a.org/page"))
    assert registry.get("s1") is source
    assert registry.find("https://A.ORG/page?fbclid=1") is source
    assert registry.get("s2") is None
    assert registry.all() == [source]
