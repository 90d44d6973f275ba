"""Extraction isolation in a real process pool: content bombs, a slow page and a killed child each cost one page, never the pool."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from research.cpu import CpuTaskError, CpuTaskTimedOut, CpuWorkerDied, SupervisedPool, run_cpu
from research.extract import extract_document
from research.models import FetchResult
from research.phases.read import extract_pages
from tests.fakes.bombs import pdf_bomb, table_page
from tests.integration.process_tree import status_bytes, status_field
from tests.waiting import eventually, wait_for

pytestmark = pytest.mark.integration

MIB = 1024 * 1024
MEMORY_LIMIT_BYTES = 512 * MIB
# What a child may show beyond its address-space limit: none in principle; the margin absorbs sampling.
MEMORY_MARGIN_BYTES = 64 * MIB
SMALL_TIME_LIMIT_SECONDS = 2.0
# The lifted caps of the tests where only the pool's limits stand between a bomb and the machine.
NO_HTML_CAPS = {"max_html_characters": 10**9, "max_html_elements": 10**9}
ARTICLE_SENTENCE = "The harbour bridge opened to traffic in the spring of 1932 after eight years of work."
ARTICLE = (
    "<html><head><title>Harbour bridge</title></head><body><article><h1>Harbour bridge</h1>"
    + f"<p>{ARTICLE_SENTENCE}</p>" * 3
    + "</article></body></html>"
).encode()


def report_pid_then_wait(path: str) -> None:
    """Run in a pool child: write the child's pid to `path`, then wait until killed."""
    Path(path + ".partial").write_text(str(os.getpid()))
    os.replace(path + ".partial", path)
    threading.Event().wait()


def _children() -> list[int]:
    """Pids of this process's direct children."""
    pids: list[int] = []
    for children_file in Path(f"/proc/{os.getpid()}/task").glob("*/children"):
        try:
            pids += [int(pid) for pid in children_file.read_text().split()]
        except OSError:
            continue
    return pids


def _pool_children() -> set[int]:
    """This process's children that are process-pool workers (not the resource tracker or test servers)."""
    workers = set()
    for pid in _children():
        try:
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                workers.add(pid)
        except OSError:
            continue
    return workers


def _is_gone(pid: int) -> bool:
    state = status_field(pid, "State")
    return state is None or state.startswith(("Z", "X"))


class ProcessTreeMemory:
    """Samples this process and its children: the largest pool child's peak resident size and the tree's largest total."""

    def __init__(self) -> None:
        self.largest_child_peak = 0
        self.largest_tree_total = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> ProcessTreeMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while True:
            children = _children()
            # VmHWM is a child's own high-water mark, so a spike between two samples is not missed.
            peaks = [status_bytes(pid, "VmHWM") for pid in _pool_children()]
            self.largest_child_peak = max([self.largest_child_peak, *peaks])
            total = status_bytes(os.getpid(), "VmRSS") + sum(status_bytes(pid, "VmRSS") for pid in children)
            self.largest_tree_total = max(self.largest_tree_total, total)
            if self._stop.wait(0.02):
                return


def _fetched(url: str, body: bytes, content_type: str) -> FetchResult:
    return FetchResult(url=url, status="ok", content_type=content_type, body=body, bytes_read=len(body))


@pytest.fixture
def pool() -> Iterator[SupervisedPool]:
    supervised = SupervisedPool(1, task_timeout_seconds=SMALL_TIME_LIMIT_SECONDS, memory_limit_bytes=MEMORY_LIMIT_BYTES)
    yield supervised
    supervised.shutdown(wait=True)


@pytest.fixture
def memory_bound_pool() -> Iterator[SupervisedPool]:
    """A pool whose time limit is far off, so the memory limit is what stops a bomb."""
    supervised = SupervisedPool(1, task_timeout_seconds=120.0, memory_limit_bytes=MEMORY_LIMIT_BYTES)
    yield supervised
    supervised.shutdown(wait=True)


async def _article_is_read(pool: SupervisedPool) -> bool:
    document = await run_cpu(extract_document, "https://example.org/bridge", ARTICLE, "text/html", pool=pool)
    return document is not None and ARTICLE_SENTENCE in document.text


async def test_pdf_bomb_costs_its_page_and_the_pages_beside_it_are_read() -> None:
    pool = SupervisedPool(2, task_timeout_seconds=15.0, memory_limit_bytes=MEMORY_LIMIT_BYTES)
    bomb = pdf_bomb(200 * MIB)
    try:
        with ProcessTreeMemory() as memory:
            tree_before = status_bytes(os.getpid(), "VmRSS")
            documents = await extract_pages(
                [("s1", _fetched("https://example.org/bomb.pdf", bomb, "application/pdf")),
                 ("s2", _fetched("https://example.org/bridge", ARTICLE, "text/html"))],
                cpu_pool=pool,
            )
    finally:
        pool.shutdown(wait=True)
    assert set(documents) == {"s2"}
    assert memory.largest_child_peak < MEMORY_LIMIT_BYTES
    assert memory.largest_tree_total < tree_before + 2 * MEMORY_LIMIT_BYTES


async def test_pdf_inflation_past_the_content_cap_is_stopped_by_the_memory_limit(memory_bound_pool: SupervisedPool) -> None:
    bomb = pdf_bomb(200 * MIB)
    with ProcessTreeMemory() as memory, pytest.raises(CpuWorkerDied):
        # pdfium aborts when an allocation fails: the child dies and the page is lost.
        await run_cpu(extract_document, "https://example.org/bomb.pdf", bomb, "application/pdf",
                      pool=memory_bound_pool, max_pdf_page_content_bytes=None)
    assert memory.largest_child_peak < MEMORY_LIMIT_BYTES + MEMORY_MARGIN_BYTES
    assert await _article_is_read(memory_bound_pool)


async def test_html_table_bomb_is_read_within_the_caps_and_memory_stays_bounded() -> None:
    pool = SupervisedPool(1, task_timeout_seconds=30.0, memory_limit_bytes=MEMORY_LIMIT_BYTES)
    bomb = table_page(20 * MIB)
    try:
        with ProcessTreeMemory() as memory:
            documents = await extract_pages([("s1", _fetched("https://example.org/table", bomb, "text/html"))], cpu_pool=pool)
        assert await _article_is_read(pool)
    finally:
        pool.shutdown(wait=True)
    assert documents["s1"].text.startswith("cell\ncell")
    assert memory.largest_child_peak < MEMORY_LIMIT_BYTES


async def test_html_table_bomb_without_caps_is_stopped_by_the_memory_limit(memory_bound_pool: SupervisedPool) -> None:
    bomb = table_page(20 * MIB)
    with ProcessTreeMemory() as memory, pytest.raises((MemoryError, CpuTaskError)):
        await run_cpu(extract_document, "https://example.org/table", bomb, "text/html", pool=memory_bound_pool, **NO_HTML_CAPS)
    assert memory.largest_child_peak < MEMORY_LIMIT_BYTES + MEMORY_MARGIN_BYTES
    assert await _article_is_read(memory_bound_pool)


async def test_slow_page_is_cut_off_at_the_time_limit_and_its_process_killed(pool: SupervisedPool) -> None:
    others = _pool_children()
    assert await _article_is_read(pool)  # the pool's one child is up
    children = _pool_children() - others
    assert len(children) == 1
    slow_page = table_page(2 * MIB)  # about ten seconds of trafilatura without the element cap
    with pytest.raises(CpuTaskTimedOut):
        await run_cpu(extract_document, "https://example.org/slow", slow_page, "text/html", pool=pool, **NO_HTML_CAPS)
    wait_for(lambda: all(_is_gone(pid) for pid in children), f"the killed child {sorted(children)} to exit", 15.0,
             interval=0.05)
    assert await _article_is_read(pool)


async def test_page_waiting_behind_a_page_that_times_out_is_read_on_the_fresh_pool(pool: SupervisedPool) -> None:
    slow_page = table_page(2 * MIB)
    slow = asyncio.ensure_future(
        run_cpu(extract_document, "https://example.org/slow", slow_page, "text/html", pool=pool, **NO_HTML_CAPS))
    waiting = asyncio.ensure_future(run_cpu(extract_document, "https://example.org/bridge", ARTICLE, "text/html", pool=pool))
    with pytest.raises(CpuTaskTimedOut):
        await slow
    document = await waiting
    assert document is not None and ARTICLE_SENTENCE in document.text


async def test_child_killed_mid_task_fails_that_task_and_the_next_extraction_succeeds(tmp_path: Path) -> None:
    pool = SupervisedPool(1, task_timeout_seconds=120.0, memory_limit_bytes=MEMORY_LIMIT_BYTES)
    pid_file = tmp_path / "pid"
    try:
        running = asyncio.ensure_future(run_cpu(report_pid_then_wait, str(pid_file), pool=pool))
        await eventually(lambda: pid_file.exists() or running.done(), "the pool child's pid", 30, interval=0.02)
        os.kill(int(pid_file.read_text()), signal.SIGKILL)  # as the OOM killer would
        with pytest.raises(CpuWorkerDied):
            await running
        assert await _article_is_read(pool)
    finally:
        pool.shutdown(wait=True)


def test_a_pool_recycling_its_processes_runs_every_task_of_a_backlog() -> None:
    # ProcessPoolExecutor's own max_tasks_per_child deadlocks on such a backlog (CPython gh-115634).
    recycling = SupervisedPool(1, task_timeout_seconds=None, memory_limit_bytes=None, tasks_per_worker=2)
    try:
        backlog = [recycling.submit(os.getpid) for _ in range(10)]
        pids = [future.result(timeout=60) for future in backlog]
    finally:
        recycling.shutdown(wait=False, cancel_futures=True)  # a hung pool must fail the test, not hang it
    assert len(pids) == 10
    assert len(set(pids)) >= 4  # fresh processes took over every two tasks or so


@pytest.mark.parametrize("warmed", [True, False])
def test_a_warmed_pool_has_imported_the_readers_before_its_first_task(warmed: bool) -> None:
    # A run's first pages used to wait for the pool's processes to spawn and import trafilatura.
    from research.readers import load_readers
    from tests.cpu_probe import has_imported  # imports nothing but sys, so a cold process has no readers

    pool = SupervisedPool(1, task_timeout_seconds=None)
    try:
        if warmed:
            for future in pool.warm(load_readers):
                future.result(timeout=60)
        assert pool.submit(has_imported, "trafilatura").result(timeout=60) is warmed
    finally:
        pool.shutdown()


def test_stopping_a_pool_now_ends_its_processes_without_waiting_for_their_work(tmp_path: Path) -> None:
    """`stop_now` (the terminal's exit, its report printed): a task still running in a child is not waited for, the
    children are gone when it returns, the task fails as its process died, and nothing new starts."""
    pool = SupervisedPool(2, task_timeout_seconds=None)
    marker = tmp_path / "pid"
    stuck = pool.submit(report_pid_then_wait, str(marker))
    wait_for(marker.exists, "the task to start in a child", 60)
    children = _pool_children()
    assert int(marker.read_text()) in children

    pool.stop_now()

    assert not any(Path(f"/proc/{pid}").exists() and status_field(pid, "State") not in (None, "Z (zombie)")
                   for pid in children)
    with pytest.raises(CpuWorkerDied):
        stuck.result(timeout=60)
    with pytest.raises(RuntimeError):
        pool.submit(len, "x")
    wait_for(lambda: not _pool_children(), "the pool's processes to be reaped", 30)
