"""A run's voice in its thread: coalesced status edits while it works, then the report, delivered once.

Before posting the report the run records the intent; after each post, the message reference.
A retried delivery edits the recorded messages instead of posting new ones. Every edit and post
first checks that this attempt still owns the run, so a stale attempt cannot deliver.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from chat.message import Messenger, MessageRef, Place
from chat.platform import Outbound
from chat.render import PlatformRenderer
from chat.state import RunProgress, initial_progress
from research.report import Report
from storage.models import Run, utcnow
from worker.leases import holds_attempt
from worker.progress import EditBudget, StatusEditor

logger = logging.getLogger(__name__)

UPLOADED_FILE = "file"
# How long the engine waits for the first status edit (a rate-limited Slack must not hold the research up).
FIRST_EDIT_WAIT_SECONDS = 2.0


def platform_user(user: str) -> str:
    """`slack:U123` → `U123`: the id as the platform knows it."""
    return user.split(":", 1)[1] if ":" in user else user


@dataclass(frozen=True)
class DeliveryTarget:
    """Where a run speaks: its thread, its status message, and whom its report mentions."""

    run_id: int
    place: Place
    status_ref: MessageRef | None
    requester: str

    @classmethod
    def load(cls, sessions: sessionmaker[Session], run_id: int) -> DeliveryTarget | None:
        """The run's target, read once; None when the run does not exist."""
        with sessions() as session:
            run = session.get(Run, run_id)
            if run is None:
                return None
            conversation = run.conversation
            return cls(run_id=run_id,
                       place=Place(platform=conversation.platform, workspace=conversation.workspace,
                                   channel=conversation.channel, thread=conversation.thread),
                       status_ref=MessageRef.model_validate(run.status_message) if run.status_message else None,
                       requester=platform_user(run.requested_by))


class RunDelivery:
    """Edits one run's status message and posts its report, on the run's own platform."""

    def __init__(self, sessions: sessionmaker[Session], target: DeliveryTarget, *, messenger: Messenger,
                 renderer: PlatformRenderer, bucket: EditBudget, min_interval: float = 1.0) -> None:
        self.sessions = sessions
        self.run_id = target.run_id
        self.place = target.place
        self.status_ref = target.status_ref
        self.requester = target.requester
        self.messenger = messenger
        self.renderer = renderer
        self._first_shown = False
        self.editor = StatusEditor(self._edit_status, bucket=bucket, workspace=self.place.workspace,
                                   min_interval=min_interval)

    def _owns(self, attempt: int) -> bool:
        with self.sessions() as session:
            return holds_attempt(session, self.run_id, attempt)

    async def _edit_status(self, progress: RunProgress) -> None:
        if self.status_ref is None or not await asyncio.to_thread(self._owns, progress.attempt):
            return
        await self.messenger.edit(self.status_ref, self.renderer.status(progress, now=dt.datetime.now(dt.timezone.utc)))

    async def on_state(self, progress: RunProgress) -> None:
        """Show `progress`; the first state (the attempt has just started) is sent before this returns.

        The engine starts only after the message has left "queued", so the user sees the run
        start at once, not after the engine's first steps have had their turn on the event loop.
        """
        first, self._first_shown = not self._first_shown, True
        await self.editor.update(progress, wait_seconds=FIRST_EDIT_WAIT_SECONDS if first else 0.0)

    async def finish(self, progress: RunProgress) -> None:
        """The report (if the run has one), then the final status edit, each exactly once.

        The report goes first: posting is not drawn from the workspace's edit budget, so a busy
        workspace delays only the status message, never the answer.
        """
        try:
            await self.deliver_report(progress.attempt)
        except Exception as error:  # nothing may be dropped silently: say so in the thread
            logger.error("report delivery failed for run %s", self.run_id, exc_info=True)
            reason = getattr(error, "reason", None) or type(error).__name__
            notice = (f"The report of this run could not be posted ({reason}). It is saved: use the Export button "
                      f"or `deepthread export {self.run_id}`.")
            try:
                await self.messenger.post(self.place, self.renderer.notice(notice))
            except Exception:
                logger.error("could not tell the thread that run %s's report failed", self.run_id, exc_info=True)
        try:
            await self.editor.close(progress)
        except Exception:  # the report is out; a failed last edit is logged, not fatal
            logger.warning("final status edit failed for run %s", self.run_id, exc_info=True)
        await asyncio.to_thread(self._mark_delivered, progress.attempt)

    def _mark_delivered(self, attempt: int) -> None:
        with self.sessions.begin() as session:
            session.execute(update(Run).where(Run.id == self.run_id, Run.attempt == attempt)
                            .values(delivered_at=utcnow(), lease_owner=None, lease_until=None))

    def _load_for_delivery(self, attempt: int) -> tuple[Report | None, list[dict[str, Any]]]:
        with self.sessions.begin() as session:
            if not holds_attempt(session, self.run_id, attempt):
                return None, []
            run = session.get(Run, self.run_id)
            if run.report_json is None:
                return None, []
            run.delivery_intent_at = run.delivery_intent_at or utcnow()
            return Report.model_validate(run.report_json), list(run.delivered_messages or [])

    def _record(self, attempt: int, delivered: list[dict[str, Any]]) -> bool:
        with self.sessions.begin() as session:
            return bool(session.execute(
                update(Run).where(Run.id == self.run_id, Run.attempt == attempt).values(delivered_messages=delivered)
            ).rowcount)

    async def deliver_report(self, attempt: int) -> None:
        """Post the stored report into the thread; a retry edits what an earlier try posted."""
        report, delivered = await asyncio.to_thread(self._load_for_delivery, attempt)
        if report is None:
            return
        delivery = self.renderer.report(report, requester=self.requester, run_id=self.run_id)
        posted = [entry for entry in delivered if entry.get("kind") != UPLOADED_FILE]
        for index, content in enumerate(delivery.messages):
            if index < len(posted):
                await self.messenger.edit(MessageRef.model_validate(posted[index]["ref"]), content)
                continue
            if not await asyncio.to_thread(self._owns, attempt):
                return
            ref = await self.messenger.post(self.place, content)
            delivered.append({"kind": "message", "ref": ref.model_dump(mode="json")})
            await asyncio.to_thread(self._record, attempt, delivered)
        if delivery.file is not None and not any(entry.get("kind") == UPLOADED_FILE for entry in delivered):
            if not await asyncio.to_thread(self._owns, attempt):
                return
            ref = await self.messenger.upload(self.place, delivery.file)
            delivered.append({"kind": UPLOADED_FILE, "ref": ref.model_dump(mode="json") if ref else None})
            await asyncio.to_thread(self._record, attempt, delivered)


PlatformParts = Callable[[str], "Outbound | None"]


async def show_queue_positions(sessions: sessionmaker[Session], waiting: Iterable[tuple[int, int]], *,
                               platform_parts: PlatformParts, bucket: EditBudget) -> list[int]:
    """Show each waiting run's place in the queue in its status message; returns the runs edited.

    Each edit is an ordinary one of the workspace's edit budget: when the budget is down to the
    reserve kept for the running runs' phase changes, the position waits for the next refresh.
    """
    edited = []
    parts_of: dict[str, Outbound | None] = {}  # one client per platform, not per run
    for run_id, position in waiting:
        with sessions() as session:
            run = session.get(Run, run_id)
            if run is None or not run.status_message or run.state != "queued" or run.celery_task_id is not None:
                continue  # admitted or ended since the list was read: its own status is more recent
            platform, workspace = run.conversation.platform, run.conversation.workspace
            progress = initial_progress(run_id=run.id, mode=run.mode, question=run.question,
                                        requested_by=run.requested_by).model_copy(update={"queue_position": position})
            ref = MessageRef.model_validate(run.status_message)
        try:
            if platform not in parts_of:
                parts_of[platform] = platform_parts(platform)
            parts = parts_of[platform]
            if parts is None or not await bucket.take(workspace):
                continue
            await parts.messenger.edit(ref, parts.renderer.status(progress, now=dt.datetime.now(dt.timezone.utc)))
        except Exception:  # a stale position is harmless; the next refresh fixes it
            logger.warning("could not refresh queue position of run %s", run_id, exc_info=True)
            continue
        edited.append(run_id)
    return edited
