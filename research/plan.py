"""Plan mode's output: a research plan the requester approves before any search happens."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, ValidationError

from research.phases.decompose import Decomposition, fallback, usable_queries


# What a plan's step says when it wants no particular kind of source.
ANY_SOURCE = frozenset({"", "any", "any source", "any sources", "all", "general", "n/a", "none"})


class StrategyStep(BaseModel):
    """One search the plan intends to run, and the kind of source it should find."""

    query: str = Field(min_length=2)
    source_type: str = "any"


class ResearchPlan(BaseModel):
    """The query as understood, key questions, search strategy and the expected deliverable."""

    query: str
    key_questions: list[str] = Field(min_length=1, max_length=5)
    search_strategy: list[StrategyStep] = Field(min_length=1, max_length=10)
    deliverable: str


def plan_as_decomposition(plan: ResearchPlan | Decomposition | dict[str, Any]) -> Decomposition:
    """The plan as the engine's decomposition: each key question with its share of the searches, the model's queries
    cleaned (`clean_query`); with nothing searchable left, the plan's query as it stands."""
    if isinstance(plan, Decomposition):
        return plan
    if isinstance(plan, dict):
        if "sub_questions" in plan:
            return Decomposition.model_validate(plan)
        plan = ResearchPlan.model_validate(plan)
    questions = plan.key_questions[:5]
    queries: list[list[str]] = [[] for _ in questions]
    # Cleaned before they are shared out, so that a copied marker takes no key question's place.
    for index, query in enumerate(usable_queries([step.query for step in plan.search_strategy])):
        bucket = queries[index % len(questions)]
        if len(bucket) < 3:
            bucket.append(query)
    sub_questions = [{"question": question, "queries": bucket or [question]} for question, bucket in zip(questions, queries)]
    try:
        return Decomposition.model_validate({"sub_questions": sub_questions, "outline": list(questions)})
    except ValidationError:
        # The person approved this plan: its query is searched even when every key question and search was unusable.
        return fallback(plan.query)


def render_plan_markdown(plan: ResearchPlan) -> str:
    """The plan as the requester reads it in the thread, under its title ("Research plan: …", the report's)."""
    lines = ["**Key questions**"]
    lines += [f"{number}. {question}" for number, question in enumerate(plan.key_questions, 1)]
    lines += ["", "**Search strategy**"]
    lines += [f"- `{step.query}`{_looking_for(step.source_type)}" for step in plan.search_strategy]
    lines += ["", f"**Deliverable:** {plan.deliverable}"]
    return "\n".join(lines)


def _looking_for(source_type: str) -> str:
    """` — looking for news` after a search, or nothing when the plan names no kind of source ("any")."""
    kind = " ".join(source_type.split())
    return "" if kind.casefold() in ANY_SOURCE else f" — looking for {kind}"
