"""The model's answer made into a report draft before the audit: what real models wrap around a report removed.

In order: reasoning (`<think>` blocks), a fence around the whole report (```` ```markdown ````), chat framing
before the first heading or claim ("Here is the report…:") and after the last ("I hope this helps!"), the
model's own source list ("## Sources", "**References:**"; deepthread lists the sources itself), and a second
title under the first. What is left is the report as the model meant it, so the audit counts only claims.
"""

from __future__ import annotations

import re

from research.markdown import markdown_paragraphs
from research.llm import strip_reasoning

_FENCED_REPORT = re.compile(r"(?P<fence>```|~~~)[ \t]*(?:markdown|md|text)?[ \t]*\n(?P<body>.*?)\n[ \t]*(?P=fence)[ \t]*(?:\n|$)",
                            re.DOTALL | re.IGNORECASE)
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
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(?P<text>.*?)\s*#*\s*$")
_BOLD_LINE = re.compile(r"^\s*(\*\*|__)(?P<text>[^*_\n]+?)(\1)\s*:?\s*$")
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
    for fenced in _FENCED_REPORT.finditer(stripped):
        body = fenced.group("body")
        if fenced.start() == 0 and fenced.end() >= len(stripped.rstrip()):
            return body
        if len(body) >= REPORT_SHARE_OF_ANSWER * len(stripped):
            return body
    return text


def _is_heading(line: str) -> bool:
    return bool(_HEADING.match(line) or _BOLD_LINE.match(line))


def _is_framing(paragraph: str, closers: bool) -> bool:
    text = paragraph.strip()
    if len(text) > FRAMING_MAX_CHARS or _CITATION_LIKE.search(text) or _is_heading(text.splitlines()[0]):
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


def _title_text(line: str) -> str | None:
    """The text of a heading or a line in bold alone, else None."""
    found = _HEADING.match(line) or _BOLD_LINE.match(line)
    return found.group("text").strip().rstrip(":").strip() if found else None


def drop_own_source_list(text: str) -> str:
    """`text` without the model's own "Sources"/"References" sections (their title and the lines under it)."""
    lines = text.splitlines()
    kept: list[str] = []
    skipping_level: int | None = None
    for line in lines:
        title = _title_text(line)
        heading = _HEADING.match(line)
        level = len(heading.group(1)) if heading else 7  # a bold or plain title line ends at any heading
        if title is not None and _SOURCES_TITLE.match(title) or _PLAIN_SOURCES_LINE.match(line):
            skipping_level = level
            continue
        if skipping_level is not None:
            if heading and len(heading.group(1)) <= skipping_level or (heading and skipping_level == 7):
                skipping_level = None
            else:
                continue
        kept.append(line)
    return "\n".join(kept)


def _comparable(text: str) -> str:
    return re.sub(r"[^\w]+", " ", text).strip().lower()


def drop_second_title(text: str) -> str:
    """The report with one title: a heading or bold line right under its `# ` title that restates it is dropped."""
    lines = text.strip("\n").splitlines()
    first = next((index for index, line in enumerate(lines) if line.strip()), None)
    heading = _HEADING.match(lines[first]) if first is not None else None
    if first is None or heading is None or len(heading.group(1)) != 1:
        return text
    title = _comparable(heading.group("text"))
    following = next((index for index in range(first + 1, len(lines)) if lines[index].strip()), None)
    second = _title_text(lines[following]) if following is not None else None
    if following is not None and second is not None and (_comparable(second) in title or title in _comparable(second)):
        del lines[following]
    return "\n".join(lines)
