"""Discord's side of feedback: the "what was wrong?" modal a 👎 opens, and what its submission says.

The modal's custom id names the run (`deepthread:what-was-wrong:42`) and the bot's interaction handler answers its
submission by that id, as it answers every button, rather than through a discord.py object kept in memory: a modal
opened before the bot restarted is still heard when it is submitted. A modal submitted from a report's message
carries its channel, so the core can check that the run belongs there, as it does for Slack's (whose submission names
no channel and carries it in the modal's metadata instead).

The words are those of Slack's modal (bot/slack/feedback.py) as far as Discord allows: its buttons are always
Submit and Cancel, and a title or a label holds at most 45 characters.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import discord

COMMENT_PREFIX = "deepthread:what-was-wrong:"
COMMENT_INPUT_ID = "comment"
COMMENT_MAX_CHARS = 3_000
TITLE = "What was wrong?"
INTRO = "Thanks for the 👎. What was wrong with this answer? It helps make the next one better."
LABEL = "What was wrong"
PLACEHOLDER = "A wrong fact, a missing source, a bad citation…"
THANKS = "Thanks for the feedback."
# Discord's component types a submitted modal nests its text input in: an action row, or a label.
ACTION_ROW, LABEL_COMPONENT = discord.ComponentType.action_row.value, discord.ComponentType.label.value


def comment_custom_id(run_id: int) -> str:
    """The modal's custom id for run `run_id`: `deepthread:what-was-wrong:42`."""
    return f"{COMMENT_PREFIX}{run_id}"


def comment_run_id(custom_id: str) -> int | None:
    """The run a submitted modal's custom id names; None for any other modal."""
    run = custom_id.removeprefix(COMMENT_PREFIX) if custom_id.startswith(COMMENT_PREFIX) else ""
    return int(run) if run.isdigit() else None


def what_was_wrong_modal(run_id: int) -> discord.ui.Modal:
    """The modal a 👎 opens: a line of thanks and one optional multi-line answer. Call it on the bot's event loop."""
    modal = discord.ui.Modal(title=TITLE, custom_id=comment_custom_id(run_id), timeout=None)
    modal.add_item(discord.ui.TextDisplay(INTRO))
    modal.add_item(discord.ui.Label(text=LABEL, component=discord.ui.TextInput(
        custom_id=COMMENT_INPUT_ID, style=discord.TextStyle.paragraph, required=False, max_length=COMMENT_MAX_CHARS,
        placeholder=PLACEHOLDER)))
    # Stopped before it is sent, so discord.py keeps no copy waiting (forever: no timeout) for the submission.
    modal.stop()
    return modal


def submitted_comment(components: Iterable[Mapping[str, Any]]) -> str:
    """The answer in a submitted modal's components (its text input, in a label or an action row); empty when none."""
    for component in components:
        if component.get("type") == ACTION_ROW:
            nested: Iterable[Mapping[str, Any]] = component.get("components") or []
        elif component.get("type") == LABEL_COMPONENT:
            nested = [component.get("component") or {}]
        else:
            nested = [component]
        for item in nested:
            if item.get("custom_id") == COMMENT_INPUT_ID:
                return str(item.get("value") or "")
    return ""
