"""Build the engine's tools and budget from the settings (shared by the CLI and the workers)."""

from __future__ import annotations

from concurrent.futures import Executor

import httpx

from config import Settings
from research.budget import ResearchOptions
from research.phases.files import FileLimits
from research.engine import ResearchTools
from research.fetch import FetchConfig
from research.limits import CircuitBreaker, RateLimiter
from research.llm import LLMClient, LLMConfig
from research.models import PROVIDER_ORDER, ProviderName
from research.netguard import OverrideResolver, Resolver, SystemResolver, parse_allow_list, parse_resolve_overrides
from research.providers import SearchConfig

# SEARCH_PROVIDERS' words, checked by the settings, as the provider names the router takes.
_PROVIDER_NAMES: dict[str, ProviderName] = {name: name for name in PROVIDER_ORDER}


def llm_config(settings: Settings) -> LLMConfig:
    """The LLM endpoint and prices; raises ValueError when LLM_MODEL is missing."""
    if not settings.llm_model:
        raise ValueError("LLM_MODEL is not set: name the model deepthread should use (see .env.example)")
    return LLMConfig(
        base_url=settings.llm_base_url, api_key=settings.secret("llm_api_key"), model=settings.llm_model,
        fast_model=settings.llm_fast_model, price_input_per_mtok=settings.llm_price_input_per_mtok,
        price_output_per_mtok=settings.llm_price_output_per_mtok,
        max_output_tokens=settings.llm_max_output_tokens, reasoning_effort=settings.llm_reasoning_effort or None,
        connect_timeout_seconds=settings.llm_connect_timeout, first_token_timeout_seconds=settings.llm_first_token_timeout,
        idle_timeout_seconds=settings.llm_idle_timeout, timeout_seconds=settings.llm_timeout,
        context_tokens=settings.llm_context_tokens, parallel_requests=settings.llm_parallel_requests,
    )


def search_config(settings: Settings) -> SearchConfig:
    """Providers, keys, base URLs and domain lists as the router wants them."""
    return SearchConfig(
        providers=([_PROVIDER_NAMES[name] for name in settings.search_providers]
                   if settings.search_providers != ["auto"] else "auto"),
        fanout=settings.search_fanout,
        tavily_api_key=settings.secret("tavily_api_key"), tavily_base_url=settings.tavily_base_url,
        brave_api_key=settings.secret("brave_api_key"), brave_base_url=settings.brave_base_url,
        exa_api_key=settings.secret("exa_api_key"), exa_base_url=settings.exa_base_url,
        searxng_url=settings.searxng_url,
        firecrawl_api_key=settings.secret("firecrawl_api_key"), firecrawl_base_url=settings.firecrawl_base_url,
        firecrawl_max_concurrency=settings.firecrawl_max_concurrency,
        blocked_domains=settings.research_blocked_domains, preferred_domains=settings.research_preferred_domains,
    )


def research_options(settings: Settings) -> ResearchOptions:
    """The configured budget of one research run."""
    return ResearchOptions(
        max_seconds=settings.research_max_seconds, max_rounds=settings.research_max_rounds,
        max_searches=settings.research_max_searches, max_sources=settings.research_max_sources,
        max_fetch_bytes=settings.research_max_fetch_bytes, max_llm_tokens=settings.research_max_llm_tokens,
        max_context_tokens=settings.chat_max_context_tokens, chat_max_output_tokens=settings.chat_max_output_tokens,
        chat_max_llm_tokens=settings.chat_max_llm_tokens,
    )


def resolver(settings: Settings) -> Resolver:
    """The system resolver, with FETCH_RESOLVE's fixed answers first."""
    overrides = parse_resolve_overrides(settings.fetch_resolve)
    return OverrideResolver(overrides, SystemResolver()) if overrides else SystemResolver()


def build_research_tools(
    settings: Settings,
    *,
    cpu_pool: Executor | None = None,
    limiter: RateLimiter | None = None,
    breaker: CircuitBreaker | None = None,
    llm_http: httpx.AsyncClient | None = None,
    search_http: httpx.AsyncClient | None = None,
    name_resolver: Resolver | None = None,
    search: SearchConfig | None = None,
) -> ResearchTools:
    """Everything the engine needs, from the settings; tests pass their own clients and resolver, and a caller that
    has read the search settings already (for the shared limiter) passes them."""
    return ResearchTools(
        llm=LLMClient(llm_config(settings), http_client=llm_http),
        search_config=search or search_config(settings),
        search_http=search_http or httpx.AsyncClient(timeout=httpx.Timeout(20.0), trust_env=True),
        resolver=name_resolver or resolver(settings),
        fetch_config=FetchConfig(allow_private=parse_allow_list(",".join(settings.fetch_allow_private_hosts)),
                                 max_per_host=settings.fetch_max_per_host),
        limiter=limiter,
        breaker=breaker,
        cpu_pool=cpu_pool,
        file_limits=FileLimits(max_bytes=settings.file_max_bytes, max_pdf_pages=settings.file_max_pdf_pages,
                               max_files=settings.file_max_per_run),
    )
