"""Watches as SQL: made from a finished report, listed by channel, paused, resumed and deleted by their owner or an
admin, and fired by the beat's tick.

Every time here is the database's clock (`storage.db.database_now`) unless the caller passes `now` (tests inject
one): a tick claims a due watch for a while (`claim_due`), then fires it (`fire_claimed`): the run is stored and the
watch's next due time moved past now in one transaction that first checks the claim is still its own. Two beats, many
workers, or machines whose clocks disagree therefore fire each due time once; a window missed while everything was
down fires once when a tick comes, since the next due time is the first one after *now*, not after the missed one.

A fired run of a watch that opens a thread of its own is stored in a conversation whose thread is a placeholder
(`PENDING_THREAD_PREFIX`): it has no thread yet. Its delivery opens one, with a headline, only when there is
something to say (`worker.watch_delivery`), and records it with `open_pending_thread`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Collection
from typing import Any, Literal, NamedTuple

from sqlalchemy import delete, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from research.report import Report
from storage.admission import waiting
from storage.conversations import PRIVATE, hold_lock_of
from storage.db import Sessions, changed_rows, database_now, hold_write_lock, off_loop
from storage.deliveries import WITHOUT_REPORT
from storage.models import Conversation, ConversationFile, Message, Run, Watch, WorkspaceSetting
from storage.quotas import DailyQuotas, quota_reached
from storage.vocabulary import (
    CADENCE_DAYS,
    PENDING_THREAD_PREFIX,
    WATCH_ACTIVE,
    WATCH_PAUSED,
    WATCH_STOPPED,
    RunOptions,
    SkipReason,
    WatchLimits,
    WatchSchedule,
    WatchState,
)

WatchAction = Literal["pause", "resume", "delete"]
FireOutcome = Literal["fired", "skipped"]


class WatchRefused(Exception):
    """A watch cannot be made or changed; `str(error)` says why, in plain words for the person who asked."""


@dataclasses.dataclass(frozen=True)
class WatchView:
    """A watch as it is listed and shown: its row's fields, detached, and its latest run's state."""

    id: int
    platform: str
    workspace: str
    channel: str
    thread: str
    created_by: str
    question: str
    options: RunOptions
    schedule: WatchSchedule
    one_thread: bool
    state: WatchState
    stopped_reason: str | None
    next_due_at: dt.datetime
    last_run_id: int | None
    last_fired_at: dt.datetime | None
    fired: int
    visibility: str

    @classmethod
    def of(cls, watch: Watch) -> WatchView:
        return cls(**{field.name: getattr(watch, field.name) for field in dataclasses.fields(cls)})


class Fired(NamedTuple):
    """What a tick did with one claimed watch: a run stored (`run_id`), or the window skipped and why (`reason`);
    `watch` as it was when fired."""

    outcome: FireOutcome
    watch: WatchView
    run_id: int | None = None
    reason: SkipReason | None = None


class FiringLimits(NamedTuple):
    """The caps a fired run meets like any other: the daily quotas and the waiting-queue caps (None/0: off)."""

    quotas: DailyQuotas
    max_waiting: int | None = None
    max_waiting_in_workspace: int | None = None

    @classmethod
    def from_settings(cls, settings: Any) -> FiringLimits:
        return cls(DailyQuotas.from_settings(settings), max_waiting=settings.max_queued_per_user,
                   max_waiting_in_workspace=settings.max_queued_per_workspace)


def _now(session: Session, now: dt.datetime | None) -> dt.datetime:
    return now if now is not None else database_now(session)


def _active_in(session: Session, workspace: str, platform: str) -> int:
    return session.scalar(select(func.count()).select_from(Watch).where(
        Watch.platform == platform, Watch.workspace == workspace, Watch.state == WATCH_ACTIVE)) or 0


def _check_limits(session: Session, limits: WatchLimits, *, platform: str, workspace: str,
                  schedule: WatchSchedule) -> None:
    if CADENCE_DAYS[schedule.cadence] < CADENCE_DAYS[limits.min_interval]:
        raise WatchRefused(f"Watches here repeat at most {limits.min_interval}: choose {limits.min_interval} or "
                           "less often.")
    if limits.max_active:  # the caller holds the workspace's watches lock (`_refuse_twin`): two at the cap, one gets it
        active = _active_in(session, workspace, platform)
        if active >= limits.max_active:
            raise WatchRefused(f"This workspace already has {active} active watches, the most it may have. Pause or "
                               "delete one (`/watches`) first.")


def _refuse_twin(session: Session, *, platform: str, workspace: str, channel: str, question: str,
                 but: int | None = None) -> None:
    """Raise WatchRefused when another watch (not `but`) of `question` in `channel` is not stopped; first takes the
    workspace's watches lock, held to the commit, so two makes or resumes at once (a double click) let one through."""
    hold_lock_of(session, f"watches:{platform}:{workspace}")
    query = select(Watch).where(Watch.platform == platform, Watch.channel == channel, Watch.question == question,
                                Watch.state != WATCH_STOPPED)
    twin = session.scalar(query if but is None else query.where(Watch.id != but))
    if twin is not None:
        raise WatchRefused(f"This question is already watched here by watch #{twin.id} "
                           f"({twin.schedule.describe()}); see `/watches`.")


def create_watch(sessions: Sessions, *, run_id: int, by: str, schedule: WatchSchedule, one_thread: bool,
                 limits: WatchLimits, now: dt.datetime | None = None,
                 where: tuple[str, str, str] | None = None) -> WatchView:
    """A watch of run `run_id`'s question, made by `by`, firing first at the schedule's next time after now; raises
    WatchRefused when the run cannot be watched (not a finished research run, or not one of channel `where`,
    platform, workspace and channel, when given) or a limit refuses."""
    with sessions.begin() as session:
        run = session.get(Run, run_id)
        if run is None or (where is not None and (run.conversation.platform, run.workspace,
                                                  run.conversation.channel) != where):
            raise WatchRefused(f"There is no run {run_id} here.")
        if run.mode != "research" or run.state != "done" or run.report_json is None:
            raise WatchRefused("Only a finished research report can be watched.")
        conversation = run.conversation
        if conversation.thread.startswith(PENDING_THREAD_PREFIX):
            raise WatchRefused("That report has no thread to watch from.")
        _refuse_twin(session, platform=conversation.platform, workspace=conversation.workspace,
                     channel=conversation.channel, question=run.question)
        _check_limits(session, limits, platform=conversation.platform, workspace=conversation.workspace,
                      schedule=schedule)
        moment = _now(session, now)
        watch = Watch(platform=conversation.platform, workspace=conversation.workspace, channel=conversation.channel,
                      thread=conversation.thread, visibility=conversation.visibility or PRIVATE, created_by=by,
                      question=run.question, options=run.options.carried(), schedule=schedule, one_thread=one_thread,
                      state=WATCH_ACTIVE, next_due_at=schedule.next_after(moment), origin_run_id=run.id,
                      last_run_id=run.id, created_at=moment)
        session.add(watch)
        session.flush()
        return WatchView.of(watch)


def watch_of(sessions: Sessions, watch_id: int) -> WatchView | None:
    """Watch `watch_id`, or None."""
    with sessions() as session:
        watch = session.get(Watch, watch_id)
        return WatchView.of(watch) if watch is not None else None


def watches_in(sessions: Sessions, *, platform: str, workspace: str, channel: str | None = None) -> list[WatchView]:
    """The watches of a channel (every channel of the workspace when `channel` is None), oldest first."""
    query = select(Watch).where(Watch.platform == platform, Watch.workspace == workspace).order_by(Watch.id)
    if channel is not None:
        query = query.where(Watch.channel == channel)
    with sessions() as session:
        return [WatchView.of(watch) for watch in session.scalars(query)]


def all_watches(sessions: Sessions) -> list[WatchView]:
    """Every watch, oldest first (`deepthread runs`, exports)."""
    with sessions() as session:
        return [WatchView.of(watch) for watch in session.scalars(select(Watch).order_by(Watch.id))]


def may_change(watch: WatchView, user: str, admins: Collection[str]) -> bool:
    """Whether `user` may pause, resume or delete `watch`: its owner, or an admin."""
    return user == watch.created_by or user in admins


def change_watch(sessions: Sessions, watch_id: int, action: WatchAction, *, by: str, admins: Collection[str],
                 limits: WatchLimits, now: dt.datetime | None = None,
                 where: tuple[str, str] | None = None) -> WatchView | None:
    """Pause, resume or delete watch `watch_id` as `by`; returns the watch as it is now (None once deleted); raises
    WatchRefused when `by` is neither its owner nor an admin, when it is not a watch of workspace `where` (platform,
    workspace) when given, or when a resume would pass the workspace's cap.

    A resumed watch fires next at its first time after now: the windows it missed while paused are not made up."""
    with sessions.begin() as session:
        watch = session.get(Watch, watch_id)
        if watch is None or (where is not None and (watch.platform, watch.workspace) != where):
            raise WatchRefused(f"There is no watch #{watch_id} here.")
        if not may_change(WatchView.of(watch), by, admins):
            raise WatchRefused(f"Only the person who made this watch, or an admin, can {action} it.")
        if action == "delete":
            session.delete(watch)
            return None
        if action == "pause":
            watch.state = WATCH_PAUSED
        elif watch.state != WATCH_ACTIVE:
            _refuse_twin(session, platform=watch.platform, workspace=watch.workspace, channel=watch.channel,
                         question=watch.question, but=watch.id)
            _check_limits(session, limits, platform=watch.platform, workspace=watch.workspace,
                          schedule=watch.schedule)
            watch.state, watch.stopped_reason = WATCH_ACTIVE, None
            watch.next_due_at = watch.schedule.next_after(_now(session, now))
        watch.claimed_by = watch.claimed_until = None
        session.flush()
        return WatchView.of(watch)


def claim_due(sessions: Sessions, owner: str, *, claim_seconds: float, now: dt.datetime | None = None,
              limit: int = 100) -> list[int]:
    """Claim, for `claim_seconds` on the database's clock, up to `limit` active watches that are due and unclaimed (or
    whose claim lapsed); returns their ids. Each claim is one conditional UPDATE: of two ticks, one gets a watch."""
    with sessions.begin() as session:
        moment = _now(session, now)
        unclaimed = or_(Watch.claimed_until.is_(None), Watch.claimed_until <= moment)
        due = list(session.scalars(select(Watch.id).where(Watch.state == WATCH_ACTIVE, Watch.next_due_at <= moment,
                                                          unclaimed).order_by(Watch.next_due_at).limit(limit)))
    claimed = []
    for watch_id in due:
        with sessions.begin() as session:
            moment = _now(session, now)
            taken = session.execute(update(Watch).where(
                Watch.id == watch_id, Watch.state == WATCH_ACTIVE, Watch.next_due_at <= moment,
                or_(Watch.claimed_until.is_(None), Watch.claimed_until <= moment),
            ).values(claimed_by=owner, claimed_until=moment + dt.timedelta(seconds=claim_seconds))
                .execution_options(synchronize_session=False))
            if changed_rows(taken):
                claimed.append(watch_id)
    return claimed


def fire_claimed(sessions: Sessions, watch_id: int, owner: str, *, limits: FiringLimits,
                 now: dt.datetime | None = None) -> Fired | None:
    """Store the run of a watch this tick claimed, or skip its window (a quota or a queue cap refuses, or its one
    thread is busy), and move its next due time past now, in one transaction; None when the claim is no longer
    `owner`'s (it lapsed and another tick took the watch) or the watch was paused or deleted meanwhile."""
    with sessions.begin() as session:
        hold_write_lock(session, Watch.id)  # SQLite: the check below and the writes after it in one write transaction
        moment = _now(session, now)
        watch = session.get(Watch, watch_id, with_for_update=True)
        if watch is None or watch.state != WATCH_ACTIVE or watch.claimed_by != owner or watch.claimed_until is None \
                or watch.claimed_until <= moment:
            return None
        view = WatchView.of(watch)
        watch.next_due_at = watch.schedule.next_after(moment)
        watch.last_fired_at = moment
        watch.claimed_by = watch.claimed_until = None
        reason = _refusal(session, watch, limits, moment)
        if reason is not None:
            return Fired("skipped", view, reason=reason)
        try:
            with session.begin_nested():
                run = _store_fired_run(session, watch, moment)
        except IntegrityError:  # its one thread has a run in flight (the one-per-thread index)
            return Fired("skipped", view, reason=SkipReason("thread_busy"))
        watch.last_run_id = run.id
        watch.fired += 1
        return Fired("fired", view, run_id=run.id)


def _refusal(session: Session, watch: Watch, limits: FiringLimits, moment: dt.datetime) -> SkipReason | None:
    """Why this window's run may not start (the same quotas and queue caps as a person's run), or None."""
    reached = quota_reached(session, limits.quotas, user=watch.created_by, workspace=watch.workspace, now=moment)
    if reached is not None:
        return SkipReason(reached.limit, reached.allowed)
    if limits.max_waiting_in_workspace:
        hold_lock_of(session, f"workspace:{watch.workspace}")
        waiting_here = session.scalar(select(func.count()).select_from(Run).where(
            Run.workspace == watch.workspace, waiting())) or 0
        if waiting_here >= limits.max_waiting_in_workspace:
            return SkipReason("workspace_queue", waiting_here)
    if limits.max_waiting is not None:
        hold_lock_of(session, watch.created_by)
        waiting_now = session.scalar(select(func.count()).select_from(Run).where(
            Run.requested_by == watch.created_by, waiting())) or 0
        if waiting_now >= limits.max_waiting:
            return SkipReason("owner_queue", waiting_now)
    return None


def _store_fired_run(session: Session, watch: Watch, moment: dt.datetime) -> Run:
    if watch.one_thread:
        conversation = session.scalar(select(Conversation).where(
            Conversation.platform == watch.platform, Conversation.workspace == watch.workspace,
            Conversation.channel == watch.channel, Conversation.thread == watch.thread))
    else:
        conversation = None
    if conversation is None:
        thread = watch.thread if watch.one_thread else f"{PENDING_THREAD_PREFIX}{uuid.uuid4().hex}"
        conversation = Conversation(platform=watch.platform, workspace=watch.workspace, channel=watch.channel,
                                    thread=thread, created_by=watch.created_by, visibility=watch.visibility,
                                    created_at=moment)
        session.add(conversation)
        # The files shared where the watch was made are sources of each of its runs, as they were of that report.
        origin_conversation = (session.scalar(select(Run.conversation_id).where(Run.id == watch.origin_run_id))
                               if watch.origin_run_id is not None and not watch.one_thread else None)
        if origin_conversation is not None:
            session.add_all(ConversationFile(conversation=conversation, file_id=shared.file_id, name=shared.name,
                                             size=shared.size, mimetype=shared.mimetype, url=shared.url,
                                             link=shared.link, shared_by=shared.shared_by, created_at=shared.created_at)
                            for shared in session.scalars(select(ConversationFile).where(
                                ConversationFile.conversation_id == origin_conversation)))
    session.add(Message(conversation=conversation, role="user", author=watch.created_by, text=watch.question,
                        mode="research", created_at=moment))
    run = Run(conversation=conversation, workspace=watch.workspace, mode="research", question=watch.question,
              options=watch.options, requested_by=watch.created_by, watch_id=watch.id, created_at=moment)
    session.add(run)
    session.flush()
    return run


def stop_watch(sessions: Sessions, watch_id: int, reason: str) -> WatchView | None:
    """Stop watch `watch_id` for good with `reason`; returns it when this call stopped it (so its owner is told once),
    None when it was already stopped or is gone."""
    with sessions.begin() as session:
        stopped = session.execute(update(Watch).where(Watch.id == watch_id, Watch.state != WATCH_STOPPED).values(
            state=WATCH_STOPPED, stopped_reason=reason, claimed_by=None, claimed_until=None)
            .execution_options(synchronize_session=False))
        if not changed_rows(stopped):
            return None
        watch = session.get(Watch, watch_id)
        return WatchView.of(watch) if watch is not None else None


def stop_watches_of(sessions: Sessions, *, platform: str, workspace: str, reason: str,
                    created_by: str | None = None, channel: str | None = None) -> list[WatchView]:
    """Stop the watches of a workspace (of one owner, or one channel, when given) with `reason`; returns those this
    call stopped."""
    query = select(Watch.id).where(Watch.platform == platform, Watch.workspace == workspace, Watch.state != WATCH_STOPPED)
    if created_by is not None:
        query = query.where(Watch.created_by == created_by)
    if channel is not None:
        query = query.where(Watch.channel == channel)
    with sessions() as session:
        ids = list(session.scalars(query))
    return [view for watch_id in ids if (view := stop_watch(sessions, watch_id, reason)) is not None]


def delete_watches_of(session: Session, *, platform: str | None, workspace: str) -> int:
    """Delete a workspace's watches and its time zone setting (runs that are left keep their rows, without their
    watch); returns how many watches (`prune --workspace`, an uninstall)."""
    query = delete(Watch).where(Watch.workspace == workspace)
    setting = delete(WorkspaceSetting).where(WorkspaceSetting.workspace == workspace)
    if platform is not None:
        query = query.where(Watch.platform == platform)
        setting = setting.where(WorkspaceSetting.platform == platform)
    session.execute(setting.execution_options(synchronize_session=False))
    return changed_rows(session.execute(query.execution_options(synchronize_session=False)))


class PreviousRun(NamedTuple):
    """The run a watch's new run is compared with, and where it was posted."""

    run_id: int
    finished_at: dt.datetime | None
    thread: str
    watch_id: int | None = None
    schedule: str = ""  # the watch's schedule in words (`every Monday at 09:00 (Europe/Paris)`)


def previous_run(sessions: Sessions, run_id: int) -> PreviousRun | None:
    """What run `run_id` of a watch is compared with — the newest earlier run of the watch that finished with a
    report, else the run the watch was made from — and the thread where the watch last spoke (its quiet line goes
    there); None when run `run_id` is not a watch's or nothing is left to compare with."""
    with sessions() as session:  # asked by a watch's run and again by its delivery: no report read here
        run = session.get(Run, run_id, options=WITHOUT_REPORT)
        if run is None or run.watch_id is None:
            return None
        watch = session.get(Watch, run.watch_id)
        compared = session.scalar(select(Run).where(
            Run.watch_id == run.watch_id, Run.id < run_id, Run.state == "done", Run.report_json.is_not(None))
            .options(*WITHOUT_REPORT).order_by(Run.id.desc()).limit(1))
        if compared is None and watch is not None and watch.origin_run_id is not None:
            compared = session.get(Run, watch.origin_run_id, options=WITHOUT_REPORT)
        if compared is None:
            return None
        made_in = watch.thread if watch is not None else compared.conversation.thread
        thread = made_in if watch is not None and watch.one_thread else (
            _latest_thread(session, run.watch_id, before=run_id) or made_in)
        return PreviousRun(compared.id, compared.finished_at, thread,
                           watch_id=run.watch_id, schedule=watch.schedule.describe() if watch is not None else "")


def _latest_thread(session: Session, watch_id: int, *, before: int | None = None) -> str | None:
    query = select(Conversation.thread).join(Run).where(
        Run.watch_id == watch_id, Conversation.thread.not_like(f"{PENDING_THREAD_PREFIX}%"))
    if before is not None:
        query = query.where(Run.id < before)
    return session.scalar(query.order_by(Run.id.desc()).limit(1))


def latest_thread(sessions: Sessions, watch_id: int, thread: str) -> str:
    """The thread of the newest run of watch `watch_id` that has one, else `thread` (where it was made)."""
    with sessions() as session:
        return _latest_thread(session, watch_id) or thread


def workspace_timezone(sessions: Sessions, *, platform: str, workspace: str) -> str:
    """The time zone a workspace set for its watches (`UTC` until one is set)."""
    with sessions() as session:
        setting = session.get(WorkspaceSetting, (platform, workspace))
        return setting.timezone if setting is not None else "UTC"


def set_workspace_timezone(sessions: Sessions, *, platform: str, workspace: str, timezone: str, by: str,
                           now: dt.datetime | None = None) -> None:
    """Set the time zone of a workspace's new watches (an IANA name, checked by the caller)."""
    with sessions.begin() as session:
        setting = session.get(WorkspaceSetting, (platform, workspace))
        if setting is None:
            setting = WorkspaceSetting(platform=platform, workspace=workspace)
            session.add(setting)
        setting.timezone, setting.updated_by = timezone, by
        setting.updated_at = _now(session, now)


def stored_report(sessions: Sessions, run_id: int) -> Report | None:
    """Run `run_id`'s stored report, or None."""
    with sessions() as session:
        report_json = session.scalar(select(Run.report_json).where(Run.id == run_id))
    return Report.model_validate(report_json) if report_json is not None else None


def open_pending_thread(sessions: Sessions, run_id: int, thread: str, status_message: dict[str, object] | None,
                        status_message_id: str | None) -> None:
    """Record the thread a watch's run opened (its conversation's placeholder replaced) and its status message."""
    with sessions.begin() as session:
        run = session.get(Run, run_id)
        if run is None:
            return
        run.conversation.thread = thread
        if status_message is not None:
            run.status_message, run.status_message_id = dict(status_message), status_message_id
        watch = session.get(Watch, run.watch_id) if run.watch_id is not None else None
        if watch is not None and watch.one_thread:
            watch.thread = thread


def is_pending(thread: str | None) -> bool:
    """Whether `thread` is a fired watch run's placeholder (no thread opened yet)."""
    return bool(thread) and str(thread).startswith(PENDING_THREAD_PREFIX)


acreate_watch = off_loop(create_watch)
awatch_of = off_loop(watch_of)
awatches_in = off_loop(watches_in)
achange_watch = off_loop(change_watch)
aclaim_due = off_loop(claim_due)
afire_claimed = off_loop(fire_claimed)
astop_watch = off_loop(stop_watch)
astop_watches_of = off_loop(stop_watches_of)
aprevious_run = off_loop(previous_run)
aopen_pending_thread = off_loop(open_pending_thread)
alatest_thread = off_loop(latest_thread)
astored_report = off_loop(stored_report)
aworkspace_timezone = off_loop(workspace_timezone)
aset_workspace_timezone = off_loop(set_workspace_timezone)
