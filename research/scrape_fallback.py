"""Pages the safe fetcher could not read usefully, read through Firecrawl instead, never past the fetcher's checks.

`FallbackFetcher` wraps a run's SafeFetcher. A page that failed with a bot wall (HTTP 403 or 429), or an HTML page
that is only a JavaScript shell, is sent to Firecrawl's scrape endpoint; a search result that already carries its
text (Firecrawl search's Markdown) is read from that text. Either way the URL first passes the fetcher's own checks
(scheme, port, resolved addresses, blocked domains, robots.txt): what the fetcher would refuse is never sent to
Firecrawl. A timeout is not a reason to scrape: the page's server stalls at will, and would choose Firecrawl so.

Firecrawl is an untrusted proxy: it follows redirects and the page's scripts, and resolves names again. A scrape is
read only when every URL Firecrawl reports for it (where the page ended, first) passes the same checks and stays on
the checked origin; otherwise the page is refused, as unreadable. What Firecrawl's own DNS answers cannot be seen from
here, which is why a self-hosted Firecrawl must have no route to private networks. A scrape counts as a provider call
and its Markdown is charged to the run's byte budget.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from concurrent.futures import Executor

from research.cpu import run_cpu
from research.events import Emit, ProviderCall, ProviderError, ProviderResult
from research.fetch import FetchBudget, FetchConfig, SafeFetcher, media_type_of
from research.models import FetchResult
from research.netguard import same_origin
from research.providers import SearchProviderError
from research.providers.firecrawl import FirecrawlScraper, ScrapedPage
from research.robots import RobotsCache
from research.sources import SourceRegistry

# A bot wall answers these; other statuses (404, 410, 500) would not be read through a browser either.
BOT_WALL_STATUSES = frozenset({403, 429})
MARKDOWN_CONTENT_TYPE = "text/markdown; charset=utf-8"
# Below this much main text an HTML page is a shell that its scripts would fill in a browser.
MIN_MAIN_TEXT_CHARACTERS = 200
_INVISIBLE_BLOCKS = re.compile(rb"<(script|style|noscript|template|svg|head)\b.*?</\1\s*>|<!--.*?-->", re.IGNORECASE | re.DOTALL)
_TAGS = re.compile(rb"<[^>]*>")
_SPACE = re.compile(rb"\s+")


def worth_scraping(result: FetchResult) -> bool:
    """Whether a failed fetch is one a browser may get past: a bot wall's 403 or 429 (never a timeout)."""
    if result.status != "failed":
        return False  # refused (safety), skipped (robots.txt, budget) and ok pages are never sent
    return result.http_status in BOT_WALL_STATUSES


def is_script_shell(url: str, body: bytes, content_type: str | None) -> bool:
    """Whether an HTML page holds no main text of its own (a JavaScript shell); top-level, for the CPU pool."""
    if media_type_of(content_type) not in ("text/html", "application/xhtml+xml"):
        return False
    # Counting visible characters first keeps the extractor off every ordinary page.
    visible = _SPACE.sub(b"", _TAGS.sub(b"", _INVISIBLE_BLOCKS.sub(b"", body)))
    if len(visible) >= MIN_MAIN_TEXT_CHARACTERS * 4:
        return False
    from research.extract import extract_document  # in the CPU pool's process, which has the readers

    document = extract_document(url, body, content_type)
    return document is None or len(document.text.strip()) < MIN_MAIN_TEXT_CHARACTERS


class FallbackFetcher:
    """A run's fetcher: the safe fetcher first, Firecrawl for the pages it could not read, provided text where there is some."""

    def __init__(
        self,
        fetcher: SafeFetcher,
        *,
        scraper: FirecrawlScraper | None,
        registry: SourceRegistry,
        emit: Emit,
        count_call: Callable[[str], None],
        may_call: Callable[[], bool],
        cpu_pool: Executor | None = None,
    ) -> None:
        self._fetcher = fetcher
        self._scraper = scraper
        self._registry = registry
        self._emit = emit
        self._count_call = count_call
        self._may_call = may_call
        self._cpu_pool = cpu_pool
        self._scraper_disabled: str | None = None

    @property
    def config(self) -> FetchConfig:
        return self._fetcher.config

    @property
    def budget(self) -> FetchBudget:
        return self._fetcher.budget

    @property
    def robots(self) -> RobotsCache:
        return self._fetcher.robots

    async def fetch(self, url: str) -> FetchResult:
        """Fetch one URL and return its recorded outcome, read through Firecrawl when the safe fetcher could not; never raises."""
        source = self._registry.find(url)
        if source is not None and source.content:
            return await self._from_provided_text(url, source.content)
        result = await self._fetcher.fetch(url)
        if self._scraper is None or self._scraper_disabled is not None:
            return result
        if worth_scraping(result) or (result.ok and await self._is_script_shell(result)):
            return await self._scraped_instead(result)
        return result

    async def _is_script_shell(self, result: FetchResult) -> bool:
        try:
            return await run_cpu(is_script_shell, result.final_url or result.url, result.body, result.content_type,
                                 pool=self._cpu_pool)
        except Exception:  # a page the extractor chokes on is left to the read phase to report
            return False

    async def _from_provided_text(self, url: str, text: str) -> FetchResult:
        """The page as the search provider sent it, once the fetcher's checks let its URL through."""
        refused = await self._fetcher.refusal(url)
        if refused is not None:
            return refused
        return self._charged(FetchResult(url=url, final_url=url, status="ok", reason="text from the search provider",
                                         content_type=MARKDOWN_CONTENT_TYPE, body=text.encode()))

    async def _scraped_instead(self, result: FetchResult) -> FetchResult:
        """`result`'s page read through Firecrawl, or `result` itself (its reason extended) when that cannot be done."""
        assert self._scraper is not None
        target = result.final_url or result.url
        # The fetcher checked this URL before it failed; checking again keeps Firecrawl behind the same rules.
        if not self._may_call() or self.budget.exhausted or await self._fetcher.refusal(target) is not None:
            return result
        why = "no main text" if result.ok else f"HTTP {result.http_status}" if result.http_status else (result.reason or "")
        self._count_call(self._scraper.name)
        await self._emit(ProviderCall(phase="fetch", provider=self._scraper.name, query=target))
        started = time.monotonic()
        try:
            page = await self._scraper.scrape(target)
        except SearchProviderError as error:
            await self._emit(ProviderError(phase="fetch", provider=self._scraper.name, query=target, reason=error.reason,
                                           skipped=error.disables_provider))
            if error.disables_provider:
                self._scraper_disabled = error.reason
            # A shell is still read as it is; a failed page keeps its failure, with Firecrawl's reason added.
            return result if result.ok else result.model_copy(update={"reason": f"{why}; Firecrawl: {error.reason}"})
        seconds = time.monotonic() - started
        refused = await self._refused_scrape(target, page)
        if refused is not None:
            await self._emit(ProviderError(phase="fetch", provider=self._scraper.name, query=target, reason=refused))
            if result.ok:  # a shell the fetcher read safely is still read as it is, as when Firecrawl fails
                return result
            return FetchResult(url=result.url, status="refused", reason=f"{why}; Firecrawl's page {refused}",
                               http_status=result.http_status, seconds=round(result.seconds + seconds, 3))
        await self._emit(ProviderResult(phase="fetch", provider=self._scraper.name, query=target, results=1,
                                        seconds=round(seconds, 3)))
        return self._charged(FetchResult(
            url=result.url, final_url=target, status="ok", reason=f"read through Firecrawl ({why})",
            http_status=page.status_code, content_type=MARKDOWN_CONTENT_TYPE, body=page.markdown.encode(),
            seconds=round(result.seconds + seconds, 3),
        ))

    async def _refused_scrape(self, target: str, page: ScrapedPage) -> str | None:
        """Why a scrape of `target` must not be read (where Firecrawl says the page went), or None when it may be."""
        for reported in page.reported_urls:
            refusal = await self._fetcher.refusal(reported)
            if refusal is not None:
                return f"ended at {reported}, refused: {refusal.reason}"
            # Firecrawl cannot be told not to follow redirects; this is what keeps it on the checked origin.
            if not same_origin(target, reported):
                return f"ended at {reported}, off {target}'s origin"
        return None

    def _charged(self, result: FetchResult) -> FetchResult:
        """`result` with its text charged to the run's byte budget, or skipped when the budget cannot cover it."""
        size = len(result.body)
        if not self.budget.charge(size):
            return FetchResult(url=result.url, status="skipped", reason="fetch budget spent", bytes_read=size)
        return result.model_copy(update={"bytes_read": result.bytes_read + size})
