"""Slack's 👍/👎 under a report or answer: a `context_actions` block holding a `feedback_buttons` element.

Each button's value names the verdict and the run (`good:42`, `bad:42`), so a click says everything the adapter needs.
"""

from __future__ import annotations

from typing import Any, Literal

from slack_sdk.models.blocks import ContextActionsBlock, FeedbackButtonObject, FeedbackButtonsElement

from chat.message import Content
from chat.render import ReportDelivery

FEEDBACK_ACTION_ID = "deepthread_feedback"
BLOCKS_PER_MESSAGE = 50
Verdict = Literal["good", "bad"]
VERDICTS: tuple[Verdict, ...] = ("good", "bad")


def feedback_value(verdict: Verdict, run_id: int) -> str:
    """What a feedback button sends back when clicked: `good:42`."""
    return f"{verdict}:{run_id}"


def parse_feedback_value(value: str) -> tuple[Verdict, int] | None:
    """The verdict and run id of a feedback button's value; None for anything else."""
    verdict, _, run = value.partition(":")
    if verdict not in VERDICTS or not run.isdigit():
        return None
    return verdict, int(run)


def feedback_block(run_id: int) -> dict[str, Any]:
    """The `context_actions` block with 👍/👎 buttons for one run."""
    buttons = FeedbackButtonsElement(
        action_id=FEEDBACK_ACTION_ID,
        positive_button=FeedbackButtonObject(text="👍", value=feedback_value("good", run_id),
                                             accessibility_label="Good answer"),
        negative_button=FeedbackButtonObject(text="👎", value=feedback_value("bad", run_id),
                                             accessibility_label="Something was wrong"))
    return ContextActionsBlock(elements=[buttons]).to_dict()


def with_feedback_buttons(delivery: ReportDelivery, run_id: int) -> ReportDelivery:
    """`delivery` with the feedback block at the very end (in a message of its own when the last one is full)."""
    messages = list(delivery.messages)
    last = messages[-1]
    blocks = (last.extra.get("slack") or {}).get("blocks")
    if blocks is not None and len(blocks) < BLOCKS_PER_MESSAGE:
        messages[-1] = Content(text=last.text, extra={**last.extra, "slack": {**last.extra["slack"],
                                                                             "blocks": [*blocks, feedback_block(run_id)]}})
    else:
        messages.append(Content(text="Was this helpful?", extra={"slack": {"blocks": [feedback_block(run_id)]}}))
    return delivery.model_copy(update={"messages": messages})
