"""The terminal chat driven from a test: lines typed at its prompt, over an in-memory database, fakeredis and a fake
clock, with what its screen showed recorded."""

from __future__ import annotations

import io
from collections.abc import Awaitable, Callable
from pathlib import Path

import fakeredis
from rich.console import Console
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from bot.console.bundle import TERMINAL, TERMINAL_USER
from bot.console.chat import TerminalChat
from bot.conversation.core import ConversationCore, CoreSettings
from chat.console.messenger import ConsoleMessenger
from chat.console.render import ConsoleRenderer
from chat.message import Place
from research.report import Report
from storage.models import Run
from tests.fakes.clock import FakeClock
from tests.run_rows import finish_run
from worker.headless import create_run
from worker.queue import Limits, Queue

SLACK_CHANNEL = Place(platform="slack", workspace="T1", channel="C1")
Sleep = Callable[[float], Awaitable[None]]


class Terminal:
    """A terminal chat over an in-memory database and fakeredis; `type` plays lines at the prompt."""

    def __init__(self, sessions: sessionmaker[Session], exports: Path) -> None:
        self.sessions = sessions
        self.exports = exports
        self.sent: list[tuple[str, int]] = []
        self.redis = fakeredis.FakeRedis()
        self.console = Console(record=True, width=100, file=io.StringIO())
        self.messenger = ConsoleMessenger(self.console)
        self.queue = Queue(sessions, self.redis, Limits(per_user=1, per_workspace=10),
                           lambda name, run_id, task_id: self.sent.append((name, run_id)))
        self.core = ConversationCore(sessions=sessions, queue=self.queue, messenger=self.messenger,
                                     renderer=ConsoleRenderer(), settings=CoreSettings())
        self.clock = FakeClock()
        self.lines_read = 0

    async def type(self, *lines: str, sleep: Sleep | None = None) -> str:
        """Type `lines` at the prompt, then Ctrl-D; returns everything the screen showed."""
        pending = list(lines)

        def read_line(prompt: str) -> str:
            if not pending:
                raise EOFError
            self.lines_read += 1
            return pending.pop(0)

        chat = TerminalChat(self.core, self.sessions, self.messenger, self.console, read_line, exports=self.exports,
                            clock=self.clock, sleep=sleep or self.clock.sleep)
        await chat.run()
        return self.console.export_text()

    def add_run(self, question: str, *, place: Place = TERMINAL, requester: str = TERMINAL_USER,
                mode: str = "research", state: str = "done", report: Report | None = None) -> int:
        run_id = create_run(self.sessions, place=place, requester=requester, mode=mode, question=question, options={})
        self.finish(run_id, state, report)
        return run_id

    def finish(self, run_id: int, state: str = "done", report: Report | None = None, **fields: object) -> None:
        finish_run(self.sessions, run_id, state, report, **fields)

    def count(self, model: type) -> int:
        with self.sessions() as session:
            return session.scalar(select(func.count()).select_from(model))

    def newest_run(self) -> Run:
        with self.sessions() as session:
            return session.scalars(select(Run).order_by(Run.id.desc())).first()


def a_report(title: str = "Tidal turbines") -> Report:
    return Report(title=title, question="What is a tidal turbine?",
                  body_markdown=f"# {title}\n\n## Summary\n\nA tidal turbine turns with the tide.")


def finishing_after(terminal: Terminal, seconds: float, **fields: object) -> Sleep:
    """A sleep on the fake clock that ends the newest run once `seconds` of virtual time have passed."""
    deadline = terminal.clock.now + seconds

    async def sleep(wait: float) -> None:
        await terminal.clock.sleep(wait)
        if terminal.clock.now >= deadline:
            terminal.finish(terminal.newest_run().id, **fields)

    return sleep
