"""A research run's progress as a streamed task list: streamed while the stream lives (the status message following
phases only), handed back to the edited status message when the stream ends early, and its final state shown once."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from chat.message import MessageRef, MessengerError, Place
from chat.slack.render import SlackRenderer
from chat.state import RunProgress, apply_event, initial_progress
from chat.tasks import ProgressTask, TaskList, TaskStreaming
from research.events import PhaseDone, PhaseStarted, PlanReady, ReadPage, SourcesRead
from research.report import Report
from storage.db import make_engine, make_session_factory
from storage.models import Base, Conversation, Run
from storage.vocabulary import DeliveredMessage
from tests.fakes.messenger import RecordingMessenger
from worker.delivery import DeliveryTarget, RunDelivery
from tests.fakes.clock import FakeClock
from tests.waiting import eventually
from worker.progress import InMemoryEditBucket
from worker.progress_stream import STREAM_BUDGET_SUFFIX, ProgressStream
from tests.unit.test_status_editor import VirtualClock, ample_bucket, settle

STREAM_TS = "500.5"
STATUS_TS = "101.0"
# A hang guard only: each wait ends as soon as the call it waits for is made.
HANG_GUARD_SECONDS = 10


class TaskStreamingMessenger(RecordingMessenger):
    """Records posts and edits, and every task-stream call; `expire_on_append` answers appends as an expired stream."""

    def __init__(self, *, expire_on_append: bool = False, streams: bool = True) -> None:
        super().__init__()
        self.expire_on_append = expire_on_append
        self.streams = streams
        self.task_calls: list[tuple[str, list[ProgressTask] | TaskList]] = []

    def streams_tasks(self, workspace: str) -> bool:
        return self.streams

    async def start_task_stream(self, place: Place, tasks: TaskList, *, recipient: str) -> MessageRef:
        self._note("start", tasks)
        return MessageRef(platform="slack", workspace=place.workspace, channel=place.channel, message_id=STREAM_TS,
                          thread=place.thread)

    async def append_task_stream(self, ref: MessageRef, tasks: list[ProgressTask]) -> None:
        self._note("append", tasks)
        if self.expire_on_append:
            raise MessengerError("message_not_in_streaming_state")

    async def stop_task_stream(self, ref: MessageRef, tasks: list[ProgressTask]) -> None:
        self._note("stop", tasks)

    async def show_task_list(self, ref: MessageRef, tasks: TaskList) -> None:
        assert ref.message_id == STREAM_TS
        self._note("edit", tasks)

    def _note(self, kind: str, tasks: list[ProgressTask] | TaskList) -> None:
        self.task_calls.append((kind, tasks))

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.task_calls]

    def status_edits(self) -> int:
        return sum(1 for ref, _ in self.edits if ref.message_id == STATUS_TS)


@pytest.fixture
def session_factory(tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    """A database file: the delivery's threads read and write it at once, as in a worker (one shared in-memory
    connection would not take that)."""
    engine = make_engine(f"sqlite:///{tmp_path}/deliveries.db")
    Base.metadata.create_all(engine)
    yield make_session_factory(engine)
    engine.dispose()


def stored_research_run(sessions: sessionmaker[Session], attempt: int = 1) -> int:
    with sessions.begin() as session:
        conversation = Conversation(platform="slack", workspace="T1", channel="C1", thread="100.0",
                                    created_by="slack:U0ALICE01")
        run = Run(conversation=conversation, workspace="T1", mode="research", question="Why is the sky blue?",
                  requested_by="slack:U0ALICE01", state="done", attempt=attempt,
                  report_json=Report(title="t", question="q", body_markdown="b").model_dump(mode="json"),
                  status_message={"platform": "slack", "workspace": "T1", "channel": "C1", "message_id": STATUS_TS,
                                  "thread": "100.0"})
        session.add(run)
        session.flush()
        return run.id


def delivery_of(sessions: sessionmaker[Session], run_id: int, messenger: TaskStreamingMessenger,
                bucket: InMemoryEditBucket | None = None) -> RunDelivery:
    return RunDelivery(sessions, DeliveryTarget.load(sessions, run_id), messenger=messenger, renderer=SlackRenderer(),
                       bucket=bucket or InMemoryEditBucket(), min_interval=0.0)


def states(run_id: int, attempt: int = 1) -> list[RunProgress]:
    """A research run's states: started, planning, its plan, planned, searching, fetching, reading, a page read."""
    progress = initial_progress(run_id=run_id, mode="research", question="Why is the sky blue?",
                                requested_by="slack:U0ALICE01", state="running", attempt=attempt)
    events = [PhaseStarted(phase="decompose", seq=1),
              PlanReady(phase="decompose", seq=2, sub_questions=["What scatters light?", "Why blue, not violet?"]),
              PhaseDone(phase="decompose", seq=3, counts={"sub_questions": 2}),
              PhaseStarted(phase="search", seq=4),
              PhaseStarted(phase="fetch", seq=5),
              PhaseStarted(phase="read", seq=6),
              SourcesRead(phase="read", seq=7, pages=[ReadPage(source_id="s1", url="https://optics.example/rayleigh",
                                                               title="Rayleigh scattering")])]
    shown = [progress]
    for event in events:
        shown.append(apply_event(shown[-1], event))
    return shown


def final(progress: RunProgress) -> RunProgress:
    return progress.model_copy(update={"state": "done"})


def recorded_progress_entry(sessions: sessionmaker[Session], run_id: int) -> DeliveredMessage:
    with sessions() as session:
        delivered = session.get(Run, run_id).delivered_messages
    return next(entry for entry in delivered if entry.kind == "progress")


def test_tasks_stream_while_the_status_message_follows_phase_changes_only(session_factory) -> None:
    run_id = stored_research_run(session_factory)
    messenger = TaskStreamingMessenger()
    assert isinstance(messenger, TaskStreaming)

    async def run() -> None:
        delivery = delivery_of(session_factory, run_id, messenger)
        shown = states(run_id)
        await delivery.on_state(shown[0])
        await eventually(lambda: messenger.kinds() == ["start"], timeout=HANG_GUARD_SECONDS)
        for number, (before, progress) in enumerate(zip(shown, shown[1:]), start=2):
            edits = messenger.status_edits()
            await delivery.on_state(progress)
            await eventually(lambda: len(messenger.task_calls) == number, timeout=HANG_GUARD_SECONDS)
            if (before.current_phase, before.state) != (progress.current_phase, progress.state):
                await eventually(lambda: messenger.status_edits() == edits + 1, timeout=HANG_GUARD_SECONDS)
        await delivery.finish(final(shown[-1]))

    asyncio.run(run())
    assert messenger.kinds() == ["start", *["append"] * 7, "stop"]
    assert [task.id for task in messenger.task_calls[2][1]] == ["sub-question-1", "sub-question-2"], \
        "only what changed is appended"
    # The first state, the five phase changes (planning, planned, searching, fetching, reading) and the final state:
    # the plan and the page read went to the stream only.
    assert messenger.status_edits() == 7
    read_task = messenger.task_calls[7][1][-1]
    assert read_task.id == "read" and [source.url for source in read_task.sources] == ["https://optics.example/rayleigh"]
    assert recorded_progress_entry(session_factory, run_id) == DeliveredMessage(
        kind="progress", final=True, ref={"platform": "slack", "workspace": "T1", "channel": "C1",
                                          "message_id": STREAM_TS, "thread": "100.0"})
    report_posts = [content for _, content, _ in messenger.posts if "here is your report" in content.text]
    assert len(report_posts) == 1


def test_task_stream_appends_draw_on_an_allowance_of_their_own_not_the_status_edits(session_factory) -> None:
    run_id = stored_research_run(session_factory)
    messenger = TaskStreamingMessenger()
    clock = FakeClock()
    bucket = InMemoryEditBucket(capacity=40, clock=clock)

    async def run() -> None:
        delivery = delivery_of(session_factory, run_id, messenger, bucket=bucket)
        shown = states(run_id)
        await delivery.on_state(shown[0])
        await eventually(lambda: messenger.kinds() == ["start"], timeout=HANG_GUARD_SECONDS)
        for number, progress in enumerate(shown[1:], start=2):
            await delivery.on_state(progress)
            await eventually(lambda: len(messenger.task_calls) == number, timeout=HANG_GUARD_SECONDS)
        await delivery.finish(final(shown[-1]))

    asyncio.run(run())
    streamed, edited = len(messenger.task_calls), messenger.status_edits()
    assert streamed > 1 and edited >= 1
    assert bucket.tokens(f"T1{STREAM_BUDGET_SUFFIX}") == 40 - streamed
    assert bucket.tokens("T1") == 40 - edited


def test_an_expired_stream_hands_progress_back_to_the_status_message_and_is_finished_by_one_edit(
    session_factory,
) -> None:
    run_id = stored_research_run(session_factory)
    messenger = TaskStreamingMessenger(expire_on_append=True)

    async def run() -> None:
        delivery = delivery_of(session_factory, run_id, messenger)
        shown = states(run_id)
        await delivery.on_state(shown[0])
        await eventually(lambda: messenger.kinds() == ["start"], timeout=HANG_GUARD_SECONDS)
        await delivery.on_state(shown[1])  # planning: its append finds the stream expired
        await eventually(lambda: delivery.progress_stream.fallen_back and delivery.editor.last_sent == shown[1],
                         timeout=HANG_GUARD_SECONDS)
        await delivery.on_state(shown[2])  # the plan: no phase change, yet the status message shows it now
        await eventually(lambda: delivery.editor.last_sent == shown[2], timeout=HANG_GUARD_SECONDS)
        await delivery.finish(final(shown[-1]))

    asyncio.run(run())
    assert messenger.kinds() == ["start", "append", "edit"], "nothing streamed after the expiry; one final edit"
    final_tasks = messenger.task_calls[-1][1]
    assert {task.id: task.status for task in final_tasks.tasks} == {
        "decompose": "complete", "sub-question-1": "complete", "sub-question-2": "complete", "search": "complete",
        "fetch": "complete", "read": "complete"}
    assert [source.text for source in final_tasks.tasks[-1].sources] == ["Rayleigh scattering"], "nothing lost"
    assert recorded_progress_entry(session_factory, run_id).final is True
    assert len([content for _, content, _ in messenger.posts if "here is your report" in content.text]) == 1

    # The resume sweep delivering again neither edits the progress message nor posts the report twice.
    again = TaskStreamingMessenger()
    asyncio.run(delivery_of(session_factory, run_id, again).finish(final(states(run_id)[-1])))
    assert again.task_calls == [] and again.posts == []


def test_a_later_attempt_finishes_the_earlier_attempt_s_progress_message_instead_of_streaming_again(
    session_factory,
) -> None:
    run_id = stored_research_run(session_factory)
    first = TaskStreamingMessenger()

    async def first_attempt() -> None:
        delivery = delivery_of(session_factory, run_id, first)
        shown = states(run_id)
        await delivery.on_state(shown[0])
        await eventually(lambda: first.kinds() == ["start"], timeout=HANG_GUARD_SECONDS)
        await delivery.on_state(shown[1])
        # Appended: the stream was recorded before.
        await eventually(lambda: first.kinds() == ["start", "append"], timeout=HANG_GUARD_SECONDS)
        await delivery.stop_progress_stream()  # the worker died here

    asyncio.run(first_attempt())
    with session_factory.begin() as session:
        session.get(Run, run_id).attempt = 2
    second = TaskStreamingMessenger()

    async def second_attempt() -> None:
        delivery = delivery_of(session_factory, run_id, second)
        shown = states(run_id, attempt=2)
        await delivery.on_state(shown[0])
        await eventually(lambda: delivery.progress_stream.fallen_back, timeout=HANG_GUARD_SECONDS)
        await delivery.finish(final(shown[-1]))

    asyncio.run(second_attempt())
    assert second.kinds() == ["edit"], "the one progress message is finished by an edit, no second stream"
    assert recorded_progress_entry(session_factory, run_id).final is True


def test_a_workspace_that_does_not_stream_tasks_gets_no_progress_stream(session_factory) -> None:
    run_id = stored_research_run(session_factory)
    messenger = TaskStreamingMessenger(streams=False)

    async def run() -> None:
        delivery = delivery_of(session_factory, run_id, messenger)
        assert delivery.progress_stream is None
        for progress in states(run_id):
            await delivery.on_state(progress)
        await delivery.finish(final(states(run_id)[-1]))

    asyncio.run(run())
    assert messenger.task_calls == [] and messenger.status_edits() >= 2


def test_a_stored_run_s_progress_keeps_its_plan_and_pages_read_for_the_resume_sweep(session_factory) -> None:
    from chat.state import progress_of_stored_run
    from storage.models import Event

    run_id = stored_research_run(session_factory)
    with session_factory.begin() as session:
        for seq, event in enumerate([PlanReady(phase="decompose", sub_questions=["What scatters light?"]),
                                     SourcesRead(phase="read", pages=[ReadPage(source_id="s1", url="https://o.example/",
                                                                               title="Optics")])], start=1):
            session.add(Event(run_id=run_id, seq=seq, type=event.type, phase=event.phase, at=event.at,
                              payload=event.model_dump(mode="json", exclude={"seq", "type", "phase", "at"})))
    with session_factory() as session:
        run = session.get(Run, run_id)
        progress = progress_of_stored_run(run, session.query(Event).filter(Event.run_id == run_id).order_by(Event.seq))
    assert progress.sub_questions == ["What scatters light?"]
    assert [(page.url, page.title) for page in progress.pages_read] == [("https://o.example/", "Optics")]


def test_while_the_process_is_overloaded_the_task_stream_sheds_as_the_status_message_does() -> None:
    # The stream's appends come out of the same overloaded delivery loop as the status edits: while it lags, a change
    # that is not a phase change waits, and a change goes out at most every 3 s, the latest state each time.
    clock = VirtualClock()
    messenger = TaskStreamingMessenger()
    busy = [False]
    stream = ProgressStream(messenger, Place(platform="slack", workspace="T1", channel="C1", thread="100.0"),
                            "slack:U0ALICE01", bucket=ample_bucket(clock), may_open=granted, record_opened=recorded,
                            on_fallback=never_falls_back, min_interval=1.0, clock=clock, sleep=clock.sleep,
                            busy=lambda: busy[0])
    initial, planning, planned, _, searching = states(1)[:5]

    async def run() -> None:
        await stream.show(initial)
        await clock.advance(1.0)
        busy[0] = True
        await stream.show(planning)  # t=1: a phase change, a second after the last: streamed
        await settle()
        assert messenger.kinds() == ["start", "append"]
        await clock.advance(1.0)
        await stream.show(planned)  # t=2: the plan alone is not a phase change: shed while overloaded
        await clock.advance(1.0)
        await stream.show(searching)  # t=3: a phase change, but the last append was at t=1
        await clock.advance(0.5)
        assert messenger.kinds() == ["start", "append"], "nothing more before t=4"
        await clock.advance(0.5)
        assert messenger.kinds() == ["start", "append", "append"], "3 s after the last append"
        appended = {task.id for task in messenger.task_calls[-1][1]}
        assert {"sub-question-1", "sub-question-2"} <= appended, "the shed plan goes out with the latest state"
        busy[0] = False
        closing = asyncio.create_task(stream.close(final(searching)))
        await clock.advance(3.0)
        assert closing.done(), "the final state is streamed at its turn"
        await closing

    asyncio.run(run())
    assert messenger.kinds()[-1] == "stop"


async def granted(attempt: int) -> bool:
    return True


async def recorded(attempt: int, ref: MessageRef) -> bool:
    return True


async def never_falls_back(progress: RunProgress) -> None:
    raise AssertionError("the stream fell back to the status message")
