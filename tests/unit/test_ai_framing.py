"""Honest framing: every report and answer says an AI wrote it, which model, and what from — on Slack, Discord and in
the terminal's Markdown and HTML exports."""

from __future__ import annotations

from chat.discord.render import DiscordRenderer, escape_text
from chat.slack.render import SlackRenderer
from research.report import Report, ReportSource, UsageSummary, ai_framing_line, render_html, render_markdown

FROM_SOURCES = "Written by AI (gpt-test-1) from the sources listed — check the citations."


def report(*, model: str | None = "gpt-test-1", sources: bool = True, mode: str = "research",
           pages_read: int = 0) -> Report:
    listed = [ReportSource(number=1, source_id="s1", title="A source", url="https://example.com/a")] if sources else []
    return Report(question="Why?", title="Why", body_markdown="## Why\n\nBecause [1].", model=model, sources=listed,
                  mode=mode, usage=UsageSummary(pages_fetched=pages_read))


def test_a_report_names_the_model_that_wrote_it_from_its_sources() -> None:
    assert ai_framing_line(report()) == FROM_SOURCES


def test_an_answer_without_sources_says_it_had_none() -> None:
    assert ai_framing_line(report(sources=False, mode="chat")) == (
        "Written by AI (gpt-test-1) without web sources — check it before relying on it.")


def test_a_report_that_read_pages_but_cites_none_says_so_instead_of_claiming_no_web_sources() -> None:
    assert ai_framing_line(report(sources=False, pages_read=5)) == (
        "Written by AI (gpt-test-1) after reading 5 web pages, but it cites none of them — check it before relying on it.")
    assert "after reading 1 web page, but" in ai_framing_line(report(sources=False, pages_read=1))
    for document in (render_markdown(report(sources=False, pages_read=5)), render_html(report(sources=False, pages_read=5))):
        assert "without web sources" not in document and "cites none of them" in document


def test_a_report_citing_its_sources_says_so_however_many_pages_were_read() -> None:
    assert ai_framing_line(report(pages_read=5)) == FROM_SOURCES


def test_a_report_stored_before_models_were_named_still_says_an_ai_wrote_it() -> None:
    assert ai_framing_line(report(model=None)) == "Written by AI from the sources listed — check the citations."


def test_slack_discord_and_exports_all_carry_the_framing_line() -> None:
    for use_markdown_blocks in (True, False):
        delivery = SlackRenderer(use_markdown_blocks=use_markdown_blocks).report(report(), requester="slack:U1", run_id=3)
        assert any(FROM_SOURCES in message.text for message in delivery.messages)
    discord = DiscordRenderer().report(report(), requester="discord:123456789012345678", run_id=3)
    assert any(escape_text(FROM_SOURCES) in message.text for message in discord.messages)  # shown as typed
    assert FROM_SOURCES in render_markdown(report())
    assert FROM_SOURCES in render_html(report())


def test_an_unfinished_report_listing_the_pages_it_read_says_it_cites_none_of_them() -> None:
    from research.report import Report, ReportSource, ai_framing_line

    unfinished = Report(title="Research incomplete", body_markdown="The run ended before the report was written.",
                        sources=[ReportSource(number=1, source_id="s1", url="https://a.example", title="A"),
                                 ReportSource(number=2, source_id="s2", url="https://b.example", title="B")],
                        partial=True, partial_reason="the model was too slow")

    assert ai_framing_line(unfinished).endswith("after reading 2 web pages, but it cites none of them — check it "
                                                "before relying on it.")
