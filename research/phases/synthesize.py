"""Synthesize: a Markdown report in which every factual sentence cites the `[pN]` passages it rests on."""

from __future__ import annotations

import datetime as dt

import re

from research.llm import LLMClient
from research.models import Passage
from research.phases.decompose import Decomposition
from research.prompts import system_prompt
from research.untrusted import fence_passages


BARE_NUMERIC_CITE = re.compile(r"\s*(?<![\w\]])\[\d+(?:\s*,\s*\d+)*\](?!\()")


def drop_bare_numeric_cites(draft: str) -> str:
    """Remove `[3]`-style cites the model invented: only `[pN]` cites can be audited, and `[n]` are ours to assign."""
    return BARE_NUMERIC_CITE.sub("", draft)


async def synthesize(
    question: str,
    plan: Decomposition,
    passages: list[Passage],
    *,
    titles: dict[str, tuple[str, str]],
    llm: LLMClient,
    today: dt.date,
    context: str | None = None,
) -> str:
    """The model's draft report (with `[pN]` cites, before the audit)."""
    parts = []
    if context:
        parts.append(f"Earlier conversation (for context):\n{context}")
    parts.append(f"Question:\n{question}")
    parts.append("Sub-questions:\n" + "\n".join(f"- {sub.question}" for sub in plan.sub_questions))
    if plan.outline:
        parts.append("Suggested outline:\n" + "\n".join(f"- {heading}" for heading in plan.outline))
    parts.append("Source passages:\n" + fence_passages(passages, titles))
    messages = [{"role": "system", "content": system_prompt("synthesize", today)},
                {"role": "user", "content": "\n\n".join(parts)}]
    return drop_bare_numeric_cites(await llm.complete(messages, task="synthesize", max_tokens=4000))
