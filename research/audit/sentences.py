"""Sentences of a prose block, the `[pN]` cite runs in them, their plain text, and whether they make a claim.

Every line of a report's body reaches the reader supported, flagged unverified, or as one of the parts that claim
nothing. Those parts are: headings (and a line in bold alone), a table's header row and delimiter row, blank lines
and rules, a question (a sentence ending with "?"), a lead-in (the last sentence of a paragraph or list item, ending
with ":", right before the list, quote, table or code it introduces), and text with no letter or digit at all.
Everything else is a claim, whatever its length: each sentence of a paragraph, list item or quote, each table body
row, and each fenced code block (whole: a report has no business with code, and code cannot carry a cite, so it
is shown flagged). A one-word line is flagged, not dropped: a reader sees that the model wrote it and that nothing
shown backs it, and a "Yes." in an answer keeps its place. A sentence with a cite is a claim wherever it stands in
prose, so a cited question or lead-in is audited too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from research.audit.markdown import BlockKind
from research.markdown import PARSERS, inline_text


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
    cited_by_audit: bool = False


def parse_segments(sentence: str) -> list[Segment]:
    segments: list[Segment] = []
    position = 0
    for run in CITE_RUN.finditer(sentence):
        ids = list(dict.fromkeys(cite.lower() for cite in CITE_ID.findall(run.group(0))))
        segments.append(Segment(sentence[position:run.start()], ids))
        position = run.end()
    segments.append(Segment(sentence[position:], []))
    return segments


_BARE_URL = re.compile(r"https?://\S+", re.IGNORECASE)
# Marks a sentence cut out of its emphasis still has (`**It doubled.` of `**Solar grew. It doubled.**`) are no words.
_MARK_CHARACTERS = re.compile(r"[*_`]+")
CITE_RUN_WITH_SPACE = re.compile(r"\s*" + CITE_RUN.pattern, re.IGNORECASE)


def plain_text(markdown: str) -> str:
    """Text as a reader sees it: cites, link targets, URLs and emphasis marks removed, spaces collapsed."""
    tokens = PARSERS.markdown.parseInline(CITE_RUN_WITH_SPACE.sub("", markdown))
    text = inline_text(tokens[0].children or []) if tokens else ""
    text = _BARE_URL.sub(" ", text)
    text = _MARK_CHARACTERS.sub("", text)
    return " ".join(text.split())


CLAIM_KINDS: frozenset[BlockKind] = frozenset({"prose", "table", "code"})


def makes_claim(plain: str, kind: BlockKind, *, leads_in: bool = False) -> bool:
    """Whether an uncited sentence claims something (the rule is in the module docstring); `leads_in` says that it
    is the last sentence of its block and a list, quote, table or code block follows."""
    if kind not in CLAIM_KINDS or not any(character.isalnum() for character in plain):
        return False
    if kind == "prose" and (plain.endswith("?") or (leads_in and plain.endswith(":"))):
        return False
    return True
