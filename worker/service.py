"""One worker process's runtime: database, Redis, CPU pool, messengers, the reaper; runs one run per call."""

from __future__ import annotations

import logging
import os
import ssl
import threading
from collections.abc import Iterable

import httpx

from chat.platform import Outbound, OutboundPlatform
from chat.state import RunProgress
from config import Settings
from ops.log_context import logged_as_run, set_run_phase
from ops.metrics import process_metrics
from research.budget import CancelToken
from research.cpu import cpu_pool
from storage.answer_drafts import AnswerDraftWriter
from storage.admission import aqueue_positions
from storage.db import Engine, make_session_factory, pooled_engine
from storage.leases import fail_unstartable
from storage.redis import connect, resolve_redis_url
from storage.shared_limits import (
    HEARTBEAT_SECONDS,
    EditBucket,
    RedisCircuitBreaker,
    RedisRateLimiter,
    beat,
    connect_async,
    connections_for,
)
from worker.cancels import CancelWatcher, redis_flags, row_flags
from worker.delivery import DeliveryRetry, DeliveryTarget, RunDelivery, show_queue_positions, sweep_undelivered
from worker.leases import reap, worker_identity
from worker.loop import RunLoop
from worker.queue import Limits, Queue, SendTask
from worker.runner import RunnerServices, StartedAttempt, execute, start_attempt
from worker.toolkit import build_research_tools, research_options, search_config

logger = logging.getLogger(__name__)

# Threads for the runs' blocking calls (database checks, name lookups), beyond one per run in flight.
BLOCKING_THREADS_BEYOND_CONCURRENCY = 4
# Threads for the delivery loop's database reads and writes (ownership checks, recorded messages).
DELIVERY_BLOCKING_THREADS = 16

def worker_engine(settings: Settings) -> Engine:
    """The worker process's database engine, with a pooled connection for every run in flight."""
    return pooled_engine(settings.database_url, settings.worker_concurrency + BLOCKING_THREADS_BEYOND_CONCURRENCY)


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
        self.redis = connect(self.redis_url)
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
        self.loop = RunLoop(blocking_threads=settings.worker_concurrency + BLOCKING_THREADS_BEYOND_CONCURRENCY)
        # Status edits and reports go out from a loop of their own: on the runs' loop, busy with a burst of
        # runs, each step of an edit waited a whole turn behind every other run's work.
        self.delivery_loop = RunLoop(blocking_threads=DELIVERY_BLOCKING_THREADS, name="deepthread-delivery")
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
        """The lease and the first status edit from this thread, the run on the runs' loop, delivery on its own."""
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
        if delivery is None:
            self.loop.run(self._execute(started, owner, None))
            return
        finished = False
        try:
            # The status message leaves "queued" as soon as this worker holds the run, before the engine starts.
            self.delivery_loop.call(delivery.on_state(started.first_progress())).result()
            final = self.loop.run(self._execute(started, owner, delivery))
            if final is not None:
                set_run_phase("deliver")
                self.delivery_loop.call(delivery.finish(final)).result()
                finished = True
        finally:
            if not finished:  # a stale attempt, or one that broke
                self.delivery_loop.call(delivery.abandon()).result()

    async def _execute(self, started: StartedAttempt, owner: str, delivery: RunDelivery | None) -> RunProgress | None:
        settings = self.settings
        search = search_config(settings)
        llm_http = httpx.AsyncClient(verify=self.ssl_context, timeout=httpx.Timeout(60.0))
        tools = build_research_tools(
            settings, cpu_pool=self.cpu_pool,
            limiter=RedisRateLimiter(self.aredis, search.min_interval_seconds),
            breaker=RedisCircuitBreaker(self.aredis, failure_threshold=search.breaker_failure_threshold,
                                        cooldown=search.breaker_cooldown_seconds),
            llm_http=llm_http,
            search_http=httpx.AsyncClient(timeout=httpx.Timeout(20.0), trust_env=True, verify=self.ssl_context),
            search=search,
        )
        tools.fetch_ssl_context = self.ssl_context
        cancel = CancelToken()
        run_id = started.run.id

        async def on_state(progress: RunProgress) -> None:
            await self.delivery_loop.bridged(delivery.on_state(progress))

        # A platform with nothing delivered (the terminal) follows the answer's draft in Redis instead.
        answer_draft = AnswerDraftWriter(self.aredis, run_id) if delivery is None else None
        answer_stream = delivery.stream_answer(started.run.attempt, self.delivery_loop.loop) if delivery else answer_draft

        async def on_text(visible_text: str) -> None:
            answer_stream.show(visible_text)  # handed over without waiting: the model is not slowed by the platform

        try:
            services = RunnerServices(sessions=self.sessions, tools=tools, options=research_options(settings),
                                      hard_deadline_grace_seconds=settings.worker_deadline_grace_seconds,
                                      lease_seconds=settings.worker_lease_seconds, metrics=process_metrics())
            with self.cancels.watching(run_id, cancel):
                final = await execute(run_id, on_state if delivery else None, services=services, cancel=cancel,
                                      owner=owner, started=started, on_text=on_text if answer_stream else None)
            if final is not None and final.state == "cancelled" and final.cancelled_by is None:
                final = final.model_copy(update={"cancelled_by": cancel.cancelled_by})
            return final
        finally:
            if answer_draft is not None:
                await answer_draft.close()
            await llm_http.aclose()  # ours, not the LLM client's, so its aclose() leaves it open
            await tools.search_http.aclose()

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
                           retry=DeliveryRetry.from_settings(self.settings))

    async def refresh_waiting(self, admitted: list[int] | None = None) -> None:
        """Show each waiting run's current place in the queue in its status message (in the workspaces of the
        `admitted` runs only, when given)."""
        waiting = await aqueue_positions(self.sessions, admitted)
        await show_queue_positions(self.sessions, waiting, platform_parts=self._platform_parts, bucket=self.edit_bucket)

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
        try:
            self.loop.run(self.aredis.aclose())
            self.delivery_loop.run(self.delivery_redis.aclose())
        finally:
            self.loop.stop()
            self.delivery_loop.stop()
        self.cpu_pool.shutdown(wait=False, cancel_futures=True)
