"""Ranking time for 10,000 passages: BM25 index plus one ranking per sub-question, then selection.

Run: `.venv/bin/python bench/rank.py [--passages N] [--queries Q] [--rounds R]`. Passages are
~160-word texts drawn (seeded, so every run is the same) from a Zipf-like vocabulary, which gives
term statistics close to prose. Ends with one `key=value` line.
"""

from __future__ import annotations

import argparse
import random
import time

from research.models import Passage
from research.rank import rank_passages_for_queries, select_passages

VOCABULARY_SIZE = 30_000
WORDS_PER_PASSAGE = 160
PASSAGES_PER_SOURCE = 40


def _vocabulary(generator: random.Random) -> list[str]:
    """Distinct made-up words of 3 to 10 letters."""
    words: set[str] = set()
    while len(words) < VOCABULARY_SIZE:
        words.add("".join(generator.choices("abcdefghijklmnopqrstuvwxyz", k=generator.randint(3, 10))))
    return sorted(words)


def _passages(count: int, generator: random.Random) -> list[Passage]:
    """`count` passages whose words follow a Zipf-like distribution over the vocabulary."""
    vocabulary = _vocabulary(generator)
    weights = [1 / rank for rank in range(1, len(vocabulary) + 1)]
    passages = []
    for number in range(1, count + 1):
        text = " ".join(generator.choices(vocabulary, weights=weights, k=WORDS_PER_PASSAGE)) + "."
        passages.append(Passage(id=f"p{number}", source_id=f"s{(number - 1) // PASSAGES_PER_SOURCE + 1}", text=text, start=0, end=len(text)))
    return passages


def main() -> None:
    """Build the passages, time ranking and selection, and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--passages", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=5, help="sub-questions ranked over one index")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds; the fastest counts")
    arguments = parser.parse_args()

    generator = random.Random(20240601)
    passages = _passages(arguments.passages, generator)
    query_words = [word for passage in passages[:: max(1, len(passages) // 50)] for word in passage.text.rstrip(".").split()[::20]]
    queries = [" ".join(generator.sample(query_words, 8)) for _ in range(arguments.queries)]

    ranking_times, selection_times = [], []
    for _ in range(arguments.rounds):
        started = time.perf_counter()
        ranked = rank_passages_for_queries(queries, passages, top_k=50)
        ranked_at = time.perf_counter()
        selected = select_passages(ranked, token_budget=24_000)
        ranking_times.append(ranked_at - started)
        selection_times.append(time.perf_counter() - ranked_at)

    ranking_seconds, selection_seconds = min(ranking_times), min(selection_times)
    words = arguments.passages * WORDS_PER_PASSAGE
    print(f"{arguments.passages} passages of {WORDS_PER_PASSAGE} words ({words / 1e6:.1f} M words), {arguments.queries} sub-questions, top 50 each")
    print(f"index + rank: {ranking_seconds:.3f} s (fastest of {arguments.rounds}); select within 24,000 tokens: {selection_seconds * 1000:.2f} ms")
    print(f"selected {len(selected)} passages from {len({passage.source_id for passage in selected})} sources")
    print(f"passages={arguments.passages} seconds={ranking_seconds:.3f} queries={arguments.queries} select_ms={selection_seconds * 1000:.2f}")


if __name__ == "__main__":
    main()
