"""Daily quotas through the conversation core: SQLite, fakeredis, an injected clock for the day and its reset."""

from __future__ import annotations

import asyncio
import datetime as dt
import io
from typing import Any

import fakeredis
import pytest
from rich.console import Console
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from bot.console.bundle import TERMINAL, TERMINAL_USER
from bot.console.chat import TerminalChat
from bot.conversation.core import ConversationCore, CoreSettings
from bot.conversation.events import ChatEvent
from chat.console.messenger import ConsoleMessenger
from chat.console.render import ConsoleRenderer
from chat.discord.render import DiscordRenderer
from chat.message import Content, OpenedThread, Place
from chat.render import PlatformRenderer
from chat.slack.render import SlackRenderer
from config.settings import load_settings
from storage.db import make_engine, make_session_factory
from storage.models import Base, Conversation, Event, Run
from storage.quotas import DailyQuotas
from tests.fakes.clock import FakeClock
from tests.fakes.messenger import RecordingMessenger
from worker.queue import Limits, Queue

ALICE, BOB = "slack:U0ALICE01", "slack:U0BOB0001"
# 20:48 UTC: the quotas reset at the next midnight, 3 h 12 min away.
EVENING = dt.datetime(2030, 5, 1, 20, 48, tzinfo=dt.timezone.utc)
RESET_WORDS = "00:00 UTC (in 3 h 12 min)"


class World:
    """The core with daily quotas over SQLite and fakeredis, its clock fixed at `now`."""

    def __init__(self, sessions: sessionmaker[Session], quotas: DailyQuotas, *, renderer: PlatformRenderer | None = None,
                 now: dt.datetime = EVENING, messenger: RecordingMessenger | None = None, max_queued_per_user: int = 100,
                 max_queued_per_workspace: int = 0, limits: Limits = Limits(per_user=10, per_workspace=10)) -> None:
        self.sessions = sessions
        self.now = now
        self.sent: list[int] = []
        self.messenger = messenger or RecordingMessenger()
        self.queue = Queue(sessions, fakeredis.FakeRedis(), limits, lambda name, run_id, task_id: self.sent.append(run_id))
        self.core = ConversationCore(sessions=sessions, queue=self.queue, messenger=self.messenger,
                                     renderer=renderer or SlackRenderer(),
                                     settings=CoreSettings(max_queued_per_user=max_queued_per_user,
                                                           max_queued_per_workspace=max_queued_per_workspace,
                                                           daily_quotas=quotas),
                                     clock=lambda: self.now)
        self._threads = 0

    def research(self, user: str = ALICE, workspace: str = "T1", platform: str = "slack", **fields: Any):
        event = ChatEvent(platform=platform, workspace=workspace, channel="C1", user=user, kind="command",
                          command="research", text="Why is the sea salty?", **fields)
        return asyncio.run(self.core.handle(event))

    def past_run(self, *, user: str = ALICE, workspace: str = "T1", created_at: dt.datetime, state: str = "done",
                 started: bool = True, costs: tuple[float, ...] = ()) -> int:
        """A run stored as if started at `created_at`, with one `llm_usage` event per cost."""
        self._threads += 1
        with self.sessions.begin() as session:
            conversation = Conversation(platform="slack", workspace=workspace, channel="C1",
                                        thread=f"past.{self._threads}", created_by=user, created_at=created_at)
            run = Run(conversation=conversation, workspace=workspace, mode="research", question="q", state=state,
                      requested_by=user, created_at=created_at, started_at=created_at if started else None)
            session.add(run)
            session.add_all([Event(run=run, seq=seq, type="llm_usage", phase="synthesize", at=created_at,
                                   payload={"model": "m", "prompt_tokens": 10, "completion_tokens": 5, "cost": cost})
                             for seq, cost in enumerate(costs, start=1)])
            session.flush()
            return run.id

    def runs(self) -> int:
        with self.sessions() as session:
            return session.scalar(select(func.count()).select_from(Run))


def this_morning(hour: int = 9) -> dt.datetime:
    return EVENING.replace(hour=hour, minute=0)


def test_the_shipped_defaults_cap_runs_per_person_and_runs_waiting_per_workspace_and_blank_means_off() -> None:
    shipped = CoreSettings.from_settings(load_settings())
    assert shipped.daily_quotas == DailyQuotas() == DailyQuotas(runs_per_user=50, cost_per_workspace=0)
    assert DailyQuotas().enabled
    assert shipped.max_queued_per_workspace == CoreSettings().max_queued_per_workspace == 20
    blank = load_settings(daily_runs_per_user="", daily_cost_per_workspace=" ", max_queued_per_workspace="")
    assert (blank.daily_runs_per_user, blank.daily_cost_per_workspace, blank.max_queued_per_workspace) == (0, 0.0, 0)
    assert not CoreSettings.from_settings(blank).daily_quotas.enabled
    chosen = CoreSettings.from_settings(load_settings(daily_runs_per_user="20", daily_cost_per_workspace="5.5"))
    assert chosen.daily_quotas == DailyQuotas(runs_per_user=20, cost_per_workspace=5.5)


def test_a_person_at_the_daily_run_limit_is_refused_with_the_numbers_and_the_reset_time(session_factory) -> None:
    world = World(session_factory, DailyQuotas(runs_per_user=2))
    for hour in (8, 9):
        world.past_run(created_at=this_morning(hour))
    runs_before = world.runs()
    refused = world.research()
    assert refused.run_id is None and refused.replies[0].private
    assert refused.replies[0].text == ("You have started 2 runs today, the daily limit of 2. "
                                       f"It resets at {RESET_WORDS}.")
    assert world.messenger.posts == [] and world.sent == [] and world.runs() == runs_before
    assert world.research(user=BOB).run_id is not None, "the limit is per person"


def test_yesterdays_runs_and_runs_cancelled_before_they_started_do_not_count(session_factory) -> None:
    world = World(session_factory, DailyQuotas(runs_per_user=2))
    world.past_run(created_at=this_morning(0) - dt.timedelta(seconds=1))
    world.past_run(created_at=this_morning(0) - dt.timedelta(hours=5))
    world.past_run(created_at=this_morning(10), state="cancelled", started=False)
    world.past_run(created_at=this_morning(0))
    assert world.research().run_id is not None


def test_a_new_day_lifts_the_run_limit(session_factory) -> None:
    world = World(session_factory, DailyQuotas(runs_per_user=1))
    world.past_run(created_at=this_morning(23))
    assert world.research().run_id is None
    world.now = this_morning(0) + dt.timedelta(days=1, minutes=1)
    assert world.research().run_id is not None


def test_a_workspace_over_its_daily_cost_refuses_new_runs_in_plain_words(session_factory) -> None:
    world = World(session_factory, DailyQuotas(cost_per_workspace=5.0))
    world.past_run(created_at=this_morning(8), costs=(1.25, 2.0))
    in_flight = world.past_run(user=BOB, created_at=this_morning(9), state="running", costs=(1.0, 0.75))
    refused = world.research()
    assert refused.run_id is None and refused.replies[0].private
    assert refused.replies[0].text == ("This workspace has spent $5.00 on the language model today, reaching its daily "
                                       f"limit of $5.00. Runs already going will finish; new ones can start again at "
                                       f"{RESET_WORDS}.")
    with session_factory() as session:
        assert session.get(Run, in_flight).state == "running", "a run in flight is left to finish"
    assert world.research(workspace="T2").run_id is not None, "the limit is per workspace"


def test_a_workspace_under_its_daily_cost_may_start_runs(session_factory) -> None:
    world = World(session_factory, DailyQuotas(cost_per_workspace=5.0))
    world.past_run(created_at=this_morning(8), costs=(4.99,))
    world.past_run(created_at=this_morning(0) - dt.timedelta(minutes=1), costs=(30.0,))
    assert world.research().run_id is not None


def test_a_reply_in_a_thread_is_refused_by_the_quota_too(session_factory) -> None:
    world = World(session_factory, DailyQuotas(runs_per_user=1))
    world.past_run(created_at=this_morning(8))
    refused = asyncio.run(world.core.handle(ChatEvent(platform="slack", workspace="T1", channel="C1", user=ALICE,
                                                      kind="mention", text="What about lakes?", message_id="m1")))
    assert refused.run_id is None and "daily limit of 1" in refused.replies[0].text
    assert world.messenger.posts == [] and world.sent == []


@pytest.mark.parametrize(("platform", "renderer"), [("slack", SlackRenderer()), ("discord", DiscordRenderer())])
def test_slack_and_discord_get_the_same_refusal(session_factory, platform: str, renderer: PlatformRenderer) -> None:
    world = World(session_factory, DailyQuotas(runs_per_user=1), renderer=renderer)
    user = f"{platform}:42"
    world.past_run(user=user, created_at=this_morning(8))
    refused = world.research(user=user, platform=platform)
    assert refused.run_id is None and refused.replies[0].private and RESET_WORDS in refused.replies[0].text


def test_the_terminal_chat_shows_the_quota_refusal(session_factory, tmp_path) -> None:
    console = Console(record=True, width=200, file=io.StringIO())
    messenger = ConsoleMessenger(console)
    queue = Queue(session_factory, fakeredis.FakeRedis(), Limits(per_user=1, per_workspace=10), lambda *_: None)
    core = ConversationCore(sessions=session_factory, queue=queue, messenger=messenger, renderer=ConsoleRenderer(),
                            settings=CoreSettings(daily_quotas=DailyQuotas(runs_per_user=1)), clock=lambda: EVENING)
    World(session_factory, DailyQuotas()).past_run(user=TERMINAL_USER, workspace=TERMINAL.workspace,
                                                   created_at=this_morning(8))
    lines = ["Why is the sea salty?"]

    def read_line(prompt: str) -> str:
        if not lines:
            raise EOFError
        return lines.pop(0)

    clock = FakeClock()
    chat = TerminalChat(core, session_factory, messenger, console, read_line, exports=tmp_path, clock=clock,
                        sleep=clock.sleep)
    asyncio.run(chat.run())
    screen = " ".join(console.export_text().split())
    assert f"You have started 1 run today, the daily limit of 1. It resets at {RESET_WORDS}." in screen
    with session_factory() as session:
        assert session.scalar(select(func.count()).select_from(Run)) == 1


class ThreadsOpenTogether(RecordingMessenger):
    """Opens no thread until `burst` commands are opening one: every command has counted the person's waiting runs
    (before its thread is opened) by the time any of them stores its run."""

    def __init__(self, burst: int) -> None:
        super().__init__()
        self.burst, self.opening = burst, 0
        self.all_opening = asyncio.Event()

    async def open_thread(self, place: Place, *, title: Content, status: Content) -> OpenedThread:
        self.opening += 1
        if self.opening == self.burst:
            self.all_opening.set()
        await self.all_opening.wait()
        return await super().open_thread(place, title=title, status=status)


def test_a_burst_of_commands_from_one_person_stops_at_the_queue_cap_and_each_is_answered(tmp_path) -> None:
    """Six `/research` commands of Alice's at once, none admitted (the workers are full), a cap of 3 waiting:
    three runs are stored and three commands are refused privately; the threads opened for the refused ones say
    they did not start. Counted only before opening the thread, all six were stored."""
    burst = 6
    engine = make_engine(f"sqlite:///{tmp_path}/deepthread.db")  # a file: the core's threads each take a connection
    Base.metadata.create_all(engine)
    world = World(make_session_factory(engine), DailyQuotas(), messenger=ThreadsOpenTogether(burst), max_queued_per_user=3,
                  limits=Limits(per_user=0, per_workspace=0))

    async def commands() -> list[Any]:
        events = [ChatEvent(platform="slack", workspace="T1", channel="C1", user=ALICE, kind="command",
                            command="research", text=f"Question {number}?") for number in range(burst)]
        return await asyncio.gather(*(world.core.handle(event) for event in events))

    outcomes = asyncio.run(commands())
    started = [outcome for outcome in outcomes if outcome.run_id is not None]
    refused = [outcome for outcome in outcomes if outcome.run_id is None]
    assert len(started) == 3 and world.runs() == 3
    assert len(refused) == 3
    for outcome in refused:
        assert [reply.private for reply in outcome.replies] == [True]
        assert outcome.replies[0].text.startswith("You already have 3 runs waiting in the queue (the limit is 3).")
    not_started = [content.text for _, content in world.messenger.edits if content.text.startswith("Not started:")]
    assert len(not_started) == 3
    engine.dispose()


def test_a_workspace_at_its_queue_cap_refuses_a_new_run_from_anyone_in_plain_words(session_factory) -> None:
    world = World(session_factory, DailyQuotas(), max_queued_per_workspace=2,
                  limits=Limits(per_user=0, per_workspace=0))
    assert world.research(user=ALICE).run_id is not None and world.research(user=BOB).run_id is not None
    refused = world.research(user="slack:U0CAROL01")
    assert refused.run_id is None and [reply.private for reply in refused.replies] == [True]
    assert refused.replies[0].text == ("This workspace already has 2 runs waiting in the queue (the limit is 2). "
                                       "They start as earlier ones finish; please ask again in a little while.")
    assert world.runs() == 2
    assert world.research(user="slack:U0CAROL01", workspace="T2").run_id is not None, "the cap is per workspace"


def test_a_burst_of_commands_from_many_people_stops_at_the_workspace_queue_cap(tmp_path) -> None:
    """Six people's `/research` at once in one workspace, none admitted, a workspace cap of 3: every command counted
    the workspace's waiting runs before any was stored, so only the count made with the insert holds the cap."""
    burst = 6
    engine = make_engine(f"sqlite:///{tmp_path}/deepthread.db")  # a file: the core's threads each take a connection
    Base.metadata.create_all(engine)
    world = World(make_session_factory(engine), DailyQuotas(), messenger=ThreadsOpenTogether(burst),
                  max_queued_per_workspace=3, limits=Limits(per_user=0, per_workspace=0))

    async def commands() -> list[Any]:
        events = [ChatEvent(platform="slack", workspace="T1", channel="C1", user=f"slack:U0PERSON{number}",
                            kind="command", command="research", text=f"Question {number}?") for number in range(burst)]
        return await asyncio.gather(*(world.core.handle(event) for event in events))

    outcomes = asyncio.run(commands())
    refused = [outcome for outcome in outcomes if outcome.run_id is None]
    assert world.runs() == 3 and len(refused) == 3
    for outcome in refused:
        assert [reply.private for reply in outcome.replies] == [True]
        assert outcome.replies[0].text.startswith(
            "This workspace already has 3 runs waiting in the queue (the limit is 3).")
    engine.dispose()
