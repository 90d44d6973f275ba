"""An answer's draft on its way to the terminal: the worker's writer and the terminal's reader over fakeredis, and
the terminal chat drawing the draft while the run is running, then replacing it with the audited answer."""

from __future__ import annotations

import asyncio
import datetime as dt
import io

import fakeredis
from rich.console import Console
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from bot.console.chat import TerminalChat
from bot.conversation.core import ConversationCore, CoreSettings
from chat.console.messenger import ConsoleMessenger
from chat.console.render import ConsoleRenderer
from research.report import Report
from storage.answer_drafts import DRAFT_TTL_SECONDS, AnswerDraftReader, AnswerDraftWriter, answer_draft_key
from storage.models import Run
from tests.fakes.clock import FakeClock
from tests.fakes.terminal import screen_left_by
from tests.waiting import settle
from worker.queue import Limits, Queue

RUN_ID = 7
# What the model streams cites passage ids; the audited answer numbers its sources and flags what they do not support.
DRAFT_START = "Tides rise twice a day"
DRAFT_WHOLE = "Tides rise twice a day because of the Moon [p3]. The Moon is made of cheese [p4]."
AUDITED_BODY = "Tides rise twice a day because of the Moon [1]. The Moon is made of cheese *(unverified)*."


class PacedSleep:
    """A sleep for the writer's pacing that returns only when the test lets it: the writer is provably waiting."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, seconds: float) -> None:
        self.entered.set()
        await self.release.wait()
        self.release.clear()

    async def next_pause(self) -> None:
        await self.entered.wait()
        self.entered.clear()


def shared_redis() -> tuple[fakeredis.FakeServer, fakeredis.FakeAsyncRedis, fakeredis.FakeRedis]:
    server = fakeredis.FakeServer()
    return server, fakeredis.FakeAsyncRedis(server=server), fakeredis.FakeRedis(server=server)


# -- the writer and the reader -----------------------------------------------------------------------

async def test_the_first_words_are_written_at_once_and_words_arriving_during_a_pause_are_written_as_the_latest() -> None:
    _, async_redis, redis = shared_redis()
    pacing = PacedSleep()
    writer = AnswerDraftWriter(async_redis, RUN_ID, sleep=pacing)
    read = AnswerDraftReader(redis)
    assert read(RUN_ID) is None

    writer.show("Tides")
    await pacing.next_pause()
    assert read(RUN_ID) == "Tides"

    writer.show("Tides rise")
    writer.show(DRAFT_START)
    assert read(RUN_ID) == "Tides", "nothing is written while the writer waits out its interval"
    pacing.release.set()
    await pacing.next_pause()
    assert read(RUN_ID) == DRAFT_START
    await writer.close()


async def test_the_draft_expires_by_itself() -> None:
    _, async_redis, redis = shared_redis()
    pacing = PacedSleep()
    writer = AnswerDraftWriter(async_redis, RUN_ID, sleep=pacing)
    writer.show(DRAFT_WHOLE)
    await pacing.next_pause()
    await writer.close()
    assert 0 < redis.ttl(answer_draft_key(RUN_ID)) <= DRAFT_TTL_SECONDS


async def test_a_redis_that_is_down_stops_the_writer_quietly() -> None:
    server, async_redis, _ = shared_redis()
    server.connected = False
    writer = AnswerDraftWriter(async_redis, RUN_ID, sleep=PacedSleep())
    writer.show(DRAFT_START)
    await settle(lambda: writer.failed, turns=100)  # the write fails on the first turn of the event loop it gets
    writer.show(DRAFT_WHOLE)  # later words are dropped, not queued for a Redis that is gone
    await writer.close()


def test_a_redis_that_is_down_gives_no_draft_and_is_not_asked_again() -> None:
    server, _, redis = shared_redis()
    redis.set(answer_draft_key(RUN_ID), DRAFT_START)
    read = AnswerDraftReader(redis)
    server.connected = False
    assert read(RUN_ID) is None
    server.connected = True
    assert read(RUN_ID) is None, "after a failure the terminal stops asking (a hung Redis would slow every poll)"


# -- the terminal chat following a run ---------------------------------------------------------------

class Terminal:
    """A terminal chat over an in-memory database and fakeredis, the worker's part played by `sleep`."""

    def __init__(self, sessions: sessionmaker[Session], *, is_terminal: bool) -> None:
        self.sessions = sessions
        self.redis = fakeredis.FakeRedis()
        self.output = io.StringIO()
        self.console = Console(file=self.output, width=100, height=40, force_terminal=is_terminal, color_system=None)
        self.messenger = ConsoleMessenger(self.console)
        queue = Queue(sessions, self.redis, Limits(per_user=1, per_workspace=10), lambda name, run_id, task_id: None)
        self.core = ConversationCore(sessions=sessions, queue=queue, messenger=self.messenger,
                                     renderer=ConsoleRenderer(), settings=CoreSettings())
        self.clock = FakeClock()
        self.screens_while_running: list[str] = []

    async def ask(self, question: str) -> str:
        """Type `question`, let the worker write the answer's draft in two steps, then end the run with the audited
        answer; returns everything written to the console."""
        steps = iter([self.start_running, lambda run_id: self.write_draft(run_id, DRAFT_START),
                      lambda run_id: self.write_draft(run_id, DRAFT_WHOLE), self.finish_with_audited_answer])
        pending = [question]

        def read_line(prompt: str) -> str:
            if not pending:
                raise EOFError
            return pending.pop(0)

        async def sleep(seconds: float) -> None:
            await self.clock.sleep(seconds)
            self.screens_while_running.append(self.output.getvalue())
            step = next(steps, None)
            if step is not None:
                step(self.newest_run_id())

        await TerminalChat(self.core, self.sessions, self.messenger, self.console, read_line, clock=self.clock,
                           sleep=sleep).run()
        return self.output.getvalue()

    def newest_run_id(self) -> int:
        with self.sessions() as session:
            return session.scalars(select(Run.id).order_by(Run.id.desc())).first()

    def start_running(self, run_id: int) -> None:
        with self.sessions.begin() as session:
            run = session.get(Run, run_id)
            run.state, run.started_at = "running", dt.datetime.now(dt.timezone.utc)

    def write_draft(self, run_id: int, text: str) -> None:
        self.redis.set(answer_draft_key(run_id), text)

    def finish_with_audited_answer(self, run_id: int) -> None:
        report = Report(question="Why are there two tides a day?", title="Two tides", mode="followup",
                        body_markdown=AUDITED_BODY)
        with self.sessions.begin() as session:
            run = session.get(Run, run_id)
            run.state, run.finished_at = "done", dt.datetime.now(dt.timezone.utc)
            run.report_json = report.model_dump(mode="json")


async def test_the_terminal_draws_the_answer_as_it_is_written_then_replaces_it_with_the_audited_answer(
        session_factory: sessionmaker[Session]) -> None:
    terminal = Terminal(session_factory, is_terminal=True)
    output = await terminal.ask("Why are there two tides a day?")
    while_running = [screen_left_by(frame) for frame in terminal.screens_while_running]
    assert any(DRAFT_START in screen and "[p3]" not in screen for screen in while_running), "the first words alone"
    assert any(DRAFT_WHOLE in screen for screen in while_running), "the whole draft, before the run ended"
    final = screen_left_by(output)
    assert "[p3]" not in final and "[p4]" not in final, "the draft is erased, not left above the answer"
    assert final.count("The Moon is made of cheese") == 1
    assert "The Moon is made of cheese (unverified)." in final


async def test_a_console_that_is_not_a_terminal_shows_only_the_audited_answer(
        session_factory: sessionmaker[Session]) -> None:
    terminal = Terminal(session_factory, is_terminal=False)
    output = await terminal.ask("Why are there two tides a day?")
    assert "[p3]" not in output and "[p4]" not in output
    assert " ".join(output.split()).count("The Moon is made of cheese") == 1 and "(unverified)" in output


def test_a_draft_taller_than_the_screen_shows_its_newest_lines() -> None:
    console = Console(file=io.StringIO(), width=60, height=20, color_system=None)
    paragraphs = [f"Paragraph {number} of the answer." for number in range(1, 41)]
    with console.capture() as capture:
        console.print(ConsoleRenderer().draft("\n\n".join(paragraphs)).extra["rich"])
    lines = capture.get().splitlines()
    assert "Paragraph 40 of the answer." in lines[-1] and lines[0].startswith("…")
    assert not any("Paragraph 1 of" in line for line in lines)
    assert len(lines) <= 20, "room is left for the run's status above it"
