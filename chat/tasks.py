"""A research run's progress as a task list (the phases and the sub-questions, with the pages read as sources), and
the contract of a messenger that can show one as a live, streamed message (Slack's task chunks)."""

from __future__ import annotations

from typing import Literal, Protocol, runtime_checkable

from pydantic import BaseModel, Field

from chat.message import MessageRef, Place
from chat.state import PHASE_LABELS, PhaseStatus, RunProgress
from storage.vocabulary import TERMINAL_STATES, RunState

TaskStatus = Literal["pending", "in_progress", "complete", "error"]
ProgressMode = Literal["auto", "stream", "edit"]

TASK_STATUS_OF_PHASE: dict[PhaseStatus, TaskStatus] = {
    "waiting": "pending", "current": "in_progress", "done": "complete", "failed": "error",
}
# The phase whose task lists the pages read, and the one the sub-questions follow.
READING_PHASE = "read"
PLANNING_PHASE = "decompose"
SUB_QUESTION_PREFIX = "sub-question-"
FINAL_DETAIL_OF_STATE = {"cancelled": "Stopped", "failed": "Failed", "timed_out": "Timed out"}


class TaskSource(BaseModel):
    """A page attached to a task: its address and the text shown for it."""

    url: str
    text: str


class ProgressTask(BaseModel):
    """One line of the task list: a phase or a sub-question."""

    id: str
    title: str
    status: TaskStatus
    details: str | None = None
    sources: list[TaskSource] = Field(default_factory=list)


class TaskList(BaseModel):
    """What a streamed progress message shows: a title (the question) and its tasks, in order."""

    title: str
    tasks: list[ProgressTask]

    def changed_since(self, shown: TaskList | None) -> list[ProgressTask]:
        """The tasks that are new or differ from what `shown` showed, in order."""
        before = {task.id: task for task in shown.tasks} if shown is not None else {}
        return [task for task in self.tasks if before.get(task.id) != task]


def _counted(count: int, noun: str, suffix: str = "") -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}{suffix}"


def _phase_details(name: str, counts: dict[str, int]) -> str | None:
    if name == "decompose" and counts.get("sub_questions"):
        return _counted(counts["sub_questions"], "sub-question")
    if name == "search" and counts.get("results"):
        return _counted(counts["results"], "result")
    if name in ("fetch", "read") and counts.get("pages_read"):
        return _counted(counts["pages_read"], "page", " read")
    return None


def _ended(status: TaskStatus, run_state: RunState) -> TaskStatus:
    """A task's status once the run has ended: nothing stays in progress, and nothing done is left pending."""
    if run_state == "done":
        return "complete" if status in ("pending", "in_progress") else status
    return "error" if status == "in_progress" else status


def task_list(progress: RunProgress) -> TaskList:
    """The task list of a research run at `progress`: the phases started so far (the pages read on the reading task),
    the sub-questions after the planning task."""
    ended = progress.state in TERMINAL_STATES
    tasks: list[ProgressTask] = []
    for line in progress.phases:
        status = TASK_STATUS_OF_PHASE[line.status]
        if status == "pending":
            continue  # a phase is a task once it starts: some never do (no gaps to check)
        if ended:
            status = _ended(status, progress.state)
        sources = [TaskSource(url=page.url, text=page.title or page.url) for page in progress.pages_read] \
            if line.name == READING_PHASE else []
        details = _phase_details(line.name, progress.counts)
        if status == "error" and progress.state in FINAL_DETAIL_OF_STATE:
            details = FINAL_DETAIL_OF_STATE[progress.state]
        tasks.append(ProgressTask(id=line.name, title=PHASE_LABELS.get(line.name, line.name), status=status,
                                  details=details, sources=sources))
        if line.name == PLANNING_PHASE:
            tasks.extend(_sub_question_tasks(progress, ended))
    return TaskList(title=progress.question, tasks=tasks)


def _sub_question_tasks(progress: RunProgress, ended: bool) -> list[ProgressTask]:
    gathering = _sub_question_status(progress)
    status = _ended(gathering, progress.state) if ended else gathering
    return [ProgressTask(id=f"{SUB_QUESTION_PREFIX}{number}", title=question, status=status)
            for number, question in enumerate(progress.sub_questions, start=1)]


def _sub_question_status(progress: RunProgress) -> TaskStatus:
    """Sub-questions are being answered from the first search until the report is being written."""
    statuses = {line.name: line.status for line in progress.phases}
    if statuses.get("synthesize", "waiting") != "waiting" or statuses.get("verify", "waiting") != "waiting":
        return "complete"
    if statuses.get("search", "waiting") != "waiting":
        return "in_progress"
    return "pending"


@runtime_checkable
class TaskStreaming(Protocol):
    """A messenger that can show a run's task list as a streamed message (Slack's `task_update` chunks); every method
    raises MessengerError as `Messenger`'s do."""

    def streams_tasks(self, workspace: str) -> bool:
        """Whether progress in `workspace` should be tried as a streamed task list (the setting, and what the
        workspace answered before)."""
        ...

    async def start_task_stream(self, place: Place, tasks: TaskList, *, recipient: str) -> MessageRef:
        """Open a streamed message in `place`'s thread showing `tasks`, for `recipient` (the platform user who asked)."""
        ...

    async def append_task_stream(self, ref: MessageRef, tasks: list[ProgressTask]) -> None:
        """Send the tasks that changed to the streamed message."""
        ...

    async def stop_task_stream(self, ref: MessageRef, tasks: list[ProgressTask]) -> None:
        """Send the last changes and end the stream."""
        ...

    async def show_task_list(self, ref: MessageRef, tasks: TaskList) -> None:
        """Replace the message at `ref` with `tasks` as an ordinary message (a stream that ended or was never opened)."""
        ...
