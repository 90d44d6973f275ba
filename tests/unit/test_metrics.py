"""Metrics: engine events in, Prometheus samples out (read back through prometheus_client's parser), and the hooks
in the runner, the status editor and the Discord messenger."""

from __future__ import annotations

import asyncio
import datetime as dt

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.orm import Session, sessionmaker

from chat.discord.messenger import DiscordMessenger
from chat.message import Content, Place
from chat.state import RunProgress, initial_progress
from ops.metrics import Metrics, StatusEdit, fetch_reason_label
from research.budget import ResearchOptions
from research.engine import ResearchTools
from research.events import LLMUsage, PhaseDone, ProviderCall, ProviderError, ProviderResult, Warning_
from research.fetch import FetchConfig, SafeFetcher, build_fetch_client
from research.llm import LLMClient
from research.models import FetchResult
from research.providers import SearchConfig
from storage.models import Conversation, Run
from storage.vocabulary import RunOptions
from tests.fakes.clock import FakeClock
from tests.fakes.discord_api import FakeDiscord
from tests.fakes.llm import FakeLLM, default_research_model
from tests.fakes.resolver import DictResolver
from worker.progress import InMemoryEditBucket, StatusEditor
from tests.attempts import execute_stored
from worker.runner import RunnerServices

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


class ManualClock:
    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


def scraped(registry: CollectorRegistry) -> Samples:
    """Every sample of the registry as Prometheus would scrape it, parsed back by prometheus_client's parser."""
    text = generate_latest(registry).decode()
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


@pytest.fixture
def metrics() -> Metrics:
    return Metrics(CollectorRegistry())


def test_events_of_a_run_become_samples_by_phase_provider_model_and_step(metrics: Metrics) -> None:
    clock = ManualClock()
    observer = metrics.run_started(mode="research", clock=clock)
    for event in (
        PhaseDone(phase="search", seconds=2.5),
        ProviderCall(provider="tavily", query="q"),
        ProviderResult(provider="tavily", query="q", results=5, seconds=0.3),
        ProviderError(provider="brave", query="q", reason="HTTP 500"),
        ProviderError(provider="exa", reason="circuit open", skipped=True),
        LLMUsage(model="gpt-test", prompt_tokens=1200, completion_tokens=300, cost=0.02, step="synthesize"),
        LLMUsage(model="gpt-test", prompt_tokens=100, completion_tokens=20, cost=0.001, step="decompose"),
        Warning_(phase="fetch", message="Skipped a page"),
    ):
        observer.saw(event)
    samples = scraped(metrics.registry)
    assert value(samples, "deepthread_phase_duration_seconds_count", phase="search") == 1
    assert value(samples, "deepthread_phase_duration_seconds_sum", phase="search") == 2.5
    assert value(samples, "deepthread_provider_calls_total", provider="tavily") == 1
    assert value(samples, "deepthread_provider_latency_seconds_bucket", provider="tavily", le="0.5") == 1
    assert value(samples, "deepthread_provider_errors_total", provider="brave", kind="failed") == 1
    assert value(samples, "deepthread_provider_errors_total", provider="exa", kind="skipped") == 1
    assert value(samples, "deepthread_llm_calls_total", model="gpt-test", step="synthesize") == 1
    assert value(samples, "deepthread_llm_tokens_total", model="gpt-test", step="synthesize", kind="prompt") == 1200
    assert value(samples, "deepthread_llm_tokens_total", model="gpt-test", step="decompose", kind="completion") == 20
    assert value(samples, "deepthread_llm_cost_dollars_total", model="gpt-test") == pytest.approx(0.021)
    assert value(samples, "deepthread_runs_total", mode="research", state="done") is None


def test_a_finished_run_is_counted_by_mode_and_state_with_its_duration_and_pages(metrics: Metrics) -> None:
    clock = ManualClock()
    observer = metrics.run_started(mode="research", clock=clock)
    clock.now += 42.0
    observer.finished("done", pages=[
        FetchResult(url="https://a.example/", status="ok"),
        FetchResult(url="https://b.example/", status="ok"),
        FetchResult(url="http://10.0.0.1/", status="refused", reason="private address"),
        FetchResult(url="https://c.example/x", status="skipped", reason="robots.txt disallows /x"),
    ])
    metrics.run_started(mode="chat", clock=clock).finished("failed")
    samples = scraped(metrics.registry)
    assert value(samples, "deepthread_runs_total", mode="research", state="done") == 1
    assert value(samples, "deepthread_runs_total", mode="chat", state="failed") == 1
    assert value(samples, "deepthread_run_duration_seconds_sum", mode="research", state="done") == 42.0
    assert value(samples, "deepthread_pages_fetched_total") == 2
    assert value(samples, "deepthread_pages_refused_total", status="refused", reason="private_address") == 1
    assert value(samples, "deepthread_pages_refused_total", status="skipped", reason="robots") == 1


def test_queue_wait_is_recorded_on_the_first_attempt_only(metrics: Metrics) -> None:
    created = dt.datetime(2025, 1, 1, 12, 0, 0)
    metrics.run_started(mode="research", created_at=created, started_at=created + dt.timedelta(seconds=7))
    metrics.run_started(mode="research", created_at=created, started_at=created + dt.timedelta(seconds=900),
                        first_attempt=False)
    samples = scraped(metrics.registry)
    assert value(samples, "deepthread_queue_wait_seconds_count", mode="research") == 1
    assert value(samples, "deepthread_queue_wait_seconds_sum", mode="research") == 7.0


async def test_the_fetchers_own_refusal_reasons_get_their_labels() -> None:
    config = FetchConfig(respect_robots=False, blocked_domains=("blocked.example",))
    resolver = DictResolver({"private.example": ["10.1.2.3"], "closed.example": ["127.0.0.1"]})
    async with build_fetch_client(config) as client:
        fetcher = SafeFetcher(client, resolver, config)
        outcomes = {url: await fetcher.fetch(url) for url in (
            "ftp://files.example/a", "http://user@site.example/", "http://blocked.example/", "http://localhost/",
            "http://private.example/", "http://10.0.0.7/", "http://unknown-name.example/",
        )}
    labels = {url: fetch_reason_label(result.reason) for url, result in outcomes.items()}
    assert labels == {
        "ftp://files.example/a": "bad_url", "http://user@site.example/": "bad_url",
        "http://blocked.example/": "blocked_domain", "http://localhost/": "private_address",
        "http://private.example/": "private_address", "http://10.0.0.7/": "private_address",
        "http://unknown-name.example/": "dns",
    }, {url: result.reason for url, result in outcomes.items()}


@pytest.mark.parametrize(("reason", "label"), [
    ("robots.txt disallows /private", "robots"),
    ("fetch budget spent", "budget"),
    ("HTTP 503", "http_error"),
    ("timed out after 15 s", "timeout"),
    ("network timeout (ReadTimeout)", "timeout"),
    ("connection failed (ConnectError)", "network"),
    ("server broke the HTTP protocol (RemoteProtocolError)", "network"),
    ("content type image/png not accepted", "content_type"),
    ("body over 5 MiB cap", "too_large"),
    ("decompressed body over 20 MiB cap", "too_large"),
    ("body could not be decompressed (gzip)", "bad_body"),
    ("more than 5 redirects", "redirects"),
    ("private address (after redirect to http://10.0.0.1/)", "private_address"),
    ("resolver gave no usable address for odd.example", "dns"),
    ("robots.txt crawl delay of 30 s, so this page's turn would come after its 20 s deadline", "host_slowed"),
    ("something new", "other"),
    (None, "other"),
])
def test_each_kind_of_fetch_reason_has_a_short_label(reason: str | None, label: str) -> None:
    assert fetch_reason_label(reason) == label


# --- the hooks ------------------------------------------------------------------------------------------------------

def test_a_run_executed_by_the_runner_is_counted_with_its_model_calls_by_step(
        session_factory: sessionmaker[Session], metrics: Metrics) -> None:
    with session_factory.begin() as session:
        conversation = Conversation(platform="cli", workspace="local", channel="terminal", thread="t1",
                                    created_by="cli:me")
        run = Run(conversation=conversation, workspace="local", mode="chat", question="What makes tides?",
                  options=RunOptions(), requested_by="cli:me")
        session.add(run)
        session.flush()
        run_id = run.id
    model = FakeLLM(default_research_model)
    nowhere = httpx.AsyncClient(transport=httpx.MockTransport(lambda request: httpx.Response(404)))
    tools = ResearchTools(llm=LLMClient(model.config(), http_client=model.http_client()), search_config=SearchConfig(),
                          search_http=nowhere, resolver=DictResolver({}))
    services = RunnerServices(sessions=session_factory, tools=tools, options=ResearchOptions(), metrics=metrics)

    final = asyncio.run(execute_stored(run_id, services))

    assert final is not None and final.state == "done"
    samples = scraped(metrics.registry)
    assert value(samples, "deepthread_runs_total", mode="chat", state="done") == 1
    assert value(samples, "deepthread_queue_wait_seconds_count", mode="chat") == 1
    llm_calls = {dict(labels)["step"]: count for (name, labels), count in samples.items()
                 if name == "deepthread_llm_calls_total"}
    assert sum(llm_calls.values()) == len(model.chat_requests) >= 1 and "unknown" not in llm_calls


async def test_the_status_editor_counts_edits_sent_failed_and_refused_by_the_budget(metrics: Metrics) -> None:
    clock = FakeClock()
    sent: list[float] = []
    failures_left = [RuntimeError("the platform said no")]

    async def send(progress: RunProgress) -> None:
        if failures_left:
            raise failures_left.pop()
        sent.append(progress.percent)

    editor = StatusEditor(send, bucket=InMemoryEditBucket(capacity=4, clock=clock), workspace="T1", clock=clock,
                          sleep=clock.sleep, count_edit=metrics.record_status_edit)
    progress = initial_progress(run_id=1, mode="research", question="q", requested_by="cli:me", state="running")
    for percent in range(1, 8):  # more ordinary edits than the budget allows
        await editor.update(progress.model_copy(update={"percent": float(percent)}), wait_seconds=5)
    await editor.close(progress.model_copy(update={"state": "done", "percent": 100.0}))
    samples = scraped(metrics.registry)
    assert sent[-1] == 100.0
    assert value(samples, "deepthread_status_edits_total", outcome=StatusEdit.FAILED.value) == 1
    assert value(samples, "deepthread_status_edits_total", outcome=StatusEdit.SENT.value) == len(sent)
    assert (value(samples, "deepthread_status_edits_total", outcome=StatusEdit.SKIPPED.value) or 0) >= 1


async def test_discord_rate_limit_waits_are_counted_with_their_length(metrics: Metrics) -> None:
    clock = FakeClock()
    discord = FakeDiscord(clock=clock)
    async with discord.client() as http:
        messenger = DiscordMessenger(http, sleep=clock.sleep, clock=clock,
                                     count_rate_limit_wait=metrics.record_rate_limit_wait)
        discord.fail_next("POST", r"^/channels/\d+/messages$", status=429, retry_after=2.5, times=2)
        place = Place(platform="discord", workspace=str(discord.guild_id), channel=str(discord.channel_id))
        await messenger.post(place, Content(text="status"))
    samples = scraped(metrics.registry)
    assert value(samples, "deepthread_platform_rate_limit_waits_total", platform="discord") == 2
    assert value(samples, "deepthread_platform_rate_limit_wait_seconds_total", platform="discord") == 5.0
