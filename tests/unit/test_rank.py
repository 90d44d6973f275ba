"""BM25 ranking of passages per sub-question and budgeted, source-diverse selection."""

from __future__ import annotations

import pytest

from research.models import Passage
from research.rank import estimate_tokens, rank_passages, rank_passages_for_queries, select_passages


def _passage(number: int, source_id: str, text: str) -> Passage:
    return Passage(id=f"p{number}", source_id=source_id, text=text, start=0, end=len(text))


CORPUS = [
    _passage(1, "s1", "The Golden Gate Bridge opened in 1937 and spans the strait at San Francisco."),
    _passage(2, "s1", "Fog often covers the bay in summer mornings."),
    _passage(3, "s2", "Bridge tolls were raised in 2019 to fund maintenance of the bridge deck."),
    _passage(4, "s3", "Sourdough bread has a long history in the city."),
    _passage(5, "s3", "The bridge was painted international orange to stay visible in fog."),
]


def test_passage_with_the_query_terms_ranks_first() -> None:
    ranked = rank_passages("when did the Golden Gate Bridge open", CORPUS, top_k=3)
    assert ranked[0][0].id == "p1"
    assert [score for _, score in ranked] == sorted((score for _, score in ranked), reverse=True)


def test_passages_sharing_no_term_with_the_query_are_left_out() -> None:
    ranked = rank_passages("sourdough history", CORPUS, top_k=5)
    assert [passage.id for passage, _ in ranked] == ["p4"]


def test_top_k_limits_the_ranking() -> None:
    assert len(rank_passages("bridge", CORPUS, top_k=2)) == 2


def test_equal_scores_keep_passage_order() -> None:
    twins = [_passage(number, f"s{number}", "identical words about rivers") for number in range(1, 6)]
    assert [passage.id for passage, _ in rank_passages("rivers", twins, top_k=5)] == ["p1", "p2", "p3", "p4", "p5"]


def test_query_of_stopwords_or_unknown_words_ranks_nothing() -> None:
    assert rank_passages("the and of", CORPUS, top_k=5) == []
    assert rank_passages("zeppelin", CORPUS, top_k=5) == []
    assert rank_passages("bridge", [], top_k=5) == []


def test_ranking_is_deterministic_and_silent(capsys: pytest.CaptureFixture[str]) -> None:
    first = rank_passages_for_queries(["bridge fog", "tolls"], CORPUS, top_k=4)
    second = rank_passages_for_queries(["bridge fog", "tolls"], CORPUS, top_k=4)
    assert first == second
    assert set(first) == {"bridge fog", "tolls"}
    assert first["tolls"][0][0].id == "p3"
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


def _ranked(*ids_and_sources: tuple[int, str], words: int = 50) -> list[tuple[Passage, float]]:
    text = " ".join(["word"] * words)
    return [(_passage(number, source, text), float(100 - index)) for index, (number, source) in enumerate(ids_and_sources)]


def test_selection_keeps_several_sources_though_one_dominates_the_scores() -> None:
    ranking = _ranked((1, "s1"), (2, "s1"), (3, "s1"), (4, "s1"), (5, "s1"), (6, "s2"), (7, "s3"))
    per_passage = estimate_tokens(ranking[0][0].text)
    selected = select_passages({"q": ranking}, token_budget=per_passage * 4, min_sources=3)
    assert [passage.id for passage in selected] == ["p1", "p2", "p6", "p7"]


def test_selection_caps_passages_per_source_while_others_remain() -> None:
    ranking = _ranked((1, "s1"), (2, "s1"), (3, "s1"), (4, "s1"), (5, "s2"), (6, "s2"))
    per_passage = estimate_tokens(ranking[0][0].text)
    selected = select_passages({"q": ranking}, token_budget=per_passage * 5, min_sources=2, max_per_source=3)
    assert [passage.id for passage in selected] == ["p1", "p2", "p3", "p5", "p6"]


def test_selection_fills_the_budget_from_one_source_when_it_is_all_there_is() -> None:
    ranking = _ranked((1, "s1"), (2, "s1"), (3, "s1"), (4, "s1"), (5, "s1"))
    per_passage = estimate_tokens(ranking[0][0].text)
    selected = select_passages({"q": ranking}, token_budget=per_passage * 5, min_sources=3, max_per_source=2)
    assert len(selected) == 5


def test_selection_never_exceeds_the_token_budget() -> None:
    ranking = _ranked(*[(number, f"s{number % 4}") for number in range(1, 30)], words=37)
    for budget in (0, 10, 100, 1000, 5000):
        selected = select_passages({"q": ranking}, token_budget=budget)
        assert sum(estimate_tokens(passage.text) for passage in selected) <= budget


def test_selection_takes_each_subquestions_best_passage_and_no_duplicates() -> None:
    first = _ranked((1, "s1"), (2, "s1"), (3, "s1"))
    second = _ranked((9, "s4"), (1, "s1"), (8, "s4"))
    per_passage = estimate_tokens(first[0][0].text)
    selected = select_passages({"history": first, "costs": second}, token_budget=per_passage * 3, min_sources=1)
    assert [passage.id for passage in selected] == ["p1", "p2", "p9"]


def test_selection_is_in_passage_id_order_and_deterministic() -> None:
    ranking = _ranked((12, "s2"), (3, "s1"), (40, "s5"), (7, "s3"))
    selected = select_passages({"q": ranking}, token_budget=10_000)
    assert [passage.id for passage in selected] == ["p3", "p7", "p12", "p40"]
    assert select_passages({"q": ranking}, token_budget=10_000) == selected


def test_a_passage_too_large_for_the_remaining_budget_is_skipped_for_smaller_ones() -> None:
    big = _passage(1, "s1", " ".join(["long"] * 300))
    small = _passage(2, "s2", "short text here")
    selected = select_passages({"q": [(big, 9.0), (small, 1.0)]}, token_budget=50)
    assert selected == [small]


def test_token_estimate_counts_words_and_characters() -> None:
    assert estimate_tokens("one two three four five six seven eight nine ten") == 13
    assert estimate_tokens("x" * 400) == 100
    assert estimate_tokens("中文" * 50) == 130
