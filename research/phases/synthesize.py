"""Synthesize: a Markdown report in which every factual sentence cites the `[pN]` passages it rests on."""

from __future__ import annotations

import datetime as dt

from research.llm import LLMClient, LongAnswer
from research.models import Passage
from research.phases.decompose import Decomposition
from research.prompts import system_prompt
from research.untrusted import fence_passages

# Words asked for per output token allowed: reasoning models spend much of the limit thinking before they write.
WORDS_PER_OUTPUT_TOKEN = 1 / 6
LONGEST_REPORT_WORDS = 2_500
SHORTEST_REPORT_WORDS = 400


def report_length_words(max_output_tokens: int) -> int:
    """How many words to ask for, so that thinking and the report both fit in the output limit."""
    return max(SHORTEST_REPORT_WORDS, min(LONGEST_REPORT_WORDS, int(max_output_tokens * WORDS_PER_OUTPUT_TOKEN)))


async def synthesize(
    question: str,
    plan: Decomposition,
    passages: list[Passage],
    *,
    titles: dict[str, tuple[str, str]],
    llm: LLMClient,
    today: dt.date,
    context: str | None = None,
) -> LongAnswer:
    """The model's draft report (with cites, before the audit), continued past output limits; `cut_off` when it
    still stopped at the limit."""
    parts = []
    if context:
        parts.append(f"Earlier conversation (for context):\n{context}")
    parts.append(f"Question:\n{question}")
    parts.append("Sub-questions:\n" + "\n".join(f"- {sub.question}" for sub in plan.sub_questions))
    if plan.outline:
        parts.append("Suggested outline:\n" + "\n".join(f"- {heading}" for heading in plan.outline))
    parts.append(f"Length: at most about {report_length_words(llm.config.max_output_tokens):,} words.")
    parts.append("Source passages:\n" + fence_passages(passages, titles))
    messages = [{"role": "system", "content": system_prompt("synthesize", today)},
                {"role": "user", "content": "\n\n".join(parts)}]
    return await llm.complete_long(messages, task="synthesize")
