"""A run's task list in Slack: `plan_update` and `task_update` chunks for chat.startStream/appendStream/stopStream
(slack-sdk's chunk models), and the same list as Block Kit for a message that is edited instead of streamed."""

from __future__ import annotations

from typing import Any

from slack_sdk.models.blocks.block_elements import UrlSourceElement
from slack_sdk.models.messages.chunk import PlanUpdateChunk, TaskUpdateChunk

from chat.message import Content
from chat.slack.render import context_block, escape_text, mrkdwn_link, section_block, slack_content
from chat.tasks import ProgressTask, TaskList
from chat.text import shortened, single_line
from research.report import safe_http_url

# Slack shows a streamed plan in "plan" mode (a checklist under a title) or "timeline" mode.
TASK_DISPLAY_MODE = "plan"
# Slack's limits on a task's `details` and `output` (256 characters); titles are kept as short.
TASK_TEXT_LIMIT = 256
# Sources beyond this many on one task are left out (the report lists every source anyway).
MAX_SOURCES_PER_TASK = 20
STATUS_EMOJI = {"pending": ":white_circle:", "in_progress": ":hourglass_flowing_sand:", "complete": ":white_check_mark:",
                "error": ":x:"}
SECTION_SOURCES_LIMIT = 2_500


def _plain(text: str) -> str:
    """Untrusted text (a question, a page title) on one line, within a task's limit, unable to ping."""
    return escape_text(shortened(single_line(text), TASK_TEXT_LIMIT))


def plan_chunk(title: str) -> dict[str, Any]:
    """The `plan_update` chunk naming the plan (the question)."""
    return PlanUpdateChunk(title=_plain(title)).to_dict()


def task_chunk(task: ProgressTask) -> dict[str, Any]:
    """One `task_update` chunk: the task's id, title, status, details and the http(s) pages attached to it."""
    sources = [UrlSourceElement(url=url, text=_plain(source.text))
               for source in task.sources[:MAX_SOURCES_PER_TASK] if (url := safe_http_url(source.url)) is not None]
    return TaskUpdateChunk(id=task.id, title=_plain(task.title), status=task.status,
                           details=_plain(task.details) if task.details else None,
                           sources=sources or None).to_dict()


def stream_chunks(tasks: list[ProgressTask], *, title: str | None = None) -> list[dict[str, Any]]:
    """The chunks that show `tasks` (preceded by the plan's title when given)."""
    return [*([plan_chunk(title)] if title is not None else []), *(task_chunk(task) for task in tasks)]


def task_list_content(tasks: TaskList) -> Content:
    """The task list as an ordinary message: one line a task, the pages read as links under their task."""
    lines = [f"*{escape_text(shortened(single_line(tasks.title), TASK_TEXT_LIMIT))}*"]
    for task in tasks.tasks:
        detail = f" — {escape_text(task.details)}" if task.details else ""
        lines.append(f"{STATUS_EMOJI[task.status]} {escape_text(single_line(task.title))}{detail}")
    blocks = [section_block(shortened("\n".join(lines), SECTION_SOURCES_LIMIT))]
    for task in tasks.tasks:
        links = _links_within([mrkdwn_link(source.url, shortened(single_line(source.text), TASK_TEXT_LIMIT))
                               for source in task.sources[:MAX_SOURCES_PER_TASK]], SECTION_SOURCES_LIMIT)
        if links:
            blocks.append(context_block(links))
    text = "\n".join([tasks.title, *(f"{task.status}: {task.title}" for task in tasks.tasks)])
    return slack_content(escape_text(shortened(text, SECTION_SOURCES_LIMIT)), blocks)


def _links_within(links: list[str], limit: int) -> str:
    """As many whole links as fit in `limit` characters, joined (a link cut in two would show its markup)."""
    kept: list[str] = []
    for link in links:
        if len(" · ".join([*kept, link])) > limit:
            break
        kept.append(link)
    return " · ".join(kept)
