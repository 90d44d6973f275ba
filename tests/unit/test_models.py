from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import Engine, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from storage.models import Citation, Conversation, Event, Message, Passage, Run, Source
from storage.vocabulary import RunOptions


def make_run(session: Session) -> Run:
    conversation = Conversation(platform="slack", workspace="T1", channel="C1", thread="1700000000.000100", created_by="U1")
    run = Run(conversation=conversation, workspace="T1", mode="research", question="Why is the sky blue?", requested_by="U1")
    session.add(run)
    session.flush()
    return run


def add_gathered_rows(session: Session, run: Run) -> None:
    source = Source(run=run, source_id="s1", url="https://example.com/a", title="A", provider="brave")
    passage = Passage(run=run, source=source, passage_id="p1", text="Rayleigh scattering.", start=0, end=20)
    session.add_all([
        source, passage,
        Citation(run=run, passage=passage, sentence="The sky is blue because of Rayleigh scattering.", verdict="supported"),
        Event(run=run, seq=1, type="phase_started", phase="decompose", payload={}),
        Event(run=run, seq=2, type="complete", payload={"partial": False}),
    ])
    session.flush()


def count(session: Session, model: type) -> int:
    return session.scalar(select(func.count()).select_from(model)) or 0


def test_run_defaults_are_queued_attempt_zero_and_not_partial(session_factory: sessionmaker[Session]) -> None:
    with session_factory() as session:
        run = make_run(session)
        session.commit()
        assert (run.state, run.attempt, run.partial, run.options) == ("queued", 0, False, RunOptions())
        assert run.created_at.tzinfo is not None


def test_conversation_relations_list_messages_and_runs(session_factory: sessionmaker[Session]) -> None:
    with session_factory() as session:
        run = make_run(session)
        session.add(Message(conversation=run.conversation, role="user", author="U1", text="hello", mode="chat"))
        session.commit()
        conversation = session.get(Conversation, run.conversation_id)
        assert [message.text for message in conversation.messages] == ["hello"]
        assert [r.id for r in conversation.runs] == [run.id]


def test_run_relations_reach_everything_it_gathered(session_factory: sessionmaker[Session]) -> None:
    with session_factory() as session:
        run = make_run(session)
        add_gathered_rows(session, run)
        session.commit()
        session.expire_all()
        run = session.get(Run, run.id)
        assert [s.source_id for s in run.sources] == ["s1"]
        assert [p.passage_id for p in run.passages] == ["p1"]
        assert run.passages[0].source.url == "https://example.com/a"
        assert run.citations[0].passage.passage_id == "p1"
        assert [e.seq for e in run.events] == [1, 2]


def test_deleting_a_run_deletes_its_sources_passages_citations_and_events(session_factory: sessionmaker[Session]) -> None:
    with session_factory() as session:
        run = make_run(session)
        add_gathered_rows(session, run)
        session.commit()
        session.delete(run)
        session.commit()
        assert [count(session, model) for model in (Run, Source, Passage, Citation, Event)] == [0, 0, 0, 0, 0]
        assert count(session, Conversation) == 1


def test_database_level_cascade_removes_rows_without_the_orm(sqlite_engine: Engine, session_factory: sessionmaker[Session]) -> None:
    with session_factory() as session:
        run = make_run(session)
        add_gathered_rows(session, run)
        session.commit()
        run_id = run.id
    with sqlite_engine.begin() as connection:
        connection.execute(Run.__table__.delete().where(Run.id == run_id))
    with session_factory() as session:
        assert [count(session, model) for model in (Source, Passage, Citation, Event)] == [0, 0, 0, 0]


def test_deleting_a_conversation_deletes_its_messages_and_runs(session_factory: sessionmaker[Session]) -> None:
    with session_factory() as session:
        run = make_run(session)
        session.add(Message(conversation=run.conversation, role="user", author="U1", text="hi"))
        add_gathered_rows(session, run)
        session.commit()
        session.delete(run.conversation)
        session.commit()
        assert [count(session, model) for model in (Conversation, Message, Run, Source, Event)] == [0, 0, 0, 0, 0]


@pytest.mark.parametrize(
    "duplicate",
    [
        lambda run, source: Source(run=run, source_id="s1", url="https://other.example"),
        lambda run, source: Passage(run=run, source=source, passage_id="p1", text="again", start=0, end=5),
        lambda run, source: Event(run=run, seq=1, type="progress"),
    ],
    ids=["run-sN", "run-pN", "run-seq"],
)
def test_ids_are_unique_within_a_run(session_factory: sessionmaker[Session], duplicate) -> None:
    with session_factory() as session:
        run = make_run(session)
        add_gathered_rows(session, run)
        session.commit()
        source = run.sources[0]
        session.add(duplicate(run, source))
        with pytest.raises(IntegrityError):
            session.flush()


def test_same_ids_are_allowed_in_different_runs(session_factory: sessionmaker[Session]) -> None:
    with session_factory() as session:
        first = make_run(session)
        add_gathered_rows(session, first)
        first.state = "done"
        second = Run(conversation=first.conversation, workspace="T1", mode="research", question="q2", requested_by="U1")
        session.add(second)
        add_gathered_rows(session, second)
        session.commit()
        assert count(session, Source) == 2


def test_one_conversation_per_thread(session_factory: sessionmaker[Session]) -> None:
    with session_factory() as session:
        make_run(session)
        session.add(Conversation(platform="slack", workspace="T1", channel="C1", thread="1700000000.000100", created_by="U2"))
        with pytest.raises(IntegrityError):
            session.flush()


def test_naive_datetimes_are_refused(session_factory: sessionmaker[Session]) -> None:
    with session_factory() as session:
        run = make_run(session)
        run.lease_until = dt.datetime(2026, 1, 1)
        with pytest.raises(Exception, match="naive datetime"):
            session.flush()


def test_sqlite_runs_with_foreign_keys_and_busy_timeout(tmp_path) -> None:
    from sqlalchemy import text

    from storage.db import make_engine

    engine = make_engine(f"sqlite:///{tmp_path}/x/deep.db")
    with engine.connect() as connection:
        assert connection.execute(text("PRAGMA foreign_keys")).scalar() == 1
        assert connection.execute(text("PRAGMA busy_timeout")).scalar() == 30000
        assert connection.execute(text("PRAGMA journal_mode")).scalar() == "wal"
    engine.dispose()


def test_a_conversation_holds_at_most_one_run_in_flight(session_factory: sessionmaker[Session]) -> None:
    with session_factory() as session:
        first = make_run(session)
        session.add(Run(conversation=first.conversation, workspace="T1", mode="chat", question="q2", requested_by="U1"))
        with pytest.raises(IntegrityError):
            session.flush()
        session.rollback()
        first = make_run(session)
        first.state = "done"
        session.add(Run(conversation=first.conversation, workspace="T1", mode="chat", question="q2", requested_by="U1"))
        session.flush()
