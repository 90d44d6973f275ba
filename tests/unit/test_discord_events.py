"""Discord payloads as ChatEvents: places, options, messages, reactions and buttons."""

from __future__ import annotations

import pytest

from bot.conversation.commands import parse_request
from bot.discord.bundle import INVITE_PERMISSIONS, invite_url
from bot.discord.events import Where, button_event, command_event, command_text, message_event, reaction_event
from chat.discord.messenger import DIRECT_MESSAGES
from storage.vocabulary import RunOptions

BOT = 900000000000000001
USER = 123456789012345678


def test_a_channel_a_thread_and_a_direct_message_map_to_the_conversation_keys() -> None:
    assert Where.of(guild_id=1, channel_id=10) == Where(workspace="1", channel="10", thread=None)
    assert Where.of(guild_id=1, channel_id=11, parent_id=10, is_thread=True) == Where(workspace="1", channel="10", thread="11")
    assert Where.of(guild_id=None, channel_id=12) == Where(workspace=DIRECT_MESSAGES, channel="12", thread="12")


def test_command_options_become_the_words_the_core_parses() -> None:
    text = command_text("tidal power output", since="2024-01-31", site="a.example b.example", depth="deep")
    request = parse_request(text, "research")
    assert request.question == "tidal power output"
    assert request.options == RunOptions(since="2024-01-31", sites=["a.example", "b.example"], preset="deep")


def test_a_command_event_is_qualified_and_carries_its_thread() -> None:
    event = command_event(Where.of(guild_id=1, channel_id=11, parent_id=10, is_thread=True), user_id=USER,
                          name="plan", text="q", interaction_id=77)
    assert (event.kind, event.command, event.user, event.channel, event.thread, event.event_id) == (
        "command", "plan", f"discord:{USER}", "10", "11", "77")


def test_a_thread_reply_is_a_follow_up_and_a_mention_is_stripped() -> None:
    thread = Where.of(guild_id=1, channel_id=11, parent_id=10, is_thread=True)
    reply = message_event(thread, user_id=USER, message_id=5, text="and in 2023?", mentions_bot=False, bot_user_id=BOT)
    assert reply is not None and (reply.kind, reply.text, reply.thread) == ("message", "and in 2023?", "11")
    mention = message_event(thread, user_id=USER, message_id=6, text=f"<@{BOT}>  research: why", mentions_bot=True,
                            bot_user_id=BOT)
    assert mention is not None and (mention.kind, mention.text) == ("mention", "research: why")


def test_channel_chatter_and_withheld_content_are_ignored() -> None:
    channel = Where.of(guild_id=1, channel_id=10)
    assert message_event(channel, user_id=USER, message_id=5, text="hello all", mentions_bot=False, bot_user_id=BOT) is None
    thread = Where.of(guild_id=1, channel_id=11, parent_id=10, is_thread=True)
    # Without the message-content intent Discord sends an empty text: nothing to act on.
    assert message_event(thread, user_id=USER, message_id=5, text="", mentions_bot=False, bot_user_id=BOT) is None


def test_every_direct_message_is_for_the_bot() -> None:
    event = message_event(Where.of(guild_id=None, channel_id=12), user_id=USER, message_id=5, text="what is new?",
                          mentions_bot=False, bot_user_id=BOT)
    assert event is not None and (event.kind, event.workspace, event.thread) == ("direct", DIRECT_MESSAGES, "12")


def test_a_reaction_names_its_emoji_and_message() -> None:
    event = reaction_event(Where.of(guild_id=1, channel_id=10), user_id=USER, message_id=42, emoji="❌")
    assert (event.kind, event.reaction, event.message_id, event.channel) == ("reaction", "❌", "42", "10")


@pytest.mark.parametrize(("custom_id", "action", "run_id"), [
    ("deepthread:cancel", "cancel", None), ("deepthread:retry:7", "retry", 7), ("deepthread:continue:7", "continue", 7),
    ("deepthread:export:8", "export", 8)])
def test_buttons_map_to_actions(custom_id: str, action: str, run_id: int | None) -> None:
    event = button_event(Where.of(guild_id=1, channel_id=10), user_id=USER, message_id=42, custom_id=custom_id)
    assert event is not None and (event.action, event.action_run_id, event.message_id) == (action, run_id, "42")


@pytest.mark.parametrize(("custom_id", "verdict", "run_id"), [
    ("deepthread:feedback:good:9", "good", 9), ("deepthread:feedback:bad:9", "bad", 9)])
def test_thumbs_up_and_down_map_to_feedback_with_the_verdict_and_the_run(custom_id: str, verdict: str,
                                                                         run_id: int) -> None:
    where = Where.of(guild_id=1, channel_id=11, parent_id=10, is_thread=True)
    event = button_event(where, user_id=USER, message_id=42, custom_id=custom_id)
    assert event is not None
    assert (event.action, event.feedback, event.action_run_id) == ("feedback", verdict, run_id)
    assert (event.user, event.channel, event.thread, event.message_id) == (f"discord:{USER}", "10", "11", "42")


@pytest.mark.parametrize("custom_id", ["someone-else", "deepthread:retry:x", "deepthread:unknown",
                                       "deepthread:feedback:meh:9", "deepthread:feedback:good:", "deepthread:feedback:bad:x"])
def test_foreign_or_broken_buttons_are_ignored(custom_id: str) -> None:
    assert button_event(Where.of(guild_id=1, channel_id=10), user_id=USER, message_id=42, custom_id=custom_id) is None


def test_the_invite_asks_for_the_commands_scope_and_only_the_permissions_used() -> None:
    url = invite_url("555")
    assert "client_id=555" in url and "scope=bot+applications.commands" in url
    permissions = int(url.rsplit("permissions=", 1)[1])
    assert permissions == sum(INVITE_PERMISSIONS.values())
    administrator, manage_messages, mention_everyone = 1 << 3, 1 << 13, 1 << 17
    assert not permissions & (administrator | manage_messages | mention_everyone)
