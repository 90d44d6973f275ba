"""Read: main text out of each fetched page, chunked into passages `pN`, ranked per sub-question."""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Executor

from research.budget import ResearchOptions
from research.cpu import run_cpu
from research.extract import extract_document, snippet_documents
from research.models import Document, FetchResult, Passage, SearchResult
from research.passages import assign_passage_ids
from research.phases.decompose import Decomposition
from research.rank import rank_passages_for_queries, select_passages

logger = logging.getLogger(__name__)


async def extract_pages(pages: list[tuple[str, FetchResult]], *, cpu_pool: Executor | None) -> dict[str, Document]:
    """Each page's main text, extracted in the CPU pool; pages with nothing readable, or whose extraction failed, was killed or ran out of memory, are left out."""

    async def extract(source_id: str, page: FetchResult) -> tuple[str, Document | None]:
        url = page.final_url or page.url
        try:
            document = await run_cpu(extract_document, url, page.body, page.content_type, pool=cpu_pool)
        except Exception as error:  # a parser's error, a killed or dead child, memory: only this page is lost
            # The error's type only: parsers quote the page in their messages.
            logger.warning("no text from %s (%s): %s", source_id, url, type(error).__name__)
            return source_id, None
        return source_id, document

    extracted = await asyncio.gather(*(extract(source_id, page) for source_id, page in pages))
    return {source_id: document for source_id, document in extracted if document is not None and document.text.strip()}


def passages_for(documents: dict[str, Document], *, first_number: int) -> list[Passage]:
    """Passages of `documents` in source order, numbered from `first_number`."""
    ordered = sorted(documents.items(), key=lambda item: int(item[0][1:]))
    return assign_passage_ids(ordered, first_number=first_number)


def snippet_passages(sources: list[SearchResult]) -> list[Passage]:
    """When no page could be read: the search snippets as passages, marked as snippets."""
    return assign_passage_ids(snippet_documents(sources))


def select_for_synthesis(plan: Decomposition | None, passages: list[Passage], options: ResearchOptions) -> list[Passage]:
    """The best passages per sub-question within the token budget, several sources kept."""
    if not passages:
        return []
    questions = [sub.question + " " + " ".join(sub.queries) for sub in plan.sub_questions] if plan else [""]
    ranked = rank_passages_for_queries(questions, passages, options.passages_per_question)
    if not any(ranked.values()):
        # Nothing shares a term with the questions (another language, say): keep document order.
        ranked = {"all": [(passage, 0.0) for passage in passages]}
    return select_passages(ranked, options.passage_token_budget)
