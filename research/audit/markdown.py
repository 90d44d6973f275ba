"""The draft's Markdown as blocks: prose to audit, headings, table rows, and verbatim parts (code, rules)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from research.markdown import FENCE, closes_fence

BlockKind = Literal["verbatim", "prose", "heading", "table"]

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
            blocks.append(Block("verbatim", "\n".join(lines[index:end + 1])))
            index = end + 1
            continue
        if not line.strip() or _RULE.match(line) or (_TABLE_ROW.match(line) and _TABLE_SEPARATOR.match(line)):
            blocks.append(Block("verbatim", line))
        elif heading := _HEADING.match(line):
            blocks.append(Block("heading", heading.group(2), heading.group(1)))
        elif _BOLD_LINE.match(line):
            blocks.append(Block("heading", line))
        elif _TABLE_ROW.match(line):
            blocks.append(Block("table", line))
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


def _is_paragraph_line(line: str) -> bool:
    return bool(line.strip()) and not any(
        pattern.match(line) for pattern in (FENCE, _HEADING, _RULE, _LIST_ITEM, _QUOTE, _TABLE_ROW)
    )


def _is_continuation(line: str) -> bool:
    return line[:1].isspace() and _is_paragraph_line(line)


