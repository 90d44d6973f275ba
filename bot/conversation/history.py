"""Which runs a person may see listed where they ask: their own recent runs, and the channel's.

A run's channel is public or private (a private channel, a group or a direct message), as the adapter said when its
conversation was stored. A private channel's runs are listed only in that channel, so a listing never names a run
from a channel that someone reading it there may not see.
"""

from __future__ import annotations

from sqlalchemy import Select, or_, select
from sqlalchemy.orm import Session

from chat.history import RunHistory, RunSummary
from chat.message import Place
from storage.models import Conversation, Run

HISTORY_LIMIT = 10
PUBLIC = "public"
PRIVATE = "private"


def run_history(session: Session, *, platform: str, workspace: str, channel: str, user: str,
                limit: int = HISTORY_LIMIT) -> RunHistory:
    """`user`'s latest runs that may be listed in `channel` (there, or in a public channel of the same workspace),
    and the latest runs others started in `channel`, newest first, at most `limit` of each."""
    same_workspace = (Conversation.platform == platform, Conversation.workspace == workspace)
    in_channel = Conversation.channel == channel
    yours = select(Run, Conversation).join(Conversation).where(
        *same_workspace, Run.requested_by == user, or_(in_channel, Conversation.visibility == PUBLIC))
    others = select(Run, Conversation).join(Conversation).where(*same_workspace, in_channel, Run.requested_by != user)
    return RunHistory(yours=_summaries(session, yours, limit), channel=_summaries(session, others, limit))


def _summaries(session: Session, query: Select[tuple[Run, Conversation]], limit: int) -> list[RunSummary]:
    rows = session.execute(query.order_by(Run.id.desc()).limit(limit)).all()
    return [RunSummary(run_id=run.id, mode=run.mode, state=run.state, question=run.question,
                       requested_by=run.requested_by, created_at=run.created_at,
                       thread=Place(platform=conversation.platform, workspace=conversation.workspace,
                                    channel=conversation.channel, thread=conversation.thread))
            for run, conversation in rows]
