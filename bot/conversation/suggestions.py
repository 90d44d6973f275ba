"""What to offer a person who opens a new conversation with the bot: one prompt per mode, and their last question."""

from __future__ import annotations

from pydantic import BaseModel

from bot.conversation.events import SuggestedPrompt
from chat.text import shortened, single_line
from storage.vocabulary import RunMode

# Slack shows at most four suggested prompts.
MAX_SUGGESTIONS = 4
TITLE_CHARS = 60
# The words that pick a mode in a message (bot.conversation.commands.mode_prefix), by stored run mode.
PREFIX_BY_MODE: dict[RunMode, str] = {"research": "research", "plan": "plan", "chat": "ask", "followup": "ask"}
MODE_PROMPTS = (
    SuggestedPrompt(title="Research with cited sources",
                    message="research: What do recent studies say about the health effects of intermittent fasting?"),
    SuggestedPrompt(title="Plan the research first",
                    message="plan: How are European cities cutting traffic emissions, and what has worked?"),
    SuggestedPrompt(title="Ask for a quick answer",
                    message="ask: What is the difference between a heat pump and an air conditioner?"),
)


class PastQuestion(BaseModel):
    """A question a person asked before, and the mode it ran in."""

    mode: RunMode
    question: str


def suggested_prompts(last: PastQuestion | None) -> list[SuggestedPrompt]:
    """One prompt for each mode (research, plan, ask), then the person's last question in its mode when there is one."""
    prompts = list(MODE_PROMPTS)
    if last is not None and last.question.strip():
        prefix = PREFIX_BY_MODE.get(last.mode, "ask")
        question = last.question.strip()
        prompts.append(SuggestedPrompt(title=shortened(f"Again: {single_line(question)}", TITLE_CHARS),
                                       message=f"{prefix}: {question}"))
    return prompts[:MAX_SUGGESTIONS]
