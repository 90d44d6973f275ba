"""Digest: when the model fails while writing, a report quoted from the gathered passages instead of written by it.

Each quote is a passage's own sentences (white space aside), each cited `[pN]` to that passage, grouped
under the sub-question the passage ranks best for. The quotes then go through the same citation audit
as a written report (without the model, which is down), so the sources are numbered and listed as usual
and every kept citation is a stored passage that contains its sentence.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from research.audit import AuditResult, verify_draft
from research.audit.sentences import sentence_spans
from research.llm import LLMAuthError, LLMError, LLMTimeout, LLMUnavailable
from research.models import Passage, SearchResult
from research.phases.decompose import Decomposition
from research.rank import rank_passages_for_queries
from research.report import TITLE_QUESTION_CHARS, shortened

DIGEST_TITLE = "Sources found, no written report"
# Quotes in all, shared evenly by the sub-questions that have passages.
MAX_QUOTES = 10
QUOTE_MAX_CHARS = 320
LONGEST_QUOTED_SENTENCE_CHARS = 600
MIN_QUOTED_WORDS = 4
# Markup in a quote would be read as markup (and a bracketed number as one of our citations): such sentences are skipped.
_UNQUOTABLE = re.compile(r"[\[\]`<>|*_\\#~]|://")


def writing_failure(error: LLMError) -> str:
    """Why the report was not written, in plain words, e.g. "the model stopped answering (HTTP 503) while writing the report"."""
    if isinstance(error, LLMAuthError):
        return "the model refused our credentials (check LLM_API_KEY) while writing the report"
    if isinstance(error, LLMTimeout):
        return f"the model was too slow while writing the report: {error}"
    if isinstance(error, LLMUnavailable):
        detail = f"HTTP {error.status}" if error.status else str(error)
        return f"the model stopped answering ({detail}) while writing the report"
    return f"the model failed while writing the report ({error})"


def _quotable(sentence: str) -> bool:
    return len(sentence.split()) >= MIN_QUOTED_WORDS and len(sentence) <= LONGEST_QUOTED_SENTENCE_CHARS \
        and _UNQUOTABLE.search(sentence) is None


def quote_of(passage: Passage) -> str | None:
    """The passage's first quotable sentences (about `QUOTE_MAX_CHARS` in all), each followed by `[pN]`; None if none is quotable."""
    text = " ".join(passage.text.split())
    quoted: list[str] = []
    length = 0
    for start, end in sentence_spans(text):
        sentence = text[start:end].strip()
        if not _quotable(sentence):
            if quoted:
                break  # one quote is one run of the passage's text, not pieces from here and there
            continue
        if quoted and length + len(sentence) > QUOTE_MAX_CHARS:
            break
        quoted.append(f"{sentence} [{passage.id}]")
        length += len(sentence)
    return " ".join(quoted) or None


def _grouped(plan: Decomposition | None, passages: list[Passage]) -> list[tuple[str, list[Passage]]]:
    """The passages under the sub-question each ranks best for, best first, each passage once."""
    questions = [sub.question for sub in plan.sub_questions] if plan else []
    queries = [sub.question + " " + " ".join(sub.queries) for sub in plan.sub_questions] if plan else []
    ranked = rank_passages_for_queries(queries, passages, len(passages)) if queries else {}
    best: dict[str, tuple[float, int]] = {}
    for index, query in enumerate(queries):
        for passage, score in ranked.get(query, []):
            if score > best.get(passage.id, (0.0, index))[0]:
                best[passage.id] = (score, index)
    groups = [(question, [passage for passage, _score in ranked.get(query, []) if best[passage.id][1] == index])
              for index, (question, query) in enumerate(zip(questions, queries))]
    rest = [passage for passage in passages if passage.id not in best]
    if rest:
        groups.append(("Other passages found" if groups else "What was found", rest))
    return groups


def digest_markdown(plan: Decomposition | None, passages: list[Passage]) -> tuple[str, list[Passage]]:
    """The quotes as Markdown (a `##` heading per sub-question, a `>` quote per passage) and the passages quoted."""
    sections: list[str] = []
    quoted: list[Passage] = []
    groups = [(heading, group) for heading, group in _grouped(plan, passages) if group]
    per_group = math.ceil(MAX_QUOTES / len(groups)) if groups else 0
    for heading, group in groups:
        quotes: list[str] = []
        for passage in group:
            if len(quotes) >= per_group or len(quoted) >= MAX_QUOTES:
                break
            quote = quote_of(passage)
            if quote is not None:
                quotes.append(f"> {quote}")
                quoted.append(passage)
        if quotes:
            sections.append(f"## {' '.join(heading.split())}\n\n" + "\n\n".join(quotes))
    return "\n\n".join(sections), quoted


async def quote_digest(
    question: str,
    plan: Decomposition | None,
    passages: list[Passage],
    sources: Mapping[str, SearchResult],
    *,
    reason: str,
) -> AuditResult | None:
    """The audited digest of `passages` (its own `#` title, the reason, then the quotes), or None when no passage
    has a sentence that can be quoted."""
    draft, quoted = digest_markdown(plan, passages)
    if not quoted:
        return None
    audited = await verify_draft(draft, passages={passage.id: passage for passage in quoted}, sources=sources, judge=None)
    title = f"{DIGEST_TITLE}: {shortened(question, TITLE_QUESTION_CHARS)}" if question.strip() else DIGEST_TITLE
    notice = (f"**This is not a written answer.** {reason[:1].upper()}{reason[1:]}; here is what was found, quoted "
              "from the sources. Retry to have the report written.")
    return audited.model_copy(update={"body_markdown": f"# {title}\n\n{notice}\n\n{audited.body_markdown}"})
