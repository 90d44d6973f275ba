"""The Discord adapter: discord.py for the gateway, application commands and interactions; the REST messenger
for everything the bot posts, so a run can outlive the interaction token's 15 minutes.

Every listener is thin: acknowledge (an interaction is deferred before anything else), turn the payload into a
ChatEvent (`bot.discord.events`), `await core.handle(event)`, then say the replies: privately as ephemeral
follow-ups of the interaction (or a direct message when there is no interaction), publicly in the thread.

discord.py reaches Discord through DISCORD_API_URL: its REST base is `discord.http.Route.BASE` (a class
attribute, so it is set process-wide), and its gateway URL comes from `GET /gateway/bot` on that base.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import inspect
import logging
import signal
import threading
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import discord
import discord.gateway
import discord.http
import httpx
import yarl
from discord import app_commands

from bot.conversation.events import ChatEvent, ConversationHandler, Outcome, Reply, Visibility
from bot.discord.events import (
    COMMANDS,
    PLATFORM,
    WATCHES_COMMAND,
    Depth,
    WatchesAction,
    Where,
    attachment_ref,
    button_event,
    command_event,
    command_text,
    comment_event,
    message_event,
    message_link,
    reaction_event,
    watch_event,
    watches_text,
)
from bot.discord.feedback import THANKS, comment_run_id, submitted_comment, what_was_wrong_modal
from bot.discord.watches import FormPart, TimeZoneLookup, WatchForm, form_click, form_text, watched_run
from chat.discord.render import KEY, DiscordRenderer, thread_name
from chat.message import Content, Messenger, MessengerError, Place
from chat.render import PlatformRenderer
from config import Settings
from ops.health import process_health
from ops.server import start_ops_server
from storage.vocabulary import zone_of

logger = logging.getLogger(__name__)

SOMETHING_WENT_WRONG = "Sorry, something went wrong while handling that. Please try again in a moment."
HISTORY_COMMAND = "history"
DESCRIPTIONS = {
    HISTORY_COMMAND: "Your recent runs and this channel's (only you see the list)",
    "research": "Research a question on the web and get a cited report in a thread",
    "plan": "Draft a research plan to approve (reply go) or revise before any searching",
    "ask": "A quick answer with no web search",
    WATCHES_COMMAND: "This channel's watches: list, pause, resume or delete one, or set this server's time zone",
}
OPTION_DESCRIPTIONS = {"question": "What to find out", "since": "Only sources from this date on (YYYY-MM-DD)",
                       "site": "Only this domain (several: separate them with spaces)",
                       "depth": "deep: more rounds and sources; quick: fewer",
                       "file": "A file to read and cite (PDF, Word, Markdown, HTML, text, CSV)",
                       "action": "What to do (list when left out)",
                       "value": "The watch's number (pause, resume, delete), or a time zone such as Europe/Paris"}
# Application flags that say the privileged message-content intent is switched on in the developer portal.
GATEWAY_MESSAGE_CONTENT = 1 << 18
GATEWAY_MESSAGE_CONTENT_LIMITED = 1 << 19
# What the bot must be allowed in a channel to run there: post the status, start its thread, talk in it, attach.
NEEDED_PERMISSIONS = {"send_messages": "Send Messages", "create_public_threads": "Create Public Threads",
                      "send_messages_in_threads": "Send Messages in Threads", "embed_links": "Embed Links",
                      "attach_files": "Attach Files", "read_message_history": "Read Message History"}
NO_MENTIONS = discord.AllowedMentions.none()
MESSAGE_CONTENT_OFF = ("The message-content intent is off for this application, so deepthread only sees thread "
                       "replies (and the files they attach) that mention it; files reach it through the file option "
                       "of /research and /ask. Turn on Message Content Intent under Bot in the Discord developer "
                       "portal to answer every follow-up and read every file shared in its threads.")


Components = list[dict[str, Any]]


class PrivateSender(Protocol):
    """Says something to the event's person alone (with buttons or menus, as Discord's component dicts)."""

    def __call__(self, text: str, components: Components | None = None) -> Awaitable[None]: ...


class RawComponents(discord.ui.View):
    """Components already written as Discord's dicts (the renderer's), sent through discord.py as they are. It holds
    no items, so discord.py keeps nothing waiting for its clicks: they reach `on_interaction` by custom id."""

    def __init__(self, components: Components) -> None:
        super().__init__(timeout=None)
        self.components = components

    def to_components(self) -> Components:
        return self.components


def components_of(content: Content) -> Components | None:
    """The buttons and menus a rendered message carries, if any."""
    components = content.extra.get(KEY, {}).get("components")
    return list(components) if components else None


def stored_time_zones(core: ConversationHandler) -> TimeZoneLookup:
    """Each server's time zone for watches, as the core keeps it (`/watches timezone`; UTC until set)."""

    async def lookup(workspace: str) -> str:
        return await core.workspace_timezone("discord", workspace)
    return lookup


@dataclass(frozen=True)
class Connection:
    """What the bot learns from DISCORD_API_URL before it connects: the gateway, and whether it may read messages."""

    gateway_url: str
    message_content: bool


async def discover(http: httpx.AsyncClient) -> Connection:
    """`GET /gateway/bot` (the gateway to dial) and `GET /applications/@me` (the message-content intent's flag);
    raises httpx.HTTPError when Discord refuses the token or cannot be reached."""
    gateway = await http.get("/gateway/bot")
    gateway.raise_for_status()
    application = await http.get("/applications/@me")
    application.raise_for_status()
    flags = int(application.json().get("flags") or 0)
    return Connection(gateway_url=str(gateway.json()["url"]),
                      message_content=bool(flags & (GATEWAY_MESSAGE_CONTENT | GATEWAY_MESSAGE_CONTENT_LIMITED)))


def point_discord_py_at(api_url: str, gateway_url: str) -> None:
    """discord.py's REST base and gateway, process-wide (it keeps both in class attributes; a plain Client
    dials `DEFAULT_GATEWAY` without asking `/gateway/bot`)."""
    discord.http.Route.BASE = api_url.rstrip("/")
    discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(gateway_url)


def missing_permissions(permissions: discord.Permissions) -> list[str]:
    """The permissions the bot lacks in a channel, by their names in Discord's settings."""
    return [label for name, label in NEEDED_PERMISSIONS.items() if not getattr(permissions, name)]


def where_of(channel: Any, *, guild_id: int | None, channel_id: int) -> Where:
    """The Where of a discord.py channel object (a thread knows its parent), with who can see the channel."""
    if isinstance(channel, discord.Thread):
        where = Where.of(guild_id=guild_id, channel_id=channel_id, parent_id=channel.parent_id, is_thread=True)
    else:
        where = Where.of(guild_id=guild_id, channel_id=channel_id)
    return dataclasses.replace(where, visibility=channel_visibility(channel))


def channel_visibility(channel: Any) -> Visibility:
    """Public when the guild's @everyone may view the channel (for a public thread, its parent); private for direct
    messages, private threads, channels hidden from @everyone, and any channel whose settings are not known."""
    if isinstance(channel, discord.Thread):
        if channel.type is discord.ChannelType.private_thread:
            return "private"
        channel = channel.parent
    if isinstance(channel, discord.abc.GuildChannel):
        return "public" if channel.permissions_for(channel.guild.default_role).view_channel else "private"
    return "private"


class DiscordBot:
    """The running bot: a discord.Client with the three commands, and listeners handing events to the core."""

    def __init__(self, settings: Settings, core: ConversationHandler, messenger: Messenger, *,
                 connection: Connection, renderer: PlatformRenderer | None = None,
                 time_zones: TimeZoneLookup | None = None, **client_options: Any) -> None:
        point_discord_py_at(settings.discord_api_url, connection.gateway_url)
        self.settings = settings
        self.core = core
        self.messenger = messenger
        self.renderer = renderer or DiscordRenderer()
        self.time_zones = time_zones or stored_time_zones(core)
        self.message_content = connection.message_content
        intents = discord.Intents.default()
        intents.message_content = connection.message_content
        self.client = discord.Client(intents=intents, allowed_mentions=NO_MENTIONS, **client_options)
        self.tree = app_commands.CommandTree(self.client)
        self.guild_ids = [int(guild) for guild in settings.discord_guild_ids]
        self.ready = asyncio.Event()  # set once the gateway session is ready and the guilds are known
        self.sync_globally = False
        for name in COMMANDS:
            self.tree.add_command(self._command(name))
        self.tree.add_command(self._history_command())
        self.tree.add_command(self._watches_command())
        # discord.py runs this hook before connecting; set on its own Client (wrapped here) rather than a subclass.
        self.client.setup_hook = self._setup  # type: ignore[method-assign]
        self.client.event(self.on_ready)
        self.client.event(self.on_message)
        self.client.event(self.on_raw_reaction_add)
        self.client.event(self.on_interaction)
        self.client.event(self.on_guild_channel_delete)
        self.client.event(self.on_guild_remove)

    def _command(self, name: str) -> app_commands.Command[Any, Any, None]:
        if name == "ask":
            async def callback(interaction: discord.Interaction, question: str,
                               file: discord.Attachment | None = None) -> None:
                await self.on_command(interaction, name, question, file)
        elif name == "research":
            # Three signatures on purpose: discord.py reads a command's options from its callback's parameters.
            async def callback(interaction: discord.Interaction, question: str, since: str | None = None,  # type: ignore[misc]
                               site: str | None = None, depth: Depth | None = None,
                               file: discord.Attachment | None = None) -> None:
                await self.on_command(interaction, name, command_text(question, since=since, site=site, depth=depth),
                                      file)
        else:
            async def callback(interaction: discord.Interaction, question: str, since: str | None = None,  # type: ignore[misc]
                               site: str | None = None, depth: Depth | None = None) -> None:
                await self.on_command(interaction, name, command_text(question, since=since, site=site, depth=depth))
        names = inspect.signature(callback).parameters
        described = app_commands.describe(**{key: text for key, text in OPTION_DESCRIPTIONS.items() if key in names})
        return app_commands.Command(name=name, description=DESCRIPTIONS[name], callback=described(callback))

    def _history_command(self) -> app_commands.Command[Any, Any, None]:
        async def callback(interaction: discord.Interaction) -> None:
            await self.on_command(interaction, HISTORY_COMMAND, HISTORY_COMMAND)
        return app_commands.Command(name=HISTORY_COMMAND, description=DESCRIPTIONS[HISTORY_COMMAND], callback=callback)

    def _watches_command(self) -> app_commands.Command[Any, Any, None]:
        async def callback(interaction: discord.Interaction, action: WatchesAction | None = None,
                           value: str | None = None) -> None:
            await self.on_command(interaction, WATCHES_COMMAND, watches_text(action, value))
        described = app_commands.describe(action=OPTION_DESCRIPTIONS["action"], value=OPTION_DESCRIPTIONS["value"])
        return app_commands.Command(name=WATCHES_COMMAND, description=DESCRIPTIONS[WATCHES_COMMAND],
                                    callback=described(callback))

    async def _setup(self) -> None:
        """Sync the commands: to DISCORD_GUILD_IDS at every start (instant), globally only when asked."""
        for guild_id in self.guild_ids:
            guild = discord.Object(id=guild_id)
            self.tree.copy_global_to(guild=guild)
            synced = await self.tree.sync(guild=guild)
            logger.info("synced %d commands to guild %s", len(synced), guild_id)
        if self.sync_globally:
            synced = await self.tree.sync()
            logger.info("synced %d commands globally (they may take up to an hour to appear)", len(synced))
        if not self.message_content:
            logger.warning(MESSAGE_CONTENT_OFF)

    async def on_ready(self) -> None:
        self.ready.set()
        user = self.client.user
        logger.info("discord bot connected as %s in %d guilds", user.name if user else "?", len(self.client.guilds))

    # -- interactions ------------------------------------------------------------------------------

    async def on_command(self, interaction: discord.Interaction, name: str, text: str,
                         file: discord.Attachment | None = None) -> None:
        """`/research`, `/plan`, `/ask`, `/history`, `/watches`: defer at once, check the channel, hand to the core
        (with the file the command attached), say the replies."""
        await interaction.response.defer(ephemeral=True, thinking=True)
        send_private = self._followup_sender(interaction)
        if interaction.guild_id is not None:
            missing = missing_permissions(interaction.app_permissions)
            if missing:
                await send_private(f"I can't work in this channel: I'm missing the {', '.join(missing)} permission"
                                   f"{'s' if len(missing) > 1 else ''}. Ask an admin to grant them, or to re-invite "
                                   "me with the link from `deepthread discord-invite`.")
                return
        where = where_of(interaction.channel, guild_id=interaction.guild_id, channel_id=interaction.channel_id or 0)
        files = [attachment_ref(attachment_id=file.id, filename=file.filename, size=file.size,
                                content_type=file.content_type, url=file.url, user_id=interaction.user.id)] if file else []
        event = command_event(where, user_id=interaction.user.id, name=name, text=text, interaction_id=interaction.id,
                              files=files)
        outcome = await self._handle(event, send_private)
        if outcome is None:
            return
        if outcome.run_id is not None and outcome.thread and outcome.thread != where.thread:
            await send_private(f"On it: follow along in <#{outcome.thread}>.")
        elif not any(reply.private for reply in outcome.replies):
            await send_private("On it." if outcome.run_id is not None else "Done.")

    async def on_interaction(self, interaction: discord.Interaction) -> None:
        """Buttons (Stop, Retry, Continue, Export, 👍/👎, Watch this, a watch's Pause, Resume and Delete), the watch
        form's menus and the "what was wrong?" modal: acknowledge, then hand the click to the core. Each is known by its
        custom id alone, so what the bot posted before a restart still works."""
        if interaction.type is discord.InteractionType.modal_submit:
            await self._on_comment(interaction)
            return
        if interaction.type is not discord.InteractionType.component or interaction.message is None:
            return
        data: Mapping[str, object] = interaction.data or {}  # a component's data: its custom_id, a menu's values
        custom_id = str(data.get("custom_id", ""))
        where = where_of(interaction.channel, guild_id=interaction.guild_id, channel_id=interaction.channel_id or 0)
        run_id = watched_run(custom_id)
        if run_id is not None:
            await self._open_watch_form(interaction, where, run_id)
            return
        values = data.get("values")
        click = form_click(custom_id, [str(value) for value in values] if isinstance(values, list) else [])
        if click is not None:
            await self._on_watch_form(interaction, where, *click)
            return
        event = button_event(where, user_id=interaction.user.id, message_id=interaction.message.id, custom_id=custom_id)
        if event is None:
            return
        if event.action == "feedback":
            await self._on_feedback(interaction, event)
            return
        await interaction.response.defer()
        await self._handle(event, self._followup_sender(interaction))

    async def _open_watch_form(self, interaction: discord.Interaction, where: Where, run_id: int) -> None:
        """"Watch this": the private form (how often, at what hour, where), its days from today in the server's time
        zone."""
        await interaction.response.defer(ephemeral=True, thinking=True)
        send_private = self._followup_sender(interaction)
        try:
            timezone = await self.time_zones(where.workspace)
            today = dt.datetime.now(zone_of(timezone)).date()
        except Exception:
            logger.exception("could not read the server's time zone for a watch")
            await self._say_privately(send_private, SOMETHING_WENT_WRONG)
            return
        await self._say_privately(send_private, form_text(timezone), WatchForm.opened(run_id, today).components())

    async def _on_watch_form(self, interaction: discord.Interaction, where: Where, part: FormPart,
                             form: WatchForm) -> None:
        """A choice in the watch form draws it again with the choice made; a Watch button hands the watch to the core
        and the form becomes its answer."""
        if part in ("how", "hour"):
            await interaction.response.edit_message(view=RawComponents(form.components()))
            return
        await interaction.response.defer()
        event = watch_event(where, user_id=interaction.user.id, run_id=form.run_id, schedule=form.schedule(),
                            one_thread=part == "one")
        await self._handle(event, self._form_answer_sender(interaction))

    async def _on_feedback(self, interaction: discord.Interaction, event: ChatEvent) -> None:
        """👍/👎 under a report, stored through the core. A 👎 opens the "what was wrong?" modal first: a modal can only
        be an interaction's first answer, and it must come within Discord's 3 s; a 👍 is thanked privately."""
        send_private = self._followup_sender(interaction)
        if event.feedback == "bad" and event.action_run_id is not None:
            try:
                await interaction.response.send_modal(what_was_wrong_modal(event.action_run_id))
            except discord.HTTPException as error:  # the 👎 is stored either way; only the chance to say why is lost
                logger.warning("could not open the feedback modal (%s)", error.status)
                if not interaction.response.is_done():
                    await interaction.response.defer(ephemeral=True)  # acknowledged, so the follow-ups still reach them
            await self._handle(event, send_private)
            return
        await interaction.response.defer(ephemeral=True, thinking=True)
        outcome = await self._handle(event, send_private)
        if outcome is not None and not any(reply.private for reply in outcome.replies):
            await self._say_privately(send_private, THANKS)

    async def _on_comment(self, interaction: discord.Interaction) -> None:
        """The "what was wrong?" modal submitted: acknowledge privately, store the answer through the core, thank."""
        data: Mapping[str, object] = interaction.data or {}  # a modal's data: its custom_id and the inputs' values
        run_id = comment_run_id(str(data.get("custom_id", "")))
        if run_id is None:
            return
        await interaction.response.defer(ephemeral=True, thinking=True)
        components = data.get("components")
        where = where_of(interaction.channel, guild_id=interaction.guild_id, channel_id=interaction.channel_id or 0)
        event = comment_event(where, user_id=interaction.user.id, run_id=run_id,
                              comment=submitted_comment(components if isinstance(components, list) else []))
        send_private = self._followup_sender(interaction)
        outcome = await self._handle(event, send_private)
        if outcome is not None and not any(reply.private for reply in outcome.replies):
            await self._say_privately(send_private, THANKS)

    # -- gateway events ----------------------------------------------------------------------------

    async def on_message(self, message: discord.Message) -> None:
        """Direct messages, replies in threads, and mentions (a mention in a channel opens a thread on it)."""
        me = self.client.user
        if message.author.bot or message.webhook_id is not None or me is None or message.type not in (
                discord.MessageType.default, discord.MessageType.reply):
            return
        where = where_of(message.channel, guild_id=message.guild.id if message.guild else None,
                         channel_id=message.channel.id)
        mentions_bot = me in message.mentions
        link = message_link(where, message.id)
        files = [attachment_ref(attachment_id=attached.id, filename=attached.filename, size=attached.size,
                                content_type=attached.content_type, url=attached.url, user_id=message.author.id,
                                link=link) for attached in message.attachments]
        event = message_event(where, user_id=message.author.id, message_id=message.id, text=message.content,
                              mentions_bot=mentions_bot, bot_user_id=me.id, files=files)
        if event is None:
            return
        if event.kind == "mention" and where.thread is None:
            # The answer needs a thread; one started from the message has the message's id.
            try:
                await message.create_thread(name=thread_name(event.text))
            except discord.HTTPException as error:
                logger.warning("could not start a thread on a mention (%s)", error.status)
                return
            event = event.model_copy(update={"thread": str(message.id)})
        await self._handle(event, self._direct_message_sender(message.author.id))

    async def on_guild_channel_delete(self, channel: discord.abc.GuildChannel) -> None:
        """A channel deleted: the watches made in it stop, saying why (`/watches`)."""
        try:
            await self.core.stop_watches(PLATFORM, str(channel.guild.id), channel=str(channel.id),
                                         reason="its channel was deleted")
        except Exception:
            logger.exception("could not stop the watches of deleted channel %s", channel.id)

    async def on_guild_remove(self, guild: discord.Guild) -> None:
        """The bot removed from a server (kicked or banned, or the server deleted): its watches stop, saying why; what
        is stored of the server stays until `deepthread prune --workspace` (the bot may be invited back)."""
        try:
            await self.core.stop_watches(PLATFORM, str(guild.id), reason="the app was removed from the server")
        except Exception:
            logger.exception("could not stop the watches of server %s, which the app was removed from", guild.id)

    async def on_raw_reaction_add(self, payload: discord.RawReactionActionEvent) -> None:
        """A reaction: the core decides whether it cancels a run or approves a plan; others are ignored."""
        me = self.client.user
        if me is None or payload.user_id == me.id or payload.emoji.name is None:
            return
        where = Where.of(guild_id=payload.guild_id, channel_id=payload.channel_id)
        event = reaction_event(where, user_id=payload.user_id, message_id=payload.message_id, emoji=payload.emoji.name)
        await self._handle(event, self._direct_message_sender(payload.user_id))

    # -- replies -----------------------------------------------------------------------------------

    async def _handle(self, event: ChatEvent, send_private: PrivateSender) -> Outcome | None:
        try:
            outcome = await self.core.handle(event)
        except Exception:
            logger.exception("the conversation core failed on a %s event", event.kind)
            await self._say_privately(send_private, SOMETHING_WENT_WRONG)
            return None
        thread = outcome.thread or event.thread
        for reply in outcome.replies:
            await self._say(reply, event, thread, send_private)
        return outcome

    async def _say(self, reply: Reply, event: ChatEvent, thread: str | None, send_private: PrivateSender) -> None:
        content = reply.content or self.renderer.reply(reply.text, person=reply.person)
        if reply.private or thread is None:
            await self._say_privately(send_private, content.text, components_of(content))
            return
        try:
            await self.messenger.post(Place(platform=event.platform, workspace=event.workspace, channel=event.channel,
                                            thread=thread), content)
        except MessengerError as error:
            logger.warning("could not deliver a reply (%s)", error.reason)

    @staticmethod
    async def _say_privately(send_private: PrivateSender, text: str, components: Components | None = None) -> None:
        try:
            await send_private(text, components)
        except (discord.HTTPException, MessengerError) as error:
            logger.info("could not reply privately (%s)", type(error).__name__)

    @staticmethod
    def _followup_sender(interaction: discord.Interaction) -> PrivateSender:
        async def send(text: str, components: Components | None = None) -> None:
            if components:
                await interaction.followup.send(text, ephemeral=True, allowed_mentions=NO_MENTIONS,
                                                view=RawComponents(components))
            else:
                await interaction.followup.send(text, ephemeral=True, allowed_mentions=NO_MENTIONS)
        return send

    def _form_answer_sender(self, interaction: discord.Interaction) -> PrivateSender:
        """The first private reply replaces the watch form (its menus and buttons go), any further one follows it."""
        follow_up = self._followup_sender(interaction)
        answered = False

        async def send(text: str, components: Components | None = None) -> None:
            nonlocal answered
            if answered:
                await follow_up(text, components)
                return
            answered = True
            await interaction.edit_original_response(content=text, view=RawComponents(components or []),
                                                     allowed_mentions=NO_MENTIONS)
        return send

    def _direct_message_sender(self, user_id: int) -> PrivateSender:
        """Private replies with no interaction to answer go by direct message (when the person accepts them)."""
        async def send(text: str, components: Components | None = None) -> None:
            user = self.client.get_user(user_id) or await self.client.fetch_user(user_id)
            if components:
                await user.send(text, allowed_mentions=NO_MENTIONS, view=RawComponents(components))
            else:
                await user.send(text, allowed_mentions=NO_MENTIONS)
        return send

    # -- running -----------------------------------------------------------------------------------

    async def run(self, token: str) -> None:
        """Connect and serve until `close()`, or SIGTERM or SIGINT in the main thread (discord.py reconnects on its
        own), with `/healthz` and `/metrics` on DISCORD_HTTP_PORT meanwhile. A signal closes the bot and returns, so the
        process exits through its clean-up (the embedded Redis's last user stops it) instead of dying by the signal."""
        health = process_health(self.settings, watch_workers=True)
        ops_server = start_ops_server(self.settings.discord_http_port, health, host=self.settings.http_bind_address,
                                      setting="DISCORD_HTTP_PORT")
        stop_signals = (signal.SIGTERM, signal.SIGINT) if threading.current_thread() is threading.main_thread() else ()
        loop = asyncio.get_running_loop()
        for sent in stop_signals:
            loop.add_signal_handler(sent, self._stop_on, sent)
        try:
            async with self.client:
                await self.client.start(token, reconnect=True)
        finally:
            for sent in stop_signals:
                loop.remove_signal_handler(sent)
            if ops_server is not None:
                await asyncio.to_thread(ops_server.stop)
        logger.info("discord bot stopped")

    def _stop_on(self, sent: signal.Signals) -> None:
        logger.info("discord bot stopping (%s)", sent.name)
        self._closing: asyncio.Future[None] = asyncio.ensure_future(self.close())

    async def close(self) -> None:
        await self.client.close()

