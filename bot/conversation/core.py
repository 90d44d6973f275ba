"""The conversation core: turns a normalised ChatEvent into stored runs, status messages and replies.

It never calls an LLM, a provider or a web page: it writes the database, submits runs through
`worker.queue`, and posts the root and status messages, so an adapter can acknowledge in time.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from config import setting_default
from bot.conversation import commands
from bot.conversation.commands import Mode, Request, UsageProblem
from bot.conversation.events import ChatEvent, Outcome, Reply
from bot.conversation.feedback import record_feedback
from bot.conversation.history import PRIVATE, run_history
from bot.conversation.quotas import quota_refusal_text
from bot.conversation.root_message import in_flight_run_started_by
from bot.conversation.suggestions import PastQuestion, latest_question, suggested_prompts
from chat.history import RunHistory
from chat.message import FileUpload, MessageRef, Messenger, Place
from chat.render import PERSON, PlatformRenderer
from chat.state import initial_progress
from research.report import EXPORTERS, ExportFormat, Report
from storage.models import Conversation, Message, Run
from storage.quotas import DailyQuotas, quota_reached
from storage.vocabulary import ACTIVE_STATES, TERMINAL_STATES, RunMode
from worker.queue import Queue, waiting

logger = logging.getLogger(__name__)

REVISION_MARKER = "\n\nChanges requested: "
APPROVAL_EMOJI = frozenset({"white_check_mark", "heavy_check_mark", "+1", "✅", "👍"})
COMMAND_MODES: dict[str, Mode] = {"research": "research", "plan": "plan", "ask": "chat"}


@dataclass(frozen=True)
class CoreSettings:
    """The settings the core reads: who may cancel any run, which reactions cancel, queue cap and daily quotas."""

    admins: frozenset[str] = frozenset()
    cancel_emoji: frozenset[str] = frozenset(setting_default("cancel_emoji"))
    max_queued_per_user: int = setting_default("max_queued_per_user")
    daily_quotas: DailyQuotas = DailyQuotas()

    @classmethod
    def from_settings(cls, settings: Any) -> "CoreSettings":
        return cls(admins=frozenset(settings.admin_user_ids), cancel_emoji=frozenset(settings.cancel_emoji),
                   max_queued_per_user=settings.max_queued_per_user,
                   daily_quotas=DailyQuotas(runs_per_user=settings.daily_runs_per_user,
                                            cost_per_workspace=settings.daily_cost_per_workspace))


def busy_reply(run: Run) -> Reply:
    return Reply(private=True, text=("A run is already in progress in this thread. Wait for it to finish, or stop it "
                                     "by replying **cancel** or reacting ❌ on its status message."))


def not_allowed_reply(run: Run) -> Reply:
    return Reply(private=True, text=f"Only the person who started this run ({PERSON}) or an admin can stop it.",
                 person=run.requested_by)


@dataclass
class ThreadView:
    """A conversation and its runs, newest last, as the rules need them."""

    conversation: Conversation
    runs: list[Run] = field(default_factory=list)

    @property
    def active(self) -> Run | None:
        return next((run for run in reversed(self.runs) if run.state in ACTIVE_STATES), None)

    @property
    def last(self) -> Run | None:
        return self.runs[-1] if self.runs else None

    @property
    def last_report(self) -> Run | None:
        return next((run for run in reversed(self.runs) if run.mode == "research" and run.report_json is not None), None)


class ConversationCore:
    """Decides what each event means and carries it out through the database, the queue and the messenger."""

    def __init__(self, *, sessions: sessionmaker[Session], queue: Queue, messenger: Messenger,
                 renderer: PlatformRenderer, settings: CoreSettings,
                 clock: Callable[[], dt.datetime] | None = None) -> None:
        self.sessions = sessions
        self.queue = queue
        self.messenger = messenger
        self.renderer = renderer
        self.settings = settings
        self.clock = clock or _now  # the daily quotas' day and reset time

    async def handle(self, event: ChatEvent) -> Outcome:
        """What `event` means, done; replies for the adapter to deliver are in the outcome."""
        if event.kind == "command":
            return await self._command(event)
        if event.kind == "reaction":
            return await self._reaction(event)
        if event.kind == "action":
            return await self._action(event)
        if event.kind == "opened":
            return await self._opened(event)
        text = event.text.strip()
        if event.thread is not None:
            view = await asyncio.to_thread(self._thread, event.platform, event.workspace, event.channel, event.thread)
            if view is not None:
                return await self._thread_reply(event, view, text)
            if event.kind == "message":
                return Outcome()  # a reply in someone else's thread, not addressed to us
        if commands.is_help(text):
            return Outcome(replies=[Reply(text=commands.HELP, private=True)])
        if commands.is_history(text):
            return await self._history(event)
        return await self._new_request(event, text, default_mode="chat")

    # -- requests ----------------------------------------------------------------------------------

    async def _command(self, event: ChatEvent) -> Outcome:
        if commands.is_help(event.text):
            return Outcome(replies=[Reply(text=commands.HELP, private=True)])
        if commands.is_history(event.text):
            return await self._history(event)
        return await self._new_request(event, event.text, default_mode=COMMAND_MODES[event.command or "research"])

    async def _new_request(self, event: ChatEvent, text: str, *, default_mode: Mode) -> Outcome:
        try:
            request = commands.parse_request(text, default_mode)
        except UsageProblem as problem:
            return Outcome(replies=[Reply(text=str(problem), private=True)])
        if event.kind == "command" and event.thread is None:
            # A command in a channel opens a thread of its own, with the run's status message in place at once;
            # the queue cap is checked first, so a refused run leaves nothing posted.
            if (refusal := await asyncio.to_thread(self._refusal, event)) is not None:
                return Outcome(replies=[refusal])
            waiting = initial_progress(run_id=0, mode=request.mode, question=request.question, requested_by=event.user)
            opened = await self.messenger.open_thread(
                Place(platform=event.platform, workspace=event.workspace, channel=event.channel),
                title=self.renderer.notice(f"{self._label(request.mode)}: {request.question}"),
                status=self.renderer.status(waiting, now=_now()))
            return await self._start(event, opened.thread, request, status=opened.status)
        thread = event.thread or event.message_id or ""
        view = await asyncio.to_thread(self._thread, event.platform, event.workspace, event.channel, thread)
        if view is not None and view.active is not None:
            return Outcome(replies=[busy_reply(view.active)], thread=thread)
        history = [(item.user, item.text, item.is_bot) for item in event.thread_history] if view is None else []
        started = await self._start(event, thread, request, history=history)
        if view is None and started.run_id is not None:
            # The question that opens a conversation names it (Slack titles assistant threads with it).
            return started.model_copy(update={"title": request.question})
        return started

    async def _opened(self, event: ChatEvent) -> Outcome:
        """Suggestions for a conversation the person just opened: one per mode, and their last question."""
        last = await asyncio.to_thread(self._latest_question, event)
        return Outcome(suggestions=suggested_prompts(last))

    def _latest_question(self, event: ChatEvent) -> PastQuestion | None:
        with self.sessions() as session:
            last = latest_question(session, platform=event.platform, workspace=event.workspace, user=event.user)
        if last is None:
            return None
        return last.model_copy(update={"question": last.question.split(REVISION_MARKER, 1)[0]})

    def _label(self, mode: Mode) -> str:
        return {"research": "Research", "plan": "Research plan", "chat": "Question"}[mode]

    async def _start(self, event: ChatEvent, thread: str, request: Request, *, plan: dict[str, Any] | None = None,
                     history: list[tuple[str, str, bool]] | None = None, extra_options: dict[str, Any] | None = None,
                     mode: RunMode | None = None, status: MessageRef | None = None) -> Outcome:
        """Store the run, post its status message in the thread (unless the thread opened with it), then submit it."""
        if status is None and (refusal := await asyncio.to_thread(self._refusal, event)) is not None:
            return Outcome(replies=[refusal], thread=thread)
        run_mode = mode or request.mode
        try:
            run_id = await asyncio.to_thread(self._store_run, event, thread, request, run_mode, plan, history or [],
                                             {**request.options, **(extra_options or {})})
        except IntegrityError:
            # Another event started a run in this thread a moment ago (the one-in-flight index refused this one).
            view = await asyncio.to_thread(self._thread, event.platform, event.workspace, event.channel, thread)
            if view is None or view.active is None:
                raise
            return Outcome(replies=[busy_reply(view.active)], thread=thread)
        place = Place(platform=event.platform, workspace=event.workspace, channel=event.channel, thread=thread)
        progress = initial_progress(run_id=run_id, mode=run_mode, question=request.question, requested_by=event.user)
        if status is None:
            status = await self.messenger.post(place, self.renderer.status(progress, now=_now()))
        position = await asyncio.to_thread(self._store_status_and_submit, run_id, status)
        if position is not None:
            waiting = progress.model_copy(update={"queue_position": position})
            await self.messenger.edit(status, self.renderer.status(waiting, now=_now()))
        return Outcome(run_id=run_id, thread=thread)

    # The database and queue calls below are synchronous; the async paths run them in a thread so
    # the adapter's event loop keeps acknowledging other requests meanwhile.

    def _store_run(self, event: ChatEvent, thread: str, request: Request, mode: RunMode, plan: dict[str, Any] | None,
                   history: list[tuple[str, str, bool]], options: dict[str, Any]) -> int:
        with self.sessions.begin() as session:
            if event.channel_visibility == PRIVATE:
                # A channel made private since its first runs: none of them may be listed elsewhere any longer.
                session.execute(update(Conversation).where(
                    Conversation.platform == event.platform, Conversation.workspace == event.workspace,
                    Conversation.channel == event.channel, Conversation.visibility != PRIVATE).values(visibility=PRIVATE))
            conversation = self._conversation(session, event, thread)
            for user, text, is_bot in history:
                session.add(Message(conversation=conversation, role="assistant" if is_bot else "user", author=user, text=text))
            session.add(Message(conversation=conversation, role="user", author=event.user, text=request.question,
                                platform_message_id=event.message_id, mode=mode))
            run = Run(conversation=conversation, workspace=event.workspace, mode=mode, question=request.question,
                      options=options, plan=plan, requested_by=event.user)
            session.add(run)
            session.flush()
            return run.id

    def _store_status_and_submit(self, run_id: int, status: MessageRef) -> int | None:
        with self.sessions.begin() as session:
            stored = session.get(Run, run_id)
            stored.status_message = status.model_dump(mode="json")
            stored.status_message_id = status.message_id
        return self.queue.submit(run_id)

    def _refusal(self, event: ChatEvent) -> Reply | None:
        """Why a new run by the event's author is refused (queue cap, then daily quotas), else None."""
        return self._queue_full(event.user) or self._quota_reached(event.user, event.workspace)

    def _quota_reached(self, user: str, workspace: str) -> Reply | None:
        """The refusal for a new run over DAILY_RUNS_PER_USER or DAILY_COST_PER_WORKSPACE, else None."""
        quotas = self.settings.daily_quotas
        if not quotas.enabled:
            return None
        now = self.clock()
        with self.sessions() as session:
            reached = quota_reached(session, quotas, user=user, workspace=workspace, now=now)
        return None if reached is None else Reply(private=True, text=quota_refusal_text(reached, now))

    def _queue_full(self, user: str) -> Reply | None:
        """The refusal for a person who already has MAX_QUEUED_PER_USER runs waiting, else None."""
        with self.sessions() as session:
            waiting_runs = session.scalar(select(func.count()).select_from(Run).where(
                Run.requested_by == user, waiting()))
        limit = self.settings.max_queued_per_user
        if waiting_runs < limit:
            return None
        return Reply(private=True, text=f"You already have {waiting_runs} runs waiting in the queue (the limit is "
                                        f"{limit}). They start as earlier ones finish; cancel one to ask something new.")

    def _load_run(self, run_id: int | None) -> Run | None:
        if run_id is None:
            return None
        with self.sessions() as session:
            run = session.get(Run, run_id)
            if run is not None:
                session.expunge(run)
            return run

    def _conversation(self, session: Session, event: ChatEvent, thread: str) -> Conversation:
        found = session.scalar(select(Conversation).where(
            Conversation.platform == event.platform, Conversation.workspace == event.workspace,
            Conversation.channel == event.channel, Conversation.thread == thread))
        if found is not None:
            return found
        conversation = Conversation(platform=event.platform, workspace=event.workspace, channel=event.channel,
                                    thread=thread, created_by=event.user,
                                    visibility=event.channel_visibility or PRIVATE)
        session.add(conversation)
        return conversation

    def _thread(self, platform: str, workspace: str, channel: str, thread: str) -> ThreadView | None:
        with self.sessions() as session:
            conversation = session.scalar(select(Conversation).where(
                Conversation.platform == platform, Conversation.workspace == workspace,
                Conversation.channel == channel, Conversation.thread == thread))
            if conversation is None:
                return None
            runs = list(session.scalars(select(Run).where(Run.conversation_id == conversation.id).order_by(Run.id)))
            session.expunge_all()
            return ThreadView(conversation=conversation, runs=runs)

    # -- replies in a thread we own ----------------------------------------------------------------

    async def _thread_reply(self, event: ChatEvent, view: ThreadView, text: str) -> Outcome:
        thread = view.conversation.thread
        if commands.is_cancel(text):
            if view.active is None:
                return Outcome(replies=[Reply(text="Nothing is running in this thread.", private=True)])
            return await self._cancel(event, view.active)
        if commands.is_help(text):
            return Outcome(replies=[Reply(text=commands.HELP, private=True)])
        if commands.is_history(text):
            return await self._history(event)
        if (output_format := commands.export_format(text)) is not None:
            reported = next((run for run in reversed(view.runs) if run.report_json is not None), None)
            if reported is None:
                return Outcome(replies=[Reply(text="There is no report in this thread to export yet.", private=True)])
            return await self._export(event, reported, output_format)
        if view.active is not None:
            return Outcome(replies=[busy_reply(view.active)])
        last, report_run = view.last, view.last_report
        prefixed, rest = commands.mode_prefix(text)
        deeper = commands.dig_deeper(text)
        try:
            if prefixed is not None:
                return await self._start(event, thread, commands.parse_request(text, "chat"))
            if last is not None and last.mode == "plan" and last.state == "done" and commands.is_approval(text):
                return await self._run_plan(event, last)
            if last is not None and last.mode == "plan" and last.state == "done":
                if not self._may_approve(event.user, last):
                    # A revision would make its author the new plan's requester, free to approve it.
                    return Outcome(replies=[Reply(private=True, text="Only the person who asked for this plan (or "
                                                                      "an admin) can revise or approve it.")])
                return await self._revise_plan(event, last, text)
            if last is not None and commands.is_retry(text) and last.state in TERMINAL_STATES:
                return await self._retry(event, last)
            if report_run is not None and (commands.is_continue(text) or deeper is not None):
                question = deeper or report_run.question
                request = commands.parse_request(question, "research")
                return await self._start(event, thread, request.model_copy(
                    update={"options": {**_carried_options(report_run), **request.options}}))
            if report_run is not None and deeper is None and _has_sources(report_run):
                request = commands.parse_request(text, "chat")
                return await self._start(event, thread, request, mode="followup",
                                         extra_options={"answer_from_run": report_run.id})
            return await self._start(event, thread, commands.parse_request(text, "chat"))
        except UsageProblem as problem:
            return Outcome(replies=[Reply(text=str(problem), private=True)])

    def _may_approve(self, user: str, plan_run: Run) -> bool:
        return user == plan_run.requested_by or user in self.settings.admins

    async def _run_plan(self, event: ChatEvent, plan_run: Run) -> Outcome:
        if not self._may_approve(event.user, plan_run):
            return Outcome(replies=[Reply(private=True, text="Only the person who asked for this plan can approve it.")])
        plan = (plan_run.report_json or {}).get("plan")
        if not plan:
            return Outcome(replies=[Reply(text="That plan has no steps to run; ask for a new plan.", private=True)])
        original = plan_run.question.split(REVISION_MARKER, 1)[0]
        request = Request(mode="research", question=original, options=_carried_options(plan_run))
        return await self._start(event, await asyncio.to_thread(self._thread_id, plan_run), request, plan=plan)

    async def _revise_plan(self, event: ChatEvent, plan_run: Run, text: str) -> Outcome:
        """A new plan with the requested changes; raises UsageProblem for an empty or too long request."""
        changes = commands.parse_request(text, "plan")
        question = f"{plan_run.question}{REVISION_MARKER}{changes.question}"
        if len(question) > commands.MAX_QUESTION_CHARS * 2:
            raise UsageProblem("This plan has been revised too much to revise again; please start a new /plan "
                               "with the whole question.")
        options = {**_carried_options(plan_run), **changes.options}
        thread = await asyncio.to_thread(self._thread_id, plan_run)
        return await self._start(event, thread, Request(mode="plan", question=question, options=options))

    async def _retry(self, event: ChatEvent, run: Run) -> Outcome:
        request = Request(mode="chat" if run.mode == "followup" else run.mode, question=run.question,
                          options={k: v for k, v in (run.options or {}).items() if k != "answer_from_run"})
        extra = {"answer_from_run": run.options["answer_from_run"]} if run.mode == "followup" else None
        return await self._start(event, await asyncio.to_thread(self._thread_id, run), request, plan=run.plan, mode=run.mode,
                                 extra_options=extra)

    # -- cancels, reactions and buttons -----------------------------------------------------------

    def _may_cancel(self, user: str, run: Run) -> bool:
        return user == run.requested_by or user in self.settings.admins

    async def _cancel(self, event: ChatEvent, run: Run) -> Outcome:
        if not self._may_cancel(event.user, run):
            return Outcome(replies=[not_allowed_reply(run)])
        state = await asyncio.to_thread(self.queue.cancel, run.id, event.user)
        if state == "cancelled" and run.status_message:
            # A queued run never reaches a worker, so its status message is ended here.
            stopped = initial_progress(run_id=run.id, mode=run.mode, question=run.question,
                                       requested_by=run.requested_by).model_copy(
                update={"state": "cancelled", "cancelled_by": event.user})
            await self.messenger.edit(MessageRef.model_validate(run.status_message),
                                      self.renderer.status(stopped, now=_now()))
        return Outcome(cancelled_run_id=run.id)

    def _run_by_status_message(self, event: ChatEvent) -> Run | None:
        if not event.message_id:
            return None
        with self.sessions() as session:
            run = session.scalar(select(Run).join(Conversation).where(
                Run.status_message_id == event.message_id, Conversation.platform == event.platform,
                Conversation.channel == event.channel))
            if run is not None:
                session.expunge(run)
            return run

    async def _reaction(self, event: ChatEvent) -> Outcome:
        run = await asyncio.to_thread(self._run_by_status_message, event)
        if run is None and event.reaction in self.settings.cancel_emoji:
            # The channel-visible message that started a run (its thread's root, or the question) stops it too.
            run = await asyncio.to_thread(in_flight_run_started_by, self.sessions, event)
        if run is None or event.reaction is None:
            return Outcome()
        if event.reaction in self.settings.cancel_emoji:
            if run.state not in ACTIVE_STATES:
                return Outcome()
            return await self._cancel(event, run)
        if event.reaction in APPROVAL_EMOJI and run.mode == "plan" and run.state == "done":
            view = await asyncio.to_thread(self._thread_of, run)
            if view is not None and view.active is not None:
                return Outcome(replies=[busy_reply(view.active)])
            return await self._run_plan(event, run)
        return Outcome()

    def _is_in(self, run: Run, event: ChatEvent) -> bool:
        """Whether `run` lives in the platform, workspace and channel the event came from."""
        with self.sessions() as session:
            conversation = session.get(Conversation, run.conversation_id)
            return (conversation.platform, conversation.workspace, conversation.channel) == (
                event.platform, event.workspace, event.channel)

    def _thread_id(self, run: Run) -> str:
        """The thread a run lives in."""
        with self.sessions() as session:
            return session.get(Conversation, run.conversation_id).thread

    def _thread_of(self, run: Run) -> ThreadView | None:
        with self.sessions() as session:
            conversation = session.get(Conversation, run.conversation_id)
            place = (conversation.platform, conversation.workspace, conversation.channel, conversation.thread)
        return self._thread(*place)

    async def _action(self, event: ChatEvent) -> Outcome:
        if event.action_run_id is None:  # a button that names no run (Stop) means the run of its status message
            run = await asyncio.to_thread(self._run_by_status_message, event)
        else:
            run = await asyncio.to_thread(self._load_run, event.action_run_id)
        if run is None:
            return Outcome(replies=[Reply(text="That run no longer exists.", private=True)])
        if not await asyncio.to_thread(self._is_in, run, event):
            return Outcome(replies=[Reply(text="That button belongs to a run in another conversation.", private=True)])
        if event.action == "export":
            return await self._export(event, run)
        if event.action in ("feedback", "feedback_comment"):
            return await asyncio.to_thread(record_feedback, self.sessions, event, run, self.clock())
        if event.action == "cancel":
            return await self._cancel(event, run) if run.state in ACTIVE_STATES else Outcome()
        view = await asyncio.to_thread(self._thread_of, run)
        if view is not None and view.active is not None:
            return Outcome(replies=[busy_reply(view.active)])
        if event.action == "approve" and run.mode == "plan":
            return await self._run_plan(event, run)
        if event.action == "retry":
            return await self._retry(event, run)
        if event.action == "continue":
            return await self._start(event, await asyncio.to_thread(self._thread_id, run),
                                     Request(mode="research", question=run.question, options=_carried_options(run)))
        return Outcome()

    async def _export(self, event: ChatEvent, run: Run, output_format: ExportFormat = "md") -> Outcome:
        """Attach the run's report in its thread as a Markdown, HTML or JSON file."""
        if run.report_json is None:
            return Outcome(replies=[Reply(text="That run has no report to export.", private=True)])
        report = Report.model_validate(run.report_json)
        report.run_id = run.id
        place = Place(platform=event.platform, workspace=event.workspace, channel=event.channel,
                      thread=await asyncio.to_thread(self._thread_id, run))
        await self.messenger.upload(place, FileUpload(filename=f"deepthread-report-{run.id}.{output_format}",
                                                      data=EXPORTERS[output_format](report).encode("utf-8"),
                                                      title=report.title[:200]))
        return Outcome()

    async def _history(self, event: ChatEvent) -> Outcome:
        """The caller's recent runs and the channel's, privately, leaving out runs of channels not visible here."""
        history = await asyncio.to_thread(self._run_history, event)
        content = self.renderer.history(history)
        return Outcome(replies=[Reply(text=content.text, private=True, content=content)])

    def _run_history(self, event: ChatEvent) -> RunHistory:
        with self.sessions() as session:
            return run_history(session, platform=event.platform, workspace=event.workspace, channel=event.channel,
                               user=event.user)


def _has_sources(run: Run) -> bool:
    """Whether a report cites sources a follow-up can be answered from (a run stopped before reading has none)."""
    return bool((run.report_json or {}).get("sources"))


def _carried_options(run: Run) -> dict[str, Any]:
    """The requester's narrowing (since, sites, preset) that a follow-on run keeps."""
    return {key: value for key, value in (run.options or {}).items() if key in ("since", "sites", "preset")}


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def build_core(settings: Any, messenger: Messenger, renderer: PlatformRenderer, *, sessions: sessionmaker[Session] | None = None,
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
