"""`deepthread prune` (by age, and `--workspace`) and its storage on the migrated schema, on SQLite and on a real
PostgreSQL."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner

from bot.cli import app
from storage.db import make_engine, make_session_factory
from storage.migrate import upgrade
from storage.vocabulary import WatchSchedule
from storage.models import Citation, Conversation, Event, Feedback, Message, Passage, Run, Source, Watch
from storage.retention import PruneCounts, count_prunable, count_workspace, forget_workspace, parse_age, prune

pytestmark = pytest.mark.integration

NOW = dt.datetime.now(dt.timezone.utc)
OLD = NOW - dt.timedelta(days=100)
CUTOFF = NOW - dt.timedelta(days=90)


def in_an_hour() -> dt.datetime:
    """A moment still ahead when prune runs: the database's clock judges leases and retries, and NOW (set when the
    module was imported) may be minutes old by then."""
    return dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1)


class Threads:
    """Stores conversations and runs with everything a run gathers, at chosen ages."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.sessions = sessions
        self.count = 0

    def conversation(self, created_at: dt.datetime = OLD, messages: int = 2, *, workspace: str = "T1",
                     platform: str = "slack") -> int:
        self.count += 1
        with self.sessions.begin() as session:
            conversation = Conversation(platform=platform, workspace=workspace, channel="C1", thread=f"{self.count}.0",
                                        created_by="slack:U1", created_at=created_at)
            session.add(conversation)
            session.add_all([Message(conversation=conversation, role="user", author="slack:U1", text=f"m{index}",
                                     created_at=created_at) for index in range(messages)])
            session.flush()
            return conversation.id

    def message(self, conversation_id: int, created_at: dt.datetime, author: str = "slack:U0NEVERASKED") -> int:
        """A reply in the thread, as the bot stores any reply in a thread it answers in."""
        with self.sessions.begin() as session:
            message = Message(conversation_id=conversation_id, role="user", author=author, text="a reply",
                              created_at=created_at)
            session.add(message)
            session.flush()
            return message.id

    def run(self, conversation_id: int, *, created_at: dt.datetime = OLD, state: str = "done", **fields) -> int:
        """A run with 2 sources, 3 passages, 2 citations and 4 events."""
        with self.sessions() as session:
            workspace = session.get_one(Conversation, conversation_id).workspace
        with self.sessions.begin() as session:
            run = Run(conversation_id=conversation_id, workspace=workspace, mode="research", question="q", state=state,
                      requested_by="slack:U1", created_at=created_at, **fields)
            sources = [Source(run=run, source_id=f"s{index}", url=f"https://example.com/{index}") for index in (1, 2)]
            passages = [Passage(run=run, source=sources[index % 2], passage_id=f"p{index}", text="t", start=0, end=1)
                        for index in (1, 2, 3)]
            citations = [Citation(run=run, passage=passages[index], sentence="s", verdict="supported") for index in (0, 1)]
            events = [Event(run=run, seq=seq, type="progress", payload={}, at=created_at) for seq in (1, 2, 3, 4)]
            session.add_all([run, *sources, *passages, *citations, *events])
            session.flush()
            return run.id

    def left(self, model: type) -> int:
        with self.sessions() as session:
            return session.scalar(select(func.count()).select_from(model))

    def ids(self, model: type) -> set[int]:
        with self.sessions() as session:
            return set(session.scalars(select(model.id)))


def test_parse_age_reads_minutes_hours_days_weeks_and_months() -> None:
    assert [parse_age(text) for text in ("90d", "12h", "2w", "30min", " 7D ", "3mo")] == [
        dt.timedelta(days=90), dt.timedelta(hours=12), dt.timedelta(weeks=2), dt.timedelta(minutes=30),
        dt.timedelta(days=7), dt.timedelta(days=90)]
    for bad in ("90", "d", "0d", "1y", "-3d", "1.5d", "", "30m"):
        with pytest.raises(ValueError):
            parse_age(bad)


def test_prune_deletes_old_finished_runs_with_everything_they_own_and_keeps_the_rest(
        sessions: sessionmaker[Session]) -> None:
    threads = Threads(sessions)
    gone_thread = threads.conversation()
    gone_runs = {threads.run(gone_thread), threads.run(gone_thread, state="failed")}
    shared_thread = threads.conversation()
    gone_runs.add(threads.run(shared_thread, state="cancelled"))
    kept_runs = {threads.run(shared_thread, created_at=NOW - dt.timedelta(days=1))}
    running_thread = threads.conversation()
    kept_runs.add(threads.run(running_thread, state="running"))
    retrying_thread = threads.conversation()
    kept_runs.add(threads.run(retrying_thread, delivery_retry_at=in_an_hour()))
    delivering_thread = threads.conversation()
    kept_runs.add(threads.run(delivering_thread, lease_owner="delivering", lease_until=in_an_hour()))
    runless_old_thread = threads.conversation(messages=3)
    recent_thread = threads.conversation(created_at=NOW - dt.timedelta(days=3))
    kept_runs.add(threads.run(recent_thread, created_at=NOW - dt.timedelta(days=3), state="timed_out"))

    # Messages: the 5 of the two runless threads, and the old ones (2 each) of the shared, retrying and delivering
    # threads; the running thread's stay while its run is in flight, the recent thread's are new.
    expected = PruneCounts(runs=3, sources=6, passages=9, citations=6, events=12, conversations=2, messages=11)
    assert count_prunable(sessions, CUTOFF) == expected
    assert threads.left(Run) == 8 and threads.left(Citation) == 16, "a dry run deletes nothing"
    assert threads.left(Message) == 15

    counts = prune(sessions, CUTOFF, batch_size=2)
    # Two batches of runs, one of conversations, three of old messages.
    assert counts == expected.model_copy(update={"batches": 6})
    assert threads.ids(Run) == kept_runs
    assert threads.ids(Conversation) == {shared_thread, running_thread, retrying_thread, delivering_thread,
                                         recent_thread}
    assert gone_thread not in threads.ids(Conversation) and runless_old_thread not in threads.ids(Conversation)
    with sessions() as session:
        for model in (Source, Passage, Citation, Event):
            assert not set(session.scalars(select(model.run_id).where(model.run_id.in_(gone_runs)))), model.__name__
        assert set(session.scalars(select(Message.conversation_id))) == {running_thread, recent_thread}
    assert threads.left(Source) == 2 * len(kept_runs) and threads.left(Event) == 4 * len(kept_runs)
    assert prune(sessions, CUTOFF) == PruneCounts(), "a second prune finds nothing"


def test_prune_command_counts_on_a_dry_run_then_deletes(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path}/deepthread.db"
    monkeypatch.setenv("DATABASE_URL", url)
    engine = make_engine(url)
    upgrade(url, engine=engine)
    threads = Threads(make_session_factory(engine))
    threads.run(threads.conversation())
    runner = CliRunner()

    dry = runner.invoke(app, ["prune", "--older-than", "90d", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert dry.output.startswith("Would delete 1 run created before ") and "4 events" in dry.output
    assert threads.left(Run) == 1

    done = runner.invoke(app, ["prune", "--older-than", "90d"])
    assert done.exit_code == 0, done.output
    assert done.output.startswith("Deleted 1 run ") and "1 conversation left with no run and 2 messages" in done.output
    assert threads.left(Run) == 0 and threads.left(Message) == 0

    bad = runner.invoke(app, ["prune", "--older-than", "90 days"])
    assert bad.exit_code == 2 and "not an age such as 90d" in bad.output
    engine.dispose()


def test_prune_deletes_old_messages_of_a_thread_that_lives_on_but_not_while_a_run_of_it_is_in_flight(
        sessions: sessionmaker[Session]) -> None:
    threads = Threads(sessions)
    living = threads.conversation(messages=0)
    old_reply = threads.message(living, OLD)  # someone who never used the bot, replying in its thread long ago
    new_reply = threads.message(living, NOW - dt.timedelta(days=1))
    kept_run = threads.run(living, created_at=NOW - dt.timedelta(days=1))
    busy = threads.conversation(messages=0)
    busy_reply = threads.message(busy, OLD)
    busy_run = threads.run(busy, created_at=NOW - dt.timedelta(minutes=5), state="running")

    assert count_prunable(sessions, CUTOFF) == PruneCounts(messages=1)
    assert prune(sessions, CUTOFF) == PruneCounts(messages=1, batches=1)
    assert threads.ids(Message) == {new_reply, busy_reply}, "a thread with a run in flight keeps its history for now"
    assert old_reply not in threads.ids(Message)
    assert threads.ids(Run) == {kept_run, busy_run} and threads.ids(Conversation) == {living, busy}

    with sessions.begin() as session:
        session.get_one(Run, busy_run).state = "done"
    assert prune(sessions, CUTOFF) == PruneCounts(messages=1, batches=1)
    assert threads.ids(Message) == {new_reply}


def test_forgetting_a_workspace_deletes_its_threads_messages_and_runs_stops_those_in_flight_and_nothing_of_another(
        sessions: sessionmaker[Session]) -> None:
    threads = Threads(sessions)
    gone = threads.conversation(created_at=NOW)
    threads.message(gone, NOW)
    finished = threads.run(gone, created_at=NOW)
    threads.run(threads.conversation(created_at=NOW), created_at=NOW, state="failed")
    threads.conversation(created_at=NOW)  # a thread the bot answered nothing in yet
    running_thread = threads.conversation(created_at=NOW)
    running = threads.run(running_thread, created_at=NOW, state="running", lease_owner="worker-1",
                          lease_until=in_an_hour())
    queued_thread = threads.conversation(created_at=NOW)
    queued = threads.run(queued_thread, created_at=NOW, state="queued")
    with sessions.begin() as session:
        session.add(Feedback(run_id=finished, user="slack:U1", value=1))
    other = threads.conversation(workspace="T2")
    other_run = threads.run(other)

    expected = PruneCounts(runs=2, sources=4, passages=6, citations=4, events=8, conversations=3, messages=7,
                           kept_conversations=2, in_flight=[running, queued], running=[running])
    assert count_workspace(sessions, "T1") == expected
    assert threads.left(Run) == 5, "counting deletes nothing"
    assert forget_workspace(sessions, "T1", by="deepthread prune", batch_size=2) == expected.model_copy(
        update={"batches": 2})
    assert threads.ids(Conversation) == {running_thread, queued_thread, other}
    assert threads.ids(Run) == {running, queued, other_run} and threads.left(Feedback) == 0
    with sessions() as session:
        assert (session.get_one(Run, running).state, session.get_one(Run, running).cancelled_by) == (
            "running", "deepthread prune"), "its worker reads the stop from the row"
        assert session.get_one(Run, queued).state == "cancelled"

    with sessions.begin() as session:
        session.get_one(Run, running).state = "cancelled"  # its worker saw the stop
    assert forget_workspace(sessions, "T1", by="deepthread prune") == PruneCounts(
        runs=2, sources=4, passages=6, citations=4, events=8, conversations=2, messages=4, batches=1)
    assert threads.ids(Conversation) == {other} and threads.ids(Run) == {other_run}
    assert threads.left(Message) == 2
    assert threads.left(Source) == 2 and threads.left(Passage) == 3 and threads.left(Citation) == 2
    assert threads.left(Event) == 4
    assert forget_workspace(sessions, "T1", by="deepthread prune") == PruneCounts(), "a last time finds nothing"
    assert forget_workspace(sessions, "T2", by="deepthread prune", platform="discord") == PruneCounts(), (
        "another platform's T2 is not this")


def test_prune_command_forgets_one_workspace_and_wants_an_age_or_a_workspace(tmp_path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path}/deepthread.db"
    monkeypatch.setenv("DATABASE_URL", url)
    engine = make_engine(url)
    upgrade(url, engine=engine)
    threads = Threads(make_session_factory(engine))
    threads.run(threads.conversation(created_at=NOW, workspace="T0GONE"), created_at=NOW)
    kept = threads.run(threads.conversation(created_at=NOW, workspace="T0KEPT"), created_at=NOW)
    with make_session_factory(engine).begin() as session:  # a watch in each workspace
        session.add_all([Watch(platform="slack", workspace=workspace, channel="C1", thread="1.1", created_by="slack:U1",
                               question="Tides?", schedule=WatchSchedule(cadence="daily", hour=9), next_due_at=NOW)
                         for workspace in ("T0GONE", "T0KEPT")])
    runner = CliRunner()

    dry = runner.invoke(app, ["prune", "--workspace", "T0GONE", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert dry.output.startswith("Would delete everything stored of workspace T0GONE: 1 conversation, with 2 messages "
                                 "and 1 run (with 2 sources, 3 passages, 2 citations and 4 events), and 1 watch.")
    assert threads.left(Run) == 2 and threads.left(Watch) == 2

    done = runner.invoke(app, ["prune", "--workspace", "T0GONE"])
    assert done.exit_code == 0, done.output
    assert done.output.startswith("Deleted everything stored of workspace T0GONE: 1 conversation")
    assert threads.ids(Run) == {kept} and threads.left(Message) == 2
    with make_session_factory(engine)() as session:
        assert [watch.workspace for watch in session.scalars(select(Watch))] == ["T0KEPT"]

    for arguments in ([], ["--older-than", "90d", "--workspace", "T0KEPT"]):
        refused = runner.invoke(app, ["prune", *arguments])
        assert refused.exit_code == 2 and "Give --older-than AGE or --workspace ID" in refused.output, arguments
    assert threads.ids(Run) == {kept}
    engine.dispose()
