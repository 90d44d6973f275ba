"""Sentences of a prose block, the `[pN]` cite runs in them, their plain text, and whether they assert a fact."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from research.audit.markdown import BlockKind
from research.audit.numbers import numbers_in

FACTUAL_MIN_WORDS = 8


CITE_GROUP = r"\[\s*p\d+(?:\s*[,;]\s*p\d+)*\s*\]"
CITE_RUN = re.compile(rf"{CITE_GROUP}(?:[ \t]*{CITE_GROUP})*", re.IGNORECASE)
CITE_ID = re.compile(r"p\d+", re.IGNORECASE)
_SENTENCE_END = re.compile(rf"[.!?]+[\"'”’)]*(?:\s*{CITE_GROUP})*(?=\s|$)", re.IGNORECASE)
_WORD_BEFORE = re.compile(r"([A-Za-z]+)$")
_ABBREVIATIONS = frozenset({
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "inc", "ltd", "corp", "fig", "approx",
    "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec",
})


def sentence_spans(content: str) -> list[tuple[int, int]]:
    """Start and end offsets of the sentences in `content`; cites after a full stop stay with their sentence."""
    spans: list[tuple[int, int]] = []
    start = _skip_space(content, 0)
    for match in _SENTENCE_END.finditer(content):
        if match.start() < start or not _is_sentence_boundary(content, match):
            continue
        spans.append((start, match.end()))
        start = _skip_space(content, match.end())
    end = len(content.rstrip())
    if start < end:
        spans.append((start, end))
    return spans


def _skip_space(text: str, position: int) -> int:
    while position < len(text) and text[position].isspace():
        position += 1
    return position


def _is_sentence_boundary(content: str, match: re.Match[str]) -> bool:
    following = content[_skip_space(content, match.end()):match.end() + 40]
    if following[:1].islower():
        return False
    if match.group(0).startswith("."):
        word = _WORD_BEFORE.search(content[:match.start()])
        if word and (len(word.group(1)) == 1 or word.group(1).lower() in _ABBREVIATIONS):
            return False
    return True


@dataclass
class Segment:
    """Text followed by a run of cites (the last segment of a sentence may have none)."""

    text: str
    cited_ids: list[str]
    kept_ids: list[str] = field(default_factory=list)


@dataclass
class Sentence:
    segments: list[Segment]
    kind: BlockKind
    plain: str
    is_claim: bool = False
    flagged: bool = False


def parse_segments(sentence: str) -> list[Segment]:
    segments: list[Segment] = []
    position = 0
    for run in CITE_RUN.finditer(sentence):
        ids = list(dict.fromkeys(cite.lower() for cite in CITE_ID.findall(run.group(0))))
        segments.append(Segment(sentence[position:run.start()], ids))
        position = run.end()
    segments.append(Segment(sentence[position:], []))
    return segments


_MARKDOWN_LINK = re.compile(r"\[([^\[\]\n]+)\]\([^()\s]*(?:\([^()\s]*\)[^()\s]*)*\)")
_BARE_URL = re.compile(r"https?://\S+", re.IGNORECASE)
_EMPHASIS = re.compile(r"[*_`]+")
CITE_RUN_WITH_SPACE = re.compile(r"\s*" + CITE_RUN.pattern, re.IGNORECASE)


def plain_text(markdown: str) -> str:
    """Text as a reader sees it: cites, link targets, URLs and emphasis marks removed, spaces collapsed."""
    text = CITE_RUN_WITH_SPACE.sub("", markdown)
    text = _MARKDOWN_LINK.sub(r"\1", text)
    text = _BARE_URL.sub(" ", text)
    text = _EMPHASIS.sub("", text)
    return " ".join(text.split())


_WORD = re.compile(r"[^\W\d_][\w'’-]*")


def is_factual(plain: str, kind: BlockKind) -> bool:
    """Whether a sentence asserts something (see the module docstring for the rule)."""
    if kind != "prose" or not plain or plain.endswith(("?", ":")):
        return False
    if numbers_in(plain):
        return True
    words = _WORD.findall(plain)
    if any(word[0].isupper() and word != "I" for word in words[1:]):
        return True
    return len(words) >= FACTUAL_MIN_WORDS


