"""One fake that speaks Tavily, Brave, Exa, SearXNG and Firecrawl at the wire, in their real JSON shapes.

Each provider lives under its own path prefix (`/tavily`, `/brave`, `/exa`, `/searxng`, `/firecrawl`), so one server
serves all five and `base_url(provider)` is what you configure as that provider's base URL. Firecrawl's scrape
endpoint is scripted and logged apart from its search, as the provider `firecrawl-scrape`:

    api.set_scraped_pages({"https://a.org/x": "# X\n\nThe page's text."})
    api.set_scrape_endings({"https://a.org/x": "http://169.254.169.254/latest/"})  # where Firecrawl says it ended
    api.set_failure("firecrawl-scrape", status=429, headers={"Retry-After": "2"})
    api.scraped_urls()  # every URL Firecrawl was asked to scrape Use it in-process through
`transport()` (an httpx ASGI transport: no sockets) or on 127.0.0.1 through `start()`:

    api = FakeSearchAPI(results_for=lambda provider, query: [{"url": "https://a.org/x", "title": "X"}]).start()
    config = api.search_config(providers=["brave", "searxng"])
    api.set_failure("brave", status=429, headers={"Retry-After": "1"}, times=3)
    api.latency = 0.3
    api.requests("brave")  # RecordedRequest list
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from research.providers import SearchConfig
from tests.fakes.server import LoopbackFake, RecordedRequest, RequestLog

HTTP_PROVIDERS = ("tavily", "brave", "exa", "searxng", "firecrawl")
FIRECRAWL_SCRAPE = "firecrawl-scrape"
# Every scripted and logged endpoint: the providers' searches and Firecrawl's scrape.
ENDPOINTS = (*HTTP_PROVIDERS, FIRECRAWL_SCRAPE)
IN_PROCESS_ROOT = "http://127.0.0.1"
FAKE_KEYS = {"tavily": "tvly-fake-key", "brave": "brave-fake-key", "exa": "exa-fake-key", "firecrawl": "fc-fake-key"}

# (provider, query text) -> generic hits: {"url", "title", "snippet", "published", "score", "extra_snippets"}.
ResultsFor = Callable[[str, str], list[dict[str, Any]]]


def slug(text: str) -> str:
    """A URL path segment made from free text."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "query"


def without_site_operators(query: str) -> str:
    """The query text without `site:`/`-site:` operators, as a search engine would read its words."""
    return " ".join(word for word in query.split() if not word.lower().startswith(("site:", "-site:")))


def default_results(provider: str, query: str) -> list[dict[str, Any]]:
    """Three hits on example.com whose URLs depend only on the query (so providers overlap) and snippets on both."""
    return [
        {
            "url": f"https://example.com/{slug(query)}/{index}",
            "title": f"{query} — result {index}",
            "snippet": f"{provider} snippet {index} about {query}",
            "published": None,
            "score": round(1.0 - index / 10, 2),
        }
        for index in range(1, 4)
    ]


@dataclass
class ScriptedResponse:
    """A raw reply served instead of search results, `times` times (None: until cleared)."""

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    times: int | None = 1


def error_body(provider: str, status: int) -> Any:
    """The error body the real API sends with `status`."""
    message = {401: "Unauthorized", 403: "Forbidden", 429: "Too Many Requests"}.get(status, "Internal Server Error")
    if provider == "tavily":
        return {"detail": {"error": f"{message}: fake Tavily error"}}
    if provider == "brave":
        code = {401: "SUBSCRIPTION_TOKEN_INVALID", 429: "RATE_LIMITED"}.get(status, "INTERNAL_ERROR")
        return {
            "type": "ErrorResponse",
            "error": {"id": str(uuid.uuid4()), "status": status, "code": code, "detail": message, "meta": {}},
            "time": 1_700_000_000,
        }
    if provider == "exa":
        return {"requestId": uuid.uuid4().hex, "error": message, "tag": message.upper().replace(" ", "_")}
    if provider in ("firecrawl", FIRECRAWL_SCRAPE):
        firecrawl_messages = {401: "Unauthorized: Invalid token", 402: "Payment required: Insufficient credits",
                              429: "Rate limit exceeded. Consumed (req/min): 21, Remaining (req/min): 0."}
        return {"success": False, "error": firecrawl_messages.get(status, "An unexpected error occurred.")}
    return f"<html><body><h1>{message}</h1></body></html>"


def _domain(url: str) -> str:
    return urlsplit(url).hostname or ""


def tavily_body(query: str, hits: list[dict[str, Any]], request: dict[str, Any]) -> dict[str, Any]:
    """A Tavily `/search` reply."""
    results = [
        {
            "title": hit.get("title"),
            "url": hit.get("url"),
            "content": hit.get("snippet", ""),
            "score": hit.get("score", 0.5),
            "raw_content": None,
            **({"published_date": hit["published"]} if hit.get("published") else {}),
        }
        for hit in hits[: int(request.get("max_results") or 5)]
    ]
    return {
        "query": query, "follow_up_questions": None, "answer": None, "images": [], "results": results,
        "response_time": 0.42, "request_id": str(uuid.uuid4()),
    }


def brave_body(query: str, hits: list[dict[str, Any]], params: dict[str, str]) -> dict[str, Any]:
    """A Brave web-search reply."""
    results = []
    for hit in hits[: int(params.get("count") or 20)]:
        url = hit.get("url") or ""
        results.append({
            "type": "search_result", "title": hit.get("title"), "url": url, "description": hit.get("snippet", ""),
            "is_source_local": False, "is_source_both": False, "language": "en", "family_friendly": True,
            "profile": {"name": _domain(url), "url": url, "long_name": _domain(url), "img": ""},
            "meta_url": {"scheme": "https", "netloc": _domain(url), "hostname": _domain(url), "path": urlsplit(url).path},
            **({"page_age": hit["published"], "age": hit["published"]} if hit.get("published") else {}),
            **({"extra_snippets": hit["extra_snippets"]} if hit.get("extra_snippets") else {}),
        })
    return {
        "type": "search",
        "query": {"original": query, "show_strict_warning": False, "is_navigational": False, "country": "us",
                  "more_results_available": False, "spellcheck_off": True},
        "mixed": {"type": "mixed", "main": [{"type": "web", "index": index, "all": False} for index in range(len(results))]},
        "web": {"type": "search", "results": results, "family_friendly": True},
    }


def exa_body(query: str, hits: list[dict[str, Any]], request: dict[str, Any]) -> dict[str, Any]:
    """An Exa `/search` reply; page text and highlights appear only when the request asked for contents."""
    contents = request.get("contents") or {}
    results = []
    for hit in hits[: int(request.get("numResults") or 10)]:
        result: dict[str, Any] = {
            "id": hit.get("url"), "title": hit.get("title"), "url": hit.get("url"),
            "publishedDate": hit.get("published"), "author": None, "score": hit.get("score"),
        }
        if isinstance(contents, dict) and contents.get("highlights"):
            result["highlights"] = [hit.get("snippet", "")]
        if isinstance(contents, dict) and contents.get("text"):
            result["text"] = hit.get("snippet", "")
        results.append(result)
    return {
        "requestId": uuid.uuid4().hex, "resolvedSearchType": "neural", "searchType": "auto", "results": results,
        "costDollars": {"total": 0.005, "search": {"neural": 0.005}},
    }


def searxng_body(query: str, hits: list[dict[str, Any]]) -> dict[str, Any]:
    """A SearXNG `format=json` reply."""
    results = [
        {
            "url": hit.get("url"), "title": hit.get("title"), "content": hit.get("snippet", ""),
            "engine": "duckduckgo", "engines": ["duckduckgo", "brave"], "positions": [position], "score": hit.get("score", 1.0),
            "category": "general", "template": "default.html", "thumbnail": "", "img_src": "",
            "parsed_url": ["https", _domain(hit.get("url") or ""), urlsplit(hit.get("url") or "").path, "", "", ""],
            "publishedDate": hit.get("published"),
        }
        for position, hit in enumerate(hits, start=1)
    ]
    return {
        "query": query, "number_of_results": 0, "results": results, "answers": [], "corrections": [],
        "infoboxes": [], "suggestions": [], "unresponsive_engines": [],
    }


def firecrawl_search_body(hits: list[dict[str, Any]], request: dict[str, Any]) -> dict[str, Any]:
    """A Firecrawl `/v2/search` reply; a hit with `markdown` comes back scraped (with metadata), as when the request
    carried `scrapeOptions`."""
    scraped = bool((request.get("scrapeOptions") or {}).get("formats"))
    web = []
    for position, hit in enumerate(hits[: int(request.get("limit") or 5)], start=1):
        result: dict[str, Any] = {"url": hit.get("url"), "title": hit.get("title"), "description": hit.get("snippet", ""),
                                  "position": position}
        if scraped and hit.get("markdown") is not None:
            result["markdown"] = hit["markdown"]
            result["metadata"] = {"title": hit.get("title"), "description": hit.get("snippet", ""),
                                  "sourceURL": hit.get("url"), "url": hit.get("final_url", hit.get("url")),
                                  "statusCode": hit.get("status_code", 200), "contentType": "text/html",
                                  **({"publishedTime": hit["published"]} if hit.get("published") else {})}
        web.append(result)
    return {"success": True, "data": {"web": web}, "creditsUsed": 1 + len(web) * scraped, "id": str(uuid.uuid4())}


def firecrawl_scrape_body(url: str, markdown: str, *, title: str | None = None, status_code: int = 200,
                          final_url: str | None = None) -> dict[str, Any]:
    """A Firecrawl `/v2/scrape` reply with the page's Markdown and metadata: `sourceURL` is the URL asked for, `url`
    where the page ended (`final_url`, as after a redirect; the URL asked for unless given)."""
    return {
        "success": True,
        "data": {
            "markdown": markdown,
            "metadata": {"title": title or url, "sourceURL": url, "url": final_url or url, "statusCode": status_code,
                         "contentType": "text/html; charset=utf-8", "proxyUsed": "basic", "creditsUsed": 1,
                         "scrapeId": str(uuid.uuid4())},
        },
    }


def _timed(endpoint: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    """`endpoint`, stamping its recorded request's `finished_at` once the reply is ready."""

    async def timed(request: Request) -> Response:
        try:
            return await endpoint(request)
        finally:
            recorded = getattr(request.state, "recorded", None)
            if recorded is not None:
                recorded.finished_at = time.monotonic()

    return timed


class FakeSearchAPI(LoopbackFake):
    """Tavily, Brave, Exa, SearXNG and Firecrawl behind one ASGI app, with programmable results, failures and latency."""

    def __init__(
        self,
        results_for: ResultsFor | None = None,
        *,
        latency: float = 0.0,
        api_keys: dict[str, str] | None = None,
    ) -> None:
        self.results_for: ResultsFor = results_for or default_results
        self.latency = latency
        self.api_keys = dict(FAKE_KEYS if api_keys is None else api_keys)
        self._results_by_provider: dict[str, Callable[[str], list[dict[str, Any]]]] = {}
        self._latency_by_provider: dict[str, float] = {}
        self._holds: list[tuple[str, asyncio.Event]] = []
        self._scripts: dict[str, list[ScriptedResponse]] = {endpoint: [] for endpoint in ENDPOINTS}
        self._logs = {endpoint: RequestLog() for endpoint in ENDPOINTS}
        # URL -> Markdown that Firecrawl's scrape returns; other URLs answer as a page that is not there.
        self.scraped_pages: dict[str, str] = {}
        # URL -> where Firecrawl's scrape says that page ended (a redirect or the page's script led it there).
        self.scrape_endings: dict[str, str] = {}
        self._lock = threading.Lock()
        self.app = Starlette(routes=[
            Route("/tavily/search", _timed(self._tavily), methods=["POST"]),
            Route("/brave/res/v1/web/search", _timed(self._brave), methods=["GET"]),
            Route("/exa/search", _timed(self._exa), methods=["POST"]),
            Route("/searxng/search", _timed(self._searxng), methods=["GET"]),
            Route("/firecrawl/v2/search", _timed(self._firecrawl_search), methods=["POST"]),
            Route("/firecrawl/v2/scrape", _timed(self._firecrawl_scrape), methods=["POST"]),
        ])

    # -- lifecycle: LoopbackFake's start, stop and `with`, serving on 127.0.0.1 at a free port --------------------

    def transport(self) -> httpx.ASGITransport:
        """An in-process httpx transport to this fake (no sockets); pair it with `base_url`."""
        return httpx.ASGITransport(app=self.app)

    def client(self) -> httpx.AsyncClient:
        """An httpx client that reaches this fake in-process, or over loopback once started."""
        if self._server is not None:
            return httpx.AsyncClient()
        return httpx.AsyncClient(transport=self.transport())

    @property
    def root_url(self) -> str:
        return self._server.url if self._server is not None else IN_PROCESS_ROOT

    def base_url(self, provider: str) -> str:
        """The URL to configure as `provider`'s base URL (for SearXNG, the instance URL)."""
        return f"{self.root_url}/{provider}"

    def search_config(self, **overrides: Any) -> SearchConfig:
        """A SearchConfig with every HTTP provider pointing here with a valid key, except Firecrawl, which is configured
        (search and scrape fallback) only when `firecrawl_api_key` is given; `overrides` win."""
        settings: dict[str, Any] = {
            "tavily_api_key": self.api_keys.get("tavily", "tvly-any"), "tavily_base_url": self.base_url("tavily"),
            "brave_api_key": self.api_keys.get("brave", "brave-any"), "brave_base_url": self.base_url("brave"),
            "exa_api_key": self.api_keys.get("exa", "exa-any"), "exa_base_url": self.base_url("exa"),
            "searxng_url": self.base_url("searxng"), "firecrawl_base_url": self.base_url("firecrawl"),
        }
        settings.update(overrides)
        return SearchConfig(**settings)

    # -- programming -----------------------------------------------------------------------------------------------

    def set_results(self, provider: str, results: Callable[[str], list[dict[str, Any]]] | list[dict[str, Any]]) -> None:
        """Make `provider` answer with these hits (a list, or a function of the query text)."""
        self._results_by_provider[provider] = results if callable(results) else (lambda query: list(results))

    def set_failure(
        self, provider: str, *, status: int, headers: dict[str, str] | None = None, body: Any = None, times: int | None = 1,
    ) -> None:
        """Make `provider`'s next `times` requests fail with `status` (the real API's error body unless given)."""
        self.set_response(provider, status=status, headers=headers, body=body if body is not None else error_body(provider, status), times=times)

    def set_response(
        self, provider: str, *, body: Any, status: int = 200, headers: dict[str, str] | None = None, times: int | None = None,
    ) -> None:
        """Serve this raw reply (dict/list as JSON, str/bytes verbatim) for `provider`'s next `times` requests (None: always)."""
        with self._lock:
            self._scripts[provider].append(ScriptedResponse(status=status, body=body, headers=dict(headers or {}), times=times))

    def hold(self, text: str) -> asyncio.Event:
        """Hold every search whose query (or body) holds `text` until the returned event is set (on the loop that
        serves the fake): one query of several can then answer first."""
        gate = asyncio.Event()
        self._holds.append((text, gate))
        return gate

    def set_latency(self, provider: str, seconds: float) -> None:
        """Delay `provider`'s replies by `seconds` (instead of the global `latency`)."""
        self._latency_by_provider[provider] = seconds

    def reset(self) -> None:
        """Forget scripted replies, per-provider results and latencies, and recorded requests."""
        with self._lock:
            for endpoint in ENDPOINTS:
                self._scripts[endpoint].clear()
                self._logs[endpoint].clear()
            self.scraped_pages.clear()
            self.scrape_endings.clear()
            self._results_by_provider.clear()
            self._latency_by_provider.clear()

    # -- inspection ------------------------------------------------------------------------------------------------

    def log(self, provider: str) -> RequestLog:
        return self._logs[provider]

    def requests(self, provider: str) -> list[RecordedRequest]:
        """Every request `provider` received, oldest first."""
        return self._logs[provider].all()

    def set_scraped_pages(self, pages: dict[str, str]) -> None:
        """Make Firecrawl's scrape return this Markdown for these URLs."""
        self.scraped_pages.update(pages)

    def set_scrape_endings(self, endings: dict[str, str]) -> None:
        """Make Firecrawl's scrape of these URLs report the given URL as where the page ended (`metadata.url`)."""
        self.scrape_endings.update(endings)

    def scraped_urls(self) -> list[str]:
        """Every URL Firecrawl's scrape was asked for, oldest first."""
        return [str(json.loads(request.body or b"{}").get("url")) for request in self.requests(FIRECRAWL_SCRAPE)]

    def last_request_data(self, provider: str) -> dict[str, Any]:
        """The last request's JSON body (POST APIs) or query parameters (GET APIs)."""
        request = self.requests(provider)[-1]
        return json.loads(request.body) if request.method == "POST" else dict(request.query)

    # -- serving ---------------------------------------------------------------------------------------------------

    async def _record_and_wait(self, provider: str, request: Request) -> bytes:
        body = await request.body()
        record = RecordedRequest(
            method=request.method, host=request.headers.get("host", ""), path=request.url.path,
            query=dict(request.query_params), headers={key.lower(): value for key, value in request.headers.items()},
            body=body,
        )
        request.state.recorded = record
        self._logs[provider].add(record)
        delay = self._latency_by_provider.get(provider, self.latency)
        if delay > 0:
            await asyncio.sleep(delay)
        asked = " ".join([*request.query_params.values(), body.decode("utf-8", "replace")])
        for text, gate in list(self._holds):
            if text in asked:
                await gate.wait()
        return body

    def _next_script(self, provider: str) -> ScriptedResponse | None:
        with self._lock:
            scripts = self._scripts[provider]
            if not scripts:
                return None
            script = scripts[0]
            if script.times is not None:
                script.times -= 1
                if script.times <= 0:
                    scripts.pop(0)
            return script

    def _hits(self, provider: str, query: str) -> list[dict[str, Any]]:
        if provider in self._results_by_provider:
            return self._results_by_provider[provider](query)
        return self.results_for(provider, query)

    def _key_is_valid(self, provider: str, presented: str | None) -> bool:
        expected = self.api_keys.get(provider)
        return bool(presented) and (expected is None or presented == expected)

    @staticmethod
    def _render(status: int, body: Any, headers: dict[str, str] | None = None) -> Response:
        if isinstance(body, dict | list) or body is None:
            return Response(json.dumps(body), status_code=status, headers=headers, media_type="application/json")
        content = body.encode() if isinstance(body, str) else body
        media_type = "text/html; charset=utf-8" if content.lstrip().startswith(b"<") else "text/plain; charset=utf-8"
        return Response(content, status_code=status, headers=headers, media_type=media_type)

    def _scripted_or_none(self, provider: str) -> Response | None:
        script = self._next_script(provider)
        return None if script is None else self._render(script.status, script.body, script.headers)

    async def _tavily(self, request: Request) -> Response:
        body = await self._record_and_wait("tavily", request)
        if (scripted := self._scripted_or_none("tavily")) is not None:
            return scripted
        data = json.loads(body or b"{}")
        key = (request.headers.get("authorization") or "").removeprefix("Bearer ").strip() or data.get("api_key")
        if not self._key_is_valid("tavily", key):
            return self._render(401, error_body("tavily", 401))
        query = str(data.get("query", ""))
        return self._render(200, tavily_body(query, self._hits("tavily", query), data))

    async def _brave(self, request: Request) -> Response:
        await self._record_and_wait("brave", request)
        if (scripted := self._scripted_or_none("brave")) is not None:
            return scripted
        if not self._key_is_valid("brave", request.headers.get("x-subscription-token")):
            return self._render(401, error_body("brave", 401))
        params = dict(request.query_params)
        query = without_site_operators(params.get("q", ""))
        return self._render(200, brave_body(query, self._hits("brave", query), params))

    async def _exa(self, request: Request) -> Response:
        body = await self._record_and_wait("exa", request)
        if (scripted := self._scripted_or_none("exa")) is not None:
            return scripted
        if not self._key_is_valid("exa", request.headers.get("x-api-key")):
            return self._render(401, error_body("exa", 401))
        data = json.loads(body or b"{}")
        query = str(data.get("query", ""))
        return self._render(200, exa_body(query, self._hits("exa", query), data))

    async def _searxng(self, request: Request) -> Response:
        await self._record_and_wait("searxng", request)
        if (scripted := self._scripted_or_none("searxng")) is not None:
            return scripted
        if request.query_params.get("format") != "json":
            return self._render(403, error_body("searxng", 403))
        query = request.query_params.get("q", "")
        return self._render(200, searxng_body(query, self._hits("searxng", query)))

    def _firecrawl_key_is_valid(self, request: Request) -> bool:
        return self._key_is_valid("firecrawl", (request.headers.get("authorization") or "").removeprefix("Bearer ").strip())

    async def _firecrawl_search(self, request: Request) -> Response:
        body = await self._record_and_wait("firecrawl", request)
        if (scripted := self._scripted_or_none("firecrawl")) is not None:
            return scripted
        if not self._firecrawl_key_is_valid(request):
            return self._render(401, error_body("firecrawl", 401))
        data = json.loads(body or b"{}")
        query = without_site_operators(str(data.get("query", "")))
        return self._render(200, firecrawl_search_body(self._hits("firecrawl", query), data))

    async def _firecrawl_scrape(self, request: Request) -> Response:
        body = await self._record_and_wait(FIRECRAWL_SCRAPE, request)
        if (scripted := self._scripted_or_none(FIRECRAWL_SCRAPE)) is not None:
            return scripted
        if not self._firecrawl_key_is_valid(request):
            return self._render(401, error_body(FIRECRAWL_SCRAPE, 401))
        url = str(json.loads(body or b"{}").get("url", ""))
        if url not in self.scraped_pages:
            return self._render(200, firecrawl_scrape_body(url, "# Not Found", title="Not Found", status_code=404))
        return self._render(200, firecrawl_scrape_body(url, self.scraped_pages[url], final_url=self.scrape_endings.get(url)))
