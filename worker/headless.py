"""Runs started outside a chat thread (the terminal): each in a conversation of its own, queued for the workers.

Listing stored runs and exporting their reports is storage.runs.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from chat.message import Place
from storage.models import Conversation, Message, Run
from storage.vocabulary import RunMode


def create_run(sessions: sessionmaker[Session], *, place: Place, requester: str, mode: RunMode, question: str,
               options: dict[str, Any], plan: dict[str, Any] | None = None) -> int:
    """A conversation of its own in `place`'s channel and a queued run in it; returns the run id."""
    with sessions.begin() as session:
        conversation = Conversation(platform=place.platform, workspace=place.workspace, channel=place.channel,
                                    thread=uuid.uuid4().hex, created_by=requester)
        run = Run(conversation=conversation, workspace=place.workspace, mode=mode, question=question,
                  options=options, plan=plan, requested_by=requester)
        session.add_all([conversation, run,
                         Message(conversation=conversation, role="user", author=requester, text=question, mode=mode)])
        session.flush()
        return run.id
