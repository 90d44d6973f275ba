"""The model and questions of the streamed-answer tests (Slack and the terminal): quick answers are a long
paragraph, and follow-ups cite a passage for a sentence it does not support, so the audited answer differs from the draft."""

from __future__ import annotations

from tests.fakes.llm import (
    UNRELATED_SENTENCE,
    ChatRequest,
    HandlerResult,
    default_research_model,
    passages_in,
    unrelated_citation_synthesis,
)

FOLLOW_UP = "How much energy did the array deliver?"
CHAT_QUESTION = "why do tides happen twice a day"
CHAT_ANSWER = ("Tides happen twice a day because the Moon pulls the ocean toward it on the near side while the Earth "
               "itself is pulled away from the water on the far side, so two bulges of water travel around the "
               "planet as it turns once a day beneath them.")


def honest_judge_model(request: ChatRequest) -> HandlerResult:
    """The default model, except that follow-ups cite a passage for a sentence it does not support, which the
    citation check then refuses, and that quick answers are a long paragraph."""
    if request.schema_name is None and "Follow-up question" in request.text:
        return unrelated_citation_synthesis(request)
    if request.schema_name == "citation_check" and UNRELATED_SENTENCE.rstrip(".") in request.text:
        ids = list(passages_in(request))
        return {"verdicts": [{"id": passage_id, "supported": False} for passage_id in ids]}
    if request.schema_name is None and not passages_in(request):
        return CHAT_ANSWER
    return default_research_model(request)
