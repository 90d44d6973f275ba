"""Markdown's code fences, read the CommonMark way, and paragraphs: shared by the audit, the report and every
renderer (no other dependency, so any module may use it)."""

from __future__ import annotations

import re

FENCE = re.compile(r"^\s*(```|~~~)")
# A closing fence has nothing after it (CommonMark): "```python" inside a block is code, not its end.
_CLOSING_FENCE = re.compile(r"^\s*(```|~~~)[`~]*\s*$")


def closes_fence(line: str, fence: str) -> bool:
    """Whether `line` ends a code block opened with `fence`."""
    closing = _CLOSING_FENCE.match(line)
    return closing is not None and closing.group(1) == fence


def code_fences(lines: list[str]) -> list[str | None]:
    """For each line, the fence of the code block it is part of (its fence lines included), else None."""
    marks: list[str | None] = []
    fence: str | None = None
    for line in lines:
        if fence is not None:
            marks.append(fence)
            fence = None if closes_fence(line, fence) else fence
        elif opening := FENCE.match(line):
            fence = opening.group(1)
            marks.append(fence)
        else:
            marks.append(None)
    return marks


def markdown_paragraphs(markdown: str) -> list[str]:
    """Block-level paragraphs of `markdown`, split at blank lines; a fenced code block stays in one paragraph."""
    paragraphs: list[str] = []
    current: list[str] = []
    lines = markdown.splitlines()
    for line, fence in zip(lines, code_fences(lines)):
        if fence is None and not line.strip():
            if current:
                paragraphs.append("\n".join(current))
                current = []
            continue
        current.append(line)
    if current:
        paragraphs.append("\n".join(current))
    return paragraphs


_FENCE_OPENING = re.compile(r"^\s*(?P<fence>```|~~~)(?P<info>.*)$")
_LANGUAGE = re.compile(r"[\w+#.-]{1,20}")


def fenced_block(paragraph: str) -> tuple[str, str, list[str]]:
    """A fenced code block's fence, language and code lines (the closing fence left out). Text after the opening
    fence that is not a short language name is code, so nothing written there is lost."""
    lines = paragraph.splitlines()
    opening = _FENCE_OPENING.match(lines[0])
    if opening is None:
        return "```", "", lines
    fence, info = opening.group("fence"), opening.group("info").strip()
    closed = len(lines) > 1 and closes_fence(lines[-1], fence)
    body = lines[1:-1] if closed else lines[1:]
    if _LANGUAGE.fullmatch(info) or not info:
        return fence, info, body
    return fence, "", [info, *body]
