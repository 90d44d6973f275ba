"""The interactive parts of the fake Slack: `views.open` with Slack's trigger rules, the checks Slack makes on a
modal's inputs and on a `context_actions` block of feedback buttons, and a submitted modal's `state.values` as
Slack sends them.

A trigger id comes with an interaction payload, lives three seconds and can be exchanged once:

    trigger_id = slack.views.issue_trigger_id(user="U1")   # put it in the block_actions payload the test sends
    slack.views.opened()                                    # OpenedView list: the modals the bot opened
    submission_state(view, {"watch_cadence": {"cadence": "weekly"}})  # the state a view_submission carries
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
LABEL_LIMIT = 2_000
OPTION_TEXT_LIMIT = 75
OPTION_VALUE_LIMIT = 150
OPTIONS_LIMITS = {"static_select": 100, "checkboxes": 10, "radio_buttons": 10}
# A choice in `submission_state`: an option's value (a select), option values (checkboxes), text (a text input),
# or None (left empty).
Choice = str | list[str] | None


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


def _option_error(option: Any) -> bool:
    return (not isinstance(option, dict) or not _plain_text(option.get("text"), OPTION_TEXT_LIMIT)
            or not 1 <= len(str(option.get("value") or "")) <= OPTION_VALUE_LIMIT)


def input_element_error(element: dict[str, Any]) -> bool:
    """Whether Slack refuses an input block's element: options out of their limits, an initial option not offered."""
    kind = element.get("type")
    if kind not in OPTIONS_LIMITS:
        return False
    options = element.get("options")
    if not isinstance(options, list) or not 1 <= len(options) <= OPTIONS_LIMITS[kind]:
        return True
    if any(_option_error(option) for option in options):
        return True
    if kind == "checkboxes":
        initial = list(element.get("initial_options") or [])
    else:
        initial = [element["initial_option"]] if element.get("initial_option") is not None else []
    return any(option not in options for option in initial)


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
            if not _plain_text(block.get("label"), LABEL_LIMIT) or not element.get("action_id") or not block.get("block_id"):
                return "invalid_arguments"
            if "hint" in block and not _plain_text(block["hint"], LABEL_LIMIT):
                return "invalid_arguments"
            if input_element_error(element):
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


def _element_state(element: dict[str, Any], choice: Choice, chosen: bool) -> dict[str, Any]:
    """One input's entry in `state.values`: what the person chose, or the element's initial value when untouched."""
    kind = str(element.get("type") or "plain_text_input")
    options = element.get("options") or []

    def option(value: str) -> dict[str, Any]:
        found = next((option for option in options if option.get("value") == value), None)
        if found is None:
            raise ValueError(f"{element.get('action_id')!r} offers no option {value!r}")
        return found

    if kind == "static_select":
        selected = (option(str(choice)) if choice is not None else None) if chosen else element.get("initial_option")
        return {"type": kind, "selected_option": selected}
    if kind in ("checkboxes", "multi_static_select"):
        values = choice if isinstance(choice, list) else [] if choice is None else [choice]
        selected_options = [option(value) for value in values] if chosen else list(element.get("initial_options") or [])
        return {"type": kind, "selected_options": selected_options}
    return {"type": kind, "value": (choice if chosen else element.get("initial_value"))}


def submission_state(view: dict[str, Any], choices: dict[str, dict[str, Choice]]) -> dict[str, Any]:
    """The `state` of a `view_submission`, shaped as Slack sends it: `values` keyed by block id and action id, every
    input of `view` there (an untouched one with its initial value), `selected_option` for a select,
    `selected_options` for checkboxes, `value` for a text input; `choices` as {block_id: {action_id: choice}} (a
    block the view does not have is sent as a text input, as a forged payload would)."""
    values: dict[str, dict[str, Any]] = {}
    for block in view.get("blocks") or []:
        if block.get("type") != "input":
            continue
        element = block.get("element") or {}
        block_id, action_id = str(block["block_id"]), str(element["action_id"])
        given = choices.get(block_id) or {}
        values[block_id] = {action_id: _element_state(element, given.get(action_id), action_id in given)}
    for block_id, actions in choices.items():
        for action_id, choice in actions.items():
            values.setdefault(block_id, {}).setdefault(action_id, {"type": "plain_text_input", "value": choice})
    return {"values": values}


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
