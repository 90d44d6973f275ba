"""Slack's assistant-thread methods for the fake Web API: `assistant.threads.setStatus`, `setSuggestedPrompts` and
`setTitle`, with Slack's argument names, limits and errors, and the threads a person opens in the assistant pane.

    thread_ts = slack.assistant.start_thread("D0ASSIST", user="U1")   # the pane's root message, as Slack makes it
    slack.assistant.prompts("D0ASSIST", thread_ts)                     # the last suggested prompts set there
    slack.assistant.title("D0ASSIST", thread_ts)                       # the thread's title, if one was set
    slack.assistant.statuses("D0ASSIST", thread_ts)                    # every status set there, oldest first
    slack.assistant.current_status("D0ASSIST", thread_ts)              # what the pane shows now ("" when none)

Slack clears a thread's status when the app posts in the thread, and after two minutes without a message
(`STATUS_TIMEOUT_SECONDS`, read on the fake's clock); `current_status` answers the same way.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.fakes.slack_api import FakeSlack

MAX_LOADING_MESSAGES = 10
MAX_SUGGESTED_PROMPTS = 4
STATUS_TIMEOUT_SECONDS = 120.0
ASSISTANT_THREAD_SUBTYPE = "assistant_app_thread"


@dataclass
class ThreadStatus:
    """One `assistant.threads.setStatus` as applied: the status line, its loading messages, and when (fake's clock)."""

    status: str
    loading_messages: list[str]
    at: float
    posted_at: float = field(default_factory=time.monotonic)


@dataclass
class AssistantThreadState:
    """What the assistant pane shows for one thread."""

    statuses: list[ThreadStatus] = field(default_factory=list)
    prompts: list[dict[str, str]] | None = None
    prompts_title: str | None = None
    title: str | None = None


def _json_list(value: Any) -> Any:
    """A list argument as sent in a form (a JSON string) or in JSON (a list)."""
    if isinstance(value, str) and value[:1] == "[":
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


class FakeAssistantThreads:
    """The `assistant.threads.*` methods of one FakeSlack, answering under its lock with its channels."""

    def __init__(self, slack: FakeSlack) -> None:
        self.slack = slack
        self._threads: dict[tuple[str, str], AssistantThreadState] = {}

    def handlers(self) -> dict[str, Any]:
        """The Web API methods this adds, by name."""
        return {"assistant.threads.setStatus": self._set_status,
                "assistant.threads.setSuggestedPrompts": self._set_suggested_prompts,
                "assistant.threads.setTitle": self._set_title}

    # --- the test's side -------------------------------------------------------------------------

    def start_thread(self, channel: str, *, user: str) -> str:
        """Open an assistant thread in the DM `channel` as a person does from the pane; the thread's ts."""
        from tests.fakes.slack_api import SlackMessage

        with self.slack._lock:
            ts = self.slack._next_ts()
            root = SlackMessage(channel=channel, ts=ts, text="New chat", blocks=None, thread_ts=None, user=user,
                                bot_id=None, params={"subtype": ASSISTANT_THREAD_SUBTYPE}, posted_at=time.monotonic())
            self.slack._channels.setdefault(channel, []).append(root)
            self._threads[(channel, ts)] = AssistantThreadState()
        return ts

    def statuses(self, channel: str, thread_ts: str) -> list[ThreadStatus]:
        with self.slack._lock:
            return list(self._state(channel, thread_ts).statuses)

    def current_status(self, channel: str, thread_ts: str) -> str:
        """The status the pane shows now: the last one set, unless the app posted since or it timed out."""
        with self.slack._lock:
            statuses = self._state(channel, thread_ts).statuses
            if not statuses:
                return ""
            last = statuses[-1]
            posted_since = any(message.posted_at > last.posted_at and message.bot_id
                               for message in self.slack.messages(channel, thread_ts=thread_ts))
            timed_out = self.slack.clock() - last.at > STATUS_TIMEOUT_SECONDS
            return "" if posted_since or timed_out else last.status

    def prompts(self, channel: str, thread_ts: str) -> list[dict[str, str]] | None:
        with self.slack._lock:
            return self._state(channel, thread_ts).prompts

    def prompts_title(self, channel: str, thread_ts: str) -> str | None:
        with self.slack._lock:
            return self._state(channel, thread_ts).prompts_title

    def title(self, channel: str, thread_ts: str) -> str | None:
        with self.slack._lock:
            return self._state(channel, thread_ts).title

    # --- the methods (called under the fake's lock) ----------------------------------------------

    def _state(self, channel: str, thread_ts: str) -> AssistantThreadState:
        return self._threads.setdefault((channel, thread_ts), AssistantThreadState())

    def _thread_error(self, params: dict[str, Any], *, thread_required: bool = True) -> str | None:
        channel, thread_ts = params.get("channel_id"), params.get("thread_ts")
        if not channel or (thread_required and not thread_ts):
            return "invalid_arguments"
        if str(channel) not in self.slack._channels:
            return "channel_not_found"
        if thread_ts and self.slack._find(str(channel), str(thread_ts)) is None:
            return "invalid_thread_ts"
        return None

    def _set_status(self, params: dict[str, Any]) -> dict[str, Any]:
        error = self._thread_error(params)
        status = params.get("status")
        loading = _json_list(params.get("loading_messages", []))
        if error is None and not isinstance(status, str):
            error = "invalid_arguments"
        if error is None and (not isinstance(loading, list) or len(loading) > MAX_LOADING_MESSAGES
                              or not all(isinstance(message, str) and message for message in loading)):
            error = "invalid_arguments"
        if error:
            return {"ok": False, "error": error}
        state = self._state(str(params["channel_id"]), str(params["thread_ts"]))
        state.statuses.append(ThreadStatus(status=str(status), loading_messages=list(loading), at=self.slack.clock()))
        return {"ok": True}

    def _set_suggested_prompts(self, params: dict[str, Any]) -> dict[str, Any]:
        error = self._thread_error(params, thread_required=False)
        prompts = _json_list(params.get("prompts"))
        if error is None and (not isinstance(prompts, list) or not 1 <= len(prompts) <= MAX_SUGGESTED_PROMPTS):
            error = "invalid_arguments"
        if error is None and not all(isinstance(prompt, dict) and isinstance(prompt.get("title"), str) and prompt["title"]
                                     and isinstance(prompt.get("message"), str) and prompt["message"]
                                     for prompt in prompts):
            error = "invalid_arguments"
        title = params.get("title")
        if error is None and title is not None and not isinstance(title, str):
            error = "invalid_arguments"
        if error:
            return {"ok": False, "error": error}
        channel = str(params["channel_id"])
        thread_ts = str(params.get("thread_ts") or self._latest_thread(channel))
        state = self._state(channel, thread_ts)
        state.prompts = [{"title": prompt["title"], "message": prompt["message"]} for prompt in prompts]
        state.prompts_title = title
        return {"ok": True}

    def _set_title(self, params: dict[str, Any]) -> dict[str, Any]:
        error = self._thread_error(params)
        title = params.get("title")
        if error is None and (not isinstance(title, str) or not title.strip()):
            error = "invalid_arguments"
        if error:
            return {"ok": False, "error": error}
        self._state(str(params["channel_id"]), str(params["thread_ts"])).title = str(title)
        return {"ok": True}

    def _latest_thread(self, channel: str) -> str:
        """Without `thread_ts` Slack sets the prompts for the latest message in the channel."""
        messages = self.slack._channels.get(channel) or []
        return messages[-1].ts if messages else ""
