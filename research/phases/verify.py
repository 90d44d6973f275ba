"""The citation audit: every `[pN]` must be a passage the model was shown and must support its sentence.

How a cite is judged, in order:
1. An id the model was not shown is removed and counted as fabricated.
2. Numbers in the text a cite covers (dates, percentages, `1,000`, `12 million`, …) must appear in the
   cited passages, allowing rounding to the sentence's precision; a missing number is a clear failure.
3. Lexical evidence (IDF-weighted share of the sentence's content words found in the passage, IDF
   computed over the shown passages) decides the clear cases either way.
4. The doubtful middle band goes to `judge` (the fast LLM) in batches, while `may_use_llm()` allows;
   otherwise the cite is kept and its sentence flagged unverified.
Unsupported cites are removed. A claim sentence without a supported cite gets `UNVERIFIED_MARKER`.
A sentence is a claim when it carries a cite or is factual: not a heading, table row, question or
lead-in ending with ":", and it contains a number, a capitalised word after its first word, or at
least `FACTUAL_MIN_WORDS` words. Cites are then renumbered `[n]` per source in order of first use.
"""

from __future__ import annotations

import math
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Literal

from pydantic import BaseModel, Field

from research.models import Passage, SearchResult
from research.report import AuditFigures, CitedPassage, ReportSource

UNVERIFIED_MARKER = " ⚠️ _unverified_"
JUDGE_BATCH_SIZE = 20
SUPPORTED_COVERAGE = 0.5
SUPPORTED_COVERAGE_WITH_MATCHED_NUMBERS = 0.35
UNSUPPORTED_COVERAGE = 0.15
FACTUAL_MIN_WORDS = 8

Verdict = Literal["supported", "unsupported", "fabricated", "uncited", "unverified"]


class SourceInfo(BaseModel):
    """What the source list needs to know about a source."""

    title: str
    url: str
    provider: str = ""


class JudgeItem(BaseModel):
    """One doubtful (sentence, passage) pair for the LLM to judge; `id` keys the answer."""

    id: str
    sentence: str
    passage_text: str


Judge = Callable[[list[JudgeItem]], Awaitable[dict[str, bool]]]


class CitationVerdict(BaseModel):
    """The audit's decision on one cite (or on an uncited factual sentence), for storage.

    `passage_id` is None for "uncited" and "fabricated"; `claimed_id` keeps the id the model wrote.
    """

    sentence: str
    passage_id: str | None = None
    verdict: Verdict
    claimed_id: str | None = None


class AuditResult(BaseModel):
    """The audited body with `[n]` citations, its sources and cited passages, the figures and every verdict."""

    body_markdown: str
    sources: list[ReportSource] = Field(default_factory=list)
    cited_passages: list[CitedPassage] = Field(default_factory=list)
    audit: AuditFigures = Field(default_factory=AuditFigures)
    citations: list[CitationVerdict] = Field(default_factory=list)
    judge_error: str | None = None


# --- Markdown structure --------------------------------------------------------------------------

BlockKind = Literal["verbatim", "prose", "heading", "table"]

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(\s{0,3}#{1,6}\s+)(.*)$")
_RULE = re.compile(r"^\s{0,3}([-*_])(?:\s*\1){2,}\s*$")
_LIST_ITEM = re.compile(r"^(\s*(?:[-*+]|\d{1,9}[.)])\s+)(.*)$")
_QUOTE = re.compile(r"^(\s{0,3}>\s?)(.*)$")
_TABLE_ROW = re.compile(r"^\s*\|")
_TABLE_SEPARATOR = re.compile(r"^\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*$")


@dataclass
class _Block:
    """A run of draft lines: `prefix` (list marker, `#`s, `>`) is kept as is, `content` is audited."""

    kind: BlockKind
    content: str
    prefix: str = ""


def _split_blocks(markdown: str) -> list[_Block]:
    """The draft as blocks whose joined text (by newlines) is the draft again."""
    blocks: list[_Block] = []
    lines = markdown.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        if _FENCE.match(line):
            fence = _FENCE.match(line).group(1)  # type: ignore[union-attr]
            end = index + 1
            while end < len(lines) and not lines[end].strip().startswith(fence):
                end += 1
            blocks.append(_Block("verbatim", "\n".join(lines[index:end + 1])))
            index = end + 1
            continue
        if not line.strip() or _RULE.match(line) or (_TABLE_ROW.match(line) and _TABLE_SEPARATOR.match(line)):
            blocks.append(_Block("verbatim", line))
        elif heading := _HEADING.match(line):
            blocks.append(_Block("heading", heading.group(2), heading.group(1)))
        elif _TABLE_ROW.match(line):
            blocks.append(_Block("table", line))
        elif item := _LIST_ITEM.match(line):
            content = [item.group(2)]
            while index + 1 < len(lines) and _is_continuation(lines[index + 1]):
                index += 1
                content.append(lines[index])
            blocks.append(_Block("prose", "\n".join(content), item.group(1)))
        elif quote := _QUOTE.match(line):
            blocks.append(_Block("prose", quote.group(2), quote.group(1)))
        else:
            content = [line]
            while index + 1 < len(lines) and _is_paragraph_line(lines[index + 1]):
                index += 1
                content.append(lines[index])
            blocks.append(_Block("prose", "\n".join(content)))
        index += 1
    return blocks


def _is_paragraph_line(line: str) -> bool:
    return bool(line.strip()) and not any(
        pattern.match(line) for pattern in (_FENCE, _HEADING, _RULE, _LIST_ITEM, _QUOTE, _TABLE_ROW)
    )


def _is_continuation(line: str) -> bool:
    return line[:1].isspace() and _is_paragraph_line(line)


# --- sentences and cites -------------------------------------------------------------------------

_CITE_GROUP = r"\[\s*p\d+(?:\s*[,;]\s*p\d+)*\s*\]"
_CITE_RUN = re.compile(rf"{_CITE_GROUP}(?:[ \t]*{_CITE_GROUP})*", re.IGNORECASE)
_CITE_ID = re.compile(r"p\d+", re.IGNORECASE)
_SENTENCE_END = re.compile(rf"[.!?]+[\"'”’)]*(?:\s*{_CITE_GROUP})*(?=\s|$)", re.IGNORECASE)
_WORD_BEFORE = re.compile(r"([A-Za-z]+)$")
_ABBREVIATIONS = frozenset({
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "inc", "ltd", "corp", "fig", "approx",
    "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec",
})


def _sentence_spans(content: str) -> list[tuple[int, int]]:
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
class _Segment:
    """Text followed by a run of cites (the last segment of a sentence may have none)."""

    text: str
    cited_ids: list[str]
    kept_ids: list[str] = field(default_factory=list)


@dataclass
class _Sentence:
    segments: list[_Segment]
    kind: BlockKind
    plain: str
    is_claim: bool = False
    flagged: bool = False


def _parse_segments(sentence: str) -> list[_Segment]:
    segments: list[_Segment] = []
    position = 0
    for run in _CITE_RUN.finditer(sentence):
        ids = list(dict.fromkeys(cite.lower() for cite in _CITE_ID.findall(run.group(0))))
        segments.append(_Segment(sentence[position:run.start()], ids))
        position = run.end()
    segments.append(_Segment(sentence[position:], []))
    return segments


_MARKDOWN_LINK = re.compile(r"\[([^\[\]\n]+)\]\([^()\s]*(?:\([^()\s]*\)[^()\s]*)*\)")
_BARE_URL = re.compile(r"https?://\S+", re.IGNORECASE)
_EMPHASIS = re.compile(r"[*_`]+")
_CITE_RUN_WITH_SPACE = re.compile(r"\s*" + _CITE_RUN.pattern, re.IGNORECASE)


def _plain_text(markdown: str) -> str:
    """Text as a reader sees it: cites, link targets, URLs and emphasis marks removed, spaces collapsed."""
    text = _CITE_RUN_WITH_SPACE.sub("", markdown)
    text = _MARKDOWN_LINK.sub(r"\1", text)
    text = _BARE_URL.sub(" ", text)
    text = _EMPHASIS.sub("", text)
    return " ".join(text.split())


_WORD = re.compile(r"[^\W\d_][\w'’-]*")


def _is_factual(plain: str, kind: BlockKind) -> bool:
    """Whether a sentence asserts something (see the module docstring for the rule)."""
    if kind != "prose" or not plain or plain.endswith(("?", ":")):
        return False
    if _numbers(plain):
        return True
    words = _WORD.findall(plain)
    if any(word[0].isupper() and word != "I" for word in words[1:]):
        return True
    return len(words) >= FACTUAL_MIN_WORDS


# --- numbers -------------------------------------------------------------------------------------

_NUMBER = re.compile(
    r"""
    (?<![\w.,])
    (?P<mantissa>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)
    (?![.,]\d)
    (?:
        \s?(?P<word_scale>%|percent\b|per\s?cent\b|thousand\b|million\b|billion\b|trillion\b)
      | (?P<short_scale>k|m|bn|b)(?!\w)
    )?
    (?:st|nd|rd|th|s)?
    (?!\w)
    """,
    re.VERBOSE | re.IGNORECASE,
)
_SCALES: dict[str, Decimal] = {
    "thousand": Decimal(10) ** 3, "k": Decimal(10) ** 3,
    "million": Decimal(10) ** 6, "m": Decimal(10) ** 6,
    "billion": Decimal(10) ** 9, "bn": Decimal(10) ** 9, "b": Decimal(10) ** 9,
    "trillion": Decimal(10) ** 12,
}
_NUMBER_WORDS: dict[str, int] = {
    word: value for value, word in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
        "sixteen seventeen eighteen nineteen twenty".split()
    )
} | {"thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90,
     "hundred": 100, "dozen": 12, "half": 50}
_NUMBER_WORD = re.compile(r"\b(" + "|".join(_NUMBER_WORDS) + r")\b", re.IGNORECASE)


@dataclass(frozen=True)
class _Number:
    mantissa: Decimal
    multiplier: Decimal
    decimals: int

    @property
    def value(self) -> Decimal:
        return self.mantissa * self.multiplier


def _numbers(text: str) -> list[_Number]:
    """Numbers, dates, percentages and scaled quantities in `text`, normalised (`1,000` is 1000, `12 million` 12e6)."""
    found: list[_Number] = []
    for match in _NUMBER.finditer(text):
        raw = match.group("mantissa").replace(",", "")
        try:
            mantissa = Decimal(raw)
        except InvalidOperation:
            continue
        scale = (match.group("word_scale") or match.group("short_scale") or "").lower()
        multiplier = _SCALES.get(scale, Decimal(1))
        decimals = len(raw.partition(".")[2])
        found.append(_Number(mantissa, multiplier, decimals))
    return found


def _passage_values(text: str) -> set[Decimal]:
    """Every value a passage states: scaled and unscaled forms, and small numbers written as words."""
    values: set[Decimal] = set()
    for number in _numbers(text):
        values.update((number.value, number.mantissa))
    values.update(Decimal(_NUMBER_WORDS[word.lower()]) for word in _NUMBER_WORD.findall(text))
    return values


def _number_is_stated(number: _Number, values: Iterable[Decimal]) -> bool:
    """Whether a passage value equals `number`, allowing rounding to the precision the sentence wrote."""
    exponent = Decimal(1).scaleb(-number.decimals)
    for value in values:
        try:
            if (value / number.multiplier).quantize(exponent, rounding=ROUND_HALF_UP) == number.mantissa:
                return True
        except InvalidOperation:  # a value too large to round at this precision cannot be the one written
            continue
    return False


# --- lexical evidence ----------------------------------------------------------------------------

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


class _LexicalIndex:
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
        sentence_stems = _content_stems(text)
        if not sentence_stems:
            return None
        passage_stems = self.stems.get(passage_id, set())
        total = sum(self.idf(stem) for stem in sentence_stems)
        found = sum(self.idf(stem) for stem in sentence_stems & passage_stems)
        return found / total if total else None


# --- the audit -----------------------------------------------------------------------------------

@dataclass
class _Check:
    """One (cite run, passage) pair under audit."""

    sentence: _Sentence
    segment: _Segment
    passage_id: str
    verdict: Verdict | None = None
    judge_id: str | None = None


@dataclass
class _Audit:
    passages: dict[str, Passage]
    index: _LexicalIndex
    figures: AuditFigures = field(default_factory=AuditFigures)
    verdicts: list[CitationVerdict] = field(default_factory=list)
    checks: list[_Check] = field(default_factory=list)
    judge_error: str | None = None


def _attributed_texts(sentence: _Sentence) -> list[str]:
    """For each segment with cites, the text its cites cover; trailing uncited text joins the last cite run."""
    texts = [segment.text for segment in sentence.segments]
    cited_indexes = [index for index, segment in enumerate(sentence.segments) if segment.cited_ids]
    if cited_indexes:
        last = cited_indexes[-1]
        texts[last] = texts[last] + " " + "".join(texts[last + 1:])
    return texts


def _check_sentence(audit: _Audit, sentence: _Sentence) -> None:
    """Drop fabricated ids and decide each remaining cite by numbers and lexical evidence (doubtful stays open)."""
    for segment, attributed in zip(sentence.segments, _attributed_texts(sentence)):
        known_ids = []
        for cited_id in segment.cited_ids:
            if cited_id in audit.passages:
                known_ids.append(cited_id)
                continue
            audit.figures.fabricated_removed += 1
            audit.verdicts.append(CitationVerdict(sentence=sentence.plain, verdict="fabricated", claimed_id=cited_id))
        if not known_ids:
            continue
        required = _numbers(_plain_text(attributed))
        run_values = set().union(*(_passage_values(audit.passages[passage_id].text) for passage_id in known_ids))
        numbers_stated = all(_number_is_stated(number, run_values) for number in required)
        for passage_id in known_ids:
            check = _Check(sentence, segment, passage_id)
            check.verdict = _lexical_verdict(audit, check, attributed, required) if numbers_stated else "unsupported"
            audit.checks.append(check)


def _lexical_verdict(audit: _Audit, check: _Check, attributed: str, required: list[_Number]) -> Verdict | None:
    """Supported, unsupported, or None (doubtful) from the sentence's content words found in the passage."""
    coverages = [
        coverage for coverage in (
            audit.index.coverage(_plain_text(attributed), check.passage_id),
            audit.index.coverage(check.sentence.plain, check.passage_id),
        ) if coverage is not None
    ]
    if not coverages:
        return None
    best = max(coverages)
    passage_values = _passage_values(audit.passages[check.passage_id].text)
    states_a_number = any(_number_is_stated(number, passage_values) for number in required)
    threshold = SUPPORTED_COVERAGE_WITH_MATCHED_NUMBERS if states_a_number else SUPPORTED_COVERAGE
    if best >= threshold:
        return "supported"
    if best < UNSUPPORTED_COVERAGE:
        return "unsupported"
    return None


async def _judge_doubtful(audit: _Audit, judge: Judge | None, may_use_llm: Callable[[], bool]) -> None:
    """Ask `judge` about the doubtful cites in batches of at most `JUDGE_BATCH_SIZE`; unjudged ones stay unverified."""
    doubtful = [check for check in audit.checks if check.verdict is None]
    for number, check in enumerate(doubtful, start=1):
        check.judge_id = f"c{number}"
    for start in range(0, len(doubtful), JUDGE_BATCH_SIZE):
        if judge is None or audit.judge_error is not None or not may_use_llm():
            break
        batch = doubtful[start:start + JUDGE_BATCH_SIZE]
        items = [
            JudgeItem(id=check.judge_id or "", sentence=check.sentence.plain, passage_text=audit.passages[check.passage_id].text)
            for check in batch
        ]
        try:
            answers = await judge(items)
        except Exception as error:  # the judge is a remote model: any failure leaves these cites unverified
            audit.judge_error = f"{type(error).__name__}: {error}"
            break
        audit.figures.judged_by_llm += len(batch)
        for check in batch:
            check.verdict = "supported" if answers.get(check.judge_id or "") is True else "unsupported"
    for check in doubtful:
        if check.verdict is None:
            check.verdict = "unverified"


def _apply_verdicts(audit: _Audit) -> None:
    """Keep supported and unverified cites, remove unsupported ones, and count every verdict."""
    for check in audit.checks:
        audit.figures.citations_checked += 1
        if check.verdict == "supported":
            audit.figures.citations_supported += 1
        elif check.verdict == "unsupported":
            audit.figures.citations_removed += 1
        if check.verdict != "unsupported" and check.passage_id not in check.segment.kept_ids:
            check.segment.kept_ids.append(check.passage_id)
        audit.verdicts.append(
            CitationVerdict(sentence=check.sentence.plain, passage_id=audit.passages[check.passage_id].id,
                            verdict=check.verdict or "unverified", claimed_id=check.passage_id)
        )


def _flag_sentences(audit: _Audit, sentences: list[_Sentence]) -> None:
    """Flag claim sentences left without a supported cite; record uncited factual ones."""
    supported = {id(check.sentence) for check in audit.checks if check.verdict == "supported"}
    for sentence in sentences:
        if not sentence.is_claim:
            continue
        audit.figures.sentences_total += 1
        if id(sentence) in supported:
            audit.figures.sentences_verified += 1
            continue
        audit.figures.sentences_unverified += 1
        sentence.flagged = True
        if not any(segment.cited_ids for segment in sentence.segments):
            audit.verdicts.append(CitationVerdict(sentence=sentence.plain, verdict="uncited"))


# --- renumbering and output ----------------------------------------------------------------------

class _Numbering:
    """Source numbers in order of first use, and the passages used from each source."""

    def __init__(self, passages: Mapping[str, Passage]) -> None:
        self.passages = passages
        self.number_of_source: dict[str, int] = {}
        self.passages_of_source: dict[str, list[str]] = {}
        self.passage_order: list[str] = []

    def numbers_for(self, passage_ids: list[str]) -> list[int]:
        numbers: list[int] = []
        for passage_id in passage_ids:
            passage = self.passages[passage_id]
            number = self.number_of_source.setdefault(passage.source_id, len(self.number_of_source) + 1)
            used = self.passages_of_source.setdefault(passage.source_id, [])
            if passage.id not in used:
                used.append(passage.id)
                self.passage_order.append(passage_id)
            if number not in numbers:
                numbers.append(number)
        return numbers


def _render_sentence(sentence: _Sentence, numbering: _Numbering) -> str:
    pieces: list[str] = []
    segments = sentence.segments
    for index, segment in enumerate(segments):
        if not segment.cited_ids:
            pieces.append(segment.text)
            continue
        numbers = numbering.numbers_for(segment.kept_ids)
        if numbers:
            pieces.append(segment.text + "".join(f"[{number}]" for number in numbers))
            continue
        following = "".join(later.text for later in segments[index + 1:])
        # A removed cite must not leave a space before the punctuation that followed it.
        removable_space = not following or following[0].isspace() or following[0] in ".,;:!?)"
        pieces.append(segment.text.rstrip() if removable_space else segment.text)
    rendered = "".join(pieces)
    return rendered + UNVERIFIED_MARKER if sentence.flagged else rendered


def _source_entry(source_id: str, sources: Mapping[str, SearchResult | SourceInfo]) -> tuple[str, str, str]:
    info = sources.get(source_id)
    if info is None:
        return source_id, "", ""
    return info.title or info.url or source_id, info.url, info.provider


def _report_sources(numbering: _Numbering, sources: Mapping[str, SearchResult | SourceInfo]) -> list[ReportSource]:
    entries: list[ReportSource] = []
    for source_id, number in numbering.number_of_source.items():
        title, url, provider = _source_entry(source_id, sources)
        used = numbering.passages_of_source[source_id]
        entries.append(ReportSource(
            number=number, source_id=source_id, title=title, url=url, provider=provider, passages_used=used,
            snippet_only=all(numbering.passages[passage_id.lower()].is_snippet for passage_id in used),
        ))
    return sorted(entries, key=lambda entry: entry.number)


def _cited_passages(numbering: _Numbering) -> list[CitedPassage]:
    return [
        CitedPassage(
            id=passage.id, source_id=passage.source_id, source_number=numbering.number_of_source[passage.source_id],
            text=passage.text, is_snippet=passage.is_snippet,
        )
        for passage in (numbering.passages[passage_id] for passage_id in numbering.passage_order)
    ]


def _parse_draft(markdown: str) -> tuple[list[_Block], list[list[tuple[int, int, _Sentence]]]]:
    """The draft's blocks and, for each, its sentences with their offsets in the block's content."""
    blocks = _split_blocks(markdown)
    block_sentences: list[list[tuple[int, int, _Sentence]]] = []
    for block in blocks:
        if block.kind == "verbatim":
            block_sentences.append([])
            continue
        spans = [(0, len(block.content.rstrip()))] if block.kind in ("table", "heading") else _sentence_spans(block.content)
        sentences = []
        for start, end in spans:
            text = block.content[start:end]
            segments = _parse_segments(text)
            sentence = _Sentence(segments, block.kind, _plain_text(text))
            is_cited = any(segment.cited_ids for segment in segments)
            sentence.is_claim = block.kind == "prose" and (is_cited or _is_factual(sentence.plain, block.kind))
            sentences.append((start, end, sentence))
        block_sentences.append(sentences)
    return blocks, block_sentences


def _render_body(blocks: list[_Block], block_sentences: list[list[tuple[int, int, _Sentence]]], numbering: _Numbering) -> str:
    rendered_blocks: list[str] = []
    for block, sentences in zip(blocks, block_sentences):
        content, position, pieces = block.content, 0, []
        for start, end, sentence in sentences:
            pieces.append(content[position:start])
            pieces.append(_render_sentence(sentence, numbering))
            position = end
        pieces.append(content[position:])
        rendered_blocks.append(block.prefix + "".join(pieces))
    return "\n".join(rendered_blocks)


async def verify_draft(
    draft_markdown: str,
    *,
    passages: Mapping[str, Passage],
    sources: Mapping[str, SearchResult | SourceInfo],
    judge: Judge | None = None,
    may_use_llm: Callable[[], bool] = lambda: True,
) -> AuditResult:
    """Audit the draft's `[pN]` cites against the passages the model was shown and renumber them `[n]` per source.

    `passages` are the passages shown to the model (by id), `sources` the run's sources by source id.
    Judge failures are not raised: the doubtful cites stay unverified and `judge_error` says why.
    """
    shown = {passage_id.lower(): passage for passage_id, passage in passages.items()}
    audit = _Audit(passages=shown, index=_LexicalIndex(shown.values()))
    blocks, block_sentences = _parse_draft(draft_markdown)
    sentences = [sentence for entries in block_sentences for _, _, sentence in entries]
    for sentence in sentences:
        _check_sentence(audit, sentence)
    await _judge_doubtful(audit, judge, may_use_llm)
    _apply_verdicts(audit)
    _flag_sentences(audit, sentences)
    numbering = _Numbering(shown)
    body = _render_body(blocks, block_sentences, numbering)
    return AuditResult(
        body_markdown=body,
        sources=_report_sources(numbering, sources),
        cited_passages=_cited_passages(numbering),
        audit=audit.figures,
        citations=audit.verdicts,
        judge_error=audit.judge_error,
    )
