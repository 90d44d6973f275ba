"""Sentence-aware passages: split a document's text into sentences, pack them into chunks, number them `pN`.

Sizes are counted in words, where a word is a run of non-space characters (long runs count once
per 20 characters) or a single Chinese or Japanese character, since those scripts put no spaces
between words. A sentence never straddles two passages unless it alone is longer than the bound,
in which case it is cut at word boundaries.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

from pydantic import BaseModel

from research.models import Document, Passage

DEFAULT_MIN_WORDS = 120
DEFAULT_MAX_WORDS = 200

_LONGEST_WORD = 20
_IDEOGRAPHS = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002fa1f"
_WORD = re.compile(rf"[{_IDEOGRAPHS}]|[^\s{_IDEOGRAPHS}]{{1,{_LONGEST_WORD}}}")
_LINE = re.compile(r"[^\n]+")

_CLOSERS = "\"'”’»)\\]】」』"
# Western terminators count only before whitespace or the end; East Asian full stops need no space after them.
_SENTENCE_END = re.compile(rf"(?:[.!?…‼⁇⁈⁉]+|[।॥؟۔])[{_CLOSERS}]*(?=\s|$)|[。！？｡]+[{_CLOSERS}]*")
_WORD_BEFORE_PERIOD = re.compile(r"(\S*)\.$")

# Words that end in a period without ending the sentence (lower case, without the final period).
ABBREVIATIONS = frozenset({
    # titles and ranks
    "mr", "mrs", "ms", "mx", "dr", "prof", "sr", "sra", "srta", "jr", "st", "mt", "ft", "gen", "gov", "sen",
    "rep", "rev", "col", "lt", "sgt", "capt", "cmdr", "adm", "maj", "hon", "pres", "supt", "messrs",
    "mme", "mlle", "dra", "dña", "hr", "fr",
    # organisations and places
    "inc", "ltd", "co", "corp", "llc", "plc", "bros", "dept", "univ", "assn", "ave", "av", "avda", "blvd", "rd", "str",
    # references
    "no", "nos", "nr", "núm", "vol", "vols", "fig", "figs", "eq", "eqs", "ch", "chap", "sec", "sect", "p",
    "pp", "pág", "para", "art", "ed", "eds", "trans", "al", "op", "cit", "ibid", "id", "ref", "refs",
    # Latin and common short forms
    "vs", "v", "cf", "e.g", "i.e", "viz", "ca", "approx", "est", "etc", "resp", "incl", "excl", "min", "max",
    "z.b", "bzw", "usw", "u.a", "d.h", "ggf", "vgl", "a.m", "p.m",
    # months
    "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec",
})


class ChunkSpan(BaseModel):
    """A chunk of one source's text: `text == document_text[start:end]`."""

    source_id: str
    text: str
    start: int
    end: int


class _Unit(NamedTuple):
    """A sentence (or a piece of an over-long one) with its offsets, size and whether it begins a line."""

    start: int
    end: int
    words: int
    starts_line: bool


def count_words(text: str) -> int:
    """The size of a text in words, as passages are measured."""
    return sum(1 for _ in _WORD.finditer(text))


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """The (start, end) offsets of each sentence of a text, whitespace excluded; a line break always ends a sentence."""
    return [(start, end) for start, end, _ in _sentence_spans_marking_line_starts(text)]


def split_sentences(text: str) -> list[str]:
    """The sentences of a text, in order."""
    return [text[start:end] for start, end in sentence_spans(text)]


def chunk_document(
    source_id: str,
    text: str,
    *,
    min_words: int = DEFAULT_MIN_WORDS,
    max_words: int = DEFAULT_MAX_WORDS,
) -> list[ChunkSpan]:
    """A document's text packed into chunks of whole sentences of about `min_words` to `max_words` words; raises ValueError on bad bounds."""
    if not 0 < min_words <= max_words:
        raise ValueError(f"need 0 < min_words <= max_words, got {min_words} and {max_words}")
    groups = _pack_units(_units(text, max_words), min_words, max_words)
    return [
        ChunkSpan(source_id=source_id, text=text[group[0].start : group[-1].end], start=group[0].start, end=group[-1].end)
        for group in groups
    ]


def number_chunks(
    chunks_in_source_order: Sequence[Sequence[ChunkSpan]],
    *,
    snippet_source_ids: frozenset[str] = frozenset(),
    first_number: int = 1,
) -> list[Passage]:
    """Passages with ids `p{first_number}`, … in source order and then offset order."""
    passages: list[Passage] = []
    number = first_number
    for chunks in chunks_in_source_order:
        for chunk in sorted(chunks, key=lambda chunk: (chunk.start, chunk.end)):
            passages.append(
                Passage(
                    id=f"p{number}",
                    source_id=chunk.source_id,
                    text=chunk.text,
                    start=chunk.start,
                    end=chunk.end,
                    is_snippet=chunk.source_id in snippet_source_ids,
                )
            )
            number += 1
    return passages


def assign_passage_ids(
    documents_in_source_order: Sequence[tuple[str, Document]],
    *,
    first_number: int = 1,
    min_words: int = DEFAULT_MIN_WORDS,
    max_words: int = DEFAULT_MAX_WORDS,
) -> list[Passage]:
    """Chunk each (source id, document) pair and number the passages `pN` by source order, then offset; snippet documents give snippet passages."""
    chunks = [chunk_document(source_id, document.text, min_words=min_words, max_words=max_words) for source_id, document in documents_in_source_order]
    snippet_source_ids = frozenset(source_id for source_id, document in documents_in_source_order if document.kind == "snippet")
    return number_chunks(chunks, snippet_source_ids=snippet_source_ids, first_number=first_number)


def passage_number(passage_id: str) -> int:
    """The number in a passage id such as `p12`; raises ValueError for anything else."""
    if not passage_id.startswith("p") or not passage_id[1:].isdigit():
        raise ValueError(f"not a passage id: {passage_id!r}")
    return int(passage_id[1:])


def _sentence_spans_marking_line_starts(text: str) -> list[tuple[int, int, bool]]:
    """(start, end, whether it begins a line) for each sentence of a text."""
    spans: list[tuple[int, int, bool]] = []
    for line in _LINE.finditer(text):
        for index, (start, end) in enumerate(_sentence_spans_in_line(line.group(0))):
            spans.append((line.start() + start, line.start() + end, index == 0))
    return spans


def _sentence_spans_in_line(line: str) -> list[tuple[int, int]]:
    """Sentence spans within one line, relative to the line, whitespace excluded."""
    content_end = len(line.rstrip())
    boundaries = [0]
    for match in _SENTENCE_END.finditer(line, 0, content_end):
        if match.end() < content_end and _ends_sentence(line, boundaries[-1], match):
            boundaries.append(match.end())
    boundaries.append(content_end)
    spans: list[tuple[int, int]] = []
    for start, end in zip(boundaries, boundaries[1:]):
        piece = line[start:end]
        stripped_start = start + len(piece) - len(piece.lstrip())
        stripped_end = start + len(piece.rstrip())
        if stripped_start < stripped_end:
            spans.append((stripped_start, stripped_end))
    return spans


def _ends_sentence(line: str, sentence_start: int, match: re.Match[str]) -> bool:
    """Whether a terminator match really ends the sentence, judging by the word before it and the word after it."""
    following = line[match.end() :].lstrip()
    if not following:
        return True
    terminator = match.group(0).rstrip(_CLOSERS)
    if terminator.endswith(("。", "！", "？", "｡")):
        return True
    if following[0].islower():
        return False
    if terminator != ".":
        return True
    window_start = max(sentence_start, match.start() - 40)
    word_match = _WORD_BEFORE_PERIOD.search(line[window_start : match.start() + 1])
    word = (word_match.group(1) if word_match else "").lstrip("(\"'“‘[¿¡").lower()
    if word in ABBREVIATIONS:
        return False
    if len(word) == 1 and word.isalpha():
        return False  # an initial, as in "N. Korea" or "George W. Bush"
    if "." in word and all(len(part) <= 2 for part in word.split(".")):
        return False  # a dotted abbreviation such as "U.S." or "e.g."
    sentence_so_far = line[sentence_start : match.start()].strip() if match.start() - sentence_start <= 8 else ""
    if sentence_so_far.isdigit() or _is_roman_numeral(sentence_so_far):
        return False  # a list number such as "1." or "IV."
    return True


def _is_roman_numeral(word: str) -> bool:
    """Whether a word is a small upper-case Roman numeral."""
    return bool(word) and len(word) <= 6 and all(letter in "IVXLC" for letter in word)


def _units(text: str, max_words: int) -> list[_Unit]:
    """The sentences of a text as packing units, over-long sentences cut at word boundaries into pieces of at most `max_words`."""
    units: list[_Unit] = []
    for start, end, starts_line in _sentence_spans_marking_line_starts(text):
        words = list(_WORD.finditer(text, start, end))
        if len(words) <= max_words:
            units.append(_Unit(start, end, len(words), starts_line))
            continue
        for first in range(0, len(words), max_words):
            piece = words[first : first + max_words]
            units.append(_Unit(piece[0].start(), piece[-1].end(), len(piece), starts_line and first == 0))
    return units


def _pack_units(units: list[_Unit], min_words: int, max_words: int) -> list[list[_Unit]]:
    """Consecutive units grouped greedily up to `max_words`, closing a group early at a line start once it has `min_words`."""
    groups: list[list[_Unit]] = []
    sizes: list[int] = []
    current: list[_Unit] = []
    size = 0
    for unit in units:
        full = size + unit.words > max_words
        at_good_break = size >= min_words and unit.starts_line
        if current and (full or at_good_break):
            groups.append(current)
            sizes.append(size)
            current, size = [], 0
        current.append(unit)
        size += unit.words
    if current:
        # A short tail joins the group before it when both fit in one passage.
        if groups and size < min_words and sizes[-1] + size <= max_words:
            groups[-1].extend(current)
        else:
            groups.append(current)
    return groups
