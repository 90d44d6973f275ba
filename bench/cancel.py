"""How soon the engine stops: after a cancel during the fetch, after a cancel while the report is written, and at its time budget.

The engine runs against the loopback fakes of `tests/fakes/corpus.py` (LLM, Brave, six hosts of pages).

- **cancel during fetch**: every page and robots.txt answers in 5 s; the token is cancelled as soon as the
  first request reaches the fake web. Latency is from `CancelToken.cancel()` to the `aborted` event.
- **cancel while writing**: the report's model call answers in 10 s; the token is cancelled as soon as that
  call reaches the fake LLM. Same latency.
- **time budget**: `max_seconds` of 2 s (1.4 s of gathering, 0.6 s kept for writing) with pages answering
  in 3 s. Figures are the run's wall time and its overshoot past `max_seconds`.

The targets: a run stops within about 2 s of a cancel (ARCHITECTURE: the cancel token is checked during steps
and cancels requests in flight), and a run that hits its time budget ends near `max_seconds`.
Each kind is measured `--trials` times on one set of fakes; one uncancelled run warms up first.

    .venv/bin/python bench/cancel.py [--trials 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from research import engine  # noqa: E402
from research.budget import CancelToken  # noqa: E402
from research.events import Aborted, Complete  # noqa: E402
from tests.fakes.corpus import QUESTION, Corpus, options  # noqa: E402
from tests.fakes.llm import ChatRequest, FakeReply, default_research_model  # noqa: E402

PAGE_SECONDS_WHEN_CANCELLING = 5.0
WRITING_SECONDS = 10.0
BUDGET_SECONDS = 2.0
PAGE_SECONDS_OVER_BUDGET = 3.0
POLL_SECONDS = 0.005


class TerminalTimer:
    """The engine's event callback: notes when the terminal event arrived."""

    def __init__(self) -> None:
        self.terminal: Any = None
        self.terminal_at: float | None = None

    async def __call__(self, event: Any) -> None:
        if isinstance(event, (Aborted, Complete)):
            self.terminal, self.terminal_at = event, time.monotonic()


async def research_then_close(tools: engine.ResearchTools, **run: Any) -> None:
    """One research run, closing the tools' HTTP clients before the event loop ends."""
    try:
        await engine.research(QUESTION, tools=tools, **run)
    finally:
        await tools.search_http.aclose()
        await tools.llm.aclose()


async def cancel_when(reached: Any, cancel: CancelToken) -> float:
    """Cancel the token as soon as `reached()` holds; return when."""
    while not reached():
        await asyncio.sleep(POLL_SECONDS)
    cancelled_at = time.monotonic()
    cancel.cancel("bench")
    return cancelled_at


def cancel_latency(corpus: Corpus, reached: Any) -> float:
    """Seconds from the cancel (once `reached()` holds) to the aborted event, for one run."""
    timer, cancel = TerminalTimer(), CancelToken()

    async def run() -> float:
        canceller = asyncio.create_task(cancel_when(reached, cancel))
        await research_then_close(corpus.tools(), options=options(), events=timer, cancel=cancel)
        return await canceller

    cancelled_at = asyncio.run(run())
    assert isinstance(timer.terminal, Aborted), f"the run ended with {timer.terminal!r}, not aborted"
    return timer.terminal_at - cancelled_at


def cancels_during_fetch(trials: int) -> list[float]:
    with Corpus(page_latency=PAGE_SECONDS_WHEN_CANCELLING) as corpus:
        latencies = []
        for _ in range(trials):
            already = len(corpus.web.requests)
            latencies.append(cancel_latency(corpus, lambda: len(corpus.web.requests) > already))
        return latencies


def cancels_while_writing(trials: int) -> list[float]:
    writing = threading.Event()

    def slow_report(request: ChatRequest) -> Any:
        if request.schema_name is None and "untrusted_source" in request.text and "Follow-up" not in request.text:
            writing.set()
            return FakeReply(content="Too late.", delay=WRITING_SECONDS)
        return default_research_model(request)

    with Corpus(llm_handler=slow_report) as corpus:
        latencies = []
        for _ in range(trials):
            writing.clear()
            latencies.append(cancel_latency(corpus, writing.is_set))
        return latencies


def runs_over_budget(trials: int) -> list[float]:
    """Wall seconds of runs whose pages answer only after the budget's gathering time."""
    with Corpus(page_latency=PAGE_SECONDS_OVER_BUDGET) as corpus:
        walls = []
        for _ in range(trials):
            timer = TerminalTimer()
            started = time.monotonic()
            asyncio.run(research_then_close(corpus.tools(), options=options(max_seconds=BUDGET_SECONDS), events=timer))
            walls.append(time.monotonic() - started)
            assert isinstance(timer.terminal, Complete) and timer.terminal.partial, f"not a partial report: {timer.terminal!r}"
        return walls


def describe(label: str, seconds: list[float]) -> None:
    print(f"{label}: median {statistics.median(seconds) * 1000:.1f} ms, max {max(seconds) * 1000:.1f} ms "
          f"({', '.join(f'{value * 1000:.1f}' for value in seconds)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    trials = parser.parse_args().trials

    with Corpus() as corpus:  # warm-up: first imports, first extraction
        asyncio.run(research_then_close(corpus.tools(), options=options(), events=TerminalTimer()))

    during_fetch = cancels_during_fetch(trials)
    describe("cancel during fetch, cancel to aborted", during_fetch)
    while_writing = cancels_while_writing(trials)
    describe("cancel while writing, cancel to aborted", while_writing)
    walls = runs_over_budget(trials)
    overshoot = [wall - BUDGET_SECONDS for wall in walls]
    print(f"time budget {BUDGET_SECONDS:g} s, pages in {PAGE_SECONDS_OVER_BUDGET:g} s: wall median "
          f"{statistics.median(walls):.3f} s, max {max(walls):.3f} s; overshoot max {max(overshoot):+.3f} s")
    print(f"cancel_fetch_median_ms={statistics.median(during_fetch) * 1000:.1f} "
          f"cancel_fetch_max_ms={max(during_fetch) * 1000:.1f} "
          f"cancel_writing_median_ms={statistics.median(while_writing) * 1000:.1f} "
          f"cancel_writing_max_ms={max(while_writing) * 1000:.1f} "
          f"budget_s={BUDGET_SECONDS:g} overrun_wall_max_s={max(walls):.3f}")


if __name__ == "__main__":
    main()
