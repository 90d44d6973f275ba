"""The conversation core's world without any chat platform: a recording messenger, the test's SQLite and fakeredis."""

from __future__ import annotations

import asyncio
from typing import Any

import fakeredis
from sqlalchemy.orm import Session, sessionmaker

from bot.conversation.core import ConversationCore, CoreSettings
from bot.conversation.events import ChatEvent
from chat.slack.render import SlackRenderer
from research.report import Report
from storage.models import Run
from tests.fakes.messenger import RecordingMessenger
from tests.run_rows import finish_run
from worker.queue import Limits, Queue

ALICE, BOB, ADMIN = "slack:U0ALICE01", "slack:U0BOB0001", "slack:U0ADMIN01"


class World:
    """The conversation core over the test's database, a recording messenger and a queue that records what it sends."""

    def __init__(self, sessions: sessionmaker[Session], per_user: int = 1) -> None:
        self.sessions = sessions
        self.sent: list[tuple[str, int]] = []
        self.messenger = RecordingMessenger()
        self.queue = Queue(sessions, fakeredis.FakeRedis(), Limits(per_user=per_user, per_workspace=10),
                           lambda name, run_id, task_id: self.sent.append((name, run_id)))
        self.core = ConversationCore(sessions=sessions, queue=self.queue, messenger=self.messenger,
                                     renderer=SlackRenderer(), settings=CoreSettings(admins=frozenset({ADMIN})))

    def handle(self, **fields: Any):
        defaults = {"platform": "slack", "workspace": "T1", "channel": "C1", "user": ALICE}
        return asyncio.run(self.core.handle(ChatEvent(**{**defaults, **fields})))

    def run(self, run_id: int) -> Run:
        with self.sessions() as session:
            return session.get(Run, run_id)

    def finish(self, run_id: int, state: str = "done", report: Report | None = None, **fields: Any) -> None:
        finish_run(self.sessions, run_id, state, report, **fields)

    def status_id(self, run_id: int) -> str:
        return self.run(run_id).status_message_id


def research(world: World, text: str = "Why is the sea salty?", user: str = ALICE):
    """`/research text` from `user`."""
    return world.handle(kind="command", command="research", text=text, user=user)
