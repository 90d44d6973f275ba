"""The engine's wall time against its critical path, with fixed fake latencies, concurrent and sequential.

Fakes on 127.0.0.1: an LLM answering in 800 ms, a search API in 300 ms, and 12 pages on 6 host
names answering in 100–1500 ms (each host's robots.txt in 100 ms). A sequential step is one phase occurrence
(from `phase_started` to `phase_done`); each call a fake recorded is attributed to the step during
which it started, and the step costs its longest call, where a page's call includes the robots.txt
fetch of its host that preceded it in the same step (a page cannot start before its host's
robots.txt has answered). Steps with no call cost nothing: their CPU work counts as overhead.
The critical path is the sum of the step costs; `ratio` is the wall time divided by it.

The sequential baseline is the same run with every concurrency bound set to 1 (fetcher overall and
per host, search router); its `sequential_ratio` is its wall time over its own critical path.

The one-host variant puts the same 12 pages (same latencies) on one host name, where the per-host bound
(`FETCH_MAX_PER_HOST`, 6) rather than the overall one decides; `one_host_ratio` is its ratio, and
`one_host_fetch_rounds` its first fetch step's wall time over the slowest page (with robots.txt) in it:
1.0 means every page was in flight at once, 2.0 two full rounds of page latency. `six_pages_one_host_rounds`
is the same figure for the fetcher alone taking 6 pages of 1 s from one host (robots.txt 100 ms first).

    .venv/bin/python bench/engine.py

`--world peer` is the world in which deepthread was raced against GPT Researcher 0.16.1: each model call
answers in 1.5 s, each search in 0.5 s, each page in 1.0 s (robots.txt at once), 6 pages, every one found by
every search; once with every page on one host and once on six hosts. The model answers two calls at once
(LLM_PARALLEL_REQUESTS=true, as a cloud API does). It prints, last, `peer_engine_s_one_host=` and
`peer_engine_s_six_hosts=` (from the engine's first step to its report, median of 5), `peer_cli_s=` (a whole
`deepthread research` process in the six-host world, from its start to its exit, a fresh SQLite database
included, median of 5) and `critical_path_s=` (the six-host run's, as above).

    .venv/bin/python bench/engine.py --world peer
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, Literal

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pydantic import BaseModel  # noqa: E402

from research import engine  # noqa: E402
from research.cpu import cpu_pool  # noqa: E402
from research.budget import ResearchOptions  # noqa: E402
from research.events import PhaseDone, PhaseStarted  # noqa: E402
from research.fetch import FetchConfig, SafeFetcher, build_fetch_client  # noqa: E402
from research.llm import LLMClient  # noqa: E402
from research.report import Report  # noqa: E402
from tests.fakes.corpus import HOSTS, QUESTION, Corpus, options  # noqa: E402
from tests.fakes.server import RecordedRequest  # noqa: E402
from tests.fakes.web import FakeWeb, Page, article_html  # noqa: E402

LLM_SECONDS = 0.8
SEARCH_SECONDS = 0.3
PAGES_PER_HOST = 2
FASTEST_PAGE_SECONDS = 0.1
SLOWEST_PAGE_SECONDS = 1.5
ROBOTS_SECONDS = 0.1
ROBOTS_TXT = "User-agent: *\nDisallow: /private/\n"

PEER_LLM_SECONDS = 1.5
PEER_SEARCH_SECONDS = 0.5
PEER_PAGE_SECONDS = 1.0
PEER_PAGES = 6
PEER_REPEATS = 5

CallKind = Literal["llm", "search", "robots", "page"]


class Call(BaseModel):
    """One request a fake served, with when it started and finished (monotonic seconds)."""

    kind: CallKind
    host: str
    path: str
    started: float
    finished: float

    @property
    def seconds(self) -> float:
        return self.finished - self.started


class Step(BaseModel):
    """One phase occurrence and the calls that started during it."""

    phase: str
    started: float
    finished: float
    calls: list[Call] = []

    @property
    def seconds(self) -> float:
        return self.finished - self.started

    @property
    def cost(self) -> float:
        """The longest call of the step, a page counted together with its host's robots.txt fetched before it."""
        robots = {call.host: call.seconds for call in self.calls if call.kind == "robots"}
        costs = [call.seconds + (robots.get(call.host, 0.0) if call.kind == "page" else 0.0) for call in self.calls]
        return max(costs, default=0.0)


class RunFigures(BaseModel):
    """One measured run: its steps, wall time and critical path."""

    label: str
    steps: list[Step]
    wall_seconds: float
    unattributed_calls: int
    report_complete: bool

    @property
    def critical_path_seconds(self) -> float:
        return sum(step.cost for step in self.steps)

    @property
    def ratio(self) -> float:
        return self.wall_seconds / self.critical_path_seconds

    @property
    def fetch_rounds(self) -> float:
        """The first fetch step's wall time over its costliest page (with its host's robots.txt): rounds of page latency."""
        fetch = next(step for step in self.steps if step.phase == "fetch")
        return fetch.seconds / fetch.cost


ONE_HOST = ("alpha.example",)


def page_latencies(hosts: tuple[str, ...] = HOSTS, pages_per_host: int = PAGES_PER_HOST) -> dict[str, float]:
    """Page URL (without port) → latency, spread evenly from the fastest to the slowest, interleaved across hosts."""
    urls = [f"http://{host}{'/zorblax' if index == 0 else f'/zorblax-{index + 1}'}"
            for index in range(pages_per_host) for host in hosts]
    step = (SLOWEST_PAGE_SECONDS - FASTEST_PAGE_SECONDS) / (len(urls) - 1)
    return {url: round(FASTEST_PAGE_SECONDS + number * step, 3) for number, url in enumerate(urls)}


def recorded_calls(corpus: Corpus) -> list[Call]:
    """Every request the three fakes served, as calls."""

    def call(kind: CallKind, request: RecordedRequest) -> Call:
        assert request.finished_at is not None, f"{kind} request to {request.path} never finished"
        return Call(kind=kind, host=request.host, path=request.path, started=request.at, finished=request.finished_at)

    calls = [call("llm", request) for request in corpus.llm.requests.all()]
    calls += [call("search", request) for provider in ("brave", "tavily") for request in corpus.search.requests(provider)]
    calls += [call("robots" if request.path == "/robots.txt" else "page", request) for request in corpus.web.requests.all()]
    return sorted(calls, key=lambda item: item.started)


class PhaseClock:
    """The engine's event callback, timing each phase occurrence as it is reported."""

    def __init__(self) -> None:
        self.steps: list[Step] = []
        self._open: dict[str, float] = {}
        self.first_event_at: float | None = None

    async def __call__(self, event: Any) -> None:
        now = time.monotonic()
        if self.first_event_at is None:
            self.first_event_at = now
        if isinstance(event, PhaseStarted) and event.phase:
            self._open[event.phase] = now
        elif isinstance(event, PhaseDone) and event.phase:
            self.steps.append(Step(phase=event.phase, started=self._open.pop(event.phase), finished=now))


def attribute(steps: list[Step], calls: list[Call]) -> int:
    """Put each call in the step during which it started; return how many started outside every step."""
    outside = 0
    for call in calls:
        step = next((step for step in steps if step.started <= call.started < step.finished), None)
        if step is None:
            outside += 1
        else:
            step.calls.append(call)
    return outside


async def research_then_close(tools: engine.ResearchTools, budget: ResearchOptions, clock: PhaseClock) -> Report | None:
    """One research run, closing the tools' HTTP clients before the event loop ends."""
    try:
        return await engine.research(QUESTION, options=budget, tools=tools, events=clock)
    finally:
        await tools.search_http.aclose()
        await tools.llm.aclose()


def run_once(label: str, *, sequential: bool, pool: Executor | None, latencies: bool = True,
             hosts: tuple[str, ...] = HOSTS) -> RunFigures:
    """Research the corpus question once against fresh fakes (the 12 pages spread over `hosts`) and measure it."""
    pages_per_host = PAGES_PER_HOST * len(HOSTS) // len(hosts)
    corpus = Corpus(
        page_latency=page_latencies(hosts, pages_per_host) if latencies else 0.0,
        llm_latency=LLM_SECONDS if latencies else 0.0,
        search_latency=SEARCH_SECONDS if latencies else 0.0,
        pages_per_host=pages_per_host,
        hosts=hosts,
    )
    for host in hosts:
        corpus.web.add(f"http://{host}/robots.txt", Page(body=ROBOTS_TXT, content_type="text/plain",
                                                        latency=ROBOTS_SECONDS if latencies else 0.0))
    with corpus:
        # Brave's free-plan pacing (one call a second) is a provider policy, not the engine's concurrency.
        search = {"min_interval_seconds": {}, **({"concurrency": 1} if sequential else {})}
        tools = corpus.tools(**search)
        if sequential:
            tools.fetch_config = tools.fetch_config.model_copy(update={"max_concurrency": 1, "max_per_host": 1})
        tools.cpu_pool = pool
        clock = PhaseClock()
        budget = options(max_sources=len(corpus.pages), results_per_query=len(corpus.pages), max_seconds=120)
        started = time.monotonic()
        report = asyncio.run(research_then_close(tools, budget, clock))
        wall = time.monotonic() - started
    unattributed = attribute(clock.steps, recorded_calls(corpus))
    return RunFigures(label=label, steps=clock.steps, wall_seconds=wall, unattributed_calls=unattributed,
                      report_complete=report is not None and not report.partial)


def peer_corpus(hosts: tuple[str, ...]) -> Corpus:
    """The peer world: 6 pages spread over `hosts`, every search finding all of them, robots.txt answered at once."""
    corpus = Corpus(page_latency=PEER_PAGE_SECONDS, llm_latency=PEER_LLM_SECONDS, search_latency=PEER_SEARCH_SECONDS,
                    pages_per_host=PEER_PAGES // len(hosts), hosts=hosts)
    for host in hosts:
        corpus.web.add(f"http://{host}/robots.txt", Page(body=ROBOTS_TXT, content_type="text/plain", latency=0.0))
    return corpus


def run_peer(hosts: tuple[str, ...]) -> tuple[float, RunFigures]:
    """One engine run in the peer world: seconds from its first step to its report, and its figures."""
    corpus = peer_corpus(hosts)
    with corpus:
        tools = corpus.tools(providers=["tavily"], min_interval_seconds={})
        tools.llm = LLMClient(corpus.llm.config(max_retries=0, parallel_requests=True))
        clock = PhaseClock()
        budget = options(max_sources=len(corpus.pages), results_per_query=len(corpus.pages), max_seconds=120)
        started = time.monotonic()
        report = asyncio.run(research_then_close(tools, budget, clock))
        ended = time.monotonic()
    unattributed = attribute(clock.steps, recorded_calls(corpus))
    figures = RunFigures(label=f"peer world, {len(hosts)} host(s)", steps=clock.steps, wall_seconds=ended - started,
                         unattributed_calls=unattributed, report_complete=report is not None and not report.partial)
    return ended - (clock.first_event_at or started), figures


def run_peer_cli(workdir: Path) -> float:
    """Seconds for a whole `deepthread research` process in the six-host peer world (a fresh database each time)."""
    corpus = peer_corpus(HOSTS)
    with corpus, tempfile.TemporaryDirectory(dir=workdir) as data:
        environment = {name: value for name, value in os.environ.items()
                       if not name.startswith(("LLM_", "SEARCH_", "BRAVE_", "TAVILY_", "FETCH_", "DATABASE_", "REDIS_",
                                               "RESEARCH_"))}
        environment.update(corpus.environment())
        environment.pop("BRAVE_API_KEY"), environment.pop("BRAVE_BASE_URL")
        # One provider, Tavily, as in the race (Brave's plan paces its calls a second apart).
        environment.update({"SEARCH_PROVIDERS": "tavily", "TAVILY_API_KEY": corpus.search.api_keys["tavily"],
                            "TAVILY_BASE_URL": corpus.search.base_url("tavily"), "LLM_PARALLEL_REQUESTS": "true",
                            "DATABASE_URL": f"sqlite:///{data}/deepthread.db", "DATA_DIR": data,
                            "RESEARCH_MAX_SOURCES": str(PEER_PAGES)})
        started = time.monotonic()
        finished = subprocess.run([sys.executable, "-m", "bot.cli", "research", QUESTION, "--format", "json"],
                                  env=environment, cwd=data, capture_output=True, text=True, timeout=120)
        seconds = time.monotonic() - started
    assert finished.returncode == 0, finished.stderr[-2000:]
    return seconds


def peer_world() -> None:
    print(f"peer world: LLM {PEER_LLM_SECONDS:g} s a call (two at once), search {PEER_SEARCH_SECONDS:g} s, "
          f"{PEER_PAGES} pages of {PEER_PAGE_SECONDS:g} s, found by every search; median of {PEER_REPEATS}")
    run_peer(ONE_HOST)  # warm-up: first imports and first extraction are not what we measure
    engine_seconds: dict[str, list[float]] = {"one_host": [], "six_hosts": []}
    last: dict[str, RunFigures] = {}
    for _ in range(PEER_REPEATS):
        for key, hosts in (("one_host", ONE_HOST), ("six_hosts", HOSTS)):
            seconds, figures = run_peer(hosts)
            engine_seconds[key].append(seconds)
            last[key] = figures
    for figures in last.values():
        print_run(figures)
    for key, values in engine_seconds.items():
        print(f"engine, {key.replace('_', ' ')}: " + ", ".join(f"{value:.2f}" for value in values) + " s")
    with tempfile.TemporaryDirectory(prefix="deepthread-bench-peer-") as workdir:
        cli_seconds = [run_peer_cli(Path(workdir)) for _ in range(PEER_REPEATS)]
    print("deepthread research, whole process: " + ", ".join(f"{value:.2f}" for value in cli_seconds) + " s")
    print(f"peer_engine_s_one_host={statistics.median(engine_seconds['one_host']):.2f} "
          f"peer_engine_s_six_hosts={statistics.median(engine_seconds['six_hosts']):.2f} "
          f"peer_cli_s={statistics.median(cli_seconds):.2f} "
          f"critical_path_s={last['six_hosts'].critical_path_seconds:.2f}")


def fetch_rounds_on_one_host(pages: int, page_seconds: float = 1.0) -> float:
    """Wall time of the default fetcher taking `pages` pages of one host at once, in rounds of page latency (robots.txt included)."""
    host = ONE_HOST[0]
    web = FakeWeb()
    web.add(f"http://{host}/robots.txt", Page(body=ROBOTS_TXT, content_type="text/plain", latency=ROBOTS_SECONDS))
    for number in range(pages):
        web.add(f"http://{host}/page/{number}", Page(article_html(f"Page {number}", ["Text."]), latency=page_seconds))

    async def fetch_all() -> float:
        config = FetchConfig(allow_private=web.allow_list())
        async with build_fetch_client(config) as client:
            fetcher = SafeFetcher(client, web.resolver(), config)
            started = time.monotonic()
            results = await asyncio.gather(*(fetcher.fetch(web.url(f"http://{host}/page/{number}")) for number in range(pages)))
            wall = time.monotonic() - started
        assert all(result.ok for result in results), [result.reason for result in results]
        return wall

    with web:
        return asyncio.run(fetch_all()) / (page_seconds + ROBOTS_SECONDS)


def print_run(figures: RunFigures) -> None:
    """Each step's duration, calls and cost, then the run's totals."""
    print(f"\n{figures.label}")
    print(f"  {'step':<12} {'seconds':>8} {'calls':>6} {'cost':>7} {'overhead':>9}")
    for step in figures.steps:
        kinds = "+".join(sorted({call.kind for call in step.calls})) or "-"
        print(f"  {step.phase:<12} {step.seconds:8.3f} {len(step.calls):>6} {step.cost:7.3f} "
              f"{step.seconds - step.cost:9.3f}  {kinds}")
    between = figures.wall_seconds - sum(step.seconds for step in figures.steps)
    print(f"  outside steps: {between:.3f} s; calls outside steps: {figures.unattributed_calls}; "
          f"complete report: {figures.report_complete}")
    print(f"  wall {figures.wall_seconds:.3f} s, critical path {figures.critical_path_seconds:.3f} s, "
          f"ratio {figures.ratio:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", choices=("default", "peer"), default="default")
    if parser.parse_args().world == "peer":
        peer_world()
        return
    print(f"LLM {LLM_SECONDS * 1000:.0f} ms a call, search {SEARCH_SECONDS * 1000:.0f} ms, "
          f"{len(HOSTS) * PAGES_PER_HOST} pages on {len(HOSTS)} hosts at "
          f"{FASTEST_PAGE_SECONDS * 1000:.0f}-{SLOWEST_PAGE_SECONDS * 1000:.0f} ms, robots.txt {ROBOTS_SECONDS * 1000:.0f} ms")
    # Warm-up without latencies: first imports and first extraction are not what we measure.
    run_once("warm-up", sequential=False, pool=None, latencies=False)
    concurrent = run_once("concurrent, CPU work inline", sequential=False, pool=None)
    print_run(concurrent)
    pool = cpu_pool(2)
    try:
        run_once("warm-up (pool)", sequential=False, pool=pool, latencies=False)
        pooled = run_once("concurrent, CPU work in cpu_pool(2)", sequential=False, pool=pool)
    finally:
        pool.shutdown()
    print_run(pooled)
    sequential = run_once("sequential baseline (every concurrency bound 1), CPU work inline", sequential=True, pool=None)
    print_run(sequential)
    one_host = run_once(f"one host: all {len(HOSTS) * PAGES_PER_HOST} pages on {ONE_HOST[0]}, CPU work inline",
                        sequential=False, pool=None, hosts=ONE_HOST)
    print_run(one_host)
    print(f"  first fetch step: {one_host.fetch_rounds:.2f} rounds of its slowest page's latency")
    six_pages_rounds = fetch_rounds_on_one_host(6)
    print(f"\nthe fetcher alone, 6 pages of 1 s on one host: {six_pages_rounds:.2f} rounds")
    print(f"\npool: ratio={pooled.ratio:.3f} wall_s={pooled.wall_seconds:.3f} "
          f"critical_path_s={pooled.critical_path_seconds:.3f}")
    print(f"ratio={concurrent.ratio:.3f} sequential_ratio={sequential.ratio:.3f} "
          f"wall_s={concurrent.wall_seconds:.3f} critical_path_s={concurrent.critical_path_seconds:.3f} "
          f"one_host_ratio={one_host.ratio:.3f} one_host_fetch_rounds={one_host.fetch_rounds:.2f} "
          f"six_pages_one_host_rounds={six_pages_rounds:.2f}")


if __name__ == "__main__":
    main()
