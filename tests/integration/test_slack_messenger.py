"""The Slack messenger against the fake Slack Web API over loopback: posts, edits, uploads, rate limits and fallbacks."""

from __future__ import annotations

import re

import pytest

from chat.message import Content, FileUpload, MessengerError, Place
from chat.slack.messenger import PLAIN_TEXT_LIMIT, SlackMessenger, build_slack_client
from chat.slack.render import SlackRenderer, section_block, slack_content
from research.report import Report, ReportSource, render_markdown
from tests.fakes.slack_api import FakeSlack

pytestmark = pytest.mark.integration

CHANNEL = "C0RESEARCH"
REQUESTER = "U0REQUEST"


@pytest.fixture
def messenger(slack: FakeSlack) -> SlackMessenger:
    return SlackMessenger(build_slack_client(slack.token, slack.api_url))


def channel_place(thread: str | None = None) -> Place:
    return Place(platform="slack", workspace="T0FAKE", channel=CHANNEL, thread=thread)


def rich(text: str) -> Content:
    return slack_content(text, [section_block(text)])


async def test_post_threads_the_message_and_turns_unfurling_and_name_linking_off(slack: FakeSlack,
                                                                                 messenger: SlackMessenger) -> None:
    parent = await messenger.post(channel_place(), rich("status"))
    reply = await messenger.post(channel_place(parent.message_id), rich("report"))
    assert reply.thread == parent.message_id and reply.channel == CHANNEL
    params = slack.calls("chat.postMessage")[-1].params
    assert params["thread_ts"] == parent.message_id
    assert params["unfurl_links"] is False and params["unfurl_media"] is False and params["link_names"] is False
    assert [message.visible_text for message in slack.messages(CHANNEL, thread_ts=parent.message_id)] == ["status", "report"]


async def test_edit_replaces_the_message_and_is_recorded(slack: FakeSlack, messenger: SlackMessenger) -> None:
    ref = await messenger.post(channel_place(), rich("searching"))
    await messenger.edit(ref, rich("reading"))
    await messenger.edit(ref, rich("done"))
    assert [edit.text for edit in slack.edits(CHANNEL, ref.message_id)] == ["reading", "done"]
    assert slack.message(CHANNEL, ref.message_id).visible_text == "done"
    assert len(slack.messages(CHANNEL)) == 1


async def test_text_only_edit_removes_the_previous_blocks(slack: FakeSlack, messenger: SlackMessenger) -> None:
    ref = await messenger.post(channel_place(), rich("with blocks"))
    await messenger.edit(ref, Content(text="plain now"))
    message = slack.message(CHANNEL, ref.message_id)
    assert message.blocks is None and message.visible_text == "plain now"


async def test_upload_goes_through_slacks_two_steps_into_the_thread(slack: FakeSlack, messenger: SlackMessenger) -> None:
    parent = await messenger.post(channel_place(), rich("status"))
    data = "# Report\n\nEvery word kept.\n".encode()
    ref = await messenger.upload(channel_place(parent.message_id), FileUpload(filename="report.md", data=data, title="Report"))
    assert [call.method for call in slack.calls()][-3:] == ["files.getUploadURLExternal", "upload", "files.completeUploadExternal"]
    [stored] = slack.files(CHANNEL)
    assert stored.data == data and stored.filename == "report.md" and stored.title == "Report"
    assert stored.thread_ts == parent.message_id
    thread = slack.messages(CHANNEL, thread_ts=parent.message_id)
    assert thread[-1].files == [stored]
    assert ref is not None and ref.message_id == thread[-1].ts


async def test_three_consecutive_429s_with_retry_after_2_are_ridden_out_and_nothing_is_lost(
        slack: FakeSlack, messenger: SlackMessenger) -> None:
    slack.fail_next("chat.postMessage", status=429, headers={"Retry-After": "2"}, times=3)
    ref = await messenger.post(channel_place(), rich("the report"))
    calls = slack.calls("chat.postMessage")
    assert [call.status for call in calls] == [429, 429, 429, 200]
    gaps = [later.at - earlier.at for earlier, later in zip(calls, calls[1:])]
    assert all(gap >= 2.0 for gap in gaps), gaps
    [message] = slack.messages(CHANNEL)
    assert message.ts == ref.message_id and message.visible_text == "the report"


async def test_rate_limited_edits_wait_for_retry_after_and_land(slack: FakeSlack, messenger: SlackMessenger) -> None:
    ref = await messenger.post(channel_place(), rich("first"))
    slack.fail_next("chat.update", status=429, headers={"Retry-After": "1"}, times=2)
    await messenger.edit(ref, rich("second"))
    calls = slack.calls("chat.update")
    assert [call.status for call in calls] == [429, 429, 200]
    assert all(later.at - earlier.at >= 1.0 for earlier, later in zip(calls, calls[1:]))
    assert slack.message(CHANNEL, ref.message_id).visible_text == "second"


async def test_rate_limit_outlasting_the_retries_raises_a_retryable_error(slack: FakeSlack) -> None:
    messenger = SlackMessenger(build_slack_client(slack.token, slack.api_url, rate_limit_retries=1))
    slack.fail_next("chat.postMessage", status=429, headers={"Retry-After": "0"}, times=5)
    with pytest.raises(MessengerError) as raised:
        await messenger.post(channel_place(), rich("lost?"))
    assert raised.value.reason == "ratelimited" and raised.value.retryable
    assert slack.messages(CHANNEL) == []


async def test_rejected_blocks_are_posted_again_as_plain_text(slack: FakeSlack, messenger: SlackMessenger) -> None:
    slack.error_next("chat.postMessage", "invalid_blocks", when=lambda params: bool(params.get("blocks")))
    ref = await messenger.post(channel_place(), slack_content("*fallback* text", [section_block("*rich* text")]))
    calls = slack.calls("chat.postMessage")
    assert [call.error for call in calls] == ["invalid_blocks", None]
    assert "blocks" not in calls[1].params
    [message] = slack.messages(CHANNEL)
    assert message.ts == ref.message_id and message.blocks is None and message.text == "*fallback* text"


async def test_a_section_over_slacks_limit_is_refused_and_the_text_still_arrives(slack: FakeSlack,
                                                                                messenger: SlackMessenger) -> None:
    too_long = "x" * 3_500
    await messenger.post(channel_place(), slack_content(too_long, [section_block(too_long)]))
    assert slack.calls("chat.postMessage")[0].error == "invalid_blocks"
    assert [message.text for message in slack.messages(CHANNEL)] == [too_long]


async def test_plain_text_fallback_splits_long_text_at_paragraphs_without_losing_any(slack: FakeSlack,
                                                                                     messenger: SlackMessenger) -> None:
    paragraphs = [f"Paragraph {index}: " + "words " * 150 for index in range(20)]
    text = "\n\n".join(paragraph.strip() for paragraph in paragraphs)
    parent = await messenger.post(channel_place(), rich("status"))
    slack.error_next("chat.postMessage", "msg_blocks_too_long")
    first = await messenger.post(channel_place(parent.message_id), slack_content(text, [section_block("summary")]))
    replies = slack.messages(CHANNEL, thread_ts=parent.message_id)[1:]
    assert len(replies) > 1 and replies[0].ts == first.message_id
    assert all(len(message.text) <= PLAIN_TEXT_LIMIT for message in replies)
    joined = "\n\n".join(message.text for message in replies)
    for paragraph in paragraphs:
        assert sum(paragraph.strip() in message.text for message in replies) == 1
    assert joined.replace("\n", "") == text.replace("\n", "")


async def test_rejected_blocks_on_an_edit_are_retried_as_plain_text(slack: FakeSlack, messenger: SlackMessenger) -> None:
    ref = await messenger.post(channel_place(), rich("status"))
    slack.error_next("chat.update", "invalid_blocks")
    await messenger.edit(ref, slack_content("plain status", [section_block("rich status")]))
    message = slack.message(CHANNEL, ref.message_id)
    assert message.text == "plain status" and message.blocks is None


async def test_other_errors_carry_slacks_code_and_are_not_retried_as_text(slack: FakeSlack,
                                                                          messenger: SlackMessenger) -> None:
    slack.error_next("chat.postMessage", "channel_not_found")
    with pytest.raises(MessengerError) as raised:
        await messenger.post(channel_place(), rich("hello"))
    assert raised.value.reason == "channel_not_found" and not raised.value.retryable
    assert len(slack.calls("chat.postMessage")) == 1


async def test_edit_of_a_missing_message_raises_message_not_found(messenger: SlackMessenger) -> None:
    ref = (await messenger.post(channel_place(), rich("x"))).model_copy(update={"message_id": "1.000000"})
    with pytest.raises(MessengerError, match="message_not_found"):
        await messenger.edit(ref, rich("y"))


async def test_a_wrong_token_is_refused_as_invalid_auth(slack: FakeSlack) -> None:
    messenger = SlackMessenger(build_slack_client("xoxb-wrong", slack.api_url))
    with pytest.raises(MessengerError) as raised:
        await messenger.post(channel_place(), rich("hello"))
    assert raised.value.reason == "invalid_auth"
    assert slack.messages(CHANNEL) == []


async def test_a_server_that_is_down_raises_a_retryable_connection_error() -> None:
    with FakeSlack() as fake:
        api_url = fake.api_url
    messenger = SlackMessenger(build_slack_client("xoxb-fake-token", api_url, connection_retries=0))
    with pytest.raises(MessengerError) as raised:
        await messenger.post(channel_place(), rich("hello"))
    assert raised.value.reason == "connection_error" and raised.value.retryable


# --- rendered reports through the messenger -------------------------------------------------------

def hostile_report(body_paragraphs: int = 3) -> Report:
    hostile = "Attention <!channel> <!here> <!everyone> <@U0VICTIM> @here @channel <script>x</script> & more"
    body = "\n\n".join(f"{hostile} [1]. Paragraph {index}." for index in range(body_paragraphs))
    return Report(title=f"Report {hostile}", question=hostile, body_markdown=body,
                  sources=[ReportSource(number=1, source_id="s1", title=hostile, url="https://a.example/page")])


async def deliver(messenger: SlackMessenger, report: Report, *, renderer: SlackRenderer | None = None) -> str:
    renderer = renderer or SlackRenderer()
    parent = await messenger.post(channel_place(), rich("status"))
    delivery = renderer.report(report, requester=REQUESTER)
    for content in delivery.messages:
        await messenger.post(channel_place(parent.message_id), content)
    if delivery.file is not None:
        await messenger.upload(channel_place(parent.message_id), delivery.file)
    return parent.message_id


def stored_texts(slack: FakeSlack) -> list[str]:
    texts = []
    for message in slack.messages(CHANNEL):
        texts.append(message.text)
        texts.append(message.visible_text)
    return texts


@pytest.mark.parametrize("use_markdown_blocks", [True, False])
async def test_a_delivered_report_with_mentions_in_it_pings_nobody_but_the_requester(
        slack: FakeSlack, messenger: SlackMessenger, use_markdown_blocks: bool) -> None:
    await deliver(messenger, hostile_report(), renderer=SlackRenderer(use_markdown_blocks=use_markdown_blocks))
    mentions = {special for text in stored_texts(slack) for special in re.findall(r"<[!@#][^>]*>", text)}
    assert mentions == {f"<@{REQUESTER}>"}
    assert all(call.params.get("link_names") is False for call in slack.calls("chat.postMessage"))


async def test_a_long_report_arrives_whole_in_several_messages(slack: FakeSlack, messenger: SlackMessenger) -> None:
    report = hostile_report(body_paragraphs=120)
    thread = await deliver(messenger, report)
    replies = slack.messages(CHANNEL, thread_ts=thread)[1:]
    assert len(replies) > 1 and all(call.error is None for call in slack.calls("chat.postMessage"))
    joined = "\n".join(message.visible_text for message in replies)
    assert all(f"Paragraph {index}." in joined for index in range(120))


async def test_a_very_long_report_arrives_as_report_md_in_the_thread(slack: FakeSlack, messenger: SlackMessenger) -> None:
    report = hostile_report(body_paragraphs=600)
    thread = await deliver(messenger, report)
    [file] = slack.files(CHANNEL)
    assert file.filename == "report.md" and file.thread_ts == thread
    assert file.data == render_markdown(report).encode()
    assert slack.messages(CHANNEL, thread_ts=thread)[1].text.startswith(f"<@{REQUESTER}>")


# --- the fake answers the other methods the bot uses ----------------------------------------------

async def test_fake_slack_answers_auth_join_replies_reactions_users_ephemeral_and_delete(slack: FakeSlack) -> None:
    client = build_slack_client(slack.token, slack.api_url)
    auth = await client.auth_test()
    assert auth["user_id"] == slack.bot_user_id and auth["team_id"] == slack.team_id
    joined = await client.conversations_join(channel=CHANNEL)
    assert joined["channel"]["is_member"] and CHANNEL in slack.joined_channels()
    assert (await client.conversations_info(channel=CHANNEL))["channel"]["id"] == CHANNEL
    parent = await client.chat_postMessage(channel=CHANNEL, text="question")
    reply = await client.chat_postMessage(channel=CHANNEL, text="answer", thread_ts=parent["ts"])
    await client.chat_postMessage(channel=CHANNEL, text="elsewhere")
    replies = await client.conversations_replies(channel=CHANNEL, ts=parent["ts"])
    assert [message["text"] for message in replies["messages"]] == ["question", "answer"]
    assert replies["messages"][1]["thread_ts"] == parent["ts"]
    await client.reactions_add(channel=CHANNEL, timestamp=reply["ts"], name="eyes")
    assert slack.message(CHANNEL, reply["ts"]).reactions == {"eyes": [slack.bot_user_id]}
    slack.add_user("U0ALICE", "alice")
    assert (await client.users_info(user="U0ALICE"))["user"]["name"] == "alice"
    ephemeral = await client.chat_postEphemeral(channel=CHANNEL, user="U0ALICE", text="only you")
    assert ephemeral["message_ts"] and slack.ephemeral_messages()[0]["text"] == "only you"
    await client.chat_delete(channel=CHANNEL, ts=reply["ts"])
    assert [message.text for message in slack.messages(CHANNEL, thread_ts=parent["ts"])] == ["question"]
    assert {call.method for call in slack.calls()} >= {"auth.test", "conversations.join", "conversations.replies",
                                                       "reactions.add", "users.info", "chat.postEphemeral", "chat.delete"}


async def test_fake_slack_requires_joining_when_asked_to(messenger: SlackMessenger) -> None:
    with FakeSlack(require_join=True) as strict:
        strict_messenger = SlackMessenger(build_slack_client(strict.token, strict.api_url))
        with pytest.raises(MessengerError, match="not_in_channel"):
            await strict_messenger.post(channel_place(), rich("hello"))
        await build_slack_client(strict.token, strict.api_url).conversations_join(channel=CHANNEL)
        await strict_messenger.post(channel_place(), rich("hello"))
        assert [message.text for message in strict.messages(CHANNEL)] == ["hello"]
