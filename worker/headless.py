"""Runs started outside a chat thread (the terminal): each in a conversation of its own, queued for the workers.

Listing stored runs and exporting their reports is storage.runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from chat.message import Place
from storage.admission import queue_run_in_own_conversation
from storage.conversations import SharedFile
from storage.db import Sessions
from storage.vocabulary import RunMode, RunOptions


def create_run(sessions: Sessions, *, place: Place, requester: str, mode: RunMode, question: str,
               options: dict[str, Any] | RunOptions, plan: dict[str, Any] | None = None,
               files: Sequence[SharedFile] = ()) -> int:
    """A conversation of its own in `place`'s channel (with `files` shared in it) and a queued run in it; returns the
    run id."""
    return queue_run_in_own_conversation(sessions, platform=place.platform, workspace=place.workspace,
                                         channel=place.channel, requester=requester, mode=mode, question=question,
                                         options=RunOptions.model_validate(options), plan=plan, files=files)
