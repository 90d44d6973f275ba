"""The citation audit: every `[pN]` must be a passage the model was shown and must support its sentence.

How a cite is judged, in order:
1. An id the model was not shown is removed and counted as fabricated.
2. Numbers in the text a cite covers (dates, percentages, `1,000`, `12 million`, …) must appear in the
   cited passages, allowing rounding to the sentence's precision; a missing number is a clear failure.
3. Lexical evidence (IDF-weighted share of the sentence's content words found in the passage, IDF
   computed over the shown passages) decides the clear cases either way.
4. The doubtful middle band goes to `judge` (the fast LLM) in batches, while `may_use_llm()` allows;
   otherwise the cite is kept and its sentence flagged unverified. A cited text with no content words (a table
   row of figures) is supported when the cited passages state all its numbers.
Unsupported cites are removed. A claim the model left uncited, or whose every cite was removed (a weak model often
states a passage's fact and cites the wrong passage), is cited by the audit itself when a shown passage clearly
states it: the passage's lexical coverage of the claim is in the supported band above (the lower bound when
the claim has numbers) and the passage states every number of the claim. Such a cite is rendered like any other,
its verdict says `added_by_audit`, and its passage is marked so in the report (`CitedPassage.added_by_audit`).
A claim without a supported cite gets `UNVERIFIED_MARKER`, so no line of the body reaches the reader unless it is
supported, flagged, or claims nothing (research.audit.sentences says which lines are claims: every sentence of
prose, every table body row and every code block, whatever its length; not headings, questions, lead-ins or table
header rows). Cites are then renumbered `[n]` per source in order of first use.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Literal

from pydantic import BaseModel, Field

from research.audit.citations import normalise_citations
from research.audit.draft import normalise_answer
from research.audit.lexical import LexicalIndex
from research.audit.markdown import Block, BlockKind, leads_into, split_blocks
from research.audit.numbers import Number, number_is_stated, numbers_in, passage_values
from research.audit.sentences import (
    CLAIM_KINDS,
    Segment,
    Sentence,
    makes_claim,
    parse_segments,
    plain_text,
    sentence_spans,
)
from research.markdown import fenced_block
from research.models import Passage, SearchResult
from research.report import AuditFigures, CitedPassage, ReportSource

UNVERIFIED_MARKER = " ⚠️ _unverified_"
JUDGE_BATCH_SIZE = 20
SUPPORTED_COVERAGE = 0.5
SUPPORTED_COVERAGE_WITH_MATCHED_NUMBERS = 0.35
UNSUPPORTED_COVERAGE = 0.15

Verdict = Literal["supported", "unsupported", "fabricated", "uncited", "unverified"]
# How the citations table stores a cite the audit added (its verdict column is 16 characters).
ADDED_VERDICT = "added"


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
    """The audit's decision on one cite (or on an uncited claim), for storage.

    `passage_id` is None for "uncited" and "fabricated"; `claimed_id` keeps the id the model wrote (None for a
    cite the audit added, whose verdict is "supported" and `added_by_audit` True).
    """

    sentence: str
    passage_id: str | None = None
    verdict: Verdict
    claimed_id: str | None = None
    added_by_audit: bool = False

    @property
    def stored_verdict(self) -> str:
        """The verdict as the citations table keeps it: `ADDED_VERDICT` for a cite the audit added."""
        return ADDED_VERDICT if self.added_by_audit else self.verdict


class AuditResult(BaseModel):
    """The audited body with `[n]` citations, its sources and cited passages, the figures and every verdict."""

    body_markdown: str
    sources: list[ReportSource] = Field(default_factory=list)
    cited_passages: list[CitedPassage] = Field(default_factory=list)
    audit: AuditFigures = Field(default_factory=AuditFigures)
    citations: list[CitationVerdict] = Field(default_factory=list)
    judge_error: str | None = None


@dataclass
class _Check:
    """One (cite run, passage) pair under audit."""

    sentence: Sentence
    segment: Segment
    passage_id: str
    verdict: Verdict | None = None
    judge_id: str | None = None


@dataclass
class _Audit:
    passages: dict[str, Passage]
    index: LexicalIndex
    figures: AuditFigures = field(default_factory=AuditFigures)
    verdicts: list[CitationVerdict] = field(default_factory=list)
    checks: list[_Check] = field(default_factory=list)
    judge_error: str | None = None
    added_to: dict[str, list[str]] = field(default_factory=dict)
    values: dict[str, set[Decimal]] = field(default_factory=dict)

    def passage_values(self, passage_id: str) -> set[Decimal]:
        if passage_id not in self.values:
            self.values[passage_id] = passage_values(self.passages[passage_id].text)
        return self.values[passage_id]


def _attributed_texts(sentence: Sentence) -> list[str]:
    """For each segment with cites, the text its cites cover; trailing uncited text joins the last cite run."""
    texts = [segment.text for segment in sentence.segments]
    cited_indexes = [index for index, segment in enumerate(sentence.segments) if segment.cited_ids]
    if cited_indexes:
        last = cited_indexes[-1]
        texts[last] = texts[last] + " " + "".join(texts[last + 1:])
    return texts


def _check_sentence(audit: _Audit, sentence: Sentence) -> None:
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
        required = numbers_in(plain_text(attributed))
        run_values = set().union(*(audit.passage_values(passage_id) for passage_id in known_ids))
        numbers_stated = all(number_is_stated(number, run_values) for number in required)
        for passage_id in known_ids:
            check = _Check(sentence, segment, passage_id)
            check.verdict = _lexical_verdict(audit, check, attributed, required) if numbers_stated else "unsupported"
            audit.checks.append(check)


def _lexical_verdict(audit: _Audit, check: _Check, attributed: str, required: list[Number]) -> Verdict | None:
    """Supported, unsupported, or None (doubtful) from the sentence's content words found in the passage."""
    coverages = [
        coverage for coverage in (
            audit.index.coverage(plain_text(attributed), check.passage_id),
            audit.index.coverage(check.sentence.plain, check.passage_id),
        ) if coverage is not None
    ]
    if not coverages:
        # Figures alone (a table row) have no words to compare: its numbers, all stated, are the whole claim.
        return "supported" if required else None
    best = max(coverages)
    stated = audit.passage_values(check.passage_id)
    states_a_number = any(number_is_stated(number, stated) for number in required)
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


def _clearly_stating_passage(audit: _Audit, claim: str) -> str | None:
    """The shown passage that states every number of `claim` and covers most of its content words, if it covers
    them in the supported band; None when none does."""
    required = numbers_in(claim)
    coverages = {
        passage_id: coverage for passage_id, coverage in audit.index.coverages(claim).items()
        if passage_id in audit.passages
        and all(number_is_stated(number, audit.passage_values(passage_id)) for number in required)
    }
    if not coverages:
        return None
    best = max(coverages, key=lambda passage_id: coverages[passage_id])
    threshold = SUPPORTED_COVERAGE_WITH_MATCHED_NUMBERS if required else SUPPORTED_COVERAGE
    return best if coverages[best] >= threshold else None


# Where a cite goes at the end of a sentence: before its closing punctuation, or inside a table row's last cell.
_SENTENCE_CLOSE = re.compile(r"(?:[.!?]+[\"'”’)]*)?\s*$")
_ROW_CLOSE = re.compile(r"\s*(?:\|\s*)?$")


def _split_close(text: str, kind: BlockKind) -> tuple[str, str]:
    close = (_ROW_CLOSE if kind == "table" else _SENTENCE_CLOSE).search(text)
    position = close.start() if close else len(text)
    return text[:position], text[position:]


def _cite_uncited_claims(audit: _Audit, sentences: list[Sentence]) -> None:
    """Cite each claim the model left without a cite that stands (none written, or every one it wrote removed as
    unsupported or fabricated), code aside, with the shown passage that clearly states it, if any: weak models often
    state a passage's fact and cite the wrong passage, or none."""
    standing = {id(check.sentence) for check in audit.checks if check.verdict != "unsupported"}
    for sentence in sentences:
        if not sentence.is_claim or sentence.kind == "code" or id(sentence) in standing:
            continue
        passage_id = _clearly_stating_passage(audit, sentence.plain)
        if passage_id is None:
            continue
        text, close = _split_close("".join(segment.text for segment in sentence.segments), sentence.kind)
        sentence.segments = [Segment(text.rstrip() + " ", [passage_id], [passage_id]), Segment(close, [])]
        sentence.cited_by_audit = True
        audit.figures.citations_added += 1
        audit.added_to.setdefault(passage_id, []).append(sentence.plain)
        audit.verdicts.append(CitationVerdict(sentence=sentence.plain, passage_id=audit.passages[passage_id].id,
                                              verdict="supported", added_by_audit=True))


def _flag_sentences(audit: _Audit, sentences: list[Sentence]) -> None:
    """Flag claims left without a supported cite; record the uncited ones."""
    supported = {id(check.sentence) for check in audit.checks if check.verdict == "supported"}
    for sentence in sentences:
        if not sentence.is_claim:
            continue
        audit.figures.sentences_total += 1
        if id(sentence) in supported or sentence.cited_by_audit:
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


def _render_sentence(sentence: Sentence, numbering: _Numbering) -> str:
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
    if not sentence.flagged:
        return rendered
    if sentence.kind == "code":
        return f"{rendered}\n{UNVERIFIED_MARKER.strip()}"  # after the closing fence, outside the code
    text, close = _split_close(rendered, "table") if sentence.kind == "table" else (rendered, "")
    return text + UNVERIFIED_MARKER + close


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


def _cited_passage(numbering: _Numbering, passage_id: str, added_to: Mapping[str, list[str]]) -> CitedPassage:
    passage = numbering.passages[passage_id]
    return CitedPassage(
        id=passage.id, source_id=passage.source_id, source_number=numbering.number_of_source[passage.source_id],
        text=passage.text, is_snippet=passage.is_snippet,
        added_by_audit=passage_id in added_to, added_to=list(added_to.get(passage_id, [])),
    )


def _parse_draft(markdown: str) -> tuple[list[Block], list[list[tuple[int, int, Sentence]]]]:
    """The draft's blocks and, for each, its sentences with their offsets in the block's content."""
    blocks = split_blocks(markdown)
    block_sentences: list[list[tuple[int, int, Sentence]]] = []
    for index, block in enumerate(blocks):
        if block.kind == "verbatim":
            block_sentences.append([])
            continue
        if block.kind == "code":
            _fence, _language, code_lines = fenced_block(block.content)
            code = Sentence([Segment(block.content, [])], "code", " ".join(" ".join(code_lines).split()))
            code.is_claim = makes_claim(code.plain, "code")
            block_sentences.append([(0, len(block.content), code)])
            continue
        whole_line = block.kind in ("table", "table_header", "heading")
        spans = [(0, len(block.content.rstrip()))] if whole_line else sentence_spans(block.content)
        leads_in = leads_into(block, next((later for later in blocks[index + 1:] if later.content.strip()), None))
        sentences = []
        for number, (start, end) in enumerate(spans, start=1):
            text = block.content[start:end]
            segments = parse_segments(text)
            sentence = Sentence(segments, block.kind, plain_text(text))
            is_cited = any(segment.cited_ids for segment in segments)
            sentence.is_claim = block.kind in CLAIM_KINDS and (
                is_cited or makes_claim(sentence.plain, block.kind, leads_in=leads_in and number == len(spans)))
            sentences.append((start, end, sentence))
        block_sentences.append(sentences)
    return blocks, block_sentences


def _render_body(blocks: list[Block], block_sentences: list[list[tuple[int, int, Sentence]]], numbering: _Numbering) -> str:
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
    """Normalise the model's answer (research.audit.draft) and its citation spellings (research.audit.citations),
    audit its `[pN]` cites against the passages the model was shown, and renumber them `[n]` per source.

    `passages` are the passages shown to the model (by id), `sources` the run's sources by source id.
    Judge failures are not raised: the doubtful cites stay unverified and `judge_error` says why.
    """
    shown = {passage_id.lower(): passage for passage_id, passage in passages.items()}
    audit = _Audit(passages=shown, index=LexicalIndex(shown.values()))
    draft_markdown = normalise_citations(normalise_answer(draft_markdown), list(shown))
    blocks, block_sentences = _parse_draft(draft_markdown)
    sentences = [sentence for entries in block_sentences for _, _, sentence in entries]
    for sentence in sentences:
        _check_sentence(audit, sentence)
    await _judge_doubtful(audit, judge, may_use_llm)
    _apply_verdicts(audit)
    _cite_uncited_claims(audit, sentences)
    _flag_sentences(audit, sentences)
    numbering = _Numbering(shown)
    body = _render_body(blocks, block_sentences, numbering)
    return AuditResult(
        body_markdown=body,
        sources=_report_sources(numbering, sources),
        cited_passages=[_cited_passage(numbering, passage_id, audit.added_to) for passage_id in numbering.passage_order],
        audit=audit.figures,
        citations=audit.verdicts,
        judge_error=audit.judge_error,
    )
