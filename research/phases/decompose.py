"""Decompose: the question into sub-questions, search queries and an outline (fallback: the question)."""

from __future__ import annotations

import datetime as dt
import re

from pydantic import BaseModel, Field, ValidationInfo, field_validator

from research.llm import LLMClient, StructuredOutputError
from research.phases.search import clean_query
from research.prompts import system_prompt

URL_PATTERN = re.compile(r"https?://[^\s<>\"'`)\]]+", re.IGNORECASE)
MAX_QUERY_CHARS = 300
NO_SEARCHABLE_QUERY = ("no searchable query: each was empty, a citation marker or words addressed to an AI, and so was "
                       "the sub-question; write plain search words")


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
    def _clean_queries(cls, queries: list[str], info: ValidationInfo) -> list[str]:
        """The model's queries cleaned (`clean_query`); none left, the sub-question's own words are searched."""
        cleaned = usable_queries(queries) or usable_queries([info.data.get("question", "")])
        if not cleaned:
            raise ValueError(NO_SEARCHABLE_QUERY)
        return cleaned


class Decomposition(BaseModel):
    """The research plan the engine follows: 1–5 sub-questions and an outline."""

    sub_questions: list[SubQuestion] = Field(min_length=1, max_length=5)
    outline: list[str] = Field(default_factory=list, max_length=8)

    @field_validator("sub_questions", mode="before")
    @classmethod
    def _drop_unsearchable(cls, sub_questions: object) -> object:
        """Sub-questions with nothing searchable are dropped while others remain; with none left, validation says why."""
        if not isinstance(sub_questions, list):
            return sub_questions
        return [sub for sub in sub_questions if not _unsearchable(sub)] or sub_questions


def usable_queries(texts: list[str]) -> list[str]:
    """The model-written `texts` that are still searchable once cleaned (`clean_query`), cut to the length limit."""
    cleaned = (clean_query(text) for text in texts)
    return [query[:MAX_QUERY_CHARS] for query in cleaned if query is not None]


def _unsearchable(sub_question: object) -> bool:
    """Whether a raw sub-question has no usable query and no usable words of its own (other shapes fail validation)."""
    if not isinstance(sub_question, dict):
        return False
    question, queries = sub_question.get("question"), sub_question.get("queries")
    if not isinstance(question, str) or not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        return False
    return not usable_queries([*queries, question])


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
    # Built without validation: the person's own words are searched as written; only a model's queries are cleaned.
    own_words = SubQuestion.model_construct(question=question.strip(), queries=[question_as_query(question)])
    return Decomposition(sub_questions=[own_words])


async def decompose(question: str, *, llm: LLMClient, today: dt.date, context: str | None = None) -> tuple[Decomposition, bool]:
    """The model's decomposition, or the fallback when it cannot give a valid one; (plan, fell_back)."""
    user = f"Question:\n{question}"
    if context:
        user = f"Earlier conversation (for context):\n{context}\n\n{user}"
    messages = [{"role": "system", "content": system_prompt("decompose", today, cites=False)}, {"role": "user", "content": user}]
    try:
        return await llm.structured(messages, Decomposition, task="decomposition", fast=True), False
    except StructuredOutputError:
        return fallback(question), True
