"""The conversation core: carries out what the rules decide for each normalised ChatEvent.

`handle(event)` loads what the rules need (`View`), asks `bot.conversation.rules.decide` what the
event means, and carries the actions out: it stores runs through `storage.conversations`, submits
them through `worker.queue`, and posts the root and status messages, so an adapter can acknowledge
in time. It never calls an LLM, a provider or a web page.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
from collections.abc import Callable, Sequence
from typing import Any

from bot.conversation.events import ChatEvent, Outcome, Reply
from bot.conversation.feedback import record_feedback
from bot.conversation.history import arun_history
from bot.conversation.rules import (
    REVISION_MARKER,
    Action,
    Cancel,
    CoreSettings,
    Export,
    KeepFiles,
    RecordFeedback,
    Say,
    ShowHistory,
    StartRun,
    Suggest,
    View,
    busy_reply,
    decide,
    queue_full_reply,
    workspace_queue_full_reply,
)
from bot.conversation.suggestions import PastQuestion, suggested_prompts
from bot.conversation.watches import WatchDesk
from bot.conversation.watches import handles as handles_watches
from chat.message import Content, FileUpload, MessageRef, Messenger, Place
from chat.render import PlatformRenderer
from chat.state import RunProgress, initial_progress
from chat.text import shortened, single_line
from chat.watches import tell_owner_stopped
from research.files import FileRef
from research.report import EXPORTERS, ExportFormat, Report
from storage.conversations import (
    NewRun,
    QueueFull,
    SharedFile,
    ThreadBusy,
    ThreadKey,
    adaily_quota_reached,
    ain_flight_run_started_by,
    alatest_question,
    aload_run,
    aremember_files,
    arun_by_status_message,
    astore_run,
    astore_status_message,
    athread_view,
    athread_view_of_run,
    awaiting_runs_in_workspace,
    awaiting_runs_of,
)
from storage.db import Sessions
from storage.models import Run
from storage.retention import aforget_workspace
from storage.watches import astop_watches_of, aworkspace_timezone
from worker.queue import Queue

__all__ = ["ConversationCore", "CoreSettings", "build_core"]

logger = logging.getLogger(__name__)

UNINSTALL_CANCELLER = "app uninstalled"  # who stopped the runs in flight of a workspace the app left


class ConversationCore:
    """Loads an event's view, decides with the rules, and carries the decision out (database, queue, messenger)."""

    def __init__(self, *, sessions: Sessions, queue: Queue, messenger: Messenger, renderer: PlatformRenderer,
                 settings: CoreSettings, clock: Callable[[], dt.datetime] | None = None) -> None:
        self.sessions = sessions
        self.queue = queue
        self.messenger = messenger
        self.renderer = renderer
        self.settings = settings
        self.clock = clock or _now  # the daily quotas' day and reset time
        self.watches = WatchDesk(sessions, renderer, admins=settings.admins, limits=settings.watch_limits)

    async def forget_workspace(self, platform: str, workspace: str) -> None:
        """Delete every thread of `workspace` on `platform` with its messages and runs (the app was removed there); its
        runs in flight are stopped instead, their threads kept until a `deepthread prune --workspace` once they end."""
        forgotten = await aforget_workspace(self.sessions, workspace, by=UNINSTALL_CANCELLER, platform=platform)
        for run_id in forgotten.running:  # marked on its row; the flag in Redis reaches its worker sooner
            await asyncio.to_thread(self.queue.flag_cancel, run_id, UNINSTALL_CANCELLER)
        logger.info("deleted what was stored of a workspace the app left: %d conversations, %d messages, %d runs; "
                    "kept %d conversations with a run in flight (%d runs stopped)", forgotten.conversations,
                    forgotten.messages, forgotten.runs, forgotten.kept_conversations, len(forgotten.in_flight))

    async def workspace_timezone(self, platform: str, workspace: str) -> str:
        """The IANA time zone a workspace set for its watches; UTC until one is set."""
        return await aworkspace_timezone(self.sessions, platform=platform, workspace=workspace)

    async def stop_watches(self, platform: str, workspace: str, *, reason: str, owner: str | None = None,
                           channel: str | None = None) -> None:
        """Stop the watches of a workspace whose owner left, or whose channel is gone, saying why in `/watches`."""
        stopped = await astop_watches_of(self.sessions, platform=platform, workspace=workspace, reason=reason,
                                         created_by=owner, channel=channel)
        if stopped:
            logger.info("stopped %d watches: %s", len(stopped), reason)
        if owner is None:  # an owner who left cannot be told; the others are, once, where the platform lets the bot
            for watch in stopped:
                await tell_owner_stopped(self.messenger, self.renderer, watch)

    async def handle(self, event: ChatEvent) -> Outcome:
        """What `event` means, done; replies for the adapter to deliver are in the outcome."""
        if handles_watches(event):
            return await self.watches.handle(event)
        view = await self._view(event)
        actions = decide(event, view, self.settings)
        if any(isinstance(action, StartRun) for action in actions):
            # The queue cap and quotas are read only when the rules would start a run, then the rules decide again.
            view = await self._with_admission(event, view)
            actions = decide(event, view, self.settings)
        outcome = Outcome()
        for action in actions:
            outcome = _merged(outcome, await self._carry_out(event, action))
        return outcome

    # -- the view ----------------------------------------------------------------------------------

    async def _view(self, event: ChatEvent) -> View:
        now = self.clock()
        if event.kind in ("reaction", "action"):
            target = await self._target(event)
            return View(now=now, target=target,
                        target_thread=await athread_view_of_run(self.sessions, target) if target is not None else None)
        if event.kind == "opened" or (event.kind == "command" and event.thread is None):
            return View(now=now)  # nothing in a thread to read: a new conversation
        thread = event.thread or event.message_id or ""
        return View(now=now, thread=await athread_view(self.sessions, _key(event, thread)))

    async def _target(self, event: ChatEvent) -> Run | None:
        """The run a reaction or button is about: the one it names, or whose status message it is on; a cancel
        reaction on the message that started a run (its thread's root, or its question) means that run."""
        if event.kind == "action" and event.action_run_id is not None:
            return await aload_run(self.sessions, event.action_run_id)
        if not event.message_id:
            return None
        run = await arun_by_status_message(self.sessions, platform=event.platform, channel=event.channel,
                                           message_id=event.message_id)
        if run is None and event.kind == "reaction" and event.reaction in self.settings.cancel_emoji:
            run = await ain_flight_run_started_by(self.sessions, platform=event.platform, workspace=event.workspace,
                                                  channel=event.channel, message_id=event.message_id)
        return run

    async def _with_admission(self, event: ChatEvent, view: View) -> View:
        waiting = await awaiting_runs_of(self.sessions, event.user)
        in_workspace = (await awaiting_runs_in_workspace(self.sessions, event.workspace)
                        if self.settings.max_queued_per_workspace else 0)
        quota = await adaily_quota_reached(self.sessions, self.settings.daily_quotas, user=event.user,
                                           workspace=event.workspace, now=view.now)
        return dataclasses.replace(view, waiting_runs=waiting, workspace_waiting_runs=in_workspace, quota=quota)

    # -- carrying out --------------------------------------------------------------------------------

    async def _carry_out(self, event: ChatEvent, action: Action) -> Outcome:
        match action:
            case Say(reply=reply, thread=thread):
                return Outcome(replies=[reply], thread=thread)
            case StartRun():
                return await self._start(event, action)
            case Cancel(run=run):
                return await self._cancel(event, run)
            case Export(run=run, thread=thread, output_format=output_format):
                return await self._export(event, run, thread, output_format)
            case RecordFeedback(run=run):
                return await record_feedback(self.sessions, event, run, self.clock())
            case ShowHistory():
                history = await arun_history(self.sessions, platform=event.platform, workspace=event.workspace,
                                             channel=event.channel, user=event.user)
                content = self.renderer.history(history)
                return Outcome(replies=[_private(content.text, content)])
            case Suggest():
                return Outcome(suggestions=suggested_prompts(await self._latest_question(event)))
            case KeepFiles(thread=thread, files=files):
                await aremember_files(self.sessions, _key(event, thread), shared_files(files), shared_by=event.user,
                                      visibility=event.channel_visibility)
                return Outcome(thread=thread)

    async def _start(self, event: ChatEvent, start: StartRun) -> Outcome:
        """Store the run, post its status message in the thread (or open a thread with it), then submit it."""
        thread, status = start.thread, None
        if thread is None:
            waiting = initial_progress(run_id=0, mode=start.mode, question=start.question, requested_by=event.user,
                                       files_only=start.options.files_only)
            opened = await self.messenger.open_thread(
                Place(platform=event.platform, workspace=event.workspace, channel=event.channel),
                title=self.renderer.notice(start.title or start.question),
                status=self.renderer.status(waiting, now=_now()))
            thread, status = opened.thread, opened.status
        key = _key(event, thread)
        new = NewRun(key=key, mode=start.mode, question=start.question, requested_by=event.user, options=start.options,
                     plan=start.plan, message_id=event.message_id, visibility=event.channel_visibility,
                     history=start.history, files=shared_files(start.files))
        try:
            run_id = await astore_run(self.sessions, new, max_waiting=self.settings.max_queued_per_user,
                                      max_waiting_in_workspace=self.settings.max_queued_per_workspace)
        except QueueFull as full:
            # Another command (of this person's, or in this workspace) was stored since the rules counted.
            refusal = (workspace_queue_full_reply(full.waiting, self.settings) if full.scope == "workspace"
                       else queue_full_reply(full.waiting, self.settings))
            if status is not None:  # the thread opened for this run says it did not start
                await self.messenger.edit(status, self.renderer.notice(f"Not started: {refusal.text}"))
            return Outcome(replies=[refusal], thread=start.thread)
        except ThreadBusy:
            view = await athread_view(self.sessions, key)
            if view is None or view.active is None:
                raise
            return Outcome(replies=[busy_reply()], thread=thread)
        place = Place(platform=event.platform, workspace=event.workspace, channel=event.channel, thread=thread)
        progress = initial_progress(run_id=run_id, mode=start.mode, question=start.question, requested_by=event.user,
                                    files_only=start.options.files_only)
        if status is None:
            status = await self.messenger.post(place, self.renderer.status(progress, now=_now()))
        await astore_status_message(self.sessions, run_id, status.model_dump(mode="json"), status.message_id)
        position = await asyncio.to_thread(self.queue.submit, run_id)  # admission takes a Redis lock: off the loop
        if position is not None:
            waiting = progress.model_copy(update={"queue_position": position})
            await self.messenger.edit(status, self.renderer.status(waiting, now=_now()))
        return Outcome(run_id=run_id, thread=thread, title=start.question if start.names_conversation else None)

    async def _cancel(self, event: ChatEvent, run: Run) -> Outcome:
        state = await asyncio.to_thread(self.queue.cancel, run.id, event.user)
        if state == "cancelled" and run.status_message:
            # A queued run never reaches a worker, so its status message is ended here.
            stopped = RunProgress.for_run(run, state="cancelled", cancelled_by=event.user)
            await self.messenger.edit(MessageRef.model_validate(run.status_message),
                                      self.renderer.status(stopped, now=_now()))
        return Outcome(cancelled_run_id=run.id)

    async def _export(self, event: ChatEvent, run: Run, thread: str, output_format: ExportFormat) -> Outcome:
        """Attach the run's report in its thread as a Markdown, HTML or JSON file."""
        if run.report_json is None:
            return Outcome(replies=[_private("That run has no report to export.")])
        report = Report.model_validate(run.report_json)
        report.run_id = run.id
        place = Place(platform=event.platform, workspace=event.workspace, channel=event.channel, thread=thread)
        await self.messenger.upload(place, FileUpload(filename=f"deepthread-report-{run.id}.{output_format}",
                                                      data=EXPORTERS[output_format](report).encode("utf-8"),
                                                      title=shortened(single_line(report.title), 200)))
        return Outcome()

    async def _latest_question(self, event: ChatEvent) -> PastQuestion | None:
        last = await alatest_question(self.sessions, platform=event.platform, workspace=event.workspace,
                                      user=event.user)
        if last is None:
            return None
        mode, question = last
        return PastQuestion(mode=mode, question=question.split(REVISION_MARKER, 1)[0])


def _key(event: ChatEvent, thread: str) -> ThreadKey:
    return ThreadKey(event.platform, event.workspace, event.channel, thread)


def _private(text: str, content: Content | None = None) -> Reply:
    return Reply(text=text, private=True, content=content)


def _merged(first: Outcome, then: Outcome) -> Outcome:
    """Two outcomes as one: the replies of both, and each other field from the later one where it set one."""
    update = {name: getattr(then, name) for name in then.model_fields_set - {"replies"}}
    return first.model_copy(update={**update, "replies": [*first.replies, *then.replies]})


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def build_core(settings: Any, messenger: Messenger, renderer: PlatformRenderer, *, sessions: Sessions | None = None,
               queue: Queue | None = None) -> ConversationCore:
    """The core wired to the configured database and queue (the composition root passes the platform parts)."""
    from storage.db import make_engine, make_session_factory
    from storage.redis import connect, resolve_redis_url
    from worker.queue import Limits, celery_sender

    if sessions is None:
        sessions = make_session_factory(make_engine(settings.database_url))
    if queue is None:
        redis_client = connect(resolve_redis_url(settings.redis_url, settings.data_dir))
        queue = Queue(sessions, redis_client, Limits(settings.max_runs_per_user, settings.max_runs_per_workspace),
                      celery_sender(settings))
    return ConversationCore(sessions=sessions, queue=queue, messenger=messenger, renderer=renderer,
                            settings=CoreSettings.from_settings(settings))


def shared_files(files: Sequence[FileRef]) -> tuple[SharedFile, ...]:
    """Files shared with an event, as the conversation keeps them (the workspace is the run's, not the file's)."""
    return tuple(SharedFile(**ref.model_dump(exclude={"workspace"})) for ref in files)
