"""A fake web: many host names served by one ASGI app, routed on the Host header, on 127.0.0.1 or in process.

How tests reach it. The fetcher connects to the checked address at the port written in the URL, so
every URL in the corpus carries the fake server's port: pages are registered under port-less URLs
(`http://alpha.example/facts/1`) and `FakeWeb.url()` gives the address to hand to the code under
test (`http://alpha.example:PORT/facts/1`). `FakeWeb.resolver()` maps every host to 127.0.0.1 and
`FakeWeb.allow_list()` exempts exactly those hosts from the private-address refusal, so production
fetcher code runs unchanged. The port is chosen when first asked for, so pages can link to one
another with `web.url(...)` before the server starts.

In process, `FakeWeb.transport()` is the same web as an httpx transport (no socket, no port): hand it to
`build_fetch_client(config, transport=...)` and address pages by their plain URLs. With `clock=` (a test's
hand-moved clock) every request is logged at that clock's time; `hold(url)` keeps a page's answer back until
`release(url)`, `answer_next(url, page)` answers the next request once with another page (a 429, say), and
`in_flight(host)` / `most_in_flight(host)` count the pages (robots.txt left out) being answered at once.

Besides plain pages there are streaming pages for the cap tests (`huge_page`, `drip_page`,
`gzip_bomb_page`), redirects, a real minimal PDF (`pdf_page`), per-host robots.txt, latency (a
default for all pages, or per page), and a RequestLog of everything the server saw.
"""

from __future__ import annotations

import asyncio
import functools
import html
import threading
import time
import zlib
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import httpx

from research.netguard import AllowList
from tests.fakes.resolver import DictResolver
from tests.fakes.server import LoopbackServer, RecordedRequest, RequestLog, free_port, read_body

KIB = 1024
MIB = 1024 * 1024

BodyStream = Callable[[], AsyncIterator[bytes]]


@dataclass
class Page:
    """One response of the fake web; `stream` (when set) sends the body chunk by chunk without a Content-Length."""

    body: bytes | str = b""
    content_type: str | None = "text/html; charset=utf-8"
    status: int = 200
    # A bytes value is sent as it is (a server sending a raw UTF-8 Location, say); text goes as Latin-1.
    headers: dict[str, str | bytes] = field(default_factory=dict)
    latency: float | None = None
    stream: BodyStream | None = None

    def body_bytes(self) -> bytes:
        return self.body.encode("utf-8") if isinstance(self.body, str) else self.body


def redirect_page(location: str, status: int = 302) -> Page:
    """A redirect to `location` (absolute or relative)."""
    return Page(status=status, content_type=None, headers={"location": location})


def huge_page(size: int, *, chunk_size: int = 64 * KIB, declare_length: bool = False, content_type: str = "text/html") -> Page:
    """A page of `size` bytes streamed as fast as the client reads; with `declare_length` it announces its size up front."""

    async def chunks() -> AsyncIterator[bytes]:
        sent = 0
        while sent < size:
            piece = min(chunk_size, size - sent)
            sent += piece
            yield b"a" * piece

    headers = {"content-length": str(size)} if declare_length else {}
    return Page(content_type=content_type, headers=headers, stream=chunks)


def drip_page(chunk: bytes = b"<p>drip</p>\n", *, interval: float = 0.05, duration: float = 30.0) -> Page:
    """A page that sends a small chunk every `interval` seconds for `duration` seconds (or until the client leaves)."""

    async def chunks() -> AsyncIterator[bytes]:
        started = time.monotonic()
        yield b"<!doctype html><html><body>"
        while time.monotonic() - started < duration:
            await asyncio.sleep(interval)
            yield chunk

    return Page(stream=chunks)


@functools.lru_cache(maxsize=4)
def gzip_bomb(decompressed_size: int) -> bytes:
    """Gzip of `decompressed_size` zero bytes (about a thousandth of that on the wire), built without holding it in memory."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    block = bytes(MIB)
    parts: list[bytes] = []
    remaining = decompressed_size
    while remaining > 0:
        piece = block if remaining >= MIB else bytes(remaining)
        parts.append(compressor.compress(piece))
        remaining -= len(piece)
    parts.append(compressor.flush())
    return b"".join(parts)


def gzip_bomb_page(decompressed_size: int = 200 * MIB, content_type: str = "text/html") -> Page:
    """An HTML page whose gzip Content-Encoding expands to `decompressed_size` bytes."""
    return Page(body=gzip_bomb(decompressed_size), content_type=content_type, headers={"content-encoding": "gzip"})


def gzip_page(body: bytes | str, content_type: str = "text/html; charset=utf-8") -> Page:
    """An ordinary page sent with gzip Content-Encoding."""
    raw = body.encode("utf-8") if isinstance(body, str) else body
    compressor = zlib.compressobj(6, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    return Page(body=compressor.compress(raw) + compressor.flush(), content_type=content_type, headers={"content-encoding": "gzip"})


def _pdf_string(text: str) -> str:
    return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")


def minimal_pdf(lines: Iterable[str], title: str | None = None) -> bytes:
    """A valid one-page PDF (Helvetica text) whose text pypdf can extract."""
    text_ops = ["BT", "/F1 12 Tf", "72 720 Td", "14 TL"]
    for line in lines:
        text_ops.append(f"({_pdf_string(line)}) Tj T*")
    text_ops.append("ET")
    stream = "\n".join(text_ops).encode("latin-1", errors="replace")
    info = f"<< /Title ({_pdf_string(title)}) >>" if title else "<< >>"
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 5 0 R >> >> /Contents 4 0 R >>",
        b"<< /Length " + str(len(stream)).encode() + b" >>\nstream\n" + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        info.encode("latin-1", errors="replace"),
    ]
    output = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets: list[int] = []
    for number, content in enumerate(objects, start=1):
        offsets.append(len(output))
        output += f"{number} 0 obj\n".encode() + content + b"\nendobj\n"
    xref_at = len(output)
    output += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    for offset in offsets:
        output += f"{offset:010d} 00000 n \n".encode()
    output += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R /Info 6 0 R >>\nstartxref\n{xref_at}\n%%EOF\n".encode()
    return bytes(output)


def pdf_page(lines: Iterable[str], title: str | None = None, content_type: str | None = "application/pdf") -> Page:
    """A PDF document; pass `content_type=None` or `application/octet-stream` to test sniffing."""
    return Page(body=minimal_pdf(lines, title), content_type=content_type)


def article_html(
    title: str,
    paragraphs: Iterable[str],
    *,
    nav_links: Iterable[tuple[str, str]] = (),
    published: str | None = None,
    author: str | None = None,
    site_name: str = "Example News",
) -> str:
    """A realistic article page: navigation, header, cookie banner and footer boilerplate around the article's main text."""
    escape = html.escape
    links = list(nav_links) or [("/", "Home"), ("/about", "About us"), ("/contact", "Contact")]
    nav = "\n".join(f'      <li><a href="{escape(href)}">{escape(label)}</a></li>' for href, label in links)
    body = "\n".join(f"      <p>{escape(paragraph)}</p>" for paragraph in paragraphs)
    meta = []
    if published:
        meta.append(f'<time datetime="{escape(published)}">{escape(published)}</time>')
    if author:
        meta.append(f'<span class="byline">By {escape(author)}</span>')
    meta_html = " ".join(meta)
    head_meta = f'\n  <meta name="author" content="{escape(author)}">' if author else ""
    if published:
        head_meta += f'\n  <meta property="article:published_time" content="{escape(published)}">'
    return f"""<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>{escape(title)} | {escape(site_name)}</title>{head_meta}
</head>
<body>
  <header class="site-header">
    <div class="logo">{escape(site_name)}</div>
    <nav>
      <ul>
{nav}
      </ul>
    </nav>
  </header>
  <div class="cookie-banner">We use cookies to improve your experience. <button>Accept all</button></div>
  <main>
    <article>
      <h1>{escape(title)}</h1>
      <div class="meta">{meta_html}</div>
{body}
    </article>
    <aside class="related">
      <h2>Related stories</h2>
      <ul><li><a href="/trending">Ten things you missed this week</a></li></ul>
    </aside>
  </main>
  <footer>
    <p>&copy; 2024 {escape(site_name)}. All rights reserved.</p>
    <a href="/privacy">Privacy policy</a> <a href="/terms">Terms of use</a>
  </footer>
</body>
</html>
"""


def _split_key(url: str) -> tuple[str, str, str]:
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    return host, parts.path or "/", parts.query


def _host_without_port(host_header: str) -> str:
    if host_header.startswith("["):
        return host_header[: host_header.index("]") + 1].lower()
    return host_header.split(":")[0].lower()


class _Gate:
    """A held page: requests for it wait, each on its own event loop, until it is opened from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open = False
        self._waiting: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    async def passed(self) -> None:
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._open:
                return
            opened: asyncio.Future[None] = loop.create_future()
            self._waiting.append((loop, opened))
        await opened

    def open(self) -> None:
        with self._lock:
            self._open = True
            waiting, self._waiting = self._waiting, []
        for loop, opened in waiting:
            loop.call_soon_threadsafe(lambda future=opened: future.done() or future.set_result(None))


class FakeWeb:
    """Serves pages for many host names, from one LoopbackServer on 127.0.0.1 or in process through `transport()`,
    and records every request."""

    def __init__(
        self,
        pages: dict[str, Page] | None = None,
        *,
        robots: dict[str, str] | None = None,
        latency: float = 0.0,
        port: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._port = port
        self.latency = latency
        self.clock = clock
        self.requests = RequestLog()
        self._pages: dict[tuple[str, str, str], Page] = {}
        self._robots: dict[str, str] = {host.lower(): text for host, text in (robots or {}).items()}
        self._next_answers: dict[tuple[str, str, str], list[Page]] = {}
        self._gates: dict[tuple[str, str, str], _Gate] = {}
        self._lock = threading.Lock()
        self._in_flight: Counter[str] = Counter()
        self._most_in_flight: Counter[str] = Counter()
        self._server: LoopbackServer | None = None
        for url, page in (pages or {}).items():
            self.add(url, page)

    @property
    def port(self) -> int:
        """The loopback server's port, chosen when first asked for."""
        if self._port is None:
            self._port = free_port()
        return self._port

    def add(self, url: str, page: Page) -> str:
        """Serve `page` at `url` (written without the port) and return the URL with the port."""
        self._pages[_split_key(url)] = page
        return self.url(url)

    def set_robots(self, host: str, text: str) -> None:
        """Serve `text` as text/plain at `host`'s /robots.txt."""
        self._robots[host.lower()] = text

    def answer_next(self, url: str, page: Page) -> None:
        """Answer the next request for `url` with `page`, once; later requests get what is added there."""
        with self._lock:
            self._next_answers.setdefault(_split_key(url), []).append(page)

    def hold(self, url: str) -> None:
        """Keep every answer from `url` back until `release(url)`."""
        self._gates[_split_key(url)] = _Gate()

    def release(self, url: str) -> None:
        """Let the held requests for `url` (and later ones) be answered; safe from any thread."""
        self._gates[_split_key(url)].open()

    def in_flight(self, host: str) -> int:
        """How many page requests (robots.txt left out) for `host` are being answered now."""
        with self._lock:
            return self._in_flight[host.lower()]

    def most_in_flight(self, host: str) -> int:
        """The most page requests (robots.txt left out) for `host` that were ever being answered at once."""
        with self._lock:
            return self._most_in_flight[host.lower()]

    def requested_hosts(self) -> list[str]:
        """The host of every request, in the order they came."""
        return [request.host for request in self.requests.all()]

    def url(self, url: str) -> str:
        """Return `url` with the fake server's port, which is where the fetcher will connect."""
        parts = urlsplit(url)
        host = parts.hostname or ""
        netloc = f"[{host}]" if ":" in host else host
        return urlunsplit((parts.scheme or "http", f"{netloc}:{self.port}", parts.path or "/", parts.query, parts.fragment))

    @property
    def hosts(self) -> set[str]:
        return {host for host, _path, _query in self._pages} | set(self._robots)

    def resolver(self, extra: dict[str, list[str]] | None = None) -> DictResolver:
        """A resolver mapping every host of this web to 127.0.0.1 (plus any `extra` names)."""
        mapping = {host: ["127.0.0.1"] for host in self.hosts}
        mapping.update(extra or {})
        return DictResolver(mapping)

    def allow_list(self) -> AllowList:
        """An allow list exempting exactly this web's hosts from the private-address refusal."""
        return AllowList(hosts=frozenset(self.hosts))

    def requests_to(self, host: str, path: str | None = None) -> list[RecordedRequest]:
        """The recorded requests for `host` (and `path`, if given)."""
        return [
            request for request in self.requests.all()
            if request.host == host.lower() and (path is None or request.path == path)
        ]

    def transport(self) -> httpx.ASGITransport:
        """This web in process: an httpx transport that answers on the request's Host header, with no socket."""
        return httpx.ASGITransport(app=self._asgi_app())

    def start(self) -> "FakeWeb":
        self._server = LoopbackServer(self._asgi_app(), port=self.port).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def __enter__(self) -> "FakeWeb":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _asgi_app(self) -> Callable[..., Any]:
        # uvicorn takes a bound method for an ASGI2 app; a plain coroutine function is ASGI3 to it.
        async def app(scope: dict[str, Any], receive: Callable[[], Any], send: Callable[[dict], Any]) -> None:
            await self._app(scope, receive, send)

        return app

    def _page_for(self, host: str, path: str, query: str) -> Page | None:
        with self._lock:
            for key in ((host, path, query), (host, path, "")):
                if self._next_answers.get(key):
                    return self._next_answers[key].pop(0)
        page = self._pages.get((host, path, query)) or self._pages.get((host, path, ""))
        if page is None and path == "/robots.txt" and host in self._robots:
            page = Page(body=self._robots[host], content_type="text/plain; charset=utf-8")
        return page

    async def _app(self, scope: dict[str, Any], receive: Callable[[], Any], send: Callable[[dict], Any]) -> None:
        if scope["type"] != "http":
            return
        headers = {key.decode("latin-1").lower(): value.decode("latin-1") for key, value in scope["headers"]}
        query = scope.get("query_string", b"").decode("latin-1")
        body = await read_body(receive)
        host = _host_without_port(headers.get("host", ""))
        record = RecordedRequest(
            method=scope["method"], host=host, path=scope["path"],
            query=dict(parse_qsl(query)), headers=headers, body=body, at=self.clock(),
        )
        self.requests.add(record)
        is_page = scope["path"] != "/robots.txt"
        if is_page:
            with self._lock:
                self._in_flight[host] += 1
                self._most_in_flight[host] = max(self._most_in_flight[host], self._in_flight[host])
        try:
            gate = self._gates.get((host, scope["path"], query)) or self._gates.get((host, scope["path"], ""))
            if gate is not None:
                await gate.passed()
            page = self._page_for(host, scope["path"], query)
            if page is None:
                page = Page(body=b"not found", content_type="text/plain", status=404)
            latency = self.latency if page.latency is None else page.latency
            if latency:
                await asyncio.sleep(latency)
            await self._respond(page, receive, send)
        finally:
            if is_page:
                with self._lock:
                    self._in_flight[host] -= 1
            record.finished_at = self.clock()

    async def _respond(self, page: Page, receive: Callable[[], Any], send: Callable[[dict], Any]) -> None:
        response_headers = {key.lower(): value for key, value in page.headers.items()}
        if page.content_type is not None:
            response_headers["content-type"] = page.content_type
        if page.stream is None:
            content = page.body_bytes()
            response_headers["content-length"] = str(len(content))
        raw_headers = [(key.encode("latin-1"), value if isinstance(value, bytes) else value.encode("latin-1"))
                       for key, value in response_headers.items()]
        await send({"type": "http.response.start", "status": page.status, "headers": raw_headers})
        if page.stream is None:
            await send({"type": "http.response.body", "body": content, "more_body": False})
            return
        await self._stream(page.stream, receive, send)

    async def _stream(self, stream: BodyStream, receive: Callable[[], Any], send: Callable[[dict], Any]) -> None:
        disconnected = asyncio.Event()

        async def watch_for_disconnect() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            disconnected.set()

        watcher = asyncio.create_task(watch_for_disconnect())
        try:
            async for chunk in stream():
                if disconnected.is_set():
                    return
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                # Yield to the loop so a client that hung up is noticed before the next write.
                await asyncio.sleep(0)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            watcher.cancel()
