"""Search providers (Tavily, Brave, Exa, SearXNG, Firecrawl, DuckDuckGo) and the router that uses them in order."""

from __future__ import annotations

import asyncio

import httpx

from research.events import Emit
from research.limits import CircuitBreaker, InMemoryCircuitBreaker, InMemoryRateLimiter, RateLimiter
from research.models import ProviderName
from research.providers.base import (
    ProviderErrorKind,
    SearchConfig,
    SearchProvider,
    SearchProviderError,
)
from research.providers.brave import BraveProvider
from research.providers.duckduckgo import DdgsSearch, DuckDuckGoProvider
from research.providers.firecrawl import FirecrawlProvider, FirecrawlScraper
from research.providers.router import NoSearchProviderError, ProviderUsage, SearchRouter, Sleep
from research.providers.searxng import SearxngProvider
from research.sources import SourceRegistry


def build_provider(
    name: ProviderName, config: SearchConfig, *, http: httpx.AsyncClient, ddgs_search: DdgsSearch | None = None,
) -> SearchProvider:
    """The provider called `name`, built from `config`; raises ValueError when it is not configured."""
    if not config.is_configured(name):
        raise ValueError(f"search provider {name} is not configured")
    timeout = config.timeout_seconds
    # The SDK-backed providers are imported only when configured: exa-py alone took a good part of a run's start-up.
    if name == "tavily":
        from research.providers.tavily import TavilyProvider

        return TavilyProvider(
            http, api_key=config.tavily_api_key or "", base_url=config.tavily_base_url,
            timeout_seconds=timeout, restrict_to_preferred=config.restrict_to_preferred,
        )
    if name == "brave":
        return BraveProvider(http, api_key=config.brave_api_key or "", base_url=config.brave_base_url, timeout_seconds=timeout)
    if name == "exa":
        from research.providers.exa import ExaProvider

        return ExaProvider(
            http, api_key=config.exa_api_key or "", base_url=config.exa_base_url,
            timeout_seconds=timeout, restrict_to_preferred=config.restrict_to_preferred,
        )
    if name == "searxng":
        return SearxngProvider(http, base_url=config.searxng_url or "", timeout_seconds=timeout)
    if name == "firecrawl":
        return FirecrawlProvider(
            http, api_key=config.firecrawl_api_key or "", base_url=config.firecrawl_base_url, timeout_seconds=timeout,
            max_concurrency=config.firecrawl_max_concurrency, restrict_to_preferred=config.restrict_to_preferred,
        )
    return DuckDuckGoProvider(search_function=ddgs_search, timeout_seconds=timeout)


def build_scraper(config: SearchConfig, *, http: httpx.AsyncClient) -> FirecrawlScraper | None:
    """The Firecrawl scraper for pages the safe fetcher cannot read, or None when Firecrawl is not configured."""
    if not config.is_configured("firecrawl"):
        return None
    return FirecrawlScraper(http, api_key=config.firecrawl_api_key or "", base_url=config.firecrawl_base_url,
                            max_concurrency=config.firecrawl_max_concurrency)


def build_router(
    config: SearchConfig,
    *,
    http: httpx.AsyncClient,
    emit: Emit,
    limiter: RateLimiter | None = None,
    breaker: CircuitBreaker | None = None,
    ddgs_search: DdgsSearch | None = None,
    sleep: Sleep = asyncio.sleep,
    registry: SourceRegistry | None = None,
) -> SearchRouter:
    """A run's search router over the configured providers in order; unconfigured ones named in `config.providers` are reported as skipped."""
    wanted = config.ordered_providers()
    usable = [name for name in wanted if config.is_configured(name)]
    if limiter is None:
        limiter = InMemoryRateLimiter(config.min_interval_seconds, sleep=sleep)
    if breaker is None:
        breaker = InMemoryCircuitBreaker(
            failure_threshold=config.breaker_failure_threshold, cooldown=config.breaker_cooldown_seconds,
        )
    if registry is None:
        registry = SourceRegistry(
            blocked_domains=config.blocked_domains,
            preferred_domains=config.preferred_domains,
            restrict_to_preferred=config.restrict_to_preferred,
        )
    return SearchRouter(
        [build_provider(name, config, http=http, ddgs_search=ddgs_search) for name in usable],
        config=config,
        emit=emit,
        limiter=limiter,
        breaker=breaker,
        registry=registry,
        not_configured=[name for name in wanted if name not in usable],
        sleep=sleep,
    )


def __getattr__(name: str) -> object:
    """`ExaProvider` and `TavilyProvider`, imported (with their SDKs) on first use rather than with this package."""
    if name == "ExaProvider":
        from research.providers.exa import ExaProvider

        return ExaProvider
    if name == "TavilyProvider":
        from research.providers.tavily import TavilyProvider

        return TavilyProvider
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BraveProvider",
    "DdgsSearch",
    "DuckDuckGoProvider",
    "ExaProvider",
    "FirecrawlProvider",
    "FirecrawlScraper",
    "NoSearchProviderError",
    "ProviderErrorKind",
    "ProviderUsage",
    "SearchConfig",
    "SearchProvider",
    "SearchProviderError",
    "SearchRouter",
    "SearxngProvider",
    "TavilyProvider",
    "build_provider",
    "build_scraper",
    "build_router",
]
