"""Slack's side of feedback: a 👍/👎 click as a ChatEvent, the "what was wrong?" modal a 👎 opens, and the modal's
submission as a ChatEvent carrying the comment.

The modal's `private_metadata` carries the run and the channel the click came from: a `view_submission` names no
channel, and the core checks that a run belongs to the channel it is given feedback in.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from pydantic import BaseModel, ValidationError
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.models.blocks import InputBlock, PlainTextInputElement, SectionBlock
from slack_sdk.models.views import View
from slack_sdk.web.async_client import AsyncWebClient

from bot.conversation.events import ChatEvent
from chat.slack.feedback import FEEDBACK_ACTION_ID, parse_feedback_value

logger = logging.getLogger(__name__)

PLATFORM = "slack"
COMMENT_CALLBACK_ID = "deepthread_feedback_comment"
COMMENT_BLOCK_ID = "what_was_wrong"
COMMENT_ACTION_ID = "comment"
COMMENT_MAX_CHARS = 3_000


class CommentContext(BaseModel):
    """What the modal remembers in `private_metadata`: the run and where the 👎 was clicked."""

    run_id: int
    workspace: str
    channel: str


def _clicker(body: dict[str, Any]) -> tuple[str, str]:
    user = body.get("user") or {}
    workspace = (body.get("team") or {}).get("id") or user.get("team_id") or ""
    return f"{PLATFORM}:{user.get('id', '')}", str(workspace)


def feedback_event(body: dict[str, Any]) -> ChatEvent | None:
    """The ChatEvent of a click on a feedback button (its value: `good:42` or `bad:42`); None for anything else."""
    action = next((action for action in body.get("actions") or [] if action.get("action_id") == FEEDBACK_ACTION_ID), None)
    parsed = parse_feedback_value(str(action.get("value") or "")) if action else None
    if parsed is None:
        return None
    verdict, run_id = parsed
    container = body.get("container") or {}
    message = body.get("message") or {}
    channel = (body.get("channel") or {}).get("id") or container.get("channel_id") or ""
    user, workspace = _clicker(body)
    return ChatEvent(platform=PLATFORM, workspace=workspace, channel=str(channel), user=user, kind="action",
                     action="feedback", feedback=verdict, action_run_id=run_id,
                     thread=message.get("thread_ts") or container.get("thread_ts"),
                     message_id=message.get("ts") or container.get("message_ts"))


def what_was_wrong_view(context: CommentContext) -> View:
    """The modal a 👎 opens: one optional multi-line answer, sent back with the run and channel in its metadata."""
    return View(
        type="modal", callback_id=COMMENT_CALLBACK_ID, private_metadata=context.model_dump_json(),
        title="What was wrong?", submit="Send", close="Skip",
        blocks=[
            SectionBlock(text="Thanks for the 👎. What was wrong with this answer? It helps make the next one better."),
            InputBlock(block_id=COMMENT_BLOCK_ID, label="What was wrong", optional=True,
                       element=PlainTextInputElement(action_id=COMMENT_ACTION_ID, multiline=True,
                                                     max_length=COMMENT_MAX_CHARS,
                                                     placeholder="A wrong fact, a missing source, a bad citation…")),
        ])


async def ask_what_was_wrong(client: AsyncWebClient, *, trigger_id: str | None, context: CommentContext) -> bool:
    """Open the "what was wrong?" modal with the click's trigger; False (logged) when Slack refuses or is unreachable."""
    if not trigger_id:
        return False
    try:
        await client.views_open(trigger_id=trigger_id, view=what_was_wrong_view(context))
    except (SlackApiError, SlackClientError) as error:
        # The 👎 is stored either way; only the chance to say why is lost (a trigger lives three seconds).
        code = error.response.get("error") if isinstance(error, SlackApiError) else type(error).__name__
        logger.warning("could not open the feedback modal (%s)", code)
        return False
    return True


def comment_event(body: dict[str, Any]) -> ChatEvent | None:
    """The ChatEvent of the modal's submission: the comment, for the run and channel in its metadata; None otherwise."""
    view = body.get("view") or {}
    if view.get("callback_id") != COMMENT_CALLBACK_ID:
        return None
    try:
        context = CommentContext.model_validate(json.loads(view.get("private_metadata") or "{}"))
    except (ValueError, ValidationError):
        return None
    answer = (((view.get("state") or {}).get("values") or {}).get(COMMENT_BLOCK_ID) or {}).get(COMMENT_ACTION_ID) or {}
    user, _ = _clicker(body)
    return ChatEvent(platform=PLATFORM, workspace=context.workspace, channel=context.channel, user=user, kind="action",
                     action="feedback_comment", action_run_id=context.run_id, text=str(answer.get("value") or ""))
