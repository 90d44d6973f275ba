from __future__ import annotations

from chat.state import apply_event, initial_progress
from research.events import Aborted, Complete, Error, PhaseDone, PhaseStarted, Progress


def fold(events, mode="research"):
    progress = initial_progress(run_id=1, mode=mode, question="q", requested_by="slack:U1")
    for seq, event in enumerate(events, 1):
        event.seq = seq
        progress = apply_event(progress, event)
    return progress


def statuses(progress):
    return {line.name: line.status for line in progress.phases}


def test_phase_checklist_marks_done_current_and_waiting() -> None:
    progress = fold([PhaseStarted(phase="decompose"), PhaseDone(phase="decompose", counts={"sub_questions": 3}),
                     PhaseStarted(phase="search")])
    assert progress.state == "running"
    assert progress.current_phase == "search"
    assert statuses(progress)["decompose"] == "done"
    assert statuses(progress)["synthesize"] == "waiting"
    assert progress.counts["sub_questions"] == 3


def test_skipped_phases_count_as_done_when_a_later_one_starts() -> None:
    progress = fold([PhaseStarted(phase="decompose"), PhaseDone(phase="decompose"), PhaseStarted(phase="synthesize")])
    assert statuses(progress)["search"] == "done"
    assert statuses(progress)["synthesize"] == "current"


def test_terminal_events_set_the_final_state() -> None:
    assert fold([Complete(partial=True, partial_reason="time budget")]).partial_reason == "time budget"
    assert fold([Progress(percent=40), Complete()]).percent == 100
    assert fold([Aborted()]).state == "cancelled"
    failed = fold([Error(message="No search provider could answer.")])
    assert failed.state == "failed" and failed.error.startswith("No search provider")


def test_progress_never_goes_backwards() -> None:
    assert fold([Progress(percent=50), Progress(percent=30)]).percent == 50


def test_a_files_only_run_lists_no_search_or_fetch_among_its_phases() -> None:
    everything = initial_progress(run_id=1, mode="research", question="q", requested_by="slack:U1")
    files_only = initial_progress(run_id=1, mode="research", question="q", requested_by="slack:U1", files_only=True)
    assert {"search", "fetch"} <= {line.name for line in everything.phases}
    assert [line.name for line in files_only.phases] == ["decompose", "read", "synthesize", "verify"]
