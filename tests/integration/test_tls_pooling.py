"""The fetcher's HTTPS connections against a real TLS server on 127.0.0.1: two names on one address never share a
connection, so a certificate checked for one name never vouches for the other."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import trustme

from research.fetch import FetchConfig, SafeFetcher, build_fetch_client
from research.netguard import parse_allow_list
from tests.fakes.resolver import DictResolver

pytestmark = pytest.mark.integration

SAME_ADDRESS = {"a.example": ["127.0.0.1"], "b.example": ["127.0.0.1"]}


@dataclass(frozen=True)
class ServedRequest:
    """One request as the TLS server saw it: which connection carried it, the SNI of that connection, its Host and path."""

    connection: int
    server_name: str | None
    host: str
    path: str


class TlsSite:
    """An HTTPS/1.1 server on 127.0.0.1 that answers every path with a small page, keeps connections alive, and picks
    its certificate by SNI among `certificates` (the first one when the name is unknown)."""

    def __init__(self, authority: trustme.CA, names: list[str]) -> None:
        self.contexts: dict[str, ssl.SSLContext] = {}
        for name in names:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            authority.issue_cert(name).configure_cert(context)
            self.contexts[name] = context
        self.default_context = self.contexts[names[0]]
        self.default_context.sni_callback = self._choose_certificate
        self.served: list[ServedRequest] = []
        self._server_names: dict[int, str | None] = {}
        self._connections = 0
        self._handlers: set[asyncio.Task] = set()
        self._server: asyncio.Server | None = None
        self.port = 0

    def _choose_certificate(self, ssl_object: ssl.SSLObject, server_name: str | None, _context: ssl.SSLContext) -> None:
        self._server_names[id(ssl_object)] = server_name
        if server_name in self.contexts:
            ssl_object.context = self.contexts[server_name]

    async def __aenter__(self) -> "TlsSite":
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.default_context)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for handler in self._handlers:
            handler.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()

    def url(self, host: str, path: str) -> str:
        return f"https://{host}:{self.port}{path}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handler = asyncio.current_task()
        assert handler is not None
        self._handlers.add(handler)
        self._connections += 1
        connection = self._connections
        server_name = self._server_names.get(id(writer.get_extra_info("ssl_object")))
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                request_line, *header_lines = head.decode("latin-1").split("\r\n")
                path = request_line.split(" ")[1]
                headers = {name.strip().lower(): value.strip()
                           for name, _, value in (line.partition(":") for line in header_lines if line)}
                self.served.append(ServedRequest(connection, server_name, headers.get("host", "").rsplit(":", 1)[0], path))
                body = f"<html><p>{path}</p></html>".encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n"
                             + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
            self._handlers.discard(handler)


@pytest.fixture
def authority() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
async def make_fetcher(authority: trustme.CA) -> AsyncIterator:
    clients = []

    def make() -> SafeFetcher:
        trusting = ssl.create_default_context()
        authority.configure_trust(trusting)
        config = FetchConfig(allow_private=parse_allow_list("a.example,b.example"), respect_robots=False,
                             page_timeout_seconds=10)
        client = build_fetch_client(config, ssl_context=trusting)
        clients.append(client)
        return SafeFetcher(client, DictResolver(SAME_ADDRESS), config)

    yield make
    for client in clients:
        await client.aclose()


async def test_a_name_on_the_same_address_gets_its_own_tls_connection_while_one_name_reuses_its_own(
    authority: trustme.CA, make_fetcher
) -> None:
    async with TlsSite(authority, ["a.example", "b.example"]) as site:
        fetcher = make_fetcher()
        for host, path in [("a.example", "/one"), ("b.example", "/two"), ("a.example", "/three")]:
            result = await fetcher.fetch(site.url(host, path))
            assert result.status == "ok", result.reason

    assert [(request.host, request.path) for request in site.served] == [
        ("a.example", "/one"), ("b.example", "/two"), ("a.example", "/three")]
    assert all(request.server_name == request.host for request in site.served), site.served
    first_a, only_b, second_a = site.served
    assert only_b.connection != first_a.connection
    assert second_a.connection == first_a.connection, "the connection for a.example was not kept for a.example"


async def test_a_certificate_checked_for_one_name_never_vouches_for_another_on_the_same_address(
    authority: trustme.CA, make_fetcher
) -> None:
    async with TlsSite(authority, ["a.example"]) as site:
        fetcher = make_fetcher()
        trusted = await fetcher.fetch(site.url("a.example", "/one"))
        impostor = await fetcher.fetch(site.url("b.example", "/two"))

    assert trusted.status == "ok", trusted.reason
    assert impostor.status == "failed" and not impostor.body
    assert [request.host for request in site.served] == ["a.example"], "b.example was sent over a.example's connection"
