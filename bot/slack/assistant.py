"""Slack's assistant pane, through bolt's `AsyncAssistant` middleware.

A person opens an assistant thread (a thread of their DM with the app): `assistant_thread_started` becomes an
`opened` ChatEvent, and the core's suggestions (one per mode, and their last question) become the thread's
suggested prompts. A message in the thread is a direct message like any other (`SlackListeners.on_message`), so the
same modes and follow-up rules apply; when it opened the conversation with a run, its question becomes the thread's
title. The run's progress shows in the pane's status line from the worker (chat/slack/thread_status.py).
`assistant_thread_context_changed` (the channel the person is looking at) is kept in a bounded in-memory store:
nothing reads it yet, and bolt's default store would rewrite the bot's first message in the thread, which is our
status message.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from slack_bolt.context.assistant.thread_context import AssistantThreadContext
from slack_bolt.context.assistant.thread_context_store.async_store import AsyncAssistantThreadContextStore
from slack_bolt.context.async_context import AsyncBoltContext
from slack_bolt.context.save_thread_context.async_save_thread_context import AsyncSaveThreadContext
from slack_bolt.context.set_suggested_prompts.async_set_suggested_prompts import AsyncSetSuggestedPrompts
from slack_bolt.context.set_title.async_set_title import AsyncSetTitle
from slack_bolt.middleware.assistant.async_assistant import AsyncAssistant
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.web.async_client import AsyncWebClient

from bot.conversation.events import ChatEvent, ConversationHandler, Outcome
from chat.text import shortened, single_line

logger = logging.getLogger(__name__)

MAX_SUGGESTED_PROMPTS = 4
PROMPTS_TITLE = "Ask deepthread"
TITLE_CHARS = 80
REMEMBERED_CONTEXTS = 1_000

OpenedEvent = Callable[[dict[str, Any]], ChatEvent | None]
MessageListener = Callable[..., Awaitable[Outcome | None]]


def thread_title(question: str) -> str:
    """A thread title from a question: one line, at most TITLE_CHARS characters."""
    return shortened(single_line(question), TITLE_CHARS)


class MemoryThreadContextStore(AsyncAssistantThreadContextStore):
    """The channel each assistant thread's person was last looking at, for the newest REMEMBERED_CONTEXTS threads."""

    def __init__(self, limit: int = REMEMBERED_CONTEXTS) -> None:
        self.limit = limit
        self._contexts: OrderedDict[tuple[str, str], dict[str, str]] = OrderedDict()

    async def save(self, *, channel_id: str, thread_ts: str, context: dict[str, str]) -> None:
        self._contexts[(channel_id, thread_ts)] = dict(context)
        self._contexts.move_to_end((channel_id, thread_ts))
        while len(self._contexts) > self.limit:
            self._contexts.popitem(last=False)

    async def find(self, *, channel_id: str, thread_ts: str) -> AssistantThreadContext | None:
        context = self._contexts.get((channel_id, thread_ts))
        return AssistantThreadContext(context) if context and context.get("channel_id") else None


class AssistantPane:
    """The listeners of the assistant pane; bolt calls them with the arguments their parameter names ask for."""

    def __init__(self, core: ConversationHandler, *, opened_event: OpenedEvent, answer_message: MessageListener) -> None:
        self.core = core
        self.opened_event = opened_event
        self.answer_message = answer_message

    async def on_thread_started(self, body: dict[str, Any], set_suggested_prompts: AsyncSetSuggestedPrompts) -> None:
        """`assistant_thread_started`: offer the core's suggestions as the thread's suggested prompts."""
        event = self.opened_event(body)
        if event is None:
            return
        try:
            outcome = await self.core.handle(event)
        except Exception:
            logger.exception("the conversation core failed on an opened assistant thread")
            return
        prompts = [{"title": prompt.title, "message": prompt.message}
                   for prompt in outcome.suggestions[:MAX_SUGGESTED_PROMPTS]]
        if not prompts:
            return
        try:
            await set_suggested_prompts(prompts=prompts, title=PROMPTS_TITLE)
        except (SlackApiError, SlackClientError, OSError) as error:
            logger.warning("could not set the suggested prompts (%s)", type(error).__name__)

    async def on_context_changed(self, payload: dict[str, Any], save_thread_context: AsyncSaveThreadContext) -> None:
        """`assistant_thread_context_changed`: remember the channel the person is now looking at."""
        context = (payload.get("assistant_thread") or {}).get("context") or {}
        await save_thread_context(context)

    async def on_user_message(self, body: dict[str, Any], client: AsyncWebClient, context: AsyncBoltContext,
                              set_title: AsyncSetTitle) -> None:
        """A message in an assistant thread: answered as a direct message; titles the thread when it opened one."""
        outcome = await self.answer_message(body=body, client=client, context=context)
        if outcome is None or not outcome.title:
            return
        try:
            await set_title(thread_title(outcome.title))
        except (SlackApiError, SlackClientError, OSError) as error:
            logger.info("could not title the assistant thread (%s)", type(error).__name__)


def build_assistant(core: ConversationHandler, *, opened_event: OpenedEvent, answer_message: MessageListener,
                    context_store: AsyncAssistantThreadContextStore | None = None) -> AsyncAssistant:
    """Bolt's assistant middleware wired to the pane's listeners (give it to `app.assistant`)."""
    pane = AssistantPane(core, opened_event=opened_event, answer_message=answer_message)
    assistant = AsyncAssistant(thread_context_store=context_store or MemoryThreadContextStore(), logger=logger)
    assistant.thread_started(pane.on_thread_started)
    assistant.thread_context_changed(pane.on_context_changed)
    assistant.user_message(pane.on_user_message)
    return assistant
