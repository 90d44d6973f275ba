"""Discord's "what was wrong?" modal: Slack's words within Discord's limits, known by its custom id alone."""

from __future__ import annotations

import asyncio
from typing import Any

import discord

from bot.discord.events import Where, comment_event
from bot.discord.feedback import (
    COMMENT_INPUT_ID,
    comment_custom_id,
    comment_run_id,
    submitted_comment,
    what_was_wrong_modal,
)
from bot.slack.feedback import CommentContext, what_was_wrong_view
from tests.fakes.discord_api import modal_form_errors, submitted_components


def discord_modal(run_id: int) -> dict[str, Any]:
    async def build() -> dict[str, Any]:  # discord.py's views belong to an event loop
        return what_was_wrong_modal(run_id).to_dict()
    return asyncio.run(build())


def test_the_modal_asks_in_slack_s_words_within_discord_s_limits() -> None:
    modal = discord_modal(42)
    assert modal_form_errors(modal).errors == {}
    slack = what_was_wrong_view(CommentContext(run_id=42, workspace="T1", channel="C1")).to_dict()
    [intro, question] = slack["blocks"]
    element = question["element"]
    [display, label] = modal["components"]
    assert modal["title"] == slack["title"]["text"]
    assert display["content"] == intro["text"]["text"]
    assert label["label"] == question["label"]["text"]
    text_input = label["component"]
    assert text_input["placeholder"] == element["placeholder"]["text"]
    assert text_input["max_length"] == element["max_length"]
    assert text_input["required"] is False and question["optional"] is True
    assert text_input["style"] == discord.TextStyle.paragraph.value


def test_the_modal_names_its_run_and_is_not_kept_in_memory_by_discord_py() -> None:
    async def build() -> discord.ui.Modal:
        return what_was_wrong_modal(42)
    modal = asyncio.run(build())
    assert modal.custom_id == comment_custom_id(42) and comment_run_id(modal.custom_id) == 42
    assert modal.is_finished(), "a finished modal is not stored by send_modal: its submission is heard by custom id"
    assert comment_run_id("someone-else") is None and comment_run_id(comment_custom_id(42) + "x") is None


def test_a_submitted_modal_becomes_a_comment_on_its_run_in_its_thread() -> None:
    components = submitted_components(discord_modal(42), {COMMENT_INPUT_ID: "A wrong figure."})
    assert submitted_comment(components) == "A wrong figure."
    assert submitted_comment([{"type": 1, "components": [{"type": 4, "custom_id": COMMENT_INPUT_ID,
                                                          "value": "In a row."}]}]) == "In a row."
    assert submitted_comment([]) == ""
    where = Where.of(guild_id=1, channel_id=11, parent_id=10, is_thread=True)
    event = comment_event(where, user_id=7, run_id=42, comment="A wrong figure.")
    assert (event.action, event.action_run_id, event.text) == ("feedback_comment", 42, "A wrong figure.")
    assert (event.user, event.workspace, event.channel, event.thread) == ("discord:7", "1", "10", "11")
