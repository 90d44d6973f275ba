"""What changed between two runs of a watch, computed by deepthread from their stored sources, never by the model.

A source is compared by its URL (normalised: scheme and host in lower case, no fragment, no trailing slash) and
the checksum of the text read from it (`text_checksum`). A URL only the current run has, and read, is "new"; one
only the previous run had, and had read, is "gone" (a search result merely listed, never read, is neither). A URL
both runs read, whose text differs, is compared sentence by sentence: two sentences that read the same once their
figures (`$29`, `1,200`, `15%`, `€4.5m`, `3 million`) are set aside, but whose figures differ, give a "figure" change
per figure that moved; a text that differs with no such sentence gives one "changed". A source either run saw only as a search snippet (no checksum) is not compared.

Sentences that read the same on both sides are set aside first. Of the sentences left, those of one shape are paired
in order when both runs have the same number of them, and skipped when they do not (a row added to a table, say,
would otherwise pair every later row with the wrong one).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any, Literal, NamedTuple
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict

from research.passages import split_sentences

ChangeKind = Literal["new", "changed", "figure", "gone"]

CONTEXT_MAX_CHARS = 200
TITLE_MAX_CHARS = 80
NOTHING_CHANGED = "- Nothing new, changed or gone among the sources read."


def source_key(url: str, file_name: str | None) -> str:
    """What a source is compared by across runs: its URL, or, for a shared file without one (the terminal's, read
    from the disk), `file:` and its name."""
    return url or (f"file:{file_name}" if file_name else "")


def text_checksum(text: str) -> str:
    """The SHA-256 (hex) of a source's text, as `Source.checksum` stores it and `compute_changes` compares it."""
    return hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest()


class PassageSnapshot(NamedTuple):
    """A passage of a run's source: its run-stable id (`p3`), its text, and whether it is a search snippet."""

    passage_id: str
    text: str
    is_snippet: bool = False


class SourceSnapshot(NamedTuple):
    """A source of a run as a later run compares it: its address, title, text checksum and passages in text order."""

    url: str
    title: str
    checksum: str | None
    passages: tuple[PassageSnapshot, ...]

    @classmethod
    def of(cls, url: str, title: str | None, checksum: str | None, file: Mapping[str, Any] | None,
           passages: Iterable[PassageSnapshot]) -> SourceSnapshot:
        """A source as stored, or as a run just found it (`file`: a shared file's details): compared by `source_key`,
        named by its title, or else its address."""
        return cls(url=source_key(url, (file or {}).get("name")), title=title or url, checksum=checksum,
                   passages=tuple(passages))


class Change(BaseModel):
    """One thing that changed since the previous run; `passage_id` is the current run's passage that shows it.

    For a "figure": `before` and `after` are the figures as written and `context` the current sentence (one line).
    """

    model_config = ConfigDict(frozen=True)

    kind: ChangeKind
    url: str
    title: str
    passage_id: str | None = None
    before: str | None = None
    after: str | None = None
    context: str | None = None


# --- comparing ----------------------------------------------------------------------------------

def compute_changes(previous: Sequence[SourceSnapshot], current: Sequence[SourceSnapshot]) -> list[Change]:
    """The changes from `previous` to `current`: new sources, moved figures, changed texts, then gone sources; each
    kind in the current run's source order (gone ones in the previous run's)."""
    before, after = _by_url(previous), _by_url(current)
    # New and gone are said of pages read (with a checksum): a search result that was only listed is not news, and
    # one that could not be fetched this time is not gone.
    new = [Change(kind="new", url=source.url, title=_title(source), passage_id=_first_passage(source))
           for key, source in after.items() if key not in before and source.checksum is not None]
    figures: list[Change] = []
    changed: list[Change] = []
    for key, source in after.items():
        earlier = before.get(key)
        if earlier is None or earlier.checksum is None or source.checksum is None or earlier.checksum == source.checksum:
            continue
        moved = _figure_changes(earlier, source)
        figures.extend(moved)
        if not moved:
            changed.append(Change(kind="changed", url=source.url, title=_title(source),
                                  passage_id=_first_passage(source)))
    gone = [Change(kind="gone", url=source.url, title=_title(source)) for key, source in before.items()
            if key not in after and source.checksum is not None]
    return [*new, *figures, *changed, *gone]


def comparable_url(url: str) -> str:
    """`url` as runs are matched on: scheme and host in lower case, no fragment, no trailing slash, query kept."""
    stripped = url.strip()
    try:
        parts = urlsplit(stripped)
    except ValueError:  # a malformed address (an unclosed IPv6 bracket) is compared as written
        return stripped
    return urlunsplit((parts.scheme.lower(), parts.netloc.lower(), parts.path.rstrip("/"), parts.query, ""))


def _by_url(sources: Iterable[SourceSnapshot]) -> dict[str, SourceSnapshot]:
    """Sources by comparable URL, the first of duplicates kept; a source with no address at all cannot be matched
    across runs and is left out (a file read from the disk has `file:` and its name: `source_key`)."""
    found: dict[str, SourceSnapshot] = {}
    for source in sources:
        key = comparable_url(source.url)
        if key:
            found.setdefault(key, source)
    return found


def _title(source: SourceSnapshot) -> str:
    return source.title.strip() or source.url


def _first_passage(source: SourceSnapshot) -> str | None:
    """The source's first passage read from its text, else its first passage (a snippet), else None."""
    read = next((passage.passage_id for passage in source.passages if not passage.is_snippet), None)
    return read or next((passage.passage_id for passage in source.passages), None)


# --- figures ------------------------------------------------------------------------------------

_FIGURE = re.compile(
    r"""
    (?<![\w.,])
    (?P<currency>[$€£¥₹]\s?)?
    (?P<number>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)
    (?![.,]\d)
    (?P<unit>\s?(?:%|percent\b|per\s?cent\b|thousand\b|million\b|billion\b|trillion\b)|(?:k|m|bn|b)(?!\w))?
    (?!\w)
    """,
    re.VERBOSE | re.IGNORECASE,
)
# A list item's marker at the start of a sentence: a bullet or a number, then a space (so "-3%" keeps its sign). It is
# not part of the sentence: an item's number is no figure, and a list renumbered between runs changes none.
_LIST_MARKER = re.compile(r"^(?:[-*+•]|\d{1,3}[.)])\s+")
_UNITS = {"percent": "%", "k": "thousand", "m": "million", "b": "billion", "bn": "billion"}
_PLACEHOLDER = "\ufffc"

FigureKey = tuple[str, Decimal, str]


class _Figure(NamedTuple):
    """A figure as written (`$29`), what it is compared by (currency, value, unit), and where it is in its sentence."""

    text: str
    key: FigureKey
    start: int


class _Sentence(NamedTuple):
    """A sentence of a source's passages, on one line, with its figures and its shape (the text without them)."""

    passage_id: str
    text: str
    shape: str
    figures: tuple[_Figure, ...]


def _figure_key(match: re.Match[str]) -> FigureKey:
    currency = (match.group("currency") or "").strip()
    try:
        value = Decimal(match.group("number").replace(",", "")).normalize()
    except InvalidOperation:  # not reached: the pattern admits only digits, commas and one point
        value = Decimal(0)
    unit = "".join((match.group("unit") or "").lower().split())
    return currency, value, _UNITS.get(unit, unit)


def _sentences(source: SourceSnapshot) -> list[_Sentence]:
    """The sentences with a figure in the source's passages read from its text, in order."""
    found: list[_Sentence] = []
    for passage in source.passages:
        if passage.is_snippet:
            continue
        for raw in split_sentences(passage.text):
            text = _LIST_MARKER.sub("", " ".join(raw.split()), count=1)
            matches = list(_FIGURE.finditer(text))
            if not matches:
                continue
            shape = " ".join(_FIGURE.sub(_PLACEHOLDER, text).casefold().split())
            figures = tuple(_Figure(" ".join(match.group(0).split()), _figure_key(match), match.start())
                            for match in matches)
            found.append(_Sentence(passage.passage_id, text, shape, figures))
    return found


def _unmatched(sentences: list[_Sentence], common: Counter[str]) -> list[_Sentence]:
    """`sentences` less those the other run has word for word (as many times as both have them)."""
    left = Counter(common)
    kept: list[_Sentence] = []
    for sentence in sentences:
        if left[sentence.text.casefold()] > 0:
            left[sentence.text.casefold()] -= 1
        else:
            kept.append(sentence)
    return kept


def _figure_changes(earlier: SourceSnapshot, source: SourceSnapshot) -> list[Change]:
    """A change for each figure that moved in a sentence otherwise the same in both runs (see the module's notes)."""
    then, now = _sentences(earlier), _sentences(source)
    common = Counter(sentence.text.casefold() for sentence in then) & Counter(sentence.text.casefold() for sentence in now)
    then, now = _unmatched(then, common), _unmatched(now, common)
    then_by_shape: dict[str, list[_Sentence]] = {}
    for sentence in then:
        then_by_shape.setdefault(sentence.shape, []).append(sentence)
    now_count = Counter(sentence.shape for sentence in now)
    seen_of_shape: Counter[str] = Counter()
    changes: list[Change] = []
    reported: set[tuple[str, str, str]] = set()
    for sentence in now:
        candidates = then_by_shape.get(sentence.shape, [])
        index = seen_of_shape[sentence.shape]
        seen_of_shape[sentence.shape] += 1
        if len(candidates) != now_count[sentence.shape]:
            continue  # ambiguous: the shape is left a different number of times on each side
        old = candidates[index]
        for was, figure in zip(old.figures, sentence.figures):
            if was.key == figure.key:
                continue
            context = _context(sentence.text, figure)
            if (was.text, figure.text, context) in reported:
                continue  # the same sentence twice on a page is one change
            reported.add((was.text, figure.text, context))
            changes.append(Change(kind="figure", url=source.url, title=_title(source), passage_id=sentence.passage_id,
                                  before=was.text, after=figure.text, context=context))
    return changes


def _context(sentence: str, figure: _Figure) -> str:
    """The sentence, or, when longer than `CONTEXT_MAX_CHARS`, the part of it around `figure`."""
    if len(sentence) <= CONTEXT_MAX_CHARS:
        return sentence
    room = CONTEXT_MAX_CHARS - 2  # an ellipsis at either end
    start = max(0, min(figure.start - room // 2, len(sentence) - room))
    window = sentence[start:start + room].strip()
    return ("…" if start > 0 else "") + window + ("…" if start + room < len(sentence) else "")


# --- rendering ----------------------------------------------------------------------------------

# Markdown that could make a page's words a link, a citation marker, code, a table or emphasis; dropped from them.
_MARKUP = re.compile(r"[\[\]()<>{}【】*_`~|\\]")
# An HTML entity (`&#91;`) reads as the character it names: its `&` is dropped so that it reads as written.
_ENTITY_START = re.compile(r"&(?=#?\w+;)")
_PASSAGE_ID = re.compile(r"p\d{1,6}")


def changes_markdown(changes: Sequence[Change], *, since: dt.datetime) -> str:
    """The section that opens a watch run's report: a bold heading naming `since`'s date, then a list item per change,
    each citing the current run's passage as the draft does (`[p3]`), so that the citation audit numbers it `[n]`
    with the report's sources. A gone source is linked, not cited: the current run did not read it."""
    heading = f"**What changed since {since.day} {since:%b %Y}**"
    items = [_item(change) for change in changes] or [NOTHING_CHANGED]
    return heading + "\n\n" + "\n".join(items)


def _item(change: Change) -> str:
    from research.report import safe_http_url  # research.report keeps `Change` in a report: imported where used

    title = plain_text(change.title, TITLE_MAX_CHARS) or plain_text(change.url, TITLE_MAX_CHARS)
    cite = f" [{change.passage_id}]" if change.passage_id and _PASSAGE_ID.fullmatch(change.passage_id) else ""
    match change.kind:
        case "new":
            return f"- New source: {title}{cite}"
        case "figure":
            before = plain_text(change.before or "", TITLE_MAX_CHARS)
            after = plain_text(change.after or "", TITLE_MAX_CHARS)
            # A change stored before list markers were left out of sentences may quote one.
            context = _LIST_MARKER.sub("", plain_text(change.context or "", CONTEXT_MAX_CHARS), count=1)
            quoted = f' ("{context}")' if context else ""
            return f"- {title}: {before} → {after}{quoted}{cite}"
        case "changed":
            return f"- Changed: {title}{cite}"
        case "gone":
            url = safe_http_url(change.url)
            return f"- No longer found: [{title}]({_link_target(url)})" if url else f"- No longer found: {title}"


def plain_text(text: str, limit: int) -> str:
    """A page's words (a title, a sentence) safe in the report's Markdown: on one line, without the characters that
    could make them a link, a citation or formatting, and at most `limit` characters long."""
    from research.report import shortened  # research.report keeps `Change` in a report: imported where used

    return shortened(_ENTITY_START.sub("", _MARKUP.sub(" ", text)), limit)


def _link_target(url: str) -> str:
    """`url` as a Markdown link's target: the characters that could end it or start another link encoded."""
    for character, encoded in (("(", "%28"), (")", "%29"), ("<", "%3C"), (">", "%3E"), ("[", "%5B"), ("]", "%5D"),
                               ("\\", "%5C"), ("`", "%60")):
        url = url.replace(character, encoded)
    return url
