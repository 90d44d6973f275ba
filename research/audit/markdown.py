"""The draft's Markdown as blocks: prose and table rows to audit, headings, table header rows, fenced code, and
verbatim parts (blank lines, rules, table delimiter rows)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from research.markdown import FENCE, closes_fence

BlockKind = Literal["verbatim", "prose", "heading", "table", "table_header", "code"]

_HEADING = re.compile(r"^(\s{0,3}#{1,6}\s+)(.*)$")
_RULE = re.compile(r"^\s{0,3}([-*_])(?:\s*\1){2,}\s*$")
_LIST_ITEM = re.compile(r"^(\s*(?:[-*+]|\d{1,9}[.)])\s+)(.*)$")
_QUOTE = re.compile(r"^(\s{0,3}>\s?)(.*)$")
_TABLE_ROW = re.compile(r"^\s*\|")
# A line in bold alone is a section title, as a heading is, and no claim.
_BOLD_LINE = re.compile(r"^\s*(\*\*|__)[^*_\n]+\1\s*:?\s*$")
_TABLE_SEPARATOR = re.compile(r"^\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*$")


@dataclass
class Block:
    """A run of draft lines: `prefix` (list marker, `#`s, `>`) is kept as is, `content` is audited."""

    kind: BlockKind
    content: str
    prefix: str = ""


def split_blocks(markdown: str) -> list[Block]:
    """The draft as blocks whose joined text (by newlines) is the draft again."""
    blocks: list[Block] = []
    lines = markdown.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        if FENCE.match(line):
            fence = FENCE.match(line).group(1)  # type: ignore[union-attr]
            end = index + 1
            while end < len(lines) and not closes_fence(lines[end], fence):
                end += 1
            blocks.append(Block("code", "\n".join(lines[index:end + 1])))
            index = end + 1
            continue
        if not line.strip() or _RULE.match(line) or (_TABLE_ROW.match(line) and _TABLE_SEPARATOR.match(line)):
            blocks.append(Block("verbatim", line))
        elif heading := _HEADING.match(line):
            blocks.append(Block("heading", heading.group(2), heading.group(1)))
        elif _BOLD_LINE.match(line):
            blocks.append(Block("heading", line))
        elif _TABLE_ROW.match(line):
            blocks.append(Block("table_header" if _precedes_delimiter_row(lines, index) else "table", line))
        elif item := _LIST_ITEM.match(line):
            content = [item.group(2)]
            while index + 1 < len(lines) and _is_continuation(lines[index + 1]):
                index += 1
                content.append(lines[index])
            blocks.append(Block("prose", "\n".join(content), item.group(1)))
        elif quote := _QUOTE.match(line):
            blocks.append(Block("prose", quote.group(2), quote.group(1)))
        else:
            content = [line]
            while index + 1 < len(lines) and _is_paragraph_line(lines[index + 1]):
                index += 1
                content.append(lines[index])
            blocks.append(Block("prose", "\n".join(content)))
        index += 1
    return blocks


def leads_into(block: Block, following: Block | None) -> bool:
    """Whether `following` is what a lead-in ending `block` with ":" introduces: a list, quote, table or code block
    (after a list item, a list nested in it, not the next item of the same list)."""
    if following is None or following.kind in ("verbatim", "heading"):
        return False
    if following.kind != "prose":
        return True
    if not _is_list_item(following):
        return bool(following.prefix.strip())  # a quote; a plain paragraph is introduced by nothing
    return not _is_list_item(block) or _indent(following.prefix) > _indent(block.prefix)


def _is_list_item(block: Block) -> bool:
    return block.kind == "prose" and _LIST_ITEM.match(block.prefix + "x") is not None


def _indent(prefix: str) -> int:
    return len(prefix) - len(prefix.lstrip())


def _precedes_delimiter_row(lines: list[str], index: int) -> bool:
    following = lines[index + 1] if index + 1 < len(lines) else ""
    return "|" in following and bool(_TABLE_SEPARATOR.match(following))


def _is_paragraph_line(line: str) -> bool:
    return bool(line.strip()) and not any(
        pattern.match(line) for pattern in (FENCE, _HEADING, _RULE, _LIST_ITEM, _QUOTE, _TABLE_ROW)
    )


def _is_continuation(line: str) -> bool:
    return line[:1].isspace() and _is_paragraph_line(line)


