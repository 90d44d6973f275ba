"""A research run's task list and its Slack chunks: phases as they start, sub-questions after the plan, pages read on
the reading task, only changes sent again, nothing left in progress once the run ends, and nothing that can ping."""

from __future__ import annotations

from chat.slack.messenger import SlackMessenger
from chat.slack.render import blocks_of
from chat.slack.tasks import plan_chunk, stream_chunks, task_list_content
from chat.state import RunProgress, apply_event, initial_progress
from chat.tasks import task_list
from research.events import Aborted, PhaseDone, PhaseStarted, PlanReady, ReadPage, SourcesRead
from tests.fakes.slack_chunks import chunk_error, chunks_error

QUESTION = "Why is the sky blue?"


def progress_after(*events) -> RunProgress:
    progress = initial_progress(run_id=1, mode="research", question=QUESTION, requested_by="slack:U1", state="running")
    for seq, event in enumerate(events, start=1):
        progress = apply_event(progress, event.model_copy(update={"seq": seq}))
    return progress


PLANNED = (PhaseStarted(phase="decompose"), PlanReady(phase="decompose", sub_questions=["What scatters light?"]),
           PhaseDone(phase="decompose", counts={"sub_questions": 1}))
READING = (*PLANNED, PhaseStarted(phase="search"), PhaseStarted(phase="fetch"), PhaseStarted(phase="read"),
           SourcesRead(phase="read", pages=[ReadPage(source_id="s1", url="https://optics.example/rayleigh",
                                                     title="Rayleigh scattering")]),
           SourcesRead(phase="read", pages=[ReadPage(source_id="s1", url="https://optics.example/rayleigh",
                                                     title="Rayleigh scattering"),
                                            ReadPage(source_id="s2", url="https://sky.example/", title="")]))


def test_phases_become_tasks_as_they_start_with_sub_questions_after_the_plan_and_pages_on_the_reading_task() -> None:
    tasks = task_list(progress_after(*READING))
    assert tasks.title == QUESTION
    assert [(task.id, task.status) for task in tasks.tasks] == [
        ("decompose", "complete"), ("sub-question-1", "in_progress"), ("search", "complete"),
        ("fetch", "complete"), ("read", "in_progress")]
    assert tasks.tasks[0].details == "1 sub-question" and tasks.tasks[1].title == "What scatters light?"
    read = tasks.tasks[-1]
    assert [(source.url, source.text) for source in read.sources] == [
        ("https://optics.example/rayleigh", "Rayleigh scattering"), ("https://sky.example/", "https://sky.example/")]


def test_the_chunks_are_slack_s_task_and_plan_updates_and_the_fake_slack_accepts_them() -> None:
    tasks = task_list(progress_after(*READING))
    chunks = stream_chunks(tasks.tasks, title=tasks.title)
    assert chunks[0] == {"type": "plan_update", "title": QUESTION}
    assert chunks[1] == {"type": "task_update", "id": "decompose", "title": "Planning the research",
                         "status": "complete", "details": "1 sub-question"}
    assert chunks[-1]["sources"] == [
        {"type": "url", "url": "https://optics.example/rayleigh", "text": "Rayleigh scattering"},
        {"type": "url", "url": "https://sky.example/", "text": "https://sky.example/"}]
    assert chunks_error(chunks) is None


def test_the_fake_slack_refuses_unknown_chunks_and_wrong_task_fields() -> None:
    assert chunk_error({"type": "thinking", "text": "hm"}) == "invalid_chunks"
    assert chunk_error({"type": "task_update", "id": "a", "title": "A", "status": "running"}) == "invalid_chunks"
    assert chunk_error({"type": "task_update", "id": "a", "title": "A", "status": "complete",
                        "sources": [{"type": "url", "url": "https://x.example"}]}) == "invalid_chunks"
    assert chunk_error({"type": "task_update", "id": "a", "name": "A", "status": "complete"}) == "invalid_chunks"
    assert chunk_error({"type": "task_update", "id": "a", "title": "A", "status": "complete", "details": "x" * 300}) \
        == "invalid_chunks"


def test_only_new_or_changed_tasks_are_sent_again() -> None:
    planned = task_list(progress_after(*PLANNED))
    reading = task_list(progress_after(*READING))
    assert [task.id for task in reading.changed_since(planned)] == ["sub-question-1", "search", "fetch", "read"]
    assert reading.changed_since(reading) == []
    assert [task.id for task in planned.changed_since(None)] == ["decompose", "sub-question-1"]


def test_an_ended_run_leaves_no_task_in_progress() -> None:
    done = task_list(progress_after(*READING).model_copy(update={"state": "done"}))
    assert {task.status for task in done.tasks} == {"complete"}
    stopped = task_list(apply_event(progress_after(*READING), Aborted(seq=20)))
    assert [(task.id, task.status, task.details) for task in stopped.tasks if task.status != "complete"] == [
        ("sub-question-1", "error", None), ("read", "error", "Stopped")]


def test_untrusted_text_cannot_ping_and_unsafe_links_are_left_out() -> None:
    progress = progress_after(PhaseStarted(phase="read"), SourcesRead(phase="read", pages=[
        ReadPage(source_id="s1", url="javascript:alert(1)", title="bad"),
        ReadPage(source_id="s2", url="https://ok.example/", title="<!channel> & <@U0OTHER>")]))
    progress = progress.model_copy(update={"question": "ping <!here> please"})
    tasks = task_list(progress)
    chunks = stream_chunks(tasks.tasks, title=tasks.title)
    assert plan_chunk(tasks.title)["title"] == "ping &lt;!here&gt; please"
    assert chunks[-1]["sources"] == [{"type": "url", "url": "https://ok.example/",
                                      "text": "&lt;!channel&gt; &amp; &lt;@U0OTHER&gt;"}]
    edited = task_list_content(tasks)
    assert "<!" not in edited.text and "<!" not in str(blocks_of(edited)) and "<@" not in str(blocks_of(edited))


def test_the_task_list_as_an_edited_message_shows_each_task_and_links_the_pages_read() -> None:
    content = task_list_content(task_list(progress_after(*READING).model_copy(update={"state": "done"})))
    blocks = blocks_of(content)
    assert ":white_check_mark: Reading pages" in blocks[0]["text"]["text"]
    assert blocks[1]["elements"][0]["text"] == ("<https://optics.example/rayleigh|Rayleigh scattering> · "
                                                "<https://sky.example/|https://sky.example/>")


def test_slack_progress_setting_decides_whether_tasks_stream() -> None:
    assert not SlackMessenger(object(), progress_mode="edit").streams_tasks("T1")  # type: ignore[arg-type]
    assert SlackMessenger(object(), progress_mode="stream").streams_tasks("T1")  # type: ignore[arg-type]
    assert SlackMessenger(object(), progress_mode="auto").streams_tasks("T1")  # type: ignore[arg-type]
