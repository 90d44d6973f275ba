"""K worker processes (1 by default) running N research runs at once (50 by default): speed, memory, what went wrong.

Throughput, time to the first status edit, memory per run, and what went wrong (failed runs, reattempts,
warnings, late reports).

K real `deepthread worker --concurrency=C` processes (`--workers K`; C = `--concurrency`, by default ceil(N / K)
so that every run starts at once) (Celery's threads, each process's runs on one shared
event loop) against SQLite (WAL) in a temporary directory (or `--database postgresql`: a throwaway PostgreSQL on
127.0.0.1, as the integration tests start it), a real Redis on 127.0.0.1, the fake
Slack, and the research fakes with the fixed latencies of `bench/engine.py`: the LLM answers every
call in 800 ms, the search API in 300 ms, and 12 pages on 6 host names (2 a host) in 100 to
1500 ms; each host's robots.txt in 100 ms. Search goes to the fake Tavily, which has no
client-side pacing (Brave's one call a second, shared by every worker through Redis, would make
this a benchmark of Brave's plan).

N users in N/10 workspaces (10 each, so MAX_RUNS_PER_WORKSPACE=10 admits them all at once) each
start one run the way the bot does (a root message, a status message in its thread, a Run row,
`Queue.submit`). Warm-up runs go first (first imports, first extraction, the CPU pool's
processes spawned), K at a time until each worker process has run one (at most WARM_UP_ROUNDS rounds), and are
not counted.

- time to first edit: from `submit` (enqueue) to the fake Slack receiving the first `chat.update`
  of the run's status message;
- runs per minute: runs completed (state `done` and a report posted in the thread) divided by the
  time from the first submit to the last report message posted;
- memory per run: (peak RSS of the worker processes' trees together while the N runs run − their idle RSS after
  the warm-up) / N; RSS (and CPU time) sampled every 0.1 s with psutil. The workers' children (the
  CPU pools' processes and multiprocessing's resource trackers) are also shown apart: they are a
  fixed overhead of a worker, not a cost per run. `peak_rss_mib` is that peak of all the trees together.

The last line also counts what went wrong: `failed` (runs whose final state is not `done`, or that never ended),
`reattempts` (the sum of each run's `attempt` − 1, read from the database at the end), `warning_lines` (WARNING,
ERROR and CRITICAL lines in all the workers' logs; the distinct ones are printed with their counts),
`late_deliveries` (runs whose report reached the fake Slack more than 5 s after the run's `finished_at`, or that
ended more than 5 s before the measurement did without a report), `max_connections_errors` and
`integrity_errors` (worker log lines naming `MaxConnectionsError` / `IntegrityError`).

    .venv/bin/python bench/worker.py [--runs N] [--workers K] [--concurrency C] [--database postgresql]
                                     [--status-edits-per-minute N]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import re
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402
from pydantic import BaseModel  # noqa: E402
from sqlalchemy import select  # noqa: E402

from bench.engine import (  # noqa: E402
    FASTEST_PAGE_SECONDS, LLM_SECONDS, PAGES_PER_HOST, ROBOTS_SECONDS, ROBOTS_TXT, SEARCH_SECONDS,
    SLOWEST_PAGE_SECONDS, page_latencies,
)
from storage.models import Run  # noqa: E402
from storage.redis import connect  # noqa: E402
from storage.vocabulary import TERMINAL_STATES  # noqa: E402
from tests.fakes.corpus import HOSTS, QUESTION, Corpus  # noqa: E402
from tests.fakes.slack_api import FakeSlack  # noqa: E402
from tests.fakes.web import Page  # noqa: E402
from tests.integration.workers import Cluster  # noqa: E402
from tests.services import create_database, postgres_server, redis_server  # noqa: E402
from worker.queue import Limits, Queue  # noqa: E402

RUNS = 50
RUNS_PER_WORKSPACE = 10
SAMPLE_SECONDS = 0.1
POLL_SECONDS = 0.5
IDLE_SETTLE_SECONDS = 3.0
RUN_TIMEOUT_SECONDS = 600.0
MIB = 1024 * 1024
WORKERS = 1
WARM_UP_ROUNDS = 3
LATE_DELIVERY_SECONDS = 5.0
WARNING_LINE = re.compile(r"\b(WARNING|ERROR|CRITICAL)\b")
DISTINCT_WARNINGS_SHOWN = 25


class ProcessSample(BaseModel):
    """RSS and CPU time so far of the worker processes together and of their children (the CPU pools), at one
    moment."""

    at: float
    main_bytes: int
    children_bytes: int
    children: int
    main_cpu_seconds: float
    children_cpu_seconds: float
    machine_busy_seconds: float

    @property
    def total_bytes(self) -> int:
        return self.main_bytes + self.children_bytes


class RunTiming(BaseModel):
    """One run's moments (monotonic seconds) and how it ended."""

    run_id: int
    state: str
    attempt: int
    error: str | None
    worker_pid: int | None
    submitted: float
    started: float | None
    first_edit: float | None
    finished: float | None
    delivered: float | None

    @property
    def first_edit_seconds(self) -> float | None:
        return None if self.first_edit is None else self.first_edit - self.submitted

    @property
    def total_seconds(self) -> float | None:
        return None if self.delivered is None else self.delivered - self.submitted


def monotonic_of(moment: dt.datetime | None) -> float | None:
    """A database or event timestamp (UTC; SQLite returns it naive) on this process's monotonic clock."""
    if moment is None:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.timezone.utc)
    return moment.timestamp() - (time.time() - time.monotonic())


def describe_children(process: psutil.Process) -> str:
    """Each descendant of `process`: what it runs (the multiprocessing entry point) and its RSS."""
    described = []
    for child in descendants(process):
        try:
            command = " ".join(child.cmdline())
            rss = child.memory_info().rss
        except psutil.NoSuchProcess:
            continue
        kind = ("resource tracker" if "resource_tracker" in command
                else "CPU pool process" if "spawn_main" in command else command[:60])
        described.append(f"{kind} {mib(rss)} MiB")
    return ", ".join(described) or "none"


def descendants(process: psutil.Process) -> list[psutil.Process]:
    """The descendants of `process`, none once it has exited."""
    try:
        return process.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def sample_of(processes: list[psutil.Process]) -> ProcessSample:
    """RSS and CPU time of `processes` and their descendants together (vanished ones count 0), and the machine's busy
    CPU time; raises psutil.NoSuchProcess once every one of `processes` has exited."""
    children_bytes, children, children_cpu = 0, 0, 0.0
    main_bytes, main_cpu, alive = 0, 0.0, 0
    for process in processes:
        for child in descendants(process):
            try:
                children_bytes += child.memory_info().rss
                cpu = child.cpu_times()
                children_cpu += cpu.user + cpu.system
                children += 1
            except psutil.NoSuchProcess:
                continue
        try:
            cpu = process.cpu_times()
            main_bytes += process.memory_info().rss
            main_cpu += cpu.user + cpu.system
            alive += 1
        except psutil.NoSuchProcess:
            continue
    if not alive:
        raise psutil.NoSuchProcess(processes[0].pid)
    machine = psutil.cpu_times()
    machine_busy = machine.user + machine.nice + machine.system + machine.irq + machine.softirq
    return ProcessSample(at=time.monotonic(), main_bytes=main_bytes, children_bytes=children_bytes,
                         children=children, main_cpu_seconds=main_cpu, children_cpu_seconds=children_cpu,
                         machine_busy_seconds=machine_busy)


class ProcessSampler:
    """Samples process trees' RSS and CPU time (summed) every `interval` seconds in a thread, keeping every sample."""

    def __init__(self, pids: list[int], interval: float = SAMPLE_SECONDS) -> None:
        self.processes = [psutil.Process(pid) for pid in pids]
        self.interval = interval
        self.samples: list[ProcessSample] = []
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._sample_until_stopped, name="memory-sampler", daemon=True)

    def _sample_until_stopped(self) -> None:
        while not self._stopping.is_set():
            try:
                self.samples.append(sample_of(self.processes))
            except psutil.NoSuchProcess:
                return
            self._stopping.wait(self.interval)

    def __enter__(self) -> ProcessSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping.set()
        self._thread.join()


class TimedQueue(Queue):
    """The bot's queue, noting in `submitted` when each run was submitted (enqueued)."""

    def __init__(self, *args: Any, submitted: dict[int, float], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.submitted = submitted

    def submit(self, run_id: int) -> int | None:
        self.submitted[run_id] = time.monotonic()
        return super().submit(run_id)


class BenchCluster(Cluster):
    """The integration tests' cluster, submitting through a `TimedQueue` that fills `submitted`."""

    def __init__(self, **arguments: Any) -> None:
        super().__init__(**arguments)
        self.submitted: dict[int, float] = {}
        self.worker_of: dict[int, int] = {}  # run id -> pid of the worker process first seen holding its lease

    def queue(self) -> Queue:
        from worker.tasks import configure, send_task

        configure(self.settings)
        return TimedQueue(self.sessions, self.redis,
                          Limits(self.settings.max_runs_per_user, self.settings.max_runs_per_workspace), send_task,
                          submitted=self.submitted)


def bench_corpus() -> Corpus:
    """The research fakes of bench/engine.py: fixed LLM, search and page latencies, robots.txt on every host."""
    corpus = Corpus(page_latency=page_latencies(), llm_latency=LLM_SECONDS, search_latency=SEARCH_SECONDS,
                    pages_per_host=PAGES_PER_HOST)
    for host in HOSTS:
        corpus.web.add(f"http://{host}/robots.txt", Page(body=ROBOTS_TXT, content_type="text/plain",
                                                        latency=ROBOTS_SECONDS))
    return corpus


def thread_replies(slack: FakeSlack, status: dict[str, Any]) -> list[float]:
    """When each message after the status message was posted in its thread (the report)."""
    return [message.posted_at for message in slack.messages(status["channel"], thread_ts=status["thread"])
            if message.ts not in (status["thread"], status["message_id"])]


def run_timing(cluster: BenchCluster, slack: FakeSlack, run_id: int) -> RunTiming:
    """When run `run_id` was submitted, started, first edited, finished and posted its report, and by which worker."""
    run = cluster.run(run_id)
    status = run.status_message
    edits = slack.edits(status["channel"], status["message_id"])
    replies = thread_replies(slack, status)
    return RunTiming(run_id=run_id, state=run.state, attempt=run.attempt, error=run.error,
                     worker_pid=cluster.worker_of.get(run_id), submitted=cluster.submitted[run_id],
                     started=monotonic_of(run.started_at),
                     first_edit=edits[0].at if edits else None, finished=monotonic_of(run.finished_at),
                     delivered=max(replies) if replies and run.state in TERMINAL_STATES else None)


def owner_pid(owner: str | None) -> int | None:
    """The process id in a lease owner (`worker.leases.worker_identity`: host:pid:thread:nonce), None for a marker."""
    parts = (owner or "").split(":")
    return int(parts[1]) if len(parts) == 4 and parts[1].isdigit() else None


class OwnerWatcher:
    """Notes in `cluster.worker_of` the worker process first seen holding each run's lease, polling the leased runs
    every POLL_SECONDS in a thread (one small query) while the benchmark runs."""

    def __init__(self, cluster: BenchCluster) -> None:
        self.cluster = cluster
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._watch_until_stopped, name="owner-watcher", daemon=True)

    def poll(self) -> None:
        with self.cluster.sessions() as session:
            rows = session.execute(select(Run.id, Run.lease_owner).where(Run.state == "running")).all()
        for run_id, owner in rows:
            if (pid := owner_pid(owner)) is not None:
                self.cluster.worker_of.setdefault(run_id, pid)

    def _watch_until_stopped(self) -> None:
        while not self._stopping.wait(POLL_SECONDS):
            with contextlib.suppress(Exception):  # a busy database: the next poll
                self.poll()

    def __enter__(self) -> OwnerWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping.set()
        self._thread.join()


def all_delivered(cluster: BenchCluster, slack: FakeSlack, run_ids: list[int]) -> bool:
    """Whether every run has ended and, if done, posted into its thread (one query: polling must not load the CPU)."""
    with cluster.sessions() as session:
        rows = session.execute(select(Run.state, Run.status_message).where(Run.id.in_(run_ids))).all()
    return all(state in TERMINAL_STATES and (state != "done" or thread_replies(slack, status))
               for state, status in rows)


def wait_until_delivered(cluster: BenchCluster, slack: FakeSlack, run_ids: list[int],
                         timeout: float) -> list[RunTiming]:
    """Wait until every run has ended and (if done) posted into its thread, or `timeout`; then time each."""
    deadline = time.monotonic() + timeout
    while not all_delivered(cluster, slack, run_ids) and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
    return [run_timing(cluster, slack, run_id) for run_id in run_ids]


def settle_idle(sampler: ProcessSampler, seconds: float) -> ProcessSample:
    """The last sample after waiting `seconds` with nothing running."""
    time.sleep(seconds)
    return sampler.samples[-1]


def percentile(values: list[float], fraction: float) -> float:
    """The `fraction` quantile of `values` (linear interpolation between the closest ranks)."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * fraction
    lower = int(position)
    upper = min(lower + 1, len(ordered) - 1)
    return ordered[lower] + (ordered[upper] - ordered[lower]) * (position - lower)


def background_load(samples: list[ProcessSample]) -> float:
    """The machine's CPU use over `samples`, in percent of one core, less the worker tree's own."""
    first, last = samples[0], samples[-1]
    machine = last.machine_busy_seconds - first.machine_busy_seconds
    worker = (last.main_cpu_seconds - first.main_cpu_seconds) + (last.children_cpu_seconds - first.children_cpu_seconds)
    others = machine - worker
    return 100 * others / (last.at - first.at)


def cpu_by_second(samples: list[ProcessSample], start: float, field: str) -> list[float]:
    """The CPU time in `field` used in each whole second from `start`, in percent of one core."""
    shares = []
    second = start
    while True:
        window = [sample for sample in samples if second <= sample.at <= second + 1]
        if len(window) < 2:
            return shares
        used = getattr(window[-1], field) - getattr(window[0], field)
        shares.append(100 * used / (window[-1].at - window[0].at))
        second += 1


def first_edit_stages(timings: list[RunTiming]) -> dict[str, list[float]]:
    """Submit → lease taken (task picked up) → first status edit (sent before the engine starts), per run."""
    complete = [timing for timing in timings if None not in (timing.started, timing.first_edit)]
    if not complete:
        return {}
    return {
        "submit to lease": [timing.started - timing.submitted for timing in complete],
        "lease to first edit": [timing.first_edit - timing.started for timing in complete],
    }


def mib(value: float) -> str:
    """Bytes as MiB with one decimal."""
    return f"{value / MIB:.1f}"


def start_runs(cluster: BenchCluster, label: str, users: list[tuple[str, str]]) -> list[int]:
    """Start one run per (user, workspace), as the bot does; raises AssertionError if one had to wait."""
    run_ids = []
    for user, workspace in users:
        run_id, position = cluster.start_run(f"{QUESTION} ({label} {user})", user=user, workspace=workspace,
                                             channel=f"C{workspace}")
        assert position is None, f"run {run_id} of {user} waits at position {position}: the limits admit all"
        run_ids.append(run_id)
    return run_ids


@contextlib.contextmanager
def database(kind: str, workdir: Path) -> Iterator[str]:
    """A fresh database URL: a SQLite file in `workdir`, or a database on a throwaway PostgreSQL server."""
    if kind == "sqlite":
        yield f"sqlite:///{workdir}/deepthread.db"
        return
    with postgres_server() as server_url:
        yield create_database(server_url, "deepthread_bench")


class Measurement(BaseModel):
    """What one benchmark run observed: each run's timing, the warm-up runs', the workers' samples and logs."""

    timings: list[RunTiming]
    warm_up: list[RunTiming]
    cold: ProcessSample
    idle: ProcessSample
    during: list[ProcessSample]
    ended: float
    worker_pids: dict[str, int]
    logs: dict[str, str]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=RUNS,
                        help=f"runs at once, {RUNS_PER_WORKSPACE} per workspace")
    parser.add_argument("--workers", type=int, default=WORKERS, help="worker processes the runs are spread over")
    parser.add_argument("--concurrency", type=int, default=None,
                        help="each worker's --concurrency (default: ceil(runs / workers), every run at once)")
    parser.add_argument("--database", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--status-edits-per-minute", type=int, default=None,
                        help="STATUS_EDITS_PER_MINUTE per workspace (default: the setting's default, 40)")
    arguments = parser.parse_args()
    settings = {} if arguments.status_edits_per_minute is None else {
        "status_edits_per_minute": str(arguments.status_edits_per_minute)}
    print(f"database: {arguments.database}; status edits per minute per workspace: "
          f"{arguments.status_edits_per_minute or 'default (40)'}")
    print(f"LLM {LLM_SECONDS * 1000:.0f} ms a call, search (Tavily) {SEARCH_SECONDS * 1000:.0f} ms, "
          f"{len(HOSTS) * PAGES_PER_HOST} pages on {len(HOSTS)} hosts at "
          f"{FASTEST_PAGE_SECONDS * 1000:.0f}-{SLOWEST_PAGE_SECONDS * 1000:.0f} ms, "
          f"robots.txt {ROBOTS_SECONDS * 1000:.0f} ms")
    runs, workers = arguments.runs, arguments.workers
    if runs < 1 or workers < 1 or (arguments.concurrency is not None and arguments.concurrency < 1):
        parser.error("--runs, --workers and --concurrency must be at least 1")
    concurrency = arguments.concurrency or -(-runs // workers)
    print(f"{runs} runs by {runs} users in {workspaces_for(runs)} workspaces, {workers} worker "
          f"process{'es' if workers > 1 else ''}, --concurrency={concurrency} each")
    print(f"machine: {psutil.cpu_count()} cores, load average {' '.join(f'{load:.2f}' for load in psutil.getloadavg())}"
          " before the start")
    with tempfile.TemporaryDirectory(prefix="deepthread-bench-worker-") as workdir:
        measurement = measure(arguments.database, Path(workdir), settings, runs, workers, concurrency)
    report(measurement)


def workspaces_for(runs: int) -> int:
    """Workspaces enough for `runs` to be admitted at once under MAX_RUNS_PER_WORKSPACE=10."""
    return max(1, -(-runs // RUNS_PER_WORKSPACE))


def worker_names(workers: int) -> list[str]:
    """The Celery node names of the `workers` processes (and their log files' names)."""
    return ["bench"] if workers == 1 else [f"bench{index}" for index in range(1, workers + 1)]


def warm_up(cluster: BenchCluster, slack: FakeSlack, pids: dict[str, int]) -> list[RunTiming]:
    """Warm-up runs, as many at once as there are workers, until each worker process has held one's lease (a free
    worker takes the next task, so a round usually reaches all of them) or WARM_UP_ROUNDS rounds have passed."""
    timings: list[RunTiming] = []
    for round_index in range(WARM_UP_ROUNDS):
        users = [(f"U0WARM{round_index}{index:02d}", f"TWARMUP{round_index}{index // RUNS_PER_WORKSPACE}")
                 for index in range(len(pids))]
        timings += wait_until_delivered(cluster, slack, start_runs(cluster, "warm-up", users), RUN_TIMEOUT_SECONDS)
        failed = [timing for timing in timings if timing.state != "done"]
        logs = "\n".join(f"--- {name}\n{cluster.log(name)[-3000:]}" for name in pids)
        assert not failed, f"warm-up runs ended {[timing.state for timing in failed]}:\n{logs}"
        cold = set(pids.values()) - {timing.worker_pid for timing in timings}
        if not cold:
            break
    else:
        print(f"warning: {len(cold)} worker process(es) ran no warm-up run in {WARM_UP_ROUNDS} rounds: "
              "their first runs pay the first imports and spawn their CPU pool")
    return timings


def measure(database_kind: str, workdir: Path, settings: dict[str, str], runs: int = RUNS, workers: int = WORKERS,
            concurrency: int | None = None) -> Measurement:
    """Start the services and the workers, run the warm-up runs, then the `runs` runs, sampling the workers
    throughout."""
    concurrency = concurrency or -(-runs // workers)
    names = worker_names(workers)
    with (redis_server() as redis_url, database(database_kind, workdir) as database_url, bench_corpus() as corpus,
          FakeSlack() as slack):
        connect(redis_url).flushall()
        cluster = BenchCluster(
            database_url=database_url, redis_url=redis_url, corpus=corpus, slack=slack,
            workdir=workdir, research_max_rounds="2", worker_concurrency=str(concurrency),
            search_providers="tavily", tavily_api_key=corpus.search.api_keys.get("tavily", "tvly-any"),
            tavily_base_url=corpus.search.base_url("tavily"), **settings,
        )
        try:
            pids = {name: cluster.start_worker(name, concurrency=concurrency).pid for name in names}
            with ProcessSampler(list(pids.values())) as sampler, OwnerWatcher(cluster):
                cold = settle_idle(sampler, IDLE_SETTLE_SECONDS)
                warm_up_timings = warm_up(cluster, slack, pids)
                settled = len(sampler.samples)
                idle = settle_idle(sampler, IDLE_SETTLE_SECONDS)
                print(f"machine CPU while the workers idled before the runs: "
                      f"{background_load(sampler.samples[settled:]):.0f}% of one core "
                      "(other processes: a busy machine skews the figures)")
                for name, process in zip(names, sampler.processes):
                    print(f"{name}'s children when idle after the warm-up: {describe_children(process)}")
                first_sample = len(sampler.samples)
                users = [(f"U0USER{index:04d}", f"T{index % workspaces_for(runs) + 1}") for index in range(runs)]
                timings = wait_until_delivered(cluster, slack, start_runs(cluster, "bench", users), RUN_TIMEOUT_SECONDS)
                ended = time.monotonic()
                during = sampler.samples[first_sample:]
        finally:
            cluster.stop()
        return Measurement(timings=timings, warm_up=warm_up_timings, cold=cold, idle=idle, during=during, ended=ended,
                           worker_pids=pids, logs={name: cluster.log(name) for name in names})


def report(measurement: Measurement) -> None:
    """Print the figures, ending with the one key=value line."""
    timings, warm_ups, during = measurement.timings, measurement.warm_up, measurement.during
    completed = [timing for timing in timings if timing.state == "done" and timing.delivered is not None]
    first_edits = [timing.first_edit_seconds for timing in timings if timing.first_edit_seconds is not None]
    first_submit = min(timing.submitted for timing in timings)
    last_delivery = max((timing.delivered for timing in completed if timing.delivered is not None),
                        default=max(timing.submitted for timing in timings))
    span = last_delivery - first_submit
    runs_per_minute = len(completed) / span * 60 if span > 0 else 0.0
    print()
    for timing in warm_ups:
        print(f"warm-up run {timing.run_id} (worker pid {timing.worker_pid}): first edit "
              f"{seconds_or_dash(timing.first_edit_seconds)} s, delivered {seconds_or_dash(timing.total_seconds)} s "
              "after submit")
    print_timings(timings, completed, span, runs_per_minute)
    print_workers(timings, measurement.worker_pids)
    failed = [timing for timing in timings if timing.state != "done"]
    print_failures(failed)
    late = late_deliveries(timings, measurement.ended)
    reattempts = sum(max(timing.attempt - 1, 0) for timing in timings)
    print(f"late deliveries (report more than {LATE_DELIVERY_SECONDS:.0f} s after the run finished, or none): "
          f"{len(late)}; reattempts: {reattempts} "
          f"({sum(1 for timing in timings if timing.attempt > 1)} runs took more than one attempt)")
    print_first_edits(timings, first_edits)
    per_run, peak_total = print_memory(timings, measurement.cold, measurement.idle, during)
    print_cpu([sample for sample in during if sample.at <= last_delivery], first_submit, len(timings))
    lines = [line for log in measurement.logs.values() for line in log.splitlines()]
    warnings = print_log_lines(measurement.logs)
    first_edit_p95 = percentile(first_edits, 0.95) if first_edits else float("nan")
    print(f"runs={len(timings)} completed={len(completed)} runs_per_min={runs_per_minute:.1f} "
          f"first_edit_p95_s={first_edit_p95:.3f} mib_per_run={per_run / MIB:.2f} "
          f"failed={len(failed)} reattempts={reattempts} warning_lines={len(warnings)} late_deliveries={len(late)} "
          f"max_connections_errors={sum(1 for line in lines if 'MaxConnectionsError' in line)} "
          f"integrity_errors={sum(1 for line in lines if 'IntegrityError' in line)} "
          f"peak_rss_mib={peak_total / MIB:.1f} workers={len(measurement.worker_pids)}")


def seconds_or_dash(value: float | None) -> str:
    """Seconds with two decimals, or a dash for a moment that never came."""
    return "-" if value is None else f"{value:.2f}"


def late_deliveries(timings: list[RunTiming], ended: float) -> list[RunTiming]:
    """Runs whose report reached the fake Slack more than LATE_DELIVERY_SECONDS after their `finished_at`, or that
    finished more than that before the measurement ended with no report."""
    return [timing for timing in timings if timing.finished is not None
            and (timing.delivered if timing.delivered is not None else ended) - timing.finished > LATE_DELIVERY_SECONDS]


def print_workers(timings: list[RunTiming], pids: dict[str, int]) -> None:
    """How many runs each worker process was seen holding (leases are polled every POLL_SECONDS)."""
    if len(pids) < 2:
        return
    held = Counter(timing.worker_pid for timing in timings)
    shares = ", ".join(f"{name} (pid {pid}) {held.get(pid, 0)}" for name, pid in pids.items())
    unseen = held.get(None, 0)
    print(f"runs per worker process: {shares}" + (f", not seen leased {unseen}" if unseen else ""))


def print_failures(failed: list[RunTiming]) -> None:
    """The final states and errors of the runs that did not end `done`, counted."""
    if not failed:
        return
    outcomes = Counter(f"{timing.state}: {(timing.error or '-')[:200]}" for timing in failed)
    print(f"{len(failed)} runs not done:")
    for outcome, count in outcomes.most_common():
        print(f"  {count:5d} x {outcome}")


def print_log_lines(logs: dict[str, str]) -> list[str]:
    """Count the workers' WARNING/ERROR/CRITICAL lines, per worker and distinct (first 200 characters without the
    time stamp, digits as #), and the tracebacks; returns the lines."""
    warnings: list[str] = []
    per_worker = []
    tracebacks = 0
    for name, log in logs.items():
        found = [line for line in log.splitlines() if WARNING_LINE.search(line)]
        tracebacks += sum(1 for line in log.splitlines() if line.startswith("Traceback"))
        per_worker.append(f"{name} {len(found)}")
        warnings += found
    print(f"worker logs: {len(warnings)} warning/error lines ({', '.join(per_worker)}), {tracebacks} tracebacks")
    distinct = Counter(re.sub(r"\d+", "#", re.sub(r"^\S+ \S+ (?=(WARNING|ERROR|CRITICAL) )", "", line))[:200]
                       for line in warnings)
    for line, count in distinct.most_common(DISTINCT_WARNINGS_SHOWN):
        print(f"  {count:5d} x {line}")
    if len(distinct) > DISTINCT_WARNINGS_SHOWN:
        print(f"  … and {len(distinct) - DISTINCT_WARNINGS_SHOWN} more distinct lines")
    return warnings


def print_timings(timings: list[RunTiming], completed: list[RunTiming], span: float, runs_per_minute: float) -> None:
    """How the runs ended, how long they took, and how long their reports waited after they finished."""
    first_submit = min(timing.submitted for timing in timings)
    last_submit = max(timing.submitted for timing in timings)
    states = {state: sum(1 for timing in timings if timing.state == state)
              for state in sorted({timing.state for timing in timings})}
    print(f"submitted {len(timings)} runs in {last_submit - first_submit:.2f} s; states {states}; "
          f"{len(completed)} done with a report in the thread")
    print(f"first submit to last report: {span:.1f} s -> {runs_per_minute:.1f} runs/min")
    totals = [timing.total_seconds for timing in completed if timing.total_seconds is not None]
    if totals:
        print(f"submit to report: median {statistics.median(totals):.2f} s, p95 {percentile(totals, 0.95):.2f} s, "
              f"max {max(totals):.2f} s")
    finished = [timing for timing in completed if timing.finished is not None and timing.delivered is not None]
    if finished:
        last_finish = max(timing.finished for timing in finished)
        waits = [timing.delivered - timing.finished for timing in finished]
        print(f"submit to run finished (stored): median "
              f"{statistics.median([timing.finished - timing.submitted for timing in finished]):.2f} s; "
              f"last run finished {last_finish - first_submit:.1f} s after the first submit "
              f"({len(finished) / (last_finish - first_submit) * 60:.1f} runs/min)")
        print(f"run finished to report posted: median {statistics.median(waits):.2f} s, "
              f"p95 {percentile(waits, 0.95):.2f} s, max {max(waits):.2f} s "
              f"(the final status edit first waits for a token of the workspace's edit budget)")


def print_first_edits(timings: list[RunTiming], first_edits: list[float]) -> None:
    """Time from submit to the first status edit, and its three stages."""
    if not first_edits:
        print("no run's status message was edited")
        return
    print(f"submit to first status edit ({len(first_edits)} runs): median {statistics.median(first_edits):.3f} s, "
          f"p95 {percentile(first_edits, 0.95):.3f} s, max {max(first_edits):.3f} s")
    stages = first_edit_stages(timings)
    if stages:
        print("  of which: " + ", ".join(f"{name} median {statistics.median(values):.3f} s, "
                                         f"p95 {percentile(values, 0.95):.3f} s" for name, values in stages.items()))


def print_memory(timings: list[RunTiming], cold: ProcessSample, idle: ProcessSample,
                 during: list[ProcessSample]) -> tuple[float, int]:
    """RSS idle and at peak, worker processes and children apart; returns the bytes per run and the peak."""
    peak_total = max(sample.total_bytes for sample in during)
    peak_main = max(sample.main_bytes for sample in during)
    peak_children = max(sample.children_bytes for sample in during)
    per_run = (peak_total - idle.total_bytes) / len(timings)
    print(f"RSS MiB            {'workers':>8} {'children':>9} {'total':>8}")
    for label, sample in (("idle, cold", cold), ("idle, warm", idle)):
        print(f"  {label:<15} {mib(sample.main_bytes):>8} {mib(sample.children_bytes):>9} {mib(sample.total_bytes):>8}"
              f"   ({sample.children} children)")
    print(f"  {f'peak, {len(timings)} runs':<15} {mib(peak_main):>8} {mib(peak_children):>9} {mib(peak_total):>8}")
    print(f"per run: ({mib(peak_total)} - {mib(idle.total_bytes)}) / {len(timings)} = {per_run / MIB:.2f} MiB "
          f"(worker processes alone: {(peak_main - idle.main_bytes) / len(timings) / MIB:.2f} MiB; "
          f"children grew {mib(peak_children - idle.children_bytes)} MiB in all)")
    print(f"against the idle RSS before the warm-up (first imports and the CPU pool not loaded yet): "
          f"{(peak_total - cold.total_bytes) / len(timings) / MIB:.2f} MiB per run")
    return per_run, peak_total


def print_cpu(busy: list[ProcessSample], first_submit: float, runs: int) -> None:
    """CPU use of the worker processes and of their CPU pools while the runs ran, overall and second by second."""
    if len(busy) < 2:
        return
    seconds = busy[-1].at - busy[0].at
    print(f"CPU while the {runs} ran ({seconds:.1f} s): worker processes "
          f"{(busy[-1].main_cpu_seconds - busy[0].main_cpu_seconds) / seconds:.0%} of a core, CPU pools "
          f"{(busy[-1].children_cpu_seconds - busy[0].children_cpu_seconds) / seconds:.0%} of a core")
    print("each second from the first submit, % of one core:")
    for label, field in (("worker processes", "main_cpu_seconds"), ("whole machine", "machine_busy_seconds")):
        shares = " ".join(f"{share:3.0f}" for share in cpu_by_second(busy, first_submit, field))
        print(f"  {label:<16} {shares}")
    print(f"  (the machine has {psutil.cpu_count()} cores: the fakes, Redis and the database share them)")


if __name__ == "__main__":
    main()
