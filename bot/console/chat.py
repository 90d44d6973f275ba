"""`deepthread chat`: the conversation core in a terminal, one thread per session.

Lines become events in the session's thread: a question, `/plan …`, `/research …`, `/ask …`,
follow-ups, `go`. Runs execute in the workers; this process follows each run's stored events,
redraws its status in place, and prints the report. Ctrl-C stops the running job (a second
Ctrl-C, or Ctrl-C at the prompt, leaves).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import signal
import uuid
from collections.abc import Callable

from rich.console import Console
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from bot.console.bundle import TERMINAL, TERMINAL_USER
from bot.conversation.core import ConversationCore
from bot.conversation.events import ChatEvent
from chat.message import MessageRef, Place
from chat.console.messenger import ConsoleMessenger, renderable_for
from chat.console.render import ConsoleRenderer
from chat.state import RunProgress, initial_progress, progress_of_stored_run
from research.report import Report
from storage.models import Event, Run

SLASH = {"/research": "research:", "/plan": "plan:", "/ask": "ask:"}
POLL_SECONDS = 0.2
GREETING = ("deepthread — ask a question, or /research, /plan, /ask. In this thread: follow-ups, [bold]go[/] to run a "
            "plan, [bold]dig deeper[/]. Ctrl-C stops a run; Ctrl-D or /quit leaves.")


def as_thread_text(line: str) -> str:
    """`/research q` → `research: q` (the thread's own words for the same request)."""
    head, _, rest = line.strip().partition(" ")
    prefix = SLASH.get(head.lower())
    return f"{prefix} {rest}".strip() if prefix else line.strip()


class TerminalChat:
    """One terminal session: a thread of its own in the database, runs executed by the workers."""

    def __init__(self, core: ConversationCore, sessions: sessionmaker[Session], messenger: ConsoleMessenger,
                 console: Console, read_line: Callable[[str], str] = input) -> None:
        self.core = core
        self.sessions = sessions
        self.messenger = messenger
        self.console = console
        self.read_line = read_line
        self.renderer = ConsoleRenderer()
        self.thread: str | None = None

    async def run(self) -> None:
        self.console.print(GREETING)
        while True:
            try:
                line = await asyncio.to_thread(self.read_line, "› ")
            except (EOFError, KeyboardInterrupt):
                self.console.print()
                return
            if line.strip() in ("/quit", "/exit"):
                return
            if not line.strip():
                continue
            await self.say(line)

    async def say(self, line: str) -> None:
        """Hand one line to the core in this session's thread, then follow the run it started."""
        message_id = uuid.uuid4().hex
        event = ChatEvent(platform=TERMINAL.platform, workspace=TERMINAL.workspace, channel=TERMINAL.channel,
                          user=TERMINAL_USER, kind="direct" if self.thread is None else "message",
                          text=as_thread_text(line), thread=self.thread, message_id=message_id)
        outcome = await self.core.handle(event)
        for reply in outcome.replies:
            self.console.print(renderable_for(self.renderer.reply(reply.text, person=reply.person)))
        if outcome.thread:
            self.thread = outcome.thread
        if outcome.run_id is not None:
            await self.follow(outcome.run_id)

    async def follow(self, run_id: int) -> None:
        """Redraw the run's status from its stored events until it ends; Ctrl-C cancels it."""
        loop = asyncio.get_running_loop()
        stop_requests = 0

        def on_interrupt() -> None:
            nonlocal stop_requests
            stop_requests += 1
            if stop_requests == 1:
                self.core.queue.cancel(run_id, TERMINAL_USER)
            else:
                raise KeyboardInterrupt

        loop.add_signal_handler(signal.SIGINT, on_interrupt)
        try:
            with self.sessions() as session:
                run = session.get(Run, run_id)
                status = MessageRef.model_validate(run.status_message)
                progress = initial_progress(run_id=run.id, mode=run.mode, question=run.question,
                                            requested_by=run.requested_by)
            while True:
                progress, run = await asyncio.to_thread(self._progress, run_id, progress)
                await self.messenger.edit(status, self.renderer.status(progress, now=_now()))
                if run.finished:
                    break
                await asyncio.sleep(POLL_SECONDS)
        finally:
            loop.remove_signal_handler(signal.SIGINT)
        self.messenger.close()
        if run.report_json is not None:
            delivery = self.renderer.report(Report.model_validate(run.report_json), requester=TERMINAL_USER)
            for content in delivery.messages:
                await self.messenger.post(_place(self.thread), content)
        elif run.error:
            self.console.print(f"The run failed: {run.error}", markup=False)
        if run.state != "done" or run.partial:
            self.console.print("Say [bold]retry[/] to run it again, or [bold]continue[/] to research further.")
        elif run.mode == "plan":
            self.console.print("Say [bold]go[/] to run this plan, or describe what to change.")

    def _progress(self, run_id: int, progress: RunProgress) -> tuple[RunProgress, Run]:
        with self.sessions() as session:
            run = session.get(Run, run_id)
            events = session.scalars(select(Event).where(Event.run_id == run_id, Event.seq > progress.last_seq)
                                     .order_by(Event.seq))
            progress = progress_of_stored_run(run, events, progress)
            if run.state == "queued":
                progress = progress.model_copy(update={"queue_position": self.core.queue.position(run_id)})
            session.expunge(run)
            return progress, run


def _place(thread: str | None) -> Place:
    return TERMINAL.model_copy(update={"thread": thread})


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)
