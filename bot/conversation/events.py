"""What adapters hand the conversation core, and what it hands back for them to say."""

from __future__ import annotations

from typing import Literal, Protocol

from pydantic import BaseModel, Field

from chat.message import Content
from research.files import FileRef
from storage.vocabulary import WatchSchedule

# `opened`: a person opened a new conversation with the bot (Slack's assistant pane) and has asked nothing yet.
EventKind = Literal["command", "mention", "message", "direct", "reaction", "action", "opened"]
Visibility = Literal["public", "private"]


class HistoryMessage(BaseModel):
    """A message of a thread the bot does not own, given as context."""

    user: str
    text: str
    is_bot: bool = False


class ChatEvent(BaseModel):
    """One thing a person did, normalised by a platform adapter.

    `user` is platform-qualified (`slack:U123`), like ADMIN_USER_IDS. `thread` is the thread the
    event happened in (None: top level of the channel); `message_id` is the event's own message
    (or, for a reaction, the message reacted to).
    """

    platform: str
    workspace: str
    channel: str
    user: str
    kind: EventKind
    text: str = ""
    thread: str | None = None
    message_id: str | None = None
    command: Literal["research", "plan", "ask", "watches"] | None = None
    reaction: str | None = None
    action: Literal["retry", "continue", "export", "cancel", "approve", "feedback", "feedback_comment", "watch",
                    "watch_pause", "watch_resume", "watch_delete"] | None = None
    action_run_id: int | None = None
    # A watch's buttons name it; "Watch this" (on run `action_run_id`) carries the schedule the person chose, whose
    # time zone the core sets: the person's (`timezone`) where the platform tells it, else the workspace's.
    watch_id: int | None = None
    watch_schedule: WatchSchedule | None = None
    watch_one_thread: bool = False
    # The person's own IANA time zone, where the platform knows it (Slack's users.info `tz`, the terminal's own).
    timezone: str | None = None
    # A feedback click's verdict; a `feedback_comment` carries what was wrong in `text`.
    feedback: Literal["good", "bad"] | None = None
    event_id: str | None = None
    thread_history: list[HistoryMessage] = Field(default_factory=list)
    # Who can see the channel, when the adapter knows (None: unknown, and a new conversation is stored as private).
    channel_visibility: Visibility | None = None
    # Files shared with the event (never the bot's own uploads): sources of the conversation's research from now on.
    files: list[FileRef] = Field(default_factory=list)


class Reply(BaseModel):
    """Something the adapter must say now: privately to the event's person (where the platform allows) or in the
    thread. `text` is platform-neutral (`**bold**`, `` `code` ``, `•` lists); `person`, a platform-qualified user id,
    is mentioned where the text says `{person}` (chat.render.PERSON); `content`, when set, is said instead."""

    text: str
    private: bool = False
    person: str | None = None
    content: Content | None = None  # already rendered for the platform (a history listing); `text` is its plain form


class SuggestedPrompt(BaseModel):
    """A message a person can send with one click: `title` is shown, `message` is what gets sent."""

    title: str
    message: str


class Outcome(BaseModel):
    """What the core did with an event: replies to send, and the run it started or stopped, if any."""

    replies: list[Reply] = Field(default_factory=list)
    run_id: int | None = None
    cancelled_run_id: int | None = None
    thread: str | None = None
    # A 👎 was stored on this run: the adapter asks the person what was wrong (Slack: a modal) where it can.
    ask_what_was_wrong: int | None = None
    # What to offer a person who opened a conversation (an `opened` event), best first.
    suggestions: list[SuggestedPrompt] = Field(default_factory=list)
    # A name for the conversation this event opened with a run (its question), where the platform titles threads.
    title: str | None = None


class ConversationHandler(Protocol):
    """The conversation core as an adapter sees it."""

    async def handle(self, event: ChatEvent) -> Outcome: ...

    async def forget_workspace(self, platform: str, workspace: str) -> None:
        """Delete everything stored of a workspace the app was removed from: its threads, messages and runs."""
        ...

    async def workspace_timezone(self, platform: str, workspace: str) -> str:
        """The IANA time zone a workspace set for its watches (`/watches timezone`); UTC until one is set."""
        ...

    async def stop_watches(self, platform: str, workspace: str, *, reason: str, owner: str | None = None,
                           channel: str | None = None) -> None:
        """Stop, with `reason`, the watches of a workspace whose owner (`owner`, platform-qualified) left or whose
        channel (`channel`) is gone."""
        ...
