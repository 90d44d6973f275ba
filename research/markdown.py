"""Markdown read the CommonMark way, by one parser that the audit, the exports and every renderer share.

`PARSERS.markdown` is markdown-it-py's CommonMark with GitHub's tables and strikethrough. Raw HTML is text, and a line
indented by four spaces is not code (only fences are): a model's indented line is prose, as Slack and Discord show it.
`read` parses a text once into a `Document`: markdown-it-py's tokens (`type`, `tag`, `map` = the source lines of a
block, `children` of an `inline` token, `attrs["href"]` of a link) and where in the source each block's text, link
and code span is written, so that the audit and the renderers rewrite a text in place and leave the rest as it was.
This module imports nothing of deepthread's, so any module may use it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from markdown_it import MarkdownIt
    from markdown_it.rules_inline import StateInline
    from markdown_it.token import Token

    InlineRule = Callable[[StateInline, bool], bool]
LinkKind = Literal["link", "image", "autolink"]

# Where a link, image, autolink or code span is written in its block's inline text, as the parser read it.
_SPAN = "deepthread_span"
_LABEL = "deepthread_label"


def _noting_spans(rule: InlineRule, token_type: str, label_offset: int | None) -> InlineRule:
    """`rule`, noting on the token it makes where it starts and ends in the inline text, and where its label is
    (`label_offset`: where its `[` is after its start, 0 for a link and 1 for an image)."""

    def noting(state: StateInline, silent: bool) -> bool:
        start, pushed = state.pos, len(state.tokens)
        if not rule(state, silent):
            return False
        made = None if silent else next((token for token in state.tokens[pushed:] if token.type == token_type), None)
        if made is not None:
            made.meta[_SPAN] = (start, state.pos)
            if label_offset is not None:
                label_end = state.md.helpers.parseLinkLabel(state, start + label_offset, label_offset == 0)
                if label_end >= 0:
                    made.meta[_LABEL] = (start + label_offset + 1, label_end)
        return True

    return noting


def _commonmark(*, every_link: bool = False, as_html_readers: bool = False) -> MarkdownIt:
    from markdown_it import MarkdownIt
    from markdown_it.rules_inline import autolink, backtick, image, link

    parser = MarkdownIt("commonmark", {"html": as_html_readers, "xhtmlOut": False})
    if every_link:  # a link whatever it points to (markdown-it-py leaves `javascript:` and the like as text)
        parser.validateLink = _any_link  # type: ignore[method-assign]
    parser.enable(["table", "strikethrough"])
    if not as_html_readers:
        parser.disable("code")
    parser.inline.ruler.at("link", _noting_spans(link, "link_open", 0))
    parser.inline.ruler.at("image", _noting_spans(image, "image", 1))
    parser.inline.ruler.at("autolink", _noting_spans(autolink, "link_open", None))
    parser.inline.ruler.at("backticks", _noting_spans(backtick, "code_inline", None))
    return parser


def _any_link(url: str) -> bool:
    return True


class Parsers:
    """The parsers deepthread reads Markdown with, each built (and markdown-it-py imported) when first asked for: a
    run's first step reads none, so a run's engine preloads markdown-it-py beside its first model call."""

    @cached_property
    def markdown(self) -> MarkdownIt:
        return _commonmark()

    @cached_property
    def every_link(self) -> MarkdownIt:
        """The same, for what must find every link another Markdown reader (Slack's, Discord's) might follow."""
        return _commonmark(every_link=True)

    @cached_property
    def every_link_as_html_readers(self) -> MarkdownIt:
        """Every link as a reader that reads raw HTML and indented code reads it (rich in the terminal, most viewers
        of a .md file): an HTML tag can hide a `]` from the label it ends, and an indented line can end a code span
        early."""
        return _commonmark(every_link=True, as_html_readers=True)

    @property
    def link_readers(self) -> tuple[MarkdownIt, MarkdownIt]:
        return self.every_link, self.every_link_as_html_readers

    @cached_property
    def neutral_markup(self) -> MarkdownIt:
        """The conversation core's neutral markup (chat.render): `**bold**` and `code`; a lone `*` or `_` stays as
        typed."""
        from markdown_it import MarkdownIt

        return MarkdownIt("zero").enable(["backticks", "emphasis"])


PARSERS = Parsers()


def normalised(markdown: str) -> str:
    """`markdown` as the parser reads it (line ends made `\\n`, NUL made U+FFFD), the text `Document` offsets count in."""
    return markdown.replace("\r\n", "\n").replace("\r", "\n").replace("\0", "\ufffd")


class Document:
    """A Markdown text parsed once: its `source` (normalised), `lines`, markdown-it-py's block `tokens`, and the
    link reference definitions it holds (`env["references"]`)."""

    def __init__(self, markdown: str, *, inline: bool = False, parser: MarkdownIt | None = None) -> None:
        self.source = normalised(markdown)
        self.env: dict[str, Any] = {}
        parser = PARSERS.markdown if parser is None else parser
        self.tokens: list[Token] = (parser.parseInline if inline else parser.parse)(self.source, self.env)
        self.lines = self.source.split("\n")
        self.line_starts: list[int] = []
        position = 0
        for line in self.lines:
            self.line_starts.append(position)
            position += len(line) + 1

    def line_range(self, first: int, end: int) -> tuple[int, int]:
        """Source offsets of lines `first` up to `end` (not included), the last line end left out."""
        last = min(end, len(self.lines)) - 1
        return self.line_starts[first], self.line_starts[last] + len(self.lines[last])

    def offsets(self, inline: Token) -> list[int] | None:
        """Where each character of an `inline` token's content is in `source`, and one entry more for where it ends;
        None when the parser's text could not be found there."""
        return self._offsets.get(id(inline))

    def line_columns(self, inline: Token) -> list[int] | None:
        """For each line of an `inline` token's content, the column where it starts in its source line, or None."""
        offsets = self.offsets(inline)
        if offsets is None or inline.map is None:
            return None
        columns, position = [], 0
        for number, text in enumerate(inline.content.split("\n")):
            columns.append(offsets[position] - self.line_starts[inline.map[0] + number])
            position += len(text) + 1
        return columns

    def span(self, inline: Token, child: Token) -> tuple[int, int] | None:
        """Source offsets of a link, image, autolink or code span (a `child` of `inline`), or None."""
        return self._source_span(inline, child.meta.get(_SPAN))

    def label(self, inline: Token, child: Token) -> tuple[int, int] | None:
        """Source offsets of the label of a link or image (a `child` of `inline`) between its brackets, or None."""
        return self._source_span(inline, child.meta.get(_LABEL))

    def _source_span(self, inline: Token, span: tuple[int, int] | None) -> tuple[int, int] | None:
        offsets = self.offsets(inline)
        if span is None or offsets is None:
            return None
        start, end = span
        if end <= start:
            return offsets[start], offsets[start]
        # Where the parser read it, or not at all.
        if any(self.source[offsets[at]:offsets[at] + 1] != inline.content[at] for at in (start, end - 1)):
            return None
        return offsets[start], offsets[end - 1] + 1

    @cached_property
    def _offsets(self) -> dict[int, list[int] | None]:
        found: dict[int, list[int] | None] = {}
        row, cursor = 0, 0
        for index, token in enumerate(self.tokens):
            if token.type == "tr_open" and token.map is not None:
                row, cursor = token.map[0], 0
            if token.type != "inline" or token.map is None:
                continue
            if index and self.tokens[index - 1].type in ("th_open", "td_open"):
                cell = self._cell_offsets(token.content, row, cursor)
                found[id(token)] = cell[0] if cell else None
                cursor = cell[1] if cell else cursor
            else:
                found[id(token)] = self._line_offsets(token.content, token.map[0])
        return found

    def _line_offsets(self, content: str, first_line: int) -> list[int] | None:
        """A paragraph's or heading's text: each of its lines ends its source line (but for closing `#`s or spaces)."""
        offsets: list[int] = []
        for number, text in enumerate(content.split("\n")):
            if first_line + number >= len(self.lines):
                return None
            line = self.lines[first_line + number]
            column = line.rfind(text) if text else len(line.rstrip())
            padding = 0
            if column < 0:
                # Spaces the parser wrote for a tab stand where the tab is; the rest is written as it is.
                bare = text.lstrip(" ")
                column, padding = (line.rfind(bare) if bare else -1), len(text) - len(bare)
                if column < 0:
                    return None
            start = self.line_starts[first_line + number] + column
            offsets.extend([start] * padding)
            offsets.extend(range(start, start + len(text) - padding + 1))
        return offsets

    def _cell_offsets(self, content: str, row: int, cursor: int) -> tuple[list[int], int] | None:
        """A table cell's text, found from `cursor` on in its row (a `|` in it is written `\\|`)."""
        line = self.lines[row]
        if not content:
            return [self.line_starts[row] + cursor], cursor
        escaped = content.replace("|", "\\|")
        column = line.find(escaped, cursor)
        if column < 0:
            escaped, column = content, line.find(content, cursor)
        if column < 0:
            return None
        offsets, position = [], self.line_starts[row] + column
        for character in content:
            if character == "|" and escaped != content:
                position += 1  # the backslash
            offsets.append(position)
            position += 1
        offsets.append(position)
        return offsets, column + len(escaped)


def read(markdown: str, parser: MarkdownIt | None = None) -> Document:
    """`markdown` parsed once, as blocks (by `PARSERS.every_link` to find links to anywhere)."""
    return Document(markdown, parser=parser)


def read_inline(text: str, parser: MarkdownIt | None = None) -> Document:
    """`text` parsed once as one run of inline text (no blocks: a `#` or `-` at its start is text)."""
    return Document(text, inline=True, parser=parser)


# --- tokens ---------------------------------------------------------------------------------------

def closing(tokens: Sequence[Token], index: int) -> int:
    """The index of the token that closes the one opened at `index` (the last token when none does)."""
    depth = 0
    for position in range(index, len(tokens)):
        depth += tokens[position].nesting
        if depth <= 0:
            return position
    return len(tokens) - 1


def heading_level(heading_open: Token) -> int:
    """1 to 6: the level of a heading (`h1` … `h6`)."""
    return int(heading_open.tag[1:])


def is_atx(heading_open: Token) -> bool:
    """Whether a heading is written with `#`s (not underlined with `===` or `---`)."""
    return heading_open.markup.startswith("#")


def inline_lines(children: Sequence[Token]) -> list[list[Token]]:
    """An inline token's children line by line: split at its soft and hard line breaks."""
    lines: list[list[Token]] = [[]]
    for child in children:
        if child.type in ("softbreak", "hardbreak"):
            lines.append([])
        else:
            lines[-1].append(child)
    return lines


def inline_text(children: Sequence[Token]) -> str:
    """Inline text as a reader reads it: words and code, a link's label, an image's description; no marks."""
    pieces: list[str] = []
    for child in children:
        if child.type in ("text", "code_inline"):
            pieces.append(child.content)
        elif child.type in ("softbreak", "hardbreak"):
            pieces.append(" ")
        elif child.type == "image":
            pieces.append(inline_text(child.children or []))
    return "".join(pieces)


def bold_line_text(line: Sequence[Token]) -> str | None:
    """The text of a line written in bold alone (`**Key findings**`, `**Sources:**` or `**Sources**:`), which reads
    as a section title; None for any other line (of `inline_lines`)."""
    tokens = [token for token in line if token.type != "text" or token.content.strip()]
    if tokens and tokens[-1].type == "text" and tokens[-1].content.strip() == ":":
        tokens.pop()
    if len(tokens) < 3 or tokens[0].type != "strong_open" or tokens[-1].type != "strong_close":
        return None
    inside = tokens[1:-1]
    if any(token.type != "text" for token in inside):
        return None
    return inline_text(inside).strip() or None


# --- links and code, where they are written --------------------------------------------------------

@dataclass(frozen=True)
class Link:
    """A link, image or autolink as the parser reads it: where it points, what it shows, its block's source `lines`,
    and its `span` and `label` in the source (None when the parser's text could not be found there)."""

    kind: LinkKind
    target: str
    text: str
    lines: tuple[int, int]
    span: tuple[int, int] | None
    label: tuple[int, int] | None


def links(document: Document) -> list[Link]:
    """Every link (inline or reference-style), image and autolink the parser finds, in reading order; none in code."""
    found: list[Link] = []
    for token in document.tokens:
        if token.type != "inline" or token.map is None:
            continue
        children = token.children or []
        for index, child in enumerate(children):
            kind: LinkKind
            if child.type == "image":
                kind, target, text = "image", str(child.attrs.get("src", "")), inline_text(child.children or [])
            elif child.type == "link_open":
                kind = "autolink" if child.markup == "autolink" else "link"
                target, text = str(child.attrs.get("href", "")), inline_text(children[index + 1:closing(children, index)])
            else:
                continue
            span = document.span(token, child)
            label = (span[0] + 1, span[1] - 1) if kind == "autolink" and span else document.label(token, child)
            found.append(Link(kind, target, text, (token.map[0], token.map[1]), span, label))
    return found


@dataclass(frozen=True)
class Definition:
    """A link reference definition (`[label]: https://…`): its label, where it points, and its source lines."""

    label: str
    target: str
    lines: tuple[int, int]


def definitions(document: Document) -> list[Definition]:
    """Every link reference definition in the text, repeated labels (which the parser ignores) included."""
    found = [Definition(label, str(entry["href"]), (entry["map"][0], entry["map"][1]))
             for label, entry in document.env.get("references", {}).items()]
    found.extend(Definition(str(entry["label"]), str(entry["href"]), (entry["map"][0], entry["map"][1]))
                 for entry in document.env.get("duplicate_refs", []))
    return found


def code_lines(document: Document) -> set[int]:
    """The source lines of fenced code blocks, their fences included."""
    return {line for token in document.tokens if token.type == "fence" and token.map is not None
            for line in range(*token.map)}


def code_ranges(document: Document) -> list[tuple[int, int]]:
    """Source offsets of every piece of code, in order: fenced blocks (their fences included) and code spans."""
    ranges: list[tuple[int, int]] = []
    for token in document.tokens:
        if token.type == "fence" and token.map is not None:
            ranges.append(document.line_range(*token.map))
        elif token.type == "inline":
            ranges.extend(span for child in token.children or [] if child.type == "code_inline"
                          if (span := document.span(token, child)) is not None)
    return sorted(ranges)


def replaced(text: str, edits: Sequence[tuple[int, int, str]], between: Callable[[str], str] = str) -> str:
    """`text` with each edit `(start, end, replacement)` made and the text between edits passed through `between`;
    an edit that overlaps an earlier one is left out."""
    pieces: list[str] = []
    position = 0
    for start, end, replacement in sorted(edits, key=lambda edit: (edit[0], -edit[1])):
        if start < position:
            continue
        pieces.extend([between(text[position:start]), replacement])
        position = end
    pieces.append(between(text[position:]))
    return "".join(pieces)


# --- paragraphs and code blocks ------------------------------------------------------------------

def markdown_paragraphs(markdown: str) -> list[str]:
    """Block-level paragraphs of `markdown`, split at blank lines; a fenced code block stays in one paragraph."""
    document = read(markdown)
    in_code = code_lines(document)
    paragraphs: list[str] = []
    current: list[str] = []
    for number, line in enumerate(document.lines):
        if number not in in_code and not line.strip():
            if current:
                paragraphs.append("\n".join(current))
                current = []
            continue
        current.append(line)
    if current:
        paragraphs.append("\n".join(current))
    return paragraphs


def _only_fence(paragraph: str) -> Token | None:
    tokens = read(paragraph).tokens
    return tokens[0] if len(tokens) == 1 and tokens[0].type == "fence" else None


def is_code_block(paragraph: str) -> bool:
    """Whether `paragraph` (one of `markdown_paragraphs`) is a fenced code block and nothing else."""
    return _only_fence(paragraph) is not None


def fenced_block(paragraph: str) -> tuple[str, str, list[str]]:
    """A fenced code block's fence, language and code lines (the closing fence left out). Text after the opening
    fence that is not a short language name is code, so nothing written there is lost; a paragraph that is not a
    fenced code block is all code."""
    fence = _only_fence(paragraph)
    if fence is None:
        return "```", "", paragraph.split("\n")
    language, body = fence_code(fence)
    return fence.markup, language, body


def fence_code(fence: Token) -> tuple[str, list[str]]:
    """A `fence` token's language and code lines; text after its opening fence that is not a short language name
    is code, so nothing written there is lost."""
    body = fence.content.removesuffix("\n").split("\n") if fence.content else []
    info = fence.info.strip()
    if not info or _is_language_name(info):
        return info, body
    return "", [info, *body]


def _is_language_name(info: str) -> bool:
    return len(info) <= 20 and all(character.isalnum() or character in "_+#.-" for character in info)
