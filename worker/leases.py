"""The leases of a process's attempts kept alive from a thread of their own, the reaper's pass over expired leases,
and the names this worker's leases go by (the leases' SQL is storage.leases).

A lease kept by a task on the runs' event loop lapsed whenever that loop was saturated: at 500 runs
in one worker, hundreds of first attempts lost their lease and ran again. `LeaseKeeper` renews every
lease the process holds, in one transaction, from one thread, whatever the event loops are doing.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from research.budget import CancelToken
from storage.db import Sessions
from storage.leases import HeldLease, end_orphaned_runs, renew_leases, resubmit_expired

if TYPE_CHECKING:  # the queue (and Redis's client with it) is the reaper's, not every attempt's
    from worker.queue import SendTask

logger = logging.getLogger(__name__)

# What an attempt whose lease was lost is cancelled by: it stops, and stores nothing.
LEASE_LOST = "lease lost"


@dataclass
class _Kept:
    loop: asyncio.AbstractEventLoop
    token: CancelToken
    renewed_at: float
    confirmed_at: float  # when the lease was last asked for and granted: it lasts a whole lease from then


class LeaseKeeper:
    """Renews the leases of every attempt this process executes, every third of a lease, from its own thread.

    An attempt whose lease was lost (a newer attempt took the run, or it ended), or that could not be
    renewed for a whole lease (the database unreachable), has its cancel token cancelled with
    LEASE_LOST in its own event loop, and stops without storing anything.
    """

    def __init__(self, sessions: Sessions, lease_seconds: float, *, interval: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.sessions = sessions
        self.lease_seconds = lease_seconds
        self.interval = interval if interval is not None else lease_seconds / 3
        self._clock = clock
        self._held: dict[HeldLease, _Kept] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False

    @contextmanager
    def keeping(self, lease: HeldLease, token: CancelToken, *, taken_at: float = -math.inf) -> Iterator[None]:
        """Keep `lease` while in the block; a loss cancels `token` (from the running loop's thread). `taken_at` is
        when the lease was asked for (on this keeper's clock), if known: `holds` trusts it until the first renewal."""
        kept = _Kept(asyncio.get_running_loop(), token, renewed_at=self._clock(), confirmed_at=taken_at)
        with self._lock:
            self._held[lease] = kept
            if self._thread is None and not self._stopping.is_set():
                self._thread = threading.Thread(target=self._loop, name="deepthread-lease-keeper", daemon=True)
                self._thread.start()
        try:
            yield
        finally:
            with self._lock:
                if self._held.get(lease) is kept:
                    del self._held[lease]

    def holds(self, lease: HeldLease) -> bool:
        """Whether `lease` is surely still this process's, without asking the database: kept here, and asked for and
        granted less than two thirds of a lease ago (a third is left for the clocks and the statements between). No
        other attempt can take a run before its lease has lapsed."""
        with self._lock:
            kept = self._held.get(lease)
            return kept is not None and self._clock() - kept.confirmed_at < self.lease_seconds * 2 / 3

    def renew(self) -> None:
        """One pass: renew every held lease, and stop the attempts whose lease is lost or has lapsed unrenewed."""
        with self._lock:
            held = dict(self._held)
        if not held:
            return
        started = self._clock()
        try:
            lost = renew_leases(self.sessions, list(held), self.lease_seconds)
        except Exception as error:  # a busy database: try again next pass, but never outlive a lease unnoticed
            if not self._failing:
                logger.warning("could not renew %s leases (%s); trying again in %g s", len(held), type(error).__name__,
                               self.interval)
            self._failing = True
            lost = {lease for lease, kept in held.items() if started - kept.renewed_at >= self.lease_seconds}
        else:
            self._failing = False
            for lease, kept in held.items():
                if lease not in lost:
                    kept.renewed_at = kept.confirmed_at = started
        for lease in lost:
            kept = held[lease]
            kept.confirmed_at = -math.inf  # not this attempt's any more, whatever its last renewal said
            logger.warning("run %s attempt %s lost its lease; stopping it", lease.run_id, lease.attempt)
            kept.token.cancel_from_thread(kept.loop, LEASE_LOST)

    def stop(self) -> None:
        """Renew no more (the thread ends at its next wake-up)."""
        self._stopping.set()

    def _loop(self) -> None:
        while not self._stopping.wait(self.interval):
            try:
                self.renew()
            except Exception:
                logger.warning("lease renewal pass failed", exc_info=True)


def reap(sessions: Sessions, send_task: SendTask, now: dt.datetime | None = None) -> list[int]:
    """Send again the runs whose lease expired (a dead worker, a lost task), and end the terminal's runs whose process
    died; returns the ids of the runs sent again."""
    from worker.queue import TASK_BY_MODE

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
