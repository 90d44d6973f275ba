"""Discord rendering: every message within Discord's limits, reports complete, and nothing that can ping."""

from __future__ import annotations

import datetime as dt
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from chat.discord.render import (
    CANCEL_ID,
    CONTENT_LIMIT,
    EMBED_DESCRIPTION_LIMIT,
    EMBEDS_PER_MESSAGE,
    EMBEDS_TOTAL_LIMIT,
    EXPORT_PREFIX,
    RETRY_PREFIX,
    SUPPRESS_EMBEDS,
    DiscordRenderer,
    escape_text,
    paragraph_to_discord,
    thread_name,
)
from chat.message import Content
from chat.state import PhaseLine, initial_progress
from chat.text import title_and_body
from research.markdown import markdown_paragraphs
from research.report import Report, ReportSource, render_markdown

REQUESTER = "discord:123456789012345678"
START = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.timezone.utc)
NOW = START + dt.timedelta(seconds=65)


def report_with(body: str, **changes: object) -> Report:
    report = Report(title="Tidal power", question="How much power do tidal turbines make?", body_markdown=body,
                    sources=[ReportSource(number=1, source_id="s1", title="Tides [and] (turbines) *bold*",
                                          url="https://tides.example/a_(b)?x=1&y=2"),
                             ReportSource(number=2, source_id="s2", title="Snippet", url="https://s.example/",
                                          snippet_only=True)])
    return report.model_copy(update=changes)


def squash(text: str) -> str:
    """`text` without white space, code fences and zero-width spaces: a long block is cut into several fenced blocks,
    and a `](` that Discord alone would read as a link is unmade with a zero-width space."""
    return re.sub(r"\s+|```|~~~|\u200b", "", text)


def assert_within_discord_limits(content: Content) -> None:
    payload = content.extra["discord"]
    assert len(content.text) <= CONTENT_LIMIT
    embeds = payload.get("embeds") or []
    assert len(embeds) <= EMBEDS_PER_MESSAGE
    assert all(len(embed.get("description", "")) <= EMBED_DESCRIPTION_LIMIT for embed in embeds)
    assert sum(len(embed.get("title", "")) + len(embed.get("description", "")) for embed in embeds) <= EMBEDS_TOTAL_LIMIT
    assert payload["allowed_mentions"]["parse"] == [], "no message may ping @everyone, roles or users by parsing"
    assert payload["flags"] & SUPPRESS_EMBEDS


token = st.text(alphabet="abcdefghij XYZ.,;:!?-*_`#>[]()<@&\n", min_size=1, max_size=400) | st.sampled_from(
    ["@everyone ", "@here ", "<@&42> ", "<@99> ", "https://x.example/a ", "[1] ", "## ", "#### ", "- ", "---",
     "word " * 200, "x" * 2_500, "A sentence ends here. " * 150, "line\n" * 700])
paragraph = st.lists(token, min_size=1, max_size=12).map("".join)


@settings(max_examples=60, deadline=None)
@given(paragraphs=st.lists(paragraph, min_size=1, max_size=12))
def test_any_report_renders_within_discord_limits_and_concatenates_back_to_the_whole(paragraphs: list[str]) -> None:
    body = "\n\n".join(paragraphs)
    delivery = DiscordRenderer().report(report_with(body), requester=REQUESTER, run_id=5)
    for content in delivery.messages:
        assert_within_discord_limits(content)
    _, rest = title_and_body(report_with(body))  # a leading `# ` line is the title, shown escaped
    converted = "\n\n".join(paragraph_to_discord(piece) for piece in markdown_paragraphs(rest))
    if delivery.file is None:
        joined = "\n\n".join(content.text for content in delivery.messages)
        assert squash(converted) in squash(joined)
    else:
        assert delivery.file.data.decode("utf-8") == render_markdown(report_with(body))


def test_a_paragraph_longer_than_a_message_is_cut_between_words_and_loses_nothing() -> None:
    body = " ".join(f"w{index}" for index in range(1_500))
    delivery = DiscordRenderer().report(report_with(body), requester=REQUESTER)
    assert len(delivery.messages) > 3
    joined = "\n\n".join(content.text for content in delivery.messages)
    assert squash(body) in squash(joined)
    assert [word for word in joined.split() if re.fullmatch(r"w\d+", word)] == body.split()


def test_only_the_first_report_message_may_mention_and_only_the_requester() -> None:
    delivery = DiscordRenderer().report(report_with("Word. " * 1_500), requester=REQUESTER, run_id=5)
    assert len(delivery.messages) > 1 and delivery.file is None
    first, *rest = delivery.messages
    assert first.text.startswith("<@123456789012345678> ")
    assert first.extra["discord"]["allowed_mentions"] == {"parse": [], "users": ["123456789012345678"]}
    assert all(content.extra["discord"]["allowed_mentions"] == {"parse": []} for content in rest)


def test_a_20000_character_report_arrives_whole_as_messages_with_export_and_feedback_on_the_last() -> None:
    body = "\n\n".join(f"Paragraph {index}: " + "tidal energy is predictable [1]. " * 18 for index in range(33))
    assert len(body) >= 20_000
    delivery = DiscordRenderer().report(report_with(body), requester=REQUESTER, run_id=9)
    assert delivery.file is None
    for content in delivery.messages:
        assert_within_discord_limits(content)
    assert squash(body) in squash("\n\n".join(content.text for content in delivery.messages))
    buttons = [component for content in delivery.messages for row in content.extra["discord"].get("components", [])
               for component in row["components"]]
    assert [button["custom_id"] for button in buttons] == [f"{EXPORT_PREFIX}9", "deepthread:feedback:good:9",
                                                           "deepthread:feedback:bad:9", "deepthread:watch:9"]
    assert [button.get("label") for button in buttons] == ["Export Markdown", "👍", "👎", "Watch this"]
    assert "components" in delivery.messages[-1].extra["discord"]


def test_a_report_sent_as_a_file_has_the_export_and_feedback_buttons_under_its_summary() -> None:
    delivery = DiscordRenderer(max_messages=3).report(report_with("Long line here. " * 1_000), requester=REQUESTER,
                                                      run_id=9)
    [summary] = delivery.messages
    [row] = summary.extra["discord"]["components"]
    assert [button["custom_id"] for button in row["components"]] == [
        f"{EXPORT_PREFIX}9", "deepthread:feedback:good:9", "deepthread:feedback:bad:9", "deepthread:watch:9"]


def test_a_very_long_report_becomes_a_summary_and_report_md() -> None:
    delivery = DiscordRenderer(max_messages=3).report(report_with("Long line here. " * 1_000), requester=REQUESTER)
    assert len(delivery.messages) == 1 and delivery.file is not None
    assert delivery.file.filename == "report.md" and b"Long line here." in delivery.file.data
    assert "report.md" in delivery.messages[0].text
    assert_within_discord_limits(delivery.messages[0])


def test_a_long_code_block_is_split_into_fenced_blocks_that_keep_every_line() -> None:
    code = "```python\n" + "\n".join(f"value_{index} = {index} * 2  # keep" for index in range(300)) + "\n```"
    delivery = DiscordRenderer().report(report_with(code), requester=REQUESTER)
    joined = "\n".join(content.text for content in delivery.messages)
    for index in range(300):
        assert f"value_{index} = {index} * 2" in joined
    for content in delivery.messages:
        assert_within_discord_limits(content)
        assert content.text.count("```") % 2 == 0, "a message must not leave a code block open"


def test_sources_are_masked_links_with_escaped_titles() -> None:
    text = "\n".join(content.text for content in DiscordRenderer().report(report_with("Body [1]."), requester=REQUESTER).messages)
    assert r"\[1\] [Tides \[and\] \(turbines\) \*bold\*](https://tides.example/a_%28b%29?x=1&y=2)" in text
    assert "(search snippet)" in text


def test_headings_discord_cannot_show_become_bold_and_rules_a_line() -> None:
    assert paragraph_to_discord("#### Deep heading") == "**Deep heading**"
    assert paragraph_to_discord("---") == "──────────"
    assert paragraph_to_discord("## Kept") == "## Kept"


def test_status_while_running_has_a_stop_button_and_pings_nobody() -> None:
    progress = initial_progress(run_id=7, mode="research", question="Why @everyone? <@&1> *x*", requested_by=REQUESTER,
                                state="running", started_at=START)
    progress = progress.model_copy(update={"phases": [PhaseLine(name="decompose", status="done"),
                                                      PhaseLine(name="search", status="current")],
                                           "counts": {"results": 12}, "percent": 30.0})
    content = DiscordRenderer().status(progress, now=NOW)
    assert_within_discord_limits(content)
    assert "**Researching:** Why @everyone? \\<@&1\\> \\*x\\*" in content.text
    assert "asked by <@123456789012345678>" in content.text and "⏳ **Searching the web**" in content.text
    assert "12 results" in content.text and "1 min 05 s" in content.text and "press **Stop**" in content.text
    [row] = content.extra["discord"]["components"]
    assert [button["custom_id"] for button in row["components"]] == [CANCEL_ID]


def test_a_failed_run_offers_retry_and_continue_and_no_stop() -> None:
    progress = initial_progress(run_id=7, mode="research", question="q", requested_by=REQUESTER, started_at=START)
    content = DiscordRenderer().status(progress.model_copy(update={"state": "failed", "error": "all providers down"}), now=NOW)
    [row] = content.extra["discord"]["components"]
    assert [button["custom_id"] for button in row["components"]] == [f"{RETRY_PREFIX}7", "deepthread:continue:7"]
    assert "❌ **Failed**: all providers down" in content.text


def test_a_done_run_has_no_buttons_left() -> None:
    progress = initial_progress(run_id=7, mode="research", question="q", requested_by=REQUESTER, started_at=START)
    content = DiscordRenderer().status(progress.model_copy(update={"state": "done"}), now=NOW)
    assert content.extra["discord"]["components"] == []


def test_a_partial_run_reads_partial_with_its_reason_never_done() -> None:
    progress = initial_progress(run_id=7, mode="research", question="q", requested_by=REQUESTER, started_at=START)
    partial = progress.model_copy(update={"state": "done", "partial": True, "partial_reason": "time budget of 60 s reached",
                                          "audit_line": "3 of 4 sentences verified"})
    content = DiscordRenderer().status(partial, now=NOW)
    assert content.text.endswith("⚠️ **Partial** — time budget of 60 s reached\n3 of 4 sentences verified")
    assert "Done" not in content.text
    finished = DiscordRenderer().status(progress.model_copy(update={"state": "done"}), now=NOW)
    assert finished.text.endswith("✅ **Done**")


def test_a_status_with_a_huge_question_stays_within_the_content_limit() -> None:
    progress = initial_progress(run_id=1, mode="research", question="why " * 2_000, requested_by=REQUESTER,
                                state="failed").model_copy(update={"error": "x" * 5_000})
    content = DiscordRenderer().status(progress, now=NOW)
    assert_within_discord_limits(content) and "…" in content.text


def test_replies_name_the_person_without_pinging_and_notices_are_shown_as_typed() -> None:
    reply = DiscordRenderer().reply("Only the person who started this run ({person}) can stop it.", person=REQUESTER)
    assert "(<@123456789012345678>)" in reply.text and reply.extra["discord"]["allowed_mentions"] == {"parse": []}
    notice = DiscordRenderer().notice("Research: **why** @everyone")
    assert notice.text == r"Research: \*\*why\*\* @everyone"
    assert escape_text("a_b") == r"a\_b"


def test_thread_names_are_one_line_of_at_most_100_characters() -> None:
    assert thread_name("Research:\n  " + "x" * 300).startswith("Research: x") and len(thread_name("y" * 300)) == 100
