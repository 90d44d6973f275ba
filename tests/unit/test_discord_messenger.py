"""The Discord REST messenger against the fake Discord reached in process (httpx's ASGI transport), on a fake clock."""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator

import httpx
import pytest

from chat.discord.messenger import DIRECT_MESSAGES, TEXT_LIMIT, DiscordMessenger, build_discord_http
from chat.message import Content, FileUpload, MessageRef, MessengerError, Place
from tests.fakes.clock import FakeClock
from tests.fakes.discord_api import FAKE_TOKEN, FakeDiscord, UploadedFile, parse_multipart

MESSAGES = r"^/channels/\d+/messages$"
MESSAGE = r"^/channels/\d+/messages/\d+$"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def discord(clock: FakeClock) -> FakeDiscord:
    return FakeDiscord(clock=clock)


@pytest.fixture
async def http(discord: FakeDiscord) -> AsyncIterator[httpx.AsyncClient]:
    async with discord.client() as client:
        yield client


@pytest.fixture
def messenger(http: httpx.AsyncClient, clock: FakeClock) -> DiscordMessenger:
    return DiscordMessenger(http, sleep=clock.sleep, clock=clock)


def place(discord: FakeDiscord, channel: int | None = None, thread: int | None = None) -> Place:
    """A place in the fake's guild: `channel` (the fake's own unless given), or a thread in it."""
    return Place(platform="discord", workspace=str(discord.guild_id), channel=str(channel or discord.channel_id),
                 thread=None if thread is None else str(thread))


def new_thread(discord: FakeDiscord) -> int:
    """A thread someone started in the fake's channel."""
    return discord.create_thread(discord.channel_id, "a thread", owner=discord.new_user("starter"))


def uploaded_files(discord: FakeDiscord) -> list[UploadedFile]:
    """The files of the last multipart request the fake received, with their form field names."""
    request = discord.requests.all()[-1]
    return parse_multipart(request.body, request.headers["content-type"])[1]


def with_buttons(text: str) -> Content:
    button = {"type": 2, "style": 4, "label": "Cancel", "custom_id": "cancel:run-1"}
    return Content(text=text, extra={"discord": {"components": [{"type": 1, "components": [button]}]}})


async def test_post_sends_the_text_with_no_mentions_no_link_previews_and_a_nonce(discord: FakeDiscord,
                                                                                 messenger: DiscordMessenger) -> None:
    ref = await messenger.post(place(discord), Content(text="hello @everyone"))
    [call] = discord.calls()
    assert (call.method, call.path) == ("POST", f"/channels/{discord.channel_id}/messages")
    assert call.json["content"] == "hello @everyone"
    assert call.json["allowed_mentions"] == {"parse": []}
    assert call.json["flags"] == 4
    assert call.json["enforce_nonce"] is True
    assert re.fullmatch(r"\d{1,25}", call.json["nonce"])
    assert "components" not in call.json and "embeds" not in call.json
    [message] = discord.messages(discord.channel_id)
    assert ref == MessageRef(platform="discord", workspace=str(discord.guild_id), channel=str(discord.channel_id),
                             message_id=str(message.id), thread=None)


async def test_post_sends_the_renderers_allowed_mentions_flags_embeds_and_components(
        discord: FakeDiscord, messenger: DiscordMessenger) -> None:
    extra = {"allowed_mentions": {"users": ["555"]}, "flags": 0, "embeds": [{"title": "Report"}],
             "components": [{"type": 1, "components": []}], "content": "not from here"}
    await messenger.post(place(discord), Content(text="<@555> your report", extra={"discord": extra}))
    body = discord.calls()[0].json
    assert body["allowed_mentions"] == {"users": ["555"]} and body["flags"] == 0
    assert body["embeds"] == [{"title": "Report"}] and body["components"] == [{"type": 1, "components": []}]
    assert body["content"] == "<@555> your report"


async def test_each_post_gets_its_own_nonce(discord: FakeDiscord, messenger: DiscordMessenger) -> None:
    await messenger.post(place(discord), Content(text="one"))
    await messenger.post(place(discord), Content(text="one"))
    assert discord.calls()[0].json["nonce"] != discord.calls()[1].json["nonce"]
    assert len(discord.messages(discord.channel_id)) == 2


async def test_post_in_a_thread_goes_to_the_threads_channel_id(discord: FakeDiscord,
                                                               messenger: DiscordMessenger) -> None:
    thread = new_thread(discord)
    ref = await messenger.post(place(discord, thread=thread), Content(text="in the thread"))
    assert discord.calls()[0].path == f"/channels/{thread}/messages"
    assert (ref.channel, ref.thread, ref.workspace) == (str(thread), str(thread), str(discord.guild_id))


async def test_rate_limited_edit_waits_retry_after_and_lands_once(discord: FakeDiscord, messenger: DiscordMessenger,
                                                                  clock: FakeClock) -> None:
    ref = await messenger.post(place(discord), Content(text="searching"))
    discord.fail_next("PATCH", MESSAGE, status=429, retry_after=2.5)
    started = clock.now
    await messenger.edit(ref, Content(text="reading"))
    patches = discord.calls("PATCH")
    assert [call.status for call in patches] == [429, 200]
    assert patches[1].at - patches[0].at >= 2.5 and clock.now - started >= 2.5
    assert [edit.content for edit in discord.edits(discord.channel_id, int(ref.message_id))] == ["reading"]


async def test_three_429s_in_a_row_are_each_waited_out(discord: FakeDiscord, messenger: DiscordMessenger,
                                                       clock: FakeClock) -> None:
    ref = await messenger.post(place(discord), Content(text="searching"))
    discord.fail_next("PATCH", MESSAGE, status=429, retry_after=2.5, times=3)
    await messenger.edit(ref, Content(text="reading"))
    patches = discord.calls("PATCH")
    assert [call.status for call in patches] == [429, 429, 429, 200]
    assert all(later.at - earlier.at >= 2.5 for earlier, later in zip(patches, patches[1:]))
    assert [edit.content for edit in discord.edits(discord.channel_id, int(ref.message_id))] == ["reading"]


async def test_429_without_a_body_waits_the_retry_after_header(discord: FakeDiscord, messenger: DiscordMessenger,
                                                               clock: FakeClock) -> None:
    discord.answer_next("POST", MESSAGES, status=429, headers={"Retry-After": "7"})
    await messenger.post(place(discord), Content(text="hello"))
    calls = discord.calls()
    assert [call.status for call in calls] == [429, 200]
    assert calls[1].at - calls[0].at >= 7


async def test_global_429_holds_back_the_next_call_on_any_route(discord: FakeDiscord, http: httpx.AsyncClient,
                                                                 clock: FakeClock) -> None:
    messenger = DiscordMessenger(http, max_attempts=1, sleep=clock.sleep, clock=clock)
    elsewhere = discord.add_channel("elsewhere")
    ref = await messenger.post(place(discord), Content(text="status"))
    discord.fail_next("PATCH", MESSAGE, status=429, retry_after=4.0, global_=True)
    with pytest.raises(MessengerError):
        await messenger.edit(ref, Content(text="reading"))
    await messenger.post(place(discord, channel=elsewhere), Content(text="elsewhere"))
    assert clock.sleeps == [4.0]
    calls = discord.calls()
    assert calls[-1].status == 200 and calls[-1].at - calls[-2].at == 4.0


async def test_post_retried_after_a_500_reuses_its_nonce_and_is_not_doubled(discord: FakeDiscord,
                                                                             messenger: DiscordMessenger) -> None:
    # Discord made the message, but the answer was a 500: the retry must not make a second one.
    discord.answer_next("POST", MESSAGES, status=500, body={"message": "500: Internal Server Error", "code": 0},
                        carried_out=True)
    ref = await messenger.post(place(discord), Content(text="the report"))
    first, second = discord.calls()
    assert (first.status, second.status) == (500, 200)
    assert first.json["nonce"] == second.json["nonce"]
    [message] = discord.messages(discord.channel_id)
    assert str(message.id) == ref.message_id and message.content == "the report"


async def test_post_retried_after_a_timeout_reuses_its_nonce_and_is_not_doubled(discord: FakeDiscord,
                                                                                messenger: DiscordMessenger,
                                                                                clock: FakeClock) -> None:
    discord.answer_next("POST", MESSAGES, carried_out=True, error=httpx.ReadTimeout("read timed out"))
    ref = await messenger.post(place(discord), Content(text="the report"))
    assert discord.calls()[0].json["nonce"] == discord.calls()[1].json["nonce"]
    assert [str(message.id) for message in discord.messages(discord.channel_id)] == [ref.message_id]
    assert clock.sleeps == [0.5]


async def test_server_errors_are_retried_with_a_growing_backoff_then_raise_retryable(
        discord: FakeDiscord, http: httpx.AsyncClient, clock: FakeClock) -> None:
    messenger = DiscordMessenger(http, max_attempts=4, sleep=clock.sleep, clock=clock)
    discord.answer_next("POST", MESSAGES, status=503, times=4)
    with pytest.raises(MessengerError) as raised:
        await messenger.post(place(discord), Content(text="lost?"))
    assert raised.value.retryable and raised.value.reason == "http_503"
    assert clock.sleeps == [0.5, 1.0, 2.0]
    assert len(discord.calls()) == 4


async def test_empty_bucket_makes_the_next_call_on_it_wait_for_the_reset(discord: FakeDiscord,
                                                                        messenger: DiscordMessenger,
                                                                        clock: FakeClock) -> None:
    exhausted = {"X-RateLimit-Bucket": "posts", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset-After": "3"}
    discord.answer_next("POST", MESSAGES, body={"id": "700000000000000001"}, headers=exhausted)
    await messenger.post(place(discord), Content(text="first"))
    await messenger.post(place(discord), Content(text="second"))
    assert clock.sleeps == [3.0]
    calls = discord.calls()
    assert calls[1].at - calls[0].at == 3.0


async def test_empty_bucket_does_not_hold_back_another_channel(discord: FakeDiscord, messenger: DiscordMessenger,
                                                               clock: FakeClock) -> None:
    elsewhere = discord.add_channel("elsewhere")
    await messenger.post(place(discord, channel=elsewhere), Content(text="learn the bucket there"))
    bucket = discord.calls()[-1].answer_headers["X-RateLimit-Bucket"]
    exhausted = {"X-RateLimit-Bucket": bucket, "X-RateLimit-Remaining": "0", "X-RateLimit-Reset-After": "3"}
    discord.answer_next("POST", MESSAGES, body={"id": "700000000000000001"}, headers=exhausted)
    await messenger.post(place(discord), Content(text="first"))
    await messenger.post(place(discord, channel=elsewhere), Content(text="elsewhere"))
    assert clock.sleeps == []


async def test_edits_of_different_messages_in_one_channel_share_a_bucket(discord: FakeDiscord,
                                                                         messenger: DiscordMessenger,
                                                                         clock: FakeClock) -> None:
    first = await messenger.post(place(discord), Content(text="one"))
    second = await messenger.post(place(discord), Content(text="two"))
    exhausted = {"X-RateLimit-Bucket": "edits", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset-After": "1.5"}
    discord.answer_next("PATCH", MESSAGE, body={"id": first.message_id}, headers=exhausted)
    await messenger.edit(first, Content(text="one, edited"))
    await messenger.edit(second, Content(text="two, edited"))
    assert clock.sleeps == [1.5]
    assert discord.edits(discord.channel_id, int(first.message_id)) == []
    assert [edit.content for edit in discord.edits(discord.channel_id, int(second.message_id))] == ["two, edited"]


async def test_missing_permissions_raises_at_once_with_discords_code_and_message(discord: FakeDiscord,
                                                                                 messenger: DiscordMessenger,
                                                                                 clock: FakeClock) -> None:
    discord.fail_next("POST", MESSAGES, status=403)
    with pytest.raises(MessengerError) as raised:
        await messenger.post(place(discord), Content(text="hello"))
    assert str(raised.value) == raised.value.reason == "50013: Missing Permissions"
    assert raised.value.retryable is False
    assert len(discord.calls()) == 1 and clock.sleeps == []


async def test_rate_limit_outlasting_the_attempts_raises_a_retryable_error(discord: FakeDiscord,
                                                                           http: httpx.AsyncClient,
                                                                           clock: FakeClock) -> None:
    messenger = DiscordMessenger(http, max_attempts=3, sleep=clock.sleep, clock=clock)
    discord.fail_next("POST", MESSAGES, status=429, retry_after=1.0, times=5)
    with pytest.raises(MessengerError) as raised:
        await messenger.post(place(discord), Content(text="lost?"))
    assert raised.value.retryable and raised.value.reason == "rate_limited"
    assert len(discord.calls()) == 3 and discord.messages(discord.channel_id) == []


async def test_429_asking_for_a_very_long_wait_is_raised_at_once_as_retryable(discord: FakeDiscord,
                                                                              messenger: DiscordMessenger,
                                                                              clock: FakeClock) -> None:
    discord.fail_next("POST", MESSAGES, status=429, retry_after=3_600.0)
    with pytest.raises(MessengerError) as raised:
        await messenger.post(place(discord), Content(text="later"))
    assert raised.value.retryable and clock.sleeps == [] and len(discord.calls()) == 1


async def test_text_over_2000_characters_is_posted_as_several_messages_with_components_on_the_last(
        discord: FakeDiscord, messenger: DiscordMessenger) -> None:
    paragraphs = [f"Paragraph {index}: " + "words " * 60 for index in range(20)]
    text = "\n\n".join(paragraph.strip() for paragraph in paragraphs)
    assert len(text) > TEXT_LIMIT
    ref = await messenger.post(place(discord), with_buttons(text))
    posted = discord.messages(discord.channel_id)
    assert len(posted) > 1 and str(posted[0].id) == ref.message_id
    assert all(len(message.content) <= TEXT_LIMIT for message in posted)
    assert re.sub(r"\s", "", "".join(message.content for message in posted)) == re.sub(r"\s", "", text)
    assert ["components" in call.json for call in discord.calls("POST")] == [False] * (len(posted) - 1) + [True]
    assert all(message.allowed_mentions == {"parse": []} for message in posted)
    assert len({message.nonce for message in posted}) == len(posted)


async def test_edit_over_2000_characters_raises_content_too_long_without_calling_discord(
        discord: FakeDiscord, messenger: DiscordMessenger) -> None:
    ref = await messenger.post(place(discord), Content(text="status"))
    with pytest.raises(MessengerError) as raised:
        await messenger.edit(ref, Content(text="x" * (TEXT_LIMIT + 1)))
    assert raised.value.reason == "content_too_long" and not raised.value.retryable
    assert [call.method for call in discord.calls()] == ["POST"]


async def test_edit_without_components_removes_the_old_buttons(discord: FakeDiscord,
                                                                messenger: DiscordMessenger) -> None:
    ref = await messenger.post(place(discord), with_buttons("running"))
    await messenger.edit(ref, Content(text="done"))
    edit = discord.calls()[-1]
    assert (edit.method, edit.path) == ("PATCH", f"/channels/{discord.channel_id}/messages/{ref.message_id}")
    assert edit.json["components"] == [] and edit.json["embeds"] == []
    assert edit.json["allowed_mentions"] == {"parse": []} and edit.json["content"] == "done"
    assert discord.message(discord.channel_id, int(ref.message_id)).components == []


async def test_open_thread_posts_the_status_in_the_channel_then_starts_a_thread_from_it(
        discord: FakeDiscord, messenger: DiscordMessenger) -> None:
    channel = discord.channel_id
    title = Content(text="What changed in\nthe EU AI Act " + "and its annexes " * 20)
    opened = await messenger.open_thread(place(discord), title=title, status=with_buttons("searching"))
    post, start = discord.calls()
    assert post.path == f"/channels/{channel}/messages" and post.json["content"] == "searching"
    [status_message] = discord.messages(channel)
    assert start.path == f"/channels/{channel}/messages/{status_message.id}/threads"
    name = start.json["name"]
    assert len(name) <= 100 and name.endswith("…") and "\n" not in name and name.startswith("What changed in the EU")
    assert start.json["auto_archive_duration"] == 1440
    [thread] = discord.threads(channel)
    assert opened.thread == str(thread.id) and status_message.thread_id == thread.id
    assert opened.status == MessageRef(platform="discord", workspace=str(discord.guild_id), channel=str(channel),
                                       message_id=str(status_message.id), thread=opened.thread)
    await messenger.edit(opened.status, Content(text="reading"))
    await messenger.post(place(discord, thread=int(opened.thread)), Content(text="the report"))
    assert discord.calls()[-2].path == f"/channels/{channel}/messages/{status_message.id}"
    assert discord.calls()[-1].path == f"/channels/{opened.thread}/messages"


async def test_thread_start_retried_after_a_lost_answer_uses_the_thread_already_made(
        discord: FakeDiscord, messenger: DiscordMessenger) -> None:
    discord.answer_next("POST", r"/threads$", status=500, carried_out=True)
    opened = await messenger.open_thread(place(discord), title=Content(text="Question"),
                                         status=Content(text="searching"))
    starts = [call for call in discord.calls() if call.path.endswith("/threads")]
    assert [call.status for call in starts] == [500, 400]
    assert opened.thread == opened.status.message_id == opened.status.thread
    assert [str(thread.id) for thread in discord.threads(discord.channel_id)] == [opened.thread]


async def test_open_thread_in_direct_messages_creates_no_thread_and_the_thread_is_the_channel(
        discord: FakeDiscord, messenger: DiscordMessenger) -> None:
    direct = discord.create_dm(discord.new_user("asker"))
    place_in_dm = Place(platform="discord", workspace=DIRECT_MESSAGES, channel=str(direct))
    opened = await messenger.open_thread(place_in_dm, title=Content(text="Question"), status=Content(text="searching"))
    [post] = discord.calls()
    assert post.path == f"/channels/{direct}/messages"
    assert discord.threads() == []
    assert opened.thread == str(direct)
    assert (opened.status.channel, opened.status.workspace) == (str(direct), DIRECT_MESSAGES)
    await messenger.post(place_in_dm.model_copy(update={"thread": opened.thread}), Content(text="the report"))
    assert discord.calls()[-1].path == f"/channels/{direct}/messages"


async def test_upload_sends_multipart_with_payload_json_and_the_file_bytes(discord: FakeDiscord,
                                                                           messenger: DiscordMessenger) -> None:
    thread = new_thread(discord)
    data = "# Report\n\nEvery word kept, even ünïcödé.\n".encode()
    ref = await messenger.upload(place(discord, thread=thread),
                                 FileUpload(filename="report.md", data=data, title="Report", comment="The full report"))
    [call] = discord.calls()
    assert call.path == f"/channels/{thread}/messages"
    assert discord.requests.all()[-1].headers["content-type"].startswith("multipart/form-data")
    assert call.json["content"] == "The full report"
    assert call.json["attachments"] == [{"id": 0, "filename": "report.md", "title": "Report"}]
    assert call.json["allowed_mentions"] == {"parse": []}
    assert call.json["enforce_nonce"] is True and call.json["nonce"]
    assert [(file.field, file.filename, file.data, file.content_type) for file in uploaded_files(discord)] == [
        ("files[0]", "report.md", data, "text/markdown")]
    assert ref.message_id in {str(message.id) for message in discord.messages(thread)} and ref.channel == str(thread)


async def test_upload_of_other_files_is_octet_stream_and_may_have_no_comment(discord: FakeDiscord,
                                                                            messenger: DiscordMessenger) -> None:
    await messenger.upload(place(discord), FileUpload(filename="report.html", data=b"<p>hi</p>"))
    [call] = discord.calls()
    assert call.json["content"] == "" and call.json["attachments"] == [{"id": 0, "filename": "report.html"}]
    assert [(file.field, file.filename, file.data, file.content_type) for file in uploaded_files(discord)] == [
        ("files[0]", "report.html", b"<p>hi</p>", "application/octet-stream")]


async def test_token_never_appears_in_errors_or_logs(discord: FakeDiscord, http: httpx.AsyncClient, clock: FakeClock,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    messenger = DiscordMessenger(http, max_attempts=2, sleep=clock.sleep, clock=clock)
    errors: list[MessengerError] = []
    discord.fail_next("POST", MESSAGES, status=403)
    discord.fail_next("POST", MESSAGES, status=429, retry_after=1.0, times=2)
    discord.answer_next("POST", MESSAGES, status=500, times=2)
    discord.answer_next("POST", MESSAGES, error=httpx.ConnectError("connection refused"), times=2)
    discord.answer_next("POST", MESSAGES, status=401, body={"message": "401: Unauthorized", "code": 0})
    for _ in range(5):
        with pytest.raises(MessengerError) as raised:
            await messenger.post(place(discord), Content(text="secret question text"))
        errors.append(raised.value)
    assert [error.reason for error in errors] == ["50013: Missing Permissions", "rate_limited", "http_500",
                                                  "connection_error", "0: 401: Unauthorized"]
    assert "rate limit" in caplog.text
    for error in errors:
        assert discord.token not in str(error) and discord.token not in repr(error)
        assert discord.token not in repr(error.__cause__)
    assert discord.token not in caplog.text and "secret question text" not in caplog.text


def test_build_discord_http_signs_with_the_bot_token_under_the_api_url() -> None:
    client = build_discord_http(FAKE_TOKEN, "http://127.0.0.1:9/api/v10")
    request = client.build_request("POST", "/channels/1/messages")
    assert str(request.url) == "http://127.0.0.1:9/api/v10/channels/1/messages"
    assert request.headers["Authorization"] == f"Bot {FAKE_TOKEN}"
    assert request.headers["User-Agent"] == "DiscordBot (https://github.com/deepthread, 0.1)"
    assert client.timeout.read is not None


async def test_a_direct_message_opens_the_persons_dm_channel_and_posts_in_it(discord: FakeDiscord,
                                                                             messenger: DiscordMessenger) -> None:
    person = discord.new_user("owner")

    ref = await messenger.direct("123", str(person.id), Content(text="Your watch stopped."))

    assert int(ref.channel) == discord.create_dm(person) and ref.workspace == DIRECT_MESSAGES
    assert [message.content for message in discord.messages(int(ref.channel))] == ["Your watch stopped."]


async def test_a_persons_direct_message_channel_is_opened_once(discord: FakeDiscord,
                                                               messenger: DiscordMessenger) -> None:
    person, other = discord.new_user("owner"), discord.new_user("other")

    for user in (person, other, person):
        await messenger.direct("123", str(user.id), Content(text="Your watch stopped."))

    assert len(discord.calls("POST", "/users/@me/channels")) == 2
    assert [message.content for message in discord.messages(discord.create_dm(person))] == ["Your watch stopped."] * 2
