"""The thread's earlier messages that fit a token budget: newest kept first, the question always counted.

Every run (chat, follow-up, research, plan) sends the model some of the thread it was asked in. A long
thread must not become a huge prompt, so its turns are measured with the estimate the passage budget
uses (`research.rank.estimate_tokens`) and kept from the newest back until the budget is spent; the turn
where the room runs out is cut to fit, marked, rather than dropped whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, TypedDict

from research.rank import estimate_tokens

TRUNCATION_MARKER = " […shortened to fit the context budget]"
# The most of a model's context window the thread's history may take: the rest is for passages and the answer.
THREAD_SHARE_OF_WINDOW = 4
# Fewer tokens than this left for a cut turn: a few words out of their context mislead more than they help.
MIN_SHORTENED_TOKENS = 32


class Turn(TypedDict):
    """One earlier message of the thread, as the chat-completions API takes it."""

    role: Literal["user", "assistant"]
    content: str


def context_tokens(turns: Sequence[Turn], question: str) -> int:
    """The estimated tokens of `turns` and `question` together, by the shared estimate."""
    return estimate_tokens(question) + sum(estimate_tokens(turn["content"]) for turn in turns)


def fit_thread_context(history: Sequence[Turn], question: str, max_tokens: int) -> list[Turn]:
    """The newest turns of `history` (oldest first) that fit in `max_tokens` beside `question`, which is counted
    first and never dropped; the turn where the room runs out is shortened with `TRUNCATION_MARKER`."""
    room = max_tokens - estimate_tokens(question)
    kept: list[Turn] = []
    for turn in reversed(history):
        cost = estimate_tokens(turn["content"])
        if cost <= room:
            kept.append(turn)
            room -= cost
            continue
        if room >= MIN_SHORTENED_TOKENS:
            kept.append(Turn(role=turn["role"], content=shortened_to(turn["content"], room)))
        break
    return kept[::-1]


def shortened_to(text: str, max_tokens: int) -> str:
    """The start of `text`, cut at a word boundary, with `TRUNCATION_MARKER`, within `max_tokens` by the shared estimate."""
    low, high = 0, len(text)
    # The estimate of a prefix never shrinks as the prefix grows, so the longest prefix that fits is found by bisection.
    while low < high:
        middle = (low + high + 1) // 2
        if estimate_tokens(text[:middle].rstrip() + TRUNCATION_MARKER) <= max_tokens:
            low = middle
        else:
            high = middle - 1
    prefix = text[:low]
    cut_mid_word = low < len(text) and not text[low].isspace() and not prefix[-1:].isspace()
    if cut_mid_word and len(prefix.split()) > 1:
        prefix = prefix.rsplit(None, 1)[0]
    return prefix.rstrip() + TRUNCATION_MARKER
