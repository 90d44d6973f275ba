"""The interactive parts of the fake Slack: `views.open` with Slack's trigger rules, and the checks Slack makes on a
`context_actions` block of feedback buttons.

A trigger id comes with an interaction payload, lives three seconds and can be exchanged once:

    trigger_id = slack.views.issue_trigger_id(user="U1")   # put it in the block_actions payload the test sends
    slack.views.opened()                                    # OpenedView list: the modals the bot opened
"""

from __future__ import annotations

import itertools
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

TRIGGER_LIFETIME_SECONDS = 3.0
TRIGGER_ID = re.compile(r"^\d+\.\d+\.[0-9a-f]+$")
VIEW_TITLE_LIMIT = 24
VIEW_BLOCKS_LIMIT = 100
PRIVATE_METADATA_LIMIT = 3_000
CALLBACK_ID_LIMIT = 255
CONTEXT_ACTIONS_ELEMENTS_LIMIT = 5
FEEDBACK_TEXT_LIMIT = 75
FEEDBACK_VALUE_LIMIT = 2_000


@dataclass
class IssuedTrigger:
    user: str
    at: float
    exchanged: bool = False


@dataclass
class OpenedView:
    """A modal the bot opened: the view as Slack stores it (id, hash, state, …), for whom, with which trigger."""

    id: str
    user: str
    trigger_id: str
    view: dict[str, Any]
    at: float

    def input_ids(self) -> list[tuple[str, str]]:
        """The (block_id, action_id) of each input block, as a `view_submission`'s state is keyed."""
        return [(block["block_id"], block["element"]["action_id"]) for block in self.view.get("blocks") or []
                if block.get("type") == "input"]


def _plain_text(value: Any, limit: int) -> bool:
    return (isinstance(value, dict) and value.get("type") == "plain_text"
            and 1 <= len(str(value.get("text") or "")) <= limit)


def view_error(view: Any) -> str | None:
    """Why Slack refuses a modal view (`invalid_arguments`), or None when it is acceptable."""
    if not isinstance(view, dict) or view.get("type") != "modal":
        return "invalid_arguments"
    blocks = view.get("blocks")
    if not _plain_text(view.get("title"), VIEW_TITLE_LIMIT) or not isinstance(blocks, list):
        return "invalid_arguments"
    if not 1 <= len(blocks) <= VIEW_BLOCKS_LIMIT:
        return "invalid_arguments"
    has_input = False
    for block in blocks:
        if block.get("type") == "input":
            has_input = True
            element = block.get("element") or {}
            if not _plain_text(block.get("label"), 2_000) or not element.get("action_id") or not block.get("block_id"):
                return "invalid_arguments"
    for button in ("submit", "close"):
        if button in view and not _plain_text(view[button], VIEW_TITLE_LIMIT):
            return "invalid_arguments"
    if has_input and "submit" not in view:
        return "invalid_arguments"
    if len(str(view.get("private_metadata") or "")) > PRIVATE_METADATA_LIMIT:
        return "invalid_arguments"
    if len(str(view.get("callback_id") or "")) > CALLBACK_ID_LIMIT:
        return "invalid_arguments"
    return None


def context_actions_error(block: dict[str, Any]) -> bool:
    """Whether Slack refuses a `context_actions` block (1–5 feedback_buttons or icon_button elements)."""
    elements = block.get("elements")
    if not isinstance(elements, list) or not 1 <= len(elements) <= CONTEXT_ACTIONS_ELEMENTS_LIMIT:
        return True
    for element in elements:
        kind = element.get("type") if isinstance(element, dict) else None
        if kind == "icon_button":
            continue
        if kind != "feedback_buttons":
            return True
        for side in ("positive_button", "negative_button"):
            button = element.get(side)
            if not isinstance(button, dict) or not _plain_text(button.get("text"), FEEDBACK_TEXT_LIMIT):
                return True
            if not 1 <= len(str(button.get("value") or "")) <= FEEDBACK_VALUE_LIMIT:
                return True
    return False


class SlackViews:
    """`views.open` as Slack answers it: a trigger must be one Slack issued, unexpired and not yet exchanged."""

    def __init__(self, *, team_id: str, clock: Callable[[], float]) -> None:
        self.team_id = team_id
        self.clock = clock
        self._triggers: dict[str, IssuedTrigger] = {}
        self._opened: list[OpenedView] = []
        self._numbers = itertools.count(1)

    def issue_trigger_id(self, *, user: str) -> str:
        """A trigger id as an interaction payload carries it (`12345.98765.abcd2358fdea`), valid for three seconds."""
        number = next(self._numbers)
        trigger_id = f"{1_700_000_000 + number}.{number}.{secrets.token_hex(6)}"
        self._triggers[trigger_id] = IssuedTrigger(user=user, at=self.clock())
        return trigger_id

    def opened(self) -> list[OpenedView]:
        """The modals opened, in order."""
        return list(self._opened)

    def open(self, params: dict[str, Any]) -> dict[str, Any]:
        """The `views.open` method (called under the fake's lock)."""
        trigger_id = str(params.get("trigger_id") or "")
        if not trigger_id or not TRIGGER_ID.match(trigger_id) or trigger_id not in self._triggers:
            return {"ok": False, "error": "invalid_trigger_id"}
        trigger = self._triggers[trigger_id]
        if trigger.exchanged:
            return {"ok": False, "error": "exchanged_trigger_id"}
        if self.clock() - trigger.at > TRIGGER_LIFETIME_SECONDS:
            return {"ok": False, "error": "expired_trigger_id"}
        view = params.get("view")
        if view_error(view):
            return {"ok": False, "error": "invalid_arguments",
                    "response_metadata": {"messages": ["[ERROR] the view is not a valid modal"]}}
        trigger.exchanged = True
        view_id = f"V{next(self._numbers):08d}"
        stored = {**view, "id": view_id, "team_id": self.team_id, "state": {"values": {}}, "hash": secrets.token_hex(8),
                  "private_metadata": view.get("private_metadata", ""), "callback_id": view.get("callback_id", ""),
                  "external_id": view.get("external_id", ""), "root_view_id": view_id, "previous_view_id": None,
                  "app_id": "A0DEEPTHREAD", "app_installed_team_id": self.team_id, "bot_id": "B0BOT"}
        self._opened.append(OpenedView(id=view_id, user=trigger.user, trigger_id=trigger_id, view=stored, at=self.clock()))
        return {"ok": True, "view": stored}
