"""Read: main text out of each fetched page (extraction starts as each page arrives), chunked into passages `pN`, ranked per sub-question.

Every passage is made from text whose sentences addressed to an AI are replaced by a marker (`defuse_injections`),
so the model is never shown, and never cites, an order planted in a page.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Sequence
from concurrent.futures import Executor
from typing import NamedTuple

from research.budget import ResearchOptions
from research.changes import text_checksum
from research.cpu import run_cpu
from research.models import Document, FetchResult, Passage, SearchResult
from research.passages import assign_passage_ids
from research.readers import extract_document
from research.phases.decompose import Decomposition
from research.rank import rank_passages_for_queries, select_passages
from research.untrusted import defuse_injections

logger = logging.getLogger(__name__)

# The ranking of the shared files' passages, taken before the sub-questions' (research.rank.select_passages).
SHARED_FILES = "shared files"


async def extract_page(source_id: str, page: FetchResult, *, cpu_pool: Executor | None) -> Document | None:
    """The page's main text, extracted in the CPU pool, with its checksum; None when nothing is readable or extraction
    failed, was killed or ran out of memory."""
    url = page.final_url or page.url
    try:
        document = await run_cpu(extract_document, url, page.body, page.content_type, pool=cpu_pool)
    except Exception as error:  # a parser's error, a killed or dead child, memory: only this page is lost
        # The error's type only (parsers quote the page), and the source id, not a URL the question may have held.
        logger.warning("no text from %s: %s", source_id, type(error).__name__)
        return None
    if document is None or not document.text.strip():
        return None
    return document.model_copy(update={"checksum": text_checksum(document.text)})


async def extract_pages(pages: list[tuple[str, FetchResult]], *, cpu_pool: Executor | None) -> dict[str, Document]:
    """Each page's main text, extracted in the CPU pool; pages with nothing readable, or whose extraction failed, are left out."""
    extracted = await asyncio.gather(*(extract_page(source_id, page, cpu_pool=cpu_pool) for source_id, page in pages))
    return {source_id: document for (source_id, _page), document in zip(pages, extracted) if document is not None}


class PageReader:
    """Starts each page's extraction as soon as the page is fetched, so reading overlaps the fetching of the others."""

    def __init__(self, *, cpu_pool: Executor | None) -> None:
        self._cpu_pool = cpu_pool
        self._extracting: dict[str, asyncio.Task[Document | None]] = {}

    def start(self, source_id: str, page: FetchResult) -> None:
        """Begin extracting `page` (once per source) without waiting for it."""
        under_way = self._extracting.get(source_id)
        if under_way is None or under_way.cancelled():
            self._extracting[source_id] = asyncio.create_task(
                extract_page(source_id, page, cpu_pool=self._cpu_pool), name=f"extract {source_id}")

    async def documents(self, pages: list[tuple[str, FetchResult]]) -> dict[str, Document]:
        """The main text of `pages`, waiting for extractions already under way and starting any not started yet."""
        for source_id, page in pages:
            self.start(source_id, page)
        # Shielded: a gathering cut short by the time budget leaves the extractions for the final read.
        extracted = await asyncio.gather(*(asyncio.shield(self._extracting[source_id]) for source_id, _page in pages))
        for source_id, _page in pages:
            # Done with: the task holds the page's body, which a long run should not keep.
            self._extracting.pop(source_id, None)
        return {source_id: document for (source_id, _page), document in zip(pages, extracted) if document is not None}

    def cancel(self) -> None:
        """Stop the extractions still under way (the run is over)."""
        for task in self._extracting.values():
            task.cancel()
        self._extracting.clear()


class ReadPassages(NamedTuple):
    """Passages made from pages, and the distinctive words of the page text addressed to an AI that they leave out."""

    passages: list[Passage]
    tainted_words: frozenset[str]


def defused(documents: Sequence[tuple[str, Document]]) -> tuple[list[tuple[str, Document]], frozenset[str]]:
    """Each (source id, document) with its sentences addressed to an AI replaced by a marker, and those sentences'
    distinctive words; passage offsets then count in the defused text."""
    kept: list[tuple[str, Document]] = []
    tainted: set[str] = set()
    for source_id, document in documents:
        text, words = defuse_injections(document.text)
        kept.append((source_id, document if text == document.text else document.model_copy(update={"text": text})))
        tainted |= words
    return kept, frozenset(tainted)


def read_passages(documents: dict[str, Document], *, first_number: int) -> ReadPassages:
    """Passages of `documents` in source order, numbered from `first_number`, made from defused text (`defused`),
    with the words that no query the model writes later may carry."""
    ordered, tainted = defused(sorted(documents.items(), key=lambda item: int(item[0][1:])))
    return ReadPassages(assign_passage_ids(ordered, first_number=first_number), tainted)


def passages_for(documents: dict[str, Document], *, first_number: int) -> list[Passage]:
    """Passages of `documents` in source order, numbered from `first_number`, made from defused text."""
    return read_passages(documents, first_number=first_number).passages


def snippet_passages(sources: list[SearchResult]) -> list[Passage]:
    """When no page could be read: the search snippets as passages, marked as snippets, made from defused text."""
    from research.extract import snippet_documents

    # Snippets stand in only once gathering is over: no query follows that their words could steer.
    documents, _tainted = defused(snippet_documents(sources))
    return assign_passage_ids(documents)


class SynthesisRanking(NamedTuple):
    """The passages ranked for the report once (per sub-question, and each shared file's best first), so that cutting
    them to fit a budget, as often as the model's window asks, ranks nothing again."""

    ranked: dict[str, list[tuple[Passage, float]]]
    first_sources: list[str]

    def select(self, token_budget: int) -> list[Passage]:
        """The best passages within `token_budget` (research.rank.select_passages)."""
        if not self.ranked:
            return []
        return select_passages(self.ranked, token_budget, first_sources=self.first_sources)


def rank_for_synthesis(plan: Decomposition | None, passages: list[Passage], options: ResearchOptions, *,
                       shared: Collection[str] = ()) -> SynthesisRanking:
    """The best passages per sub-question, several sources kept; the best passage of each `shared` source (a file the
    asker shared, which they expect read) first, however the web's rank."""
    if not passages:
        return SynthesisRanking({}, [])
    questions = [sub.question + " " + " ".join(sub.queries) for sub in plan.sub_questions] if plan else [""]
    ranked = rank_passages_for_queries(questions, passages, options.passages_per_question)
    if not any(ranked.values()):
        # Nothing shares a term with the questions (another language, say): keep document order.
        ranked = {"all": [(passage, 0.0) for passage in passages]}
    by_file: dict[str, list[Passage]] = {}
    for passage in passages:
        if passage.source_id in shared:
            by_file.setdefault(passage.source_id, []).append(passage)
    if not by_file:
        return SynthesisRanking(dict(ranked), [])
    # Each file's own best passage (its first when none shares a word with the questions), ranked apart.
    asked = " ".join(questions)
    best_of_files: list[tuple[Passage, float]] = []
    for file_passages in by_file.values():
        ranking = next(iter(rank_passages_for_queries([asked], file_passages, 1).values()), [])
        best_of_files.append(ranking[0] if ranking else (file_passages[0], 0.0))
    return SynthesisRanking({SHARED_FILES: best_of_files, **ranked}, list(by_file))


def select_for_synthesis(plan: Decomposition | None, passages: list[Passage], options: ResearchOptions, *,
                         shared: Collection[str] = ()) -> list[Passage]:
    """The best passages for the report within `options.passage_token_budget` (`rank_for_synthesis`)."""
    return rank_for_synthesis(plan, passages, options, shared=shared).select(options.passage_token_budget)
