"""Which run a message started: the thread's root message (a mention, a DM question, or the title the bot posted
for a slash command) or the question that asked for the thread's current run."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from bot.conversation.events import ChatEvent
from storage.models import Conversation, Message, Run
from storage.vocabulary import ACTIVE_STATES


def in_flight_run_started_by(sessions: sessionmaker[Session], event: ChatEvent) -> Run | None:
    """The queued or running run that the message the event is about started, detached; None when there is none."""
    if not event.message_id:
        return None
    with sessions() as session:
        in_place = (Conversation.platform == event.platform, Conversation.workspace == event.workspace,
                    Conversation.channel == event.channel)
        conversation_id = session.scalar(select(Conversation.id).where(*in_place, Conversation.thread == event.message_id))
        if conversation_id is None:
            conversation_id = _conversation_whose_latest_question_is(session, event, in_place)
        if conversation_id is None:
            return None
        run = session.scalar(select(Run).where(Run.conversation_id == conversation_id, Run.state.in_(ACTIVE_STATES))
                             .order_by(Run.id.desc()))
        if run is not None:
            session.expunge(run)
        return run


def _conversation_whose_latest_question_is(session: Session, event: ChatEvent, in_place: tuple) -> int | None:
    """The conversation in which the event's message is the newest question (the one its current run answers)."""
    asked = session.scalar(select(Message).join(Conversation).where(
        *in_place, Message.platform_message_id == event.message_id, Message.role == "user"))
    if asked is None:
        return None
    # An older question of the thread did not start the run in flight now.
    newest = session.scalar(select(Message.id).where(
        Message.conversation_id == asked.conversation_id, Message.role == "user", Message.mode.is_not(None))
        .order_by(Message.id.desc()).limit(1))
    return asked.conversation_id if newest == asked.id else None
