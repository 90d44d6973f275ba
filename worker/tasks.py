"""The Celery app and its tasks: thin wrappers that hand a run id to the worker runtime.

No result backend (state lives in SQL), late acknowledgement, reject on worker lost, prefetch 1.
Research is I/O-bound, so one worker process runs WORKER_CONCURRENCY runs at once: Celery hands
each to one of its threads, which runs it on the process's one shared event loop (worker.loop) and
waits; CPU-heavy steps go to one bounded process pool per worker process.
"""

from __future__ import annotations

import contextvars
import gc
import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from celery import Celery, signals
from celery.worker.consumer import Consumer

from chat.platform import OutboundPlatform
from config import Settings, get_settings
from ops.health import process_health
from ops.log_context import RunLogContext, bind_run, unbind_run
from ops.server import OpsServer, start_ops_server
from storage.redis import broker_transport_options, celery_broker_url, resolve_redis_url
from worker.queue import QUEUE_NAME

if TYPE_CHECKING:
    from worker.service import WorkerRuntime  # imported at run time only by runtime(), in the worker process

logger = logging.getLogger(__name__)

# One hour: a task message taken by a worker that died is delivered again after this (the reaper acts sooner).
VISIBILITY_TIMEOUT_SECONDS = 3600


class BrokerOutageConsumer(Consumer):
    """Celery's consumer, reconnecting (instead of dying) when the Redis broker went away while a task was unacknowledged.

    On a lost connection Celery collects the kombu connection, which detaches its transport, then
    closes it. kombu's Redis channel, whose close was cut short by the failed read of its pending
    BRPOP, then tries again to restore the unacknowledged messages through the detached transport
    and raises AttributeError ('NoneType' object has no attribute 'hostname'), which Celery treats
    as unrecoverable; so does acknowledging, later, a task received on that channel. The broken
    connection is already dropped by then, so carrying on reconnects; the unacknowledged message
    comes back after the visibility timeout and finds its run ended (tasks check the run's state).
    """

    def on_connection_error_after_connected(self, exc: Exception) -> None:
        try:
            super().on_connection_error_after_connected(exc)
        except AttributeError:
            logger.warning("broker connection lost with tasks unacknowledged; reconnecting")

    def call_soon_ack(self, p: Callable[..., object], *args: object, **kwargs: object) -> object:
        return super().call_soon_ack(_unless_channel_detached(p), *args, **kwargs)


def _unless_channel_detached(acknowledge: Callable[..., object]) -> Callable[..., object]:
    """`acknowledge`, logging instead of raising when its message came on a channel whose connection was lost."""

    def call(*args: object, **kwargs: object) -> object:
        try:
            return acknowledge(*args, **kwargs)
        except AttributeError:
            logger.warning("a task received before the broker connection was lost could not be acknowledged; "
                           "the broker delivers it again after its visibility timeout, to no effect")
            return None

    return call


app = Celery("deepthread", set_as_current=False)
app.conf.update(
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    task_ignore_result=True,
    result_backend=None,
    task_serializer="json",
    accept_content=["json"],
    task_default_queue=QUEUE_NAME,
    broker_connection_retry=True,
    broker_connection_retry_on_startup=True,
    broker_connection_max_retries=None,  # a worker waits out a broker outage of any length
    worker_hijack_root_logger=False,
    worker_send_task_events=False,
    worker_cancel_long_running_tasks_on_connection_loss=False,
    worker_consumer=f"{__name__}:BrokerOutageConsumer",
    broker_transport_options={"visibility_timeout": VISIBILITY_TIMEOUT_SECONDS, **broker_transport_options()},
)


_platforms: list[OutboundPlatform] = []


def configure(settings: Settings, *, platforms: Sequence[OutboundPlatform] = ()) -> Celery:
    """Point the app at the broker of these settings (the embedded Redis when REDIS_URL is empty); a worker
    process also gets the chat platforms it delivers to (the composition root's bundles)."""
    global _settings
    app.conf.broker_url = celery_broker_url(resolve_redis_url(settings.redis_url, settings.data_dir))
    # The settings the command was started with (`--concurrency N` included) size every pool of the runtime.
    _settings = settings
    if platforms:
        _platforms[:] = platforms
    return app


_settings: Settings | None = None


def worker_settings() -> Settings:
    """The settings `configure` was given, else those of the environment."""
    return _settings or get_settings()


_runtime_lock = threading.Lock()
_runtime: WorkerRuntime | None = None


def runtime() -> WorkerRuntime:
    """The worker process's runtime (database, Redis, CPU pool, messengers), made on first use."""
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            from worker.service import WorkerRuntime

            _runtime = WorkerRuntime(worker_settings(), send_task=send_task, platforms=_platforms)
        return _runtime


def send_task(name: str, run_id: int, task_id: str) -> None:
    """Hand a run to the workers by task name."""
    app.send_task(name, args=[run_id], task_id=task_id, queue=QUEUE_NAME)


@app.task(name="deepthread.research", ignore_result=True)
def research_task(run_id: int) -> None:
    runtime().run(run_id)


@app.task(name="deepthread.plan", ignore_result=True)
def plan_task(run_id: int) -> None:
    runtime().run(run_id)


@app.task(name="deepthread.chat", ignore_result=True)
def chat_task(run_id: int) -> None:
    runtime().run(run_id)


@app.task(name="deepthread.watch_tick", ignore_result=True)
def watch_tick_task() -> None:
    """The beat's tick (worker.beat): fire the watches that are due."""
    runtime().watch_tick()


_run_log_tokens: dict[str, contextvars.Token[RunLogContext | None]] = {}


@signals.task_prerun.connect
def _tag_logs_with_run(task_id: str, args: Sequence[object] = (), **_: object) -> None:
    # From here to postrun, Celery's own lines about the task (its success, its failure) name the run too.
    if args and isinstance(args[0], int):  # every deepthread task takes the run id alone
        _run_log_tokens[task_id] = bind_run(args[0])


@signals.task_postrun.connect
def _untag_logs(task_id: str, **_: object) -> None:
    token = _run_log_tokens.pop(task_id, None)
    if token is not None:
        unbind_run(token)


_ops_server: OpsServer | None = None


@signals.worker_init.connect
def _serve_health_and_metrics(**_: object) -> None:
    # From the start, before the broker is reached: a broker down at start-up is then a failing part, not silence.
    global _ops_server
    settings = worker_settings()
    _ops_server = start_ops_server(settings.worker_http_port, process_health(settings, watch_workers=False),
                                   host=settings.http_bind_address, setting="WORKER_HTTP_PORT")


# The collector's thresholds in a worker (generations 0, 1, 2; CPython's defaults are 700, 10, 10).
COLLECTOR_THRESHOLDS = (50_000, 50, 100)


def quiet_collector() -> None:
    """Make the garbage collector's passes rare and short in a process that carries hundreds of runs.

    At a thousand runs on two workers, each worker's collector stopped every thread 25 times in four minutes
    for a full pass over every live object (up to 1.1 s each, 12 s in all), and young passes ran every 700
    allocations: reports waited seconds behind them. What start-up made (modules, settings, clients) is
    frozen, never examined again; young passes come after 50,000 allocations, full ones far more rarely. A
    run's objects are freed by their reference counts as it ends; what the collector finds is the few cycles
    (exceptions with their frames), which wait a little longer.
    """
    gc.freeze()
    gc.set_threshold(*COLLECTOR_THRESHOLDS)


@signals.worker_ready.connect
def _start_runtime(**_: object) -> None:
    runtime().start()
    quiet_collector()


@signals.worker_shutdown.connect
def _stop_runtime(**_: object) -> None:
    # worker_shutdown comes after running tasks have drained, so no run loses its CPU pool mid-way.
    if _runtime is not None:
        _runtime.stop()
    if _ops_server is not None:
        _ops_server.stop()


def worker_argv(settings: Settings, *, hostname: str | None = None) -> list[str]:
    """The arguments `deepthread worker` starts Celery with."""
    argv = ["worker", "--pool=threads", f"--concurrency={settings.worker_concurrency}", f"--queues={QUEUE_NAME}",
            f"--loglevel={settings.log_level}", "--without-gossip", "--without-mingle", "--without-heartbeat"]
    if hostname:
        argv.append(f"--hostname={hostname}")
    return argv
