"""The draft's Markdown as blocks, read from markdown-it-py's tokens: prose and table rows to audit, headings, table
header rows, fenced code, and verbatim parts (blank lines, rules, table delimiter rows, a `---` or `===` line).

CommonMark reads text with a `---` or `===` line under it as a heading; a small model writes that line as a rule
right under its paragraph, so only a heading written with `#`s is one here, and underlined text is prose."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from research.markdown import Document, bold_line_text, closing, inline_lines, is_atx, read

if TYPE_CHECKING:
    from markdown_it.token import Token

BlockKind = Literal["verbatim", "prose", "heading", "table", "table_header", "code"]


@dataclass
class Block:
    """A run of draft lines: `prefix` (list marker, `#`s, `>`) is kept as is, `content` is audited. `list_depth`
    counts the list items the block is in; `opens_item` says that it is the first line of one."""

    kind: BlockKind
    content: str
    prefix: str = ""
    list_depth: int = 0
    opens_item: bool = False


def split_blocks(markdown: str) -> list[Block]:
    """The draft as blocks whose joined text (by newlines) is the draft again."""
    document = read(markdown)
    placed = sorted(_read_blocks(document), key=lambda entry: entry[0])
    blocks: list[Block] = []
    line = 0
    for first, end, block in placed:
        if first < line:
            continue
        blocks.extend(_unread_line(text) for text in document.lines[line:first])
        blocks.append(block)
        line = end
    blocks.extend(_unread_line(text) for text in document.lines[line:])
    return blocks


def _unread_line(line: str) -> Block:
    """A line that no block holds: blank, or text the parser keeps to itself (a link definition, a lone `>`),
    audited as prose as the reader of raw Markdown sees it."""
    return Block("prose" if line.strip() else "verbatim", line)


def _read_blocks(document: Document) -> list[tuple[int, int, Block]]:
    """The blocks of every leaf the parser found, each with its first source line and the line after it."""
    placed: list[tuple[int, int, Block]] = []
    tokens, lines = document.tokens, document.lines
    depth, item_line = 0, -1
    for index, token in enumerate(tokens):
        if token.type in ("list_item_open", "list_item_close"):
            depth += token.nesting
            item_line = token.map[0] if token.map is not None else -1
            continue
        if token.map is None or token.type not in ("fence", "hr", "heading_open", "paragraph_open", "table_open"):
            continue
        first, end = token.map
        opens_item, item_line = first == item_line, -1
        if token.type == "fence":
            placed.append((first, end, Block("code", "\n".join(lines[first:end]))))
        elif token.type == "hr":
            placed.extend((number, number + 1, Block("verbatim", lines[number])) for number in range(first, end))
        elif token.type == "heading_open" and is_atx(token):
            placed.extend(_heading_blocks(document, token, tokens[index + 1], depth, opens_item))
        elif token.type == "heading_open":  # underlined: its text is prose, the underline verbatim
            placed.extend(_paragraph_blocks(document, tokens[index + 1], depth, opens_item))
            placed.append((end - 1, end, Block("verbatim", lines[end - 1])))
        elif token.type == "paragraph_open":
            placed.extend(_paragraph_blocks(document, tokens[index + 1], depth, opens_item))
        else:
            placed.extend(_table_blocks(document, tokens[index:closing(tokens, index) + 1]))
    return placed


def _heading_blocks(document: Document, heading: Token, inline: Token, depth: int,
                    opens_item: bool) -> list[tuple[int, int, Block]]:
    """A heading written with `#`s (one line) as a heading block, its `#`s in the prefix."""
    assert heading.map is not None
    first, end = heading.map
    columns = document.line_columns(inline)
    line = document.lines[first]
    column = columns[0] if columns is not None and inline.content else len(line)
    return [(first, end, Block("heading", line[column:], line[:column], depth, opens_item))]


def _paragraph_blocks(document: Document, inline: Token, depth: int,
                      opens_item: bool) -> list[tuple[int, int, Block]]:
    """A paragraph as prose blocks: a new block at each line that has its own `>`, the other lines joining the one
    before as they are written; a line in bold alone at the start of a block is a section title, as a heading is."""
    assert inline.map is not None
    first, end = inline.map
    lines = document.lines
    columns = document.line_columns(inline)
    if columns is None or len(columns) != end - first:  # text the parser wrote otherwise: its lines as they are
        return [(first, end, Block("prose", "\n".join(lines[first:end]), "", depth, opens_item))]
    breaks = inline_lines(inline.children or [])
    bold_lines = len(breaks) == end - first  # a code span across lines leaves fewer lines than were written
    placed: list[tuple[int, int, Block]] = []
    current: list[str] = []
    current_first, prefix = first, ""
    for number in range(first, end):
        line, column = lines[number], columns[number - first]
        line_prefix = line[:column]
        if current and not line_prefix.strip():
            current.append(line)
            continue
        if current:
            placed.append((current_first, number, Block("prose", "\n".join(current), prefix, depth,
                                                        opens_item and current_first == first)))
            current = []
        if not line_prefix.strip() and (bold_lines or number == first) and bold_line_text(breaks[number - first]):
            placed.append((number, number + 1, Block("heading", line, "", depth, opens_item and number == first)))
            continue
        current, current_first, prefix = [line[column:]], number, line_prefix
    if current:
        placed.append((current_first, end, Block("prose", "\n".join(current), prefix, depth,
                                                 opens_item and current_first == first)))
    return placed


def _table_blocks(document: Document, table: list[Token]) -> list[tuple[int, int, Block]]:
    """A table's rows, each one block (the header row apart), and its delimiter row verbatim."""
    assert table[0].map is not None
    placed: list[tuple[int, int, Block]] = []
    rows: set[int] = set()
    in_head = False
    for token in table:
        if token.type in ("thead_open", "thead_close"):
            in_head = token.type == "thead_open"
        elif token.type == "tr_open" and token.map is not None:
            number = token.map[0]
            rows.add(number)
            line = document.lines[number]
            # A quoted table keeps its `>` apart; elsewhere the row is audited whole, as it is written.
            quote = line[:len(line) - len(line.lstrip(" \t>"))]
            prefix = quote if ">" in quote else ""
            placed.append((number, number + 1, Block("table_header" if in_head else "table", line[len(prefix):], prefix)))
    placed.extend((number, number + 1, Block("verbatim", document.lines[number]))
                  for number in range(*table[0].map) if number not in rows)
    return placed


def leads_into(block: Block, following: Block | None) -> bool:
    """Whether `following` is what a lead-in ending `block` with ":" introduces: a list, quote, table or code block
    (after a list item, a list nested in it, not the next item of the same list)."""
    if following is None or following.kind in ("verbatim", "heading"):
        return False
    if following.kind != "prose":
        return True
    if not following.opens_item:
        return bool(following.prefix.strip())  # a quote; a plain paragraph is introduced by nothing
    return not block.opens_item or following.list_depth > block.list_depth
