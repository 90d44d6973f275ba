"""A stored run's sources as a watch's next run compares them (`research.changes.compute_changes`)."""

from __future__ import annotations

from sqlalchemy import select

from research.changes import PassageSnapshot, SourceSnapshot
from storage.db import Sessions, off_loop
from storage.models import Passage, Source


def source_snapshots(sessions: Sessions, run_id: int) -> list[SourceSnapshot]:
    """The run's sources in the order they were stored, each with its text's checksum and its passages in text order
    (a source with no title is named by its URL); empty for a run with no sources or no such run."""
    with sessions() as session:
        sources = session.execute(
            select(Source.id, Source.url, Source.title, Source.checksum, Source.file)
            .where(Source.run_id == run_id).order_by(Source.id)).all()
        passages = session.execute(
            select(Passage.source_row_id, Passage.passage_id, Passage.text, Passage.is_snippet)
            .where(Passage.run_id == run_id).order_by(Passage.source_row_id, Passage.start, Passage.id)).all()
    by_source: dict[int, list[PassageSnapshot]] = {}
    for source_row_id, passage_id, text, is_snippet in passages:
        by_source.setdefault(source_row_id, []).append(PassageSnapshot(passage_id, text, bool(is_snippet)))
    return [SourceSnapshot.of(url, title, checksum, file, by_source.get(row_id, []))
            for row_id, url, title, checksum, file in sources]


asource_snapshots = off_loop(source_snapshots)
