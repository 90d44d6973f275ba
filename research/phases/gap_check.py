"""Gap check: the model judges coverage per sub-question and may ask for a few more queries."""

from __future__ import annotations

import datetime as dt

from pydantic import BaseModel, Field

from research.llm import LLMClient, StructuredOutputError
from research.models import Passage
from research.phases.decompose import Decomposition
from research.phases.search import clean_query
from research.prompts import system_prompt
from research.untrusted import distinctive_words, fence_passages

MAX_NEW_QUERIES = 3


class Coverage(BaseModel):
    question: str
    covered: bool


class GapVerdict(BaseModel):
    """Which sub-questions are covered, and the searches that would fill the gaps."""

    sub_questions: list[Coverage] = Field(default_factory=list)
    more_queries: list[str] = Field(default_factory=list, max_length=MAX_NEW_QUERIES)


def gap_check_messages(question: str, plan: Decomposition, passages: list[Passage], *,
                       titles: dict[str, tuple[str, str]], today: dt.date) -> list[dict[str, str]]:
    """The gap check's prompt: the question, its sub-questions and the passages gathered so far."""
    shown = fence_passages(passages, titles)
    sub_questions = "\n".join(f"- {sub.question}" for sub in plan.sub_questions)
    user = f"Question:\n{question}\n\nSub-questions:\n{sub_questions}\n\nPassages gathered so far:\n{shown or '(none)'}"
    return [{"role": "system", "content": system_prompt("gap_check", today, cites=False)}, {"role": "user", "content": user}]


async def check_gaps(
    question: str,
    plan: Decomposition,
    passages: list[Passage],
    *,
    titles: dict[str, tuple[str, str]],
    llm: LLMClient,
    today: dt.date,
    tainted: frozenset[str] = frozenset(),
) -> list[str]:
    """More queries to run, or none when coverage is judged enough (or the model cannot say); each cleaned
    (`clean_query`), and left out when it carries a `tainted` word (one a page addressed to the AI reading it)."""
    messages = gap_check_messages(question, plan, passages, titles=titles, today=today)
    try:
        verdict = await llm.structured(messages, GapVerdict, task="gap_check", fast=True)
    except StructuredOutputError:
        return []
    # Words of the question and of the plan were written before any page was read: a page cannot have planted them.
    planned = " ".join([question, *(part for sub in plan.sub_questions for part in (sub.question, *sub.queries))])
    page_words = tainted - distinctive_words(planned)
    cleaned = (clean_query(query, tainted=page_words) for query in verdict.more_queries)
    return [query for query in cleaned if query is not None][:MAX_NEW_QUERIES]
