"""Exactly-once delivery of a report, and what happens when a platform refuses it."""

from __future__ import annotations

import asyncio

from sqlalchemy.orm import Session, sessionmaker

from chat.message import Content, MessengerError, Place
from chat.slack.render import SlackRenderer, blocks_of
from chat.state import initial_progress
from research.report import Report
from storage.models import Conversation, Run
from tests.fakes.messenger import RecordingMessenger
from chat.platform import Outbound
from worker.delivery import DeliveryTarget, RunDelivery, show_queue_positions
from worker.progress import InMemoryEditBucket


def stored_run(sessions: sessionmaker[Session], attempt: int = 1) -> int:
    with sessions.begin() as session:
        conversation = Conversation(platform="slack", workspace="T1", channel="C1", thread="100.0", created_by="slack:U0ALICE01")
        run = Run(conversation=conversation, workspace="T1", mode="research", question="q", requested_by="slack:U0ALICE01",
                  state="done", attempt=attempt, report_json=Report(title="t", question="q", body_markdown="b").model_dump(mode="json"),
                  status_message={"platform": "slack", "workspace": "T1", "channel": "C1", "message_id": "101.0", "thread": "100.0"})
        session.add(run)
        session.flush()
        return run.id


def delivery(sessions: sessionmaker[Session], run_id: int, messenger: RecordingMessenger) -> RunDelivery:
    return RunDelivery(sessions, DeliveryTarget.load(sessions, run_id), messenger=messenger, renderer=SlackRenderer(), bucket=InMemoryEditBucket(),
                       min_interval=0.0)


def test_the_report_is_posted_once_in_the_thread_and_recorded(session_factory) -> None:
    run_id = stored_run(session_factory)
    messenger = RecordingMessenger()
    asyncio.run(delivery(session_factory, run_id, messenger).deliver_report(attempt=1))
    assert len(messenger.posts) == 1 and messenger.posts[0][0].thread == "100.0"
    assert "<@U0ALICE01>" in messenger.posts[0][1].text
    with session_factory() as session:
        run = session.get(Run, run_id)
        assert run.delivery_intent_at is not None and len(run.delivered_messages) == 1


def test_a_retried_delivery_edits_what_was_posted_instead_of_posting_again(session_factory) -> None:
    run_id = stored_run(session_factory)
    first = RecordingMessenger()
    asyncio.run(delivery(session_factory, run_id, first).deliver_report(attempt=1))
    again = RecordingMessenger()
    asyncio.run(delivery(session_factory, run_id, again).deliver_report(attempt=1))
    assert again.posts == []
    assert [ref.message_id for ref, _ in again.edits] == [first.posts[0][2].message_id]


def test_a_stale_attempt_cannot_deliver(session_factory) -> None:
    run_id = stored_run(session_factory, attempt=2)
    messenger = RecordingMessenger()
    asyncio.run(delivery(session_factory, run_id, messenger).deliver_report(attempt=1))
    assert messenger.posts == []


class RefusingMessenger(RecordingMessenger):
    async def post(self, place: Place, content: Content):
        if "here is your report" in content.text:
            raise MessengerError("channel_not_found")
        return await super().post(place, content)


def test_a_refused_report_is_announced_in_the_thread_not_dropped(session_factory) -> None:
    run_id = stored_run(session_factory)
    messenger = RefusingMessenger()
    progress = initial_progress(run_id=run_id, mode="research", question="q", requested_by="slack:U0ALICE01",
                                attempt=1).model_copy(update={"state": "done"})
    asyncio.run(delivery(session_factory, run_id, messenger).finish(progress))
    notices = [content.text for _, content, _ in messenger.posts]
    assert any("could not be posted (channel_not_found)" in text and f"deepthread export {run_id}" in text for text in notices)


def test_the_first_state_is_on_the_status_message_before_on_state_returns_later_ones_are_not_awaited(
    session_factory,
) -> None:
    run_id = stored_run(session_factory)
    messenger = RecordingMessenger()
    first = initial_progress(run_id=run_id, mode="research", question="q", requested_by="slack:U0ALICE01",
                             attempt=1, state="running")

    async def two_states() -> tuple[int, int]:
        run_delivery = delivery(session_factory, run_id, messenger)
        await run_delivery.on_state(first)
        edits_after_first = len(messenger.edits)
        await run_delivery.on_state(first.model_copy(update={"current_phase": "search"}))
        edits_right_after_second = len(messenger.edits)
        await run_delivery.editor.stop()
        return edits_after_first, edits_right_after_second

    after_first, right_after_second = asyncio.run(two_states())
    assert after_first == 1 and messenger.edits[0][0].message_id == "101.0"
    assert right_after_second == 1  # coalesced in the background, not waited for


def waiting_runs(sessions: sessionmaker[Session], count: int) -> list[int]:
    with sessions.begin() as session:
        run_ids = []
        for index in range(count):
            conversation = Conversation(platform="slack", workspace="T1", channel="C1", thread=f"{200 + index}.0",
                                        created_by="slack:U0ALICE01")
            run = Run(conversation=conversation, workspace="T1", mode="research", question=f"q{index}",
                      requested_by="slack:U0ALICE01", state="queued",
                      status_message={"platform": "slack", "workspace": "T1", "channel": "C1",
                                      "message_id": f"{300 + index}.0", "thread": f"{200 + index}.0"})
            session.add(run)
            session.flush()
            run_ids.append(run.id)
        return run_ids


def test_queue_positions_are_shown_in_each_waiting_runs_status_message(session_factory) -> None:
    run_ids = waiting_runs(session_factory, 3)
    messenger = RecordingMessenger()
    edited = asyncio.run(show_queue_positions(
        session_factory, [(run_id, position) for position, run_id in enumerate(run_ids, start=1)],
        platform_parts=lambda platform: Outbound(messenger=messenger, renderer=SlackRenderer()), bucket=InMemoryEditBucket()))
    assert edited == run_ids
    assert [ref.message_id for ref, _ in messenger.edits] == ["300.0", "301.0", "302.0"]
    shown = [str(content.text) + str(blocks_of(content)) for _, content in messenger.edits]
    assert all(f"position {position} in the queue" in text for position, text in enumerate(shown, start=1))


def test_queue_positions_wait_when_the_workspaces_budget_is_down_to_its_reserve(session_factory) -> None:
    run_ids = waiting_runs(session_factory, 3)
    messenger = RecordingMessenger()
    bucket = InMemoryEditBucket(capacity=4, per_seconds=3600.0)  # reserve: 1 token for phase changes

    async def refresh() -> list[int]:
        return await show_queue_positions(session_factory, [(run_id, 1) for run_id in run_ids],
                                          platform_parts=lambda platform: Outbound(messenger=messenger, renderer=SlackRenderer()), bucket=bucket)

    edited = asyncio.run(refresh())
    assert len(edited) == 3 and len(messenger.edits) == 3
    assert asyncio.run(refresh()) == []  # one token left, kept for a running run's phase change
    assert len(messenger.edits) == 3
    assert asyncio.run(bucket.take("T1", priority=True))
