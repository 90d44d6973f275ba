"""Watches on Slack, without a network: a listing's blocks (untrusted questions escaped, buttons only for those who
may change a watch, within Slack's limits), "Watch this" under research reports only, and the watch modal read back
from a submission shaped as Slack sends it."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest

from bot.slack.watches import (
    CADENCE_BLOCK,
    DAY_BLOCK,
    HOUR_BLOCK,
    THREAD_BLOCK,
    WEEKDAY_BLOCK,
    WatchContext,
    WatchForm,
    read_watch_form,
    watch_view,
)
from chat.slack.render import (
    BLOCKS_PER_MESSAGE,
    EXPORT_ACTION_ID,
    WATCH_ACTION_ID,
    WATCH_DELETE_ACTION_ID,
    WATCH_PAUSE_ACTION_ID,
    WATCH_RESUME_ACTION_ID,
    SlackRenderer,
    blocks_of,
)
from chat.watches import WatchListing, WatchSummary
from research.report import Report, WatchComparison
from storage.vocabulary import WatchSchedule, WatchState
from tests.fakes.slack_api import blocks_error
from tests.fakes.slack_interactivity import submission_state, view_error

OWNER = "slack:U0OWNER01"
MALICIOUS = "<!channel> <@U0VICTIM1> <https://evil.example|your bank> & [bank](https://evil.example/login)"
NEXT_DUE = dt.datetime(2026, 3, 2, 8, 0, tzinfo=dt.timezone.utc)
WEEKLY = WatchSchedule(cadence="weekly", hour=9, weekday=0, timezone="Europe/Paris")


def summary(watch_id: int, *, question: str = "What is new in tidal power?", state: WatchState = "active",
            may_change: bool = True) -> WatchSummary:
    return WatchSummary(watch_id=watch_id, question=question, schedule=WEEKLY, state=state,
                        stopped_reason="the channel was archived" if state == "stopped" else None,
                        next_due_at=NEXT_DUE, created_by=OWNER, may_change=may_change)


def listing_blocks(*watches: WatchSummary) -> list[dict[str, Any]]:
    content = SlackRenderer().watches(WatchListing(watches=list(watches)))
    blocks = blocks_of(content)
    assert blocks is not None and blocks_error(blocks) is None
    return blocks


def buttons_after(blocks: list[dict[str, Any]], watch_id: int) -> list[dict[str, Any]]:
    """The buttons of the actions block that follows watch `watch_id`'s section (none when no actions block does)."""
    index = next(index for index, block in enumerate(blocks)
                 if block["type"] == "section" and block["text"]["text"].startswith(f"*#{watch_id}*"))
    following = blocks[index + 1] if index + 1 < len(blocks) else {}
    return following.get("elements", []) if following.get("type") == "actions" else []


# --- the listing -------------------------------------------------------------------------------------

def test_a_question_in_a_listing_can_neither_ping_nor_forge_a_link() -> None:
    content = SlackRenderer().watches(WatchListing(watches=[summary(7, question=MALICIOUS)]))
    blocks = listing_blocks(summary(7, question=MALICIOUS))
    texts = [content.text, *(block["text"]["text"] for block in blocks if block["type"] == "section")]
    for text in texts:
        # The only Slack markup in a listing is ours: the owner's mention and the next run's date.
        assert {match.group(0)[:8] for match in re.finditer(r"<[^>]*>", text)} <= {"<@U0OWNE", "<!date^1"}, text
    assert all("&lt;!channel&gt;" in text for text in texts if "#7" in text)
    section = next(block for block in blocks if block["type"] == "section" and "#7" in block["text"]["text"])["text"]["text"]
    assert "&lt;@U0VICTIM1&gt;" in section and "&lt;https://evil.example|your bank&gt;" in section
    assert "by <@U0OWNER01>" in section and "every Monday at 09:00 (Europe/Paris)" in section


def test_buttons_appear_only_on_watches_the_person_may_change() -> None:
    blocks = listing_blocks(summary(1), summary(2, state="paused"), summary(3, state="stopped"),
                            summary(4, may_change=False))
    assert [button["action_id"] for button in buttons_after(blocks, 1)] == [WATCH_PAUSE_ACTION_ID, WATCH_DELETE_ACTION_ID]
    assert [button["action_id"] for button in buttons_after(blocks, 2)] == [WATCH_RESUME_ACTION_ID, WATCH_DELETE_ACTION_ID]
    assert [button["action_id"] for button in buttons_after(blocks, 3)] == [WATCH_RESUME_ACTION_ID, WATCH_DELETE_ACTION_ID]
    assert buttons_after(blocks, 4) == []
    for watch_id in (1, 2, 3):
        buttons = buttons_after(blocks, watch_id)
        assert {button["value"] for button in buttons} == {str(watch_id)}
        delete = buttons[-1]
        assert delete["style"] == "danger" and delete["confirm"]["style"] == "danger"
        assert delete["confirm"]["confirm"]["text"] == "Delete" and f"#{watch_id}" in delete["confirm"]["title"]["text"]
    actions = [block for block in blocks if block["type"] == "actions"]
    assert len({block["block_id"] for block in actions}) == len(actions)
    for block in actions:
        assert len({button["action_id"] for button in block["elements"]}) == len(block["elements"])


def test_only_an_active_watch_shows_its_next_run() -> None:
    blocks = listing_blocks(summary(1), summary(2, state="paused"))
    sections = {block["text"]["text"][:3]: block["text"]["text"] for block in blocks[1:] if block["type"] == "section"}
    assert "next <!date^" in sections["*#1"] and "next" not in sections["*#2"]
    assert "paused (every Monday at 09:00 (Europe/Paris))" in sections["*#2"]


def test_an_empty_listing_says_how_to_make_a_watch() -> None:
    content = SlackRenderer().watches(WatchListing())
    assert blocks_of(content) is None and "*Watch this*" in content.text


def test_a_listing_too_long_for_one_message_s_blocks_falls_back_to_text() -> None:
    watches = [summary(number, question=f"Question {number} <!channel>") for number in range(1, 31)]
    content = SlackRenderer().watches(WatchListing(watches=watches))
    assert 1 + 2 * len(watches) > BLOCKS_PER_MESSAGE and blocks_of(content) is None
    assert all(f"*#{number}* Question {number} &lt;!channel&gt;" in content.text for number in range(1, 31))
    assert "/watches pause N" in content.text and "<!channel>" not in content.text


# --- "Watch this" under a report -------------------------------------------------------------------

def last_buttons(report: Report) -> list[str]:
    delivery = SlackRenderer().report(report, requester=OWNER, run_id=42)
    blocks = blocks_of(delivery.messages[-1]) or []
    assert blocks_error(blocks) is None
    return [element["action_id"] for block in blocks if block["type"] == "actions" for element in block["elements"]]


def test_watch_this_sits_beside_export_under_a_research_report_only() -> None:
    research = Report(title="Tidal power", question="What is new in tidal power?", body_markdown="Much [1].")
    assert last_buttons(research) == [EXPORT_ACTION_ID, WATCH_ACTION_ID]
    delivery = SlackRenderer().report(research, requester=OWNER, run_id=42)
    watch = next(element for block in blocks_of(delivery.messages[-1]) or [] if block["type"] == "actions"
                 for element in block["elements"] if element["action_id"] == WATCH_ACTION_ID)
    assert (watch["value"], watch["text"]["text"]) == ("42", "Watch this")
    for mode in ("plan", "chat", "followup"):
        assert last_buttons(research.model_copy(update={"mode": mode})) == [EXPORT_ACTION_ID], mode
    assert last_buttons(research.model_copy(update={"watch": WatchComparison(previous_run_id=1)})) == [EXPORT_ACTION_ID]
    assert last_buttons(research.model_copy(update={"stopped_by_user": True})) == [EXPORT_ACTION_ID]


# --- the modal -------------------------------------------------------------------------------------

CONTEXT = WatchContext(run_id=42, channel="C0RESEARCH", thread="1710000001.000001")


def opened_view(today: dt.date = dt.date(2026, 3, 4)) -> dict[str, Any]:
    view = watch_view(CONTEXT, today=today).to_dict()
    assert view_error(view) is None
    return view


def test_the_modal_defaults_to_the_day_of_the_click() -> None:
    def initial(view: dict[str, Any], block_id: str) -> str:
        block = next(block for block in view["blocks"] if block.get("block_id") == block_id)
        return block["element"]["initial_option"]["value"]

    wednesday = opened_view(dt.date(2026, 3, 4))
    assert (initial(wednesday, WEEKDAY_BLOCK), initial(wednesday, DAY_BLOCK)) == ("2", "4")
    assert initial(opened_view(dt.date(2026, 3, 30)), DAY_BLOCK) == "31"  # the month's last day


def test_a_submitted_modal_reads_as_the_schedule_chosen() -> None:
    view = opened_view()
    state = submission_state(view, {CADENCE_BLOCK: {"cadence": "weekly"}, WEEKDAY_BLOCK: {"weekday": "0"},
                                    HOUR_BLOCK: {"hour": "9"}, THREAD_BLOCK: {"one_thread": ["one_thread"]}})
    form = read_watch_form({**view, "state": state})
    assert form == WatchForm(context=CONTEXT, schedule=WatchSchedule(cadence="weekly", hour=9, weekday=0),
                             one_thread=True)
    untouched = read_watch_form({**view, "state": submission_state(view, {CADENCE_BLOCK: {"cadence": "monthly"}})})
    assert isinstance(untouched, WatchForm) and untouched.schedule == WatchSchedule(cadence="monthly", hour=9, day=4)
    assert not untouched.one_thread


@pytest.mark.parametrize(("choices", "missing"), [
    ({CADENCE_BLOCK: {"cadence": "monthly"}, DAY_BLOCK: {"day": None}}, DAY_BLOCK),
    ({CADENCE_BLOCK: {"cadence": "weekly"}, WEEKDAY_BLOCK: {"weekday": None}}, WEEKDAY_BLOCK),
    ({CADENCE_BLOCK: {"cadence": None}}, CADENCE_BLOCK),
])
def test_a_modal_missing_what_its_cadence_needs_is_answered_beside_the_input(choices: dict[str, Any],
                                                                             missing: str) -> None:
    view = opened_view()
    errors = read_watch_form({**view, "state": submission_state(view, choices)})
    assert isinstance(errors, dict) and list(errors) == [missing]


def test_a_modal_whose_metadata_was_tampered_with_is_refused() -> None:
    view = {**opened_view(), "private_metadata": '{"run_id": "not a run"}'}
    errors = read_watch_form({**view, "state": submission_state(view, {})})
    assert isinstance(errors, dict) and CADENCE_BLOCK in errors
