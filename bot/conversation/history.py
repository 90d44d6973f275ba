"""Which runs a person may see listed where they ask: their own recent runs, and the channel's.

A run's channel is public or private (a private channel, a group or a direct message), as the adapter said when its
conversation was stored. A private channel's runs are listed only in that channel, so a listing never names a run
from a channel that someone reading it there may not see (`storage.conversations.listed_runs` holds that rule).
"""

from __future__ import annotations

from chat.history import RunHistory, RunSummary
from chat.message import Place
from storage.conversations import RunRow, listed_runs
from storage.db import Sessions, off_loop
from storage.watches import is_pending

HISTORY_LIMIT = 10


def run_history(sessions: Sessions, *, platform: str, workspace: str, channel: str, user: str,
                limit: int = HISTORY_LIMIT) -> RunHistory:
    """`user`'s latest runs that may be listed in `channel`, and the latest runs others started in `channel`, newest
    first, at most `limit` of each."""
    yours, others = listed_runs(sessions, platform=platform, workspace=workspace, channel=channel, user=user,
                                limit=limit)
    return RunHistory(yours=_summaries(yours), channel=_summaries(others))


arun_history = off_loop(run_history)


def _summaries(rows: list[RunRow]) -> list[RunSummary]:
    return [RunSummary(run_id=run.id, mode=run.mode, state=run.state, question=run.question,
                       requested_by=run.requested_by, created_at=run.created_at,
                       thread=Place(platform=conversation.platform, workspace=conversation.workspace,
                                    channel=conversation.channel,
                                    # A watch's run with no thread of its own (nothing changed): no link to one.
                                    thread=None if is_pending(conversation.thread) else conversation.thread))
            for run, conversation in rows]
