"""The rules of a conversation: what a chat event means, decided from what the thread holds, with no side effects.

`decide(event, view, settings)` returns the actions to carry out; `bot.conversation.core` loads the
view, carries the actions out (stores, submits, posts) and reports the outcome to the adapter. The
rules, each with a test in `tests/unit/test_conversation_rules.py`:

1.  **help**: `help` (a command's text, a mention, or a reply in our thread) is answered privately; nothing starts.
2.  **history**: `history` lists the asker's recent runs and the channel's, privately.
3.  **modes**: `/research`, `/plan` and `/ask` start a run in their mode; a mention or DM is a quick answer (chat)
    unless it starts with `research:`, `plan:` or `ask:`.
4.  **usage**: a request that cannot run as written (empty, too long, a bad option) gets the usage problem
    privately; nothing starts.
5.  **own thread**: a command in a channel opens a thread of its own, titled with the mode and question.
6.  **queue cap**: a person with MAX_QUEUED_PER_USER runs waiting is refused a new one, privately; so is anyone in
    a workspace with MAX_QUEUED_PER_WORKSPACE runs waiting (when it is not 0).
7.  **daily quotas**: a run over DAILY_RUNS_PER_USER or DAILY_COST_PER_WORKSPACE is refused, saying when it resets.
8.  **one in flight**: a new run in a thread with a run queued or running is refused with how to stop that one.
9.  **joining late**: a mention in a thread deepthread has no conversation in starts one, with the thread's
    messages so far as history; the question names the conversation.
10. **not ours**: a plain reply in a thread deepthread does not own is ignored.
11. **cancel**: `cancel` (or the cancel reaction, or the Stop button) stops the thread's run in flight; only its
    requester or an admin may; with nothing in flight, the reply says so (the reaction and button stay quiet).
12. **export**: `export [md|html|json]` in a thread attaches its newest report; with none, the reply says so.
13. **plan approval**: after a finished plan, an approval (`go`, ✅, the Approve button) runs it as research with
    the plan's steps and options; only the plan's requester or an admin may; a plan with no steps cannot run.
14. **plan revision**: any other reply after a finished plan asks for a revised plan (its requester or an admin
    only); a plan revised past twice the question limit must be asked anew.
15. **retry**: `retry` (or the Retry button) after a finished run runs it again: same mode, question, plan, options.
16. **continue**: `continue` or `dig deeper [on …]` after a report runs more research, keeping its options.
17. **follow-ups**: any other reply after a report with sources is answered from that report's passages.
18. **chat**: any other reply in our thread is a quick answer with the thread as context.
19. **buttons and reactions**: they act on the run they name (or whose status message they are on); a run that
    no longer exists, or lives in another conversation, is refused privately.
20. **feedback**: 👍/👎 is stored for the clicking person (a 👎 asks what was wrong); a comment is stored too.
21. **suggestions**: a person who opens a new conversation is offered a prompt per mode and their last question.
22. **files**: files shared with a request (a mention, a DM, a reply in our thread, Discord's file option) are kept
    as sources of the conversation's research, and a request that shares files is research unless it says
    otherwise (`/ask` with a file is research of the files only), as is a question in a thread that holds files
    and no report yet, or files shared since its report, or that starts with "files only:"; files shared with any
    other reply are kept for the thread before the reply is answered; pictures, sound and video are not read (the
    person is told); "files only" where no file is shared is the question's words, not a scope; a message that
    only shares files is acknowledged in the thread ("I'll use notes.pdf in this
    thread") and starts nothing.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from config import setting_default
from bot.conversation import commands
from bot.conversation.commands import Mode, Request, UsageProblem
from bot.conversation.events import ChatEvent, Reply
from bot.conversation.quotas import quota_refusal_text
from chat.render import PERSON
from research.files import FileRef
from research.report import ExportFormat
from storage.conversations import HistoryTurn, ThreadView
from storage.models import Run
from storage.quotas import DailyQuotas, QuotaReached
from storage.vocabulary import ACTIVE_STATES, TERMINAL_STATES, RunMode, RunOptions, WatchLimits

REVISION_MARKER = "\n\nChanges requested: "
APPROVAL_EMOJI = frozenset({"white_check_mark", "heavy_check_mark", "+1", "✅", "👍"})
COMMAND_MODES: dict[str, Mode] = {"research": "research", "plan": "plan", "ask": "chat"}
LABELS: dict[Mode, str] = {"research": "Research", "plan": "Research plan", "chat": "Question"}
NOTHING_RUNNING = "Nothing is running in this thread."
NO_REPORT_TO_EXPORT = "There is no report in this thread to export yet."
NO_VERDICT = "That feedback button sent nothing I understand; please click 👍 or 👎 again."


@dataclass(frozen=True)
class CoreSettings:
    """The settings the rules read: who may act on any run, which reactions cancel, queue caps and daily quotas."""

    admins: frozenset[str] = frozenset()
    cancel_emoji: frozenset[str] = frozenset(setting_default("cancel_emoji"))
    max_queued_per_user: int = setting_default("max_queued_per_user")
    max_queued_per_workspace: int = setting_default("max_queued_per_workspace")  # 0: off
    daily_quotas: DailyQuotas = DailyQuotas()
    watch_limits: WatchLimits = WatchLimits(setting_default("watch_max_per_workspace"),
                                            setting_default("watch_min_interval"))

    @classmethod
    def from_settings(cls, settings: Any) -> CoreSettings:
        return cls(admins=frozenset(settings.admin_user_ids), cancel_emoji=frozenset(settings.cancel_emoji),
                   max_queued_per_user=settings.max_queued_per_user,
                   max_queued_per_workspace=settings.max_queued_per_workspace,
                   daily_quotas=DailyQuotas.from_settings(settings),
                   watch_limits=WatchLimits.from_settings(settings))


@dataclass(frozen=True)
class View:
    """What the rules see of an event's world, loaded before they decide.

    `thread`: the conversation in the event's thread (for a message at the top level, the one rooted
    at it), if deepthread has one. `target`: the run a reaction or button is about, and
    `target_thread` the conversation it lives in. `waiting_runs`, `workspace_waiting_runs` and `quota`:
    what a new run by the event's person would be refused for.
    """

    now: dt.datetime
    thread: ThreadView | None = None
    target: Run | None = None
    target_thread: ThreadView | None = None
    waiting_runs: int = 0
    workspace_waiting_runs: int = 0
    quota: QuotaReached | None = None


# -- actions -------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Say:
    """Tell the event's person (privately, or in the thread): the reply goes back to the adapter."""

    reply: Reply
    thread: str | None = None  # the thread the reply is about, where the rules know it


@dataclass(frozen=True)
class StartRun:
    """Store a run, post its status message and submit it; `thread` None opens a thread for it, titled `title`."""

    thread: str | None
    mode: RunMode
    question: str
    options: RunOptions = field(default_factory=RunOptions)
    plan: dict[str, Any] | None = None
    history: tuple[HistoryTurn, ...] = ()
    title: str | None = None
    names_conversation: bool = False  # the question names the conversation it opens (Slack titles the thread)
    files: tuple[FileRef, ...] = ()  # shared with the request: kept as sources of the conversation


@dataclass(frozen=True)
class KeepFiles:
    """Keep files shared without a request as sources of the conversation in `thread` (made if new), and say so."""

    thread: str
    files: tuple[FileRef, ...]


@dataclass(frozen=True)
class Cancel:
    """Stop `run`, queued or running; what it found so far is kept."""

    run: Run


@dataclass(frozen=True)
class Export:
    """Attach `run`'s report in its thread as a file."""

    run: Run
    thread: str
    output_format: ExportFormat = "md"


@dataclass(frozen=True)
class RecordFeedback:
    """Store the event's 👍/👎 or comment on `run`."""

    run: Run


@dataclass(frozen=True)
class ShowHistory:
    """List the person's recent runs and the channel's, privately."""


@dataclass(frozen=True)
class Suggest:
    """Offer the person who opened a conversation a prompt per mode and their last question."""


Action = Say | StartRun | Cancel | Export | RecordFeedback | ShowHistory | Suggest | KeepFiles


# -- the decision ----------------------------------------------------------------------------------------------------

def decide(event: ChatEvent, view: View, settings: CoreSettings) -> list[Action]:
    """What `event` means in `view`, as the actions to carry out, in order."""
    unreadable = [shared for shared in event.files if not may_be_read(shared)]
    if not unreadable:
        return _decide(event, view, settings)
    # Pictures, sound and video change nothing: the request goes on as if they were not attached, and the person
    # is told which were not read.
    notice = say(f"I can't read {_listed([shared.name for shared in unreadable])}: deepthread reads PDF, Word, "
                 "Markdown, HTML, text and CSV files.")
    event = event.model_copy(update={"files": [shared for shared in event.files if may_be_read(shared)]})
    if not event.files and not event.text.strip():
        return [notice]
    return [*_decide(event, view, settings), notice]


def _decide(event: ChatEvent, view: View, settings: CoreSettings) -> list[Action]:
    match event.kind:
        case "command":
            return _command(event, view, settings)
        case "reaction":
            return _reaction(event, view, settings)
        case "action":
            return _button(event, view, settings)
        case "opened":
            return [Suggest()]
    text = event.text.strip()
    if event.thread is not None:
        if view.thread is not None:
            return _thread_reply(event, view, settings, view.thread, text)
        if event.kind == "message":
            return []  # a reply in someone else's thread, not addressed to us
    if event.files and not text:
        return _keep_files(event, event.thread or event.message_id or "")
    # A quick answer cannot read files: a request that shares some is research unless it says otherwise.
    return _general(event, view, settings, text, default_mode="research" if event.files else "chat")


def _command(event: ChatEvent, view: View, settings: CoreSettings) -> list[Action]:
    if event.command == "ask" and event.files:
        # A quick question about a file is answered from the file: research that searches nothing else.
        return _general(event, view, settings, f"{event.text} --files-only", default_mode="research")
    return _general(event, view, settings, event.text, default_mode=COMMAND_MODES[event.command or "research"])


def _general(event: ChatEvent, view: View, settings: CoreSettings, text: str, *, default_mode: Mode) -> list[Action]:
    """Help, history, or a new request outside a conversation of ours."""
    if commands.is_help(text):
        return [say(commands.HELP)]
    if commands.is_history(text):
        return [ShowHistory()]
    try:
        request = commands.parse_request(text, default_mode)
    except UsageProblem as problem:
        return [say(str(problem))]
    files = tuple(event.files)
    if event.kind == "command" and event.thread is None:
        # A command in a channel opens a thread of its own, with the run's status message in place at once.
        return _start(event, view, settings, StartRun(thread=None, mode=request.mode, question=request.question,
                                                      options=request.options, files=files,
                                                      title=f"{LABELS[request.mode]}: {request.question}"))
    thread = event.thread or event.message_id or ""
    if view.thread is not None and view.thread.active is not None:
        return [Say(busy_reply(), thread=thread)]
    history = () if view.thread is not None else tuple(
        HistoryTurn(item.user, item.text, item.is_bot) for item in event.thread_history)
    return _start(event, view, settings, StartRun(thread=thread, mode=request.mode, question=request.question,
                                                  options=request.options, history=history, files=files,
                                                  names_conversation=view.thread is None))


def _keep_files(event: ChatEvent, thread: str) -> list[Action]:
    """Files shared with no request: kept for the thread's research, and acknowledged there."""
    return [KeepFiles(thread=thread, files=tuple(event.files)),
            Say(Reply(text=files_kept_text([shared.name for shared in event.files])), thread=thread)]


def files_kept_text(names: list[str]) -> str:
    """The thread's acknowledgement of files shared without a request."""
    return (f"I'll use {_listed(names)} in this thread. Ask a question in this thread and "
            f"{'it is' if len(names) == 1 else 'they are'} read and cited beside the web; start it with "
            "**files only:** to search nothing else.")


def _listed(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


UNREAD_MEDIA = ("image/", "audio/", "video/")


def may_be_read(shared: FileRef) -> bool:
    """Whether a shared file is of a kind deepthread might read (its content decides when the run reads it):
    not a picture, a sound or a video as the platform declared it."""
    return not (shared.mimetype or "").lower().startswith(UNREAD_MEDIA)


def _start(event: ChatEvent, view: View, settings: CoreSettings, start: StartRun) -> list[Action]:
    """`start`, unless the person is over the queue cap or a daily quota."""
    refusal = refusal_of(event, view, settings)
    if refusal is not None:
        return [Say(refusal, thread=start.thread)]
    holds_files = bool(event.files or (view.thread is not None and view.thread.shared_files))
    return [dataclasses.replace(start, options=commands.scoped(start.options, has_files=holds_files))]


def refusal_of(event: ChatEvent, view: View, settings: CoreSettings) -> Reply | None:
    """Why a new run by the event's person is refused (the queue caps, then the daily quotas), else None."""
    if view.waiting_runs >= settings.max_queued_per_user:
        return queue_full_reply(view.waiting_runs, settings)
    if 0 < settings.max_queued_per_workspace <= view.workspace_waiting_runs:
        return workspace_queue_full_reply(view.workspace_waiting_runs, settings)
    if view.quota is not None:
        return Reply(private=True, text=quota_refusal_text(view.quota, view.now))
    return None


def queue_full_reply(waiting_runs: int, settings: CoreSettings) -> Reply:
    """The private refusal of a person who already has `waiting_runs` runs waiting (at or over the cap)."""
    return Reply(private=True, text=f"You already have {waiting_runs} runs waiting in the queue (the limit is "
                                    f"{settings.max_queued_per_user}). They start as earlier ones finish; cancel one "
                                    "to ask something new.")


def workspace_queue_full_reply(waiting_runs: int, settings: CoreSettings) -> Reply:
    """The private refusal of a new run in a workspace with `waiting_runs` runs waiting (at or over its cap)."""
    return Reply(private=True, text=f"This workspace already has {waiting_runs} runs waiting in the queue (the limit "
                                    f"is {settings.max_queued_per_workspace}). They start as earlier ones finish; "
                                    "please ask again in a little while.")


# -- replies in a thread we own --------------------------------------------------------------------------------------

def _thread_reply(event: ChatEvent, view: View, settings: CoreSettings, thread: ThreadView,
                  text: str) -> list[Action]:
    if event.files and not text:
        return _keep_files(event, thread.key.thread)
    # Files shared with any other reply are kept for the thread first, whatever the reply then asks for.
    kept: list[Action] = [KeepFiles(thread=thread.key.thread, files=tuple(event.files))] if event.files else []
    return kept + _reply_in_our_thread(event, view, settings, thread, text)


def _reply_in_our_thread(event: ChatEvent, view: View, settings: CoreSettings, thread: ThreadView,
                         text: str) -> list[Action]:
    if commands.is_cancel(text):
        if thread.active is None:
            return [say(NOTHING_RUNNING)]
        return _cancel(event, settings, thread.active)
    if commands.is_help(text):
        return [say(commands.HELP)]
    if commands.is_history(text):
        return [ShowHistory()]
    if (output_format := commands.export_format(text)) is not None:
        reported = thread.last_reported
        return [say(NO_REPORT_TO_EXPORT) if reported is None else Export(reported, thread.key.thread, output_format)]
    if thread.active is not None:
        return [Say(busy_reply())]
    try:
        return _next_run(event, view, settings, thread, text)
    except UsageProblem as problem:
        return [say(str(problem))]


def _next_run(event: ChatEvent, view: View, settings: CoreSettings, thread: ThreadView, text: str) -> list[Action]:
    """The run a reply in a quiet thread of ours asks for; raises UsageProblem for a request that cannot run."""
    last, report_run = thread.last, thread.last_report
    where = thread.key.thread
    prefixed, _ = commands.mode_prefix(text)
    deeper = commands.dig_deeper(text)
    if prefixed is not None:
        return _start_request(event, view, settings, where, commands.parse_request(text, "chat"))
    if last is not None and last.mode == "plan" and last.state == "done":
        if commands.is_approval(text):
            return _run_plan(event, view, settings, last, where)
        if not may_act_on(event.user, last, settings):
            # A revision would make its author the new plan's requester, free to approve it.
            return [say("Only the person who asked for this plan (or an admin) can revise or approve it.")]
        return _revise_plan(event, view, settings, last, where, text)
    if last is not None and commands.is_retry(text) and last.state in TERMINAL_STATES:
        return _retry(event, view, settings, last, where)
    if report_run is not None and (commands.is_continue(text) or deeper is not None):
        request = commands.parse_request(deeper or report_run.question, "research")
        return _start_request(event, view, settings, where, request.model_copy(
            update={"options": report_run.options.carried().merged(request.options)}))
    # New files with a question make research that reads them (a follow-up only re-reads the report's passages).
    if (report_run is not None and deeper is None and has_sources(report_run) and not event.files
            and not _reads_files_anew(thread, text)):
        request = commands.parse_request(text, "chat")
        return _start(event, view, settings, StartRun(thread=where, mode="followup", question=request.question,
                                                      options=RunOptions(answer_from_run=report_run.id)))
    # A thread holding shared files researches them (a quick answer would not read them).
    return _start_request(event, view, settings, where,
                          commands.parse_request(text, "research" if thread.shared_files or event.files else "chat"))


def _reads_files_anew(thread: ThreadView, text: str) -> bool:
    """Whether a question after a report is research of the thread's files rather than a follow-up from the report's
    passages: files were shared since the report, or the question asks for the files only."""
    report_run = thread.last_report
    if not thread.shared_files or report_run is None:
        return False
    newer = thread.newest_file_at is not None and thread.newest_file_at > report_run.created_at
    return newer or commands.asks_files_only(text)


def _start_request(event: ChatEvent, view: View, settings: CoreSettings, thread: str, request: Request) -> list[Action]:
    return _start(event, view, settings, StartRun(thread=thread, mode=request.mode, question=request.question,
                                                  options=request.options))


def _run_plan(event: ChatEvent, view: View, settings: CoreSettings, plan_run: Run, thread: str) -> list[Action]:
    if not may_act_on(event.user, plan_run, settings):
        return [say("Only the person who asked for this plan can approve it.")]
    plan = (plan_run.report_json or {}).get("plan")
    if not plan:
        return [say("That plan has no steps to run; ask for a new plan.")]
    original = plan_run.question.split(REVISION_MARKER, 1)[0]
    return _start(event, view, settings, StartRun(thread=thread, mode="research", question=original,
                                                  options=plan_run.options.carried(), plan=plan))


def _revise_plan(event: ChatEvent, view: View, settings: CoreSettings, plan_run: Run, thread: str,
                 text: str) -> list[Action]:
    """A new plan with the requested changes; raises UsageProblem for an empty or too long request."""
    changes = commands.parse_request(text, "plan")
    question = f"{plan_run.question}{REVISION_MARKER}{changes.question}"
    if len(question) > commands.MAX_QUESTION_CHARS * 2:
        raise UsageProblem("This plan has been revised too much to revise again; please start a new /plan "
                           "with the whole question.")
    return _start(event, view, settings, StartRun(thread=thread, mode="plan", question=question,
                                                  options=plan_run.options.carried().merged(changes.options)))


def _retry(event: ChatEvent, view: View, settings: CoreSettings, run: Run, thread: str) -> list[Action]:
    return _start(event, view, settings, StartRun(thread=thread, mode=run.mode, question=run.question,
                                                  options=run.options, plan=run.plan))


# -- cancels, reactions and buttons ----------------------------------------------------------------------------------

def _cancel(event: ChatEvent, settings: CoreSettings, run: Run) -> list[Action]:
    if not may_act_on(event.user, run, settings):
        return [Say(not_allowed_reply(run))]
    return [Cancel(run)]


def _reaction(event: ChatEvent, view: View, settings: CoreSettings) -> list[Action]:
    run, reaction = view.target, event.reaction
    if run is None or reaction is None:
        return []
    if reaction in settings.cancel_emoji:
        return _cancel(event, settings, run) if run.state in ACTIVE_STATES else []
    if reaction in APPROVAL_EMOJI and run.mode == "plan" and run.state == "done" and view.target_thread is not None:
        if view.target_thread.active is not None:
            return [Say(busy_reply())]
        return _run_plan(event, view, settings, run, view.target_thread.key.thread)
    return []


def _button(event: ChatEvent, view: View, settings: CoreSettings) -> list[Action]:
    run, thread = view.target, view.target_thread
    if run is None or thread is None:
        return [say("That run no longer exists.")]
    if thread.key[:3] != (event.platform, event.workspace, event.channel):
        return [say("That button belongs to a run in another conversation.")]
    match event.action:
        case "export":
            return [Export(run, thread.key.thread)]
        case "feedback" | "feedback_comment":
            if event.action == "feedback" and event.feedback is None:
                return [say(NO_VERDICT)]
            return [RecordFeedback(run)]
        case "cancel":
            return _cancel(event, settings, run) if run.state in ACTIVE_STATES else []
    if thread.active is not None:
        return [Say(busy_reply())]
    where = thread.key.thread
    match event.action:
        case "approve" if run.mode == "plan":
            return _run_plan(event, view, settings, run, where)
        case "retry":
            return _retry(event, view, settings, run, where)
        case "continue":
            return _start(event, view, settings, StartRun(thread=where, mode="research", question=run.question,
                                                          options=run.options.carried()))
    return []


# -- words and small judgements ------------------------------------------------------------------------------------

def say(text: str) -> Say:
    """A private reply to the event's person."""
    return Say(Reply(text=text, private=True))


def busy_reply() -> Reply:
    return Reply(private=True, text=("A run is already in progress in this thread. Wait for it to finish, or stop it "
                                     "by replying **cancel** or reacting ❌ on its status message."))


def not_allowed_reply(run: Run) -> Reply:
    return Reply(private=True, text=f"Only the person who started this run ({PERSON}) or an admin can stop it.",
                 person=run.requested_by)


def may_act_on(user: str, run: Run, settings: CoreSettings) -> bool:
    """Whether `user` may stop, approve or revise `run`: its requester, or an admin."""
    return user == run.requested_by or user in settings.admins


def has_sources(run: Run) -> bool:
    """Whether a report cites sources a follow-up can be answered from (a run stopped before reading has none)."""
    return bool((run.report_json or {}).get("sources"))
