"""The conversation's rules, one test each (numbered as in bot/conversation/rules.py's docstring): decide() alone,
over views built in memory — no database, no queue, no platform."""

from __future__ import annotations

import ast
import dataclasses
import datetime as dt
import itertools
import re
from pathlib import Path
from typing import Any

import pytest

from bot.conversation import rules
from bot.conversation.commands import HELP, MAX_QUESTION_CHARS
from research.files import FileRef
from bot.conversation.events import ChatEvent, HistoryMessage
from bot.conversation.rules import (
    Cancel,
    CoreSettings,
    Export,
    RecordFeedback,
    Say,
    ShowHistory,
    StartRun,
    Suggest,
    View,
    decide,
)
from storage.conversations import HistoryTurn, ThreadView
from storage.models import Conversation, Run
from storage.quotas import QuotaReached
from storage.vocabulary import RunOptions

ALICE, BOB, ADMIN = "slack:U0ALICE01", "slack:U0BOB0001", "slack:U0ADMIN01"
NOW = dt.datetime(2026, 11, 27, 18, 0, tzinfo=dt.timezone.utc)
SETTINGS = CoreSettings(admins=frozenset({ADMIN}), cancel_emoji=frozenset({"x"}), max_queued_per_user=3)
THREAD = "1700000000.000100"
PLAN = {"steps": [{"query": "sea salt sources"}]}
REPORT = {"title": "On salt", "sources": [{"number": 1, "url": "https://example.org/a"}]}
_ids = itertools.count(1)


def event(**fields: Any) -> ChatEvent:
    defaults = {"platform": "slack", "workspace": "T1", "channel": "C1", "user": ALICE, "kind": "message"}
    return ChatEvent(**{**defaults, **fields})


def reply_in_thread(text: str, **fields: Any) -> ChatEvent:
    return event(text=text, thread=THREAD, **fields)


def run(mode: str = "research", state: str = "done", *, by: str = ALICE, question: str = "Why is the sea salty?",
        options: RunOptions | None = None, plan: dict[str, Any] | None = None,
        report: dict[str, Any] | None = None) -> Run:
    """A run as the view holds it: a detached row, never stored."""
    return Run(id=next(_ids), conversation_id=1, workspace="T1", mode=mode, state=state, requested_by=by,
               question=question, options=options or RunOptions(), plan=plan, report_json=report,
               status_message={"platform": "slack", "workspace": "T1", "channel": "C1", "message_id": "9.9"})


def thread(*runs: Run, channel: str = "C1") -> ThreadView:
    conversation = Conversation(id=1, platform="slack", workspace="T1", channel=channel, thread=THREAD,
                                created_by=ALICE, visibility="public")
    return ThreadView(conversation=conversation, runs=list(runs))


def view(**fields: Any) -> View:
    return View(now=NOW, **fields)


def only(actions: list[rules.Action]) -> rules.Action:
    assert len(actions) == 1, actions
    return actions[0]


def private_text(actions: list[rules.Action]) -> str:
    said = only(actions)
    assert isinstance(said, Say) and said.reply.private
    return said.reply.text


# 1. help
@pytest.mark.parametrize("ask", [event(kind="command", command="research", text="help"), event(kind="mention", text="help"),
                                 reply_in_thread("help")])
def test_1_help_is_answered_privately_and_starts_nothing(ask: ChatEvent) -> None:
    assert private_text(decide(ask, view(thread=thread(run())), SETTINGS)) == HELP


# 2. history
def test_2_history_lists_runs_privately() -> None:
    assert decide(event(kind="command", command="research", text="history"), view(), SETTINGS) == [ShowHistory()]


# 3. modes
@pytest.mark.parametrize(("ask", "mode"), [
    (event(kind="command", command="research", text="q"), "research"), (event(kind="command", command="plan", text="q"), "plan"),
    (event(kind="command", command="ask", text="q"), "chat"), (event(kind="mention", text="q", message_id="5.5"), "chat"),
    (event(kind="direct", text="research: q", message_id="5.5"), "research"),
    (event(kind="mention", text="plan: q", message_id="5.5"), "plan")])
def test_3_commands_and_prefixes_pick_the_mode(ask: ChatEvent, mode: str) -> None:
    start = only(decide(ask, view(), SETTINGS))
    assert isinstance(start, StartRun) and (start.mode, start.question) == (mode, "q")


# 4. usage
def test_4_a_request_that_cannot_run_gets_the_problem_privately() -> None:
    assert private_text(decide(event(kind="command", command="research", text="   --quick "), view(), SETTINGS)).startswith("Usage:")
    too_long = event(kind="command", command="research", text="why " * 600)
    assert f"{MAX_QUESTION_CHARS:,}" in private_text(decide(too_long, view(), SETTINGS))


# 5. own thread
def test_5_a_command_in_a_channel_opens_a_thread_titled_with_mode_and_question() -> None:
    start = only(decide(event(kind="command", command="plan", text="Why is the sea salty? --deep"), view(), SETTINGS))
    assert isinstance(start, StartRun)
    assert (start.thread, start.title, start.options) == (None, "Research plan: Why is the sea salty?", RunOptions(preset="deep"))


# 6. queue cap
def test_6_a_person_at_the_queue_cap_is_refused() -> None:
    ask = event(kind="command", command="research", text="q")
    assert "3 runs waiting" in private_text(decide(ask, view(waiting_runs=3), SETTINGS))
    assert isinstance(only(decide(ask, view(waiting_runs=2), SETTINGS)), StartRun)


def test_6_a_workspace_at_its_queue_cap_refuses_anyone_a_new_run_unless_the_cap_is_off() -> None:
    capped = CoreSettings(max_queued_per_user=3, max_queued_per_workspace=20)
    ask = event(kind="mention", text="q", message_id="5.5")
    assert private_text(decide(ask, view(workspace_waiting_runs=20), capped)) == (
        "This workspace already has 20 runs waiting in the queue (the limit is 20). They start as earlier ones "
        "finish; please ask again in a little while.")
    assert isinstance(only(decide(ask, view(workspace_waiting_runs=19), capped)), StartRun)
    off = CoreSettings(max_queued_per_user=3, max_queued_per_workspace=0)
    assert isinstance(only(decide(ask, view(workspace_waiting_runs=500), off)), StartRun)


# 7. daily quotas
def test_7_a_run_over_a_daily_quota_is_refused_with_its_reset_time() -> None:
    reached = QuotaReached(limit="runs_per_user", used=5, allowed=5, resets_at=NOW + dt.timedelta(hours=6))
    text = private_text(decide(event(kind="mention", text="q", message_id="5.5"), view(quota=reached), SETTINGS))
    assert "daily limit of 5" in text and "00:00 UTC" in text


# 8. one in flight
def test_8_a_new_run_in_a_busy_thread_is_refused_with_how_to_stop_it() -> None:
    busy = view(thread=thread(run(state="running")))
    assert "already in progress" in private_text(decide(reply_in_thread("and the ocean?"), busy, SETTINGS))
    mention = event(kind="mention", text="again?", thread=THREAD)
    assert "already in progress" in private_text(decide(mention, busy, SETTINGS))


# 9. joining late
def test_9_a_mention_in_a_thread_we_do_not_own_starts_a_conversation_with_its_history() -> None:
    mention = event(kind="mention", text="what did they decide?", thread=THREAD, message_id="5.5",
                    thread_history=[HistoryMessage(user=BOB, text="we chose tides"),
                                    HistoryMessage(user="slack:B1", text="noted", is_bot=True)])
    start = only(decide(mention, view(), SETTINGS))
    assert isinstance(start, StartRun) and start.thread == THREAD and start.names_conversation
    assert start.history == (HistoryTurn(BOB, "we chose tides", False), HistoryTurn("slack:B1", "noted", True))


# 10. not ours
def test_10_a_plain_reply_in_a_thread_we_do_not_own_is_ignored() -> None:
    assert decide(reply_in_thread("lunch?"), view(), SETTINGS) == []


# 11. cancel
def test_11_cancel_stops_the_run_in_flight_for_its_requester_or_an_admin_only() -> None:
    running = run(state="running")
    busy = view(thread=thread(running))
    assert decide(reply_in_thread("cancel"), busy, SETTINGS) == [Cancel(running)]
    assert decide(reply_in_thread("stop", user=ADMIN), busy, SETTINGS) == [Cancel(running)]
    refused = only(decide(reply_in_thread("cancel", user=BOB), busy, SETTINGS))
    assert isinstance(refused, Say) and refused.reply.person == ALICE and "can stop it" in refused.reply.text
    assert private_text(decide(reply_in_thread("cancel"), view(thread=thread(run())), SETTINGS)) == rules.NOTHING_RUNNING
    reaction = event(kind="reaction", reaction="x", message_id="9.9")
    assert decide(reaction, view(target=running, target_thread=busy.thread), SETTINGS) == [Cancel(running)]
    finished = run()
    assert decide(reaction, view(target=finished, target_thread=thread(finished)), SETTINGS) == []


# 12. export
def test_12_export_attaches_the_newest_report_or_says_there_is_none() -> None:
    reported, chat = run(report=REPORT), run(mode="chat", report=None)
    assert decide(reply_in_thread("export html"), view(thread=thread(reported, chat)), SETTINGS) == [
        Export(reported, THREAD, "html")]
    assert private_text(decide(reply_in_thread("export"), view(thread=thread(chat)), SETTINGS)) == rules.NO_REPORT_TO_EXPORT


# 13. plan approval
def test_13_approving_a_plan_runs_it_as_research_for_its_requester_or_an_admin() -> None:
    plan_run = run(mode="plan", question=f"Why is the sea salty?{rules.REVISION_MARKER}add estuaries",
                   options=RunOptions(sites=["noaa.gov"]), report={"plan": PLAN})
    start = only(decide(reply_in_thread("go"), view(thread=thread(plan_run)), SETTINGS))
    assert isinstance(start, StartRun)
    assert (start.mode, start.question, start.plan, start.options) == ("research", "Why is the sea salty?", PLAN,
                                                                       RunOptions(sites=["noaa.gov"]))
    assert "Only the person who asked" in private_text(decide(reply_in_thread("go", user=BOB), view(thread=thread(plan_run)), SETTINGS))
    empty = run(mode="plan", report={"plan": None})
    assert "no steps" in private_text(decide(reply_in_thread("go"), view(thread=thread(empty)), SETTINGS))
    approve = event(kind="reaction", reaction="white_check_mark", message_id="9.9")
    assert isinstance(only(decide(approve, view(target=plan_run, target_thread=thread(plan_run)), SETTINGS)), StartRun)


# 14. plan revision
def test_14_any_other_reply_after_a_plan_revises_it_for_its_requester_only() -> None:
    plan_run = run(mode="plan", report={"plan": PLAN}, options=RunOptions(preset="quick"))
    revised = only(decide(reply_in_thread("add estuaries --site noaa.gov"), view(thread=thread(plan_run)), SETTINGS))
    assert isinstance(revised, StartRun) and revised.mode == "plan"
    assert revised.question == f"Why is the sea salty?{rules.REVISION_MARKER}add estuaries"
    assert revised.options == RunOptions(preset="quick", sites=["noaa.gov"])
    assert "revise or approve" in private_text(decide(reply_in_thread("more", user=BOB), view(thread=thread(plan_run)), SETTINGS))
    long_plan = run(mode="plan", question="q" * (MAX_QUESTION_CHARS * 2), report={"plan": PLAN})
    assert "revised too much" in private_text(decide(reply_in_thread("more"), view(thread=thread(long_plan)), SETTINGS))


# 15. retry
def test_15_retry_runs_a_finished_run_again_as_it_was() -> None:
    failed = run(state="failed", options=RunOptions(since="2024-01-01"), plan=PLAN)
    start = only(decide(reply_in_thread("retry"), view(thread=thread(failed)), SETTINGS))
    assert isinstance(start, StartRun)
    assert (start.mode, start.question, start.plan, start.options) == ("research", failed.question, PLAN, failed.options)


# 16. continue
def test_16_continue_and_dig_deeper_run_more_research_keeping_the_options() -> None:
    report_run = run(report=REPORT, options=RunOptions(sites=["noaa.gov"], preset="deep"))
    again = only(decide(reply_in_thread("continue"), view(thread=thread(report_run)), SETTINGS))
    deeper = only(decide(reply_in_thread("dig deeper on estuaries --quick"), view(thread=thread(report_run)), SETTINGS))
    assert isinstance(again, StartRun) and isinstance(deeper, StartRun)
    assert (again.mode, again.question, again.options) == ("research", report_run.question, report_run.options)
    assert (deeper.question, deeper.options) == ("on estuaries", RunOptions(sites=["noaa.gov"], preset="quick"))


# 17. follow-ups
def test_17_a_reply_after_a_report_with_sources_is_answered_from_its_passages() -> None:
    report_run = run(report=REPORT)
    start = only(decide(reply_in_thread("which source is newest?"), view(thread=thread(report_run)), SETTINGS))
    assert isinstance(start, StartRun)
    assert (start.mode, start.options) == ("followup", RunOptions(answer_from_run=report_run.id))


# 18. chat
def test_18_any_other_reply_in_our_thread_is_a_quick_answer() -> None:
    no_sources = run(report={"title": "Stopped", "sources": []}, state="cancelled")
    start = only(decide(reply_in_thread("what now?"), view(thread=thread(no_sources)), SETTINGS))
    assert isinstance(start, StartRun) and (start.mode, start.thread, start.names_conversation) == ("chat", THREAD, False)


# 19. buttons and reactions
def test_19_buttons_act_on_their_run_and_refuse_a_missing_or_foreign_one() -> None:
    finished = run(state="failed")
    retry = event(kind="action", action="retry", action_run_id=finished.id)
    assert isinstance(only(decide(retry, view(target=finished, target_thread=thread(finished)), SETTINGS)), StartRun)
    assert "no longer exists" in private_text(decide(retry, view(), SETTINGS))
    foreign = view(target=finished, target_thread=thread(finished, channel="C2"))
    assert "another conversation" in private_text(decide(retry, foreign, SETTINGS))
    busy = view(target=finished, target_thread=thread(finished, run(state="queued")))
    assert "already in progress" in private_text(decide(retry, busy, SETTINGS))
    unrelated = event(kind="reaction", reaction="tada", message_id="9.9")
    assert decide(unrelated, view(target=finished, target_thread=thread(finished)), SETTINGS) == []


# 20. feedback
def test_20_feedback_is_stored_and_a_click_with_no_verdict_is_refused() -> None:
    answered = run(mode="chat", report=REPORT)
    seen = view(target=answered, target_thread=thread(answered))
    assert decide(event(kind="action", action="feedback", feedback="bad", action_run_id=answered.id), seen,
                  SETTINGS) == [RecordFeedback(answered)]
    assert decide(event(kind="action", action="feedback_comment", text="wrong year", action_run_id=answered.id), seen,
                  SETTINGS) == [RecordFeedback(answered)]
    assert private_text(decide(event(kind="action", action="feedback", action_run_id=answered.id), seen,
                               SETTINGS)) == rules.NO_VERDICT


# 21. suggestions
def test_21_an_opened_conversation_is_offered_suggestions() -> None:
    assert decide(event(kind="opened", thread=THREAD), view(), SETTINGS) == [Suggest()]


# 22. files
PDF = FileRef(file_id="F1", name="field-notes.pdf", size=1000, link="https://example.slack.com/files/U1/F1")


def test_22_a_message_that_only_shares_files_keeps_them_says_so_in_the_thread_and_starts_nothing() -> None:
    for shared in (reply_in_thread("", files=[PDF]), event(kind="mention", text="", message_id="7.7", files=[PDF]),
                   event(kind="direct", text=" ", thread=None, message_id="8.8", files=[PDF])):
        actions = decide(shared, view(thread=thread(run()) if shared.thread else None), SETTINGS)
        assert not any(isinstance(action, StartRun) for action in actions)
        kept, said = actions
        assert isinstance(kept, rules.KeepFiles) and kept.files == (PDF,)
        assert kept.thread == (shared.thread or shared.message_id)
        assert isinstance(said, Say) and not said.reply.private and "I'll use field-notes.pdf in this thread" in said.reply.text
    # A file shared in a thread that is not ours is not ours either.
    assert decide(reply_in_thread("", files=[PDF]), view(), SETTINGS) == []


def test_22_a_request_that_shares_files_is_research_reading_them() -> None:
    mention = event(kind="mention", text="does this hold up?", message_id="7.7", files=[PDF])
    start = only(decide(mention, view(), SETTINGS))
    assert isinstance(start, StartRun) and start.mode == "research" and start.files == (PDF,)
    # Asked as a quick answer on purpose, it stays one; in our thread, new files make research, not a follow-up.
    asked = only(decide(event(kind="mention", text="ask: what is this?", message_id="7.8", files=[PDF]), view(), SETTINGS))
    assert isinstance(asked, StartRun) and asked.mode == "chat"
    reported = run(report=REPORT)
    kept, follow = decide(reply_in_thread("compare with this", files=[PDF]), view(thread=thread(reported)), SETTINGS)
    assert kept == rules.KeepFiles(thread=THREAD, files=(PDF,))
    assert isinstance(follow, StartRun) and follow.mode == "research"
    command = only(decide(event(kind="command", command="research", text="check it, files only", files=[PDF]), view(),
                          SETTINGS))
    assert isinstance(command, StartRun) and command.options.files_only and command.files == (PDF,)
    reported.created_at = NOW
    after_report = ThreadView(conversation=thread().conversation, runs=[reported], shared_files=1,
                              newest_file_at=reported.created_at)
    follow_up = only(decide(reply_in_thread("and the price?"), view(thread=after_report), SETTINGS))
    assert isinstance(follow_up, StartRun) and follow_up.mode == "followup"
    scoped = only(decide(reply_in_thread("files only: and the price?"), view(thread=after_report), SETTINGS))
    assert isinstance(scoped, StartRun) and scoped.mode == "research" and scoped.options.files_only
    assert scoped.question == "and the price?"  # the scope said first is no part of the question
    newer = dataclasses.replace(after_report, newest_file_at=reported.created_at + dt.timedelta(minutes=1))
    reread = only(decide(reply_in_thread("and the price?"), view(thread=newer), SETTINGS))
    assert isinstance(reread, StartRun) and reread.mode == "research"
    holding_files = ThreadView(conversation=thread().conversation, shared_files=2)
    asked_later = only(decide(reply_in_thread("what do they conclude?"), view(thread=holding_files), SETTINGS))
    assert isinstance(asked_later, StartRun) and asked_later.mode == "research"
    asked_about = only(decide(event(kind="command", command="ask", text="what does it conclude?", files=[PDF]), view(),
                              SETTINGS))
    assert isinstance(asked_about, StartRun) and asked_about.mode == "research" and asked_about.options.files_only
    assert asked_about.question == "what does it conclude?"


def test_every_rule_in_the_docstring_has_its_test() -> None:
    numbered = re.findall(r"^(\d+)\.\s", rules.__doc__ or "", re.MULTILINE)
    tested = {name.split("_")[1] for name in globals() if re.match(r"test_\d+_", name)}
    assert numbered and set(numbered) == tested


def test_the_rules_touch_no_database_session_queue_or_platform() -> None:
    forbidden = ("sqlalchemy", "worker", "chat.slack", "chat.discord", "chat.console", "storage.db", "asyncio")
    tree = ast.parse(Path(rules.__file__).read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module} | {
        alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert [module for module in imported if module.startswith(forbidden)] == []


def test_22_files_shared_with_any_reply_are_kept_and_the_reply_means_what_it_says() -> None:
    plan = run(mode="plan", report={"plan": {"key_questions": ["Why?"]}})
    kept, approved = decide(reply_in_thread("go", files=[PDF]), view(thread=thread(plan)), SETTINGS)
    assert isinstance(kept, rules.KeepFiles) and isinstance(approved, StartRun) and approved.plan is not None
    busy = decide(reply_in_thread("and this?", files=[PDF]), view(thread=thread(run(state="running"))), SETTINGS)
    assert isinstance(busy[0], rules.KeepFiles) and "already in progress" in busy[1].reply.text


def test_22_files_only_is_a_scope_only_where_there_are_files_and_pictures_are_not_read() -> None:
    words = only(decide(event(kind="command", command="research", text="Which files only Linux reads?"), view(),
                        SETTINGS))
    assert isinstance(words, StartRun) and not words.options.files_only
    no_files = only(decide(event(kind="command", command="research", text="files only: what is in them?"), view(),
                           SETTINGS))
    assert isinstance(no_files, StartRun) and not no_files.options.files_only
    picture = FileRef(file_id="F9", name="screenshot.png", mimetype="image/png")
    assert "I can't read screenshot.png" in private_text(decide(reply_in_thread("", files=[picture]),
                                                                view(thread=thread(run())), SETTINGS))
    asked = decide(reply_in_thread("what about this error?", files=[picture]), view(thread=thread(run(report=REPORT))),
                   SETTINGS)
    assert [type(action) for action in asked] == [StartRun, Say] and asked[0].mode == "followup"
    assert asked[1].reply.private and "I can't read screenshot.png" in asked[1].reply.text
