"""Rank passages per sub-question with BM25 and select, within a token budget, a set that keeps several sources.

Both steps are deterministic: ties in score keep passage order, and selection depends only on its inputs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from research.models import Passage
from research.passages import count_words, passage_number

if TYPE_CHECKING:  # imported where used (and early by research.readers.preload): a run ranks only after reading
    import bm25s
    import numpy as np

RankedPassages = list[tuple[Passage, float]]

DEFAULT_MAX_PASSAGES_PER_SOURCE = 3


def rank_passages(query: str, passages: Sequence[Passage], top_k: int) -> RankedPassages:
    """The `top_k` passages best matching a query by BM25, best first; passages sharing no term with it are left out."""
    return rank_passages_for_queries([query], passages, top_k)[query]


def rank_passages_for_queries(queries: Sequence[str], passages: Sequence[Passage], top_k: int) -> dict[str, RankedPassages]:
    """For each query, the `top_k` passages best matching it by BM25 over one shared index, best first."""
    if top_k < 1 or not passages:
        return {query: [] for query in queries}
    retriever = _index([passage.text for passage in passages])
    ranked: dict[str, RankedPassages] = {}
    for query in queries:
        scores = _scores(retriever, query, len(passages))
        # A stable sort on the negated scores keeps passage order among equal scores.
        import numpy as np

        order = np.argsort(-scores, kind="stable")[:top_k]
        ranked[query] = [(passages[index], float(scores[index])) for index in order if scores[index] > 0]
    return ranked


def estimate_tokens(text: str) -> int:
    """A model-agnostic estimate of a text's size in LLM tokens: the larger of 1.3 per word and one per four characters."""
    return max(math.ceil(count_words(text) * 1.3), math.ceil(len(text) / 4))


def select_passages(
    ranked_per_subquestion: Mapping[str, Sequence[tuple[Passage, float]]],
    token_budget: int,
    *,
    min_sources: int = 3,
    max_per_source: int = DEFAULT_MAX_PASSAGES_PER_SOURCE,
    first_sources: Sequence[str] = (),
) -> list[Passage]:
    """The best passages across sub-questions that fit in `token_budget`, in passage-id order.

    Candidates are taken round-robin across sub-questions by rank. First the best passage of each of
    `first_sources` (files the asker shared); then the best passage of each new source until
    `min_sources` sources are in; then candidates in order while their source has fewer than
    `max_per_source`; then, if budget remains, any candidate that fits.
    """
    candidates = _round_robin(ranked_per_subquestion)
    chosen: dict[str, Passage] = {}
    spent = 0
    sources: dict[str, int] = {}

    def take(passage: Passage) -> None:
        nonlocal spent
        chosen[passage.id] = passage
        spent += estimate_tokens(passage.text)
        sources[passage.source_id] = sources.get(passage.source_id, 0) + 1

    def fits(passage: Passage) -> bool:
        return passage.id not in chosen and spent + estimate_tokens(passage.text) <= token_budget

    wanted = set(first_sources)
    for passage in candidates:
        if passage.source_id in wanted and passage.source_id not in sources and fits(passage):
            take(passage)
    for passage in candidates:
        if len(sources) >= min_sources:
            break
        if passage.source_id not in sources and fits(passage):
            take(passage)
    for passage in candidates:
        if sources.get(passage.source_id, 0) < max_per_source and fits(passage):
            take(passage)
    for passage in candidates:
        if fits(passage):
            take(passage)
    return sorted(chosen.values(), key=lambda passage: passage_number(passage.id))


def _round_robin(ranked_per_subquestion: Mapping[str, Sequence[tuple[Passage, float]]]) -> list[Passage]:
    """Each sub-question's first passage, then each one's second, and so on, without repeats."""
    rankings = [ranking for _, ranking in ranked_per_subquestion.items()]
    seen: set[str] = set()
    ordered: list[Passage] = []
    for rank in range(max((len(ranking) for ranking in rankings), default=0)):
        for ranking in rankings:
            if rank < len(ranking):
                passage = ranking[rank][0]
                if passage.id not in seen:
                    seen.add(passage.id)
                    ordered.append(passage)
    return ordered


def _tokenize(texts: list[str]) -> bm25s.tokenization.Tokenized:
    """Lower-cased word tokens without English stopwords, as ids with their vocabulary."""
    import bm25s

    return bm25s.tokenize(texts, stopwords="en", show_progress=False)


def _index(texts: list[str]) -> bm25s.BM25:
    """A BM25 index over texts."""
    import bm25s

    retriever = bm25s.BM25()
    retriever.index(_tokenize(texts), show_progress=False)
    return retriever


def _scores(retriever: bm25s.BM25, query: str, document_count: int) -> np.ndarray:
    """The BM25 score of every indexed text for a query; all zeros when no query term is in the index."""
    import bm25s
    import numpy as np

    query_terms = bm25s.tokenize([query], stopwords="en", show_progress=False, return_ids=False)[0]
    known_terms = [term for term in query_terms if term and term in retriever.vocab_dict]
    if not known_terms:
        return np.zeros(document_count, dtype=np.float32)
    return np.asarray(retriever.get_scores(known_terms), dtype=np.float32)
