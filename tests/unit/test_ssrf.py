"""The SSRF guard: refused addresses never reach a connection, checked ones are what the connection uses."""

from __future__ import annotations

import ipaddress

import httpx
import pytest

from research.fetch import FetchConfig, SafeFetcher, build_fetch_client
from research.netguard import (
    MalformedHostError,
    forbidden_reason,
    normalise_host,
    parse_allow_list,
    parse_numeric_ipv4,
)
from tests.fakes.resolver import DictResolver, RebindingResolver
from tests.fakes.web import FakeWeb, Page

PUBLIC_ADDRESS = "93.184.216.34"

NAMES = {
    "public.example": [PUBLIC_ADDRESS],
    "redirector.example": ["93.184.216.35"],
    "internal.example": ["10.0.0.5"],
    "mixed.example": [PUBLIC_ADDRESS, "10.0.0.7"],
    "metadata.example": ["169.254.169.254"],
    "loopback6.example": ["::1"],
    "mapped.example": ["::ffff:127.0.0.1"],
    "intranet.corp": ["10.1.2.3"],
    "localhost": ["127.0.0.1"],
}


class RecordingTransport(httpx.AsyncBaseTransport):
    """Stands in for the network: records every request it is asked to send and answers from a function."""

    def __init__(self, answer: httpx.MockTransport | None = None) -> None:
        self.requests: list[httpx.Request] = []
        self._answer = answer or httpx.MockTransport(ordinary_site)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return await self._answer.handle_async_request(request)


def ordinary_site(request: httpx.Request) -> httpx.Response:
    if request.url.path == "/robots.txt":
        return httpx.Response(404)
    return httpx.Response(200, headers={"content-type": "text/html"}, content=b"<html><p>hello</p></html>")


def fetcher_for(transport: httpx.AsyncBaseTransport, resolver: object, allow: str = "") -> SafeFetcher:
    config = FetchConfig(allow_private=parse_allow_list(allow), page_timeout_seconds=2)
    return SafeFetcher(build_fetch_client(config, transport=transport), resolver, config)  # type: ignore[arg-type]


REFUSED = [
    ("http://127.0.0.1/", "loopback address 127.0.0.1"),
    ("http://localhost/", "loopback name localhost"),
    ("http://LOCALHOST./admin", "loopback name localhost"),
    ("http://api.localhost/", "loopback name api.localhost"),
    ("http://[::1]/", "loopback address ::1"),
    ("http://0.0.0.0/", "unspecified address 0.0.0.0"),
    ("http://0/", "unspecified address 0.0.0.0"),
    ("http://[::]/", "unspecified address ::"),
    ("http://169.254.169.254/latest/meta-data/", "link-local address 169.254.169.254"),
    ("http://10.0.0.1/", "private address 10.0.0.1"),
    ("https://10.0.0.1/", "private address 10.0.0.1"),
    ("http://172.16.0.1/", "private address 172.16.0.1"),
    ("http://192.168.1.1:8080/", "private address 192.168.1.1"),
    ("http://100.100.100.200/", "shared (CGNAT) address 100.100.100.200"),
    ("http://224.0.0.1/", "multicast address 224.0.0.1"),
    ("http://240.0.0.1/", "reserved address 240.0.0.1"),
    ("http://[::ffff:127.0.0.1]/", "loopback address 127.0.0.1 (IPv4-mapped"),
    ("http://[::127.0.0.1]/", "loopback address 127.0.0.1 (IPv4-compatible"),
    ("http://[64:ff9b::a00:1]/", "private address 10.0.0.1 (NAT64"),
    ("http://[2002:a9fe:a9fe::]/", "link-local address 169.254.169.254 (6to4"),
    ("http://[fe80::1]/", "link-local address fe80::1"),
    ("http://[fc00::1]/", "private address fc00::1"),
    ("http://[ff02::1]/", "multicast address ff02::1"),
    ("http://2130706433/", "loopback address 127.0.0.1"),
    ("http://0x7f000001/", "loopback address 127.0.0.1"),
    ("http://0177.0.0.1/", "loopback address 127.0.0.1"),
    ("http://127.1/", "loopback address 127.0.0.1"),
    ("http://0x7f.0.0.1/", "loopback address 127.0.0.1"),
    ("http://256.0.0.1/", "out of range"),
    ("http://%31%32%37.0.0.1/", "no usable host"),
    ("http://internal.example/", "private address 10.0.0.5 (resolved from internal.example)"),
    ("http://mixed.example/", "private address 10.0.0.7 (resolved from mixed.example)"),
    ("http://metadata.example/", "link-local address 169.254.169.254"),
    ("http://loopback6.example/", "loopback address ::1"),
    ("http://mapped.example/", "loopback address 127.0.0.1 (IPv4-mapped"),
    ("file:///etc/passwd", "scheme file not allowed"),
    ("gopher://127.0.0.1:70/_GET%20/", "scheme gopher not allowed"),
    ("ftp://public.example/file", "scheme ftp not allowed"),
    ("//public.example/", "scheme missing not allowed"),
    ("http://user:secret@public.example/", "credentials in URL not allowed"),
    ("http://public.example@127.0.0.1/", "credentials in URL not allowed"),
    ("http://public.example:99999/", "invalid port"),
]


@pytest.mark.parametrize(("url", "expected_reason"), REFUSED, ids=[url for url, _ in REFUSED])
async def test_forbidden_destination_is_refused_before_any_connection(url: str, expected_reason: str) -> None:
    transport = RecordingTransport()
    fetcher = fetcher_for(transport, DictResolver(NAMES))

    result = await fetcher.fetch(url)

    assert result.status == "refused"
    assert expected_reason in (result.reason or "")
    assert transport.requests == []


async def test_ip_literal_is_checked_without_asking_the_resolver() -> None:
    resolver = DictResolver(NAMES)
    fetcher = fetcher_for(RecordingTransport(), resolver)

    await fetcher.fetch("http://10.0.0.1/")

    assert resolver.lookups == []


async def test_public_host_is_reached_at_its_checked_address_with_original_host_header() -> None:
    transport = RecordingTransport()
    fetcher = fetcher_for(transport, DictResolver(NAMES))

    result = await fetcher.fetch("http://public.example/story?id=7#top")

    assert result.status == "ok"
    page_request = transport.requests[-1]
    assert page_request.url.host == PUBLIC_ADDRESS
    assert page_request.url.raw_path == b"/story?id=7"
    assert page_request.headers["host"] == "public.example"
    assert result.final_url == "http://public.example/story?id=7#top"


async def test_https_request_carries_sni_hostname_of_the_original_host() -> None:
    transport = RecordingTransport()
    # Allowed by name, so it keeps its port 8443 (a public host is fetched on 80 and 443 only).
    fetcher = fetcher_for(transport, DictResolver(NAMES), allow="public.example")

    await fetcher.fetch("https://public.example:8443/")

    page_request = transport.requests[-1]
    assert str(page_request.url) == f"https://{PUBLIC_ADDRESS}:8443/"
    assert page_request.extensions["sni_hostname"] == "public.example"
    assert page_request.headers["host"] == "public.example:8443"


async def test_rebinding_name_is_connected_only_at_the_address_that_was_checked() -> None:
    resolver = RebindingResolver({"rebind.example": [[PUBLIC_ADDRESS], ["127.0.0.1"]]})
    transport = RecordingTransport()
    config = FetchConfig(respect_robots=False)
    fetcher = SafeFetcher(build_fetch_client(config, transport=transport), resolver, config)

    first = await fetcher.fetch("http://rebind.example/")
    second = await fetcher.fetch("http://rebind.example/")

    assert first.status == "ok"
    assert [request.url.host for request in transport.requests] == [PUBLIC_ADDRESS]
    assert second.status == "refused"
    assert second.reason == "loopback address 127.0.0.1 (resolved from rebind.example)"
    assert resolver.lookups == ["rebind.example", "rebind.example"]


async def test_redirect_to_private_address_is_refused_before_following_it() -> None:
    def redirect_inward(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/robots.txt":
            return httpx.Response(404)
        return httpx.Response(302, headers={"location": "http://10.0.0.1/admin"})

    transport = RecordingTransport(httpx.MockTransport(redirect_inward))
    fetcher = fetcher_for(transport, DictResolver(NAMES))

    result = await fetcher.fetch("http://redirector.example/go")

    assert result.status == "refused"
    assert result.reason == "private address 10.0.0.1 (after redirect to http://10.0.0.1/admin)"
    assert {request.url.host for request in transport.requests} == {"93.184.216.35"}


async def test_redirect_to_name_resolving_privately_is_refused() -> None:
    def redirect_inward(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/robots.txt":
            return httpx.Response(404)
        return httpx.Response(301, headers={"location": "//internal.example/secrets"})

    transport = RecordingTransport(httpx.MockTransport(redirect_inward))
    fetcher = fetcher_for(transport, DictResolver(NAMES))

    result = await fetcher.fetch("https://redirector.example/go")

    assert result.status == "refused"
    assert "private address 10.0.0.5" in (result.reason or "")
    assert {request.url.host for request in transport.requests} == {"93.184.216.35"}


async def test_redirect_to_file_scheme_is_refused() -> None:
    def redirect_to_file(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/robots.txt":
            return httpx.Response(404)
        return httpx.Response(307, headers={"location": "file:///etc/passwd"})

    fetcher = fetcher_for(RecordingTransport(httpx.MockTransport(redirect_to_file)), DictResolver(NAMES))

    result = await fetcher.fetch("http://redirector.example/")

    assert result.status == "refused"
    assert (result.reason or "").startswith("scheme file not allowed")


async def test_private_host_listed_in_allow_list_is_fetched() -> None:
    transport = RecordingTransport()
    fetcher = fetcher_for(transport, DictResolver(NAMES), allow="intranet.corp")

    result = await fetcher.fetch("http://INTRANET.corp/wiki")

    assert result.status == "ok"
    assert transport.requests[-1].url.host == "10.1.2.3"
    assert transport.requests[-1].headers["host"] == "intranet.corp"


async def test_allow_listed_host_does_not_open_other_private_hosts() -> None:
    transport = RecordingTransport()
    fetcher = fetcher_for(transport, DictResolver(NAMES), allow="intranet.corp")

    result = await fetcher.fetch("http://internal.example/")

    assert result.status == "refused"
    assert transport.requests == []


async def test_allow_listed_network_admits_its_addresses_only() -> None:
    transport = RecordingTransport()
    fetcher = fetcher_for(transport, DictResolver(NAMES), allow="10.0.0.0/8")

    inside = await fetcher.fetch("http://10.20.30.40/")
    outside = await fetcher.fetch("http://192.168.1.1/")

    assert inside.status == "ok"
    assert outside.status == "refused"
    assert {request.url.host for request in transport.requests} == {"10.20.30.40"}


async def test_loopback_server_is_not_contacted_when_not_allow_listed() -> None:
    web = FakeWeb({"http://alpha.example/": Page("<p>hi</p>")})
    config = FetchConfig()
    with web:
        async with build_fetch_client(config) as client:
            fetcher = SafeFetcher(client, web.resolver(), config)
            result = await fetcher.fetch(web.url("http://alpha.example/"))

    assert result.status == "refused"
    assert result.reason == "loopback address 127.0.0.1 (resolved from alpha.example)"
    assert len(web.requests) == 0


async def test_unknown_name_fails_as_unresolvable_without_connecting() -> None:
    transport = RecordingTransport()
    fetcher = fetcher_for(transport, DictResolver(NAMES))

    result = await fetcher.fetch("http://nowhere.example/")

    assert result.status == "failed"
    assert result.reason == "could not resolve nowhere.example"
    assert transport.requests == []


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("2130706433", "127.0.0.1"),
        ("0x7f000001", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("10.1", "10.0.0.1"),
        ("192.168.257", "192.168.1.1"),
        ("0x0A.0.0.1", "10.0.0.1"),
        ("8.8.8.8.", "8.8.8.8"),
    ],
)
def test_numeric_hosts_are_read_like_a_browser_would(host: str, expected: str) -> None:
    assert str(parse_numeric_ipv4(host)) == expected


@pytest.mark.parametrize("host", ["1.2.3.4.5", "4294967296", "08.0.0.1", "1.256.0.0", "foo.123"])
def test_malformed_numeric_hosts_are_rejected(host: str) -> None:
    with pytest.raises(MalformedHostError):
        normalise_host(host)


def test_names_are_normalised_to_lower_case_idna_without_trailing_dot() -> None:
    assert normalise_host("Bücher.Example.") == "xn--bcher-kva.example"
    assert parse_numeric_ipv4("example.com") is None


@pytest.mark.parametrize("address", ["8.8.8.8", "2606:4700::1111", "64:ff9b::808:808", "2002:808:808::1"])
def test_public_addresses_are_not_forbidden(address: str) -> None:
    assert forbidden_reason(ipaddress.ip_address(address)) is None


def test_allow_list_parses_hosts_addresses_and_networks() -> None:
    allow_list = parse_allow_list("Intranet.Corp, 10.0.0.0/8  192.168.5.5\n[fd00::1]")

    assert allow_list.hosts == frozenset({"intranet.corp"})
    assert allow_list.allows("intranet.corp", ipaddress.ip_address("172.16.0.1"))
    assert allow_list.allows("other.corp", ipaddress.ip_address("10.9.9.9"))
    assert allow_list.allows("other.corp", ipaddress.ip_address("192.168.5.5"))
    assert allow_list.allows("other.corp", ipaddress.ip_address("fd00::1"))
    assert not allow_list.allows("other.corp", ipaddress.ip_address("192.168.5.6"))


def test_allow_list_rejects_malformed_network() -> None:
    with pytest.raises(ValueError):
        parse_allow_list("10.0.0.0/33")


def test_ascii_names_with_underscores_are_accepted_and_junk_is_not() -> None:
    assert normalise_host("My_Host.Example.com") == "my_host.example.com"
    with pytest.raises(MalformedHostError):
        normalise_host("bad host.example")
