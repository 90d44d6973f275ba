"""Why a watch's window started no run, as its thread reads it: storage says which cap refused, the chat words it."""

from __future__ import annotations

import pytest

from chat.watches import skip_words
from storage.vocabulary import SkipReason


@pytest.mark.parametrize(("reason", "words"), [
    (SkipReason("runs_per_user", 3), "its owner reached the daily limit of 3 runs"),
    (SkipReason("cost_per_workspace", 2.5), "this workspace reached its daily spending limit of $2.50"),
    (SkipReason("workspace_queue", 40), "40 runs were already waiting in this workspace, as many as may wait"),
    (SkipReason("owner_queue", 5), "its owner already had 5 runs waiting, as many as may wait"),
    (SkipReason("thread_busy"), "a run was still going in its thread"),
])
def test_every_reason_a_window_is_skipped_reads_in_plain_words(reason: SkipReason, words: str) -> None:
    assert skip_words(reason) == words
