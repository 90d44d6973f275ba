"""Every way a model writes a citation, read in one place and rewritten as the audit's `[pN, pM]` runs.

Understood: `[p3]` `[P3]` `[p3, p4]` `[p3; p4]` `[p3][p4]` `[p3-p5]` `(p3)` `(p3, p4)` `【p3】` `[^p3]`
`[source: p3]` `[p3](url)`, and numbered cites `[3]` `[3, 4]` `[3][4]` `[3-5]` `【3†source】`: a number is the
Nth passage shown (as the prompt lists them), or, past the last one, the passage with that id. A cite that
points at nothing still becomes an id, which the audit removes as fabricated, so no raw marker reaches a reader.
Footnote definitions (`[^p3]: …`) are dropped. Code spans and fenced code are left as they are.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from research.markdown import code_lines, code_ranges, links, read, replaced

_ID = r"[pP]\s?\d{1,6}"
_NUMBER = r"\d{1,3}"  # four digits would be a year, not a citation
_LABEL = r"(?:(?:sources?|passages?|refs?|references?|citations?|ids?)\s*[:#]?\s*)"
_RANGE_SEPARATOR = r"\s*(?:-|–|—|to)\s*"
_LIST_SEPARATOR = r"\s*(?:,|;|&|\band\b)\s*"


def _list_of(item: str) -> str:
    element = rf"{item}(?:{_RANGE_SEPARATOR}{item})?"
    return rf"{element}(?:{_LIST_SEPARATOR}{element})*"


_ANY_ITEM = rf"(?:{_ID}|{_NUMBER})"
# One marker: bracketed ids or numbers (optionally footnote-style or labelled), parenthesised ids, or anything in
# lenticular brackets (【4†source】 included). A marker written as a link (`[p3](https://…)`) is read from the link.
_MARKER = re.compile(
    rf"(?<![\w\\])\[\^?\s*{_LABEL}?(?P<bracket>{_list_of(_ANY_ITEM)})\s*\]"
    rf"|\(\s*{_LABEL}?(?P<paren>{_list_of(_ID)})\s*\)"
    rf"|【(?P<lenticular>[^】\n]*)】",
    re.IGNORECASE,
)
_ITEM = re.compile(rf"(?P<id>{_ID})|(?P<number>{_NUMBER})", re.IGNORECASE)
_RANGE = re.compile(rf"(?P<first>{_ANY_ITEM}){_RANGE_SEPARATOR}(?P<last>{_ANY_ITEM})", re.IGNORECASE)
# Footnotes are not CommonMark (markdown-it-py reads them only with a plugin): a definition is a line of its own.
_FOOTNOTE_DEFINITION = re.compile(r"^\s{0,3}\[\^[^\]\n]+\]:.*$")
LONGEST_RANGE = 20


class CitationReader:
    """Reads citation markers against the passages the model was shown, in the order it was shown them."""

    def __init__(self, shown_ids: Sequence[str]) -> None:
        self.shown = [passage_id.lower() for passage_id in shown_ids]
        self.shown_set = set(self.shown)

    def passage_for(self, token: str) -> str:
        """The passage id a single cite token means (`p3`, `P 3`, or a number)."""
        token = token.lower().replace(" ", "")
        if token.startswith("p"):
            return token
        number = int(token)
        if 1 <= number <= len(self.shown):
            return self.shown[number - 1]
        return f"p{number}"  # the model dropped the `p`, or it points at nothing: the audit decides

    def ids_in(self, marker_text: str) -> list[str]:
        """Every passage id a marker's inside names, ranges expanded, in order, without repeats."""
        ids: list[str] = []
        position = 0
        while position < len(marker_text):
            found = _RANGE.match(marker_text, position) or _ITEM.match(marker_text, position)
            if found is None:
                position += 1
                continue
            if found.re is _RANGE:
                ids.extend(self._range(found.group("first"), found.group("last")))
            else:
                ids.append(self.passage_for(found.group(0)))
            position = found.end()
        return list(dict.fromkeys(ids))

    def _range(self, first: str, last: str) -> list[str]:
        if first.isdigit() and last.isdigit() and 1 <= int(first) <= int(last) <= len(self.shown):
            return self.shown[int(first) - 1:int(last)]  # a numbered range counts positions in the order shown
        start, end = self.passage_for(first), self.passage_for(last)
        low, high = int(start[1:]), int(end[1:])
        if not 0 <= high - low <= LONGEST_RANGE:
            return [start, end]
        return [f"p{number}" for number in range(low, high + 1)]

    def rewrite_prose(self, text: str) -> str:
        """`text` (prose, no code in it) with every citation marker on each line rewritten as one `[pN, pM]` run."""
        return "\n".join(_MARKER.sub(self._canonical, line) for line in text.split("\n"))

    def canonical(self, marker_text: str) -> str | None:
        """A whole marker (`[p3, 4]`) as one `[pN, pM]` run ("" when it names nothing), or None for other text."""
        marker = _MARKER.fullmatch(marker_text)
        return self._canonical(marker) if marker is not None else None

    def _canonical(self, marker: re.Match[str]) -> str:
        inside = marker.group("bracket") or marker.group("paren") or marker.group("lenticular") or ""
        ids = self.ids_in(inside)
        return f"[{', '.join(ids)}]" if ids else ""


def normalise_citations(markdown: str, shown_ids: Sequence[str]) -> str:
    """`markdown` with every citation spelling rewritten as `[pN]` runs and footnote definitions removed; code (as
    markdown-it-py reads it) is left as it is."""
    reader = CitationReader(shown_ids)
    document = read(markdown)
    in_code = code_lines(document)
    if any(number not in in_code and _FOOTNOTE_DEFINITION.match(line) for number, line in enumerate(document.lines)):
        kept = [line for number, line in enumerate(document.lines)
                if number in in_code or not _FOOTNOTE_DEFINITION.match(line)]
        document = read("\n".join(kept))
    source = document.source
    unchanged = [(start, end, source[start:end]) for start, end in code_ranges(document)]
    as_links = [(link.span[0], link.span[1], canonical) for link in links(document)
                if link.kind == "link" and link.span is not None and link.label is not None
                and not _names_a_reference(source[link.label[1]:link.span[1]])
                if (canonical := reader.canonical(f"[{source[link.label[0]:link.label[1]]}]")) is not None]
    return replaced(source, unchanged + as_links, reader.rewrite_prose)


def _names_a_reference(after_label: str) -> bool:
    """Whether a link is written `[label][reference]` (what follows its label is `][reference]`): to a model, that
    is two cites side by side (`[2][8]`), which the parser reads as one link where `[8]: https://…` is defined."""
    return after_label.startswith("][") and after_label != "][]"
