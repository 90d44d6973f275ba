"""Slack's events about a watch's owner or channel, through the real bolt app and conversation core on SQLite: a
deactivated owner's watches stop, a deleted or archived channel's watches stop, each saying why; other watches go
on; an uninstall forgets the workspace's watches with the rest of what is stored of it."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from storage.models import Watch
from storage.vocabulary import WatchSchedule
from storage.watches import all_watches
from tests.fakes.slack_api import FakeSlack
from tests.fakes.slack_events import SlackEventSender
from tests.unit.slack_adapter import SECRET, dispatch, listeners_finished, make_app
from tests.unit.test_slack_uninstall import core_over

TEAM, OTHER_TEAM = "T0WATCHES", "T0ELSEWHR"
ALICE, BOB = "U0ALICE01", "U0BOB0001"


@pytest.fixture(scope="module")
def slack() -> Iterator[FakeSlack]:
    with FakeSlack() as fake:
        yield fake


def add_watch(sessions: sessionmaker[Session], *, owner: str = ALICE, channel: str = "C1",
              workspace: str = TEAM) -> None:
    with sessions.begin() as session:
        session.add(Watch(platform="slack", workspace=workspace, channel=channel, thread="1.0",
                          created_by=f"slack:{owner}", question=f"{owner} in {channel}?",
                          schedule=WatchSchedule(cadence="daily", hour=9),
                          next_due_at=dt.datetime(2026, 11, 28, 9, tzinfo=dt.timezone.utc)))


def send(app: Any, event: dict[str, Any], team: str = TEAM) -> int:
    async def go() -> int:
        sender = SlackEventSender("http://bot.invalid/slack/events", SECRET, team_id=team)
        response = await dispatch(app, sender, sender.event({**event, "event_ts": sender.next_ts()}))
        await listeners_finished()
        return response.status
    return asyncio.run(go())


def states(sessions: sessionmaker[Session]) -> dict[str, tuple[str, str | None]]:
    return {watch.question: (watch.state, watch.stopped_reason) for watch in all_watches(sessions)}


def test_a_deactivated_owners_watches_stop_and_others_go_on(slack: FakeSlack,
                                                          session_factory: sessionmaker[Session]) -> None:
    add_watch(session_factory, owner=ALICE)
    add_watch(session_factory, owner=BOB)
    add_watch(session_factory, owner=ALICE, workspace=OTHER_TEAM)
    core = core_over(session_factory)
    app = make_app(slack, core)

    assert send(app, {"type": "user_change", "user": {"id": ALICE, "deleted": False}}) == 200
    assert {state for state, _ in states(session_factory).values()} == {"active"}
    assert send(app, {"type": "user_change", "user": {"id": ALICE, "deleted": True}}) == 200

    assert core.messenger.directs == []  # a deactivated person cannot be told
    mine = [watch for watch in all_watches(session_factory) if watch.workspace == TEAM]
    assert {(watch.created_by, watch.state, watch.stopped_reason) for watch in mine} == {
        (f"slack:{ALICE}", "stopped", "its owner's account was deactivated"), (f"slack:{BOB}", "active", None)}
    others = [watch for watch in all_watches(session_factory) if watch.workspace == OTHER_TEAM]
    assert [watch.state for watch in others] == ["active"]  # the same id in another workspace is another person


@pytest.mark.parametrize(("event", "words"), [
    ({"type": "channel_deleted", "channel": "C1"}, "its channel was deleted"),
    ({"type": "channel_archive", "channel": "C1", "user": BOB}, "its channel was archived"),
    ({"type": "group_archive", "channel": "C1"}, "its channel was archived"),
])
def test_a_gone_channels_watches_stop_saying_why(slack: FakeSlack, session_factory: sessionmaker[Session],
                                                 event: dict[str, Any], words: str) -> None:
    add_watch(session_factory, channel="C1")
    add_watch(session_factory, channel="C2", owner=BOB)
    core = core_over(session_factory)
    app = make_app(slack, core)

    assert send(app, event) == 200
    assert send(app, event) == 200  # Slack sends it again: nothing more happens

    assert states(session_factory) == {f"{ALICE} in C1?": ("stopped", words), f"{BOB} in C2?": ("active", None)}
    # Its owner is told once, directly; the other watch's owner is not.
    [(workspace, user, content)] = core.messenger.directs
    assert (workspace, user) == (TEAM, ALICE) and words in content.text and f"{ALICE} in C1?" in content.text


def test_an_uninstall_forgets_the_workspaces_watches(slack: FakeSlack,
                                                     session_factory: sessionmaker[Session]) -> None:
    add_watch(session_factory)
    add_watch(session_factory, workspace=OTHER_TEAM, owner=BOB)
    app = make_app(slack, core_over(session_factory))

    assert send(app, {"type": "app_uninstalled"}) == 200

    assert [watch.workspace for watch in all_watches(session_factory)] == [OTHER_TEAM]
