"""Celery beat: the process that sends the workers the watch tick every WATCH_TICK_SECONDS.

Beat only sends; a worker runs `deepthread.watch_tick`, which claims the due watches in the database, so a second beat
(on this machine or another) only adds ticks and never runs a watch twice. The schedule is one plain interval, with
nothing worth remembering across restarts, so beat keeps it in memory: it writes no schedule file and no pid file,
neither in the working directory nor in a DATA_DIR that two beats could share. A tick left waiting on the queue for
a tick's time expires, so workers back from an outage drop the backlog instead of running it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from worker.queue import QUEUE_NAME

if TYPE_CHECKING:
    from celery import Celery

    from config import Settings

WATCH_TICK_TASK = "deepthread.watch_tick"
# Celery's base scheduler keeps the schedule in memory; its default (PersistentScheduler) writes a shelve file,
# which two beats on one DATA_DIR would fight over (gdbm locks it; dbm.dumb has no lock and gets corrupted).
IN_MEMORY_SCHEDULER = "celery.beat:Scheduler"


def beat_schedule(settings: Settings) -> dict[str, dict[str, Any]]:
    """Celery's `beat_schedule`: the watch tick every WATCH_TICK_SECONDS on the workers' queue, expiring a tick later."""
    tick = settings.watch_tick_seconds
    return {"watch-tick": {"task": WATCH_TICK_TASK, "schedule": tick,
                           "options": {"queue": QUEUE_NAME, "expires": tick}}}


def beat_app(settings: Settings) -> Celery:
    """The workers' Celery app, on their broker (the embedded Redis, started here, when REDIS_URL is empty), with
    the watch tick scheduled."""
    from worker.tasks import configure

    app = configure(settings)
    app.conf.beat_schedule = beat_schedule(settings)
    app.conf.beat_scheduler = IN_MEMORY_SCHEDULER
    return app


def beat_argv(settings: Settings) -> list[str]:
    """The arguments `deepthread beat` starts Celery with: the schedule in memory and no pid file, so that nothing is
    written to the working directory and two beats on one machine can run."""
    return ["beat", f"--scheduler={IN_MEMORY_SCHEDULER}", "--pidfile=", f"--loglevel={settings.log_level}"]
