"""Decompose: the question into sub-questions, search queries and an outline (fallback: the question)."""

from __future__ import annotations

import datetime as dt
import re

from pydantic import BaseModel, Field, field_validator

from research.llm import LLMClient, StructuredOutputError
from research.prompts import system_prompt

URL_PATTERN = re.compile(r"https?://[^\s<>\"'`)\]]+", re.IGNORECASE)
MAX_QUERY_CHARS = 300


class SubQuestion(BaseModel):
    """One part of the question, with the searches that should answer it."""

    question: str
    queries: list[str] = Field(min_length=1, max_length=3)

    @field_validator("question")
    @classmethod
    def _non_empty_question(cls, question: str) -> str:
        if not question.strip():
            raise ValueError("a sub-question cannot be empty")
        return question.strip()

    @field_validator("queries")
    @classmethod
    def _clean_queries(cls, queries: list[str]) -> list[str]:
        cleaned = [query.strip()[:MAX_QUERY_CHARS] for query in queries if query.strip()]
        if not cleaned:
            raise ValueError("at least one non-empty query")
        return cleaned


class Decomposition(BaseModel):
    """The research plan the engine follows: 1–5 sub-questions and an outline."""

    sub_questions: list[SubQuestion] = Field(min_length=1, max_length=5)
    outline: list[str] = Field(default_factory=list, max_length=8)


def priority_urls(question: str) -> list[str]:
    """URLs written in the question, in order, without trailing punctuation: read first."""
    seen: list[str] = []
    for match in URL_PATTERN.findall(question):
        url = match.rstrip(".,;:!?")
        if url not in seen:
            seen.append(url)
    return seen


def question_as_query(question: str) -> str:
    """The question as a search query: its URLs left out, cut to the query length limit."""
    query = URL_PATTERN.sub(" ", question).strip() or question
    return query[:MAX_QUERY_CHARS]


def fallback(question: str) -> Decomposition:
    """The question itself as the one sub-question and the one query."""
    return Decomposition(sub_questions=[SubQuestion(question=question, queries=[question_as_query(question)])])


async def decompose(question: str, *, llm: LLMClient, today: dt.date, context: str | None = None) -> tuple[Decomposition, bool]:
    """The model's decomposition, or the fallback when it cannot give a valid one; (plan, fell_back)."""
    user = f"Question:\n{question}"
    if context:
        user = f"Earlier conversation (for context):\n{context}\n\n{user}"
    messages = [{"role": "system", "content": system_prompt("decompose", today)}, {"role": "user", "content": user}]
    try:
        return await llm.structured(messages, Decomposition, task="decomposition", fast=True), False
    except StructuredOutputError:
        return fallback(question), True
