"""What every search provider shares: its configuration, its error family, and the helpers that read HTTP replies."""

from __future__ import annotations

from collections.abc import Iterable

import contextvars
import datetime as dt
import email.utils
import json
from collections.abc import Callable
from typing import Any, Literal, Protocol

import httpx
from pydantic import BaseModel, Field, field_validator

from research.errors import DeepthreadError
from research.models import PROVIDER_ORDER, ProviderName, SearchQuery, SearchResult

DEFAULT_TAVILY_BASE_URL = "https://api.tavily.com"
DEFAULT_BRAVE_BASE_URL = "https://api.search.brave.com"
DEFAULT_EXA_BASE_URL = "https://api.exa.ai"
DEFAULT_FIRECRAWL_BASE_URL = "https://api.firecrawl.dev"

ProviderErrorKind = Literal["auth", "rate_limited", "server", "malformed", "unavailable", "timeout", "rejected", "empty", "payment"]

_REASONS: dict[ProviderErrorKind, str] = {
    "auth": "authentication failed",
    "rate_limited": "rate limited",
    "server": "server error",
    "malformed": "malformed response",
    "unavailable": "unavailable",
    "timeout": "timed out",
    "rejected": "request rejected",
    "empty": "empty result",
    "payment": "payment required",
}


class SearchProviderError(DeepthreadError):
    """A provider call failed; `kind` says how, `retry_after` (seconds) is the provider's own hint."""

    def __init__(
        self,
        provider: str,
        kind: ProviderErrorKind,
        detail: str = "",
        *,
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        self.provider = provider
        self.kind = kind
        self.detail = detail
        self.status = status
        self.retry_after = retry_after
        super().__init__(f"{provider}: {self.reason}" + (f" ({detail})" if detail else ""))

    @property
    def reason(self) -> str:
        """A short human reason such as "rate limited" or "server error (HTTP 502)"."""
        text = _REASONS[self.kind]
        return f"{text} (HTTP {self.status})" if self.status is not None and self.kind != "rate_limited" else text

    @property
    def retryable(self) -> bool:
        """Whether trying the same call again later may succeed (429 and 5xx)."""
        return self.kind in ("rate_limited", "server")

    @property
    def disables_provider(self) -> bool:
        """Whether the provider is useless for the rest of the run (a rejected key, spent credits)."""
        return self.kind in ("auth", "payment")


class SearchProvider(Protocol):
    """One search API, normalising its hits to `SearchResult`s (without ids)."""

    name: ProviderName

    async def search(self, query: SearchQuery) -> list[SearchResult]:
        """Search for `query`; raises SearchProviderError on any failure."""
        ...


def _optional_text(value: Any) -> str | None:
    """A configured secret or string as plain text, with blanks meaning "not set"."""
    if value is None:
        return None
    if hasattr(value, "get_secret_value"):
        value = value.get_secret_value()
    text = str(value).strip()
    return text or None


class SearchConfig(BaseModel):
    """Which providers to use and how: keys, base URLs, domain lists, retries, limits."""

    providers: list[ProviderName] | Literal["auto"] = "auto"
    fanout: bool = False
    tavily_api_key: str | None = None
    tavily_base_url: str = DEFAULT_TAVILY_BASE_URL
    brave_api_key: str | None = None
    brave_base_url: str = DEFAULT_BRAVE_BASE_URL
    exa_api_key: str | None = None
    exa_base_url: str = DEFAULT_EXA_BASE_URL
    searxng_url: str | None = None
    firecrawl_api_key: str | None = None
    firecrawl_base_url: str = DEFAULT_FIRECRAWL_BASE_URL
    # Firecrawl calls in flight (searches and scrapes together) per event loop, i.e. per worker process.
    firecrawl_max_concurrency: int = Field(default=2, ge=1)
    blocked_domains: list[str] = Field(default_factory=list)
    preferred_domains: list[str] = Field(default_factory=list)
    restrict_to_preferred: bool = False
    max_results: int = Field(default=8, ge=1, le=50)
    timeout_seconds: float = Field(default=20.0, gt=0)
    max_attempts: int = Field(default=3, ge=1)
    backoff_base_seconds: float = Field(default=1.0, ge=0)
    max_retry_wait_seconds: float = Field(default=30.0, ge=0)
    breaker_failure_threshold: int = Field(default=3, ge=1)
    breaker_cooldown_seconds: float = Field(default=60.0, ge=0)
    # Brave's free plan allows one request a second per key; DuckDuckGo blocks bursts.
    min_interval_seconds: dict[str, float] = Field(default_factory=lambda: {"brave": 1.0, "duckduckgo": 1.0})
    concurrency: int = Field(default=4, ge=1)

    @field_validator("providers", mode="before")
    @classmethod
    def _providers_from_text(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [item.strip() for item in value.split(",") if item.strip()]
        if isinstance(value, list | tuple):
            names = [str(item).strip().lower() for item in value]
            return "auto" if names in ([], ["auto"]) else names
        return value

    @field_validator("tavily_api_key", "brave_api_key", "exa_api_key", "searxng_url", "firecrawl_api_key", mode="before")
    @classmethod
    def _blank_is_unset(cls, value: Any) -> str | None:
        return _optional_text(value)

    @field_validator("tavily_base_url", "brave_base_url", "exa_base_url", "searxng_url", "firecrawl_base_url")
    @classmethod
    def _no_trailing_slash(cls, value: str | None) -> str | None:
        return value.rstrip("/") if value else value

    def is_configured(self, provider: ProviderName) -> bool:
        """Whether `provider` has what it needs (a key or a URL; DuckDuckGo needs nothing)."""
        needs: dict[ProviderName, str | None] = {
            "tavily": self.tavily_api_key,
            "brave": self.brave_api_key,
            "exa": self.exa_api_key,
            "searxng": self.searxng_url,
            "firecrawl": self.firecrawl_api_key,
            "duckduckgo": "keyless",
        }
        return needs[provider] is not None

    def ordered_providers(self) -> list[ProviderName]:
        """The providers to try, in order: the configured list, or for `auto` the configured ones in the documented order."""
        if self.providers == "auto":
            return [name for name in PROVIDER_ORDER if self.is_configured(name)]
        return list(dict.fromkeys(self.providers))


def parse_retry_after(value: str | None, *, now: dt.datetime | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP date), or None when absent or unreadable."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    current = now or dt.datetime.now(dt.timezone.utc)
    return max(0.0, (when - current).total_seconds())


def parse_published(value: Any) -> dt.date | None:
    """The calendar date of an ISO 8601 or RFC 2822 timestamp, or None when absent or unreadable."""
    if not isinstance(value, str) or not value.strip():
        return None
    text = value.strip()
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).date()
    except ValueError:
        pass
    try:
        return dt.date.fromisoformat(text[:10])
    except ValueError:
        pass
    try:
        return email.utils.parsedate_to_datetime(text).date()
    except (TypeError, ValueError, IndexError):
        return None


def text_or_none(value: Any) -> str | None:
    """`value` stripped when it is a non-blank string, else None."""
    return value.strip() if isinstance(value, str) and value.strip() else None


def float_or_none(value: Any) -> float | None:
    """`value` as a float when it is a number (not a bool), else None."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def strings_in(value: Any) -> list[str]:
    """The non-blank strings of a list (anything else gives an empty list)."""
    if not isinstance(value, list):
        return []
    return [item.strip() for item in value if isinstance(item, str) and item.strip()]


def build_result(
    provider: str,
    *,
    url: Any,
    title: Any,
    snippet: Any = None,
    published: Any = None,
    score: Any = None,
    extra_snippets: Any = None,
    content: Any = None,
) -> SearchResult | None:
    """A SearchResult from loosely typed fields, or None when there is no http(s) URL to keep."""
    link = text_or_none(url)
    if link is None or not link.lower().startswith(("http://", "https://")):
        return None
    return SearchResult(
        provider=provider,
        title=text_or_none(title) or link,
        url=link,
        snippet=text_or_none(snippet) or "",
        published=parse_published(published),
        score=float_or_none(score),
        extra_snippets=strings_in(extra_snippets),
        content=text_or_none(content),
    )


def build_results(provider: str, items: Iterable[Any], **keys: str) -> list[SearchResult]:
    """SearchResults from JSON objects, each field read from the key named for it (`snippet="content"`); items that
    are not objects or have no http(s) URL are skipped."""
    results: list[SearchResult] = []
    for item in items:
        if isinstance(item, dict):
            result = build_result(provider, **{field: item.get(key) for field, key in keys.items()})
            if result is not None:
                results.append(result)
    return results


def results_list(provider: str, payload: Any, *path: str, missing_is_empty: bool = False) -> list[Any]:
    """The list at `path` in a JSON payload (null counts as empty); raises SearchProviderError (malformed) when the payload has another shape or, unless `missing_is_empty`, lacks the path."""
    current = payload
    for key in path:
        if not isinstance(current, dict):
            raise SearchProviderError(provider, "malformed", f"expected a JSON object holding {key!r}")
        if key not in current and not missing_is_empty:
            raise SearchProviderError(provider, "malformed", f"no {key!r} in the reply")
        current = current.get(key)
        if current is None:
            return []
    if not isinstance(current, list):
        raise SearchProviderError(provider, "malformed", f"{'.'.join(path)} is not a list")
    return current


def error_for_status(
    provider: str, response: httpx.Response, *, fallback_retry_after: float | None = None,
) -> SearchProviderError:
    """The provider error that an HTTP error status stands for (401/403 auth, 402 payment, 429 rate limited, 5xx server,
    other 4xx rejected)."""
    status = response.status_code
    detail = " ".join(response.text.split())[:200]
    if status in (401, 403):
        kind: ProviderErrorKind = "auth"
    elif status == 402:
        kind = "payment"
    elif status == 429:
        kind = "rate_limited"
    elif status >= 500:
        kind = "server"
    else:
        kind = "rejected"
    hint = parse_retry_after(response.headers.get("retry-after"))
    if hint is None:
        hint = fallback_retry_after
    return SearchProviderError(provider, kind, detail, status=status, retry_after=hint if kind in ("rate_limited", "server") else None)


def decode_json(provider: str, response: httpx.Response) -> Any:
    """The JSON body of a successful reply; raises SearchProviderError (malformed) for anything else, such as an HTML page."""
    try:
        return json.loads(response.content)
    except (ValueError, UnicodeDecodeError) as error:
        snippet = " ".join(response.text.split())[:120]
        raise SearchProviderError(provider, "malformed", f"not JSON: {snippet!r}") from error


async def send_for_json(
    provider: str,
    http: httpx.AsyncClient,
    request: httpx.Request,
    *,
    retry_hint: Callable[[httpx.Response], float | None] | None = None,
) -> Any:
    """Send `request` and return its JSON body; raises SearchProviderError for transport failures, error statuses and non-JSON bodies.

    `retry_hint` reads a wait from a provider's own headers when the reply has no Retry-After.
    """
    try:
        response = await http.send(request)
    except httpx.TimeoutException as error:
        raise SearchProviderError(provider, "timeout", type(error).__name__) from error
    except httpx.HTTPError as error:
        raise SearchProviderError(provider, "unavailable", f"{type(error).__name__}: {error}") from error
    if response.status_code >= 400:
        hint = retry_hint(response) if retry_hint is not None else None
        raise error_for_status(provider, response, fallback_retry_after=hint)
    return decode_json(provider, response)


def exclusion_operators(domains: list[str]) -> str:
    """Search-operator text that keeps `domains` out of results (" -site:a.com -site:b.org")."""
    return "".join(f" -site:{domain}" for domain in domains)


_last_response: contextvars.ContextVar[httpx.Response | None] = contextvars.ContextVar("last_response", default=None)


class _NoTransport(httpx.AsyncBaseTransport):
    """The transport of a client that forwards every request elsewhere; using it is a bug."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        raise RuntimeError("ResponseRecordingClient sends through its inner client only")


class ResponseRecordingClient(httpx.AsyncClient):
    """An httpx client to hand a vendor SDK: it sends through the caller's client and remembers the last response in this task.

    SDK exceptions drop the status and headers (Retry-After); this keeps them. Being its own client also keeps the
    SDK's default headers (its API key) off the caller's shared client.
    """

    def __init__(self, inner: httpx.AsyncClient) -> None:
        super().__init__(transport=_NoTransport(), trust_env=False)
        self._inner = inner

    async def send(self, request: httpx.Request, **kwargs: Any) -> httpx.Response:
        response = await self._inner.send(request, **kwargs)
        _last_response.set(response)
        return response

    @staticmethod
    def forget_last_response() -> None:
        """Clear the remembered response before a new SDK call in this task."""
        _last_response.set(None)

    @staticmethod
    def last_response() -> httpx.Response | None:
        """The response to the latest request sent in this task since `forget_last_response`, if any."""
        return _last_response.get()


def error_from_sdk_failure(
    provider: str,
    error: Exception,
    response: httpx.Response | None,
    *,
    timeout_types: tuple[type[BaseException], ...] = (),
) -> SearchProviderError:
    """Classify an exception a vendor SDK raised, using the HTTP response it got when there was one."""
    if isinstance(error, SearchProviderError):
        return error
    if response is not None and response.status_code >= 400:
        return error_for_status(provider, response)
    if response is not None:
        return SearchProviderError(provider, "malformed", f"{type(error).__name__}: {error}"[:200])
    if isinstance(error, httpx.TimeoutException | TimeoutError) or isinstance(error, timeout_types):
        return SearchProviderError(provider, "timeout", type(error).__name__)
    return SearchProviderError(provider, "unavailable", f"{type(error).__name__}: {error}"[:200])


def query_with_exclusions(query: SearchQuery) -> str:
    """The query text with `-site:` operators for blocked domains, for engines that understand them."""
    return query.text + exclusion_operators(query.blocked_domains)
