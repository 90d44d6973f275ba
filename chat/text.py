"""Platform-neutral text: collapsing, shortening, Markdown paragraphs, and splitting within a size limit.

Every renderer splits long text the same way: at paragraph boundaries first, then lines, sentences and
words, and only as a last resort in the middle of a word; the pieces joined back give the text again
(less the whitespace at the cuts). `split_source` converts each piece to the platform's markup as it
goes, because converting (escaping) can make text longer than it was.
"""

from __future__ import annotations

from collections.abc import Callable

from research.report import Report, ReportSource, safe_http_url, split_title
from research.report import footer_lines as footer_lines  # the renderers take it from here with the other helpers

# Coarsest first: lines, sentences, words (paragraphs come before these where a caller splits whole documents).
SEPARATORS = ("\n", ". ", " ")

Convert = Callable[[str], str]
Measure = Callable[[str], int]


def platform_user(user: str) -> str:
    """`slack:U123` → `U123`: a person's id as their platform knows it (stored ids are qualified by the platform)."""
    return user.split(":", 1)[-1]


def single_line(text: str) -> str:
    """`text` with every run of whitespace (newlines included) collapsed to one space."""
    return " ".join(text.split())


def shortened(text: str, limit: int) -> str:
    """`text`, or its first `limit` characters followed by a visible "…"."""
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def unchanged(text: str) -> str:
    return text


def _tokens(text: str, separator: str) -> list[str]:
    """`text` cut after each `separator`, the separator kept on the left piece, so joining them gives `text` back."""
    pieces = text.split(separator)
    return [piece + separator for piece in pieces[:-1]] + [pieces[-1]]


def _hard_cut(text: str, limit: int) -> list[str]:
    pieces: list[str] = []
    while len(text) > limit:
        cut = limit
        entity_start = text.rfind("&", max(0, cut - 6), cut)
        if entity_start != -1 and ";" not in text[entity_start:cut]:
            cut = entity_start or limit  # never cut an HTML entity (`&amp;`) in two
        pieces.append(text[:cut])
        text = text[cut:]
    return pieces + ([text] if text else [])


def split_source(source: str, convert: Convert, limit: int, separators: tuple[str, ...] = SEPARATORS, *,
                 measure: Measure = len) -> list[str]:
    """Converted pieces of `source`, each within `limit`, cut at the coarsest separator that works.

    `measure` estimates a token's converted size without converting it (escaping is what makes text longer).
    """
    converted = convert(source)
    if len(converted) <= limit:
        return [converted]
    if not separators:
        return _hard_cut(converted, limit)
    tokens = _tokens(source, separators[0])
    sizes = [measure(token) for token in tokens]
    pieces: list[str] = []
    start = 0
    while start < len(tokens):
        if sizes[start] > limit:
            if tokens[start].strip():
                pieces.extend(split_source(tokens[start].strip(), convert, limit, separators[1:], measure=measure))
            start += 1
            continue
        end, estimate = start, 0
        while end < len(tokens) and sizes[end] <= limit and estimate + sizes[end] <= limit:
            estimate += sizes[end]
            end += 1
        chunk = convert("".join(tokens[start:end]).strip())
        while len(chunk) > limit and end - start > 1:
            end = start + max(1, min(end - start - 1, int((end - start) * limit / len(chunk) * 0.95)))
            chunk = convert("".join(tokens[start:end]).strip())
        if len(chunk) > limit:
            pieces.extend(split_source(tokens[start].strip(), convert, limit, separators[1:], measure=measure))
        elif chunk:
            pieces.append(chunk)
        start = end
    return pieces


def split_text(text: str, limit: int) -> list[str]:
    """`text` in pieces of at most `limit` characters, cut at paragraphs, then lines, sentences, words."""
    return split_source(text, unchanged, limit, ("\n\n", *SEPARATORS))


def pack_pieces(pieces: list[str], limit: int, joiner: str = "\n\n") -> list[str]:
    """Pieces joined by `joiner` into as few texts as fit in `limit` characters each."""
    packed: list[str] = []
    for piece in pieces:
        if packed and len(packed[-1]) + len(joiner) + len(piece) <= limit:
            packed[-1] += joiner + piece
        else:
            packed.append(piece)
    return packed


def title_and_body(report: Report) -> tuple[str, str]:
    """The report's title on one line (its own `# heading` when the body starts with one) and the rest of its body."""
    own_title, rest = split_title(report.body_markdown)
    return single_line(own_title or report.title), (rest if own_title else report.body_markdown).strip("\n")




def markdown_source_link(source: ReportSource, escape: Convert) -> str:
    """A source as a Markdown link `[title](url)` (title through `escape`; parentheses in the URL encoded), or its
    title and address as text when the address is not http(s)."""
    title = escape(single_line(source.title) or source.url)
    url = safe_http_url(source.url)
    if url:
        return f"[{title}]({url.replace('(', '%28').replace(')', '%29')})"
    return f"{title} ({escape(source.url)})" if source.url else title
