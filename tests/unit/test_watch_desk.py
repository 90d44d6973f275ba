"""The conversation core's watch desk, platform-neutral: "Watch this" makes a watch in the person's time zone (or the
workspace's), `/watches` lists and changes them for their owner or an admin only, and the cap, the shortest interval
and the time zone setting refuse in plain words."""

from __future__ import annotations

import pytest

from bot.conversation.core import ConversationCore
from storage.vocabulary import WatchLimits, WatchSchedule
from storage.watches import all_watches
from tests.run_rows import one_source_report
from tests.unit.conversation_world import ADMIN, ALICE, BOB, World, research

WEEKLY = WatchSchedule(cadence="weekly", hour=9, weekday=0)
DAILY = WatchSchedule(cadence="daily", hour=7)


def finished_research(world: World, text: str = "Why is the sea salty?", user: str = ALICE) -> int:
    outcome = research(world, text, user=user)
    assert outcome.run_id is not None
    world.finish(outcome.run_id, report=one_source_report(text))
    return outcome.run_id


def watch_this(world: World, run_id: int, schedule: WatchSchedule = WEEKLY, user: str = ALICE,
               timezone: str | None = "Europe/Paris"):
    return world.handle(kind="action", action="watch", action_run_id=run_id, watch_schedule=schedule, user=user,
                        timezone=timezone)


def only_reply(outcome) -> str:
    assert len(outcome.replies) == 1 and outcome.replies[0].private
    return outcome.replies[0].text


def with_limits(world: World, limits: WatchLimits) -> None:
    core: ConversationCore = world.core
    core.watches.limits = limits


def test_watch_this_makes_a_watch_in_the_persons_time_zone_and_says_when_it_runs(world: World) -> None:
    run_id = finished_research(world)
    reply = only_reply(watch_this(world, run_id))
    [watch] = all_watches(world.sessions)
    assert watch.created_by == ALICE and watch.question == "Why is the sea salty?"
    assert watch.schedule.timezone == "Europe/Paris"
    assert watch.schedule.cadence == "weekly" and watch.schedule.weekday == 0 and watch.schedule.hour == 9
    assert "every Monday at 09:00 (Europe/Paris)" in reply and "next" in reply
    assert watch.next_due_at.astimezone(watch.next_due_at.tzinfo).weekday() == 0


def test_without_the_persons_zone_the_workspaces_is_used_utc_until_set(world: World) -> None:
    run_id = finished_research(world)
    assert "UTC" in only_reply(world.handle(kind="command", command="watches", text="timezone"))
    only_reply(watch_this(world, run_id, timezone=None))
    assert all_watches(world.sessions)[0].schedule.timezone == "UTC"
    # Only an admin sets it (admins are configured here), and only to a real zone.
    assert "Only an admin" in only_reply(world.handle(kind="command", command="watches", text="timezone Asia/Tokyo"))
    assert "unknown time zone" in only_reply(world.handle(kind="command", command="watches",
                                                         text="timezone Mars/Olympus", user=ADMIN))
    assert "Asia/Tokyo" in only_reply(world.handle(kind="command", command="watches", text="timezone Asia/Tokyo",
                                                   user=ADMIN))
    other = finished_research(world, "How deep is the sea?", user=BOB)
    only_reply(watch_this(world, other, user=BOB, timezone=None))
    assert [watch.schedule.timezone for watch in all_watches(world.sessions)] == ["UTC", "Asia/Tokyo"]


def test_only_the_owner_or_an_admin_may_pause_resume_or_delete(world: World) -> None:
    only_reply(watch_this(world, finished_research(world)))
    [watch] = all_watches(world.sessions)

    def press(action: str, user: str) -> str:
        return only_reply(world.handle(kind="action", action=action, watch_id=watch.id, user=user))

    refused = press("watch_pause", BOB)
    assert "Only the person who made this watch, or an admin" in refused
    assert all_watches(world.sessions)[0].state == "active"
    assert "paused" in press("watch_pause", ALICE)
    assert all_watches(world.sessions)[0].state == "paused"
    assert "Only the person" in only_reply(world.handle(kind="command", command="watches", text=f"resume {watch.id}",
                                                        user=BOB))
    assert "resumed" in press("watch_resume", ADMIN)
    assert all_watches(world.sessions)[0].state == "active"
    assert "Only the person" in press("watch_delete", BOB)
    assert "deleted" in press("watch_delete", ALICE)
    assert all_watches(world.sessions) == []


def test_the_listing_offers_changes_only_to_those_who_may_make_them(world: World) -> None:
    only_reply(watch_this(world, finished_research(world)))
    listing = world.handle(kind="command", command="watches", text="", user=ALICE).replies[0]
    assert listing.content is not None and "Why is the sea salty?" in listing.content.text
    watch_id = all_watches(world.sessions)[0].id
    for user, allowed in ((ALICE, True), (ADMIN, True), (BOB, False)):
        summary = world.core.watches._summary(all_watches(world.sessions)[0], user)
        assert summary.may_change is allowed, user
        assert summary.watch_id == watch_id


def test_the_workspace_cap_and_the_shortest_interval_refuse_in_plain_words(world: World) -> None:
    with_limits(world, WatchLimits(max_active=1, min_interval="weekly"))
    first = finished_research(world)
    assert "at most weekly" in only_reply(watch_this(world, first, schedule=DAILY))
    assert all_watches(world.sessions) == []
    only_reply(watch_this(world, first))
    second = finished_research(world, "How deep is the sea?")
    refusal = only_reply(watch_this(world, second))
    assert "already has 1 active watches, the most it may have" in refusal
    assert len(all_watches(world.sessions)) == 1
    # A paused watch frees its place; resuming it past the cap is refused.
    only_reply(world.handle(kind="command", command="watches", text=f"pause {all_watches(world.sessions)[0].id}"))
    only_reply(watch_this(world, second))
    assert "the most it may have" in only_reply(world.handle(kind="command", command="watches",
                                                             text=f"resume {all_watches(world.sessions)[0].id}"))


@pytest.mark.parametrize("state", ["failed", "running"])
def test_only_a_finished_research_report_can_be_watched(world: World, state: str) -> None:
    run_id = research(world).run_id
    if state == "failed":
        world.finish(run_id, state="failed")
    assert "Only a finished research report" in only_reply(watch_this(world, run_id))
    assert all_watches(world.sessions) == []


def test_the_same_question_is_not_watched_twice_in_a_channel(world: World) -> None:
    run_id = finished_research(world)
    only_reply(watch_this(world, run_id))
    assert "already watched here" in only_reply(watch_this(world, run_id, user=BOB))
    assert len(all_watches(world.sessions)) == 1


def test_a_watch_is_changed_only_from_its_own_workspace(world: World) -> None:
    only_reply(watch_this(world, finished_research(world)))
    [watch] = all_watches(world.sessions)
    elsewhere = world.handle(kind="action", action="watch_delete", watch_id=watch.id, user=ADMIN, workspace="T2")
    assert f"There is no watch #{watch.id} here" in only_reply(elsewhere)
    assert all_watches(world.sessions) == [watch]


@pytest.mark.parametrize("elsewhere", [{"workspace": "T2"}, {"channel": "C2"}, {"platform": "discord"}])
def test_only_a_run_of_the_events_own_channel_can_be_watched(world: World, elsewhere: dict[str, str]) -> None:
    run_id = finished_research(world)
    refusal = only_reply(world.handle(kind="action", action="watch", action_run_id=run_id, watch_schedule=WEEKLY,
                                      user=BOB, **elsewhere))
    assert f"There is no run {run_id} here" in refusal
    assert all_watches(world.sessions) == []
