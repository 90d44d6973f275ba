"""Lexical evidence: IDF-weighted coverage of a sentence's content words by a passage."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

from research.models import Passage

_STOPWORDS = frozenset("""
a about above after again against all also although am an and any are as at be because been before being
below between both but by can could did do does doing down during each either few for from further had has
have having he her here hers herself him himself his how however i if in into is it its itself just may
might more most much must my myself nor not now of off on once only or other our ours ourselves out over
own per same she should so some such than that the their theirs them themselves then there these they this
those though through thus to too under until up upon very via was we were what when where whether which
while who whom whose why will with within without would yet you your yours according reported report
reports said says stated states including include includes
percent cent thousand million billion trillion bn
""".split())
_TOKEN = re.compile(r"[^\W\d_][\w'’]*")


def _stem(word: str) -> str:
    """A crude stem: long words truncated, plural `s` dropped, so that inflections still match."""
    word = word.lower().removesuffix("'s").removesuffix("’s")
    if len(word) > 6:
        return word[:6]
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


def _content_stems(text: str) -> set[str]:
    return {_stem(token) for token in _TOKEN.findall(text) if len(token) > 1 and token.lower() not in _STOPWORDS}


class LexicalIndex:
    """IDF-weighted coverage of a sentence's content words by a passage, IDF over the shown passages."""

    def __init__(self, passages: Iterable[Passage]) -> None:
        self.stems: dict[str, set[str]] = {passage.id.lower(): _content_stems(passage.text) for passage in passages}
        self.document_count = len(self.stems)
        self.document_frequency: dict[str, int] = {}
        for stems in self.stems.values():
            for stem in stems:
                self.document_frequency[stem] = self.document_frequency.get(stem, 0) + 1

    def idf(self, stem: str) -> float:
        frequency = self.document_frequency.get(stem, 0)
        return math.log(1 + (self.document_count - frequency + 0.5) / (frequency + 0.5))

    def coverage(self, text: str, passage_id: str) -> float | None:
        """Share of `text`'s content-word weight found in the passage; None when `text` has no content words."""
        return self._coverage(_content_stems(text), passage_id)

    def coverages(self, text: str) -> dict[str, float]:
        """`coverage` of `text` by every passage, by passage id (lower case); empty when `text` has no content words."""
        sentence_stems = _content_stems(text)
        found = {passage_id: self._coverage(sentence_stems, passage_id) for passage_id in self.stems}
        return {passage_id: coverage for passage_id, coverage in found.items() if coverage is not None}

    def _coverage(self, sentence_stems: set[str], passage_id: str) -> float | None:
        if not sentence_stems:
            return None
        passage_stems = self.stems.get(passage_id, set())
        total = sum(self.idf(stem) for stem in sentence_stems)
        found = sum(self.idf(stem) for stem in sentence_stems & passage_stems)
        return found / total if total else None
