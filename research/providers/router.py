"""The search router: providers in order with fallback (or all at once with fan-out), retries, limits and breakers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence

from pydantic import BaseModel, Field

from research.errors import DeepthreadError
from research.events import Emit, ProviderCall, ProviderError, ProviderResult
from research.limits import CircuitBreaker, RateLimiter
from research.models import ProviderName, SearchQuery, SearchResult
from research.providers.base import SearchConfig, SearchProvider, SearchProviderError
from research.sources import SourceRegistry

Sleep = Callable[[float], Awaitable[None]]
Clock = Callable[[], float]

NOT_CONFIGURED = "not configured"
CIRCUIT_OPEN = "circuit open"
# What a person sets in .env to make each provider usable (DuckDuckGo needs nothing).
PROVIDER_SETTINGS = {"tavily": "TAVILY_API_KEY", "brave": "BRAVE_API_KEY", "exa": "EXA_API_KEY",
                     "searxng": "SEARXNG_URL", "firecrawl": "FIRECRAWL_API_KEY"}


class NoSearchProviderError(DeepthreadError):
    """No provider could answer: none is usable, or every one failed for every query. `unset` names the settings
    that would have made the providers asked usable."""

    def __init__(self, *details: object, unset: Sequence[str] = ()) -> None:
        super().__init__(*details)
        self.unset = tuple(unset)

    @property
    def plain_reason(self) -> str:
        details = str(self).strip()
        reason = f"No search provider could answer ({details})." if details else "No search provider could answer."
        if self.unset:
            settings = self.unset[0] if len(self.unset) == 1 else f"{', '.join(self.unset[:-1])} or {self.unset[-1]}"
            reason += f" Set {settings} in .env, or SEARCH_PROVIDERS=auto to search DuckDuckGo, which needs no key."
        return reason


class ProviderUsage(BaseModel):
    """What one provider did during the run: calls made, results returned, failures, and why it was skipped."""

    calls: int = 0
    results: int = 0
    errors: list[str] = Field(default_factory=list)
    skipped: str | None = None


class _QueryOutcome(BaseModel):
    """The raw results one query got, and whether any provider answered it."""

    query: SearchQuery
    results: list[SearchResult] = Field(default_factory=list)
    answered: bool = False


class SearchRouter:
    """Sends queries to providers in `SEARCH_PROVIDERS` order, falling back on errors, and registers the results."""

    def __init__(
        self,
        providers: Sequence[SearchProvider],
        *,
        config: SearchConfig,
        emit: Emit,
        limiter: RateLimiter,
        breaker: CircuitBreaker,
        registry: SourceRegistry,
        not_configured: Sequence[ProviderName] = (),
        sleep: Sleep = asyncio.sleep,
        clock: Clock = time.monotonic,
    ) -> None:
        self.providers = list(providers)
        self.config = config
        self.registry = registry
        self._emit = emit
        self._limiter = limiter
        self._breaker = breaker
        self._sleep = sleep
        self._clock = clock
        self._usage: dict[str, ProviderUsage] = {name: ProviderUsage() for name in [*not_configured, *self.provider_names]}
        self._pending_skips: list[tuple[str, str]] = [(name, NOT_CONFIGURED) for name in not_configured]
        self._announced_skips: set[tuple[str, str]] = set()
        self._disabled: dict[str, str] = {}
        self._concurrency = asyncio.Semaphore(config.concurrency)

    @property
    def provider_names(self) -> list[str]:
        """The usable providers, in the order they are tried."""
        return [provider.name for provider in self.providers]

    @property
    def usage(self) -> dict[str, ProviderUsage]:
        """Per provider: calls, results, errors and skip reason so far (for the usage footer and the budget)."""
        return {name: usage.model_copy(deep=True) for name, usage in self._usage.items()}

    @property
    def calls(self) -> dict[str, int]:
        """Provider calls made so far, per provider (every HTTP attempt counts)."""
        return {name: usage.calls for name, usage in self._usage.items()}

    @property
    def total_calls(self) -> int:
        """Provider calls made so far, all providers together."""
        return sum(usage.calls for usage in self._usage.values())

    @property
    def skipped(self) -> dict[str, str]:
        """Providers that were skipped or failed during the run, with the latest reason ("not configured", "rate limited", …)."""
        return {
            name: usage.skipped or usage.errors[-1]
            for name, usage in self._usage.items()
            if usage.skipped or usage.errors
        }

    def count_call(self, provider: str) -> None:
        """Count a call made to `provider` outside search (a Firecrawl scrape), for the usage footer and the budget."""
        self._usage.setdefault(provider, ProviderUsage()).calls += 1

    async def search(self, queries: Sequence[SearchQuery],
                     on_found: Callable[[list[SearchResult]], None] | None = None) -> list[SearchResult]:
        """Run `queries` (concurrently, bounded) and return the run's sources they found, deduplicated, in id order.

        Each query's results are registered as soon as it and every query before it have answered (in query order,
        so `sN` ids do not depend on timing), and the sources new to this call are handed to `on_found` then: a
        caller can fetch the first query's pages while the others are still searching. Raises NoSearchProviderError
        when no provider answered any of them.
        """
        await self._announce_pending_skips()
        if not queries:
            return []
        searching = [asyncio.ensure_future(self._search_bounded(query)) for query in queries]
        found: dict[str, SearchResult] = {}
        registered = 0
        try:
            for answered in asyncio.as_completed(searching):
                await answered
                while registered < len(searching) and searching[registered].done():
                    new = [source for source in self._register(searching[registered].result())
                           if source.id not in found]
                    registered += 1
                    found.update((source.id, source) for source in new)
                    if new and on_found is not None:
                        on_found(new)
        finally:
            for task in searching:
                task.cancel()
        if not any(task.result().answered for task in searching):
            raise self._no_provider_error()
        return sorted(found.values(), key=lambda source: int(source.id[1:]))

    async def search_one(self, query: SearchQuery) -> list[SearchResult]:
        """Run one query and return the run's sources for it in rank order; raises NoSearchProviderError when no provider answered."""
        await self._announce_pending_skips()
        outcome = await self._search_bounded(query)
        if not outcome.answered:
            raise self._no_provider_error()
        return self._register(outcome)

    def effective_query(self, query: SearchQuery) -> SearchQuery:
        """`query` with the run's domain lists added and, unless the caller set one, the configured result count."""
        update: dict[str, object] = {
            "blocked_domains": list(dict.fromkeys([*self.config.blocked_domains, *query.blocked_domains])),
            "preferred_domains": list(dict.fromkeys([*self.config.preferred_domains, *query.preferred_domains])),
        }
        if "max_results" not in query.model_fields_set:
            update["max_results"] = self.config.max_results
        return query.model_copy(update=update)

    def _register(self, outcome: _QueryOutcome) -> list[SearchResult]:
        """Filter and register one query's results with the run's registry."""
        query = outcome.query
        return self.registry.add_results(
            outcome.results,
            blocked_domains=query.blocked_domains,
            preferred_domains=query.preferred_domains,
            since=query.since,
        )

    async def _search_bounded(self, query: SearchQuery) -> _QueryOutcome:
        async with self._concurrency:
            effective = self.effective_query(query)
            if self.config.fanout:
                return await self._fan_out(effective)
            return await self._first_that_answers(effective)

    async def _first_that_answers(self, query: SearchQuery) -> _QueryOutcome:
        """Try providers in order until one answers (an empty answer counts)."""
        for provider in self.providers:
            if not await self._is_usable(provider.name):
                continue
            results = await self._call(provider, query)
            if results is not None:
                return _QueryOutcome(query=query, results=results, answered=True)
        return _QueryOutcome(query=query)

    async def _fan_out(self, query: SearchQuery) -> _QueryOutcome:
        """Send the query to every usable provider at once and pool the answers in provider order."""
        usable = [provider for provider in self.providers if await self._is_usable(provider.name)]
        answers = await asyncio.gather(*(self._call(provider, query) for provider in usable))
        pooled = [result for answer in answers if answer is not None for result in answer]
        return _QueryOutcome(query=query, results=pooled, answered=any(answer is not None for answer in answers))

    async def _is_usable(self, name: str) -> bool:
        """Whether `name` may be called now: not disabled for the run and its circuit lets calls through."""
        if name in self._disabled:
            return False
        if not await self._breaker.allow(name):
            await self._skip(name, CIRCUIT_OPEN)
            return False
        return True

    async def _call(self, provider: SearchProvider, query: SearchQuery) -> list[SearchResult] | None:
        """One provider's answer after retries, or None when it failed (recorded, emitted, breaker told)."""
        try:
            results = await self._call_with_retries(provider, query)
        except SearchProviderError as error:
            await self._breaker.record_failure(provider.name)
            self._usage[provider.name].errors.append(error.reason)
            await self._emit(ProviderError(phase="search", provider=provider.name, query=query.text, reason=error.reason))
            if error.disables_provider:
                # A rejected key will not become valid, nor spent credits come back, during this run.
                self._disabled[provider.name] = error.reason
                await self._skip(provider.name, error.reason)
            return None
        await self._breaker.record_success(provider.name)
        self._usage[provider.name].results += len(results)
        return results

    async def _call_with_retries(self, provider: SearchProvider, query: SearchQuery) -> list[SearchResult]:
        """Call the provider, retrying 429 and 5xx with exponential backoff that honours Retry-After; raises the last SearchProviderError."""
        for attempt in range(1, self.config.max_attempts + 1):
            await self._limiter.acquire(provider.name)
            self._usage[provider.name].calls += 1
            await self._emit(ProviderCall(phase="search", provider=provider.name, query=query.text))
            started = self._clock()
            try:
                results = await provider.search(query)
            except SearchProviderError as error:
                wait = self._retry_wait(error, attempt)
                if wait is None:
                    raise
                await self._sleep(wait)
                continue
            await self._emit(ProviderResult(
                phase="search", provider=provider.name, query=query.text,
                results=len(results), seconds=self._clock() - started,
            ))
            return results
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _retry_wait(self, error: SearchProviderError, attempt: int) -> float | None:
        """Seconds to wait before retrying, or None to give up (not retryable, out of attempts, or asked to wait too long)."""
        if not error.retryable or attempt >= self.config.max_attempts:
            return None
        if error.retry_after is not None:
            # Waiting less than the provider asked only earns another 429: fall back instead.
            return error.retry_after if error.retry_after <= self.config.max_retry_wait_seconds else None
        backoff = self.config.backoff_base_seconds * 2 ** (attempt - 1)
        return min(backoff, self.config.max_retry_wait_seconds)

    async def _skip(self, name: str, reason: str) -> None:
        """Record that `name` is skipped and why, emitting the diagnostic once per provider and reason."""
        self._usage.setdefault(name, ProviderUsage()).skipped = reason
        if (name, reason) not in self._announced_skips:
            self._announced_skips.add((name, reason))
            await self._emit(ProviderError(phase="search", provider=name, reason=reason, skipped=True))

    async def _announce_pending_skips(self) -> None:
        pending, self._pending_skips = self._pending_skips, []
        for name, reason in pending:
            await self._skip(name, reason)

    def _no_provider_error(self) -> NoSearchProviderError:
        """The error for no provider answering: why each gave nothing, and the settings that would make the
        providers not configured usable."""
        if not self._usage:
            return NoSearchProviderError("none is configured")
        reasons = self.skipped
        unset = [PROVIDER_SETTINGS[name] for name, reason in reasons.items()
                 if reason == NOT_CONFIGURED and name in PROVIDER_SETTINGS]
        summary = "; ".join(f"{name}: {reason}" for name, reason in reasons.items()) or "none is usable"
        return NoSearchProviderError(summary, unset=unset)
