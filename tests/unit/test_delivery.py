"""Exactly-once delivery of a report, and what happens when a platform refuses it."""

from __future__ import annotations

import asyncio
import datetime as dt

from sqlalchemy.orm import Session, sessionmaker

from chat.message import Content, FileUpload, MessageRef, MessengerError, Place
from chat.slack.render import SlackRenderer, blocks_of
from chat.state import RunProgress, initial_progress
from research.report import Report
from storage.leases import claim_undelivered
from storage.models import Conversation, Run
from tests.fakes.messenger import RecordingMessenger
from chat.platform import Outbound
from worker.delivery import (
    DeliveryOutcome,
    DeliveryRetry,
    DeliveryTarget,
    RunDelivery,
    show_queue_positions,
    sweep_undelivered,
)
from worker.progress import InMemoryEditBucket

REPORT_GREETING = "here is your report"


def stored_run(sessions: sessionmaker[Session], attempt: int = 1) -> int:
    with sessions.begin() as session:
        conversation = Conversation(platform="slack", workspace="T1", channel="C1", thread="100.0", created_by="slack:U0ALICE01")
        run = Run(conversation=conversation, workspace="T1", mode="research", question="q", requested_by="slack:U0ALICE01",
                  state="done", attempt=attempt, report_json=Report(title="t", question="q", body_markdown="b").model_dump(mode="json"),
                  status_message={"platform": "slack", "workspace": "T1", "channel": "C1", "message_id": "101.0", "thread": "100.0"})
        session.add(run)
        session.flush()
        return run.id


def delivery(sessions: sessionmaker[Session], run_id: int, messenger: RecordingMessenger, *,
             retry: DeliveryRetry | None = None, clock=None) -> RunDelivery:
    return RunDelivery(sessions, DeliveryTarget.load(sessions, run_id), messenger=messenger, renderer=SlackRenderer(), bucket=InMemoryEditBucket(),
                       min_interval=0.0, retry=retry, clock=clock)


def test_the_report_is_posted_once_in_the_thread_and_recorded(session_factory) -> None:
    run_id = stored_run(session_factory)
    messenger = RecordingMessenger()
    asyncio.run(delivery(session_factory, run_id, messenger).deliver_report(attempt=1))
    assert len(messenger.posts) == 1 and messenger.posts[0][0].thread == "100.0"
    assert "<@U0ALICE01>" in messenger.posts[0][1].text
    with session_factory() as session:
        run = session.get(Run, run_id)
        assert run.delivery_intent_at is not None and len(run.delivered_messages) == 1


def test_the_attempt_s_report_is_posted_from_memory_and_a_retry_reads_the_stored_one(session_factory) -> None:
    run_id = stored_run(session_factory)  # stored with the body "b"
    in_memory = Report(title="t", question="q", body_markdown="The report the attempt holds.")
    first = RecordingMessenger()
    asyncio.run(delivery(session_factory, run_id, first).deliver_report(attempt=1, report=in_memory))
    assert "The report the attempt holds." in first.posts[0][1].text
    with session_factory() as session:
        run = session.get(Run, run_id)
        assert run.delivery_intent_at is not None and len(run.delivered_messages) == 1  # the row stays the truth
    again = RecordingMessenger()
    asyncio.run(delivery(session_factory, run_id, again).deliver_report(attempt=1))
    assert again.posts == [] and "The report the attempt holds." not in again.edits[0][1].text


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
    outcome = asyncio.run(delivery(session_factory, run_id, messenger).finish(progress))
    notices = [content.text for _, content, _ in messenger.posts]
    assert any("could not be posted (channel_not_found)" in text and f"deepthread export {run_id}" in text for text in notices)
    assert outcome == DeliveryOutcome.DELIVERED, "the notice reached the thread: nothing is left to retry"
    assert fetch(session_factory, run_id).delivered_at is not None


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


def fetch(sessions: sessionmaker[Session], run_id: int) -> Run:
    with sessions() as session:
        return session.get(Run, run_id)


class WallClock:
    """The time the delivery and the sweep read, moved only by the test."""

    def __init__(self) -> None:
        self.now = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.timezone.utc)

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)


class FlakyMessenger(RecordingMessenger):
    """A platform that answers HTTP 500 to what `failing` picks while `down`; the failed calls are not applied."""

    def __init__(self, *, posts: bool = True, edits: bool = True, only_reports: bool = False) -> None:
        super().__init__()
        self.down = True
        self.fail_posts, self.fail_edits, self.only_reports = posts, edits, only_reports
        self.refused = 0

    def _fails(self, content: Content, kind_fails: bool) -> bool:
        failing = self.down and kind_fails and (not self.only_reports or REPORT_GREETING in content.text)
        self.refused += failing
        return failing

    async def post(self, place: Place, content: Content) -> MessageRef:
        if self._fails(content, self.fail_posts):
            raise MessengerError("http_500", retryable=True)
        return await super().post(place, content)

    async def edit(self, ref: MessageRef, content: Content) -> None:
        if self._fails(content, self.fail_edits and not self.only_reports):
            raise MessengerError("http_500", retryable=True)
        await super().edit(ref, content)

    async def upload(self, place: Place, upload: FileUpload) -> MessageRef | None:
        if self.down and self.fail_posts:
            raise MessengerError("http_500", retryable=True)
        return await super().upload(place, upload)


def finished(run_id: int) -> RunProgress:
    return initial_progress(run_id=run_id, mode="research", question="q", requested_by="slack:U0ALICE01",
                            attempt=1).model_copy(update={"state": "done"})


def sweep(sessions: sessionmaker[Session], messenger: RecordingMessenger, clock: WallClock,
          retry: DeliveryRetry | None = None) -> dict[int, DeliveryOutcome]:
    return asyncio.run(sweep_undelivered(
        sessions, platforms=["slack"], lease_seconds=30, now=clock(),
        delivery_for=lambda run_id: delivery(sessions, run_id, messenger, retry=retry, clock=clock)))


def reports_posted(messenger: RecordingMessenger) -> list[Content]:
    return [content for _, content, _ in messenger.posts if REPORT_GREETING in content.text]


def test_a_report_the_platform_failed_to_take_is_not_marked_delivered_and_the_sweep_delivers_it_after_the_backoff(
    session_factory,
) -> None:
    run_id = stored_run(session_factory)
    clock, messenger = WallClock(), FlakyMessenger()
    started = clock()

    outcome = asyncio.run(delivery(session_factory, run_id, messenger, clock=clock).finish(finished(run_id)))
    run = fetch(session_factory, run_id)
    assert outcome == DeliveryOutcome.RETRY_SCHEDULED and messenger.posts == []
    assert run.delivered_at is None and run.delivery_attempts == 1
    assert run.delivery_retry_at == started + dt.timedelta(seconds=30)

    clock.advance(29)
    assert sweep(session_factory, messenger, clock) == {}, "not before the backoff"
    messenger.down = False
    clock.advance(2)
    assert sweep(session_factory, messenger, clock) == {run_id: DeliveryOutcome.DELIVERED}
    assert len(reports_posted(messenger)) == 1
    assert [ref.message_id for ref, _ in messenger.edits] == ["101.0"]
    assert "⏳" not in messenger.edits[-1][1].text, "the status shows the final state"
    assert fetch(session_factory, run_id).delivered_at is not None
    clock.advance(3600)
    assert sweep(session_factory, messenger, clock) == {}, "a delivered run is not claimed again"


def test_a_report_in_the_thread_whose_final_status_edit_failed_is_retried_without_posting_it_again(
    session_factory,
) -> None:
    run_id = stored_run(session_factory)
    clock, messenger = WallClock(), FlakyMessenger(posts=False, edits=True)

    outcome = asyncio.run(delivery(session_factory, run_id, messenger, clock=clock).finish(finished(run_id)))
    assert outcome == DeliveryOutcome.RETRY_SCHEDULED
    assert len(reports_posted(messenger)) == 1 and fetch(session_factory, run_id).delivered_at is None

    messenger.down = False
    clock.advance(31)
    assert sweep(session_factory, messenger, clock) == {run_id: DeliveryOutcome.DELIVERED}
    assert len(reports_posted(messenger)) == 1, "the retry edits the posted report instead of posting it again"
    assert "101.0" in [ref.message_id for ref, _ in messenger.edits]


def test_retries_back_off_doubling_from_the_first_delay_up_to_the_cap() -> None:
    retry = DeliveryRetry(max_attempts=8, first_delay_seconds=30, max_delay_seconds=1800)
    assert [retry.delay_after(failed) for failed in range(1, 9)] == [30, 60, 120, 240, 480, 960, 1800, 1800]
    assert retry.delay_after(10_000) == 1800


def test_after_the_last_attempt_a_final_notice_is_posted_and_the_sweep_stops(session_factory, caplog) -> None:
    run_id = stored_run(session_factory)
    clock, messenger = WallClock(), FlakyMessenger(only_reports=True)
    retry = DeliveryRetry(max_attempts=3, first_delay_seconds=30, max_delay_seconds=60)

    outcomes = [asyncio.run(delivery(session_factory, run_id, messenger, retry=retry, clock=clock).finish(finished(run_id)))]
    for wait in (30, 60):
        clock.advance(wait)
        outcomes.extend(sweep(session_factory, messenger, clock, retry).values())
    assert outcomes == [DeliveryOutcome.RETRY_SCHEDULED, DeliveryOutcome.RETRY_SCHEDULED, DeliveryOutcome.GIVEN_UP]
    assert messenger.refused == 3 and reports_posted(messenger) == []
    notices = [content.text for _, content, _ in messenger.posts]
    assert len(notices) == 1 and "could not be posted (http_500), even after 3 tries" in notices[0]
    assert f"deepthread export {run_id}" in notices[0]
    assert "⏳" not in messenger.edits[-1][1].text, "the status still shows how the run ended"
    run = fetch(session_factory, run_id)
    assert run.delivery_given_up_at is not None and run.delivered_at is None and run.delivery_attempts == 3
    clock.advance(365 * 24 * 3600)
    assert claim_undelivered(session_factory, ["slack"], 30, now=clock()) == []
    given_up = [record for record in caplog.records if "gave up delivering" in record.getMessage()]
    assert [record.levelname for record in given_up] == ["WARNING"]
    assert not any("deepthread export" in record.getMessage() for record in caplog.records), "no message text in logs"


def test_a_report_and_its_notice_refused_for_good_are_given_up_at_once(session_factory) -> None:
    run_id = stored_run(session_factory)

    class GoneChannel(RecordingMessenger):
        async def post(self, place: Place, content: Content) -> MessageRef:
            raise MessengerError("channel_not_found")

    clock = WallClock()
    outcome = asyncio.run(delivery(session_factory, run_id, GoneChannel(), clock=clock).finish(finished(run_id)))
    assert outcome == DeliveryOutcome.GIVEN_UP
    clock.advance(365 * 24 * 3600)
    assert claim_undelivered(session_factory, ["slack"], 30, now=clock()) == []


def test_a_notice_already_in_the_thread_is_not_posted_again_when_the_status_edit_is_retried(session_factory) -> None:
    run_id = stored_run(session_factory)

    class RefusingReportsEditsDown(RefusingMessenger):
        down = True

        async def edit(self, ref: MessageRef, content: Content) -> None:
            if self.down:
                raise MessengerError("http_500", retryable=True)
            await super().edit(ref, content)

    clock, messenger = WallClock(), RefusingReportsEditsDown()
    first = asyncio.run(delivery(session_factory, run_id, messenger, clock=clock).finish(finished(run_id)))
    messenger.down = False
    clock.advance(31)
    assert (first, sweep(session_factory, messenger, clock)) == (DeliveryOutcome.RETRY_SCHEDULED,
                                                                 {run_id: DeliveryOutcome.DELIVERED})
    notices = [content.text for _, content, _ in messenger.posts if "could not be posted" in content.text]
    assert len(notices) == 1
    assert not any("could not be posted" in content.text for _, content in messenger.edits), "no report edited into it"


def test_a_watch_s_run_whose_thread_was_never_opened_is_retried_by_the_sweep_even_with_its_watch_deleted(
        session_factory) -> None:
    # A watch deleted after firing sets the run's watch_id to NULL; the run still has no status message and only its
    # placeholder thread, and its first delivery had failed: the sweep must still take it up.
    clock = WallClock()
    with session_factory.begin() as session:
        conversation = Conversation(platform="slack", workspace="T1", channel="C1", thread="watch-pending:abc",
                                    created_by="slack:U0ALICE01")
        run = Run(conversation=conversation, workspace="T1", mode="research", question="q",
                  requested_by="slack:U0ALICE01", state="done", attempt=1, watch_id=None,
                  finished_at=clock() - dt.timedelta(hours=1), delivery_retry_at=clock() - dt.timedelta(seconds=1))
        session.add(run)
        session.flush()
        run_id = run.id
    assert claim_undelivered(session_factory, ["slack"], 30, now=clock()) == [run_id]
