"""Synthesize: a Markdown report in which every factual sentence cites the `[pN]` passages it rests on.

A model that writes no inline citation at all (small local models often do not) gets one simpler way to cite:
the answer as JSON claims, each with the id of the passage it rests on (`cited_claims`), which deepthread renders
as a cited list. Either way the draft then goes through the same citation audit.
"""

from __future__ import annotations

import datetime as dt
import re

from pydantic import BaseModel, Field

from research.llm import LLMClient, LongAnswer, Message, OnText
from research.models import Passage
from research.phases.decompose import Decomposition
from research.phases.search import without_citation_markers
from research.prompts import system_prompt
from research.untrusted import fence_passages

# Words asked for per output token allowed: reasoning models spend much of the limit thinking before they write.
WORDS_PER_OUTPUT_TOKEN = 1 / 6
LONGEST_REPORT_WORDS = 2_500
SHORTEST_REPORT_WORDS = 400
CLAIMS_TASK = "cited_claims"
MAX_CLAIMS = 15
CLAIMS_HEADING = "Key findings"
# An id as a weak model spells it inside JSON: `p3`, `P3`, `[p3]`, `3`.
_PASSAGE_ID = re.compile(r"^\W*p?\s*(\d+)\W*$", re.IGNORECASE)


def report_length_words(max_output_tokens: int) -> int:
    """How many words to ask for, so that thinking and the report both fit in the output limit."""
    return max(SHORTEST_REPORT_WORDS, min(LONGEST_REPORT_WORDS, int(max_output_tokens * WORDS_PER_OUTPUT_TOKEN)))


def _task_parts(question: str, plan: Decomposition, context: str | None) -> list[str]:
    parts = []
    if context:
        parts.append(f"Earlier conversation (for context):\n{context}")
    parts.append(f"Question:\n{question}")
    parts.append("Sub-questions:\n" + "\n".join(f"- {sub.question}" for sub in plan.sub_questions))
    return parts


def synthesis_messages(question: str, plan: Decomposition, passages: list[Passage], *,
                       titles: dict[str, tuple[str, str]], today: dt.date, context: str | None = None,
                       answer_tokens: int) -> list[Message]:
    """The report prompt: question, sub-questions, outline, the length that fits `answer_tokens`, the passages."""
    parts = _task_parts(question, plan, context)
    if plan.outline:
        parts.append("Suggested outline:\n" + "\n".join(f"- {heading}" for heading in plan.outline))
    parts.append(f"Length: at most about {report_length_words(answer_tokens):,} words.")
    parts.append("Source passages:\n" + fence_passages(passages, titles))
    return [{"role": "system", "content": system_prompt("synthesize", today)},
            {"role": "user", "content": "\n\n".join(parts)}]


async def synthesize(
    question: str,
    plan: Decomposition,
    passages: list[Passage],
    *,
    titles: dict[str, tuple[str, str]],
    llm: LLMClient,
    today: dt.date,
    context: str | None = None,
    answer_tokens: int | None = None,
    on_text: OnText | None = None,
) -> LongAnswer:
    """The model's draft report (with cites, before the audit), continued past output limits; `cut_off` when it
    still stopped at the limit. `on_text` hears the text as it is written (to count words, never to show it)."""
    answer_tokens = answer_tokens or llm.config.max_output_tokens
    messages = synthesis_messages(question, plan, passages, titles=titles, today=today, context=context,
                                  answer_tokens=answer_tokens)
    return await llm.complete_long(messages, task="synthesize", max_tokens=answer_tokens, on_text=on_text)


class CitedClaim(BaseModel):
    """One sentence of the answer and the id of the passage that states it."""

    text: str
    passage_id: str


class CitedClaims(BaseModel):
    """The answer as claims, each resting on one passage (the `cited_claims` contract)."""

    claims: list[CitedClaim] = Field(default_factory=list)


def claims_messages(question: str, plan: Decomposition, passages: list[Passage], *,
                    titles: dict[str, tuple[str, str]], today: dt.date, context: str | None = None) -> list[Message]:
    """The claims prompt: question, sub-questions and the passages."""
    parts = [*_task_parts(question, plan, context), "Source passages:\n" + fence_passages(passages, titles)]
    return [{"role": "system", "content": system_prompt("cited_claims", today)},
            {"role": "user", "content": "\n\n".join(parts)}]


def claims_markdown(title: str, claims: list[CitedClaim]) -> str:
    """The claims as a report draft: the title, then one cited list item a claim (`[pN]` as the audit reads it).
    A claim whose id was not shown keeps the id, so that the audit counts and removes it as fabricated."""
    items = []
    for claim in claims[:MAX_CLAIMS]:
        text = " ".join(without_citation_markers(claim.text).split())  # its id is given apart
        if not text:
            continue
        number = _PASSAGE_ID.match(claim.passage_id.strip())
        passage_id = f"p{number.group(1)}" if number else claim.passage_id.strip()
        body, end = (text[:-1].rstrip(), text[-1]) if text[-1] in ".!?" else (text, ".")
        items.append(f"- {body} [{passage_id}]{end}")
    if not items:
        return ""
    return f"# {' '.join(title.split())}\n\n## {CLAIMS_HEADING}\n\n" + "\n".join(items)


async def cited_claims(question: str, plan: Decomposition, passages: list[Passage], *,
                       titles: dict[str, tuple[str, str]], llm: LLMClient, today: dt.date, title: str,
                       context: str | None = None, max_tokens: int | None = None) -> str:
    """The simpler way to cite: the answer as JSON claims, rendered as a cited Markdown draft ("" when none)."""
    messages = claims_messages(question, plan, passages, titles=titles, today=today, context=context)
    answer = await llm.structured(messages, CitedClaims, task=CLAIMS_TASK, max_tokens=max_tokens)
    return claims_markdown(title, answer.claims)
