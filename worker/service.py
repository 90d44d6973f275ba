"""One worker process's runtime: database, Redis, CPU pool, messengers, the reaper; runs one run per call."""

from __future__ import annotations

import logging
from concurrent import futures
import os
import ssl
import threading
from collections.abc import Awaitable, Callable, Iterable

import httpx

from chat.platform import Outbound, OutboundPlatform
from config import Settings
from ops.log_context import logged_as_run
from ops.metrics import process_metrics
from research.cpu import cpu_pool
from research.files import FileDownloader, LocalFiles
from storage.answer_drafts import AnswerDraftWriter
from storage.admission import aqueue_positions
from storage.db import Engine, make_session_factory, pooled_engine
from storage.leases import fail_unstartable
from storage.watches import FiringLimits
from storage.redis import connect, connections_for, resolve_redis_url
from storage.shared_limits import (
    HEARTBEAT_SECONDS,
    EditBucket,
    RedisCircuitBreaker,
    RedisRateLimiter,
    beat,
    connect_async,
)
from worker.cancels import CancelWatcher, redis_flags, row_flags
from worker.delivery import DeliveryRetry, DeliveryTarget, RunDelivery, show_queue_positions, sweep_undelivered
from worker.leases import LeaseKeeper, reap, worker_identity
from worker.loop import RunLoop
from worker.queue import Limits, Queue, SendTask
from worker.attempt import RunAttempt, WorkerLoops
from worker.runner import RunnerServices, start_attempt
from worker.toolkit import build_research_tools, research_options, search_config
from worker.watches import WatchTick

logger = logging.getLogger(__name__)

# Threads for the runs' blocking calls (database checks, name lookups), beyond one per run in flight.
BLOCKING_THREADS_BEYOND_CONCURRENCY = 4
# Threads for the delivery loop's database reads and writes (ownership checks, recorded messages).
DELIVERY_BLOCKING_THREADS = 16

def worker_engine(settings: Settings) -> Engine:
    """The worker process's database engine: a pooled connection for every run in flight, up to
    WORKER_DATABASE_CONNECTIONS (at 500 runs a worker, a pool sized by its runs alone met PostgreSQL's "too many
    clients"; a run holds a connection only for a statement's time, so they take turns)."""
    return pooled_engine(settings.database_url, settings.worker_concurrency + BLOCKING_THREADS_BEYOND_CONCURRENCY,
                         max_connections=settings.worker_database_connections)


def shared_ssl_context() -> ssl.SSLContext:
    """The TLS context every run's HTTP clients share (httpx's default trust store).

    Building one loads a CA bundle, about 20 ms of CPU and 1 MiB; three per run (search, LLM,
    fetcher) made 50 runs starting together queue for the CPU for seconds.
    """
    return httpx.create_ssl_context()


class WorkerRuntime:
    """Shared by every run in one worker process: the runs execute on one event loop (worker.loop)."""

    def __init__(self, settings: Settings, *, send_task: SendTask, platforms: Iterable[OutboundPlatform] = (),
                 cpu_workers: int | None = None) -> None:
        self.settings = settings
        self.platforms = {platform.name: platform for platform in platforms}
        self._outbound: dict[str, Outbound | None] = {}
        self._outbound_lock = threading.Lock()
        self.redis_url = resolve_redis_url(settings.redis_url, settings.data_dir)
        self.redis = connect(self.redis_url, max_connections=connections_for(settings.worker_concurrency))
        self.sessions = make_session_factory(worker_engine(settings))
        self.queue = Queue(self.sessions, self.redis, Limits(settings.max_runs_per_user, settings.max_runs_per_workspace),
                           send_task)
        self.send_task = send_task
        self.cpu_pool = cpu_pool(cpu_workers or min(2, os.cpu_count() or 1),
                                 task_timeout_seconds=settings.extract_timeout_seconds,
                                 memory_limit_bytes=settings.extract_memory_limit_mb * 1024 * 1024)
        self.ssl_context = shared_ssl_context()
        # Its own client: with Redis down it reads the run rows within a second, not after retries.
        self.cancels = CancelWatcher(redis_flags(connect(self.redis_url, fail_fast=True)), row_flags(self.sessions))
        self.leases = LeaseKeeper(self.sessions, settings.worker_lease_seconds)
        self.loop = RunLoop(blocking_threads=settings.worker_concurrency + BLOCKING_THREADS_BEYOND_CONCURRENCY)
        # Status edits and reports go out from a loop of their own (see WorkerLoops).
        self.delivery_loop = RunLoop(blocking_threads=DELIVERY_BLOCKING_THREADS, name="deepthread-delivery")
        self.loops = WorkerLoops(runs=self.loop, delivery=self.delivery_loop)
        # Each client's connections live on its own loop; a burst of runs waits for one rather than failing.
        self.aredis = connect_async(self.redis_url, max_connections=connections_for(settings.worker_concurrency))
        self.delivery_redis = connect_async(self.redis_url, max_connections=connections_for(settings.worker_concurrency))
        self.edit_bucket = EditBucket(self.delivery_redis, capacity=settings.status_edits_per_minute)
        self._stopping = threading.Event()
        self._reaper: threading.Thread | None = None

    @logged_as_run
    def run(self, run_id: int) -> None:
        """Execute run `run_id` (if nobody else holds it), deliver it, then admit what waits; call from a worker thread."""
        try:
            self._start_and_run(run_id)
        finally:
            try:
                admitted = self.queue.admit()
                if admitted:  # only the queues these runs left have moved
                    self.delivery_loop.run(self.refresh_waiting(admitted))
            except Exception:  # admission is retried by the reaper; never fail the task for it
                logger.warning("admission after run %s failed", run_id, exc_info=True)

    def _start_and_run(self, run_id: int) -> None:
        """Take the run's lease as a new attempt and hand the attempt its delivery, its tools and the two loops."""
        try:
            delivery = self._delivery(run_id)
        except (LookupError, ValueError) as error:
            # This worker can never run it (no Slack token, say): end it with the reason instead of retrying forever.
            fail_unstartable(self.sessions, run_id, f"The worker cannot start this run: {error}")
            return
        owner = worker_identity()
        started = start_attempt(self.sessions, run_id, owner, self.settings.worker_lease_seconds)
        if started is None:
            return
        services, close = self._services()
        services.tools.files = self._files(started.run.conversation.platform)
        # A platform with nothing delivered (the terminal) follows the answer's draft in Redis instead.
        answer_draft = AnswerDraftWriter(self.aredis, run_id) if delivery is None else None
        RunAttempt(started, services, owner=owner, delivery=delivery).run_in_worker(
            self.loops, cancels=self.cancels, answer_draft=answer_draft, close=close)

    def _services(self) -> tuple[RunnerServices, Callable[[], Awaitable[None]]]:
        """What one attempt executes with (its own HTTP clients, the process's pools, limits and metrics), and how
        to close its clients after."""
        settings = self.settings
        search = search_config(settings)
        llm_http = httpx.AsyncClient(verify=self.ssl_context, timeout=httpx.Timeout(60.0))
        search_http = httpx.AsyncClient(timeout=httpx.Timeout(20.0), trust_env=True, verify=self.ssl_context)
        tools = build_research_tools(
            settings, cpu_pool=self.cpu_pool,
            limiter=RedisRateLimiter(self.aredis, search.min_interval_seconds),
            breaker=RedisCircuitBreaker(self.aredis, failure_threshold=search.breaker_failure_threshold,
                                        cooldown=search.breaker_cooldown_seconds),
            llm_http=llm_http, search_http=search_http, search=search,
        )
        tools.fetch_ssl_context = self.ssl_context
        services = RunnerServices(sessions=self.sessions, tools=tools, options=research_options(settings),
                                  hard_deadline_grace_seconds=settings.worker_deadline_grace_seconds,
                                  lease_seconds=settings.worker_lease_seconds, metrics=process_metrics(),
                                  leases=self.leases, overloaded=self.loop.overloaded)

        async def close() -> None:
            await llm_http.aclose()  # ours, not the LLM client's, so its aclose() leaves it open
            await search_http.aclose()

        return services, close

    def _platform_parts(self, platform: str) -> Outbound | None:
        """The platform's messenger and renderer (None: a platform that shows its runs itself, like the terminal);
        raises LookupError when this worker does not know the platform or it is not configured here."""
        with self._outbound_lock:  # runs build their delivery in the loop's threads
            if platform not in self._outbound:
                known = self.platforms.get(platform)
                if known is None:
                    raise LookupError(f"this worker does not deliver to {platform}")
                # One per process: its HTTP connections and the platform's rate-limit state serve every run.
                self._outbound[platform] = known.outbound(self.settings)
            return self._outbound[platform]

    def _files(self, platform: str) -> FileDownloader | None:
        """How the run reaches the files shared with it: its platform's own file hosts, or (a platform that shows
        its runs itself, the terminal, on this machine) the disk."""
        parts = self._platform_parts(platform)
        return LocalFiles() if parts is None else parts.files

    def _delivering_platforms(self) -> list[str]:
        """The platforms whose finished runs this worker can deliver."""
        names = []
        for name in self.platforms:
            try:
                if self._platform_parts(name) is not None:
                    names.append(name)
            except LookupError:
                continue
        return names

    def _delivery(self, run_id: int) -> RunDelivery | None:
        """The run's delivery on its platform (None: no run, or nothing to deliver to); raises as `_platform_parts`."""
        target = DeliveryTarget.load(self.sessions, run_id)
        parts = self._platform_parts(target.place.platform) if target is not None else None
        if target is None or parts is None:
            return None
        return RunDelivery(self.sessions, target, messenger=parts.messenger, renderer=parts.renderer, bucket=self.edit_bucket,
                           retry=DeliveryRetry.from_settings(self.settings), busy=self.delivery_loop.overloaded)

    def watch_tick(self) -> None:
        """Fire the watches that are due (the beat's `deepthread.watch_tick`); call from a worker thread."""
        tick = WatchTick(self.sessions, self.queue, FiringLimits.from_settings(self.settings),
                         claim_seconds=self.settings.watch_claim_seconds, platform_parts=self._platform_parts,
                         metrics=process_metrics())
        self.delivery_loop.run(tick())

    async def refresh_waiting(self, admitted: list[int] | None = None) -> None:
        """Show each waiting run's current place in the queue in its status message (in the workspaces of the
        `admitted` runs only, when given)."""
        waiting = await aqueue_positions(self.sessions, admitted)
        await show_queue_positions(self.sessions, waiting, platform_parts=self._platform_parts, bucket=self.edit_bucket)

    def start(self) -> None:
        """As the worker becomes ready: the CPU pool's processes start and import the readers now (not when a run's
        first pages arrive), and the reaper and the heartbeat begin."""
        from research.readers import load_readers

        warming = self.cpu_pool.warm(load_readers)

        def say_when_ready() -> None:
            futures.wait(warming)
            logger.info("CPU pool ready: %s processes have the readers loaded", len(warming))

        threading.Thread(target=say_when_ready, name="deepthread-pool-warm-up", daemon=True).start()
        self.start_reaper()

    def start_reaper(self) -> None:
        """Resubmit runs whose lease expired and admit waiting runs, every third of a lease."""
        def loop() -> None:
            while not self._stopping.wait(max(1.0, self.settings.worker_lease_seconds / 3)):
                try:
                    reap(self.sessions, self.send_task)
                    self.queue.admit()
                    self.delivery_loop.run(sweep_undelivered(self.sessions, platforms=self._delivering_platforms(),
                                                    lease_seconds=self.settings.worker_lease_seconds,
                                                    delivery_for=self._delivery))
                except Exception:
                    if self._stopping.is_set():  # the loops closed under a pass that had started
                        return
                    logger.warning("reaper pass failed", exc_info=True)

        self._reaper = threading.Thread(target=loop, name="deepthread-reaper", daemon=True)
        self._reaper.start()
        self._heartbeat = threading.Thread(target=self._beat, name="deepthread-heartbeat", daemon=True)
        self._heartbeat.start()

    def _beat(self) -> None:
        """Tell the bots this worker is alive (a run queued with none alive is said so to its requester)."""
        name = worker_identity()
        while True:
            try:
                beat(self.redis, name)
            except Exception:  # Redis down: the bots will say no worker is alive, which is then true enough
                logger.warning("worker heartbeat failed", exc_info=True)
            if self._stopping.wait(HEARTBEAT_SECONDS):
                return

    def stop(self) -> None:
        self._stopping.set()
        self.cancels.stop()
        self.leases.stop()
        try:
            self.loop.run(self.aredis.aclose())
            self.delivery_loop.run(self.delivery_redis.aclose())
        finally:
            self.loop.stop()
            self.delivery_loop.stop()
        self.cpu_pool.shutdown(wait=False, cancel_futures=True)
