"""The model's answer made into a report draft before the audit: what real models wrap around a report removed.

In order: reasoning (`<think>` blocks), a fence around the whole report (```` ```markdown ````), chat framing
before the first heading or claim ("Here is the report…:") and after the last ("I hope this helps!"), the
model's own source list ("## Sources", "**References:**"; deepthread lists the sources itself), and a second
title under the first. What is left is the report as the model meant it, so the audit counts only claims.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from research.markdown import bold_line_text, heading_level, inline_lines, inline_text, is_atx, markdown_paragraphs, read
from research.llm import strip_reasoning

if TYPE_CHECKING:
    from markdown_it.token import Token

# A fence around a report names no language, or one a report is written in.
_REPORT_LANGUAGES = frozenset({"", "markdown", "md", "text"})
# A fenced part this large a share of the answer is the report, and the rest is chatter around it.
REPORT_SHARE_OF_ANSWER = 0.6
FRAMING_MAX_CHARS = 400
_FRAMING_OPENERS = re.compile(
    r"^(?:sure|certainly|of course|absolutely|okay|ok|great|alright|here(?:'s| is| are)|below (?:is|are)|"
    r"i(?:'ve| have) (?:compiled|written|prepared|put together|drafted|created)|based on (?:the|your)\b|"
    r"as requested|the following (?:is|are)|this (?:report|answer) (?:is|was) based)\b",
    re.IGNORECASE)
_FRAMING_CLOSERS = re.compile(
    r"\b(?:i hope (?:this|that|it) helps|hope (?:this|that) helps|let me know|feel free to|happy to help|"
    r"if you (?:have|need|would like|want)|would you like me to|do you want me to|is there anything else)\b",
    re.IGNORECASE)
_CITATION_LIKE = re.compile(r"\[[^\]\n]*\d[^\]\n]*\]|【|\(\s*p\d+", re.IGNORECASE)
_SOURCES_TITLE = re.compile(
    r"^(?:sources?|references?|bibliography|works cited|citations?|source list|sources used|reference list|"
    r"further reading)\s*:?$", re.IGNORECASE)
_PLAIN_SOURCES_LINE = re.compile(r"^\s*(?:sources?|references?)\s*:\s*$", re.IGNORECASE)


def normalise_answer(answer: str) -> str:
    """The report inside a model's answer (see the module docstring); an empty string when there is none."""
    text = strip_reasoning(answer)
    text = unwrap_fenced_report(drop_framing(unwrap_fenced_report(text)))  # framing may sit around the fence
    text = drop_own_source_list(text)
    return drop_second_title(text).strip()


def unwrap_fenced_report(text: str) -> str:
    """The inside of a Markdown fence that holds the report (the whole answer, or most of it amid chatter)."""
    stripped = text.strip()
    document = read(stripped)
    for token in document.tokens:
        if token.type != "fence" or token.map is None or token.info.strip().lower() not in _REPORT_LANGUAGES:
            continue
        body = token.content.removesuffix("\n")
        whole = token.level == 0 and token.map == [0, len(document.lines)]
        if whole or len(body) >= REPORT_SHARE_OF_ANSWER * len(stripped):
            return body
    return text


def _titles(tokens: list[Token]) -> list[tuple[int, int, str]]:
    """The section titles of a text outside lists and quotes, in order: each heading (its level) and each line in
    bold alone (level 7, ended by any heading), with its first source line and its text."""
    found: list[tuple[int, int, str]] = []
    for index, token in enumerate(tokens):
        if token.level != 0 or token.map is None:
            continue
        inline = tokens[index + 1] if index + 1 < len(tokens) else None
        if token.type == "heading_open" and inline is not None:
            found.append((token.map[0], heading_level(token), inline_text(inline.children or [])))
        elif token.type == "paragraph_open" and inline is not None:
            lines = inline_lines(inline.children or [])
            for number, line in enumerate(lines[:token.map[1] - token.map[0]]):
                title = bold_line_text(line)
                plain = inline_text(line)
                if title is not None:
                    found.append((token.map[0] + number, 7, title))
                elif _PLAIN_SOURCES_LINE.match(plain):
                    found.append((token.map[0] + number, 7, plain))
    return found


def _starts_with_title(paragraph: str) -> bool:
    """Whether a paragraph opens with a heading or a line in bold alone."""
    tokens = read(paragraph).tokens
    if not tokens:
        return False
    if tokens[0].type == "heading_open":
        return True
    lines = inline_lines(tokens[1].children or []) if tokens[0].type == "paragraph_open" else []
    return bool(lines) and bold_line_text(lines[0]) is not None


def _is_framing(paragraph: str, closers: bool) -> bool:
    text = paragraph.strip()
    if len(text) > FRAMING_MAX_CHARS or _CITATION_LIKE.search(text) or _starts_with_title(text):
        return False
    if closers:
        return bool(_FRAMING_CLOSERS.search(text))
    return bool(_FRAMING_OPENERS.match(text)) or (text.endswith(":") and "\n" not in text)


def drop_framing(text: str) -> str:
    """`text` without chat framing before the first heading or claim and after the last."""
    paragraphs = markdown_paragraphs(text)
    while paragraphs and _is_framing(paragraphs[0], closers=False):
        paragraphs.pop(0)
    while paragraphs and _is_framing(paragraphs[-1], closers=True):
        paragraphs.pop()
    return "\n\n".join(paragraphs)


def drop_own_source_list(text: str) -> str:
    """`text` without the model's own "Sources"/"References" sections (their title and the lines under it)."""
    document = read(text)
    headings = {token.map[0]: heading_level(token) for token in document.tokens
                if token.type == "heading_open" and token.level == 0 and token.map is not None}
    source_titles = {line: level for line, level, title in _titles(document.tokens)
                     if _SOURCES_TITLE.match(title.strip().rstrip(":").strip()) or _PLAIN_SOURCES_LINE.match(title)}
    if not source_titles:
        return text
    kept: list[str] = []
    skipping_level: int | None = None  # a bold or plain title line (7) ends at any heading
    for number, line in enumerate(document.lines):
        if number in source_titles:
            skipping_level = source_titles[number]
            continue
        if skipping_level is not None and number in headings and headings[number] <= skipping_level:
            skipping_level = None
        if skipping_level is None:
            kept.append(line)
    return "\n".join(kept)


def _comparable(text: str) -> str:
    return re.sub(r"[^\w]+", " ", text).strip().lower()


def drop_second_title(text: str) -> str:
    """The report with one title: a heading or bold line right under its `# ` title that restates it is dropped."""
    document = read(text.strip("\n"))
    tokens = document.tokens
    if not tokens or tokens[0].type != "heading_open" or tokens[0].tag != "h1" or not is_atx(tokens[0]):
        return text
    title = _comparable(inline_text(tokens[1].children or []))
    following = next((index for index in range(3, len(tokens)) if tokens[index].level == 0), len(tokens))
    opening = tokens[following] if following < len(tokens) else None
    if opening is None or opening.map is None:
        return "\n".join(document.lines)
    second: str | None = None
    if opening.type == "heading_open" and is_atx(opening):
        second = inline_text(tokens[following + 1].children or [])
    elif opening.type == "paragraph_open":
        second = bold_line_text(inline_lines(tokens[following + 1].children or [])[0])
    lines = list(document.lines)
    if second is not None and (_comparable(second) in title or title in _comparable(second)):
        del lines[opening.map[0]]
    return "\n".join(lines)
