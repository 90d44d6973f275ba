"""deepthread's Prometheus metrics, and the observer that turns one run's engine events into samples.

Every process keeps its own registry (the default one, with the process collectors) and serves it on
its own port: a worker is one process whose runs share it from threads (Celery's thread pool), so no
multiprocess mode is needed; workers sharing a host each get a WORKER_HTTP_PORT of their own.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable, Iterable
from enum import StrEnum

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram

from research.events import Event, LLMUsage, PhaseDone, ProviderCall, ProviderError, ProviderResult
from research.models import FetchResult

Clock = Callable[[], float]

RUN_SECONDS_BUCKETS = (5, 15, 30, 60, 120, 180, 300, 450, 600, 900, 1200, 1800)
PHASE_SECONDS_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300)
QUEUE_WAIT_SECONDS_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900, 1800, 3600)
PROVIDER_SECONDS_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30)

# The fetcher's reasons are sentences for people; a label needs a short fixed word. First match wins.
FETCH_REASON_LABELS: tuple[tuple[str, str], ...] = (
    ("page's turn", "host_slowed"),
    ("robots.txt", "robots"),
    ("budget", "budget"),
    ("could not resolve", "dns"),
    ("resolver gave", "dns"),
    ("loopback name", "private_address"),
    (" address", "private_address"),
    ("blocked domain", "blocked_domain"),
    ("content type", "content_type"),
    ("content encoding", "content_type"),
    (" cap", "too_large"),
    ("decompress", "bad_body"),
    ("timed out", "timeout"),
    ("timeout", "timeout"),
    ("protocol", "network"),
    ("connection failed", "network"),
    ("transfer failed", "network"),
    ("http ", "http_error"),
    ("redirects", "redirects"),
    ("scheme", "bad_url"),
    ("credentials in url", "bad_url"),
    ("usable host", "bad_url"),
    ("port", "bad_url"),
)
OTHER_REASON = "other"


class StatusEdit(StrEnum):
    """What became of one status edit."""

    SENT = "sent"
    FAILED = "failed"
    SKIPPED = "skipped"  # the workspace's edit budget refused it; the latest state goes out later


def fetch_reason_label(reason: str | None) -> str:
    """The short label of a fetcher's reason for not reading a page (`other` when none fits)."""
    text = (reason or "").lower()
    return next((label for fragment, label in FETCH_REASON_LABELS if fragment in text), OTHER_REASON)


def seconds_between(earlier: dt.datetime | None, later: dt.datetime | None) -> float | None:
    """`later - earlier` in seconds (naive times read as UTC, as the database stores them); None when either is missing."""
    if earlier is None or later is None:
        return None
    if earlier.tzinfo is None:
        earlier = earlier.replace(tzinfo=dt.timezone.utc)
    if later.tzinfo is None:
        later = later.replace(tzinfo=dt.timezone.utc)
    return max(0.0, (later - earlier).total_seconds())


class Metrics:
    """Every deepthread metric, registered on `registry` (tests give a fresh one; processes share `process_metrics()`)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.runs = Counter("deepthread_runs", "Runs that ended, by mode and final state.", ["mode", "state"],
                            registry=registry)
        self.run_seconds = Histogram("deepthread_run_duration_seconds", "A run attempt from its start to its stored end.",
                                     ["mode", "state"], buckets=RUN_SECONDS_BUCKETS, registry=registry)
        self.phase_seconds = Histogram("deepthread_phase_duration_seconds", "One pass through an engine phase.",
                                       ["phase"], buckets=PHASE_SECONDS_BUCKETS, registry=registry)
        self.queue_wait = Histogram("deepthread_queue_wait_seconds", "From a run's creation to its first start.",
                                    ["mode"], buckets=QUEUE_WAIT_SECONDS_BUCKETS, registry=registry)
        self.provider_calls = Counter("deepthread_provider_calls", "Search provider calls.", ["provider"],
                                      registry=registry)
        self.provider_errors = Counter("deepthread_provider_errors",
                                       "Search provider calls that failed, or were skipped (circuit open).",
                                       ["provider", "kind"], registry=registry)
        self.provider_seconds = Histogram("deepthread_provider_latency_seconds", "Search provider answers.", ["provider"],
                                          buckets=PROVIDER_SECONDS_BUCKETS, registry=registry)
        self.pages_fetched = Counter("deepthread_pages_fetched", "Pages fetched and handed to reading.",
                                     registry=registry)
        self.pages_refused = Counter("deepthread_pages_refused",
                                     "Pages not read, by the fetcher's status (refused, failed, skipped) and reason.",
                                     ["status", "reason"], registry=registry)
        self.llm_calls = Counter("deepthread_llm_calls", "Model calls, by model and engine step.", ["model", "step"],
                                 registry=registry)
        self.llm_tokens = Counter("deepthread_llm_tokens", "Model tokens, by model, engine step and kind.",
                                  ["model", "step", "kind"], registry=registry)
        self.llm_cost = Counter("deepthread_llm_cost_dollars", "Model cost at the configured prices.", ["model"],
                                registry=registry)
        self.status_edits = Counter("deepthread_status_edits", "Status-message edits, by what became of them.",
                                    ["outcome"], registry=registry)
        self.rate_limit_waits = Counter("deepthread_platform_rate_limit_waits",
                                        "Waits imposed by a chat platform's rate limits.", ["platform"], registry=registry)
        self.rate_limit_wait_seconds = Counter("deepthread_platform_rate_limit_wait_seconds",
                                               "Time spent waiting out chat platforms' rate limits.", ["platform"],
                                               registry=registry)
        self.feedback = Counter("deepthread_feedback", "👍/👎 clicks on reports and answers, by verdict (good, bad).",
                                ["verdict"], registry=registry)
        self.watch_runs = Counter("deepthread_watch_runs", "Due times of watches, by what became of them (fired: a run "
                                  "started; skipped: a quota, a cap or a busy thread refused it; failed: an error).",
                                  ["outcome"], registry=registry)

    def run_started(self, *, mode: str, created_at: dt.datetime | None = None, started_at: dt.datetime | None = None,
                    first_attempt: bool = True, clock: Clock = time.monotonic) -> RunObserver:
        """The observer of one run attempt; the first attempt records how long the run waited in the queue."""
        waited = seconds_between(created_at, started_at) if first_attempt else None
        if waited is not None:
            self.queue_wait.labels(mode=mode).observe(waited)
        return RunObserver(self, mode=mode, clock=clock)

    def record_status_edit(self, outcome: StatusEdit) -> None:
        """Count one status edit by what became of it."""
        self.status_edits.labels(outcome=outcome.value).inc()

    def record_feedback(self, verdict: str) -> None:
        """Count one 👍 ("good") or 👎 ("bad") click."""
        self.feedback.labels(verdict=verdict).inc()

    def record_rate_limit_wait(self, platform: str, seconds: float) -> None:
        """Count one wait imposed by `platform`'s rate limits, and its length."""
        self.rate_limit_waits.labels(platform=platform).inc()
        self.rate_limit_wait_seconds.labels(platform=platform).inc(max(0.0, seconds))


class RunObserver:
    """Turns one run attempt's events, and its end, into samples."""

    def __init__(self, metrics: Metrics, *, mode: str, clock: Clock = time.monotonic) -> None:
        self.metrics = metrics
        self.mode = mode
        self._clock = clock
        self._started = clock()

    def saw(self, event: Event) -> None:
        """Record what `event` tells (phases, provider calls, model usage); other events tell nothing countable."""
        metrics = self.metrics
        match event:
            case PhaseDone(phase=str(phase), seconds=seconds):
                metrics.phase_seconds.labels(phase=phase).observe(seconds)
            case ProviderCall(provider=provider):
                metrics.provider_calls.labels(provider=provider).inc()
            case ProviderResult(provider=provider, seconds=seconds):
                metrics.provider_seconds.labels(provider=provider).observe(seconds)
            case ProviderError(provider=provider, skipped=skipped):
                metrics.provider_errors.labels(provider=provider, kind="skipped" if skipped else "failed").inc()
            case LLMUsage():
                step = event.step or event.phase or "unknown"
                metrics.llm_calls.labels(model=event.model, step=step).inc()
                metrics.llm_tokens.labels(model=event.model, step=step, kind="prompt").inc(event.prompt_tokens)
                metrics.llm_tokens.labels(model=event.model, step=step, kind="completion").inc(event.completion_tokens)
                metrics.llm_cost.labels(model=event.model).inc(max(0.0, event.cost))

    def finished(self, state: str, *, pages: Iterable[FetchResult] = ()) -> None:
        """Count the run in its final `state`, its duration, and what became of each page it tried to fetch."""
        metrics = self.metrics
        metrics.runs.labels(mode=self.mode, state=state).inc()
        metrics.run_seconds.labels(mode=self.mode, state=state).observe(max(0.0, self._clock() - self._started))
        for page in pages:
            if page.ok:
                metrics.pages_fetched.inc()
            else:
                metrics.pages_refused.labels(status=page.status, reason=fetch_reason_label(page.reason)).inc()


_process_metrics: Metrics | None = None
_process_metrics_lock = threading.Lock()


def process_metrics() -> Metrics:
    """This process's metrics, on prometheus_client's default registry (made on first use)."""
    global _process_metrics
    with _process_metrics_lock:
        if _process_metrics is None:
            _process_metrics = Metrics(REGISTRY)
        return _process_metrics


def record_status_edit(outcome: StatusEdit) -> None:
    """Count one status edit in this process's metrics."""
    process_metrics().record_status_edit(outcome)


def record_rate_limit_wait(platform: str, seconds: float) -> None:
    """Count one platform rate-limit wait in this process's metrics."""
    process_metrics().record_rate_limit_wait(platform, seconds)
