"""The safe fetcher: every page outcome is a FetchResult, and no request reaches an address the guard did not check.

Each hop (at most `max_redirects` redirects, followed by hand) is checked the same way: scheme
http/https, no userinfo, the host normalised like a browser would, resolved once through the injected
resolver, every address checked against `research.netguard`, then the request is sent to the checked
IP with the original Host header and TLS SNI, so a second DNS answer (rebinding) is never used.
Connections are pooled per host name, checked address and port (`HostPinnedTransport`), so a TLS
connection whose certificate was checked for one name never carries a request for another name on
the same address. A hop to a blocked domain (`blocked_domains`, subdomains included, hosts compared
in the same canonical form as the search-result filter) is refused like a private address.
robots.txt is honoured per origin. Bodies are streamed under a raw cap, a decompressed cap and a
per-page deadline, and charged to a byte budget shared by the whole run.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
import zlib
from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from http.cookiejar import CookieJar, DefaultCookiePolicy
from urllib.parse import urljoin, urlsplit

import httpx
from pydantic import BaseModel, ConfigDict, Field

from research.models import FetchResult, FetchStatus
from research.netguard import (
    AllowList,
    IPAddress,
    MalformedHostError,
    Resolver,
    ResolutionError,
    forbidden_reason,
    ip_literal,
    is_localhost_name,
    normalise_host,
)
from research.robots import RobotsAnswer, RobotsCache
from research.urls import domain_matches

logger = logging.getLogger(__name__)

KIB = 1024
MIB = 1024 * 1024
DEFAULT_USER_AGENT = "deepthread/0.1 (research bot; +https://github.com/deepthread/deepthread)"
ACCEPTED_CONTENT_TYPES = frozenset({"text/html", "application/xhtml+xml", "text/plain", "application/pdf"})
ACCEPT_HEADER = "text/html,application/xhtml+xml,text/plain;q=0.9,application/pdf;q=0.8"
DEFAULT_PORTS = {"http": 80, "https": 443}
SNIFF_BYTES = 512


class FetchConfig(BaseModel):
    """The fetcher's tunables: identity, private-host exemptions, blocked domains, caps, deadlines and concurrency."""

    user_agent: str = DEFAULT_USER_AGENT
    allow_private: AllowList = Field(default_factory=AllowList)
    blocked_domains: tuple[str, ...] = ()
    max_body_bytes: int = 5 * MIB
    max_decoded_bytes: int = 20 * MIB
    max_robots_bytes: int = 500 * KIB
    page_timeout_seconds: float = 10.0
    robots_timeout_seconds: float = 5.0
    max_redirects: int = 5
    max_concurrency: int = 8
    max_per_host: int = 2
    respect_robots: bool = True


class FetchBudget:
    """Bytes a whole run may download (`RESEARCH_MAX_FETCH_BYTES`), shared by every fetch of that run."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.spent = 0

    @property
    def remaining(self) -> int:
        return max(0, self.max_bytes - self.spent)

    @property
    def exhausted(self) -> bool:
        return self.spent >= self.max_bytes

    def charge(self, received: int) -> bool:
        """Record bytes already received and say whether the budget still covers them."""
        self.spent += received
        return self.spent <= self.max_bytes


class Target(BaseModel):
    """One checked hop: the URL as written, its normalised host and port, and the address that was checked."""

    model_config = ConfigDict(frozen=True)

    url: str
    scheme: str
    host: str
    port: int
    address: str
    path_and_query: str

    @property
    def connect_url(self) -> str:
        """The URL with the host replaced by the checked address, which is where the connection goes."""
        netloc = f"[{self.address.replace('%', '%25')}]" if ":" in self.address else self.address
        return f"{self.scheme}://{netloc}:{self.port}{self.path_and_query}"

    @property
    def host_header(self) -> str:
        """The Host header value the server expects for the original URL."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if DEFAULT_PORTS[self.scheme] == self.port else f"{host}:{self.port}"

    @property
    def is_ip_literal(self) -> bool:
        return ip_literal(self.host) is not None


class FetchStopped(Exception):
    """A fetch ends early with a recorded outcome (refused, failed or skipped) and a human reason."""

    def __init__(self, status: FetchStatus, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.final_url: str | None = None
        self.http_status: int | None = None
        self.bytes_read = 0

    def as_result(self, url: str) -> FetchResult:
        """The FetchResult that records this early end for `url`."""
        return FetchResult(
            url=url, final_url=self.final_url, status=self.status, reason=self.reason,
            http_status=self.http_status, bytes_read=self.bytes_read,
        )


def describe_size(size: int) -> str:
    """Render a byte count the way a person would say it ("5 MiB", "64 KiB", "1000 bytes")."""
    if size >= MIB and size % MIB == 0:
        return f"{size // MIB} MiB"
    if size >= KIB and size % KIB == 0:
        return f"{size // KIB} KiB"
    return f"{size} bytes"


def media_type_of(content_type: str | None) -> str:
    """Return the lower-case media type of a Content-Type header, without parameters ('' when missing)."""
    return (content_type or "").split(";")[0].strip().lower()


def sniff_media_type(prefix: bytes) -> str | None:
    """Guess PDF or HTML from a body's first bytes, or None."""
    if prefix.startswith(b"%PDF-"):
        return "application/pdf"
    head = prefix.lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    if head.startswith((b"<!doctype html", b"<html")):
        return "text/html"
    return None


def sniffed_content_type(declared: str, body: bytes) -> str:
    """Return the type of an unlabelled (or octet-stream) body: PDF, or HTML when no type was declared; raises FetchStopped otherwise."""
    sniffed = sniff_media_type(body[:SNIFF_BYTES])
    if sniffed == "application/pdf" or (sniffed is not None and declared == ""):
        return sniffed
    raise FetchStopped("refused", f"content type {declared or 'missing'} not accepted")


class BoundedDecoder:
    """Undoes a gzip or deflate Content-Encoding without ever producing more than `limit` bytes in total."""

    def __init__(self, content_encoding: str, limit: int) -> None:
        self.encoding = content_encoding.strip().lower()
        self.limit = limit
        self.produced = 0
        self._first_chunk = True
        if self.encoding in ("", "identity"):
            self._decompressor = None
        elif self.encoding in ("gzip", "x-gzip"):
            self._decompressor = zlib.decompressobj(zlib.MAX_WBITS | 16)
        elif self.encoding == "deflate":
            self._decompressor = zlib.decompressobj()
        else:
            raise FetchStopped("refused", f"content encoding {self.encoding} not supported")

    def feed(self, data: bytes) -> bytes:
        """Decode one raw chunk; raises FetchStopped when the decoded total passes the limit or the data is corrupt."""
        return self._counted(data if self._decompressor is None else self._decompress(data))

    def _decompress(self, data: bytes) -> bytes:
        assert self._decompressor is not None
        # One more byte than allowed is enough to know the cap is passed, without inflating a bomb.
        allowance = self.limit - self.produced + 1
        try:
            decoded = self._decompressor.decompress(data, allowance)
        except zlib.error as error:
            if self._first_chunk and self.encoding == "deflate":
                # Some servers send raw deflate without the zlib wrapper that the name promises.
                self._first_chunk = False
                self._decompressor = zlib.decompressobj(-zlib.MAX_WBITS)
                return self._decompress(data)
            raise FetchStopped("failed", f"body could not be decompressed ({self.encoding})") from error
        self._first_chunk = False
        return decoded

    def finish(self) -> bytes:
        """Return whatever the decompressor still holds; raises FetchStopped if that passes the limit."""
        if self._decompressor is None:
            return b""
        try:
            rest = self._decompressor.flush()
        except zlib.error as error:
            raise FetchStopped("failed", f"body could not be decompressed ({self.encoding})") from error
        return self._counted(rest)

    def _counted(self, decoded: bytes) -> bytes:
        self.produced += len(decoded)
        if self.produced > self.limit:
            raise FetchStopped("refused", f"decompressed body over {describe_size(self.limit)} cap")
        return decoded


class PoolKey(BaseModel):
    """What a pooled connection was opened for: a connection serves only requests with the same key."""

    model_config = ConfigDict(frozen=True)

    scheme: str
    host: str
    server_name: str | None
    address: str
    port: int | None


def pool_key(request: httpx.Request) -> PoolKey:
    """The key of the connection `request` may use: its scheme, Host header, TLS server name, and the address and port it goes to."""
    server_name = request.extensions.get("sni_hostname")
    return PoolKey(
        scheme=request.url.scheme,
        host=request.headers.get("host", request.url.host).lower(),
        server_name=str(server_name).lower() if server_name else None,
        address=request.url.host,
        port=request.url.port,
    )


class HostPinnedTransport(httpx.AsyncBaseTransport):
    """One connection pool per host name, checked address and port, so no connection is shared by two names on one address.

    httpx pools by the URL's origin, which for the fetcher is the checked IP: without this, a request for
    b.example could ride a TLS connection whose certificate was checked for a.example.
    """

    def __init__(self, *, ssl_context: ssl.SSLContext | None = None, limits: httpx.Limits | None = None) -> None:
        # One context for every pool: building one per host would reload the CA bundle each time.
        self._ssl_context = ssl_context if ssl_context is not None else httpx.create_ssl_context(trust_env=False)
        self._limits = limits or httpx.Limits()
        self._pools: dict[PoolKey, httpx.AsyncHTTPTransport] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        key = pool_key(request)
        pool = self._pools.get(key)
        if pool is None:
            pool = httpx.AsyncHTTPTransport(verify=self._ssl_context, limits=self._limits, trust_env=False)
            self._pools[key] = pool
        return await pool.handle_async_request(request)

    async def aclose(self) -> None:
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            await pool.aclose()


def build_fetch_client(config: FetchConfig, transport: httpx.AsyncBaseTransport | None = None, *,
                       ssl_context: ssl.SSLContext | None = None) -> httpx.AsyncClient:
    """Build the HTTP client the fetcher expects: pools per host and address, no proxies from the environment, no redirects, no cookies kept."""
    if transport is None:
        limits = httpx.Limits(max_connections=config.max_concurrency, max_keepalive_connections=config.max_per_host)
        transport = HostPinnedTransport(ssl_context=ssl_context, limits=limits)
    return httpx.AsyncClient(
        transport=transport,
        trust_env=False,
        follow_redirects=False,
        cookies=httpx.Cookies(CookieJar(policy=DefaultCookiePolicy(allowed_domains=[]))),
        timeout=httpx.Timeout(config.page_timeout_seconds),
        headers={"User-Agent": config.user_agent},
    )


class SafeFetcher:
    """Fetches pages for one run under the SSRF guard, robots.txt, caps, deadlines, concurrency limits and the run's byte budget."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        resolver: Resolver,
        config: FetchConfig | None = None,
        budget: FetchBudget | None = None,
    ) -> None:
        self.config = config or FetchConfig()
        self.budget = budget or FetchBudget(25 * MIB)
        self._client = client
        self._resolver = resolver
        self._overall = asyncio.Semaphore(self.config.max_concurrency)
        self._per_host: dict[str, asyncio.Semaphore] = {}
        self.robots = RobotsCache(self._fetch_robots, self.config.user_agent)

    async def fetch(self, url: str) -> FetchResult:
        """Fetch one URL and return its recorded outcome; never raises for a problem with the page."""
        started = time.monotonic()
        result = await self._fetch_with_limits(url)
        return result.model_copy(update={"seconds": round(time.monotonic() - started, 3)})

    async def _fetch_with_limits(self, url: str) -> FetchResult:
        if self.budget.exhausted:
            return FetchResult(url=url, status="skipped", reason="fetch budget spent")
        async with self._overall:
            if self.budget.exhausted:
                return FetchResult(url=url, status="skipped", reason="fetch budget spent")
            seconds = self.config.page_timeout_seconds
            try:
                async with asyncio.timeout(seconds) as deadline:
                    return await self._fetch_page(url, deadline)
            except TimeoutError:
                return FetchResult(url=url, status="failed", reason=f"timed out after {seconds:g} s")
            except FetchStopped as stopped:
                return stopped.as_result(url)
            except httpx.HTTPError as error:
                return FetchResult(url=url, status="failed", reason=describe_http_error(error))
            except Exception as error:  # a page must never end the run, whatever went wrong
                logger.exception("unexpected error while fetching a page")
                return FetchResult(url=url, status="failed", reason=f"unexpected error ({type(error).__name__})")

    async def _fetch_page(self, url: str, deadline: asyncio.Timeout) -> FetchResult:
        async with self._final_response(url, deadline, check_robots=self.config.respect_robots) as (target, response):
            counter = _RawCounter()
            try:
                content_type, body = await self._accepted_body(response, counter)
            except FetchStopped as stopped:
                stopped.final_url = target.url
                stopped.http_status = response.status_code
                stopped.bytes_read = counter.raw_bytes
                raise
            return FetchResult(
                url=url,
                final_url=target.url,
                status="ok",
                http_status=response.status_code,
                content_type=content_type,
                body=body,
                bytes_read=counter.raw_bytes,
            )

    async def _accepted_body(self, response: httpx.Response, counter: "_RawCounter") -> tuple[str, bytes]:
        if not 200 <= response.status_code < 300:
            raise FetchStopped("failed", f"HTTP {response.status_code}")
        declared_type = response.headers.get("content-type", "")
        media_type = media_type_of(declared_type)
        must_sniff = media_type in ("", "application/octet-stream")
        if not must_sniff and media_type not in ACCEPTED_CONTENT_TYPES:
            raise FetchStopped("refused", f"content type {media_type} not accepted")
        declared_length = response.headers.get("content-length", "")
        if declared_length.isdigit() and int(declared_length) > self.config.max_body_bytes:
            raise FetchStopped("refused", f"body over {describe_size(self.config.max_body_bytes)} cap")
        body = bytearray()
        sniffed_type: str | None = None
        async with aclosing(self._decoded_chunks(response, counter, self.config.max_body_bytes)) as chunks:
            async for chunk in chunks:
                body += chunk
                if must_sniff and sniffed_type is None and len(body) >= SNIFF_BYTES:
                    # Decide on an unlabelled body early rather than download a binary to the cap.
                    sniffed_type = sniffed_content_type(media_type, bytes(body))
        if must_sniff:
            return sniffed_type or sniffed_content_type(media_type, bytes(body)), bytes(body)
        return declared_type, bytes(body)

    async def _decoded_chunks(
        self, response: httpx.Response, counter: "_RawCounter", raw_cap: int, *, enforce_budget: bool = True
    ) -> AsyncIterator[bytes]:
        if response.is_stream_consumed:
            # A response built from bytes (httpx.MockTransport in tests) arrives already read and decoded.
            decoder = BoundedDecoder("identity", self.config.max_decoded_bytes)
            raw_chunks: AsyncIterator[bytes] = _one_chunk(response.content)
        else:
            decoder = BoundedDecoder(response.headers.get("content-encoding", ""), self.config.max_decoded_bytes)
            raw_chunks = response.aiter_raw()
        async for raw in raw_chunks:
            counter.raw_bytes += len(raw)
            if not self.budget.charge(len(raw)) and enforce_budget:
                raise FetchStopped("skipped", "fetch budget spent")
            if counter.raw_bytes > raw_cap:
                raise FetchStopped("refused", f"body over {describe_size(raw_cap)} cap")
            decoded = decoder.feed(raw)
            if decoded:
                yield decoded
        rest = decoder.finish()
        if rest:
            yield rest

    @asynccontextmanager
    async def _final_response(
        self, url: str, deadline: asyncio.Timeout | None, *, check_robots: bool
    ) -> AsyncIterator[tuple[Target, httpx.Response]]:
        current = url
        for hop in range(self.config.max_redirects + 1):
            try:
                target = await self._checked_target(current)
            except FetchStopped as stopped:
                if hop == 0:
                    raise
                raise FetchStopped(stopped.status, f"{stopped.reason} (after redirect to {current})") from stopped
            if check_robots:
                refusal = await self.robots.refusal(target.url)
                if refusal is not None:
                    raise FetchStopped("skipped", refusal)
            async with self._host_slot(target.host, deadline):
                response = await self._send(target)
                try:
                    if not response.has_redirect_location:
                        yield target, response
                        return
                    location = response.headers["location"]
                finally:
                    await response.aclose()
            current = urljoin(current, location)
        raise FetchStopped("failed", f"more than {self.config.max_redirects} redirects")

    async def _checked_target(self, url: str) -> Target:
        parts = urlsplit(url.strip())
        scheme = parts.scheme.lower()
        if scheme not in DEFAULT_PORTS:
            raise FetchStopped("refused", f"scheme {scheme or 'missing'} not allowed")
        # Userinfo is a classic parser-confusion trick (http://trusted@evil/) and we never send credentials.
        if "@" in parts.netloc:
            raise FetchStopped("refused", "credentials in URL not allowed")
        if not parts.hostname or "%" in parts.hostname:
            raise FetchStopped("refused", "URL has no usable host")
        try:
            port = parts.port or DEFAULT_PORTS[scheme]
            host = normalise_host(parts.hostname)
        except MalformedHostError as error:
            raise FetchStopped("refused", str(error)) from error
        except ValueError as error:
            raise FetchStopped("refused", "invalid port in URL") from error
        if domain_matches(host, self.config.blocked_domains):
            raise FetchStopped("refused", f"blocked domain {host}")
        address = await self._checked_address(host)
        path_and_query = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        return Target(url=url, scheme=scheme, host=host, port=port, address=address, path_and_query=path_and_query)

    async def _checked_address(self, host: str) -> str:
        allow_list = self.config.allow_private
        literal = ip_literal(host)
        if literal is not None:
            addresses = [literal]
        else:
            if is_localhost_name(host) and host not in allow_list.hosts:
                raise FetchStopped("refused", f"loopback name {host}")
            addresses = await self._resolved_addresses(host)
        for address in addresses:
            reason = forbidden_reason(address)
            if reason is not None and not allow_list.allows(host, address):
                suffix = "" if literal is not None else f" (resolved from {host})"
                raise FetchStopped("refused", reason + suffix)
        return str(addresses[0])

    async def _resolved_addresses(self, host: str) -> list[IPAddress]:
        try:
            answers = await self._resolver.resolve(host)
        except (ResolutionError, OSError) as error:
            raise FetchStopped("failed", f"could not resolve {host}") from error
        addresses = [address for address in (ip_literal(answer) for answer in answers) if address is not None]
        if not addresses or len(addresses) != len(answers):
            raise FetchStopped("failed", f"resolver gave no usable address for {host}")
        return addresses

    @asynccontextmanager
    async def _host_slot(self, host: str, deadline: asyncio.Timeout | None) -> AsyncIterator[None]:
        semaphore = self._per_host.setdefault(host, asyncio.Semaphore(self.config.max_per_host))
        loop = asyncio.get_running_loop()
        when = deadline.when() if deadline is not None else None
        if deadline is not None and when is not None and semaphore.locked():
            # Waiting for our turn at a busy host is not the page's fault, so the deadline pauses meanwhile.
            remaining = when - loop.time()
            deadline.reschedule(None)
            await semaphore.acquire()
            deadline.reschedule(loop.time() + remaining)
        else:
            await semaphore.acquire()
        try:
            yield
        finally:
            semaphore.release()

    async def _send(self, target: Target) -> httpx.Response:
        extensions: dict[str, object] = {}
        if target.scheme == "https" and not target.is_ip_literal:
            extensions["sni_hostname"] = target.host
        request = self._client.build_request(
            "GET",
            target.connect_url,
            headers={
                "Host": target.host_header,
                "User-Agent": self.config.user_agent,
                "Accept": ACCEPT_HEADER,
                "Accept-Encoding": "gzip, deflate",
            },
            extensions=extensions,
        )
        # Cookies of one site must not travel to another site that shares its address.
        request.headers.pop("cookie", None)
        return await self._client.send(request, stream=True, follow_redirects=False)

    async def _fetch_robots(self, robots_url: str) -> RobotsAnswer:
        seconds = self.config.robots_timeout_seconds
        try:
            async with asyncio.timeout(seconds) as deadline:
                async with self._final_response(robots_url, deadline, check_robots=False) as (_target, response):
                    if not 200 <= response.status_code < 300:
                        return RobotsAnswer(http_status=response.status_code)
                    text = await self._read_robots_body(response)
                    return RobotsAnswer(http_status=response.status_code, body=text)
        except TimeoutError:
            return RobotsAnswer(problem=f"timed out after {seconds:g} s")
        except FetchStopped as stopped:
            return RobotsAnswer(problem=stopped.reason)
        except httpx.HTTPError as error:
            return RobotsAnswer(problem=describe_http_error(error))

    async def _read_robots_body(self, response: httpx.Response) -> str:
        cap = self.config.max_robots_bytes
        body = bytearray()
        counter = _RawCounter()
        # RFC 9309 lets a crawler ignore rules past its size limit, so a long file is cut, not refused.
        raw_cap = max(cap, self.config.max_body_bytes)
        # Charged to the budget but never cut by it: a half-read robots.txt would be cached as unreachable.
        async with aclosing(self._decoded_chunks(response, counter, raw_cap, enforce_budget=False)) as chunks:
            async for chunk in chunks:
                body += chunk
                if len(body) >= cap:
                    break
        return bytes(body[:cap]).decode("utf-8", errors="replace")


async def _one_chunk(content: bytes) -> AsyncIterator[bytes]:
    yield content


class _RawCounter:
    """Bytes received on the wire for one response, before any decoding."""

    def __init__(self) -> None:
        self.raw_bytes = 0


def describe_http_error(error: httpx.HTTPError) -> str:
    """Turn an httpx error into a short reason such as "connection failed (ConnectError)"."""
    if isinstance(error, httpx.TimeoutException):
        return f"network timeout ({type(error).__name__})"
    if isinstance(error, httpx.ConnectError):
        return "connection failed (ConnectError)"
    if isinstance(error, httpx.RemoteProtocolError):
        return "server broke the HTTP protocol (RemoteProtocolError)"
    return f"transfer failed ({type(error).__name__})"
