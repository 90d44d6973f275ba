"""Slack's `app_uninstalled` through the real bolt app and the real conversation core on SQLite: the workspace's
stored threads, their messages and its runs are deleted (and, with OAuth installs, its tokens), another
workspace's are kept; a run still in flight is stopped instead, its thread left for the next prune once it ends."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import fakeredis
import pytest
from cryptography.fernet import Fernet
from slack_sdk.oauth.installation_store import Installation
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session, sessionmaker

from bot.conversation.core import ConversationCore, CoreSettings
from bot.slack.app import build_slack_app
from bot.slack.dedupe import MemoryEventDeduper
from bot.slack.oauth import oauth_installs
from chat.slack.messenger import build_slack_client
from chat.slack.render import SlackRenderer
from config import load_settings
from storage.models import Conversation, Event, Feedback, Message, Run, Source
from storage.retention import forget_workspace
from storage.shared_limits import CANCEL_FLAG
from tests.fakes.messenger import RecordingMessenger
from tests.fakes.slack_api import FAKE_CLIENT_ID, FAKE_CLIENT_SECRET, FakeSlack
from tests.fakes.slack_events import SlackEventSender
from tests.unit.slack_adapter import SECRET, dispatch, listeners_finished, make_app
from worker.queue import Limits, Queue

GONE, KEPT = "T0GONE001", "T0KEPT001"


@pytest.fixture(scope="module")
def slack() -> Iterator[FakeSlack]:
    with FakeSlack() as fake:
        yield fake


def core_over(sessions: sessionmaker[Session]) -> ConversationCore:
    queue = Queue(sessions, fakeredis.FakeRedis(), Limits(per_user=1, per_workspace=10), lambda *_: None)
    return ConversationCore(sessions=sessions, queue=queue, messenger=RecordingMessenger(), renderer=SlackRenderer(),
                            settings=CoreSettings())


def store_threads(sessions: sessionmaker[Session], workspace: str) -> None:
    """A thread with a finished run (a source, an event, a 👍) and a reply by someone who never asked anything, and a
    thread whose run is still running."""
    with sessions.begin() as session:
        for number, state in enumerate(("done", "running")):
            conversation = Conversation(platform="slack", workspace=workspace, channel="C1", thread=f"{number}.0",
                                        created_by="slack:U0ASKER01")
            run = Run(conversation=conversation, workspace=workspace, mode="research", question="q", state=state,
                      requested_by="slack:U0ASKER01")
            session.add_all([
                Message(conversation=conversation, role="user", author="slack:U0ASKER01", text="q"),
                Message(conversation=conversation, role="user", author="slack:U0BYSTAND", text="a reply in the thread"),
                run, Source(run=run, source_id="s1", url="https://example.com/"),
                Event(run=run, seq=1, type="progress", payload={}),
            ])
            if state == "done":
                session.flush()
                session.add(Feedback(run_id=run.id, user="slack:U0ASKER01", value=1))


def stored(sessions: sessionmaker[Session], workspace: str) -> dict[str, int]:
    with sessions() as session:
        runs = select(Run.id).where(Run.workspace == workspace)
        conversations = select(Conversation.id).where(Conversation.workspace == workspace)
        return {
            "conversations": session.scalar(select(func.count()).where(Conversation.id.in_(conversations))) or 0,
            "messages": session.scalar(select(func.count()).where(Message.conversation_id.in_(conversations))) or 0,
            "runs": session.scalar(select(func.count()).where(Run.id.in_(runs))) or 0,
            "sources": session.scalar(select(func.count()).where(Source.run_id.in_(runs))) or 0,
            "events": session.scalar(select(func.count()).where(Event.run_id.in_(runs))) or 0,
            "feedback": session.scalar(select(func.count()).where(Feedback.run_id.in_(runs))) or 0,
        }


EVERYTHING = {"conversations": 2, "messages": 4, "runs": 2, "sources": 2, "events": 2, "feedback": 1}
NOTHING = dict.fromkeys(EVERYTHING, 0)
# The thread whose run is still running: kept, with its run, until the run has ended.
IN_FLIGHT = {"conversations": 1, "messages": 2, "runs": 1, "sources": 1, "events": 1, "feedback": 0}


def running_run(sessions: sessionmaker[Session], workspace: str) -> Run:
    with sessions() as session:
        return session.scalars(select(Run).where(Run.workspace == workspace, Run.state == "running")).one()


async def uninstall(app, team_id: str) -> int:
    sender = SlackEventSender("http://bot.invalid/slack/events", SECRET, team_id=team_id)
    response = await dispatch(app, sender, sender.event({"type": "app_uninstalled", "event_ts": sender.next_ts()}))
    await listeners_finished()
    return response.status


def test_an_uninstall_deletes_the_workspace_s_threads_and_runs_stops_one_in_flight_and_keeps_another_s(
        slack: FakeSlack, session_factory: sessionmaker[Session]) -> None:
    for workspace in (GONE, KEPT):
        store_threads(session_factory, workspace)
    assert stored(session_factory, GONE) == EVERYTHING
    core = core_over(session_factory)
    app = make_app(slack, core)

    assert asyncio.run(uninstall(app, GONE)) == 200
    assert stored(session_factory, GONE) == IN_FLIGHT, "the running run's thread waits for its worker to stop"
    stopped = running_run(session_factory, GONE)
    assert stopped.cancelled_by == "app uninstalled", "the worker reads the stop from the row"
    assert core.queue.redis.get(CANCEL_FLAG.format(run_id=stopped.id)) == b"app uninstalled", "and from Redis"
    assert stored(session_factory, KEPT) == EVERYTHING
    assert running_run(session_factory, KEPT).cancelled_by is None

    with session_factory.begin() as session:
        session.get_one(Run, stopped.id).state = "cancelled"  # its worker saw the stop
    forget_workspace(session_factory, GONE, by="deepthread prune")  # the next `deepthread prune --workspace`
    assert stored(session_factory, GONE) == NOTHING
    assert stored(session_factory, KEPT) == EVERYTHING


def test_an_uninstall_of_an_oauth_install_deletes_its_tokens_and_what_is_stored_of_it(
        slack: FakeSlack, sqlite_engine: Engine, session_factory: sessionmaker[Session]) -> None:
    settings = load_settings(slack_client_id=FAKE_CLIENT_ID, slack_client_secret=FAKE_CLIENT_SECRET,
                             slack_signing_secret=SECRET, slack_api_url=slack.api_url,
                             deepthread_secret_key=Fernet.generate_key().decode())
    client = build_slack_client("", slack.api_url)
    installs = oauth_installs(settings, sqlite_engine, client)
    for workspace in (GONE, KEPT):
        store_threads(session_factory, workspace)
        asyncio.run(installs.store.async_save(Installation(
            app_id="A0DEEPTHREAD", team_id=workspace, user_id="U0INSTALLER", bot_token=f"xoxb-{workspace}",
            bot_id="B0BOT", bot_user_id="U0BOTUSER", bot_scopes=["chat:write"])))
    app = build_slack_app(settings, core_over(session_factory), client=client, dedupe=MemoryEventDeduper(),
                          installs=installs)

    assert asyncio.run(uninstall(app, GONE)) == 200
    assert asyncio.run(installs.store.async_find_bot(enterprise_id=None, team_id=GONE)) is None
    kept = asyncio.run(installs.store.async_find_bot(enterprise_id=None, team_id=KEPT))
    assert kept is not None and kept.bot_token == f"xoxb-{KEPT}"
    assert stored(session_factory, GONE) == IN_FLIGHT
    assert stored(session_factory, KEPT) == EVERYTHING
