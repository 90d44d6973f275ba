"""`deepthread chat`: the conversation core in a terminal, one thread per session.

Lines become events in the session's thread: a question, `/plan …`, `/research …`, `/ask …`,
follow-ups, `go`. Runs execute in the workers; this process follows each run's stored events,
redraws its status in place, shows a chat or follow-up answer as the model writes it (the worker's draft in Redis),
and prints the report. Ctrl-C stops the running job (a second
Ctrl-C, or Ctrl-C at the prompt, leaves). The terminal's own commands (`/help`, `/history`, `/runs`,
`/export`, `/quit`) are answered here and never reach the core; `/watch` and `/watches` are turned into the core's watch
events here. While the chat is open, the runs of this terminal's watches that end are shown as they end (the worker
delivers nothing to a terminal).

Leaving never waits: SIGTERM and SIGHUP (the terminal closed) leave like Ctrl-C at the prompt, also during a run, and
the prompt is read in a daemon thread, so a line still being typed when the chat leaves does not hold the process
(`asyncio.to_thread`'s executor is waited for at exit, and `input()` returns only when Enter is pressed).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import logging
import os
import re
import shlex
import signal
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

from bot.console.bundle import TERMINAL, TERMINAL_USER
from bot.conversation.core import ConversationCore
from bot.conversation.events import ChatEvent, Outcome
from bot.conversation.history import arun_history
from chat.message import MessageRef, Place
from chat.console.messenger import ConsoleMessenger, print_unbroken, renderable_for
from chat.console.render import ConsoleRenderer
from chat.history import mode_name
from chat.state import RunProgress, progress_of_stored_run
from chat.text import shortened, single_line
from chat.watches import quiet_line, watch_headline
from research.files import FileRef, local_file_ref
from research.report import ExportFormat, Report
from storage.answer_drafts import AnswerDraftReader
from storage.conversations import ThreadKey, aload_run, athread_view, athread_view_of_run
from storage.db import Sessions, off_loop
from storage.models import Run
from storage.admission import aqueue_position
from storage.deliveries import arun_with_events
from storage.runs import RUNS_HEADER, WATCHES_HEADER, aexport_run, arecent_runs, watch_lines
from storage.shared_limits import live_workers
from storage.vocabulary import CADENCES, WEEKDAYS, Cadence, WatchSchedule, zone_of
from storage.watches import WatchView, awatches_in

logger = logging.getLogger(__name__)
awatch_lines = off_loop(watch_lines)

SLASH = {"/research": "research:", "/plan": "plan:", "/ask": "ask:"}
POLL_SECONDS = 0.2
PROMPT = "› "
# Each leaves the chat at once, at the prompt or during a run (where a first Ctrl-C only stops the run).
LEAVE_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
GREETING = ("deepthread — ask a question, or start with /research, /plan or /ask. Type [bold]/help[/] for the rest; "
            "[bold]/quit[/] (or Ctrl-D) leaves.")
HISTORY_LIMIT = 10
RUNS_LIMIT = 20
EXPORT_FORMATS: tuple[ExportFormat, ...] = ("md", "html", "json")
# Workers beat every 2 s with a 6 s lifetime, so 5 s without one is not a beat missed in passing.
NO_WORKER_GRACE_SECONDS = 5.0
NO_WORKER = ("No worker is running, so this run waits in the queue. Start one with `deepthread worker` in another "
             "terminal (`deepthread up` starts one for you).")
EXPORT_USAGE = "Usage: /export RUN_ID [md|html|json], e.g. /export 12 html (/history lists the run ids)."

ATTACH_USAGE = "Usage: /attach PATH, e.g. /attach ~/notes/field-notes.pdf (PDF, Word, Markdown, HTML, text or CSV)."
WATCH_USAGE = ("Usage: /watch daily|weekly|monthly [HH:MM] [--thread], e.g. /watch weekly 09:00, to research this "
               "session's latest report again on that schedule (at 09:00 unless told); /watch RUN_ID daily … watches "
               "another report of this terminal (/history lists them); --thread keeps every run in this session's "
               "thread.")
WATCHES_USAGE = ("Usage: /watches lists this terminal's watches; /watches pause N, /watches resume N and /watches delete N "
                 "change watch N.")
DEFAULT_WATCH_HOUR = 9
# The runs of this terminal's watches are looked for this often while the chat is open.
WATCH_POLL_SECONDS = 3.0
LOCALTIME = Path("/etc/localtime")
CLOCK_TIME = re.compile(r"(\d{1,2}):(\d{2})")

CommandName = Literal["help", "history", "runs", "export", "attach", "watch", "watches", "quit", "unknown"]
COMMAND_WORDS: dict[str, CommandName] = {"help": "help", "?": "help", "history": "history", "runs": "runs",
                                         "export": "export", "attach": "attach", "watch": "watch",
                                         "watches": "watches", "quit": "quit", "exit": "quit"}
HELP_SECTIONS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("Ask", (
        ("a question", "a quick answer"),
        ("/research QUESTION", "a report researched on the web, every claim cited"),
        ("/plan QUESTION", "a research plan to look at before anything is searched"),
        ("/ask QUESTION", "a quick answer with no web search"),
        ("options", "after the question: --since DATE (2024-01-31), --site DOMAIN (repeatable), --deep, --quick"),
    )),
    ("Then, in this session", (
        ("a follow-up", "answered from the sources the last report read"),
        ("go", "run the plan just drafted (or say what to change in it)"),
        ("dig deeper", "more research on the same question, or on a narrower one: dig deeper: costs"),
        ("retry", "run a failed or stopped run again"),
        ("continue", "research further from where the last report stopped"),
        ("export md|html|json", "save this session's latest report in DATA_DIR/exports"),
        ("/attach PATH", "a file (PDF, Word, Markdown, HTML, text, CSV) this session's research reads and cites; "
                         "say files only to search nothing else"),
        ("/watch CADENCE [HH:MM]", "research this session's latest report again, daily, weekly (on today's "
                                   "weekday) or monthly (on today's date), at 09:00 unless told; each run opens with "
                                   "what changed. --thread keeps its runs in this session; /watch RUN_ID … watches "
                                   "another report"),
        ("Ctrl-C", "cancel the running job and keep what was found (a second Ctrl-C leaves)"),
    )),
    ("Commands", (
        ("/history", f"this terminal's last {HISTORY_LIMIT} runs, newest first"),
        ("/runs", "the latest runs of every platform, as deepthread runs lists them"),
        ("/export ID md|html|json", "save a run's report in DATA_DIR/exports (as md unless told otherwise)"),
        ("/watches", "this terminal's watches; /watches pause N, resume N or delete N changes watch N"),
        ("/help", "this help"),
        ("/quit", "leave (also /exit or Ctrl-D)"),
    )),
)


@dataclass(frozen=True)
class ChatCommand:
    """A command the terminal answers itself: its name, the words after it, and the word as typed."""

    name: CommandName
    arguments: tuple[str, ...] = ()
    word: str = ""
    rest: str = ""  # the line after the command's word, as typed (a path may hold spaces)


def as_thread_text(line: str) -> str:
    """`/research q` → `research: q` (the thread's own words for the same request)."""
    head, _, rest = line.strip().partition(" ")
    prefix = SLASH.get(head.lower())
    return f"{prefix} {rest}".strip() if prefix else line.strip()


def chat_command(line: str) -> ChatCommand | None:
    """The terminal's own command in `line` (`/history`, `runs`, `export 12 html`, `?`), or None when the
    line is for the core (a question, `/research …`, `go`); any other `/word` is an unknown command."""
    words = line.split()
    if not words:
        return None
    head, arguments = words[0].lower(), tuple(words[1:])
    if head.startswith("/"):
        if head in SLASH:
            return None
        name = COMMAND_WORDS.get(head[1:])
        return ChatCommand(name=name or "unknown", arguments=arguments, word=words[0],
                           rest=line.strip()[len(words[0]):].strip())
    if head == "export" and arguments and arguments[0].lstrip("#").isdigit() and len(arguments) <= 2:
        return ChatCommand(name="export", arguments=arguments, word=head)
    if head == "export" and len(arguments) == 1 and arguments[0].lower() in EXPORT_FORMATS:
        return ChatCommand(name="export", arguments=arguments, word=head)  # this session's latest report
    # A bare word is a command only when alone: "history of tidal power" is a question.
    if not arguments and head in COMMAND_WORDS:
        return ChatCommand(name=COMMAND_WORDS[head], word=head)
    return None


def typed_path(rest: str) -> str:
    """The path after `/attach` as a shell would read it (quoted, or with escaped spaces, as a terminal pastes a
    dragged file), or as typed when that reads as more than one word."""
    try:
        words = shlex.split(rest)
    except ValueError:  # an unclosed quote
        return rest.strip()
    return words[0] if len(words) == 1 else rest.strip()


@dataclass(frozen=True)
class WatchRequest:
    """What `/watch` asked for: the report to watch (None: this session's latest), how often, at what time of day, and
    whether its runs stay in the report's thread."""

    cadence: Cadence
    hour: int = DEFAULT_WATCH_HOUR
    minute: int = 0
    run_id: int | None = None
    one_thread: bool = False

    def schedule(self, today: dt.date, timezone: str) -> WatchSchedule:
        """The schedule in `timezone`: a weekly watch on `today`'s weekday, a monthly one on `today`'s date."""
        return WatchSchedule(cadence=self.cadence, hour=self.hour, minute=self.minute, timezone=timezone,
                             weekday=today.weekday() if self.cadence == "weekly" else None,
                             day=today.day if self.cadence == "monthly" else None)


def watch_request(arguments: tuple[str, ...]) -> WatchRequest:
    """`/watch [RUN_ID] daily|weekly|monthly [HH:MM] [--thread]` read; raises ValueError for any other form."""
    words = [word for word in arguments if word.lower() != "--thread"]
    one_thread = len(words) < len(arguments)
    run_id = None
    if words and words[0].lstrip("#").isdigit():
        run_id = int(words.pop(0).lstrip("#"))
    if not words or words[0].lower() not in CADENCES or len(words) > 2:
        raise ValueError("not a /watch form")
    cadence = next(known for known in CADENCES if known == words[0].lower())
    hour, minute = DEFAULT_WATCH_HOUR, 0
    if len(words) == 2:
        clock_time = CLOCK_TIME.fullmatch(words[1])
        if clock_time is None or int(clock_time.group(1)) > 23 or int(clock_time.group(2)) > 59:
            raise ValueError(f"not a time of day: {words[1]}")
        hour, minute = int(clock_time.group(1)), int(clock_time.group(2))
    return WatchRequest(cadence=cadence, hour=hour, minute=minute, run_id=run_id, one_thread=one_thread)


def watches_form_is_known(arguments: tuple[str, ...]) -> bool:
    """Whether the words after `/watches` are a form the core answers: none (or `list`), or pause|resume|delete N."""
    if not arguments or [word.lower() for word in arguments] == ["list"]:
        return True
    return (len(arguments) == 2 and arguments[0].lower() in ("pause", "resume", "delete")
            and arguments[1].lstrip("#").isdigit())


def local_timezone(environ: Mapping[str, str] = os.environ, localtime: Path = LOCALTIME) -> str:
    """This machine's IANA time zone: `TZ` when it names one, else the zone `/etc/localtime` links to, else UTC."""
    candidates = [environ.get("TZ", "").strip().removeprefix(":")]
    with contextlib.suppress(OSError):
        candidates.append(os.readlink(localtime))
    for candidate in candidates:
        # A path into a zoneinfo folder (`/usr/share/zoneinfo/Europe/Paris`, or its posix/ or right/ copy) names the
        # zone after the folder.
        name = candidate.rpartition("zoneinfo/")[2] if "zoneinfo/" in candidate else candidate
        name = name.removeprefix("posix/").removeprefix("right/")
        if not name:
            continue
        try:
            zone_of(name)
        except ValueError:
            continue
        return name
    return "UTC"


def read_prompt_line(prompt: str) -> str:
    """The line typed after `prompt`, without its line break; raises EOFError at the end of the input.

    `input()` on a terminal; from a pipe or file, read unbuffered from the file descriptor: `input()` there holds
    stdin's buffer lock while it waits, and a read still waiting when the chat leaves made the interpreter's exit abort.
    """
    try:
        descriptor = sys.stdin.fileno()
    except (AttributeError, OSError, ValueError):  # no file behind it (a test's stand-in)
        return input(prompt)
    if sys.stdin.isatty() and sys.stdout.isatty():
        return input(prompt)
    sys.stdout.write(prompt)
    sys.stdout.flush()
    typed = bytearray()
    while not typed.endswith(b"\n"):
        byte = os.read(descriptor, 1)
        if not byte:
            break
        typed += byte
    if not typed:
        raise EOFError
    return typed.decode(sys.stdin.encoding or "utf-8", errors="replace").removesuffix("\n")


def help_text() -> RenderableType:
    """What the terminal can do, written for the terminal (no reactions, mentions or markup shown raw)."""
    table = Table.grid(padding=(0, 2))
    table.add_column(no_wrap=True)
    table.add_column()
    for title, rows in HELP_SECTIONS:
        table.add_row(Text(title, style="underline"))
        for how, what in rows:
            table.add_row(Text(f"  {how}", style="bold"), Text(what))
    return table


class WorkerWatch:
    """Says once when no worker has been alive for `grace` seconds in a row, by the `clock` given."""

    def __init__(self, grace: float, clock: Callable[[], float]) -> None:
        self.grace = grace
        self.clock = clock
        self.missing_since: float | None = None
        self.told = False

    def should_tell(self, workers_alive: bool) -> bool:
        """True the first time the workers have been missing for the whole grace, False otherwise."""
        if workers_alive:
            self.missing_since = None
            return False
        now = self.clock()
        if self.missing_since is None:
            self.missing_since = now
        if self.told or now - self.missing_since < self.grace:
            return False
        self.told = True
        return True


class AnswerDraftView:
    """A chat or follow-up answer shown live below its run's status as the model writes it, taken down before the
    audited answer is printed (on a console that is not a terminal, live messages are never drawn: only the answer)."""

    def __init__(self, messenger: ConsoleMessenger, renderer: ConsoleRenderer, place: Place) -> None:
        self.messenger = messenger
        self.renderer = renderer
        self.place = place
        self.ref: MessageRef | None = None
        self.text = ""

    async def show(self, draft: str | None) -> None:
        """Draw `draft` (the whole answer so far) in place of the last one; nothing to draw leaves the screen as is."""
        if not draft or not draft.strip() or draft == self.text:
            return
        content = self.renderer.draft(draft)
        if self.ref is None:
            self.ref = await self.messenger.post(self.place, content)
        else:
            await self.messenger.edit(self.ref, content)
        self.text = draft

    async def take_down(self) -> None:
        """Remove the draft from the screen, if one was drawn."""
        if self.ref is not None:
            await self.messenger.withdraw(self.ref)
            self.ref = None


class WatchRunFeed:
    """The runs of this terminal's watches that end while the chat is open, each given once: the first look only notes
    those that had ended before."""

    def __init__(self, sessions: Sessions) -> None:
        self.sessions = sessions
        self.settled: set[int] | None = None  # watch runs given or noted, and runs that are no watch's (its origin)

    async def newly_ended(self) -> list[tuple[WatchView, Run]]:
        """Each watch of the terminal whose latest run ended since the last look, with that run."""
        first_look = self.settled is None
        settled = set(self.settled or ())
        ended = []
        for watch in await awatches_in(self.sessions, platform=TERMINAL.platform, workspace=TERMINAL.workspace,
                                       channel=TERMINAL.channel):
            if watch.last_run_id is None or watch.last_run_id in settled:
                continue
            run = await aload_run(self.sessions, watch.last_run_id)
            is_watch_run = run is not None and run.watch_id is not None
            if run is not None and is_watch_run and not run.finished:
                continue  # given when it ends
            settled.add(watch.last_run_id)
            if run is not None and is_watch_run and not first_look:
                ended.append((watch, run))
        self.settled = settled
        return ended


class TerminalChat:
    """One terminal session: a thread of its own in the database, runs executed by the workers.

    `exports` is where `/export` writes (DATA_DIR/exports unless given); `workers_alive` lists the live
    workers, `answer_drafts` reads a run's answer as far as the model has written it (from Redis unless given), and
    `clock`/`sleep` pace the following of a run (tests pass fakes of them). `timezone` is the person's IANA zone for
    their watches (the machine's unless given), `now` the wall clock that says which day is today, and `watch_sleep`
    paces the looks for ended watch runs, every `watch_poll_seconds`.
    """

    def __init__(self, core: ConversationCore, sessions: Sessions, messenger: ConsoleMessenger,
                 console: Console, read_line: Callable[[str], str] = read_prompt_line, *, exports: Path | None = None,
                 workers_alive: Callable[[], list[str]] | None = None, no_worker: str = NO_WORKER,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 answer_drafts: Callable[[int], str | None] | None = None, timezone: str | None = None,
                 now: Callable[[], dt.datetime] | None = None,
                 watch_sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 watch_poll_seconds: float = WATCH_POLL_SECONDS) -> None:
        self.core = core
        self.sessions = sessions
        self.messenger = messenger
        self.console = console
        self.read_line = read_line
        self.renderer = ConsoleRenderer(you=TERMINAL_USER)
        self.thread: str | None = None
        self._exports = exports
        self.workers_alive = workers_alive or (lambda: live_workers(self.core.queue.redis))
        self.no_worker = no_worker
        self.clock = clock
        self.sleep = sleep
        self.answer_drafts = answer_drafts or AnswerDraftReader(self.core.queue.redis)
        self.timezone = timezone or local_timezone()
        self.now = now or _now
        self.watch_sleep = watch_sleep
        self.watch_poll_seconds = watch_poll_seconds
        self._leaving = asyncio.Event()
        self._handling: dict[signal.Signals, Callable[[signal.Signals], None]] = {}
        # Held while a line is answered, and while ended watch runs are shown: one never prints into the other.
        self._turn = asyncio.Lock()
        self._prompting = False
        self._watch_runs_failing = False

    @property
    def exports(self) -> Path:
        if self._exports is None:
            from config import get_settings

            self._exports = Path(get_settings().data_dir) / "exports"
        return self._exports

    async def run(self) -> None:
        """Read lines until /quit, Ctrl-D, or Ctrl-C (SIGTERM, SIGHUP) at the prompt: commands answered here, the rest
        to the core. A signal leaves at once, also during a run."""
        self.console.print(GREETING, highlight=False)
        watch_runs = asyncio.create_task(self._show_watch_runs(), name="terminal-watch-runs")
        try:
            with self._signals_call(self._leave, *LEAVE_SIGNALS):
                while not self._leaving.is_set():
                    line = await self._next_line()
                    if line is None:
                        self.console.print()  # the prompt's line is left unfinished
                        return
                    if not line.strip():
                        continue
                    command = chat_command(line)
                    if command is not None and command.name == "quit":
                        return
                    async with self._turn:
                        if command is None:
                            await self.say(line)
                        else:
                            await self.obey(command)
        finally:
            watch_runs.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch_runs

    def _leave(self, _: signal.Signals) -> None:
        self._leaving.set()

    @contextmanager
    def _signals_call(self, callback: Callable[[signal.Signals], None], *signals: signal.Signals) -> Iterator[None]:
        """`callback(signal)` on each of `signals` while inside; after, what handled them before (the chat's own
        handler, or the process's)."""
        loop = asyncio.get_running_loop()
        saved = {sent: (self._handling.get(sent), signal.getsignal(sent)) for sent in signals}
        for sent in signals:
            loop.add_signal_handler(sent, callback, sent)
            self._handling[sent] = callback
        try:
            yield
        finally:
            for sent, (outer, before) in saved.items():
                if outer is not None:
                    loop.add_signal_handler(sent, outer, sent)
                    self._handling[sent] = outer
                    continue
                loop.remove_signal_handler(sent)
                del self._handling[sent]
                if before is not None:
                    signal.signal(sent, before)

    async def _next_line(self) -> str | None:
        """The next line typed at the prompt, or None when the person leaves (Ctrl-D, a signal, a closed terminal)."""
        loop = asyncio.get_running_loop()
        typed: asyncio.Future[str] = loop.create_future()
        threading.Thread(target=self._read_into, args=(loop, typed), name="terminal-prompt", daemon=True).start()
        leaving = asyncio.ensure_future(self._leaving.wait())
        self._prompting = True
        try:
            await asyncio.wait((typed, leaving), return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._prompting = False
            leaving.cancel()
        if not typed.done():
            typed.cancel()  # a line typed later goes nowhere
            return None
        try:
            return typed.result()
        except (EOFError, KeyboardInterrupt, OSError):
            return None

    def _read_into(self, loop: asyncio.AbstractEventLoop, typed: asyncio.Future[str]) -> None:
        """Read one line at the prompt (in the prompt's thread) and settle `typed` with it, or with what was raised."""
        try:
            line = self.read_line(PROMPT)
        except BaseException as error:  # noqa: BLE001  (EOFError, a closed terminal's OSError: for the chat to judge)
            settle = functools.partial(_settle_with_error, typed, error)
        else:
            settle = functools.partial(_settle_with_line, typed, line)
        try:
            loop.call_soon_threadsafe(settle)
        except RuntimeError:  # the loop has closed: the chat left while the line was being typed
            pass

    async def obey(self, command: ChatCommand) -> None:
        """Answer one of the terminal's own commands (all but quit); nothing reaches the core."""
        if command.name == "help":
            self.console.print(help_text())
        elif command.name == "history":
            self.console.print(await self._history())
        elif command.name == "runs":
            lines = await arecent_runs(self.sessions, RUNS_LIMIT, self.console.width)
            for line in [RUNS_HEADER, *lines] if lines else ["No runs yet."]:
                print_unbroken(self.console, Text(line))
            watches = await awatch_lines(self.sessions, self.console.width)
            if watches:
                self.console.print()
                for line in [WATCHES_HEADER, *watches]:
                    print_unbroken(self.console, Text(line))
        elif command.name == "export":
            print_unbroken(self.console, await self._export(command.arguments))
        elif command.name == "attach":
            await self._attach(typed_path(command.rest))
        elif command.name == "watch":
            await self._watch(command.arguments)
        elif command.name == "watches":
            await self._watches(command.arguments)
        else:
            self.console.print(Text(f"Unknown command {command.word}. Type /help for the commands."))

    async def _attach(self, typed: str) -> None:
        """Share the file at `typed` (a path on this machine) with this session's research."""
        if not typed.strip():
            self.console.print(Text(ATTACH_USAGE))
            return
        ref = local_file_ref(typed.strip(), shared_by=TERMINAL_USER)
        if ref is None:
            self.console.print(Text(f"There is no file at {typed.strip()}. {ATTACH_USAGE}"))
            return
        await self.say("", files=[ref])

    async def say(self, line: str, files: list[FileRef] | None = None) -> None:
        """Hand one line (and the files shared with it) to the core in this session's thread, then follow the run it
        started."""
        message_id = uuid.uuid4().hex
        event = ChatEvent(platform=TERMINAL.platform, workspace=TERMINAL.workspace, channel=TERMINAL.channel,
                          user=TERMINAL_USER, kind="direct" if self.thread is None else "message",
                          text=as_thread_text(line), thread=self.thread, message_id=message_id, files=files or [])
        outcome = await self.core.handle(event)
        self._print_replies(outcome)
        if outcome.thread:
            self.thread = outcome.thread
        if outcome.run_id is not None:
            await self.follow(outcome.run_id)

    async def follow(self, run_id: int) -> None:
        """Redraw the run's status from its stored events, and its answer as it is written, until it ends; Ctrl-C
        cancels it."""
        stop_requests = 0

        def on_interrupt(sent: signal.Signals) -> None:
            nonlocal stop_requests
            stop_requests += 1
            if stop_requests == 1:
                self.core.queue.cancel(run_id, TERMINAL_USER)
            else:
                self._leave(sent)

        watch = WorkerWatch(NO_WORKER_GRACE_SECONDS, self.clock)
        draft = AnswerDraftView(self.messenger, self.renderer, _place(self.thread))
        with self._signals_call(on_interrupt, signal.SIGINT):
            run = await aload_run(self.sessions, run_id)
            if run is None:
                raise LookupError(f"no run {run_id}")
            status = MessageRef.model_validate(run.status_message)
            progress = RunProgress.for_run(run)
            print_unbroken(self.console, Text(f"Run {run_id} · {mode_name(progress.mode)}", style="dim"))
            while True:
                progress, run = await self._progress(run_id, progress)
                await self.messenger.edit(status, self.renderer.status(progress, now=_now()))
                if run.finished or self._leaving.is_set():
                    break
                if run.state == "running":
                    await draft.show(await asyncio.to_thread(self.answer_drafts, run_id))
                if run.state == "queued" and not watch.told:
                    if watch.should_tell(bool(await asyncio.to_thread(self.workers_alive))):
                        # The notice may name the worker's log file.
                        print_unbroken(self.console, renderable_for(self.renderer.reply(self.no_worker)))
                await self.sleep(POLL_SECONDS)
        await draft.take_down()  # the audited answer below replaces it
        self.messenger.close()
        if not run.finished:  # leaving: the run goes on in the workers, its report in /history
            return
        if run.report_json is not None:
            delivery = self.renderer.report(Report.model_validate(run.report_json), requester=TERMINAL_USER)
            for content in delivery.messages:
                await self.messenger.post(_place(self.thread), content)
        elif run.error:
            self.console.print(f"The run failed: {run.error}", markup=False, highlight=False)
        if run.state != "done" or run.partial:
            self.console.print("Say [bold]retry[/] to run it again, or [bold]continue[/] to research further.",
                               highlight=False)
        elif run.mode == "plan":
            self.console.print("Say [bold]go[/] to run this plan, or describe what to change.", highlight=False)

    def _print_replies(self, outcome: Outcome) -> None:
        """The core's replies: each as it was rendered (a listing), or its text with its bold and code drawn."""
        for reply in outcome.replies:
            self.console.print(renderable_for(reply.content or self.renderer.reply(reply.text, person=reply.person)))

    def _event(self, **fields: Any) -> ChatEvent:
        """An event of the person at this terminal, in this session's thread."""
        return ChatEvent(platform=TERMINAL.platform, workspace=TERMINAL.workspace, channel=TERMINAL.channel,
                         user=TERMINAL_USER, thread=self.thread, message_id=uuid.uuid4().hex, **fields)

    async def _watch(self, arguments: tuple[str, ...]) -> None:
        """Watch this session's latest research report (or the terminal's run named) on the schedule asked for."""
        try:
            request = watch_request(arguments)
        except ValueError:
            self.console.print(Text(WATCH_USAGE))
            return
        run_id = request.run_id
        if run_id is None:
            run_id = await self._latest_research_run()
            if run_id is None:
                self.console.print(Text(f"No research report in this session yet to watch. {WATCH_USAGE}"))
                return
        elif not await self._is_terminal_run(run_id):
            self.console.print(Text(f"There is no run {run_id} in this terminal: /history lists its runs."))
            return
        schedule = request.schedule(self.now().astimezone(zone_of(self.timezone)).date(), self.timezone)
        before = {watch.id for watch in await self._terminal_watches()}
        outcome = await self.core.handle(self._event(
            kind="action", action="watch", action_run_id=run_id, watch_schedule=schedule,
            watch_one_thread=request.one_thread, timezone=self.timezone))
        self._print_replies(outcome)
        if any(watch.id not in before for watch in await self._terminal_watches()):
            self.console.print(Text(watch_made_note(schedule), style="dim"))

    async def _watches(self, arguments: tuple[str, ...]) -> None:
        """List this terminal's watches, or pause, resume or delete one, as the core does it."""
        if not watches_form_is_known(arguments):
            self.console.print(Text(WATCHES_USAGE))
            return
        self._print_replies(await self.core.handle(self._event(kind="command", command="watches",
                                                               text=" ".join(arguments))))

    async def _terminal_watches(self) -> list[WatchView]:
        return await awatches_in(self.sessions, platform=TERMINAL.platform, workspace=TERMINAL.workspace,
                                 channel=TERMINAL.channel)

    async def _is_terminal_run(self, run_id: int) -> bool:
        """Whether run `run_id` was asked for at this terminal (a watch made here must not watch another platform's)."""
        run = await aload_run(self.sessions, run_id)
        view = await athread_view_of_run(self.sessions, run) if run is not None else None
        return view is not None and (view.key.platform, view.key.workspace, view.key.channel) == (
            TERMINAL.platform, TERMINAL.workspace, TERMINAL.channel)

    async def _latest_research_run(self) -> int | None:
        """The id of this session's latest research run with a report, if any."""
        if self.thread is None:
            return None
        view = await athread_view(self.sessions, ThreadKey(TERMINAL.platform, TERMINAL.workspace, TERMINAL.channel,
                                                            self.thread))
        reported = view.last_report if view is not None else None
        return reported.id if reported is not None else None

    async def _show_watch_runs(self) -> None:
        """Every `watch_poll_seconds` while the chat is open, show the runs of this terminal's watches that ended (the
        worker delivers nothing to a terminal); a database that does not answer is told once, and tried again."""
        feed = WatchRunFeed(self.sessions)
        while True:
            async with self._turn:
                try:
                    ended = await feed.newly_ended()
                except Exception as error:  # noqa: BLE001  (the chat goes on; the next look tries again)
                    if not self._watch_runs_failing:
                        logger.warning("could not look for ended watch runs (%s); trying again", type(error).__name__)
                    self._watch_runs_failing = True
                    ended = []
                else:
                    self._watch_runs_failing = False
                if ended:
                    at_prompt = self._prompting
                    if at_prompt:
                        self.console.print()  # off the prompt's line
                    for watch, run in ended:
                        await self._show_watch_run(watch, run)
                    if at_prompt:
                        self.console.print(PROMPT, end="", markup=False, highlight=False)
            await self.watch_sleep(self.watch_poll_seconds)

    async def _show_watch_run(self, watch: WatchView, run: Run) -> None:
        """A watch's run that ended: its report under a headline when something changed (or there was nothing to
        compare with), else one line: nothing changed, or how the run ended."""
        report = Report.model_validate(run.report_json) if run.report_json is not None else None
        comparison = report.watch if report is not None else None
        if report is None or run.state != "done" or (comparison is not None and not comparison.changes):
            state = "failed" if report is None and run.state == "done" else run.state
            progress = RunProgress.for_run(run, state=state, error=run.error or "it wrote no report")
            about = f"Watch #{watch.id}, run {run.id}: {shortened(single_line(run.question), 80)}"
            print_unbroken(self.console, Text(f"{quiet_line(progress, comparison)} ({about})"))
            return
        headline = f"{watch_headline(run.question, report)} · watch #{watch.id}, run {run.id}"
        print_unbroken(self.console, Text(headline, style="bold"))
        delivery = self.renderer.report(report, requester=TERMINAL_USER)
        for content in delivery.messages:
            await self.messenger.post(_place(self.thread), content)

    async def _progress(self, run_id: int, progress: RunProgress) -> tuple[RunProgress, Run]:
        """The run as stored now, and `progress` with its events since then folded in (and its place in the queue)."""
        stored = await arun_with_events(self.sessions, run_id, after_seq=progress.last_seq)
        if stored is None:
            raise LookupError(f"no run {run_id}")
        run, events = stored
        progress = progress_of_stored_run(run, events, progress)
        if run.state == "queued":
            position = await aqueue_position(self.sessions, run_id)
            progress = progress.model_copy(update={"queue_position": position})
        return progress, run

    async def _history(self) -> RenderableType:
        """This terminal's latest runs (every session's), newest first, as the conversation core lists them."""
        history = await arun_history(self.sessions, platform=TERMINAL.platform, workspace=TERMINAL.workspace,
                                     channel=TERMINAL.channel, user=TERMINAL_USER, limit=HISTORY_LIMIT)
        return renderable_for(self.renderer.history(history))

    async def _latest_report_run(self) -> int | None:
        """The id of this session's latest run with a report, if any."""
        if self.thread is None:
            return None
        view = await athread_view(self.sessions, ThreadKey(TERMINAL.platform, TERMINAL.workspace, TERMINAL.channel,
                                                            self.thread))
        reported = view.last_reported if view is not None else None
        return reported.id if reported is not None else None

    async def _export(self, arguments: tuple[str, ...]) -> Text:
        """Write a run's report (without a run id, this session's latest) under `exports`; the text says where, or
        why it could not."""
        if len(arguments) == 1 and arguments[0].lower() in EXPORT_FORMATS:
            latest = await self._latest_report_run()
            if latest is None:
                return Text(f"No report in this session yet. {EXPORT_USAGE}")
            arguments = (str(latest), arguments[0])
        if not arguments or len(arguments) > 2 or not arguments[0].lstrip("#").isdigit():
            return Text(EXPORT_USAGE)
        run_id = int(arguments[0].lstrip("#"))
        output_format = arguments[1].lower() if len(arguments) == 2 else "md"
        if output_format not in EXPORT_FORMATS:
            return Text(f"Cannot export as {arguments[1]}: choose md, html or json, e.g. /export {run_id} html.")
        run = await aload_run(self.sessions, run_id)
        if run is None:
            return Text(f"There is no run {run_id}. /history lists this terminal's runs, /runs every run.")
        text = await aexport_run(self.sessions, run_id, output_format)
        if text is None:
            return Text(f"Run {run_id} has no report to export (it is {run.state}).")
        path = await asyncio.to_thread(self._save_export, run_id, output_format, text)
        return Text(f"Saved the report of run {run_id} to {path}")

    def _save_export(self, run_id: int, output_format: str, text: str) -> Path:
        """Write an exported report under `exports`; where it went."""
        self.exports.mkdir(parents=True, exist_ok=True)
        path = self.exports / f"deepthread-report-{run_id}.{output_format}"
        path.write_text(text, encoding="utf-8")
        return path.resolve()


def watch_made_note(schedule: WatchSchedule) -> str:
    """What the terminal adds once a watch is made: which day it runs on, and where its runs show."""
    if schedule.cadence == "weekly":
        when = f"It runs on {WEEKDAYS[schedule.weekday or 0]}s, today's weekday. "
    elif schedule.cadence == "monthly":
        when = f"It runs on day {schedule.day} of each month, today's date (a shorter month's last day). "
    else:
        when = ""
    return (f"{when}Its runs show here while this chat is open, and in /history; they start while a worker and the "
            "beat run (deepthread up starts both).")


def _place(thread: str | None) -> Place:
    return TERMINAL.model_copy(update={"thread": thread})


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _settle_with_line(typed: asyncio.Future[str], line: str) -> None:
    if not typed.done():
        typed.set_result(line)


def _settle_with_error(typed: asyncio.Future[str], error: BaseException) -> None:
    if not typed.done():
        typed.set_exception(error)
