"""A cite the audit adds (a model copied a passage's sentence and cited nothing) is stored as "added" and exported
as `added_by_audit`: through the worker's runner, the database and the JSON export, on SQLite."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from research.budget import ResearchOptions
from research.engine import ResearchTools
from research.llm import LLMClient
from research.providers import SearchConfig
from storage.db import make_engine, make_session_factory
from storage.models import Base, Citation, Conversation, Passage, Run, Source
from storage.runs import export_run
from storage.vocabulary import RunOptions
from tests.fakes.llm import ChatRequest, FakeLLM, HandlerResult, default_research_model
from tests.fakes.resolver import DictResolver
from worker.queue import ADMITTED
from tests.attempts import execute_stored
from worker.runner import RunnerServices

TIDES = "Tides rise and fall twice a day because of the gravitational pull of the Moon on the oceans."
TURBINES = "The Zorblax turbine array delivered 1,011 kilowatt hours of tidal energy during its trial."


@pytest.fixture
def sessions(tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(f"sqlite:///{tmp_path / 'deepthread.db'}")
    Base.metadata.create_all(engine)
    yield make_session_factory(engine)
    engine.dispose()


def follow_up_on_a_finished_run(sessions: sessionmaker[Session]) -> int:
    """A research run that read two passages, and a follow-up admitted to answer from them; the follow-up's id."""
    with sessions.begin() as session:
        conversation = Conversation(platform="slack", workspace="T1", channel="C1", thread="1.0", created_by="slack:U1")
        earlier = Run(conversation=conversation, workspace="T1", mode="research", question="How do tides work?",
                      requested_by="slack:U1", state="done", attempt=1)
        for number, text in enumerate((TIDES, TURBINES), start=1):
            source = Source(run=earlier, source_id=f"s{number}", url=f"https://s{number}.example/", title=f"Page {number}",
                            provider="brave")
            session.add(Passage(run=earlier, source=source, passage_id=f"p{number}", text=text, start=0, end=len(text)))
        session.add(earlier)
        session.flush()
        follow_up = Run(conversation=conversation, workspace="T1", mode="followup", question="Why do tides happen?",
                        requested_by="slack:U1", options=RunOptions(answer_from_run=earlier.id), celery_task_id="task-2",
                        lease_owner=ADMITTED, lease_until=dt.datetime.now(dt.timezone.utc) + dt.timedelta(minutes=5))
        session.add(follow_up)
        session.flush()
        return follow_up.id


def copying_without_citing(request: ChatRequest) -> HandlerResult:
    """A weak model: its answer copies a passage's sentence word for word and cites nothing."""
    if request.schema_name is not None:
        return default_research_model(request)
    return TIDES


def services(sessions: sessionmaker[Session]) -> RunnerServices:
    model = FakeLLM(copying_without_citing)
    nowhere = httpx.AsyncClient(transport=httpx.MockTransport(lambda request: httpx.Response(404)))
    tools = ResearchTools(llm=LLMClient(model.config(), http_client=model.http_client()), search_config=SearchConfig(),
                          search_http=nowhere, resolver=DictResolver({}))
    return RunnerServices(sessions=sessions, tools=tools, options=ResearchOptions())


def test_a_cite_the_audit_added_is_stored_as_added_and_exported_as_added_by_audit(sessions) -> None:
    run_id = follow_up_on_a_finished_run(sessions)
    final = asyncio.run(execute_stored(run_id, services(sessions)))
    assert final is not None and final.state == "done"

    with sessions() as session:
        citations = session.scalars(select(Citation).where(Citation.run_id == run_id)).all()
        assert [(citation.verdict, citation.passage.passage_id if citation.passage else None, citation.sentence)
                for citation in citations] == [("added", "p1", TIDES)]
        report_markdown = session.get(Run, run_id).report_markdown or ""
    assert f"{TIDES[:-1]} [1]." in report_markdown and "unverified" not in report_markdown

    exported = json.loads(export_run(sessions, run_id, "json") or "{}")
    assert [(passage["id"], passage["added_by_audit"], passage["added_to"]) for passage in exported["cited_passages"]] == [
        ("p1", True, [TIDES])]
    assert (exported["audit"]["citations_added"], exported["audit"]["sentences_verified"]) == (1, 1)
