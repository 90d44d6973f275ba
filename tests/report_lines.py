"""What a reader could take for a checked claim but is not: the sentences of a delivered report body that carry no
`[n]` citation and no unverified flag, outside headings, list lead-ins and table headers.

Used by the end-to-end tests of weak models and by `bench/local_model.py` (`unflagged_uncited=`). The engine's own
words in a report it did not write (why it is unfinished, what was read) are not the model's claims and are left out.
"""

from __future__ import annotations

import re

from research.audit import UNVERIFIED_MARKER
from research.audit.sentences import sentence_spans
from research.engine import NO_SOURCES_NOTICE

CITED = re.compile(r"\[\d+\]")
CITED_AFTER_STOP = re.compile(r"([.!?])\s*((?:\[\d+\])+)")
TABLE_DELIMITER = re.compile(r"^\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?$")
LIST_MARK = re.compile(r"^(?:[-*+]|\d+[.)])\s+")
# Sentences the engine writes itself into a report the model did not finish.
ENGINE_WORDS = ("This is not a written answer", "Retry to have the report written", "The run ended before",
                "The research was stopped", "These ", "This source had been", "Not read:", "more search result",
                NO_SOURCES_NOTICE)


def unaccounted_sentences(body_markdown: str) -> list[str]:
    """Sentences of the body that are neither cited, flagged, a heading, a lead-in nor a table header."""
    lines = body_markdown.splitlines()
    found: list[str] = []
    in_fence = False
    for index, raw in enumerate(lines):
        line = raw.strip()
        if line.startswith(("```", "~~~")):
            in_fence = not in_fence
            continue
        following = lines[index + 1].strip() if index + 1 < len(lines) else ""
        if not line or line.startswith("#") or TABLE_DELIMITER.match(line) or (line.startswith("|")
                                                                              and TABLE_DELIMITER.match(following)):
            continue
        # A citation written after the sentence's full stop ("… period. [1]") belongs to that sentence.
        text = CITED_AFTER_STOP.sub(r" \2\1", LIST_MARK.sub("", line.lstrip("> ").strip()))
        if not in_fence and text.endswith(":"):
            continue  # a lead-in to what follows
        pieces = text.split(UNVERIFIED_MARKER.strip())
        for number, piece in enumerate(pieces):
            sentences = [piece[start:end].strip() for start, end in sentence_spans(piece)] or [piece.strip()]
            if number < len(pieces) - 1:
                sentences = sentences[:-1]  # the flag follows the sentence it marks
            for sentence in sentences:
                if sentence and not CITED.search(sentence) and not any(words in sentence for words in ENGINE_WORDS):
                    found.append(sentence)
    return found
