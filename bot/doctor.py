"""`deepthread doctor`: what is configured, what answers, and what is missing, with secrets masked."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Literal

import httpx
import redis
from pydantic import BaseModel

from config import Settings
from storage.db import reachable_backend
from storage.redis import connect, resolve_redis_url

Status = Literal["ok", "missing", "error", "off"]
# What the keyless fallback provider (the ddgs package) reaches.
DUCKDUCKGO_URL = "https://html.duckduckgo.com/html/"
SYMBOLS: dict[Status, str] = {"ok": "✔", "missing": "✘", "error": "✘", "off": "·"}


class Check(BaseModel):
    """The verdict on one component; `required` failures make the doctor exit non-zero."""

    component: str
    status: Status
    detail: str
    required: bool = False

    @property
    def failed(self) -> bool:
        return self.required and self.status in ("missing", "error")


def describe_http_error(error: Exception) -> str:
    if isinstance(error, httpx.TimeoutException):
        return "timed out"
    if isinstance(error, httpx.ConnectError):
        return "connection refused or host unknown"
    return type(error).__name__


_URL_CREDENTIALS = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)[^/@\s]+@", re.IGNORECASE)


def _redact(settings: Settings, message: str) -> str:
    """Remove every secret value from a message (errors can echo URLs or headers), and any `user:password@` of a URL."""
    for name, value in settings:
        if hasattr(value, "get_secret_value") and value.get_secret_value():
            message = message.replace(value.get_secret_value(), "***")
    return _URL_CREDENTIALS.sub(r"\g<scheme>***@", message)


def check_database(settings: Settings) -> Check:
    try:
        backend = reachable_backend(settings.database_url)
    except Exception as error:  # any driver error is a verdict here, not a crash
        return Check(component="database", status="error", detail=f"unreachable: {type(error).__name__}", required=True)
    return Check(component="database", status="ok", detail=f"{backend} reachable", required=True)


RedisFactory = Callable[[Settings], redis.Redis]


def configured_redis(settings: Settings) -> redis.Redis:
    """A client for REDIS_URL, or for the embedded server (started if need be) when it is empty."""
    return connect(resolve_redis_url(settings.redis_url, settings.data_dir))


def check_redis(settings: Settings, redis_for: RedisFactory = configured_redis) -> Check:
    where = "configured server" if settings.redis_url else "embedded server under " + settings.data_dir
    try:
        redis_for(settings).ping()
    except Exception as error:  # a failed ping is a verdict here, not a crash
        return Check(component="redis", status="error", detail=f"{where}: {type(error).__name__}", required=True)
    return Check(component="redis", status="ok", detail=f"{where} answers PING", required=True)


def check_llm(settings: Settings, http: httpx.Client) -> list[Check]:
    checks: list[Check] = []
    if not settings.llm_model:
        checks.append(Check(component="llm", status="missing", detail="LLM_MODEL is not set", required=True))
    key = settings.secret("llm_api_key")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        response = http.get(f"{settings.llm_base_url.rstrip('/')}/models", headers=headers)
    except httpx.HTTPError as error:
        checks.append(Check(component="llm endpoint", status="error",
                            detail=f"{settings.llm_base_url}: {describe_http_error(error)}", required=True))
        return checks
    if response.status_code == 401:
        detail = "answers 401: LLM_API_KEY is missing" if not key else "answers 401: LLM_API_KEY is rejected"
        checks.append(Check(component="llm endpoint", status="missing" if not key else "error", detail=detail, required=True))
    else:
        key_note = "key set" if key else "no key (fine for local servers)"
        checks.append(Check(component="llm endpoint", status="ok",
                            detail=f"{settings.llm_base_url} answers HTTP {response.status_code}; {key_note}", required=True))
    return checks


def _probe(http: httpx.Client, url: str, headers: dict[str, str] | None = None) -> str | None:
    """None when `url` answers at all, else why not."""
    try:
        http.get(url, headers=headers or {})
    except httpx.HTTPError as error:
        return describe_http_error(error)
    return None


def check_search(settings: Settings, http: httpx.Client) -> list[Check]:
    keyed = {"tavily": ("tavily_api_key", settings.tavily_base_url),
             "brave": ("brave_api_key", settings.brave_base_url),
             "exa": ("exa_api_key", settings.exa_base_url),
             # Firecrawl is also the scrape fallback for pages the safe fetcher cannot read.
             "firecrawl": ("firecrawl_api_key", settings.firecrawl_base_url)}
    checks: list[Check] = []
    for name, (key_name, base_url) in keyed.items():
        if not settings.secret(key_name):
            checks.append(Check(component=f"search: {name}", status="off", detail=f"{key_name.upper()} not set"))
            continue
        problem = _probe(http, base_url)
        checks.append(Check(component=f"search: {name}", status="error" if problem else "ok",
                            detail=f"key set; {base_url} " + (problem or "reachable")))
    if settings.searxng_url:
        problem = _probe(http, settings.searxng_url)
        checks.append(Check(component="search: searxng", status="error" if problem else "ok",
                            detail=f"{settings.searxng_url} " + (problem or "reachable")))
    else:
        checks.append(Check(component="search: searxng", status="off", detail="SEARXNG_URL not set"))
    problem = _probe(http, DUCKDUCKGO_URL)
    checks.append(Check(component="search: duckduckgo", status="error" if problem else "ok",
                        detail="keyless fallback: " + (f"{DUCKDUCKGO_URL} {problem}" if problem else "reachable")))
    return checks


PlatformCheck = Callable[[Settings, httpx.Client], Check]


def run_checks(settings: Settings, http: httpx.Client, platform_checks: Iterable[PlatformCheck] = (), *,
               redis_for: RedisFactory = configured_redis) -> list[Check]:
    """Check every component, each platform with its bundle's check; never raises for a component that is down."""
    checks = [check_database(settings), check_redis(settings, redis_for), *check_llm(settings, http),
              *check_search(settings, http), *(check(settings, http) for check in platform_checks)]
    return [check.model_copy(update={"detail": _redact(settings, check.detail)}) for check in checks]


def format_checks(checks: list[Check]) -> str:
    """The doctor's report, one line per component and a verdict."""
    width = max(len(check.component) for check in checks)
    lines = [f"{SYMBOLS[check.status]} {check.component.ljust(width)}  {check.detail}" for check in checks]
    failed = [check.component for check in checks if check.failed]
    lines.append("")
    lines.append(f"Not ready: fix {', '.join(failed)}." if failed else "Ready.")
    return "\n".join(lines)
