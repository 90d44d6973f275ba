"""A stored run's sources read back as a watch's next run compares them (storage.snapshots), on SQLite and
PostgreSQL."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy.orm import Session, sessionmaker

from research.changes import PassageSnapshot, SourceSnapshot
from storage.models import Conversation, Passage, Run, Source
from storage.snapshots import asource_snapshots, source_snapshots

pytestmark = pytest.mark.integration


def stored_run(sessions: sessionmaker[Session], thread: str = "1.0") -> int:
    """A finished run with a page read (its passages stored out of text order), a snippet-only source without a
    title, and a source never fetched; the run's id."""
    with sessions.begin() as session:
        conversation = Conversation(platform="slack", workspace="T1", channel="C1", thread=thread, created_by="slack:U1")
        run = Run(conversation=conversation, workspace="T1", mode="research", question="What does Pro cost?",
                  requested_by="slack:U1", state="done", attempt=1)
        read = Source(run=run, source_id="s1", url="https://shop.example/pricing", title="Pricing", checksum="c" * 64)
        snippet_only = Source(run=run, source_id="s2", url="https://news.example/pro", title=None)
        unfetched = Source(run=run, source_id="s3", url="https://blog.example/", title="Blog")
        session.add_all([read, snippet_only, unfetched])
        session.add_all([
            Passage(run=run, source=read, passage_id="p2", text="Teams get five seats.", start=40, end=61),
            Passage(run=run, source=read, passage_id="p1", text="The Pro plan costs $29.", start=0, end=23),
            Passage(run=run, source=snippet_only, passage_id="p3", text="Pro now $35", start=0, end=11,
                    is_snippet=True),
        ])
        session.flush()
        return run.id


def test_a_run_s_sources_come_back_in_order_with_checksums_and_passages_in_text_order(
        sessions: sessionmaker[Session]) -> None:
    run_id = stored_run(sessions)
    other_run = stored_run(sessions, thread="2.0")

    assert source_snapshots(sessions, run_id) == [
        SourceSnapshot(url="https://shop.example/pricing", title="Pricing", checksum="c" * 64,
                       passages=(PassageSnapshot("p1", "The Pro plan costs $29."),
                                 PassageSnapshot("p2", "Teams get five seats."))),
        SourceSnapshot(url="https://news.example/pro", title="https://news.example/pro", checksum=None,
                       passages=(PassageSnapshot("p3", "Pro now $35", is_snippet=True),)),
        SourceSnapshot(url="https://blog.example/", title="Blog", checksum=None, passages=()),
    ]

    async def read_off_the_loop() -> list[SourceSnapshot]:
        return await asource_snapshots(sessions, other_run)

    assert asyncio.run(read_off_the_loop()) == source_snapshots(sessions, run_id)


def test_a_run_without_sources_has_no_snapshots(sessions: sessionmaker[Session]) -> None:
    assert source_snapshots(sessions, stored_run(sessions) + 100) == []
