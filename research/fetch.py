"""The safe fetcher: every page outcome is a FetchResult, and no request reaches an address the guard did not check.

Each hop (at most `max_redirects` redirects, followed by hand) is checked the same way: scheme
http/https, no userinfo, the host normalised like a browser would, resolved once through the injected
resolver, every address checked against `research.netguard`, port 80 or 443 unless the host is allowed
although private (`allow_private`), then the request is sent to the checked IP with the original Host
header and TLS SNI, so a second DNS answer (rebinding) is never used.
Connections are pooled per host name, checked address and port (`HostPinnedTransport`), so a TLS
connection whose certificate was checked for one name never carries a request for another name on
the same address. A hop to a blocked domain (`blocked_domains`, subdomains included, hosts compared
in the same canonical form as the search-result filter) is refused like a private address.
robots.txt is honoured per origin. Each host gets `max_per_host` requests at once; a robots.txt
Crawl-delay makes that one at a time, spaced by the delay, and a 429 halves it and pauses the host for
its Retry-After (both waits capped, and never past a page's deadline). Bodies are streamed under a raw cap, a decompressed cap and a
per-page deadline, and charged to a byte budget shared by the whole run.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import ssl
import time
import zlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing, asynccontextmanager
from http.cookiejar import CookieJar, DefaultCookiePolicy
from urllib.parse import urljoin, urlsplit

import httpx
from pydantic import BaseModel, ConfigDict, Field

from research.errors import DeepthreadError
from research.models import FetchResult, FetchStatus
from research.providers.base import parse_retry_after
from research.netguard import (
    DEFAULT_PORTS,
    AllowList,
    IPAddress,
    MalformedHostError,
    Resolver,
    ResolutionError,
    forbidden_port_reason,
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
SNIFF_BYTES = 512
# A 429 without a Retry-After still earns the host a short pause before the page is asked again.
DEFAULT_TOO_MANY_REQUESTS_WAIT_SECONDS = 1.0

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]


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
    # What browsers open per host; a robots.txt crawl delay or a 429 lowers it for that host.
    max_per_host: int = 6
    # Crawl delays and Retry-After waits are cut to this: a polite pause, never a stalled run.
    max_host_wait_seconds: float = 10.0
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


class PageDeadline:
    """A page's time allowance on an injected clock: the page's task is stopped with TimeoutError when it runs out.

    Like `asyncio.timeout`, but it can be paused (waiting for a busy host is not the page's fault) and the
    clock and sleep are handed in, so tests move time by hand.
    """

    def __init__(self, seconds: float, *, clock: Clock, sleep: Sleep) -> None:
        self.seconds = seconds
        self._clock = clock
        self._sleep = sleep
        self._expires_at = math.inf
        self._paused_remaining: float | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._task: asyncio.Task[object] | None = None
        self._cancelling = 0
        self.expired = False

    @property
    def remaining(self) -> float:
        """Seconds left before the page is given up."""
        if self._paused_remaining is not None:
            return self._paused_remaining
        return self._expires_at - self._clock()

    async def __aenter__(self) -> "PageDeadline":
        self._task = asyncio.current_task()
        assert self._task is not None
        self._cancelling = self._task.cancelling()
        self._arm(self.seconds)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        self._disarm()
        assert self._task is not None
        # As asyncio.timeout does: our own cancel becomes TimeoutError, anyone else's stays a cancel.
        if self.expired and self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc

    @asynccontextmanager
    async def paused(self) -> AsyncIterator[None]:
        """Stop the allowance from running out while the block runs, then resume it with what was left."""
        remaining = self.remaining
        self._disarm()
        self._paused_remaining = remaining
        try:
            yield
        finally:
            self._paused_remaining = None
            if not self.expired:
                self._arm(remaining)

    def _arm(self, seconds: float) -> None:
        self._expires_at = self._clock() + seconds
        self._watchdog = asyncio.create_task(self._expire_after(seconds), name="page deadline")

    def _disarm(self) -> None:
        if self._watchdog is not None and not self._watchdog.done():
            self._watchdog.cancel()
        self._watchdog = None

    async def _expire_after(self, seconds: float) -> None:
        await self._sleep(max(0.0, seconds))
        self.expired = True
        assert self._task is not None
        self._task.cancel()


class HostPace:
    """How one host may be asked: how many requests at once, and the earliest start of the next one."""

    def __init__(self, max_in_flight: int) -> None:
        self.max_in_flight = max_in_flight
        self.in_flight = 0
        self.spacing_seconds = 0.0
        self.next_start = -math.inf
        self.slowed_because: str | None = None
        self._waiters: list[asyncio.Future[None]] = []

    @property
    def busy(self) -> bool:
        return self.in_flight >= self.max_in_flight

    @property
    def waiting(self) -> int:
        """Requests waiting for one in flight to end."""
        return len(self._waiters)

    def follow_crawl_delay(self, seconds: float) -> None:
        """Ask one request at a time, starts `seconds` apart (robots.txt's Crawl-delay, already capped)."""
        if seconds > self.spacing_seconds:
            self.spacing_seconds = seconds
            self.slowed_because = f"robots.txt asks for {seconds:g} s between requests"
        self.max_in_flight = 1

    def back_off(self, now: float, seconds: float) -> None:
        """After a 429: half as many requests at once (at least one), none before `seconds` from `now`."""
        self.max_in_flight = max(1, self.max_in_flight // 2)
        self.next_start = max(self.next_start, now + seconds)
        self.slowed_because = f"the host answered HTTP 429 and asked for {seconds:g} s"

    def turn(self, now: float) -> float:
        """When a request asked for at `now` may start."""
        return max(now, self.next_start)

    def take_turn(self, start: float) -> None:
        """Reserve the start at `start`, so the next request keeps the spacing after it."""
        self.next_start = max(self.next_start, start + self.spacing_seconds)

    async def acquire(self) -> None:
        """Wait until fewer than `max_in_flight` requests are in flight, then count one more."""
        while self.busy:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    # Woken and cancelled at once: hand the wake-up on rather than lose it.
                    self._wake_next()
                raise
            finally:
                self._waiters.remove(waiter)
        self.in_flight += 1

    def release(self) -> None:
        """Count one request fewer in flight and let the next waiter try."""
        self.in_flight -= 1
        self._wake_next()

    def _wake_next(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
                return


class FetchStopped(DeepthreadError):
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


@functools.cache
def default_ssl_context() -> ssl.SSLContext:
    """The certificate-checking TLS context every fetcher of this process shares (loading the CA bundle takes tens of ms)."""
    return httpx.create_ssl_context(trust_env=False)


class HostPinnedTransport(httpx.AsyncBaseTransport):
    """One connection pool per host name, checked address and port, so no connection is shared by two names on one address.

    httpx pools by the URL's origin, which for the fetcher is the checked IP: without this, a request for
    b.example could ride a TLS connection whose certificate was checked for a.example.
    """

    def __init__(self, *, ssl_context: ssl.SSLContext | None = None, limits: httpx.Limits | None = None) -> None:
        # None: the process-wide context, shared by every pool and run, since each build reloads the CA bundle.
        self._ssl_context = ssl_context
        self._limits = limits or httpx.Limits()
        self._pools: dict[PoolKey, httpx.AsyncHTTPTransport] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        key = pool_key(request)
        pool = self._pools.get(key)
        if pool is None:
            verify = self._ssl_context if self._ssl_context is not None else default_ssl_context()
            pool = httpx.AsyncHTTPTransport(verify=verify, limits=self._limits, trust_env=False)
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
        *,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.config = config or FetchConfig()
        self.budget = budget or FetchBudget(25 * MIB)
        self._client = client
        self._resolver = resolver
        self._clock = clock
        self._sleep = sleep
        self._overall = asyncio.Semaphore(self.config.max_concurrency)
        self._hosts: dict[str, HostPace] = {}
        self.robots = RobotsCache(self._fetch_robots, self.config.user_agent)

    async def fetch(self, url: str) -> FetchResult:
        """Fetch one URL and return its recorded outcome; never raises for a problem with the page."""
        started = self._clock()
        result = await self._fetch_with_limits(url)
        return result.model_copy(update={"seconds": round(self._clock() - started, 3)})

    def pace_of(self, host: str) -> HostPace:
        """How fast `host` (normalised) is being asked now."""
        return self._hosts.setdefault(host, HostPace(self.config.max_per_host))

    def _deadline(self, seconds: float) -> PageDeadline:
        return PageDeadline(seconds, clock=self._clock, sleep=self._sleep)

    async def refusal(self, url: str) -> FetchResult | None:
        """The outcome `url` gets before any page request (scheme, host, address, blocked domain, robots.txt), or None when it may be fetched."""
        try:
            target = await self._checked_target(url)
            if self.config.respect_robots and (robots_refusal := await self.robots.refusal(target.url)) is not None:
                raise FetchStopped("skipped", robots_refusal)
        except FetchStopped as stopped:
            return stopped.as_result(url)
        return None

    async def _fetch_with_limits(self, url: str) -> FetchResult:
        if self.budget.exhausted:
            return FetchResult(url=url, status="skipped", reason="fetch budget spent")
        async with self._overall:
            if self.budget.exhausted:
                return FetchResult(url=url, status="skipped", reason="fetch budget spent")
            seconds = self.config.page_timeout_seconds
            try:
                async with self._deadline(seconds) as deadline:
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

    async def _fetch_page(self, url: str, deadline: PageDeadline) -> FetchResult:
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
    ) -> AsyncGenerator[bytes, None]:
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
        self, url: str, deadline: PageDeadline, *, check_robots: bool
    ) -> AsyncIterator[tuple[Target, httpx.Response]]:
        current = url
        for hop in range(self.config.max_redirects + 1):
            try:
                target = await self._checked_target(current)
            except FetchStopped as stopped:
                if hop == 0:
                    raise
                raise FetchStopped(stopped.status, f"{stopped.reason} (after redirect to {current})") from stopped
            pace = self.pace_of(target.host)
            if check_robots:
                refusal = await self.robots.refusal(target.url)
                if refusal is not None:
                    raise FetchStopped("skipped", refusal)
                crawl_delay = self.robots.crawl_delay(target.url)
                if crawl_delay is not None:
                    pace.follow_crawl_delay(min(crawl_delay, self.config.max_host_wait_seconds))
            async with self._paced_response(target, pace, deadline) as response:
                if not response.has_redirect_location:
                    yield target, response
                    return
                location = response.headers["location"]
            current = urljoin(current, location)
        raise FetchStopped("failed", f"more than {self.config.max_redirects} redirects")

    @asynccontextmanager
    async def _paced_response(self, target: Target, pace: HostPace, deadline: PageDeadline) -> AsyncIterator[httpx.Response]:
        """The host's answer, sent at the host's pace; a 429 slows the host and is asked again once if the page has time."""
        asked_again = False
        while True:
            await self._wait_for_turn(pace, deadline)
            async with self._host_slot(pace, deadline):
                response = await self._send(target)
                try:
                    if response.status_code == 429:
                        wait = parse_retry_after(response.headers.get("retry-after"))
                        wait = min(DEFAULT_TOO_MANY_REQUESTS_WAIT_SECONDS if wait is None else wait,
                                   self.config.max_host_wait_seconds)
                        now = self._clock()
                        pace.back_off(now, wait)
                        ask_again = not asked_again and pace.turn(now) - now < deadline.remaining
                    else:
                        ask_again = False
                    if not ask_again:
                        yield response
                        return
                finally:
                    await response.aclose()
            asked_again = True

    async def _wait_for_turn(self, pace: HostPace, deadline: PageDeadline) -> None:
        """Sleep until the host's next turn (that wait counts against the page); raises FetchStopped when the turn comes too late."""
        now = self._clock()
        start = pace.turn(now)
        if start > now and start - now >= deadline.remaining:
            raise FetchStopped("skipped", f"{pace.slowed_because or 'the host is slowed down'}, so this page's turn "
                                          f"would come after its {deadline.seconds:g} s deadline")
        pace.take_turn(start)
        if start > now:
            await self._sleep(start - now)

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
        address = await self._checked_address(host, port)
        path_and_query = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        return Target(url=url, scheme=scheme, host=host, port=port, address=address, path_and_query=path_and_query)

    async def _checked_address(self, host: str, port: int) -> str:
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
        # A host allowed although private (the operator's own service, a test's fake) keeps any port.
        port_reason = forbidden_port_reason(port)
        if port_reason is not None and not all(allow_list.allows(host, address) for address in addresses):
            raise FetchStopped("refused", f"{port_reason} on {host}")
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
    async def _host_slot(self, pace: HostPace, deadline: PageDeadline) -> AsyncIterator[None]:
        if pace.busy:
            # Waiting for a request of ours to a busy host to end is not the page's fault, so the deadline pauses.
            async with deadline.paused():
                await pace.acquire()
        else:
            await pace.acquire()
        try:
            yield
        finally:
            pace.release()

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
            async with self._deadline(seconds) as deadline:
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
