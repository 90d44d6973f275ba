"""A streamed answer passes the same safeguards as a posted one (issue 24, M3): what streams into Slack, chunk by
chunk, and the terminal's live draft can neither ping anyone nor link anywhere; Discord posts an answer whole.

The model's words are streamed as they come, before any audit: nothing in them can be a mention, and since they
have no audited sources, none of their links may link (tests/link_readers.py reads them as each reader would).
"""

from __future__ import annotations

import asyncio
import html
import io
import re
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from bot.console.chat import AnswerDraftView
from chat.console.messenger import ConsoleMessenger
from chat.console.render import ConsoleRenderer
from chat.discord.messenger import DiscordMessenger
from chat.message import AnswerStreaming, MessageRef, Place
from chat.slack.messenger import SlackMessenger, build_slack_client
from chat.slack.render import section_block, slack_content, stream_markdown
from research.markdown import PARSERS, links, read
from tests.fakes.slack_api import FakeSlack
from tests.link_readers import hidden_markdown_links, hidden_terminal_links, hides
from tests.waiting import eventually
from worker.answer_stream import AnswerStream

CHANNEL = "C0RESEARCH"
ASKER = "U0ASKER"
ELSEWHERE = "https://evil.example/login"
# The answer as the model writes it, a chunk at a time: mentions, Slack's own link syntax, and Markdown links of
# several spellings: a `[` escaped already, one after an escaped backslash (`\\[`), a reference defined later.
CHUNKS = ["Tides <!channel> rise", " twice a day <!here>: log in at [your bank](https://evil.example/login)",
          " or <https://evil.example/login|here>, ask <@U0VICTIM> in <#C0OTHER>, see \\[the chart](https://evil",
          ".example/c) and \\\\[the map](<https://evil.example/map> \"Map\") and [the table][t]\n\n",
          "[t]: https://evil.example/table\n\nDone."]
ANSWER = "".join(CHUNKS)


@pytest.fixture
def slack() -> Iterator[FakeSlack]:
    with FakeSlack() as fake:
        yield fake


def assert_pings_and_links_nothing(markdown: str) -> None:
    """Nothing in streamed Markdown is a Slack mention or link (`<…>`), and no reader finds a link in it, whether it
    reads `&lt;` as written or as `<`."""
    assert "<" not in markdown and ">" not in markdown, markdown
    for read_as in (markdown, html.unescape(markdown)):
        assert [link for reader in PARSERS.link_readers for link in links(read(read_as, reader)) if link.kind != "autolink"] == []
        assert hidden_markdown_links(read_as) == []


async def test_streamed_chunks_reach_slack_escaped_and_unlinked(slack: FakeSlack) -> None:
    messenger = SlackMessenger(build_slack_client(slack.token, slack.api_url, rate_limit_retries=0))
    root = await messenger.post(Place(platform="slack", workspace=slack.team_id, channel=CHANNEL),
                                slack_content("question", [section_block("question")]))
    place = Place(platform="slack", workspace=slack.team_id, channel=CHANNEL, thread=root.message_id)

    async def record(ref: MessageRef) -> bool:
        return True

    async def allowed() -> bool:
        return True

    stream = AnswerStream(messenger, place, ASKER, loop=asyncio.get_running_loop(), may_open=allowed,
                          record_opened=record, append_interval=0.0)
    for sent, _ in enumerate(CHUNKS, start=1):
        stream.show("".join(CHUNKS[:sent]))  # the whole answer so far, as the engine hands it over
        await eventually(lambda: len(slack.calls("chat.startStream") + slack.calls("chat.appendStream")) >= sent,
                         f"chunk {sent} streamed")
    ref = await stream.close()
    assert ref is not None and not stream.frozen

    calls = slack.calls("chat.startStream") + slack.calls("chat.appendStream")
    assert len(calls) == len(CHUNKS)
    for call in calls:
        assert_pings_and_links_nothing(call.params["markdown_text"])
    shown = slack.stream(CHANNEL, ref.message_id).markdown
    assert_pings_and_links_nothing(shown)
    assert shown == stream_markdown(ANSWER), "the stream shows the safe rendering of the whole answer, in order"
    assert "&lt;!channel&gt;" in shown and "&lt;!here&gt;" in shown and "&lt;@U0VICTIM&gt;" in shown
    assert "\\[your bank](https://evil.example/login)" in shown, "a link shows where it goes, as text"


WORDS = st.sampled_from([*"[]()<>!\\`*_ \n:&|@", "<!channel>", "<!here>", "<@U1>", "https://evil.example/x", "[1]",
                         "](", "]: ", "\\[", "\\\\[", "&lt;", "```", "    ", "> ", "word"])


@settings(max_examples=200, deadline=None)
@given(chunks=st.lists(st.lists(WORDS, max_size=12).map("".join), min_size=1, max_size=8))
def test_streamed_markdown_grows_by_appending_and_never_pings_or_links(chunks: list[str]) -> None:
    streamed = "".join(stream_markdown(chunk, after="".join(chunks[:index])) for index, chunk in enumerate(chunks))
    assert streamed == stream_markdown("".join(chunks)), "what a chunk adds never changes what was streamed"
    assert_pings_and_links_nothing(streamed)


def test_the_terminal_draws_a_draft_with_no_link_elsewhere() -> None:
    draft = ConsoleRenderer().draft(ANSWER + ' And [more <b title="]">](https://evil.example/html).')
    assert hidden_terminal_links(draft) == []
    assert ELSEWHERE in draft.text, "a link shows where it goes, as text"


async def test_the_terminal_live_draft_writes_no_hyperlink_elsewhere() -> None:
    output = io.StringIO()
    console = Console(file=output, width=120, height=40, force_terminal=True, color_system="truecolor")
    view = AnswerDraftView(ConsoleMessenger(console), ConsoleRenderer(), Place(platform="cli", workspace="w",
                                                                                 channel="c", thread="t"))
    for sent in range(1, len(CHUNKS) + 1):
        await view.show("".join(CHUNKS[:sent]))
    await view.take_down()
    written = output.getvalue()
    hyperlinks = [(target, _SGR.sub("", shown)) for target, shown in _HYPERLINK.findall(written)]
    assert [(target, shown) for target, shown in hyperlinks if hides(target, shown)] == []
    assert "your bank (https://evil.example/login)" in written, "a link shows where it goes, as text"


# A terminal hyperlink (OSC 8: where it goes, then what it shows) and a colour or style change (SGR).
_HYPERLINK = re.compile(r"\x1b\]8;[^;]*;([^\x1b]+)\x1b\\(.*?)\x1b\]8;;\x1b\\")
_SGR = re.compile(r"\x1b\[[0-9;]*m")


def test_discord_posts_an_answer_whole_rather_than_streaming_it() -> None:
    # So a Discord answer is only ever the audited report, rendered as tests/unit/test_report_links.py checks.
    assert not issubclass(DiscordMessenger, AnswerStreaming)


async def test_a_backslash_that_ends_one_chunk_escapes_the_bracket_that_begins_the_next(slack: FakeSlack) -> None:
    messenger = SlackMessenger(build_slack_client(slack.token, slack.api_url, rate_limit_retries=0))
    root = await messenger.post(Place(platform="slack", workspace=slack.team_id, channel=CHANNEL),
                                slack_content("question", [section_block("question")]))
    place = Place(platform="slack", workspace=slack.team_id, channel=CHANNEL, thread=root.message_id)
    chunks = ["See \\", "[the map](https://evil.example/map), then \\\\", "[a link](https://evil.example/x)"]
    ref = await messenger.start_stream(place, chunks[0], recipient=ASKER)
    for chunk in chunks[1:]:
        await messenger.append_stream(ref, chunk)
    shown = slack.stream(CHANNEL, ref.message_id).markdown
    assert shown == stream_markdown("".join(chunks)), "chunked, it reads as the whole text escaped at once"
    assert_pings_and_links_nothing(shown)
