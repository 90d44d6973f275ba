"""The conversation core's rules, without Slack: a recording messenger, SQLite and fakeredis."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import select

from bot.conversation.commands import MAX_QUESTION_CHARS, UsageProblem, parse_request
from bot.conversation.events import ChatEvent, HistoryMessage
from research.report import Report, ReportSource
from storage.models import Message, Run
from storage.vocabulary import RunOptions
from tests.unit.conversation_world import ADMIN, ALICE, BOB, World, research


# -- commands and options ------------------------------------------------------------------------

def test_research_command_posts_a_root_and_a_status_message_then_submits_the_run(world: World) -> None:
    outcome = research(world, "Why is the sea salty? --since 2024-01-31 --site noaa.gov --site nasa.gov --deep")
    run = world.run(outcome.run_id)
    assert (run.mode, run.question, run.requested_by) == ("research", "Why is the sea salty?", ALICE)
    assert run.options == RunOptions(since="2024-01-31", sites=["noaa.gov", "nasa.gov"], preset="deep")
    root, status = world.messenger.posts
    assert root[0].thread is None and "Why is the sea salty?" in root[1].text
    assert status[0].thread == root[2].message_id == outcome.thread
    assert run.status_message["message_id"] == status[2].message_id
    assert world.sent == [("deepthread.research", run.id)]


@pytest.mark.parametrize(("command", "mode", "task"), [("plan", "plan", "deepthread.plan"), ("ask", "chat", "deepthread.chat")])
def test_plan_and_ask_commands_pick_their_mode(world: World, command: str, mode: str, task: str) -> None:
    outcome = world.handle(kind="command", command=command, text="What is a tidal turbine?")
    assert world.run(outcome.run_id).mode == mode
    assert world.sent == [(task, outcome.run_id)]


def test_help_is_answered_privately_and_starts_nothing(world: World) -> None:
    outcome = world.handle(kind="command", command="research", text="help")
    assert outcome.run_id is None and outcome.replies[0].private and "/plan" in outcome.replies[0].text
    assert world.messenger.posts == [] and world.sent == []


def test_empty_question_gets_the_usage_line_privately(world: World) -> None:
    outcome = world.handle(kind="command", command="research", text="   --quick ")
    assert outcome.replies[0].private and outcome.replies[0].text.startswith("Usage:")
    assert world.sent == []


def test_question_over_the_limit_is_refused_with_the_limit_stated(world: World) -> None:
    outcome = research(world, "why " * 600)
    assert f"{MAX_QUESTION_CHARS:,}" in outcome.replies[0].text and outcome.replies[0].private
    assert world.sent == []


@pytest.mark.parametrize(("text", "named"), [("q --depth 3", "--depth"), ("q --since yesterday", "yesterday"),
                                              ("q --site", "--site"), ("q --site not_a_domain", "not_a_domain"),
                                              ("q --deep --quick", "--deep or --quick")])
def test_bad_or_unknown_options_are_named(text: str, named: str) -> None:
    with pytest.raises(UsageProblem, match=named):
        parse_request(text, "research")


def test_question_text_is_kept_as_data(world: World) -> None:
    outcome = research(world, "Is <!channel> & @here <script>alert(1)</script> safe?")
    assert world.run(outcome.run_id).question == "Is <!channel> & @here <script>alert(1)</script> safe?"
    for _, content, _ in world.messenger.posts:
        assert "<!channel>" not in content.text and "<script>" not in content.text


# -- mentions and direct messages ----------------------------------------------------------------

@pytest.mark.parametrize(("text", "mode"), [("what is BM25?", "chat"), ("research: what is BM25?", "research"),
                                            ("Plan: what is BM25?", "plan")])
def test_a_mention_is_chat_unless_it_starts_with_research_or_plan(world: World, text: str, mode: str) -> None:
    outcome = world.handle(kind="mention", text=text, message_id="1700.1")
    run = world.run(outcome.run_id)
    assert run.mode == mode and run.question == "what is BM25?"
    assert outcome.thread == "1700.1"


def test_a_direct_message_is_chat_in_a_thread_under_it(world: World) -> None:
    outcome = world.handle(kind="direct", channel="D1", text="hello there", message_id="1700.2")
    assert world.run(outcome.run_id).mode == "chat" and outcome.thread == "1700.2"


def test_in_a_thread_the_command_words_work_as_a_mention(world: World) -> None:
    outcome = world.handle(kind="mention", text="research: ocean salinity", thread="1600.0", message_id="1600.5")
    assert world.run(outcome.run_id).mode == "research" and outcome.thread == "1600.0"


def test_a_mention_in_a_thread_the_bot_does_not_own_takes_its_messages_as_context(world: World) -> None:
    history = [HistoryMessage(user=BOB, text="We need sources on ocean salinity."),
               HistoryMessage(user=ALICE, text="Especially since 2020.")]
    outcome = world.handle(kind="mention", text="research: salinity trends", thread="1500.0", message_id="1500.9",
                           thread_history=history)
    with world.sessions() as session:
        texts = [m.text for m in session.scalars(select(Message).order_by(Message.id))]
    assert texts[:2] == ["We need sources on ocean salinity.", "Especially since 2020."]
    assert world.run(outcome.run_id).mode == "research"


def test_a_reply_in_a_thread_the_bot_does_not_own_is_ignored(world: World) -> None:
    outcome = world.handle(kind="message", text="just chatting", thread="1400.0", message_id="1400.1")
    assert outcome.run_id is None and outcome.replies == [] and world.messenger.posts == []


# -- follow-ups ------------------------------------------------------------------------------------

REPORT_TEXT = "Salt comes from rivers [1]."


def finished_research(world: World) -> tuple[int, str]:
    outcome = research(world)
    source = ReportSource(number=1, source_id="s1", title="Salinity", url="https://sea.example/")
    world.finish(outcome.run_id, report=Report(title="t", body_markdown=REPORT_TEXT, sources=[source]))
    # The worker stores what the bot said in the thread when a run finishes.
    with world.sessions.begin() as session:
        run = session.get(Run, outcome.run_id)
        session.add(Message(conversation_id=run.conversation_id, role="assistant", author="deepthread",
                            text=REPORT_TEXT, mode="research"))
    return outcome.run_id, outcome.thread


def thread_messages(world: World, run_id: int) -> list[tuple[str, str]]:
    """The run's conversation as the worker reads it for context: (role, text), oldest first."""
    with world.sessions() as session:
        conversation_id = session.get(Run, run_id).conversation_id
        return [(message.role, message.text) for message in session.scalars(
            select(Message).where(Message.conversation_id == conversation_id).order_by(Message.id))]


def test_a_question_after_a_report_is_answered_from_that_runs_passages(world: World) -> None:
    run_id, thread = finished_research(world)
    outcome = world.handle(kind="message", text="What about the Dead Sea?", thread=thread, message_id="x1")
    run = world.run(outcome.run_id)
    assert run.mode == "followup" and run.options == RunOptions(answer_from_run=run_id)
    assert world.sent[-1] == ("deepthread.chat", run.id)


@pytest.mark.parametrize("text", ["dig deeper", "Dig deeper into river input", "research: river input to oceans"])
def test_dig_deeper_starts_new_research_with_the_thread_as_context(world: World, text: str) -> None:
    run_id, thread = finished_research(world)
    outcome = world.handle(kind="message", text=text, thread=thread, message_id="x2")
    run = world.run(outcome.run_id)
    assert run.mode == "research" and run.conversation_id == world.run(run_id).conversation_id
    assert run.question in ("Why is the sea salty?", "into river input", "river input to oceans")
    context = thread_messages(world, run.id)
    assert context[:2] == [("user", "Why is the sea salty?"), ("assistant", REPORT_TEXT)]
    assert context[-1][0] == "user" and run.question in context[-1][1]


def plan_thread(world: World) -> tuple[int, str]:
    outcome = world.handle(kind="command", command="plan", text="How do tidal turbines work?")
    plan = {"query": "q", "key_questions": ["A?", "B?"], "search_strategy": [{"query": "a"}], "deliverable": "d"}
    world.finish(outcome.run_id, report=Report(title="plan", mode="plan", body_markdown="…", plan=plan))
    return outcome.run_id, outcome.thread


@pytest.mark.parametrize("text", ["go", "Approve", "yes, run it", "Go ahead!", "lgtm"])
def test_approving_a_plan_runs_research_with_that_plan(world: World, text: str) -> None:
    plan_id, thread = plan_thread(world)
    outcome = world.handle(kind="message", text=text, thread=thread, message_id="x3")
    run = world.run(outcome.run_id)
    assert run.mode == "research" and run.question == "How do tidal turbines work?"
    assert run.plan["key_questions"] == ["A?", "B?"]


def test_a_check_reaction_on_the_plan_approves_it(world: World) -> None:
    plan_id, _ = plan_thread(world)
    outcome = world.handle(kind="reaction", reaction="white_check_mark", message_id=world.status_id(plan_id))
    assert world.run(outcome.run_id).plan is not None


def test_any_other_reply_to_a_plan_revises_it(world: World) -> None:
    plan_id, thread = plan_thread(world)
    outcome = world.handle(kind="message", text="Focus on costs instead", thread=thread, message_id="x4")
    run = world.run(outcome.run_id)
    assert run.mode == "plan" and "Focus on costs instead" in run.question


def test_retry_after_a_failed_run_asks_the_same_question_again(world: World) -> None:
    outcome = research(world, "Why is the sea salty? --quick")
    world.finish(outcome.run_id, state="failed", error="No search provider could answer.")
    retry = world.handle(kind="action", action="retry", action_run_id=outcome.run_id, thread=outcome.thread)
    run = world.run(retry.run_id)
    assert (run.question, run.options) == ("Why is the sea salty?", RunOptions(preset="quick"))


def test_continue_after_a_partial_run_starts_more_research_in_the_thread(world: World) -> None:
    outcome = research(world)
    world.finish(outcome.run_id, report=Report(title="t", body_markdown="b", partial=True), partial=True)
    again = world.handle(kind="message", text="continue", thread=outcome.thread, message_id="x5")
    assert world.run(again.run_id).mode == "research"


# -- one run per thread, cancels -------------------------------------------------------------------

def test_a_second_request_while_a_run_is_in_flight_says_so_and_how_to_cancel(world: World) -> None:
    outcome = research(world)
    second = world.handle(kind="message", text="and what about lakes?", thread=outcome.thread, message_id="x6")
    assert second.run_id is None
    assert "cancel" in second.replies[0].text and second.replies[0].private


def test_a_cancel_reaction_from_the_requester_cancels(world: World) -> None:
    outcome = research(world)
    result = world.handle(kind="reaction", reaction="x", message_id=world.status_id(outcome.run_id))
    assert result.cancelled_run_id == outcome.run_id
    assert world.run(outcome.run_id).state == "cancelled"  # still queued, so it never starts


def test_a_cancel_reaction_from_someone_else_is_ignored_and_they_are_told_privately(world: World) -> None:
    outcome = research(world)
    result = world.handle(kind="reaction", reaction="x", user=BOB, message_id=world.status_id(outcome.run_id))
    assert result.cancelled_run_id is None and result.replies[0].private
    assert world.run(outcome.run_id).state == "queued"


def test_an_admin_may_cancel_anyone_s_run(world: World) -> None:
    outcome = research(world)
    result = world.handle(kind="reaction", reaction="octagonal_sign", user=ADMIN, message_id=world.status_id(outcome.run_id))
    assert result.cancelled_run_id == outcome.run_id


def test_replying_cancel_stops_the_running_run(world: World) -> None:
    outcome = research(world)
    world.finish(outcome.run_id, state="running")
    result = world.handle(kind="message", text="stop", thread=outcome.thread, message_id="x7")
    assert result.cancelled_run_id == outcome.run_id
    run = world.run(outcome.run_id)
    assert run.state == "running" and run.cancelled_by == ALICE
    assert world.queue.redis.get(f"deepthread:cancel:{run.id}") == ALICE.encode()


def test_other_reactions_do_nothing(world: World) -> None:
    outcome = research(world)
    result = world.handle(kind="reaction", reaction="tada", message_id=world.status_id(outcome.run_id))
    assert result.replies == [] and result.cancelled_run_id is None and result.run_id is None
    run = world.run(outcome.run_id)
    assert (run.state, run.cancelled_by) == ("queued", None)
    assert world.queue.redis.get(f"deepthread:cancel:{run.id}") is None


# -- queue position and export -------------------------------------------------------------------

def test_a_waiting_run_s_status_shows_its_place_in_the_queue(world: World) -> None:
    research(world, "first question")
    second = world.handle(kind="command", command="research", text="second question")
    assert world.run(second.run_id).state == "queued"
    ref, content = world.messenger.edits[-1]
    assert ref.message_id == world.status_id(second.run_id) and "position 1" in content.text


def test_export_uploads_the_report_as_markdown(world: World) -> None:
    run_id, thread = finished_research(world)
    world.handle(kind="action", action="export", action_run_id=run_id, thread=thread)
    place, upload = world.messenger.uploads[0]
    assert place.thread == thread and upload.filename.endswith(".md") and b"# t" in upload.data


# -- rules found by review -------------------------------------------------------------------------

def test_an_approved_plan_keeps_the_requester_s_options(world: World) -> None:
    outcome = world.handle(kind="command", command="plan", text="How do tidal turbines work? --site noaa.gov --since 2024-01-01")
    plan = {"query": "q", "key_questions": ["A?"], "search_strategy": [{"query": "a"}], "deliverable": "d"}
    world.finish(outcome.run_id, report=Report(title="plan", mode="plan", body_markdown="…", plan=plan))
    research_run = world.run(world.handle(kind="message", text="go", thread=outcome.thread, message_id="y1").run_id)
    assert research_run.options == RunOptions(sites=["noaa.gov"], since="2024-01-01")


def test_only_the_requester_or_an_admin_may_approve_a_plan_by_reply(world: World) -> None:
    _, thread = plan_thread(world)
    refused = world.handle(kind="message", text="go", user=BOB, thread=thread, message_id="y2")
    assert refused.run_id is None and refused.replies[0].private
    assert world.run(world.handle(kind="message", text="go", user=ADMIN, thread=thread, message_id="y3").run_id).mode == "research"


def test_dig_deeper_after_a_follow_up_starts_research_not_chat(world: World) -> None:
    run_id, thread = finished_research(world)
    follow_up = world.handle(kind="message", text="What about lakes?", thread=thread, message_id="y4").run_id
    world.finish(follow_up, report=Report(title="t", mode="followup", body_markdown="b"))
    deeper = world.run(world.handle(kind="message", text="dig deeper", thread=thread, message_id="y5").run_id)
    assert (deeper.mode, deeper.question) == ("research", "Why is the sea salty?")


def test_a_plan_revision_is_checked_like_any_request(world: World) -> None:
    _, thread = plan_thread(world)
    too_long = world.handle(kind="message", text="focus " * 500, thread=thread, message_id="y6")
    assert too_long.run_id is None and "limit" in too_long.replies[0].text


def test_cancelling_a_queued_run_ends_its_status_message(world: World) -> None:
    research(world, "first question")
    second = world.handle(kind="command", command="research", text="second question")
    world.handle(kind="reaction", reaction="x", message_id=world.status_id(second.run_id))
    ref, content = world.messenger.edits[-1]
    assert ref.message_id == world.status_id(second.run_id)
    assert "Stopped" in content.text and "<@U0ALICE01>" in content.text


def test_two_events_at_once_start_only_one_run_in_a_thread(tmp_path) -> None:
    from storage.db import make_engine, make_session_factory
    from storage.models import Base

    # A file database: each thread gets its own connection, as in production (in-memory SQLite shares one).
    engine = make_engine(f"sqlite:///{tmp_path}/races.db")
    Base.metadata.create_all(engine)
    world = World(make_session_factory(engine))
    plan_id, thread = plan_thread(world)

    async def both():
        go = ChatEvent(platform="slack", workspace="T1", channel="C1", user=ALICE, kind="message", text="go",
                       thread=thread, message_id="y7")
        approve = ChatEvent(platform="slack", workspace="T1", channel="C1", user=ALICE, kind="reaction",
                            reaction="white_check_mark", message_id=world.status_id(plan_id))
        return await asyncio.gather(world.core.handle(go), world.core.handle(approve))

    outcomes = asyncio.run(both())
    assert sum(outcome.run_id is not None for outcome in outcomes) == 1
    assert sum(bool(outcome.replies) for outcome in outcomes) == 1


def test_someone_else_cannot_revise_a_plan_to_make_it_theirs_and_approve_it(world: World) -> None:
    plan_id, thread = plan_thread(world)
    hijack = world.handle(kind="message", text="also cover wave power", user=BOB, thread=thread, message_id="z1")
    assert hijack.run_id is None and hijack.replies[0].private and "Only the person" in hijack.replies[0].text
    refused = world.handle(kind="message", text="go", user=BOB, thread=thread, message_id="z2")
    assert refused.run_id is None


def test_a_button_acts_only_on_a_run_of_the_channel_it_was_clicked_in(world: World) -> None:
    outcome = research(world)
    world.finish(outcome.run_id, state="failed")
    elsewhere = world.handle(kind="action", action="retry", action_run_id=outcome.run_id, channel="C2")
    assert elsewhere.run_id is None and "another conversation" in elsewhere.replies[0].text
    here = world.handle(kind="action", action="retry", action_run_id=outcome.run_id, channel="C1")
    assert here.run_id is not None


def test_a_person_with_the_most_runs_waiting_is_refused_in_plain_words_and_nothing_is_posted(world: World) -> None:
    first = research(world, "Why is the sea salty?")  # runs: one per person at a time
    waiting_runs = [research(world, f"Question number {index}?") for index in range(3)]
    assert first.run_id and all(outcome.run_id for outcome in waiting_runs)
    posts = len(world.messenger.posts)
    refused = research(world, "One more question?")
    assert refused.run_id is None and refused.replies[0].private and "3 runs waiting" in refused.replies[0].text
    assert len(world.messenger.posts) == posts, "no thread or status message for a refused run"
    assert research(world, "Bob may still ask?", user=BOB).run_id is not None


def test_a_question_after_a_report_that_read_nothing_is_a_new_question(world: World) -> None:
    outcome = research(world)
    world.finish(outcome.run_id, state="cancelled", report=Report(title="Research stopped", body_markdown="…"))
    asked = world.handle(kind="message", text="What about the Dead Sea?", thread=outcome.thread, message_id="x9")
    assert world.run(asked.run_id).mode == "chat", "nothing to answer a follow-up from"
