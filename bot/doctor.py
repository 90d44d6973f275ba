"""`deepthread doctor`: what is configured, what answers, and what is missing, with secrets masked."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Literal

import httpx
import redis
from pydantic import BaseModel

from config import Settings
from research.models import PROVIDER_ORDER, ProviderName
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
        checks.extend(_check_models(settings, response))
    return checks


def listed_models(response: httpx.Response) -> list[str] | None:
    """The model ids an OpenAI-style `/models` answer lists, or None when it lists none, or the server serves any
    name it is asked for (llama.cpp's llama-server, whose models are `owned_by` "llamacpp")."""
    if not response.is_success:
        return None
    try:
        entries = response.json().get("data")
    except (ValueError, AttributeError):
        return None
    if not isinstance(entries, list):
        return None
    models = [entry for entry in entries if isinstance(entry, dict) and isinstance(entry.get("id"), str)]
    if not models or all(entry.get("owned_by") == "llamacpp" for entry in models):
        return None
    return [entry["id"] for entry in models]


def _is_listed(model: str, listed: list[str]) -> bool:
    # Ollama answers to a name without a tag as to its ":latest".
    return model in listed or (":" not in model and f"{model}:latest" in listed)


def _check_models(settings: Settings, response: httpx.Response) -> list[Check]:
    """`llm model`: LLM_MODEL (and LLM_FAST_MODEL) among the models the endpoint lists, when it lists any."""
    listed = listed_models(response)
    if listed is None or not settings.llm_model:
        return []
    chosen = {"LLM_MODEL": settings.llm_model}
    if settings.llm_fast_model and settings.llm_fast_model != settings.llm_model:
        chosen["LLM_FAST_MODEL"] = settings.llm_fast_model
    unlisted = [f"{variable}={model}" for variable, model in chosen.items() if not _is_listed(model, listed)]
    if not unlisted:
        return [Check(component="llm model", status="ok", required=True,
                      detail=f"{', '.join(chosen.values())} listed by {settings.llm_base_url}/models")]
    few = ", ".join(listed[:5]) + (f" and {len(listed) - 5} more" if len(listed) > 5 else "")
    return [Check(component="llm model", status="missing", required=True,
                  detail=f"{' and '.join(unlisted)} {'is' if len(unlisted) == 1 else 'are'} not among the models "
                         f"the endpoint lists ({few}): set one of those in .env")]


def _probe(http: httpx.Client, url: str, headers: dict[str, str] | None = None) -> str | None:
    """None when `url` answers at all, else why not."""
    try:
        http.get(url, headers=headers or {})
    except httpx.HTTPError as error:
        return describe_http_error(error)
    return None


# What each provider needs before research may ask it (its setting, as named on Settings; DuckDuckGo needs nothing)
# and the address the doctor probes, judged as research.providers.SearchConfig.is_configured judges it.
def _provider_needs(settings: Settings) -> dict[ProviderName, tuple[str | None, str]]:
    return {"tavily": ("tavily_api_key", settings.tavily_base_url), "brave": ("brave_api_key", settings.brave_base_url),
            "exa": ("exa_api_key", settings.exa_base_url), "searxng": ("searxng_url", settings.searxng_url or ""),
            "firecrawl": ("firecrawl_api_key", settings.firecrawl_base_url), "duckduckgo": (None, DUCKDUCKGO_URL)}


_PROVIDER_NAMES: dict[str, ProviderName] = {name: name for name in PROVIDER_ORDER}


def _has(settings: Settings, setting: str | None) -> bool:
    """Whether `setting` is set (None, DuckDuckGo's: nothing is needed)."""
    if setting is None:
        return True
    value = getattr(settings, setting)
    return bool(value.get_secret_value() if hasattr(value, "get_secret_value") else value)


def searched_providers(settings: Settings) -> list[ProviderName]:
    """The providers research asks, in its order: SEARCH_PROVIDERS, or for `auto` every configured one in the
    documented order (as research.providers.SearchConfig.ordered_providers; DuckDuckGo needs nothing)."""
    if settings.search_providers == ["auto"]:
        needs = _provider_needs(settings)
        return [name for name in PROVIDER_ORDER if _has(settings, needs[name][0])]
    return list(dict.fromkeys(_PROVIDER_NAMES[name] for name in settings.search_providers))


def _either(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def check_search(settings: Settings, http: httpx.Client) -> list[Check]:
    """A line per provider, probing only those research asks (SEARCH_PROVIDERS), and Firecrawl when its key makes it
    the scrape fallback; then `search`, which fails when none of the providers research asks can answer."""
    needs = _provider_needs(settings)
    searched = searched_providers(settings)
    checks: list[Check] = []
    answering: list[ProviderName] = []
    not_set: list[str] = []  # what the providers SEARCH_PROVIDERS lists lack
    for name in PROVIDER_ORDER:
        setting, url = needs[name]
        variable, configured = (setting or "").upper(), _has(settings, setting)
        if name in searched and not configured:
            not_set.append(variable)
            checks.append(Check(component=f"search: {name}", status="missing",
                                detail=f"in SEARCH_PROVIDERS, but {variable} is not set: research skips it"))
            continue
        # Firecrawl with a key reads the pages the safe fetcher cannot, also when research does not search with it.
        scrape_only = name == "firecrawl" and name not in searched and configured
        if name not in searched and not scrape_only:
            why = ("keyless, but not in SEARCH_PROVIDERS" if setting is None else
                   f"{variable} set, but not in SEARCH_PROVIDERS" if configured else f"{variable} not set")
            checks.append(Check(component=f"search: {name}", status="off", detail=why))
            continue
        problem = _probe(http, url)
        if problem is None and not scrape_only:
            answering.append(name)
        what = "keyless" if setting is None else "key set" if setting.endswith("_key") else "set"
        if scrape_only:
            what += ", the scrape fallback only (not in SEARCH_PROVIDERS)"
        checks.append(Check(component=f"search: {name}", status="error" if problem else "ok",
                            detail=f"{what}; {url} " + (problem or "reachable")))
    checks.append(_search_verdict(settings, searched, answering, not_set))
    return checks


def _search_verdict(settings: Settings, searched: list[ProviderName], answering: list[ProviderName],
                    not_set: list[str]) -> Check:
    """`search`: ok when a provider research asks answers; else what to set in .env (or to check) so that one does."""
    if answering:
        silent = [name for name in searched if name not in answering]
        return Check(component="search", status="ok", required=True,
                     detail=f"research searches with {', '.join(answering)}"
                            + (f" ({', '.join(silent)} cannot answer)" if silent else ""))
    if not_set:
        fix = f"set {_either(not_set)} in .env"
    else:
        unset = [setting.upper() for setting, _url in _provider_needs(settings).values()
                 if setting is not None and not _has(settings, setting)]
        add = "" if settings.search_providers == ["auto"] else " and add that provider to SEARCH_PROVIDERS"
        fix = f"check the network, or set {_either(unset)} in .env{add}" if unset else "check the network"
    return Check(component="search", status="missing" if not_set else "error", required=True,
                 detail=f"no search provider can answer (SEARCH_PROVIDERS={','.join(settings.search_providers)}): {fix}")


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
