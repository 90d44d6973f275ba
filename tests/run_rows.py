"""Run rows as the tests read and finish them (what a worker would have written, without a worker), on a migrated
database of the test's own."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import fakeredis
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from research.report import Report, ReportSource
from storage.db import make_engine, make_session_factory
from storage.migrate import upgrade
from storage.models import Run
from worker.queue import Limits, Queue


@contextmanager
def migrated_sqlite(folder: Path) -> Iterator[tuple[str, sessionmaker[Session]]]:
    """A migrated SQLite database in `folder`: its URL and sessions on it (the engine is disposed after)."""
    database_url = f"sqlite:///{folder}/deepthread.db"
    engine = make_engine(database_url)
    upgrade(database_url, engine=engine)
    try:
        yield database_url, make_session_factory(engine)
    finally:
        engine.dispose()


def all_runs(sessions: sessionmaker[Session]) -> list[Run]:
    """Every run, oldest first."""
    with sessions() as session:
        return list(session.scalars(select(Run).order_by(Run.id)))


def finish_run(sessions: sessionmaker[Session], run_id: int, state: str = "done", report: Report | None = None,
               **fields: object) -> None:
    """Put the run in `state` with `report` and any other `fields`, as the worker would at its end."""
    with sessions.begin() as session:
        run = session.get(Run, run_id)
        run.state = state
        if report is not None:
            run.report_json = report.model_dump(mode="json")
        for name, value in fields.items():
            setattr(run, name, value)


def one_source_report(question: str) -> Report:
    """A short finished report on `question` citing one source."""
    return Report(
        title=f"On {question}", question=question, body_markdown=f"What we found about {question} [1].",
        sources=[ReportSource(number=1, source_id="s1", url="https://example.org/tides", title="Tides")],
    )


def queue_without_workers(sessions: sessionmaker[Session]) -> Queue:
    """A queue that admits runs but sends them to no worker: the runs stay as the core recorded them."""
    return Queue(sessions, fakeredis.FakeRedis(), Limits(per_user=10, per_workspace=10), lambda *submitted: None)
