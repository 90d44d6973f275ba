"""The fake Discord against the real discord.py client (gateway + REST) and plain httpx: it must speak Discord's wire
formats well enough that neither can tell, and enforce Discord's rules (intents, limits, nonces, rate limits)."""

from __future__ import annotations

import asyncio
import json
import math
import zlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import discord
import discord.gateway
import discord.http
import httpx
import pytest
from discord import app_commands

from tests.fakes.clock import FakeClock
from tests.fakes.discord_api import FakeDiscord, discord_py_pointed_at
from tests.fakes.discord_gateway import INTENT_GUILD_MESSAGES, INTENT_GUILDS, INTENT_MESSAGE_CONTENT

pytestmark = pytest.mark.integration

# How long discord.py waits for further GUILD_CREATEs after the last one before on_ready (its default is 2 s).
READY_GRACE = 0.5
TIMEOUT = 10.0


class BotUnderTest:
    """A real discord.Client with a CommandTree, turning the events the tests wait on into asyncio queues."""

    def __init__(self, token: str, intents: discord.Intents) -> None:
        self.token = token
        self.client = discord.Client(intents=intents, guild_ready_timeout=READY_GRACE, enable_debug_events=True)
        self.tree = app_commands.CommandTree(self.client)
        self.ready = asyncio.Event()
        self.heartbeat_acked = asyncio.Event()
        self.resumed = asyncio.Event()
        self.messages: asyncio.Queue[discord.Message] = asyncio.Queue()
        self.reactions: asyncio.Queue[discord.RawReactionActionEvent] = asyncio.Queue()
        self.created_threads: asyncio.Queue[discord.Thread] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None
        client = self.client

        @client.event
        async def on_ready() -> None:
            self.ready.set()

        @client.event
        async def on_resumed() -> None:
            self.resumed.set()

        @client.event
        async def on_message(message: discord.Message) -> None:
            if client.user is None or message.author.id != client.user.id:
                self.messages.put_nowait(message)

        @client.event
        async def on_raw_reaction_add(payload: discord.RawReactionActionEvent) -> None:
            self.reactions.put_nowait(payload)

        @client.event
        async def on_thread_create(thread: discord.Thread) -> None:
            self.created_threads.put_nowait(thread)

        @client.event
        async def on_socket_raw_receive(raw: str) -> None:
            if json.loads(raw).get("op") == 11:
                self.heartbeat_acked.set()

    async def start(self) -> None:
        """Log in and connect; returns once on_ready fired, raises what `client.start` raised if it ended first."""
        self.task = asyncio.create_task(self.client.start(self.token))
        ready = asyncio.create_task(self.ready.wait())
        done, _ = await asyncio.wait({self.task, ready}, timeout=TIMEOUT, return_when=asyncio.FIRST_COMPLETED)
        if self.task in done:
            ready.cancel()
            self.task.result()
            raise AssertionError("client.start() returned before on_ready")
        if ready not in done:
            raise AssertionError("on_ready did not fire")

    async def stop(self) -> None:
        await self.client.close()
        if self.task is not None and not self.task.done():
            await asyncio.wait_for(self.task, TIMEOUT)


async def next_event(queue: asyncio.Queue[Any]) -> Any:
    return await asyncio.wait_for(queue.get(), TIMEOUT)


@pytest.fixture
def discord_fake(request: pytest.FixtureRequest) -> Iterator[FakeDiscord]:
    """A started fake (options from indirect parametrization) with discord.py's Route.BASE and gateway aimed at it."""
    saved = discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY
    with FakeDiscord(**getattr(request, "param", {})) as fake, discord_py_pointed_at(fake):
        yield fake
    assert (discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY) == saved


@pytest.fixture
async def make_bot(discord_fake: FakeDiscord) -> AsyncIterator[Any]:
    bots: list[BotUnderTest] = []

    def make(intents: discord.Intents | None = None) -> BotUnderTest:
        bot = BotUnderTest(discord_fake.token, intents or discord.Intents.default())
        bots.append(bot)
        return bot

    yield make
    for bot in bots:
        await bot.stop()


@pytest.fixture
def rest(discord_fake: FakeDiscord) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=discord_fake.api_url, headers={"Authorization": f"Bot {discord_fake.token}"},
                      timeout=TIMEOUT) as client:
        yield client


# --- discord.py through the gateway ----------------------------------------------------------------


async def test_client_connects_with_compressed_gateway_gets_ready_guild_and_heartbeat_acks(
        discord_fake: FakeDiscord, make_bot: Any) -> None:
    bot = make_bot()
    await bot.start()

    guild = bot.client.get_guild(discord_fake.guild_id)
    assert guild is not None and guild.name == "Deepthread Test"
    assert isinstance(bot.client.get_channel(discord_fake.channel_id), discord.TextChannel)
    assert guild.me is not None and guild.me.id == discord_fake.bot.id
    assert bot.client.user is not None and bot.client.user.id == discord_fake.bot.id
    assert bot.client.application_id == discord_fake.application_id
    [identify] = discord_fake.identify_payloads
    assert identify["token"] == discord_fake.token and identify["intents"] == bot.client.intents.value
    [connection] = discord_fake.gateway_connections()
    assert connection.compress == discord.utils._ActiveDecompressionContext.COMPRESSION_TYPE
    assert connection.query["v"] == "10" and connection.query["encoding"] == "json"
    assert connection.binary_frames_sent == connection.frames_sent > 0
    await asyncio.wait_for(bot.heartbeat_acked.wait(), TIMEOUT)
    assert connection.heartbeats >= 1 and math.isfinite(bot.client.latency)


async def test_reconnect_request_resumes_the_session(discord_fake: FakeDiscord, make_bot: Any) -> None:
    bot = make_bot()
    await bot.start()
    discord_fake.request_reconnect()
    await asyncio.wait_for(bot.resumed.wait(), TIMEOUT)

    first, second = discord_fake.gateway_connections()
    assert second.resumed and second.session_id == first.session_id
    assert len(discord_fake.identify_payloads) == 1
    alice = discord_fake.new_user("alice")
    discord_fake.user_message(alice, discord_fake.channel_id, f"{discord_fake.bot.mention} still there?",
                              mentions=[discord_fake.bot])
    assert (await next_event(bot.messages)).content.endswith("still there?")


async def test_slash_command_runs_with_its_option_defers_ephemerally_and_follows_up(
        discord_fake: FakeDiscord, make_bot: Any) -> None:
    bot = make_bot()
    asked: asyncio.Queue[tuple[str, discord.Interaction]] = asyncio.Queue()

    @bot.tree.command(name="research", description="Research a question")
    async def research(interaction: discord.Interaction, question: str) -> None:
        await interaction.response.defer(ephemeral=True, thinking=True)
        await interaction.followup.send(f"Researching: {question}", ephemeral=True)
        await asked.put((question, interaction))

    await bot.start()
    alice = discord_fake.new_user("alice")
    interaction_id = discord_fake.send_command(alice, discord_fake.channel_id, "research", {"question": "Why is the sky blue?"})

    question, interaction = await next_event(asked)
    assert question == "Why is the sky blue?"
    assert interaction.id == interaction_id and interaction.user.id == alice.id
    assert isinstance(interaction.user, discord.Member) and interaction.guild_id == discord_fake.guild_id
    # The fake, like Discord, refuses a callback after its 3 s: a recorded response was in time.
    [response] = discord_fake.interaction_responses(interaction_id)
    assert response.type == 5 and response.flags == 64
    [followup] = await discord_fake.wait_for_async(lambda: discord_fake.followups(interaction_id))
    assert followup.content == "Researching: Why is the sky blue?" and followup.ephemeral
    assert followup.id == discord_fake.interaction(interaction_id).original_message_id


async def test_a_dm_command_carries_a_user_and_dm_messages_keep_their_content(
        discord_fake: FakeDiscord, make_bot: Any) -> None:
    bot = make_bot()
    invoked: asyncio.Queue[discord.Interaction] = asyncio.Queue()

    @bot.tree.command(name="research", description="Research a question")
    async def research(interaction: discord.Interaction, question: str) -> None:
        await interaction.response.send_message(f"On it: {question}")
        await invoked.put(interaction)

    await bot.start()
    alice = discord_fake.new_user("alice")
    dm = discord_fake.create_dm(alice)
    discord_fake.send_command(alice, dm, "research", {"question": "Is a DM private?"})

    interaction = await next_event(invoked)
    assert interaction.guild_id is None and isinstance(interaction.channel, discord.DMChannel)
    assert type(interaction.user) is discord.User and interaction.user.id == alice.id
    [reply] = discord_fake.messages(dm)
    assert (reply.content, reply.type, reply.ephemeral) == ("On it: Is a DM private?", 20, False)
    discord_fake.user_message(alice, dm, "no mention needed in a DM")
    message = await next_event(bot.messages)
    assert message.content == "no mention needed in a DM" and isinstance(message.channel, discord.DMChannel)


async def test_tree_sync_uses_the_guild_route_for_a_guild_and_the_global_route_otherwise(
        discord_fake: FakeDiscord, make_bot: Any) -> None:
    bot = make_bot()
    invoked_with: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    @bot.tree.command(name="research", description="Research a question")
    async def research(interaction: discord.Interaction, question: str) -> None:
        await interaction.response.send_message("ok")
        await invoked_with.put(dict(interaction.data or {}))

    await bot.start()
    guild = discord.Object(discord_fake.guild_id)
    bot.tree.copy_global_to(guild=guild)
    guild_commands = await bot.tree.sync(guild=guild)
    global_commands = await bot.tree.sync()

    assert [sync.guild_id for sync in discord_fake.synced_commands] == [discord_fake.guild_id, None]
    assert [call.path for call in discord_fake.calls("PUT")] == [
        f"/applications/{discord_fake.application_id}/guilds/{discord_fake.guild_id}/commands",
        f"/applications/{discord_fake.application_id}/commands"]
    assert [command.name for command in guild_commands] == [command.name for command in global_commands] == ["research"]
    assert guild_commands[0].guild_id == discord_fake.guild_id and global_commands[0].guild_id is None
    assert discord_fake.commands(discord_fake.guild_id)[0]["id"] == str(guild_commands[0].id)

    discord_fake.send_command(discord_fake.new_user("bob"), discord_fake.channel_id, "research", {"question": "q"})
    data = await next_event(invoked_with)
    assert (data["id"], data["guild_id"]) == (str(guild_commands[0].id), str(discord_fake.guild_id))


async def test_message_content_intent_requested_but_not_enabled_closes_4014(
        discord_fake: FakeDiscord, make_bot: Any) -> None:
    intents = discord.Intents.default()
    intents.message_content = True
    bot = make_bot(intents)

    with pytest.raises(discord.PrivilegedIntentsRequired):
        await bot.start()
    [connection] = discord_fake.gateway_connections()
    assert connection.close_code == 4014 and connection.closed_by == "server"
    assert discord_fake.identify_payloads[0]["intents"] & INTENT_MESSAGE_CONTENT


async def test_without_the_content_intent_only_messages_mentioning_the_bot_carry_content(
        discord_fake: FakeDiscord, make_bot: Any) -> None:
    bot = make_bot()
    await bot.start()
    channel = bot.client.get_channel(discord_fake.channel_id)
    assert isinstance(channel, discord.TextChannel)
    thread = await channel.create_thread(name="Research thread", type=discord.ChannelType.public_thread)
    alice = discord_fake.new_user("alice")

    discord_fake.user_message(alice, thread.id, "a secret the bot may not read")
    unmentioned = await next_event(bot.messages)
    discord_fake.user_message(alice, thread.id, f"{discord_fake.bot.mention} tell me more", mentions=[discord_fake.bot])
    mentioned = await next_event(bot.messages)

    assert unmentioned.content == "" and unmentioned.author.id == alice.id
    assert mentioned.content == f"<@{discord_fake.bot.id}> tell me more"
    assert [user.id for user in mentioned.mentions] == [discord_fake.bot.id]
    assert [message.content for message in discord_fake.messages(thread.id)] == [
        "a secret the bot may not read", f"<@{discord_fake.bot.id}> tell me more"]


@pytest.mark.parametrize("discord_fake", [{"message_content_intent_enabled": True}], indirect=True)
async def test_with_the_content_intent_enabled_and_requested_every_message_carries_content(
        discord_fake: FakeDiscord, make_bot: Any) -> None:
    intents = discord.Intents.default()
    intents.message_content = True
    bot = make_bot(intents)
    await bot.start()
    assert bot.client.application_flags.gateway_message_content

    discord_fake.user_message(discord_fake.new_user("alice"), discord_fake.channel_id, "plain words")
    assert (await next_event(bot.messages)).content == "plain words"


async def test_thread_created_over_rest_is_cached_and_its_messages_and_reactions_reach_the_bot(
        discord_fake: FakeDiscord, make_bot: Any) -> None:
    bot = make_bot()
    await bot.start()
    channel = bot.client.get_channel(discord_fake.channel_id)
    assert isinstance(channel, discord.TextChannel)
    status = await channel.send("Researching…", allowed_mentions=discord.AllowedMentions.none())
    thread = await status.create_thread(name="Research: why is the sky blue?")

    cached = await next_event(bot.created_threads)
    assert cached.id == thread.id == status.id
    assert bot.client.get_channel(thread.id) is cached and cached.parent_id == discord_fake.channel_id
    [stored] = discord_fake.threads(discord_fake.channel_id)
    assert stored.id == thread.id and stored.type == 11 and stored.owner_id == discord_fake.bot.id

    alice = discord_fake.new_user("alice")
    discord_fake.user_message(alice, thread.id, f"{discord_fake.bot.mention} and at sunset?", mentions=[discord_fake.bot])
    message = await next_event(bot.messages)
    assert isinstance(message.channel, discord.Thread)
    assert message.channel.id == thread.id and message.channel.parent_id == discord_fake.channel_id

    discord_fake.add_reaction(alice, discord_fake.channel_id, status.id, "❌")
    reaction = await next_event(bot.reactions)
    assert (reaction.user_id, reaction.message_id, reaction.channel_id) == (alice.id, status.id, discord_fake.channel_id)
    assert str(reaction.emoji) == "❌" and reaction.member is not None and reaction.member.id == alice.id
    assert discord_fake.message(discord_fake.channel_id, status.id).reactions == {"❌": [alice.id]}


async def test_discord_py_waits_out_a_scripted_429_and_sends_once(discord_fake: FakeDiscord, make_bot: Any) -> None:
    bot = make_bot()
    await bot.start()
    channel = bot.client.get_channel(discord_fake.channel_id)
    assert isinstance(channel, discord.TextChannel)
    discord_fake.fail_next("POST", r"^/channels/\d+/messages$", retry_after=0.2)

    sent = await channel.send("after the rate limit")

    assert [call.status for call in discord_fake.calls("POST", path_contains="/messages")] == [429, 200]
    assert [message.id for message in discord_fake.messages(discord_fake.channel_id)] == [sent.id]


async def test_button_click_reaches_the_view_and_updates_the_message(discord_fake: FakeDiscord, make_bot: Any) -> None:
    bot = make_bot()
    clicked: asyncio.Queue[discord.Interaction] = asyncio.Queue()

    class Stop(discord.ui.View):
        @discord.ui.button(label="Stop", custom_id="stop-research")
        async def stop(self, interaction: discord.Interaction, button: discord.ui.Button[Any]) -> None:
            await interaction.response.edit_message(content="Stopped.", view=None)
            await clicked.put(interaction)

    await bot.start()
    view = Stop(timeout=None)
    bot.client.add_view(view)
    channel = bot.client.get_channel(discord_fake.channel_id)
    assert isinstance(channel, discord.TextChannel)
    status = await channel.send("Researching…", view=view)

    interaction_id = discord_fake.click_button(discord_fake.new_user("alice"), channel.id, status.id, "stop-research")

    assert (await next_event(clicked)).id == interaction_id
    [response] = discord_fake.interaction_responses(interaction_id)
    assert response.type == 7
    assert discord_fake.message(channel.id, status.id).content == "Stopped."
    assert [edit.components for edit in discord_fake.edits(channel.id, status.id)] == [[]]


async def test_a_modal_answering_a_click_is_shown_to_the_clicker_and_its_submission_reaches_discord_py(
        discord_fake: FakeDiscord, make_bot: Any) -> None:
    bot = make_bot()
    submitted: asyncio.Queue[discord.Interaction] = asyncio.Queue()

    class Why(discord.ui.Modal, title="What was wrong?"):
        answer = discord.ui.Label(text="What was wrong", component=discord.ui.TextInput(
            custom_id="answer", style=discord.TextStyle.paragraph, required=False, max_length=3000))

        async def on_submit(self, interaction: discord.Interaction) -> None:
            await interaction.response.defer(ephemeral=True, thinking=True)
            await submitted.put(interaction)

    @bot.client.event
    async def on_interaction(interaction: discord.Interaction) -> None:
        if interaction.type is discord.InteractionType.component:
            await interaction.response.send_modal(Why(custom_id="why:7"))

    await bot.start()
    channel = bot.client.get_channel(discord_fake.channel_id)
    assert isinstance(channel, discord.TextChannel)
    report = await channel.send("A report")
    alice = discord_fake.new_user("alice")
    click = discord_fake.click_button(alice, channel.id, report.id, "thumbs-down")
    modal = await discord_fake.wait_for_async(lambda: discord_fake.modal(click))
    assert modal["custom_id"] == "why:7" and modal["title"] == "What was wrong?"

    with pytest.raises(AssertionError, match="only to the person"):
        discord_fake.submit_modal(discord_fake.new_user("mallory"), click, {"answer": "not mine"})
    submission = discord_fake.submit_modal(alice, click, {"answer": "A wrong figure."})
    interaction = await next_event(submitted)

    assert interaction.id == submission and interaction.message is not None and interaction.message.id == report.id
    assert interaction.data is not None and interaction.data.get("custom_id") == "why:7"
    [answered] = discord_fake.interaction_responses(submission)
    assert answered.type == 5 and answered.ephemeral
    with pytest.raises(AssertionError, match="no open modal"):
        discord_fake.submit_modal(alice, click, {"answer": "twice"})


# --- REST with plain httpx -------------------------------------------------------------------------


def _error(response: httpx.Response) -> dict[str, Any]:
    return response.json()


def test_message_limits_answer_invalid_form_body_and_store_nothing(discord_fake: FakeDiscord, rest: httpx.Client) -> None:
    path = f"/channels/{discord_fake.channel_id}/messages"
    too_long = rest.post(path, json={"content": "x" * 2001})
    long_description = rest.post(path, json={"embeds": [{"description": "d" * 4097}]})
    too_many_embeds = rest.post(path, json={"embeds": [{"title": "t"}] * 11})
    too_many_fields = rest.post(path, json={"embeds": [{"fields": [{"name": "n", "value": "v"}] * 26}]})
    too_much_text = rest.post(path, json={"embeds": [{"description": "d" * 4000}, {"description": "d" * 2001}]})
    empty = rest.post(path, json={"content": "   "})

    assert {response.status_code for response in (too_long, long_description, too_many_embeds, too_many_fields,
                                                  too_much_text, empty)} == {400}
    assert _error(too_long) == {"code": 50035, "message": "Invalid Form Body", "errors": {"content": {"_errors": [
        {"code": "BASE_TYPE_MAX_LENGTH", "message": "Must be 2000 or fewer in length."}]}}}
    assert _error(long_description)["errors"]["embeds"]["0"]["description"]["_errors"][0]["code"] == "BASE_TYPE_MAX_LENGTH"
    assert _error(too_many_embeds)["errors"]["embeds"]["_errors"][0]["message"] == "Must be 10 or fewer in length."
    assert _error(too_many_fields)["errors"]["embeds"]["0"]["fields"]["_errors"][0]["message"] == "Must be 25 or fewer in length."
    assert _error(too_much_text)["code"] == 50035
    assert _error(too_much_text)["errors"]["embeds"]["_errors"][0]["code"] == "MAX_EMBED_SIZE_EXCEEDED"
    assert _error(empty) == {"code": 50006, "message": "Cannot send an empty message"}
    assert discord_fake.messages(discord_fake.channel_id) == []
    assert rest.post(path, json={"content": "x" * 2000}).status_code == 200


def test_enforced_nonce_returns_the_first_message_and_stores_one(discord_fake: FakeDiscord, rest: httpx.Client) -> None:
    path = f"/channels/{discord_fake.channel_id}/messages"
    body = {"content": "Final answer", "nonce": "run-42-final", "enforce_nonce": True, "allowed_mentions": {"parse": []}}
    first, again = rest.post(path, json=body), rest.post(path, json=body)
    other = rest.post(path, json={**body, "nonce": "run-42-other"})

    assert first.status_code == again.status_code == other.status_code == 200
    assert first.json()["id"] == again.json()["id"] != other.json()["id"]
    assert first.json()["nonce"] == "run-42-final"
    assert [message.id for message in discord_fake.messages(discord_fake.channel_id)] == [
        int(first.json()["id"]), int(other.json()["id"])]
    assert [call.allowed_mentions for call in discord_fake.message_calls()] == [{"parse": []}] * 3


def test_scripted_rate_limit_answers_like_discord_and_stores_nothing(discord_fake: FakeDiscord, rest: httpx.Client) -> None:
    path = f"/channels/{discord_fake.channel_id}/messages"
    discord_fake.fail_next("POST", r"/messages$", retry_after=1.5)
    limited = rest.post(path, json={"content": "hello"})
    allowed = rest.post(path, json={"content": "hello"})

    assert limited.status_code == 429
    assert limited.json() == {"message": "You are being rate limited.", "retry_after": 1.5, "global": False}
    assert limited.headers["Retry-After"] == "2" and limited.headers["X-RateLimit-Remaining"] == "0"
    assert limited.headers["X-RateLimit-Scope"] == "user" and limited.headers["Via"]
    assert allowed.status_code == 200
    for header in ("X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "X-RateLimit-Reset-After",
                   "X-RateLimit-Bucket"):
        assert header in limited.headers and header in allowed.headers
    assert [message.content for message in discord_fake.messages(discord_fake.channel_id)] == ["hello"]

    discord_fake.fail_next("POST", r"/messages$", status=403)
    forbidden = rest.post(path, json={"content": "hello"})
    assert forbidden.status_code == 403 and forbidden.json() == {"code": 50013, "message": "Missing Permissions"}


def test_missing_or_wrong_token_is_unauthorized(discord_fake: FakeDiscord) -> None:
    for headers in ({}, {"Authorization": "Bot not-the-token"}, {"Authorization": f"Bearer {discord_fake.token}"}):
        response = httpx.get(f"{discord_fake.api_url}/users/@me", headers=headers)
        assert response.status_code == 401 and response.json() == {"message": "401: Unauthorized", "code": 0}


def test_multipart_upload_stores_the_attachment(discord_fake: FakeDiscord, rest: httpx.Client) -> None:
    report = b"# Report\r\n\r\n--boundary-lookalike\r\n\x00\xff\r\n"
    payload = {"content": "Full report attached", "attachments": [{"id": 0, "filename": "report.md"}],
               "allowed_mentions": {"parse": []}}
    response = rest.post(f"/channels/{discord_fake.channel_id}/messages",
                         data={"payload_json": json.dumps(payload)},
                         files={"files[0]": ("report.md", report, "text/markdown")})

    assert response.status_code == 200
    [attachment] = response.json()["attachments"]
    assert attachment["filename"] == "report.md" and attachment["size"] == len(report)
    [stored] = discord_fake.messages(discord_fake.channel_id)[0].attachments
    assert stored.filename == "report.md" and stored.data == report and stored.content_type == "text/markdown"
    assert httpx.get(attachment["url"]).content == report
    [call] = discord_fake.message_calls()
    assert call.files == ["report.md"] and call.allowed_mentions == {"parse": []}


def test_unknown_resources_threads_and_double_acknowledgement_answer_discord_codes(
        discord_fake: FakeDiscord, rest: httpx.Client) -> None:
    channel = discord_fake.channel_id
    assert rest.get("/channels/1").json()["code"] == 10003
    assert rest.patch(f"/channels/{channel}/messages/1", json={"content": "x"}).json()["code"] == 10008
    message_id = rest.post(f"/channels/{channel}/messages", json={"content": "start"}).json()["id"]

    unnamed = rest.post(f"/channels/{channel}/messages/{message_id}/threads", json={"name": "n" * 101})
    thread = rest.post(f"/channels/{channel}/messages/{message_id}/threads", json={"name": "Research"})
    second = rest.post(f"/channels/{channel}/messages/{message_id}/threads", json={"name": "Again"})
    assert unnamed.status_code == 400 and unnamed.json()["errors"]["name"]["_errors"][0]["code"] == "BASE_TYPE_BAD_LENGTH"
    assert thread.status_code == 201 and thread.json()["id"] == message_id
    assert thread.json()["parent_id"] == str(channel) and thread.json()["type"] == 11
    assert rest.get(f"/channels/{message_id}").json()["parent_id"] == str(channel)
    assert second.status_code == 400 and second.json()["code"] == 160004

    interaction_id = discord_fake.send_command(discord_fake.new_user("alice"), channel, "research", {"question": "q"})
    token = discord_fake.interaction(interaction_id).token
    callback = f"/interactions/{interaction_id}/{token}/callback"
    first = httpx.post(discord_fake.api_url + callback, json={"type": 5, "data": {"flags": 64}})
    again = httpx.post(discord_fake.api_url + callback, json={"type": 4, "data": {"content": "late"}})
    assert first.status_code == 204
    assert again.status_code == 400 and again.json() == {"message": "Interaction has already been acknowledged.",
                                                         "code": 40060}
    assert [response.type for response in discord_fake.interaction_responses(interaction_id)] == [5]

    late_id = discord_fake.send_command(discord_fake.new_user("bob"), channel, "research", {"question": "q"})
    discord_fake.interaction_timeout = 0.0
    late = httpx.post(f"{discord_fake.api_url}/interactions/{late_id}/{discord_fake.interaction(late_id).token}/callback",
                      json={"type": 5})
    assert late.status_code == 404 and late.json() == {"message": "Unknown interaction", "code": 10062}


# --- the gateway protocol itself, with a raw WebSocket ---------------------------------------------

class RawGateway:
    """A bare gateway client decoding frames the way discord.py does, so each compression is checked on the wire."""

    def __init__(self, socket: aiohttp.ClientWebSocketResponse, compress: str | None) -> None:
        self.socket = socket
        self.compress = compress
        self.frames: list[bytes | str] = []
        self._zlib = zlib.decompressobj()
        self._zstd = None
        if compress == "zstd-stream":
            import zstandard

            self._zstd = zstandard.ZstdDecompressor().decompressobj()

    async def receive(self) -> dict[str, Any]:
        message = await self.socket.receive(timeout=TIMEOUT)
        if message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED):
            return {"closed": message.data}
        self.frames.append(message.data)
        if self._zstd is not None:
            return json.loads(self._zstd.decompress(message.data))
        if self.compress == "zlib-stream":
            return json.loads(self._zlib.decompress(message.data))
        return json.loads(message.data)

    async def send(self, op: int, data: Any) -> None:
        await self.socket.send_str(json.dumps({"op": op, "d": data}))


@pytest.mark.parametrize("compress", [None, "zlib-stream", "zstd-stream"])
async def test_gateway_speaks_each_transport_compression_and_resumes(discord_fake: FakeDiscord, compress: str | None) -> None:
    if compress == "zstd-stream":
        pytest.importorskip("zstandard")
    query = "?v=10&encoding=json" + (f"&compress={compress}" if compress else "")
    intents = INTENT_GUILDS | INTENT_GUILD_MESSAGES
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(discord_fake.gateway_url + query) as socket:
            gateway = RawGateway(socket, compress)
            hello = await gateway.receive()
            assert hello["op"] == 10 and hello["d"]["heartbeat_interval"] == 41250
            await gateway.send(1, None)
            assert (await gateway.receive())["op"] == 11
            await gateway.send(2, {"token": discord_fake.token, "intents": intents, "properties": {}})
            ready, guild_create = await gateway.receive(), await gateway.receive()
            assert (ready["t"], ready["s"], guild_create["t"], guild_create["s"]) == ("READY", 1, "GUILD_CREATE", 2)
            assert ready["d"]["resume_gateway_url"] == discord_fake.gateway_url
            if compress:
                assert all(isinstance(frame, bytes) for frame in gateway.frames)
            if compress == "zlib-stream":
                assert all(frame[-4:] == b"\x00\x00\xff\xff" for frame in gateway.frames)  # type: ignore[index]
            if compress is None:
                assert all(isinstance(frame, str) for frame in gateway.frames)
            await socket.close(code=4000)

        alice = discord_fake.new_user("alice")
        discord_fake.user_message(alice, discord_fake.channel_id, "sent while disconnected")
        async with session.ws_connect(discord_fake.gateway_url + query) as socket:
            gateway = RawGateway(socket, compress)
            assert (await gateway.receive())["op"] == 10
            await gateway.send(6, {"token": discord_fake.token, "session_id": ready["d"]["session_id"], "seq": 2})
            missed, resumed = await gateway.receive(), await gateway.receive()
            assert (missed["t"], missed["s"], missed["d"]["content"]) == ("MESSAGE_CREATE", 3, "")
            assert (resumed["t"], resumed["s"]) == ("RESUMED", 4)

        async with session.ws_connect(discord_fake.gateway_url + query) as socket:
            gateway = RawGateway(socket, compress)
            await gateway.receive()
            await gateway.send(2, {"token": "wrong", "intents": intents, "properties": {}})
            assert (await gateway.receive()) == {"closed": 4004}


def test_a_modal_beyond_discord_s_limits_is_refused_and_no_modal_opens(discord_fake: FakeDiscord,
                                                                       rest: httpx.Client) -> None:
    message_id = rest.post(f"/channels/{discord_fake.channel_id}/messages", json={"content": "report"}).json()["id"]
    text_input = {"type": 4, "custom_id": "answer", "style": 2, "max_length": 3000}
    modal = {"custom_id": "why", "title": "What was wrong?",
             "components": [{"type": 18, "label": "What was wrong", "component": text_input}]}
    too_long = {**modal, "title": "t" * 46,
                "components": [{"type": 18, "label": "l" * 46, "component": {**text_input, "max_length": 4001}}]}
    for body, accepted in ((too_long, False), (modal, True)):
        click = discord_fake.click_button(discord_fake.new_user("alice"), discord_fake.channel_id, int(message_id), "b")
        token = discord_fake.interaction(click).token
        answer = httpx.post(f"{discord_fake.api_url}/interactions/{click}/{token}/callback",
                            json={"type": 9, "data": body})
        if accepted:
            assert answer.status_code == 204 and discord_fake.modal(click) == modal
        else:
            errors = answer.json()["errors"]["data"]
            assert answer.status_code == 400 and discord_fake.modal(click) is None
            assert errors["title"]["_errors"][0]["code"] == "BASE_TYPE_MAX_LENGTH"
            assert errors["components"]["0"]["label"]["_errors"][0]["code"] == "BASE_TYPE_MAX_LENGTH"
            assert "max_length" in errors["components"]["0"]["component"]


async def test_the_fakes_own_rate_limit_is_per_channel_like_discord_s() -> None:
    clock = FakeClock()
    fake = FakeDiscord(clock=clock, rate_limit=(5, 5.0))
    other = fake.add_channel("elsewhere")
    async with fake.client() as client:
        first = [await client.post(f"/channels/{fake.channel_id}/messages", json={"content": f"{index}"})
                 for index in range(6)]
        elsewhere = await client.post(f"/channels/{other}/messages", json={"content": "other channel"})
        clock.advance(5.0)
        later = await client.post(f"/channels/{fake.channel_id}/messages", json={"content": "next window"})

    assert [response.status_code for response in first] == [200] * 5 + [429]
    assert first[4].headers["X-RateLimit-Remaining"] == "0" and float(first[5].json()["retry_after"]) > 0
    assert elsewhere.status_code == 200 and later.status_code == 200
    assert [message.content for message in fake.messages(fake.channel_id)] == ["0", "1", "2", "3", "4", "next window"]
