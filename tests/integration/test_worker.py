"""Real Celery workers (separate processes), real Redis, the fake LLM, providers, corpus and Slack."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import psutil
import pytest
from sqlalchemy import select

from storage.leases import DELIVERY_GRACE_SECONDS
from storage.models import Citation, Event, Passage, Run, Source
from tests.fakes.corpus import QUESTION, Corpus
from tests.fakes.llm import FakeReply
from tests.fakes.slack_api import FakeSlack
from tests.integration.workers import Cluster

pytestmark = pytest.mark.integration

CURRENT_PHASE = re.compile(r"⏳ ([^\n]+)")
REPORT_GREETING = "here is your report"
# The steps that take a model call or a search (1.6 s here) and so outlast the 0.9 s between status edits.
SLOW_PHASES = ["*Planning the research*", "*Searching the web*", "*Writing the report*"]


def make_cluster(tmp_path: Path, redis_url: str, corpus: Corpus, slack: FakeSlack, **settings: str) -> Cluster:
    from storage.redis import connect

    connect(redis_url).flushall()
    return Cluster(database_url=f"sqlite:///{tmp_path}/deepthread.db", redis_url=redis_url, corpus=corpus,
                   slack=slack, workdir=tmp_path, **settings)


def status_edits(slack: FakeSlack, cluster: Cluster, run_id: int):
    ref = cluster.run(run_id).status_message
    return slack.edits(ref["channel"], ref["message_id"])


def reports_in_thread(slack: FakeSlack, cluster: Cluster, run_id: int):
    ref = cluster.run(run_id).status_message
    return [message for message in slack.messages(ref["channel"], thread_ts=ref["thread"])
            if REPORT_GREETING in message.visible_text]


def test_research_run_edits_one_status_message_through_the_phases_and_reports_in_the_thread(
        tmp_path: Path, redis_url: str, slack: FakeSlack) -> None:
    with Corpus(llm_latency=1.6, search_latency=1.6, page_latency=1.6) as corpus:
        cluster = make_cluster(tmp_path, redis_url, corpus, slack, log_level="INFO")
        try:
            worker = psutil.Process(cluster.start_worker("w1").pid)
            # The CPU pool's processes start with the worker and load the readers, before its first run (whose
            # status edits they would otherwise slow while they import).
            cluster.wait_for(lambda: "CPU pool ready" in cluster.log("w1"), 60, "the CPU pool's processes to be ready")
            assert len(worker.children(recursive=True)) >= 2
            run_id, position = cluster.start_run(QUESTION, user="U0ALICE1")
            assert position is None
            run = cluster.wait_for_state(run_id, {"done", "failed", "cancelled", "timed_out"}, timeout=90)
            assert run.state == "done", run.error
            cluster.wait_for(lambda: reports_in_thread(slack, cluster, run_id), 20, "the report in the thread")
        finally:
            cluster.stop()
    edits = status_edits(slack, cluster, run_id)
    phases = list(dict.fromkeys(match.group(1) for edit in edits if (match := CURRENT_PHASE.search(edit.text))))
    final_texts = [edit.text for edit in edits if "⏳" not in edit.text]
    # Each step that lasts an edit interval is shown, in order; fetching and reading may pass unseen, since the
    # question's own pages (every page here) are fetched and read while the run plans.
    assert [phase for phase in phases if phase in SLOW_PHASES] == SLOW_PHASES, phases
    assert final_texts
    gaps = [later.at - earlier.at for earlier, later in zip(edits, edits[1:])]
    assert min(gaps) >= 0.9, gaps
    assert "⏳" not in edits[-1].text and "sentences verified" in edits[-1].text
    reports = reports_in_thread(slack, cluster, run_id)
    assert len(reports) == 1
    assert "<@U0ALICE1>" in reports[0].text
    with cluster.sessions() as session:
        for model in (Source, Passage, Citation, Event):
            assert session.scalars(select(model).where(model.run_id == run_id)).first() is not None


def test_ten_runs_in_one_workspace_stay_within_its_edit_budget(tmp_path: Path, redis_url: str, slack: FakeSlack) -> None:
    per_minute = 60
    with Corpus(llm_latency=0.5, search_latency=0.5, page_latency=0.5) as corpus:
        cluster = make_cluster(tmp_path, redis_url, corpus, slack, status_edits_per_minute=str(per_minute))
        try:
            cluster.start_worker("w1", concurrency=10)
            run_ids = [cluster.start_run(f"{QUESTION} ({index})", user=f"U0USER{index:02d}")[0] for index in range(10)]
            for run_id in run_ids:
                assert cluster.wait_for_state(run_id, {"done", "failed", "cancelled", "timed_out"}, 120).state == "done"
            for run_id in run_ids:
                cluster.wait_for(lambda: (edits := status_edits(slack, cluster, run_id)) and "⏳" not in edits[-1].text,
                                 90, f"run {run_id}'s final status edit")
        finally:
            cluster.stop()
    updates = sorted(call.at for call in slack.calls("chat.update"))
    assert updates
    duration = updates[-1] - updates[0]
    # A token bucket of capacity C refilled at C a minute allows at most C + C·t/60 edits in t seconds.
    assert len(updates) <= per_minute + per_minute * duration / 60 + 1, (len(updates), duration)
    for run_id in run_ids:
        edits = status_edits(slack, cluster, run_id)
        assert edits and "⏳" not in edits[-1].text, "a run's final state was not its last edit"


def test_cancel_flag_mid_fetch_stops_the_run_and_says_who(tmp_path: Path, redis_url: str, slack: FakeSlack) -> None:
    with Corpus(page_latency=8.0) as corpus:
        cluster = make_cluster(tmp_path, redis_url, corpus, slack)
        try:
            cluster.start_worker("w1")
            run_id, _ = cluster.start_run(QUESTION, user="U0ALICE1")

            def fetching() -> bool:
                with cluster.sessions() as session:
                    return session.scalars(select(Event).where(Event.run_id == run_id, Event.phase == "fetch")).first() is not None

            cluster.wait_for(fetching, 60, "the fetch phase")
            cluster.queue().cancel(run_id, "slack:U0ALICE1")
            run = cluster.wait_for_state(run_id, {"cancelled", "done", "failed"}, timeout=30)
            cluster.wait_for(lambda: "Stopped" in status_edits(slack, cluster, run_id)[-1].text, 10, "the stopped status")
        finally:
            cluster.stop()
    assert run.state == "cancelled"
    assert run.cancelled_by == "slack:U0ALICE1"
    with cluster.sessions() as session:
        assert session.scalars(select(Source).where(Source.run_id == run_id)).all()
        events = session.scalars(select(Event).where(Event.run_id == run_id).order_by(Event.seq)).all()
    # The pages take 8 s: the cancel stopped the fetch in flight, it did not wait for the phase to end.
    assert not [event for event in events if event.type == "phase_done" and event.phase == "fetch"]
    assert events[-1].type == "aborted"
    assert "<@U0ALICE1>" in status_edits(slack, cluster, run_id)[-1].text


def test_a_run_survives_its_worker_being_killed_and_reports_once(tmp_path: Path, redis_url: str, slack: FakeSlack) -> None:
    with Corpus(llm_latency=1.0, page_latency=2.0) as corpus:
        cluster = make_cluster(tmp_path, redis_url, corpus, slack, worker_lease_seconds="3", research_max_seconds="30")
        try:
            cluster.start_worker("a")
            run_id, _ = cluster.start_run(QUESTION, user="U0ALICE1")
            cluster.wait_for_state(run_id, {"running"}, timeout=60)
            cluster.kill("a")
            cluster.start_worker("b")
            run = cluster.wait_for_state(run_id, {"done", "failed", "cancelled", "timed_out"}, timeout=60)
            cluster.wait_for(lambda: reports_in_thread(slack, cluster, run_id), 20, "the report")
        finally:
            cluster.stop()
    assert run.state == "done"
    assert run.attempt >= 2
    assert len(reports_in_thread(slack, cluster, run_id)) == 1
    with cluster.sessions() as session:
        events = session.scalars(select(Event).where(Event.run_id == run_id).order_by(Event.seq)).all()
    assert [event.seq for event in events] == list(range(1, len(events) + 1))
    assert [event.type for event in events].count("complete") == 1


def test_a_worker_killed_after_posting_the_report_leaves_one_report_once_another_worker_delivers(
        tmp_path: Path, redis_url: str, slack: FakeSlack) -> None:
    with Corpus(llm_latency=0.2) as corpus:
        cluster = make_cluster(tmp_path, redis_url, corpus, slack, worker_lease_seconds="3")
        try:
            cluster.start_worker("a")
            run_id, _ = cluster.start_run(QUESTION, user="U0ALICE1")
            status = cluster.run(run_id).status_message
            # The final status edit comes after the report is posted: the worker is killed while Slack holds it.
            final_edit = slack.hold_next("chat.update", lambda params: params.get("ts") == status["message_id"]
                                         and "⏳" not in str(params.get("text")) and reports_in_thread(slack, cluster, run_id))
            assert final_edit.arrived.wait(90), cluster.log("a")
            assert len(reports_in_thread(slack, cluster, run_id)) == 1
            cluster.kill("a")
            final_edit.release.set()
            with cluster.sessions.begin() as session:
                run = session.get(Run, run_id)
                assert run.state == "done" and run.delivered_at is None
                # As if the delivery grace had passed, instead of waiting for it.
                run.finished_at -= dt.timedelta(seconds=DELIVERY_GRACE_SECONDS + 1)
            cluster.start_worker("b")
            cluster.wait_for(lambda: cluster.run(run_id).delivered_at is not None, 60, "the delivery by worker b")
        finally:
            cluster.stop()
    assert len(reports_in_thread(slack, cluster, run_id)) == 1
    assert "⏳" not in status_edits(slack, cluster, run_id)[-1].text


def test_a_users_second_run_waits_with_its_position_and_starts_when_the_first_ends(
        tmp_path: Path, redis_url: str, slack: FakeSlack) -> None:
    with Corpus(llm_latency=1.0, page_latency=1.0) as corpus:
        cluster = make_cluster(tmp_path, redis_url, corpus, slack, max_runs_per_user="1")
        try:
            cluster.start_worker("w1")
            first, first_position = cluster.start_run(QUESTION, user="U0ALICE1")
            second, second_position = cluster.start_run(f"{QUESTION} again", user="U0ALICE1")
            assert first_position is None and second_position == 1
            status = cluster.run(second).status_message
            assert "position 1 in the queue" in slack.message(status["channel"], status["message_id"]).visible_text
            cluster.wait_for_state(first, {"running"}, timeout=30)
            assert cluster.run(second).state == "queued"
            assert cluster.wait_for_state(first, {"done"}, timeout=60)
            assert cluster.run(second).started_at is None or cluster.run(second).started_at >= cluster.run(first).finished_at
            assert cluster.wait_for_state(second, {"done"}, timeout=60)
        finally:
            cluster.stop()


def test_a_run_past_its_hard_deadline_ends_timed_out_with_a_partial_report(
        tmp_path: Path, redis_url: str, slack: FakeSlack) -> None:
    with Corpus(llm_latency=0.2) as corpus:
        slow_synthesis = corpus.llm.handler

        def handler(request):
            if request.schema_name is None:
                return FakeReply(content=slow_synthesis(request), delay=30)
            return slow_synthesis(request)

        corpus.llm.handler = handler
        cluster = make_cluster(tmp_path, redis_url, corpus, slack, research_max_seconds="4",
                               worker_deadline_grace_seconds="2")
        try:
            cluster.start_worker("w1")
            run_id, _ = cluster.start_run(QUESTION, user="U0ALICE1")
            run = cluster.wait_for_state(run_id, {"done", "failed", "cancelled", "timed_out"}, timeout=60)
            cluster.wait_for(lambda: "Timed out" in status_edits(slack, cluster, run_id)[-1].text
                             or "timed out" in status_edits(slack, cluster, run_id)[-1].text, 15, "the timed-out status")
        finally:
            cluster.stop()
    assert run.state == "timed_out"
    assert run.partial and "timed out" in run.partial_reason
    assert run.report_json is not None
    with cluster.sessions() as session:
        assert session.scalars(select(Source).where(Source.run_id == run_id)).all()
