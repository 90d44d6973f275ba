"""Feedback without Slack: the core storing 👍/👎 and comments, the feedback block under a report, `deepthread runs`
counting them, and the fake Web API's trigger rules for the "what was wrong?" modal."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from bot.cli import app
from chat.slack.feedback import FEEDBACK_ACTION_ID, feedback_value, parse_feedback_value
from chat.slack.render import SlackRenderer
from research.report import Report, ReportSource
from storage.db import make_engine, make_session_factory
from storage.migrate import upgrade
from storage.models import Conversation, Feedback, Run
from tests.fakes.clock import FakeClock
from tests.fakes.slack_interactivity import SlackViews, context_actions_error
from tests.unit.conversation_world import ALICE, BOB, World, research

WHAT_WAS_WRONG = "The second figure is from 2019, not 2024."


def feedback_rows(world: World) -> list[tuple[int, str, int, str | None]]:
    with world.sessions() as session:
        return [(row.run_id, row.user, row.value, row.comment)
                for row in session.scalars(select(Feedback).order_by(Feedback.id))]


def click(world: World, run_id: int, verdict: str, user: str = ALICE, channel: str = "C1"):
    return world.handle(kind="action", action="feedback", feedback=verdict, action_run_id=run_id, user=user,
                        channel=channel)


def test_a_thumbs_up_is_stored_once_per_person_and_a_second_click_changes_it(world: World) -> None:
    run_id = research(world).run_id
    assert click(world, run_id, "good").ask_what_was_wrong is None
    assert click(world, run_id, "good", user=BOB).replies == []
    click(world, run_id, "bad", user=BOB)
    assert feedback_rows(world) == [(run_id, ALICE, 1, None), (run_id, BOB, -1, None)]


def test_each_click_is_counted_in_the_process_metrics_by_verdict(world: World) -> None:
    from prometheus_client import REGISTRY

    from ops.metrics import process_metrics

    process_metrics()  # the counters exist from here on

    def counted(verdict: str) -> float:
        return REGISTRY.get_sample_value("deepthread_feedback_total", {"verdict": verdict}) or 0.0

    before = counted("good"), counted("bad")
    run_id = research(world).run_id
    click(world, run_id, "good")
    click(world, run_id, "bad", user=BOB)
    click(world, run_id, "bad")
    assert (counted("good") - before[0], counted("bad") - before[1]) == (1, 2)


def test_a_thumbs_down_asks_what_was_wrong_and_the_answer_lands_on_that_row(world: World) -> None:
    run_id = research(world).run_id
    assert click(world, run_id, "bad").ask_what_was_wrong == run_id
    world.handle(kind="action", action="feedback_comment", action_run_id=run_id, text=f"  {WHAT_WAS_WRONG}\n")
    assert feedback_rows(world) == [(run_id, ALICE, -1, WHAT_WAS_WRONG)]


def test_feedback_from_another_channel_is_refused_and_not_stored(world: World) -> None:
    run_id = research(world).run_id
    outcome = click(world, run_id, "good", channel="C2")
    assert outcome.replies[0].private and "another conversation" in outcome.replies[0].text
    assert feedback_rows(world) == []


def small_report(model: str | None = "gpt-test-1") -> Report:
    return Report(question="Why?", title="Why", body_markdown="## Why\n\nBecause [1].", model=model,
                  sources=[ReportSource(number=1, source_id="s1", title="A source", url="https://example.com/a")])


@pytest.mark.parametrize("use_markdown_blocks", [True, False])
def test_a_delivered_report_ends_with_feedback_buttons_naming_its_run(use_markdown_blocks: bool) -> None:
    delivery = SlackRenderer(use_markdown_blocks=use_markdown_blocks).report(small_report(), requester="slack:U1", run_id=9)
    last = delivery.messages[-1].extra["slack"]["blocks"][-1]
    assert last["type"] == "context_actions" and not context_actions_error(last)
    buttons = last["elements"][0]
    assert (buttons["type"], buttons["action_id"]) == ("feedback_buttons", FEEDBACK_ACTION_ID)
    assert parse_feedback_value(buttons["positive_button"]["value"]) == ("good", 9)
    assert parse_feedback_value(buttons["negative_button"]["value"]) == ("bad", 9)
    earlier = [block for message in delivery.messages[:-1] for block in message.extra["slack"]["blocks"]]
    assert all(block["type"] != "context_actions" for block in earlier)


def test_feedback_values_that_name_no_verdict_or_run_are_not_understood() -> None:
    assert parse_feedback_value(feedback_value("bad", 12)) == ("bad", 12)
    for value in ("meh:12", "good:", "good:12x", "12", ""):
        assert parse_feedback_value(value) is None


def test_deepthread_runs_shows_each_run_s_thumbs_up_and_down_counts(tmp_path, monkeypatch) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    engine = make_engine(url)
    upgrade(url, engine=engine)
    now = dt.datetime(2026, 12, 2, tzinfo=dt.timezone.utc)
    with make_session_factory(engine).begin() as session:
        conversation = Conversation(platform="slack", workspace="T1", channel="C1", thread="1.0", created_by=ALICE)
        rated = Run(conversation=conversation, workspace="T1", mode="research", question="rated question",
                    requested_by=ALICE, state="done")
        unrated = Run(conversation=conversation, workspace="T1", mode="chat", question="unrated question",
                      requested_by=ALICE, state="done")
        session.add_all([rated, unrated])
        session.flush()
        session.add_all([Feedback(run_id=rated.id, user=user, value=value, created_at=now, updated_at=now)
                         for user, value in ((ALICE, 1), (BOB, 1), ("slack:U0CAROL01", -1))])
    engine.dispose()
    monkeypatch.setenv("DATABASE_URL", url)
    lines = CliRunner().invoke(app, ["runs"]).output.splitlines()
    assert "FEEDBACK" in lines[0]
    assert "👍 2 👎 1" in next(line for line in lines if "rated question" in line and "unrated" not in line)
    assert "👍" not in next(line for line in lines if "unrated question" in line)


# --- the fake Web API's views.open ------------------------------------------------------------------

MODAL = {"type": "modal", "title": {"type": "plain_text", "text": "What was wrong?"},
         "submit": {"type": "plain_text", "text": "Send"},
         "blocks": [{"type": "input", "block_id": "b", "label": {"type": "plain_text", "text": "What"},
                     "element": {"type": "plain_text_input", "action_id": "a"}}]}


def test_fake_views_open_honours_slack_s_trigger_rules() -> None:
    clock = FakeClock()
    views = SlackViews(team_id="T1", clock=clock)
    assert views.open({"trigger_id": "12.34.abcd", "view": MODAL})["error"] == "invalid_trigger_id"
    fresh = views.issue_trigger_id(user="U1")
    assert views.open({"trigger_id": fresh, "view": {**MODAL, "submit": None}})["error"] == "invalid_arguments"
    opened = views.open({"trigger_id": fresh, "view": MODAL})
    assert opened["ok"] and views.opened()[0].input_ids() == [("b", "a")]
    assert views.open({"trigger_id": fresh, "view": MODAL})["error"] == "exchanged_trigger_id"
    stale = views.issue_trigger_id(user="U1")
    clock.advance(3.5)
    assert views.open({"trigger_id": stale, "view": MODAL})["error"] == "expired_trigger_id"
