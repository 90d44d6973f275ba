"""URL canonicalisation, hosts and domain matching."""

from __future__ import annotations

import pytest

from research.urls import canonicalize_url, domain_matches, host_of, normalize_domain, url_matches


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("HTTPS://Example.COM/Path", "https://example.com/Path"),
        ("https://example.com", "https://example.com/"),
        ("https://example.com:443/a", "https://example.com/a"),
        ("http://example.com:80/a", "http://example.com/a"),
        ("http://example.com:8080/a", "http://example.com:8080/a"),
        ("https://example.com:80/a", "https://example.com:80/a"),
        ("https://example.com/a#section-2", "https://example.com/a"),
        ("https://example.com./a", "https://example.com/a"),
        ("  https://example.com/a  ", "https://example.com/a"),
        ("https://[2001:DB8::1]:443/a", "https://[2001:db8::1]/a"),
        ("https://user:pw@Example.com/a", "https://user:pw@example.com/a"),
    ],
)
def test_canonical_form_normalises_scheme_host_port_and_fragment(raw: str, canonical: str) -> None:
    assert canonicalize_url(raw) == canonical


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("https://example.com/a?utm_source=x&utm_medium=y", "https://example.com/a"),
        ("https://example.com/a?id=7&utm_campaign=z&page=2", "https://example.com/a?id=7&page=2"),
        ("https://example.com/a?UTM_Source=x&q=1", "https://example.com/a?q=1"),
        ("https://example.com/a?gclid=1&fbclid=2&msclkid=3&q=1", "https://example.com/a?q=1"),
        ("https://example.com/a?mc_cid=1&mc_eid=2&_ga=3&igshid=4", "https://example.com/a"),
        ("https://github.com/o/r/blob/x?ref=main", "https://github.com/o/r/blob/x?ref=main"),
    ],
)
def test_tracking_parameters_are_dropped_and_others_kept_in_order(raw: str, canonical: str) -> None:
    assert canonicalize_url(raw) == canonical


def test_kept_query_parameters_keep_their_encoding() -> None:
    assert canonicalize_url("https://example.com/s?q=a%20b+c&x=%2F&utm_source=n") == "https://example.com/s?q=a%20b+c&x=%2F"


def test_path_case_is_preserved() -> None:
    assert canonicalize_url("https://example.com/CaseSensitive/Path") == "https://example.com/CaseSensitive/Path"


@pytest.mark.parametrize("raw", ["mailto:someone@example.com", "not a url", "ftp://Example.com/file", "https://exa mple.com:99999/"])
def test_non_http_or_broken_urls_come_back_unchanged(raw: str) -> None:
    assert canonicalize_url(raw) == raw


def test_urls_differing_only_in_noise_have_one_canonical_form() -> None:
    variants = [
        "https://Example.com/report?utm_source=newsletter#intro",
        "https://example.com:443/report",
        "HTTPS://EXAMPLE.COM/report?fbclid=abc",
    ]
    assert {canonicalize_url(url) for url in variants} == {"https://example.com/report"}


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("https://WWW.Example.com:8443/x", "www.example.com"),
        ("http://example.com./", "example.com"),
        ("https://[::1]:8080/", "::1"),
        ("no host here", ""),
    ],
)
def test_host_of_returns_the_lower_case_host(url: str, host: str) -> None:
    assert host_of(url) == host


@pytest.mark.parametrize(
    ("entry", "domain"),
    [("Example.com", "example.com"), ("*.example.com", "example.com"), (".example.com", "example.com"),
     ("https://Example.com/path", "example.com"), ("example.com/path", "example.com")],
)
def test_domain_list_entries_are_normalised(entry: str, domain: str) -> None:
    assert normalize_domain(entry) == domain


@pytest.mark.parametrize(
    ("host", "domains", "matches"),
    [
        ("example.com", ["example.com"], True),
        ("www.example.com", ["example.com"], True),
        ("a.b.example.com", ["*.example.com"], True),
        ("EXAMPLE.com", ["example.COM"], True),
        ("notexample.com", ["example.com"], False),
        ("example.com.evil.org", ["example.com"], False),
        ("example.com", ["www.example.com"], False),
        ("example.com", [], False),
        ("", ["example.com"], False),
        ("example.com", [""], False),
    ],
)
def test_domain_matches_the_domain_and_its_subdomains_only(host: str, domains: list[str], matches: bool) -> None:
    assert domain_matches(host, domains) is matches


def test_url_matches_uses_the_url_host() -> None:
    assert url_matches("https://news.example.com/a?b=c", ["example.com"])
    assert not url_matches("https://example.org/example.com", ["example.com"])
