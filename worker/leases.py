"""The reaper's pass over expired leases, and the names this worker's leases go by (the leases are storage.leases)."""

from __future__ import annotations

import datetime as dt
import uuid

from storage.db import Sessions
from storage.leases import end_orphaned_runs, resubmit_expired
from worker.queue import TASK_BY_MODE, SendTask


def reap(sessions: Sessions, send_task: SendTask, now: dt.datetime | None = None) -> list[int]:
    """Send again the runs whose lease expired (a dead worker, a lost task), and end the terminal's runs whose process
    died; returns the ids of the runs sent again."""
    resubmitted = resubmit_expired(sessions, now)
    for run_id, mode, task_id in resubmitted:
        send_task(TASK_BY_MODE[mode], run_id, task_id)
    end_orphaned_runs(sessions, now)
    return [run_id for run_id, _, _ in resubmitted]


def worker_identity() -> str:
    """A name for this worker thread's leases, unique across machines and restarts."""
    import os
    import socket
    import threading

    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}:{uuid.uuid4().hex[:6]}"
