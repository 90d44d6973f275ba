"""Every setting deepthread reads, from the environment and `.env`, validated at start-up."""

from __future__ import annotations

import ipaddress
from functools import lru_cache
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from research.errors import DeepthreadError

PROVIDER_NAMES = ("tavily", "brave", "exa", "searxng", "firecrawl", "duckduckgo")
MIB = 1024 * 1024


class SettingsError(DeepthreadError):
    """A setting has an invalid value; the message is one line naming the variable."""


def _http_url(value: str | None) -> str | None:
    if value is None or value == "":
        return None
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http(s) URL such as https://example.com")
    return value.rstrip("/")


def _comma_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return [str(item).strip() for item in value if str(item).strip()]


HttpUrl = Annotated[str, AfterValidator(_http_url)]
OptionalHttpUrl = Annotated[str | None, AfterValidator(_http_url)]
CommaList = Annotated[list[str], NoDecode]


class Settings(BaseSettings):
    """deepthread's configuration; see `.env.example` for what each variable means."""

    model_config = SettingsConfigDict(env_file=".env", env_file_encoding="utf-8", extra="ignore", case_sensitive=False)

    database_url: str = "sqlite:///data/deepthread.db"
    redis_url: str = ""
    data_dir: str = "data"

    llm_base_url: HttpUrl = "https://api.openai.com/v1"
    llm_api_key: SecretStr | None = None
    llm_model: str | None = None
    llm_fast_model: str | None = None
    llm_price_input_per_mtok: float = Field(default=0.0, ge=0)
    llm_price_output_per_mtok: float = Field(default=0.0, ge=0)
    llm_max_output_tokens: int = Field(default=16_000, gt=0)
    llm_reasoning_effort: Literal["", "minimal", "low", "medium", "high"] = ""
    # How long to wait on the model (research.llm): streamed calls by connect, first token and idle gap, never a total.
    llm_connect_timeout: float = Field(default=10.0, gt=0)
    llm_first_token_timeout: float = Field(default=600.0, gt=0)
    llm_idle_timeout: float = Field(default=120.0, gt=0)
    llm_timeout: float = Field(default=900.0, gt=0)
    # The model's whole context window in tokens; empty: asked of the server (llama.cpp, vLLM, Ollama), else learnt.
    llm_context_tokens: int | None = Field(default=None, gt=0)
    # Whether the endpoint answers two calls at once; empty: yes unless it is on this machine or a private network.
    llm_parallel_requests: bool | None = None

    search_providers: CommaList = Field(default_factory=lambda: ["auto"])
    search_fanout: bool = False
    tavily_api_key: SecretStr | None = None
    tavily_base_url: HttpUrl = "https://api.tavily.com"
    brave_api_key: SecretStr | None = None
    brave_base_url: HttpUrl = "https://api.search.brave.com"
    exa_api_key: SecretStr | None = None
    exa_base_url: HttpUrl = "https://api.exa.ai"
    searxng_url: OptionalHttpUrl = None
    # Firecrawl: a search provider, and the scrape fallback for pages the safe fetcher cannot read (bot walls, JS shells).
    firecrawl_api_key: SecretStr | None = None
    firecrawl_base_url: HttpUrl = "https://api.firecrawl.dev"
    # Firecrawl calls in flight per worker process (its plans limit concurrency; more only earns 429s and empty pages).
    firecrawl_max_concurrency: int = Field(default=2, gt=0)

    fetch_allow_private_hosts: CommaList = Field(default_factory=list)
    fetch_resolve: CommaList = Field(default_factory=list)
    # Requests in flight per host (what browsers open); a robots.txt crawl delay or a 429 lowers it for that host.
    fetch_max_per_host: int = Field(default=6, gt=0)

    research_max_seconds: int = Field(default=300, gt=0)
    research_max_rounds: int = Field(default=3, gt=0)
    research_max_searches: int = Field(default=30, gt=0)
    research_max_sources: int = Field(default=12, gt=0)
    research_max_fetch_bytes: int = Field(default=25 * MIB, gt=0)
    research_max_llm_tokens: int = Field(default=200_000, gt=0)
    # The thread's earlier messages sent with any run (newest kept first, the one that overflows shortened).
    chat_max_context_tokens: int = Field(default=12_000, gt=0)
    # The output limit of one chat answer or follow-up (reasoning models think inside it).
    chat_max_output_tokens: int = Field(default=4_000, gt=0)
    # All model calls of one chat answer or follow-up together; past it the follow-up's citation check is skipped.
    chat_max_llm_tokens: int = Field(default=40_000, gt=0)
    research_blocked_domains: CommaList = Field(default_factory=list)
    research_preferred_domains: CommaList = Field(default_factory=list)

    worker_concurrency: int = Field(default=8, gt=0)
    # Database connections one worker process opens at most; its runs take turns for them (PostgreSQL's own limit,
    # 100 by default, is shared by every process).
    worker_database_connections: int = Field(default=32, gt=0)
    # Each worker process's /healthz and /metrics (0: none); workers sharing a host need a port each.
    worker_http_port: int = Field(default=9450, ge=0, le=65535)
    # One page's extraction in the CPU pool: its process is killed past this time or address-space limit.
    extract_timeout_seconds: float = Field(default=20, gt=0)
    extract_memory_limit_mb: int = Field(default=1024, ge=256)
    # Files shared in a conversation as sources (research.files): bytes one file may have, PDF pages read, files
    # one run reads (the newest of its thread).
    file_max_bytes: int = Field(default=20 * MIB, gt=0)
    file_max_pdf_pages: int = Field(default=200, gt=0)
    file_max_per_run: int = Field(default=10, gt=0)
    # Where shared files are downloaded from: the platforms' own file hosts, as origins (scheme and host; a port
    # only for the tests' fakes). The bot token goes to Slack's file host only; nothing follows a redirect elsewhere.
    slack_file_hosts: CommaList = Field(default_factory=lambda: ["https://files.slack.com"])
    discord_file_hosts: CommaList = Field(default_factory=lambda: ["https://cdn.discordapp.com", "https://media.discordapp.net"])
    worker_lease_seconds: float = Field(default=30, gt=0)
    worker_deadline_grace_seconds: float = Field(default=60, ge=0)
    status_edits_per_minute: int = Field(default=40, gt=0)
    # A report the platform refused for a while is retried by the resume sweep, backing off, this many times in all.
    delivery_max_attempts: int = Field(default=8, gt=0)
    delivery_retry_seconds: float = Field(default=30, gt=0)
    delivery_retry_max_seconds: float = Field(default=1800, gt=0)
    max_runs_per_user: int = Field(default=1, gt=0)
    max_runs_per_workspace: int = Field(default=10, gt=0)
    max_queued_per_user: int = Field(default=3, gt=0)
    # Runs one workspace may have waiting, whoever asked; 0 is off. On by default, like the daily run quota, so that
    # spend has a ceiling out of the box.
    max_queued_per_workspace: int = Field(default=20, ge=0)
    # Daily quotas (UTC day, counted in SQL): runs a person may start, LLM cost in USD a workspace may spend; 0 is off.
    daily_runs_per_user: int = Field(default=50, ge=0)
    daily_cost_per_workspace: float = Field(default=0.0, ge=0)
    admin_user_ids: CommaList = Field(default_factory=list)
    # Watches (research that comes back on its own): how often Celery beat asks the workers for due watches, how
    # long a claim of a due watch holds (on the database's clock), how many active watches a workspace may have
    # (0 is off), and the shortest interval a watch may repeat at.
    watch_tick_seconds: float = Field(default=60, gt=0)
    watch_claim_seconds: float = Field(default=120, gt=0)
    watch_max_per_workspace: int = Field(default=20, ge=0)
    watch_min_interval: Literal["daily", "weekly", "monthly"] = "daily"

    slack_bot_token: SecretStr | None = None
    slack_app_token: SecretStr | None = None
    slack_signing_secret: SecretStr | None = None
    slack_api_url: HttpUrl = "https://slack.com/api/"
    # Research progress: streamed task chunks, the edited status message, or auto (stream where the workspace can).
    # Edit by default: a stream per run doubles the Slack calls, and 200 runs at once in one worker then kept their
    # first status edit waiting 2-5 s (p95; bench/worker.py), against 1.3 s with edits alone.
    slack_progress: Literal["auto", "stream", "edit"] = "edit"
    # OAuth installs (many workspaces, HTTP mode): the app's credentials, and where Slack asks people to approve.
    slack_client_id: str | None = None
    slack_client_secret: SecretStr | None = None
    slack_authorize_url: HttpUrl = "https://slack.com/oauth/v2/authorize"
    # Fernet keys, comma-separated, that encrypt the OAuth installs' tokens in the database: the first encrypts, all
    # decrypt (a new key goes first, the old one after it until `deepthread migrate` has encrypted again).
    deepthread_secret_key: SecretStr | None = None
    # /metrics on the Slack app's port, which is the public one in HTTP mode: off unless Prometheus scrapes it there.
    slack_serve_metrics: bool = False
    discord_bot_token: SecretStr | None = None
    discord_application_id: str | None = None
    discord_api_url: HttpUrl = "https://discord.com/api/v10"
    discord_guild_ids: CommaList = Field(default_factory=list)
    # The Discord bot's /healthz and /metrics (0: none).
    discord_http_port: int = Field(default=9451, ge=0, le=65535)
    # The address every HTTP server listens on (the worker's and the Discord bot's /healthz and /metrics, the Slack
    # app's default --host): loopback unless a deployment opts in, as Compose does with 0.0.0.0.
    http_bind_address: str = "127.0.0.1"

    cancel_emoji: CommaList = Field(default_factory=lambda: ["x", "octagonal_sign", "❌", "🛑"])
    log_level: str = "INFO"
    log_format: str = "console"

    @field_validator(
        "search_providers", "fetch_allow_private_hosts", "fetch_resolve", "research_blocked_domains",
        "research_preferred_domains", "admin_user_ids", "discord_guild_ids", "cancel_emoji", "slack_file_hosts",
        "discord_file_hosts", mode="before",
    )
    @classmethod
    def _split_commas(cls, value: Any) -> list[str]:
        return _comma_list(value)

    @field_validator("daily_runs_per_user", "daily_cost_per_workspace", "max_queued_per_workspace", mode="before")
    @classmethod
    def _blank_quota_is_off(cls, value: Any) -> Any:
        return 0 if value is None or (isinstance(value, str) and not value.strip()) else value

    @field_validator("llm_context_tokens", "llm_parallel_requests", mode="before")
    @classmethod
    def _blank_window_is_unknown(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("search_providers")
    @classmethod
    def _known_providers(cls, value: list[str]) -> list[str]:
        names = [name.lower() for name in value] or ["auto"]
        if names == ["auto"]:
            return names
        unknown = [name for name in names if name not in PROVIDER_NAMES]
        if unknown:
            raise ValueError(f"unknown provider {', '.join(unknown)}; choose from auto or {','.join(PROVIDER_NAMES)}")
        return names

    @field_validator("fetch_allow_private_hosts")
    @classmethod
    def _valid_allow_list(cls, value: list[str]) -> list[str]:
        from research.netguard import parse_allow_list

        parse_allow_list(",".join(value))
        return value

    @field_validator("fetch_resolve")
    @classmethod
    def _valid_overrides(cls, value: list[str]) -> list[str]:
        from research.netguard import parse_resolve_overrides

        parse_resolve_overrides(value)
        return value

    @field_validator("discord_guild_ids")
    @classmethod
    def _snowflakes(cls, value: list[str]) -> list[str]:
        if any(not item.isdigit() for item in value):
            raise ValueError("must be a comma list of numeric guild ids, e.g. 123456789012345678")
        return value

    @field_validator("discord_application_id")
    @classmethod
    def _application_id(cls, value: str | None) -> str | None:
        if value and not value.isdigit():
            raise ValueError("must be the numeric application id from the developer portal")
        return value or None

    @field_validator("slack_api_url")
    @classmethod
    def _slack_trailing_slash(cls, value: str) -> str:
        # slack-sdk joins method names onto base_url, so it must end with a slash.
        return value if value.endswith("/") else value + "/"

    @field_validator("http_bind_address")
    @classmethod
    def _ip_address(cls, value: str) -> str:
        try:
            return str(ipaddress.ip_address(value.strip()))
        except ValueError:
            raise ValueError("must be an IP address: 127.0.0.1 (this host only) or 0.0.0.0 (every address)") from None

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        level = value.upper()
        if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise ValueError("must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL")
        return level

    @field_validator("log_format")
    @classmethod
    def _known_format(cls, value: str) -> str:
        if value not in ("console", "json"):
            raise ValueError("must be console or json")
        return value

    @field_validator("deepthread_secret_key")
    @classmethod
    def _fernet_keys(cls, value: SecretStr | None) -> SecretStr | None:
        keys = [key.strip() for key in (value.get_secret_value() if value is not None else "").split(",") if key.strip()]
        if not keys:
            return value
        from cryptography.fernet import Fernet  # only when a key is set: 20 ms of every start otherwise

        for key in keys:
            try:
                Fernet(key)
            except ValueError:
                raise ValueError("must be Fernet keys, comma-separated; make one with python -c \"from "
                                 "cryptography.fernet import Fernet; print(Fernet.generate_key().decode())\"") from None
        return value

    @field_validator("database_url")
    @classmethod
    def _database_url(cls, value: str) -> str:
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        try:
            make_url(value)
        except ArgumentError as exc:
            raise ValueError("must be an SQLAlchemy URL such as sqlite:///data/deepthread.db") from exc
        return value

    @property
    def fast_model(self) -> str | None:
        return self.llm_fast_model or self.llm_model

    def secret(self, name: str) -> str | None:
        """The plain value of a secret setting, or None when unset or blank."""
        value = getattr(self, name)
        if value is None:
            return None
        plain = value.get_secret_value()
        return plain or None


def describe_validation_error(error: ValidationError) -> str:
    """One line naming the first invalid variable and why, without echoing its value."""
    first = error.errors()[0]
    variable = str(first["loc"][0]).upper() if first["loc"] else "settings"
    message = first["msg"].removeprefix("Value error, ")
    return f"Invalid setting {variable}: {message}"


def load_settings(**overrides: Any) -> Settings:
    """Read and validate the settings; raises SettingsError with one line naming the variable."""
    try:
        return Settings(**overrides)
    except ValidationError as error:
        raise SettingsError(describe_validation_error(error)) from None


def setting_default(name: str) -> Any:
    """A setting's default value, for code that keeps one beside it (a class's own default), so there is one."""
    return Settings.model_fields[name].get_default(call_default_factory=True)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once."""
    return load_settings()
