"""The `chunks` of chat.startStream/appendStream/stopStream as Slack checks them, and the task list they build up.

Chunk shapes as documented for chat.appendStream (and slack-sdk's `slack_sdk.models.messages.chunk`):
`{"type": "markdown_text", "text"}`, `{"type": "plan_update", "title"}`, `{"type": "blocks", "blocks"}`, and
`{"type": "task_update", "id", "title", "status": pending|in_progress|complete|error, "details"?, "output"?,
"sources"?: [{"type": "url", "url", "text"}]}`; anything else is `invalid_chunks`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

TASK_STATUSES = frozenset({"pending", "in_progress", "complete", "error"})
TASK_DISPLAY_MODES = frozenset({"timeline", "plan"})
# Slack's limit on a task's `details` and `output`.
TASK_TEXT_LIMIT = 256
FIELDS_OF_CHUNK: dict[str, tuple[frozenset[str], frozenset[str]]] = {  # type: (required, optional)
    "markdown_text": (frozenset({"text"}), frozenset()),
    "plan_update": (frozenset({"title"}), frozenset()),
    "blocks": (frozenset({"blocks"}), frozenset()),
    "task_update": (frozenset({"id", "title", "status"}), frozenset({"details", "output", "sources"})),
}


def decoded_chunks(value: Any) -> Any:
    """`chunks` as sent: a JSON body's list, or a form field's JSON string."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _source_ok(source: Any) -> bool:
    return (isinstance(source, dict) and set(source) == {"type", "url", "text"} and source["type"] == "url"
            and isinstance(source["url"], str) and source["url"].startswith(("http://", "https://"))
            and isinstance(source["text"], str) and bool(source["text"]))


def chunk_error(chunk: Any) -> str | None:
    """Why Slack refuses `chunk` (`invalid_chunks`), or None."""
    if not isinstance(chunk, dict) or chunk.get("type") not in FIELDS_OF_CHUNK:
        return "invalid_chunks"
    required, optional = FIELDS_OF_CHUNK[chunk["type"]]
    keys = set(chunk) - {"type"}
    if not required <= keys or keys - required - optional:
        return "invalid_chunks"
    if chunk["type"] == "blocks":
        return None if isinstance(chunk["blocks"], list) else "invalid_chunks"
    if not all(isinstance(chunk[name], str) for name in required):
        return "invalid_chunks"
    if chunk["type"] != "task_update":
        return None
    if chunk["status"] not in TASK_STATUSES or not chunk["id"] or not chunk["title"]:
        return "invalid_chunks"
    for name in ("details", "output"):
        if name in chunk and not (isinstance(chunk[name], str) and len(chunk[name]) <= TASK_TEXT_LIMIT):
            return "invalid_chunks"
    if "sources" in chunk and not (isinstance(chunk["sources"], list) and all(map(_source_ok, chunk["sources"]))):
        return "invalid_chunks"
    return None


def chunks_error(chunks: Any) -> str | None:
    """Why Slack refuses a call's `chunks` (None when absent or acceptable)."""
    if chunks is None:
        return None
    if not isinstance(chunks, list):
        return "invalid_chunks"
    return next((error for chunk in chunks if (error := chunk_error(chunk)) is not None), None)


@dataclass
class StreamedTasks:
    """What the task chunks of one stream add up to: the plan's title and each task as last updated, in first-seen order."""

    chunks: list[dict[str, Any]] = field(default_factory=list)

    def add(self, chunks: list[dict[str, Any]] | None) -> None:
        self.chunks.extend(chunks or [])

    @property
    def plan_title(self) -> str | None:
        titles = [chunk["title"] for chunk in self.chunks if chunk["type"] == "plan_update"]
        return titles[-1] if titles else None

    @property
    def tasks(self) -> dict[str, dict[str, Any]]:
        latest: dict[str, dict[str, Any]] = {}
        for chunk in self.chunks:
            if chunk["type"] == "task_update":
                latest[chunk["id"]] = chunk
        return latest

    def updates_of(self, task_id: str) -> list[dict[str, Any]]:
        """Every update of one task, in order."""
        return [chunk for chunk in self.chunks if chunk["type"] == "task_update" and chunk["id"] == task_id]
