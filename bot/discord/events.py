"""Discord payloads as ChatEvents: pure functions of ids and texts, so the rules need no gateway to test."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from bot.conversation.events import ChatEvent, Visibility
from research.files import FileRef
from chat.discord.messenger import DIRECT_MESSAGES
from chat.discord.render import (
    CANCEL_ID,
    CONTINUE_PREFIX,
    EXPORT_PREFIX,
    FEEDBACK_LABELS,
    FEEDBACK_PREFIX,
    RETRY_PREFIX,
    WATCH_BUTTON_PREFIX,
)
from storage.vocabulary import WatchSchedule

PLATFORM = "discord"
COMMANDS: tuple[Literal["research", "plan", "ask"], ...] = ("research", "plan", "ask")
Depth = Literal["deep", "quick"]
WATCHES_COMMAND: Literal["watches"] = "watches"
# `/watches`' action option; `list` (or none) lists the channel's watches.
WatchesAction = Literal["list", "pause", "resume", "delete", "timezone"]
ActionName = Literal["retry", "continue", "export", "cancel"]
BUTTON_ACTIONS: tuple[tuple[str, ActionName], ...] = (
    (RETRY_PREFIX, "retry"), (CONTINUE_PREFIX, "continue"), (EXPORT_PREFIX, "export"))
WatchActionName = Literal["watch_pause", "watch_resume", "watch_delete"]
WATCH_BUTTON_ACTIONS: dict[str, WatchActionName] = {"pause": "watch_pause", "resume": "watch_resume",
                                                    "delete": "watch_delete"}


@dataclass(frozen=True)
class Where:
    """Where something happened, as the core keys conversations: the guild (or DMs), the channel, the thread.

    A thread's messages belong to its parent channel's conversation keyed by the thread; a direct
    message channel is one conversation of its own (Discord has no threads there).
    """

    workspace: str
    channel: str
    thread: str | None
    visibility: Visibility | None = None  # who can see the channel, when the channel object told

    @classmethod
    def of(cls, *, guild_id: int | None, channel_id: int, parent_id: int | None = None, is_thread: bool = False) -> Where:
        if guild_id is None:
            return cls(workspace=DIRECT_MESSAGES, channel=str(channel_id), thread=str(channel_id))
        if is_thread and parent_id is not None:
            return cls(workspace=str(guild_id), channel=str(parent_id), thread=str(channel_id))
        return cls(workspace=str(guild_id), channel=str(channel_id), thread=None)


def qualified_user(user_id: int | str) -> str:
    """`discord:42` for Discord's user 42, the form ADMIN_USER_IDS and the core use."""
    return f"{PLATFORM}:{user_id}"


def command_text(question: str, *, since: str | None = None, site: str | None = None, depth: Depth | None = None) -> str:
    """The command's options written as the words the core parses (`--since`, `--site`, `--deep`/`--quick`)."""
    words = [question.strip()]
    if since:
        words.append(f"--since {since.strip()}")
    for domain in (site or "").replace(",", " ").split():
        words.append(f"--site {domain}")
    if depth:
        words.append(f"--{depth}")
    return " ".join(words)


def watches_text(action: WatchesAction | None, value: str | None) -> str:
    """`/watches`' options as the words the core parses: `pause 3`, `timezone Europe/Paris`, or nothing (the list);
    a value without an action is taken as typed (`pause 3` in the value alone works too)."""
    if action == "list":
        return ""
    return " ".join(word for word in (action or "", (value or "").strip()) if word)


def attachment_ref(*, attachment_id: int, filename: str, size: int | None, content_type: str | None, url: str,
                   user_id: int, link: str | None = None) -> FileRef:
    """A Discord attachment as a file shared with the event: downloaded from its CDN URL, linked back to by the
    message that carries it (`link`; a command's option has no message, so its CDN URL)."""
    return FileRef(file_id=str(attachment_id), name=filename, size=size, mimetype=content_type, url=url,
                   link=link or url, shared_by=qualified_user(user_id))


def message_link(where: Where, message_id: int) -> str:
    """The jump link of a message: `https://discord.com/channels/<guild or @me>/<channel>/<message>`."""
    guild = "@me" if where.workspace == DIRECT_MESSAGES else where.workspace
    return f"https://discord.com/channels/{guild}/{where.thread or where.channel}/{message_id}"


def command_event(where: Where, *, user_id: int, name: str, text: str, interaction_id: int,
                  files: list[FileRef] | None = None) -> ChatEvent:
    """The ChatEvent of `/research`, `/plan`, `/ask` (with the file its `file` option attached) or `/watches`; any
    other command (`/history`) goes as `/research` with its text."""
    command: Literal["research", "plan", "ask", "watches"] = next(
        (known for known in (*COMMANDS, WATCHES_COMMAND) if known == name), "research")
    return ChatEvent(platform=PLATFORM, workspace=where.workspace, channel=where.channel, thread=where.thread,
                     user=qualified_user(user_id), kind="command", command=command, text=text,
                     event_id=str(interaction_id), channel_visibility=where.visibility, files=files or [])


def without_bot_mention(text: str, bot_user_id: int | None) -> str:
    """`text` with every mention of the bot (`<@id>`, `<@!id>`) removed and the ends trimmed."""
    if bot_user_id is None:
        return text.strip()
    stripped = re.sub(rf"<@!?{bot_user_id}>", " ", text)
    return re.sub(r"[ \t]{2,}", " ", stripped).strip()


def message_event(where: Where, *, user_id: int, message_id: int, text: str, mentions_bot: bool,
                  bot_user_id: int | None, files: list[FileRef] | None = None) -> ChatEvent | None:
    """A direct message, a reply in a thread, or a mention, with the files it attaches; None for a channel message
    not addressed to the bot (or one whose text and attachments Discord withheld: no message-content intent and no
    mention)."""
    words = without_bot_mention(text, bot_user_id)
    if not words and not files:
        return None
    if where.workspace == DIRECT_MESSAGES:
        kind: Literal["direct", "message", "mention"] = "direct"
    elif mentions_bot:
        kind = "mention"
    elif where.thread is not None:
        kind = "message"
    else:
        return None
    return ChatEvent(platform=PLATFORM, workspace=where.workspace, channel=where.channel, thread=where.thread,
                     user=qualified_user(user_id), kind=kind, text=words, message_id=str(message_id),
                     event_id=str(message_id), channel_visibility=where.visibility, files=files or [])


def reaction_event(where: Where, *, user_id: int, message_id: int, emoji: str) -> ChatEvent:
    """A reaction on a message (the core decides whether it cancels a run or approves a plan)."""
    return ChatEvent(platform=PLATFORM, workspace=where.workspace, channel=where.channel, user=qualified_user(user_id),
                     kind="reaction", reaction=emoji, message_id=str(message_id))


def button_event(where: Where, *, user_id: int, message_id: int, custom_id: str) -> ChatEvent | None:
    """A click on one of our buttons; None for any other custom id."""
    if custom_id.startswith(FEEDBACK_PREFIX):
        return feedback_event(where, user_id=user_id, message_id=message_id, custom_id=custom_id)
    if custom_id.startswith(WATCH_BUTTON_PREFIX):
        return watch_button_event(where, user_id=user_id, message_id=message_id, custom_id=custom_id)
    action: ActionName | None = "cancel" if custom_id == CANCEL_ID else None
    run_id: int | None = None
    for prefix, name in BUTTON_ACTIONS:
        if custom_id.startswith(prefix):
            try:
                run_id = int(custom_id.removeprefix(prefix))
            except ValueError:
                return None
            action = name
    if action is None:
        return None
    return ChatEvent(platform=PLATFORM, workspace=where.workspace, channel=where.channel, thread=where.thread,
                     user=qualified_user(user_id), kind="action", action=action, action_run_id=run_id,
                     message_id=str(message_id))


def feedback_event(where: Where, *, user_id: int, message_id: int, custom_id: str) -> ChatEvent | None:
    """A click on 👍 or 👎 under a report (`deepthread:feedback:good:42`); None for a custom id that says otherwise."""
    written, _, run = custom_id.removeprefix(FEEDBACK_PREFIX).partition(":")
    verdict = next((known for known in FEEDBACK_LABELS if known == written), None)
    if verdict is None or not run.isdigit():
        return None
    return ChatEvent(platform=PLATFORM, workspace=where.workspace, channel=where.channel, thread=where.thread,
                     user=qualified_user(user_id), kind="action", action="feedback", feedback=verdict,
                     action_run_id=int(run), message_id=str(message_id))


def watch_button_event(where: Where, *, user_id: int, message_id: int, custom_id: str) -> ChatEvent | None:
    """A click on Pause, Resume or Delete in a watch listing (`deepthread:watches:pause:7`); None for a custom id that
    says otherwise."""
    written, _, watch = custom_id.removeprefix(WATCH_BUTTON_PREFIX).partition(":")
    action = WATCH_BUTTON_ACTIONS.get(written)
    if action is None or not watch.isdigit():
        return None
    return ChatEvent(platform=PLATFORM, workspace=where.workspace, channel=where.channel, thread=where.thread,
                     user=qualified_user(user_id), kind="action", action=action, watch_id=int(watch),
                     message_id=str(message_id))


def watch_event(where: Where, *, user_id: int, run_id: int, schedule: WatchSchedule, one_thread: bool) -> ChatEvent:
    """"Watch this" on run `run_id`, with the schedule the person chose; its time zone is left to the core (the
    server's), since Discord does not tell anyone's."""
    return ChatEvent(platform=PLATFORM, workspace=where.workspace, channel=where.channel, thread=where.thread,
                     user=qualified_user(user_id), kind="action", action="watch", action_run_id=run_id,
                     watch_schedule=schedule, watch_one_thread=one_thread, timezone=None)


def comment_event(where: Where, *, user_id: int, run_id: int, comment: str) -> ChatEvent:
    """What a person said was wrong with run `run_id` (the "what was wrong?" modal, submitted)."""
    return ChatEvent(platform=PLATFORM, workspace=where.workspace, channel=where.channel, thread=where.thread,
                     user=qualified_user(user_id), kind="action", action="feedback_comment", action_run_id=run_id,
                     text=comment)
