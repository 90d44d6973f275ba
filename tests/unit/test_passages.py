"""Sentence splitting, sentence-aware chunking and passage numbering, with hypothesis properties."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from research.extract import extract_document
from research.models import Document
from research.passages import (
    ABBREVIATIONS,
    ChunkSpan,
    assign_passage_ids,
    chunk_document,
    count_words,
    number_chunks,
    passage_number,
    sentence_spans,
    split_sentences,
)

MIN_WORDS, MAX_WORDS = 12, 20

# Ordinary words that are no abbreviation, so generated sentences have known boundaries.
words = st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=2, max_size=9).filter(lambda word: word not in ABBREVIATIONS)
terminators = st.sampled_from([".", "!", "?", "…", ".”", "?)"])
separators = st.sampled_from([" ", "  ", "\n", "\n\n", " \n"])


@st.composite
def sentences(draw: st.DrawFn, max_words: int = 30) -> str:
    body = draw(st.lists(words, min_size=1, max_size=max_words))
    return " ".join([body[0].capitalize(), *body[1:]]) + draw(terminators)


@st.composite
def documents_with_sentences(draw: st.DrawFn) -> tuple[str, list[tuple[int, int]]]:
    """A text made of generated sentences, with the true offsets of each sentence."""
    parts = draw(st.lists(sentences(), min_size=1, max_size=40))
    text = draw(st.sampled_from(["", " ", "\n"]))
    spans: list[tuple[int, int]] = []
    for index, sentence in enumerate(parts):
        if index:
            text += draw(separators)
        spans.append((len(text), len(text) + len(sentence)))
        text += sentence
    return text, spans


@given(documents_with_sentences())
def test_sentences_are_split_where_they_were_written(document: tuple[str, list[tuple[int, int]]]) -> None:
    text, true_spans = document
    assert sentence_spans(text) == true_spans


@given(documents_with_sentences())
def test_every_sentence_lands_in_exactly_one_passage(document: tuple[str, list[tuple[int, int]]]) -> None:
    text, true_spans = document
    chunks = chunk_document("s1", text, min_words=MIN_WORDS, max_words=MAX_WORDS)
    for start, end in true_spans:
        if count_words(text[start:end]) > MAX_WORDS:
            continue
        holders = [chunk for chunk in chunks if chunk.start <= start and end <= chunk.end]
        overlapping = [chunk for chunk in chunks if chunk.start < end and start < chunk.end]
        assert len(holders) == 1
        assert overlapping == holders


@given(documents_with_sentences())
def test_no_passage_exceeds_the_size_bound(document: tuple[str, list[tuple[int, int]]]) -> None:
    text, _ = document
    for chunk in chunk_document("s1", text, min_words=MIN_WORDS, max_words=MAX_WORDS):
        assert count_words(chunk.text) <= MAX_WORDS


@given(documents_with_sentences())
def test_a_sentence_longer_than_the_bound_is_cut_only_at_word_boundaries(document: tuple[str, list[tuple[int, int]]]) -> None:
    text, true_spans = document
    chunks = chunk_document("s1", text, min_words=MIN_WORDS, max_words=MAX_WORDS)
    for start, end in true_spans:
        if count_words(text[start:end]) <= MAX_WORDS:
            continue
        pieces = [chunk for chunk in chunks if chunk.start < end and start < chunk.end]
        assert len(pieces) >= 2
        for piece in pieces:
            assert piece.start <= start or text[piece.start - 1].isspace()
            assert piece.end >= end or text[piece.end].isspace()
        assert " ".join(text[max(piece.start, start) : min(piece.end, end)] for piece in pieces) == text[start:end]


@given(st.text(max_size=3000), st.integers(min_value=1, max_value=60), st.integers(min_value=0, max_value=140))
@settings(max_examples=200)
def test_any_text_is_covered_once_in_order_with_recoverable_offsets(text: str, min_words: int, extra_words: int) -> None:
    max_words = min_words + extra_words
    chunks = chunk_document("s7", text, min_words=min_words, max_words=max_words)
    covered = [False] * len(text)
    previous_end = 0
    for chunk in chunks:
        assert text[chunk.start : chunk.end] == chunk.text
        assert chunk.text == chunk.text.strip() and chunk.text
        assert chunk.start >= previous_end
        assert count_words(chunk.text) <= max_words
        previous_end = chunk.end
        for index in range(chunk.start, chunk.end):
            covered[index] = True
    assert all(covered[index] for index, character in enumerate(text) if not character.isspace())


@given(st.lists(documents_with_sentences(), min_size=1, max_size=5))
def test_passage_ids_are_stable_across_runs_and_numbered_by_source_then_offset(texts: list[tuple[str, list[tuple[int, int]]]]) -> None:
    documents = [(f"s{index + 1}", Document(url=f"https://example.org/{index}", kind="html", text=text)) for index, (text, _) in enumerate(texts)]
    first_run = assign_passage_ids(documents, min_words=MIN_WORDS, max_words=MAX_WORDS)
    second_run = assign_passage_ids(documents, min_words=MIN_WORDS, max_words=MAX_WORDS)
    assert first_run == second_run
    assert [passage.id for passage in first_run] == [f"p{number}" for number in range(1, len(first_run) + 1)]
    order = [(int(passage.source_id[1:]), passage.start) for passage in first_run]
    assert order == sorted(order)
    texts_by_source = dict((source_id, document.text) for source_id, document in documents)
    assert all(texts_by_source[passage.source_id][passage.start : passage.end] == passage.text for passage in first_run)


def test_default_passages_hold_between_120_and_200_words_in_long_prose() -> None:
    sentence = "The committee reviewed the proposal in detail and asked for further evidence on costs."
    text = " ".join([sentence] * 200)
    chunks = chunk_document("s1", text)
    sizes = [count_words(chunk.text) for chunk in chunks]
    assert all(120 <= size <= 200 for size in sizes[:-1])
    assert sizes[-1] <= 200


def test_a_passage_closes_at_a_paragraph_start_once_it_has_enough_words() -> None:
    paragraph = " ".join(["Each sentence here has exactly eight words in it."] * 2)
    text = "\n".join([paragraph] * 6)
    chunks = chunk_document("s1", text, min_words=30, max_words=60)
    assert [chunk.text.count("\n") for chunk in chunks] == [1, 1, 1]
    assert all(chunk.start == 0 or text[chunk.start - 1] == "\n" for chunk in chunks)


def test_a_short_tail_joins_the_passage_before_it_when_both_fit() -> None:
    line = "Alpha beta gamma delta epsilon zeta eta theta iota kappa."
    text = "\n".join([line] * 3 + ["Tail."])
    assert [chunk.text for chunk in chunk_document("s1", text, min_words=20, max_words=40)] == [text]
    separate = chunk_document("s1", text, min_words=20, max_words=25)
    assert [chunk.text for chunk in separate] == ["\n".join([line] * 2), f"{line}\nTail."]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Dr. Smith met Mr. Jones at 5 p.m. today. They talked.", ["Dr. Smith met Mr. Jones at 5 p.m. today.", "They talked."]),
        ("It costs 3.5 million, e.g. for roads. Next year is 2025.", ["It costs 3.5 million, e.g. for roads.", "Next year is 2025."]),
        ("SEOUL, Aug. 20 (Yonhap) -- N. Korea slammed S. Korea. The U.S. Army agreed.", ["SEOUL, Aug. 20 (Yonhap) -- N. Korea slammed S. Korea.", "The U.S. Army agreed."]),
        ('He said "Stop." Then he left! Why? Nobody knows...', ['He said "Stop."', "Then he left!", "Why?", "Nobody knows..."]),
        ("1. First step. 2. Second step.", ["1. First step.", "2. Second step."]),
        ("今日は晴れです。明日は雨でしょう！本当？", ["今日は晴れです。", "明日は雨でしょう！", "本当？"]),
        ("¿Qué hora es? ¡Son las tres! El Sr. García llegó.", ["¿Qué hora es?", "¡Son las tres!", "El Sr. García llegó."]),
        ("A heading without a stop\nThe paragraph under it.", ["A heading without a stop", "The paragraph under it."]),
        ("Version 2.0 ships the fix. See https://example.org/a.b for details.", ["Version 2.0 ships the fix.", "See https://example.org/a.b for details."]),
    ],
)
def test_sentence_splitting_handles_abbreviations_numbers_and_other_scripts(text: str, expected: list[str]) -> None:
    assert split_sentences(text) == expected


def test_chinese_text_is_measured_per_character() -> None:
    assert count_words("中文文本") == 4
    assert count_words("Hello world, 中文") == 4


def test_a_run_without_spaces_counts_once_per_twenty_characters() -> None:
    assert count_words("x" * 45) == 3


def test_later_rounds_continue_numbering_after_earlier_passages() -> None:
    first = assign_passage_ids([("s1", Document(url="https://a.example/", kind="html", text="One sentence here."))])
    later = assign_passage_ids([("s2", Document(url="https://b.example/", kind="html", text="Another one.")), ("s3", Document(url="https://c.example/", kind="snippet", text="A snippet."))], first_number=len(first) + 1)
    assert [(passage.id, passage.source_id, passage.is_snippet) for passage in first + later] == [("p1", "s1", False), ("p2", "s2", False), ("p3", "s3", True)]


def test_chunks_given_out_of_offset_order_are_numbered_by_offset() -> None:
    chunks = [ChunkSpan(source_id="s1", text="b", start=10, end=11), ChunkSpan(source_id="s1", text="a", start=0, end=1)]
    assert [(passage.id, passage.text) for passage in number_chunks([chunks])] == [("p1", "a"), ("p2", "b")]


def test_empty_or_blank_document_has_no_passages() -> None:
    assert chunk_document("s1", "") == []
    assert chunk_document("s1", " \n\n \t") == []


def test_bounds_must_be_positive_and_ordered() -> None:
    with pytest.raises(ValueError):
        chunk_document("s1", "Text.", min_words=0, max_words=10)
    with pytest.raises(ValueError):
        chunk_document("s1", "Text.", min_words=30, max_words=20)


def test_passage_number_reads_ids_and_rejects_others() -> None:
    assert passage_number("p12") == 12
    with pytest.raises(ValueError):
        passage_number("s12")
    assert re.fullmatch(r"p\d+", "p3")


DATA = Path(__file__).resolve().parent.parent / "data"


@pytest.mark.parametrize("page", ["debian-faq-basic-defs.html", "sott-adelson-assange.html", "python-howto-sockets.html", "latvian-landslide.html"])
def test_real_page_sentences_each_land_in_one_passage_within_the_bound(page: str) -> None:
    document = extract_document("https://example.org/", (DATA / "pages" / page).read_bytes(), "text/html")
    assert document is not None
    chunks = chunk_document("s1", document.text)
    assert len(chunks) >= 2
    for start, end in sentence_spans(document.text):
        assert len([chunk for chunk in chunks if chunk.start <= start and end <= chunk.end]) == 1
    assert all(count_words(chunk.text) <= 200 for chunk in chunks)
    assert sum(count_words(chunk.text) for chunk in chunks) == count_words(document.text)
