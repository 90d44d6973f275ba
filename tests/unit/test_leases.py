"""Leases, attempts and the reaper, on SQLite with an injected clock."""

from __future__ import annotations

import datetime as dt

from sqlalchemy.orm import Session, sessionmaker

from storage.leases import ADMITTED, MAX_ATTEMPTS, claim_undelivered, fail_unstartable, renew_lease, take_lease
from storage.models import Conversation, Run
from worker.leases import reap

NOW = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.timezone.utc)


def queued_run(sessions: sessionmaker[Session], **fields) -> int:
    with sessions.begin() as session:
        conversation = Conversation(platform="slack", workspace="T1", channel="C1", thread=f"{len(fields)}.{id(fields)}",
                                    created_by="slack:U1")
        admitted = {"celery_task_id": "task-1", "lease_owner": ADMITTED, "lease_until": NOW + dt.timedelta(seconds=120)}
        run = Run(conversation=conversation, workspace="T1", mode="research", question="q", requested_by="slack:U1",
                  **{**admitted, **fields})
        session.add(run)
        session.flush()
        return run.id


def get(sessions: sessionmaker[Session], run_id: int) -> Run:
    with sessions() as session:
        return session.get(Run, run_id)


def test_an_admitted_run_is_taken_once_and_a_second_task_finds_the_live_lease(session_factory) -> None:
    run_id = queued_run(session_factory)
    assert take_lease(session_factory, run_id, "worker-a", 30, now=NOW) == 1
    assert take_lease(session_factory, run_id, "worker-b", 30, now=NOW + dt.timedelta(seconds=5)) is None
    assert get(session_factory, run_id).state == "running"


def test_only_the_lease_owner_can_renew_it(session_factory) -> None:
    run_id = queued_run(session_factory)
    take_lease(session_factory, run_id, "worker-a", 30, now=NOW)
    assert renew_lease(session_factory, run_id, 1, "worker-a", 30)
    assert not renew_lease(session_factory, run_id, 1, "worker-b", 30)


def test_an_expired_lease_is_resubmitted_and_a_reaped_attempt_cannot_renew(session_factory) -> None:
    run_id = queued_run(session_factory)
    take_lease(session_factory, run_id, "worker-a", 30, now=NOW)
    sent: list[tuple[str, int, str]] = []
    later = NOW + dt.timedelta(seconds=31)
    assert reap(session_factory, lambda name, rid, task: sent.append((name, rid, task)), now=later) == [run_id]
    assert sent[0][:2] == ("deepthread.research", run_id)
    assert not renew_lease(session_factory, run_id, 1, "worker-a", 30)
    assert take_lease(session_factory, run_id, "worker-b", 30, now=later) == 2


def test_a_run_interrupted_too_often_is_failed_instead_of_resubmitted(session_factory) -> None:
    run_id = queued_run(session_factory, attempt=MAX_ATTEMPTS, state="running")
    with session_factory.begin() as session:
        session.get(Run, run_id).lease_until = NOW - dt.timedelta(seconds=1)
    assert reap(session_factory, lambda *args: None, now=NOW) == []
    run = get(session_factory, run_id)
    assert run.state == "failed" and "interrupted" in run.error


def test_a_run_no_worker_can_start_ends_failed_with_the_reason(session_factory) -> None:
    run_id = queued_run(session_factory)
    assert fail_unstartable(session_factory, run_id, "SLACK_BOT_TOKEN is not set", now=NOW)
    run = get(session_factory, run_id)
    assert run.state == "failed" and "SLACK_BOT_TOKEN" in run.error


def test_a_run_held_by_a_live_worker_is_not_failed_by_another(session_factory) -> None:
    run_id = queued_run(session_factory)
    take_lease(session_factory, run_id, "worker-a", 30, now=NOW)
    assert not fail_unstartable(session_factory, run_id, "nope", now=NOW + dt.timedelta(seconds=1))


def test_a_finished_run_whose_delivery_never_completed_is_claimed_once(session_factory) -> None:
    run_id = queued_run(session_factory, state="done", finished_at=NOW - dt.timedelta(minutes=10),
                        status_message={"platform": "slack", "workspace": "T1", "channel": "C1", "message_id": "1.0"})
    with session_factory.begin() as session:
        run = session.get(Run, run_id)
        run.lease_owner, run.lease_until = None, None
    assert claim_undelivered(session_factory, ["slack"], 30, now=NOW) == [run_id]
    assert claim_undelivered(session_factory, ["slack"], 30, now=NOW + dt.timedelta(seconds=1)) == []
    with session_factory.begin() as session:
        session.get(Run, run_id).delivered_at = NOW
    assert claim_undelivered(session_factory, ["slack"], 30, now=NOW + dt.timedelta(minutes=5)) == []


def test_a_terminal_run_whose_process_died_ends_failed_with_the_reason(session_factory) -> None:
    run_id = queued_run(session_factory, celery_task_id=None, lease_owner=None, lease_until=None)
    assert take_lease(session_factory, run_id, "cli-process", 30, now=NOW) == 1
    assert reap(session_factory, lambda *args: None, now=NOW + dt.timedelta(seconds=10)) == []
    assert get(session_factory, run_id).state == "running", "a live lease is left alone"
    reap(session_factory, lambda *args: None, now=NOW + dt.timedelta(seconds=31))
    run = get(session_factory, run_id)
    assert run.state == "failed" and "stopped before it finished" in run.error and run.finished_at is not None


def test_a_delivery_retry_is_claimed_when_due_without_the_grace_and_a_given_up_one_never(session_factory) -> None:
    status = {"platform": "slack", "workspace": "T1", "channel": "C1", "message_id": "1.0"}
    retrying = queued_run(session_factory, state="done", finished_at=NOW, status_message=status, lease_owner=None,
                          lease_until=None, delivery_attempts=1, delivery_retry_at=NOW + dt.timedelta(seconds=30))
    given_up = queued_run(session_factory, state="done", finished_at=NOW - dt.timedelta(hours=1), status_message=status,
                          lease_owner=None, lease_until=None, delivery_attempts=8, delivery_given_up_at=NOW)
    assert claim_undelivered(session_factory, ["slack"], 30, now=NOW + dt.timedelta(seconds=29)) == []
    assert claim_undelivered(session_factory, ["slack"], 30, now=NOW + dt.timedelta(seconds=30)) == [retrying]
    assert claim_undelivered(session_factory, ["slack"], 30, now=NOW + dt.timedelta(seconds=31)) == [], "claimed once"
    assert given_up not in claim_undelivered(session_factory, ["slack"], 30, now=NOW + dt.timedelta(days=365))
