"""The engine's data: what search returns, what fetching and extraction produce, and passages."""

from __future__ import annotations

import datetime as dt
from typing import Literal

from pydantic import BaseModel, Field

ProviderName = Literal["tavily", "brave", "exa", "searxng", "firecrawl", "duckduckgo"]
PROVIDER_ORDER: tuple[ProviderName, ...] = ("tavily", "brave", "exa", "searxng", "firecrawl", "duckduckgo")


class SearchQuery(BaseModel):
    """One query as the router hands it to a provider."""

    text: str
    max_results: int = 8
    preferred_domains: list[str] = Field(default_factory=list)
    blocked_domains: list[str] = Field(default_factory=list)
    since: dt.date | None = None


class SearchResult(BaseModel):
    """A search hit normalised across providers; `id` (`sN`) is assigned by the run."""

    id: str = ""
    provider: str
    title: str
    url: str
    snippet: str = ""
    published: dt.date | None = None
    score: float | None = None
    extra_snippets: list[str] = Field(default_factory=list)
    # The page's text when the provider sent it (Firecrawl's Markdown): read instead of fetched; never stored.
    content: str | None = Field(default=None, repr=False, exclude=True)


FetchStatus = Literal["ok", "refused", "failed", "skipped"]


class FetchResult(BaseModel):
    """The recorded outcome of fetching one URL; never an exception."""

    url: str
    final_url: str | None = None
    status: FetchStatus
    reason: str | None = None
    http_status: int | None = None
    content_type: str | None = None
    body: bytes = Field(default=b"", repr=False)
    bytes_read: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"


DocumentKind = Literal["html", "pdf", "text", "snippet"]


class Document(BaseModel):
    """Main text extracted from a fetched page (or a search snippet standing in for one)."""

    url: str
    kind: DocumentKind
    text: str
    title: str | None = None
    author: str | None = None
    published: str | None = None
    # SHA-256 (hex) of the whole text read, before it is defused and cut into passages; None for a snippet.
    checksum: str | None = None


class Passage(BaseModel):
    """A sentence-aligned chunk of a source's text with a run-stable id `pN`."""

    id: str
    source_id: str
    text: str
    start: int
    end: int
    is_snippet: bool = False
    page: int | None = None  # for a shared PDF: the page the passage starts on


class ModelUsage(BaseModel):
    """Running totals for one model."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    estimated_calls: int = 0
