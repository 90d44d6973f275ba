"""Slack rendering: status messages for every run state, reports within Block Kit limits, and text that cannot ping."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chat.message import Content
from chat.render import ReportDelivery
from chat.slack.render import (
    BLOCKS_PER_MESSAGE,
    MARKDOWN_BLOCK_LIMIT,
    MESSAGE_TEXT_BUDGET,
    SECTION_TEXT_LIMIT,
    SlackRenderer,
    blocks_of,
    escape_text,
    inline_to_mrkdwn,
)
from chat.status import progress_bar
from chat.text import split_text
from chat.state import PhaseLine, RunProgress, initial_progress
from research.llm import ModelUsage
from research.report import STOPPED_BY_USER_LINE, AuditFigures, Report, ReportSource, UsageSummary, audit_line, render_markdown, usage_line

START = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.timezone.utc)
NOW = START + dt.timedelta(seconds=65)
REQUESTER = "U0REQUEST"
HOSTILE = "Ping <!channel> and <!here> and <!everyone> and <@U0VICTIM> and @here; <script>alert(1)</script> & co."


def make_report(body: str = "## Summary\n\nSolar capacity grew by **45%** in 2023 [1]. The tower opened in 1889 [2].",
                **changes: object) -> Report:
    usage = UsageSummary(llm={"big-model": ModelUsage(calls=1, prompt_tokens=10_000, completion_tokens=2_000, cost=0.01)},
                         total_tokens=12_000, cost=0.01, seconds=41.2)
    report = Report(
        title="Solar power in 2023",
        question="How fast did solar grow?",
        body_markdown=body,
        sources=[
            ReportSource(number=1, source_id="s1", title="Renewables 2024", url="https://energy.example/report?a=1&b=2"),
            ReportSource(number=2, source_id="s2", title="Tower history", url="https://tower.example/history",
                         snippet_only=True),
        ],
        audit=AuditFigures(sentences_total=20, sentences_verified=18, sentences_unverified=2),
        usage=usage,
        skipped_providers={"brave": "rate limited"},
    )
    return report.model_copy(update=changes)


def running_progress(**changes: object) -> RunProgress:
    progress = initial_progress(run_id=7, mode="research", question="How fast did solar grow?", requested_by=REQUESTER,
                                state="running", started_at=START)
    phases = [PhaseLine(name=line.name, status=status) for line, status in
              zip(progress.phases, ["done", "done", "current", "waiting", "waiting", "waiting", "waiting"])]
    progress = progress.model_copy(update={"phases": phases, "percent": 42.0,
                                           "counts": {"sub_questions": 3, "results": 24, "pages_read": 9, "passages": 120}})
    return progress.model_copy(update=changes)


def texts_of(content: Content) -> list[str]:
    """The fallback text and every text inside the blocks of one message."""
    texts = [content.text]
    for block in blocks_of(content) or []:
        if block["type"] == "markdown":
            texts.append(block["text"])
        elif block["type"] == "section":
            texts.append(block["text"]["text"])
        elif block["type"] == "context":
            texts.extend(element["text"] for element in block["elements"])
    return texts


def all_texts(delivery: ReportDelivery) -> list[str]:
    return [text for message in delivery.messages for text in texts_of(message)]


def section_texts(delivery: ReportDelivery) -> list[str]:
    return [block["text"]["text"] for message in delivery.messages for block in blocks_of(message) or []
            if block["type"] == "section"]


def assert_within_slack_limits(delivery: ReportDelivery) -> None:
    for message in delivery.messages:
        blocks = blocks_of(message) or []
        assert len(blocks) <= BLOCKS_PER_MESSAGE
        for block in blocks:
            if block["type"] == "section":
                assert 0 < len(block["text"]["text"]) <= SECTION_TEXT_LIMIT
        assert sum(len(block["text"]) for block in blocks if block["type"] == "markdown") <= MARKDOWN_BLOCK_LIMIT
        assert len(message.text) <= 40_000


def assert_cannot_ping(texts: list[str], allowed_mention: str | None = None) -> None:
    for text in texts:
        for special in re.findall(r"<[!@#][^>]*>", text):
            assert special == allowed_mention, f"{special!r} would ping in {text[:200]!r}"


# --- escaping -------------------------------------------------------------------------------------

def test_escape_text_replaces_slacks_control_characters() -> None:
    assert escape_text("a & b <!channel> <@U1> 1 > 0") == "a &amp; b &lt;!channel&gt; &lt;@U1&gt; 1 &gt; 0"


def test_escape_text_escapes_ampersand_first_so_entities_are_not_double_read() -> None:
    assert escape_text("&lt;") == "&amp;lt;"


def test_inline_conversion_makes_markdown_into_slack_mrkdwn() -> None:
    converted = inline_to_mrkdwn("**bold** and *italic* and ~~gone~~ and `a<b` and [site](https://a.example/?x=1&y=2)")
    assert converted == "*bold* and _italic_ and ~gone~ and `a&lt;b` and <https://a.example/?x=1&amp;y=2|site>"


def test_inline_conversion_does_not_link_non_http_urls() -> None:
    converted = inline_to_mrkdwn("[click](javascript:alert(1)) [file](file:///etc/passwd) <ftp://x.example/>")
    assert "<javascript" not in converted and "<file:" not in converted and "<ftp:" not in converted
    assert "[click](javascript:alert(1))" in converted


def test_link_label_cannot_smuggle_a_mention() -> None:
    converted = inline_to_mrkdwn("[<!channel>](https://a.example/)")
    assert converted == "<https://a.example/|&lt;!channel&gt;>"


# --- status ---------------------------------------------------------------------------------------

def test_running_status_shows_question_requester_checklist_counts_bar_elapsed_and_how_to_stop() -> None:
    content = SlackRenderer().status(running_progress(), now=NOW)
    text = "\n".join(texts_of(content))
    assert "How fast did solar grow?" in text
    assert f"asked by <@{REQUESTER}>" in text
    assert "✅ Planning the research" in text and "✅ Searching the web" in text
    assert "⏳ *Fetching pages*" in text
    assert "▫️ Reading pages" in text
    assert "3 sub-questions · 24 results · 9 pages read · 120 passages" in text
    assert progress_bar(42.0) in text and "42%" in text
    assert "1 min 05 s" in text
    assert "React with :x: to stop" in text


def test_status_uses_the_configured_cancel_emoji() -> None:
    content = SlackRenderer(cancel_emoji="octagonal_sign").status(running_progress(), now=NOW)
    assert "React with :octagonal_sign: to stop" in content.text
    assert "React with 🛑 to stop" in SlackRenderer(cancel_emoji="🛑").status(running_progress(), now=NOW).text


def test_progress_bar_fills_in_proportion() -> None:
    assert progress_bar(0) == "▱▱▱▱▱▱▱▱▱▱ 0%"
    assert progress_bar(48) == "▰▰▰▰▰▱▱▱▱▱ 48%"
    assert progress_bar(100) == "▰▰▰▰▰▰▰▰▰▰ 100%"


def test_queued_status_shows_the_queue_position() -> None:
    progress = initial_progress(run_id=7, mode="research", question="q", requested_by=REQUESTER).model_copy(
        update={"queue_position": 3})
    content = SlackRenderer().status(progress, now=NOW)
    assert "Queued" in content.text and "position 3 in the queue" in content.text


def test_done_status_shows_the_audit_line_and_no_longer_offers_to_stop() -> None:
    progress = running_progress(state="done", percent=100.0, audit_line="18 of 20 sentences verified · 1 citation removed")
    content = SlackRenderer().status(progress, now=NOW)
    assert "Done" in content.text and "18 of 20 sentences verified · 1 citation removed" in content.text
    assert "React with" not in content.text


def test_done_partial_status_reads_partial_with_its_reason_never_done() -> None:
    progress = running_progress(state="done", percent=100.0, partial=True, partial_reason="the time budget ran out.",
                                audit_line="3 of 4 sentences verified")
    content = SlackRenderer().status(progress, now=NOW)
    ending = next(block["text"]["text"] for block in content.extra["slack"]["blocks"]
                  if block["type"] == "section" and "Partial" in block["text"]["text"])
    assert ending == "⚠️ *Partial* — the time budget ran out\n3 of 4 sentences verified"
    assert "Done" not in content.text and "✅ *" not in content.text


def test_cancelled_status_names_who_stopped_it() -> None:
    content = SlackRenderer().status(running_progress(state="cancelled", cancelled_by="U0STOPPER"), now=NOW)
    assert "Stopped* by <@U0STOPPER>" in content.text
    assert "React with" not in content.text


def test_timed_out_status_says_it_timed_out_and_why() -> None:
    assert "Timed out" in SlackRenderer().status(running_progress(state="timed_out"), now=NOW).text
    progress = running_progress(state="timed_out", error="The run passed its hard deadline of 600 s and was stopped.")
    assert "Timed out*: The run passed its hard deadline of 600 s" in SlackRenderer().status(progress, now=NOW).text


def test_failed_status_gives_the_plain_reason_escaped() -> None:
    progress = running_progress(state="failed", error="Every search provider failed <!channel>")
    phases = [line.model_copy(update={"status": "failed"}) if line.status == "current" else line for line in progress.phases]
    content = SlackRenderer().status(progress.model_copy(update={"phases": phases}), now=NOW)
    assert "Failed*: Every search provider failed &lt;!channel&gt;" in content.text
    assert "❌ Fetching pages" in content.text


def test_status_escapes_a_hostile_question_and_only_mentions_the_requester() -> None:
    content = SlackRenderer().status(running_progress(question=HOSTILE), now=NOW)
    assert_cannot_ping(texts_of(content), allowed_mention=f"<@{REQUESTER}>")
    assert "&lt;!channel&gt;" in content.text and "&lt;script&gt;" in content.text and "&amp; co." in content.text


def test_status_does_not_turn_a_malformed_requester_into_a_mention() -> None:
    content = SlackRenderer().status(running_progress(requested_by="!channel"), now=NOW)
    assert_cannot_ping(texts_of(content))


def test_status_with_a_huge_question_stays_within_section_limits_and_shows_it_was_shortened() -> None:
    content = SlackRenderer().status(running_progress(question="&" * 5_000, state="failed", error="<" * 5_000), now=NOW)
    for block in blocks_of(content) or []:
        if block["type"] == "section":
            assert len(block["text"]["text"]) <= SECTION_TEXT_LIMIT
    assert "…" in content.text


# --- reports --------------------------------------------------------------------------------------

def test_short_report_is_one_message_with_a_markdown_block_and_mentions_the_requester_first() -> None:
    delivery = SlackRenderer().report(make_report(), requester=REQUESTER)
    assert len(delivery.messages) == 1 and delivery.file is None
    message = delivery.messages[0]
    assert message.text.startswith(f"<@{REQUESTER}> here is your report")
    assert blocks_of(message) is not None
    assert blocks_of(message)[0]["text"]["text"].startswith(f"<@{REQUESTER}>")
    assert blocks_of(message)[1]["type"] == "markdown"
    assert "**45%**" in blocks_of(message)[1]["text"]
    assert_within_slack_limits(delivery)


def test_markdown_block_report_lists_sources_as_links_and_ends_with_the_footer() -> None:
    report = make_report()
    markdown = blocks_of(SlackRenderer().report(report, requester=REQUESTER).messages[0])[1]["text"]  # type: ignore[index]
    assert "[Renewables 2024](https://energy.example/report?a=1&amp;b=2)" in markdown
    assert "[Tower history](https://tower.example/history) (search snippet)" in markdown
    assert escape_text(audit_line(report)) in markdown and escape_text(usage_line(report)) in markdown


def test_sections_report_lists_sources_as_slack_links_and_ends_with_the_footer() -> None:
    report = make_report()
    delivery = SlackRenderer(use_markdown_blocks=False).report(report, requester=REQUESTER)
    text = "\n".join(section_texts(delivery))
    assert "[1] <https://energy.example/report?a=1&amp;b=2|Renewables 2024>" in text
    assert "[2] <https://tower.example/history|Tower history> _(search snippet)_" in text
    assert audit_line(report) in text and usage_line(report) in text
    assert "*Summary*" in text and "*45%*" in text
    assert all(block["type"] != "markdown" for message in delivery.messages for block in blocks_of(message) or [])


def test_sources_with_non_http_urls_are_not_linked() -> None:
    report = make_report(body="See [click](javascript:alert(1)) now.", sources=[
        ReportSource(number=1, source_id="s1", title="Evil", url="javascript:alert(1)"),
        ReportSource(number=2, source_id="s2", title="Files", url="ftp://files.example/x"),
    ])
    for renderer in (SlackRenderer(), SlackRenderer(use_markdown_blocks=False)):
        texts = all_texts(renderer.report(report, requester=REQUESTER))
        joined = "\n".join(texts)
        assert "<javascript:" not in joined and "<ftp:" not in joined
        assert "Evil" in joined and "ftp://files.example/x" in joined
        markdown = [block["text"] for message in renderer.report(report, requester=REQUESTER).messages
                    for block in blocks_of(message) or [] if block["type"] == "markdown"]
        for text in markdown:
            # In a markdown block a link needs an unescaped `](`; the report shows this one as plain text.
            assert not re.search(r"(?<!\\)\]\(javascript:", text) and "click" in text
            assert "](javascript:" not in text.replace("\\](javascript:", "") and "](ftp:" not in text


@pytest.mark.parametrize("use_markdown_blocks", [True, False])
def test_report_with_hostile_text_pings_nobody_but_the_requester(use_markdown_blocks: bool) -> None:
    report = make_report(title=f"Title {HOSTILE}", question=HOSTILE,
                         body=f"## {HOSTILE}\n\n{HOSTILE}\n\n- {HOSTILE}\n\n> {HOSTILE}",
                         sources=[ReportSource(number=1, source_id="s1", title=HOSTILE, url="https://a.example/?q=<!here>")])
    delivery = SlackRenderer(use_markdown_blocks=use_markdown_blocks).report(report, requester=REQUESTER)
    texts = all_texts(delivery)
    assert_cannot_ping(texts, allowed_mention=f"<@{REQUESTER}>")
    joined = "\n".join(texts)
    assert "&lt;!channel&gt;" in joined and "&lt;script&gt;" in joined and "&amp; co." in joined
    # A bare @here is plain text for messages posted through the Web API without link_names.
    assert "@here" in joined


def test_report_file_title_cannot_carry_a_mention() -> None:
    report = make_report(title="<!channel> report", body="x " * 80_000)
    delivery = SlackRenderer().report(report, requester=REQUESTER)
    assert delivery.file is not None and delivery.file.title is not None
    assert "<" not in delivery.file.title and ">" not in delivery.file.title


def long_body(paragraph_count: int, paragraph_length: int = 900) -> tuple[str, list[str]]:
    paragraphs = []
    for index in range(paragraph_count):
        words = f"Paragraph {index} says something measured [1]."
        paragraph = (words + " ") * (paragraph_length // (len(words) + 1))
        paragraphs.append(paragraph.strip())
    return "\n\n".join(paragraphs), paragraphs


def test_long_report_is_split_at_paragraph_boundaries_within_limits_and_loses_nothing() -> None:
    body, paragraphs = long_body(40)
    delivery = SlackRenderer().report(make_report(body=body), requester=REQUESTER)
    assert delivery.file is None
    assert 2 <= len(delivery.messages) <= 4
    assert_within_slack_limits(delivery)
    sections = section_texts(delivery)
    for paragraph in paragraphs:
        assert sum(paragraph in section for section in sections) == 1, "a paragraph was cut or repeated"
    joined = "\n".join(sections)
    positions = [joined.index(paragraph) for paragraph in paragraphs]
    assert positions == sorted(positions)
    for message in delivery.messages:
        assert sum(len(text) for text in texts_of(message)[1:]) <= MESSAGE_TEXT_BUDGET + len(f"<@{REQUESTER}>") + 100


def test_only_the_first_message_of_a_split_report_mentions_the_requester() -> None:
    body, _ = long_body(40)
    delivery = SlackRenderer().report(make_report(body=body), requester=REQUESTER)
    mentions = [f"<@{REQUESTER}>" in message.text for message in delivery.messages]
    assert mentions[0] and not any(mentions[1:])


def test_a_paragraph_longer_than_a_section_is_cut_at_words_without_losing_any() -> None:
    words = [f"word{index}" for index in range(2_000)]
    delivery = SlackRenderer().report(make_report(body=" ".join(words)), requester=REQUESTER)
    assert_within_slack_limits(delivery)
    found = " ".join(section_texts(delivery)).split()
    body_words = [word for word in found if word.startswith("word")]
    assert body_words == words


def test_a_long_code_block_is_split_into_fenced_pieces() -> None:
    code = "\n".join(f"line_{index} = {index}" for index in range(1_000))
    delivery = SlackRenderer().report(make_report(body=f"```python\n{code}\n```"), requester=REQUESTER)
    assert_within_slack_limits(delivery)
    code_sections = [text for text in section_texts(delivery) if "line_" in text]
    assert len(code_sections) > 1
    for text in code_sections:
        for piece in text.split("\n\n"):
            if "line_" in piece:
                assert piece.startswith("```\n") and piece.endswith("\n```")
    assert all(f"line_{index} = {index}" in "\n".join(code_sections) for index in range(1_000))


def test_very_long_report_is_uploaded_as_markdown_with_a_summary_message() -> None:
    body, _ = long_body(120)
    report = make_report(body=body)
    delivery = SlackRenderer(max_messages=4).report(report, requester=REQUESTER)
    assert delivery.file is not None
    assert delivery.file.filename == "report.md"
    assert delivery.file.data == render_markdown(report).encode("utf-8")
    assert len(delivery.messages) == 1
    summary = delivery.messages[0]
    assert summary.text.startswith(f"<@{REQUESTER}>")
    assert "report.md" in summary.text and audit_line(report) in summary.text
    assert_within_slack_limits(delivery)


@pytest.mark.parametrize("body_paragraphs", [1, 200])
def test_a_huge_title_of_ampersands_still_fits_the_section_limit(body_paragraphs: int) -> None:
    body, _ = long_body(body_paragraphs)
    delivery = SlackRenderer().report(make_report(title="&" * 4_000, body=body), requester=REQUESTER)
    assert_within_slack_limits(delivery)
    assert "&amp;" * 10 in "\n".join(all_texts(delivery))


def test_report_stopped_by_user_says_so() -> None:
    delivery = SlackRenderer().report(make_report(stopped_by_user=True), requester=REQUESTER)
    assert STOPPED_BY_USER_LINE in "\n".join(all_texts(delivery))


def test_report_body_with_its_own_title_is_not_titled_twice() -> None:
    delivery = SlackRenderer(use_markdown_blocks=False).report(
        make_report(body="# Own title\n\nText [1]."), requester=REQUESTER)
    text = "\n".join(section_texts(delivery))
    assert text.count("Own title") == 1 and "Solar power in 2023" not in text


def test_code_with_angle_brackets_is_sent_as_escaped_mrkdwn_sections() -> None:
    delivery = SlackRenderer().report(make_report(body="Use `a < b && c` here."), requester=REQUESTER)
    assert all(block["type"] != "markdown" for block in blocks_of(delivery.messages[0]) or [])
    assert "`a &lt; b &amp;&amp; c`" in "\n".join(section_texts(delivery))


def test_markdown_lists_quotes_and_rules_become_mrkdwn() -> None:
    delivery = SlackRenderer(use_markdown_blocks=False).report(
        make_report(body="- first\n- second\n\n> quoted\n\n---\n\n1. one"), requester=REQUESTER)
    text = "\n".join(section_texts(delivery))
    assert "• first\n• second" in text and "> quoted" in text and "1. one" in text


# --- notices and splitting ------------------------------------------------------------------------

def test_notice_escapes_its_text() -> None:
    content = SlackRenderer().notice("Only <@U1> may stop this & <!channel>")
    assert_cannot_ping(texts_of(content))
    assert content.text == "Only &lt;@U1&gt; may stop this &amp; &lt;!channel&gt;"


def test_split_text_prefers_paragraph_boundaries_and_keeps_every_character() -> None:
    paragraphs = [("alpha " * 100).strip(), ("beta " * 100).strip(), ("gamma " * 100).strip()]
    pieces = split_text("\n\n".join(paragraphs), 1_200)
    assert all(len(piece) <= 1_200 for piece in pieces)
    assert "".join(pieces).replace("\n", "") == "".join(paragraphs)
    assert pieces[0].rstrip() == paragraphs[0] + "\n\n" + paragraphs[1] or pieces[0].rstrip() == paragraphs[0]


# --- any text at all ------------------------------------------------------------------------------

FRAGMENTS = st.sampled_from([*"ab <>&!@#|*_~`[]()\n:/.", "<!channel>", "<@U1>", "@here", "https://x.example/?a=1&b=2",
                             "javascript:x", "**", "```", "\n\n", "# ", "- ", "> ", "&lt;", "[1]"])
ANY_TEXT = st.lists(FRAGMENTS, max_size=400).map("".join)


@settings(max_examples=150, deadline=None)
@given(title=ANY_TEXT, question=ANY_TEXT, body=ANY_TEXT, source_title=ANY_TEXT, use_markdown_blocks=st.booleans())
def test_any_report_stays_within_limits_and_pings_nobody_but_the_requester(
        title: str, question: str, body: str, source_title: str, use_markdown_blocks: bool) -> None:
    report = make_report(title=title or "t", question=question, body=body, sources=[
        ReportSource(number=1, source_id="s1", title=source_title, url="https://a.example/x")])
    delivery = SlackRenderer(use_markdown_blocks=use_markdown_blocks).report(report, requester=REQUESTER)
    assert_within_slack_limits(delivery)
    assert_cannot_ping(all_texts(delivery), allowed_mention=f"<@{REQUESTER}>")


@settings(max_examples=100, deadline=None)
@given(question=ANY_TEXT, error=ANY_TEXT, state=st.sampled_from(["queued", "running", "done", "failed", "cancelled", "timed_out"]))
def test_any_status_pings_nobody_but_the_requester(question: str, error: str, state: str) -> None:
    progress = running_progress(question=question, error=error, state=state, audit_line=error, partial=True,
                                partial_reason=error)
    content = SlackRenderer().status(progress, now=NOW)
    assert_cannot_ping(texts_of(content), allowed_mention=f"<@{REQUESTER}>")
    assert all(len(text) <= SECTION_TEXT_LIMIT for text in texts_of(content)[1:])
