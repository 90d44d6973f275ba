"""A later attempt of a run, and a stale one, write no duplicates: on SQLite and on a real PostgreSQL.

At 500 runs in one worker, leases lapsed and runs were attempted again; three attempts then crashed
storing their outcome on `UNIQUE constraint failed: sources.run_id, sources.source_id`. On SQLite the
stale attempt's check that it still owned the run was a read, which takes no lock: a new attempt
could start (and clear the findings) between that check and the stale attempt's inserts.
"""

from __future__ import annotations

import datetime as dt
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
from sqlalchemy import event, func, select, update
from sqlalchemy.orm import Session, sessionmaker

from storage.attempts import AttemptOutcome, CitationFinding, Findings, PassageFinding, SourceFinding, finish_attempt, \
    start_attempt
from tests.attempts import admitted_run
from storage.models import Citation, Message, Passage, Run, Source

pytestmark = pytest.mark.integration

LEASE_SECONDS = 30.0
# How long the test lets a new attempt try to start while a stale attempt is between its check and its inserts.
NEW_ATTEMPT_CHANCE_SECONDS = 1.0


def findings(tag: str) -> Findings:
    sources = [SourceFinding(source_id=f"s{number}", url=f"https://example.org/{tag}/{number}", title=tag, snippet=None,
                             provider="fake", published=None, fetch_status="ok", fetch_reason=None)
               for number in (1, 2)]
    passages = [PassageFinding(passage_id=f"p{number}", source_id=f"s{number}", text=f"{tag} passage {number}",
                               start=0, end=10, is_snippet=False) for number in (1, 2)]
    citations = [CitationFinding(sentence=f"{tag} claim.", verdict="supported", passage_id="p1")]
    return Findings(sources, passages, citations)


def outcome(tag: str) -> AttemptOutcome:
    return AttemptOutcome(state="done", phase_timings={}, reply_text=f"{tag} reply")


def lapse_lease(sessions: sessionmaker[Session], run_id: int) -> None:
    with sessions.begin() as session:
        session.execute(update(Run).where(Run.id == run_id)
                        .values(lease_until=dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=1)))


def counts(sessions: sessionmaker[Session], run_id: int) -> dict[str, int]:
    with sessions() as session:
        tallies = {model.__name__: session.scalar(select(func.count()).select_from(model).where(model.run_id == run_id))
                   for model in (Source, Passage, Citation)}
        tallies["replies"] = session.scalar(select(func.count()).select_from(Message).where(Message.role == "assistant"))
        return tallies


ONE_ATTEMPTS_WORTH = {"Source": 2, "Passage": 2, "Citation": 1, "replies": 1}


def test_a_second_attempt_after_a_lapsed_lease_replaces_the_findings_and_the_first_cannot_store(
        sessions: sessionmaker[Session]) -> None:
    run_id = admitted_run(sessions)
    first = start_attempt(sessions, run_id, "worker-a", LEASE_SECONDS)
    assert first is not None
    lapse_lease(sessions, run_id)
    second = start_attempt(sessions, run_id, "worker-b", LEASE_SECONDS)
    assert second is not None and second.run.attempt == 2

    assert not finish_attempt(sessions, run_id, 1, outcome("first"), findings("first"))
    assert finish_attempt(sessions, run_id, 2, outcome("second"), findings("second"))
    assert counts(sessions, run_id) == ONE_ATTEMPTS_WORTH
    with sessions() as session:
        assert set(session.scalars(select(Source.title).where(Source.run_id == run_id))) == {"second"}
        assert list(session.scalars(select(Message.text).where(Message.role == "assistant"))) == ["second reply"]


def test_storing_an_outcome_again_writes_nothing_more(sessions: sessionmaker[Session]) -> None:
    """A store tried again after an error that left its commit in doubt (it had gone through) adds nothing."""
    run_id = admitted_run(sessions)
    assert start_attempt(sessions, run_id, "worker-a", LEASE_SECONDS) is not None
    assert finish_attempt(sessions, run_id, 1, outcome("first"), findings("first"))
    assert finish_attempt(sessions, run_id, 1, outcome("first"), findings("first"))
    assert counts(sessions, run_id) == ONE_ATTEMPTS_WORTH


def test_no_new_attempt_starts_between_a_stale_attempts_check_and_its_writes(sessions: sessionmaker[Session]) -> None:
    """The first attempt's outcome is paused at its first write of findings (its ownership already checked),
    its lease lapsed meanwhile, and a second worker tries to take the run. The second must wait for the first's
    transaction: the run then has ended, so no second attempt starts, and the findings are the first's, once."""
    run_id = admitted_run(sessions)
    assert start_attempt(sessions, run_id, "worker-a", LEASE_SECONDS) is not None
    lapse_lease(sessions, run_id)
    engine = sessions.kw["bind"]
    paused, resume = threading.Event(), threading.Event()
    storing_thread: list[int] = []

    checked: list[str] = []

    def pause_at_the_first_write(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        """In the storing thread, before the first statement after its ownership check (`SELECT runs.attempt …`)."""
        if threading.get_ident() not in storing_thread or paused.is_set():
            return
        if checked:
            paused.set()
            resume.wait(timeout=30)
        elif statement.lstrip().upper().startswith("SELECT RUNS.ATTEMPT"):
            checked.append(statement)

    def store_first() -> bool:
        storing_thread.append(threading.get_ident())
        return finish_attempt(sessions, run_id, 1, outcome("first"), findings("first"))

    event.listen(engine, "before_cursor_execute", pause_at_the_first_write)
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            stored_first: Future[bool] = pool.submit(store_first)
            assert paused.wait(timeout=30), "the first attempt never reached its writes"
            second: Future[Any] = pool.submit(start_attempt, sessions, run_id, "worker-b", LEASE_SECONDS)
            # The new attempt must not get through while the stale one is mid-transaction; give it the chance.
            done_early = threading.Event()
            second.add_done_callback(lambda _: done_early.set())
            started_in_between = done_early.wait(timeout=NEW_ATTEMPT_CHANCE_SECONDS)
            resume.set()
            assert stored_first.result(timeout=60)
            assert second.result(timeout=60) is None
    finally:
        event.remove(engine, "before_cursor_execute", pause_at_the_first_write)
    assert not started_in_between
    assert counts(sessions, run_id) == ONE_ATTEMPTS_WORTH
    with sessions() as session:
        run = session.get_one(Run, run_id)
        assert (run.state, run.attempt) == ("done", 1)
        assert list(session.scalars(select(Message.text).where(Message.role == "assistant"))) == ["first reply"]
