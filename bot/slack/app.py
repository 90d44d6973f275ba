"""The Slack adapter: slack-bolt listeners that acknowledge at once, turn Slack payloads into ChatEvents for the
conversation core, and deliver the replies the core hands back.

Acknowledging: slash commands and buttons call `ack()` before anything else, and bolt acknowledges events itself
before the listener runs; with `process_before_response=False` bolt answers Slack's HTTP request as soon as the ack is
made and runs the rest of the listener as a background task, so nothing the core does can delay the answer.

Every listener is thin: build the event, check that the bot can post in the channel (joining public channels, asking
to be invited into private ones), `await core.handle(event)`, then say the replies: private ones through the
command's `response_url` (`respond`) or `chat.postEphemeral`, public ones in the event's thread. Reply texts are
escaped, so nothing the core quotes can ping anyone.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import BaseModel
from slack_bolt.async_app import AsyncAck, AsyncApp, AsyncBoltContext, AsyncRespond
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_bolt.response import BoltResponse
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.web.async_client import AsyncWebClient

from bot.conversation.events import ChatEvent, ConversationHandler, HistoryMessage, Outcome, Reply, Visibility
from chat.slack.render import WATCH_ACTION_ID, SlackRenderer, blocks_of
from bot.slack.assistant import build_assistant
from bot.slack.bundle import missing_adapter_setting, oauth_mode, web_client
from bot.slack.dedupe import EventDeduper, MemoryReplayGuard, ReplayGuard, request_fingerprint
from bot.slack.feedback import COMMENT_CALLBACK_ID, CommentContext, ask_what_was_wrong, comment_event, feedback_event
from bot.slack.watches import (
    WATCH_BUTTON_ACTIONS,
    WATCH_CALLBACK_ID,
    WATCHES_COMMAND,
    PersonZones,
    open_watch_form,
    read_watch_form,
    today_in,
    watch_button_event,
    watch_event,
    watch_this_context,
    watches_command_event,
)
from chat.slack.feedback import FEEDBACK_ACTION_ID
from chat.slack.messenger import ResponseUrlPoster
from config import Settings
from research.files import FileRef

if TYPE_CHECKING:
    from bot.slack.oauth import OAuthInstalls

logger = logging.getLogger(__name__)

PLATFORM = "slack"
COMMANDS: dict[str, Literal["research", "plan", "ask"]] = {"/research": "research", "/plan": "plan", "/ask": "ask"}
ACTION_IDS: dict[str, Literal["retry", "continue", "export", "cancel"]] = {
    "deepthread_retry": "retry", "deepthread_continue": "continue", "deepthread_export": "export",
    "deepthread_stop": "cancel",
}
# Message subtypes that are still a person writing (a reply also sent to the channel, a message with a file).
PERSON_MESSAGE_SUBTYPES = frozenset({None, "thread_broadcast", "file_share"})
CHANNEL_TYPES_WITH_THREADS = frozenset({"channel", "group", "mpim"})
# What a slash command's `channel_name` and an event's `channel_type` say of a channel that not everyone can see.
PRIVATE_CHANNEL_NAMES = frozenset({"directmessage", "privategroup"})
PRIVATE_CHANNEL_TYPES = frozenset({"im", "group", "mpim"})
HISTORY_FETCH_LIMIT = 200
HISTORY_KEEP = 50
MEMBERSHIP_CACHE_SECONDS = 300.0
REPLIES = SlackRenderer()
SOMETHING_WENT_WRONG = "Sorry, something went wrong while handling that. Please try again in a moment."
WATCH_FORM_UNAVAILABLE = "I couldn't open the watch form in time. Please press **Watch this** again."
REPLAYED_REQUEST_STATUS = 409



# --- payloads to events -----------------------------------------------------------------------------

def qualified_user(user_id: str) -> str:
    """`slack:U123` for Slack's `U123`, the form ADMIN_USER_IDS and the core use."""
    return f"{PLATFORM}:{user_id}"


def workspace_of(body: dict[str, Any], context: AsyncBoltContext) -> str:
    """The workspace an event came from: bolt's context, else the payload's `team_id` ("" when neither names one)."""
    return context.team_id or str(body.get("team_id") or "")


def without_bot_mention(text: str, bot_user_id: str | None) -> str:
    """`text` with every mention of the bot (`<@U0BOT>`, `<@U0BOT|name>`) removed and the ends trimmed."""
    if not bot_user_id:
        return text.strip()
    stripped = re.sub(rf"<@{re.escape(bot_user_id)}(?:\|[^>]*)?>", " ", text)
    return re.sub(r"[ \t]{2,}", " ", stripped).strip()


def mentions_bot(text: str, bot_user_id: str | None) -> bool:
    """Whether `text` mentions the bot."""
    if not bot_user_id:
        return False
    return re.search(rf"<@{re.escape(bot_user_id)}(?:\|[^>]*)?>", text) is not None


def command_event(command: dict[str, Any]) -> ChatEvent | None:
    """The ChatEvent of a `/research`, `/plan` or `/ask` payload; None for any other command."""
    name = COMMANDS.get(str(command.get("command", "")))
    if name is None:
        return None
    private = str(command.get("channel_name", "")) in PRIVATE_CHANNEL_NAMES
    return ChatEvent(platform=PLATFORM, workspace=str(command.get("team_id", "")), channel=str(command.get("channel_id", "")),
                     user=qualified_user(str(command.get("user_id", ""))), kind="command", command=name,
                     text=str(command.get("text") or "").strip(), channel_visibility="private" if private else None)


def shared_files(event: dict[str, Any], bot_user_id: str | None) -> list[FileRef]:
    """The files a message shares, as the core takes them: never the bot's own uploads (exported reports), nor a
    file Slack shows only as deleted. Whether each may be read (a Slack Connect or external file may not) is
    asked of `files.info` when a run downloads it."""
    refs = []
    for shared in event.get("files") or []:
        if not isinstance(shared, dict) or not shared.get("id") or shared.get("mode") == "tombstone":
            continue
        owner = shared.get("user") or event.get("user")
        if bot_user_id and owner == bot_user_id:
            continue
        size = shared.get("size")
        refs.append(FileRef(file_id=str(shared["id"]), name=str(shared.get("name") or shared.get("title") or shared["id"]),
                            size=size if isinstance(size, int) else None, mimetype=shared.get("mimetype"),
                            url=str(shared.get("url_private_download") or ""), link=shared.get("permalink"),
                            shared_by=qualified_user(str(owner)) if owner else None))
    return refs


def mention_event(body: dict[str, Any], bot_user_id: str | None) -> ChatEvent:
    """The ChatEvent of an `app_mention` event callback, the bot's mention taken out of the text."""
    event = body["event"]
    return ChatEvent(platform=PLATFORM, workspace=_event_workspace(body), channel=str(event.get("channel", "")),
                     user=qualified_user(str(event.get("user", ""))), kind="mention",
                     text=without_bot_mention(str(event.get("text") or ""), bot_user_id),
                     thread=event.get("thread_ts"), message_id=event.get("ts"), event_id=body.get("event_id"),
                     files=shared_files(event, bot_user_id))


def message_event(body: dict[str, Any], bot_user_id: str | None) -> ChatEvent | None:
    """A direct message (kind `direct`) or a reply in a channel thread (kind `message`); None for anything else.

    Edits, joins and other subtypes, bots' messages, top-level channel messages, and thread replies that mention the
    bot (the `app_mention` listener has those) are None.
    """
    event = body["event"]
    if event.get("subtype") not in PERSON_MESSAGE_SUBTYPES or event.get("bot_id") or not event.get("user"):
        return None
    channel_type = event.get("channel_type")
    text = str(event.get("text") or "")
    thread_ts, ts = event.get("thread_ts"), event.get("ts")
    if channel_type == "im":
        kind: Literal["direct", "message"] = "direct"
    elif channel_type in CHANNEL_TYPES_WITH_THREADS and thread_ts and thread_ts != ts and not mentions_bot(text, bot_user_id):
        kind = "message"
    else:
        return None
    return ChatEvent(platform=PLATFORM, workspace=_event_workspace(body), channel=str(event.get("channel", "")),
                     user=qualified_user(str(event["user"])), kind=kind, text=without_bot_mention(text, bot_user_id),
                     thread=thread_ts, message_id=ts, event_id=body.get("event_id"),
                     channel_visibility="private" if channel_type in PRIVATE_CHANNEL_TYPES else "public",
                     files=shared_files(event, bot_user_id))


def assistant_opened_event(body: dict[str, Any]) -> ChatEvent | None:
    """The `opened` ChatEvent of an `assistant_thread_started` (a person opened a thread in the assistant pane)."""
    thread = body["event"].get("assistant_thread") or {}
    if not thread.get("user_id") or not thread.get("channel_id") or not thread.get("thread_ts"):
        return None
    return ChatEvent(platform=PLATFORM, workspace=_event_workspace(body), channel=str(thread["channel_id"]),
                     user=qualified_user(str(thread["user_id"])), kind="opened", thread=str(thread["thread_ts"]),
                     event_id=body.get("event_id"), channel_visibility="private")


def reaction_event(body: dict[str, Any]) -> ChatEvent | None:
    """The ChatEvent of a `reaction_added` on a message (the emoji's name, the message reacted to); None otherwise."""
    event = body["event"]
    item = event.get("item") or {}
    if item.get("type") != "message" or not event.get("user") or not event.get("reaction"):
        return None
    return ChatEvent(platform=PLATFORM, workspace=_event_workspace(body), channel=str(item.get("channel", "")),
                     user=qualified_user(str(event["user"])), kind="reaction", reaction=str(event["reaction"]),
                     message_id=item.get("ts"), event_id=body.get("event_id"))


def action_event(body: dict[str, Any]) -> ChatEvent | None:
    """The ChatEvent of a click on a retry, continue, export or Stop button (value: the run id); None otherwise.

    A Stop button without a run id (a run not stored when its status message was drawn) means its status message's run.
    """
    actions = body.get("actions") or []
    if not actions:
        return None
    action = ACTION_IDS.get(str(actions[0].get("action_id", "")))
    if action is None:
        return None
    try:
        run_id: int | None = int(actions[0].get("value", ""))
    except (TypeError, ValueError):
        if action != "cancel":
            return None
        run_id = None
    message = body.get("message") or {}
    container = body.get("container") or {}
    user = body.get("user") or {}
    message_ts = message.get("ts") or container.get("message_ts")
    channel = (body.get("channel") or {}).get("id") or container.get("channel_id") or ""
    workspace = (body.get("team") or {}).get("id") or user.get("team_id") or ""
    return ChatEvent(platform=PLATFORM, workspace=str(workspace), channel=str(channel), user=qualified_user(str(user.get("id", ""))),
                     kind="action", action=action, action_run_id=run_id,
                     thread=message.get("thread_ts") or container.get("thread_ts") or message_ts, message_id=message_ts)


def history_before(messages: list[dict[str, Any]], before_ts: str | None, bot_user_id: str | None,
                   keep: int = HISTORY_KEEP) -> list[HistoryMessage]:
    """The last `keep` messages of a thread (from `conversations.replies`) written before `before_ts`."""
    earlier = [message for message in messages if before_ts is None or _ts_value(message.get("ts")) < _ts_value(before_ts)]
    history = []
    for message in earlier[-keep:]:
        author = message.get("user") or message.get("bot_id") or ""
        is_bot = bool(message.get("bot_id")) or (bot_user_id is not None and author == bot_user_id)
        history.append(HistoryMessage(user=qualified_user(str(author)), text=str(message.get("text") or ""), is_bot=is_bot))
    return history


def _ts_value(ts: Any) -> float:
    try:
        return float(ts)
    except (TypeError, ValueError):
        return 0.0


def _event_workspace(body: dict[str, Any]) -> str:
    return str(body.get("team_id") or body["event"].get("team") or "")


# --- can the bot post here? ----------------------------------------------------------------------------

class ChannelAccess(BaseModel):
    """Whether the bot can post in a channel, and if not, what to tell the person (privately); and who can see the
    channel when Slack said (a private channel, a group DM or a DM is private)."""

    can_post: bool
    reason: str | None = None
    visibility: Visibility | None = None


def invite_instructions(bot_user_id: str | None) -> str:
    """How to let the bot into a private channel, addressed to the person who asked."""
    bot = f"<@{bot_user_id}>" if bot_user_id else "@deepthread"
    return (f"I'm not in this conversation, so I can't post my answer here. If it is a private channel, invite me with "
            f"/invite {bot} and ask again; otherwise ask me in a channel I'm in or in a direct message.")


class ChannelMembership:
    """Finds out whether the bot can post in a channel, joining public ones; remembers yes answers for a while.

    Only yes answers are remembered, so that a channel the bot was just invited into works at once.
    """

    def __init__(self, *, cache_seconds: float = MEMBERSHIP_CACHE_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        self.cache_seconds = cache_seconds
        self.clock = clock
        self._can_post_until: dict[str, tuple[float, ChannelAccess]] = {}

    async def ensure(self, client: AsyncWebClient, channel: str, bot_user_id: str | None) -> ChannelAccess:
        """Whether the bot can post in `channel`, after joining it if it is public; never raises for Slack errors."""
        until, known = self._can_post_until.get(channel, (0.0, None))
        if known is not None and until > self.clock():
            return known
        access = await self._find_out(client, channel, bot_user_id)
        if access.can_post:
            self._can_post_until[channel] = (self.clock() + self.cache_seconds, access)
        return access

    async def _find_out(self, client: AsyncWebClient, channel: str, bot_user_id: str | None) -> ChannelAccess:
        try:
            info = (await client.conversations_info(channel=channel)).get("channel") or {}
        except SlackApiError as error:
            # A private channel (or a DM between other people) is invisible to a bot that is not in it.
            logger.info("conversations.info refused for a channel: %s", _slack_error_code(error))
            return ChannelAccess(can_post=False, reason=invite_instructions(bot_user_id))
        except SlackClientError:
            logger.warning("conversations.info failed; assuming the bot can post", exc_info=True)
            return ChannelAccess(can_post=True)
        private = bool(info.get("is_im") or info.get("is_private") or info.get("is_mpim") or info.get("is_group"))
        if info.get("is_im") or info.get("is_member"):
            return ChannelAccess(can_post=True, visibility="private" if private else "public")
        if private:
            return ChannelAccess(can_post=False, reason=invite_instructions(bot_user_id))
        return await self._join(client, channel, bot_user_id)

    @staticmethod
    async def _join(client: AsyncWebClient, channel: str, bot_user_id: str | None) -> ChannelAccess:
        try:
            await client.conversations_join(channel=channel)
        except (SlackApiError, SlackClientError) as error:
            code = _slack_error_code(error) if isinstance(error, SlackApiError) else "connection_error"
            logger.warning("could not join a public channel: %s", code)
            bot = f"<@{bot_user_id}>" if bot_user_id else "@deepthread"
            return ChannelAccess(can_post=False, reason=f"I couldn't join this channel ({code}). "
                                                        f"Invite me with /invite {bot} and ask again.")
        logger.info("joined a public channel to answer there")
        return ChannelAccess(can_post=True, visibility="public")


def _slack_error_code(error: SlackApiError) -> str:
    data = getattr(error.response, "data", None)
    return str(data.get("error")) if isinstance(data, dict) and data.get("error") else "unknown_error"


# --- saying the replies --------------------------------------------------------------------------------

class PrivateSender(Protocol):
    """Says a text (with its Block Kit blocks, when it has them) that only the event's person sees."""

    async def __call__(self, text: str, blocks: list[dict[str, Any]] | None = None) -> None: ...


def _bare_user(user: str) -> str:
    return user.removeprefix(f"{PLATFORM}:")


async def post_in_thread(client: AsyncWebClient, channel: str, thread: str | None, text: str) -> None:
    """Post `text` (Slack mrkdwn, already escaped) in `thread` of `channel`, link previews off."""
    await client.chat_postMessage(channel=channel, thread_ts=thread, text=text, unfurl_links=False, unfurl_media=False)


def ephemeral_sender(client: AsyncWebClient, event: ChatEvent, thread: str | None) -> PrivateSender:
    """Says a text only the event's person sees, with `chat.postEphemeral`."""
    async def send(text: str, blocks: list[dict[str, Any]] | None = None) -> None:
        await client.chat_postEphemeral(channel=event.channel, user=_bare_user(event.user), text=text, blocks=blocks,
                                        thread_ts=thread)
    return send


def respond_sender(respond: AsyncRespond, poster: ResponseUrlPoster) -> PrivateSender:
    """Says a text only the person sees, through the command's or button's `response_url`: what bolt's `respond`
    sends, over `poster`'s connections kept open."""
    async def send(text: str, blocks: list[dict[str, Any]] | None = None) -> None:
        if respond.response_url is None:
            raise ValueError("no response_url to answer privately through")
        message: dict[str, Any] = {"text": text, "response_type": "ephemeral", "replace_original": False}
        if blocks is not None:
            message["blocks"] = blocks
        await poster.send(respond.response_url, message)
    return send


def reply_thread(event: ChatEvent, outcome: Outcome) -> str | None:
    """The thread public replies go to: the core's, else the event's; a top-level mention is answered under itself."""
    if outcome.thread:
        return outcome.thread
    if event.thread:
        return event.thread
    return event.message_id if event.kind == "mention" else None


async def deliver(replies: list[Reply], *, client: AsyncWebClient, event: ChatEvent, thread: str | None,
                  send_private: PrivateSender, renderer: SlackRenderer = REPLIES) -> None:
    """Say each reply as mrkdwn, privately or in `thread`; a failed reply is logged and does not stop the others."""
    for reply in replies:
        content = reply.content or renderer.reply(reply.text, person=reply.person)
        text = content.text
        try:
            if reply.private or (thread is None and event.kind == "reaction"):
                # A reaction's thread is unknown when the core does not say it; a public reply would land top level.
                await send_private(text, blocks_of(content))
            else:
                await post_in_thread(client, event.channel, thread, text)
        except (SlackApiError, SlackClientError, OSError, ValueError) as error:
            logger.warning("could not deliver a reply (%s)", type(error).__name__)


# --- the listeners -------------------------------------------------------------------------------------

class SlackListeners:
    """What each Slack request does; bolt calls these methods with the arguments their parameter names ask for."""

    def __init__(self, core: ConversationHandler, dedupe: EventDeduper, membership: ChannelMembership | None = None,
                 replay_guard: ReplayGuard | None = None,
                 forget_installation: Callable[[AsyncBoltContext], Awaitable[None]] | None = None,
                 zones: PersonZones | None = None) -> None:
        self.core = core
        self.dedupe = dedupe
        self.membership = membership or ChannelMembership()
        self.zones = zones or PersonZones()
        self.replay_guard = replay_guard or MemoryReplayGuard()
        # OAuth installs: deletes the workspace's stored tokens (bot.slack.oauth.InstallationRemoval).
        self.forget_installation = forget_installation
        self.private_replies = ResponseUrlPoster()

    async def refuse_replayed_requests(self, req: AsyncBoltRequest, body: dict[str, Any],
                                       next_: Callable[[], Awaitable[BoltResponse]]) -> BoltResponse:
        """Global middleware, after bolt's signature check: a signed request (command, button) seen before is refused.

        Events are left to `drop_retried_events`: Slack's retries of an event are legitimate and deduped by event id.
        """
        signature = (req.headers.get("x-slack-signature") or [""])[0]
        timestamp = (req.headers.get("x-slack-request-timestamp") or [""])[0]
        if not signature or body.get("type") == "event_callback":
            return await next_()
        if not await self.replay_guard.first_sighting(request_fingerprint(signature, timestamp)):
            logger.info("refused a replayed signed request")
            return BoltResponse(status=REPLAYED_REQUEST_STATUS, body="replayed request")
        return await next_()

    async def drop_retried_events(self, body: dict[str, Any], next_: Callable[[], Awaitable[BoltResponse]]) -> BoltResponse:
        """Global middleware: an event whose `event_id` was already delivered is acknowledged and goes no further."""
        event_id = body.get("event_id") if body.get("type") == "event_callback" else None
        if event_id and not await self.dedupe.first_delivery(str(event_id)):
            logger.info("dropped a repeated delivery of an event")
            return BoltResponse(status=200, body="")
        return await next_()

    async def on_command(self, ack: AsyncAck, command: dict[str, Any], respond: AsyncRespond, client: AsyncWebClient,
                         context: AsyncBoltContext) -> None:
        """`/research`, `/plan`, `/ask`: acknowledge, check the channel, hand to the core, say the replies."""
        await ack()
        event = command_event(command)
        if event is None:
            return
        send_private = respond_sender(respond, self.private_replies)
        if (event := await self._where_the_bot_can_post(client, event, context.bot_user_id, send_private)) is None:
            return
        await self._handle(event, client=client, send_private=send_private)

    async def on_mention(self, body: dict[str, Any], client: AsyncWebClient, context: AsyncBoltContext) -> None:
        """`app_mention` (already acknowledged by bolt): with the thread so far when the mention is inside one."""
        mention = mention_event(body, context.bot_user_id)
        send_private = ephemeral_sender(client, mention, mention.thread)
        if (event := await self._where_the_bot_can_post(client, mention, context.bot_user_id, send_private)) is None:
            return
        if event.thread:
            event = event.model_copy(update={"thread_history": await self._thread_history(client, event, context.bot_user_id)})
        await self._handle(event, client=client, send_private=send_private)

    async def on_message(self, body: dict[str, Any], client: AsyncWebClient, context: AsyncBoltContext) -> Outcome | None:
        """`message`: direct messages and replies in channel threads go to the core; the rest is ignored."""
        event = message_event(body, context.bot_user_id)
        if event is None:
            return None
        return await self._handle(event, client=client, send_private=ephemeral_sender(client, event, event.thread))

    async def on_reaction(self, body: dict[str, Any], client: AsyncWebClient) -> None:
        """`reaction_added` on a message: the core decides whether it cancels a run or approves a plan."""
        event = reaction_event(body)
        if event is None:
            return
        await self._handle(event, client=client, send_private=ephemeral_sender(client, event, None))

    async def on_action(self, ack: AsyncAck, body: dict[str, Any], respond: AsyncRespond, client: AsyncWebClient) -> None:
        """Retry, continue and export buttons: acknowledge, then hand the click to the core."""
        await ack()
        event = action_event(body)
        if event is None:
            return
        await self._handle(event, client=client, send_private=respond_sender(respond, self.private_replies))

    async def on_feedback(self, ack: AsyncAck, body: dict[str, Any], respond: AsyncRespond, client: AsyncWebClient) -> None:
        """👍/👎 under a report: acknowledge, store it through the core, and for a 👎 open the "what was wrong?" modal."""
        await ack()
        event = feedback_event(body)
        if event is None:
            return
        outcome = await self._handle(event, client=client, send_private=respond_sender(respond, self.private_replies))
        if outcome is not None and outcome.ask_what_was_wrong is not None:
            context = CommentContext(run_id=outcome.ask_what_was_wrong, workspace=event.workspace, channel=event.channel)
            await ask_what_was_wrong(client, trigger_id=body.get("trigger_id"), context=context)

    async def on_feedback_comment(self, ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient) -> None:
        """The "what was wrong?" modal submitted: close it, then store the comment through the core."""
        await ack()
        event = comment_event(body)
        if event is None:
            return
        await self._handle(event, client=client, send_private=ephemeral_sender(client, event, None))

    async def on_watch_this(self, ack: AsyncAck, body: dict[str, Any], respond: AsyncRespond,
                            client: AsyncWebClient) -> None:
        """"Watch this" under a research report: acknowledge, then open the modal that asks how often and when."""
        await ack()
        context = watch_this_context(body)
        if context is None:
            return
        user_id = str((body.get("user") or {}).get("id", ""))
        today = today_in(await self.zones.of_quickly(client, user_id))
        if await open_watch_form(client, trigger_id=body.get("trigger_id"), context=context, today=today):
            return
        try:
            await respond_sender(respond, self.private_replies)(REPLIES.reply(WATCH_FORM_UNAVAILABLE).text)
        except (SlackApiError, SlackClientError, OSError, ValueError) as error:
            logger.warning("could not say the watch form did not open (%s)", type(error).__name__)

    async def on_watch_form(self, ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient) -> None:
        """The watch modal submitted: what is missing shown beside its input, else the modal closed and the watch
        made through the core in the person's time zone, the reply said privately in the report's thread."""
        form = read_watch_form(body.get("view") or {})
        if isinstance(form, dict):
            await ack(response_action="errors", errors=form)
            return
        await ack()
        user_id = str((body.get("user") or {}).get("id", ""))
        event = watch_event(body, form, timezone=await self.zones.of(client, user_id))
        await self._handle(event, client=client, send_private=ephemeral_sender(client, event, event.thread))

    async def on_watches_command(self, ack: AsyncAck, command: dict[str, Any], respond: AsyncRespond,
                                 client: AsyncWebClient) -> None:
        """`/watches`: acknowledge, then list, pause, resume or delete through the core; every reply private."""
        await ack()
        timezone = await self.zones.of(client, str(command.get("user_id", "")))
        await self._handle(watches_command_event(command, timezone=timezone), client=client,
                           send_private=respond_sender(respond, self.private_replies))

    async def on_watch_button(self, ack: AsyncAck, body: dict[str, Any], respond: AsyncRespond,
                              client: AsyncWebClient) -> None:
        """Pause, Resume or Delete on a watch listing: acknowledge, then hand the click to the core."""
        await ack()
        event = watch_button_event(body)
        if event is None:
            return
        await self._handle(event, client=client, send_private=respond_sender(respond, self.private_replies))

    async def on_app_uninstalled(self, body: dict[str, Any], context: AsyncBoltContext) -> None:
        """`app_uninstalled`: the workspace's stored tokens (OAuth installs), then everything stored of it: its threads,
        their messages (also of people who never used the bot) and its runs, whatever became of the tokens."""
        try:
            if self.forget_installation is not None:
                await self.forget_installation(context)
        finally:
            workspace = workspace_of(body, context)
            if workspace:
                await self.core.forget_workspace(PLATFORM, workspace)
            else:
                logger.warning("app_uninstalled named no workspace; its stored threads are kept")

    async def on_user_change(self, body: dict[str, Any], context: AsyncBoltContext) -> None:
        """`user_change`: a person deactivated (`deleted`) no longer owns running watches; theirs stop, saying why."""
        user = body.get("event", {}).get("user") or {}
        workspace = workspace_of(body, context)
        if user.get("deleted") and user.get("id") and workspace:
            await self.core.stop_watches(PLATFORM, workspace, owner=f"{PLATFORM}:{user['id']}",
                                         reason="its owner's account was deactivated")

    async def on_channel_gone(self, body: dict[str, Any], context: AsyncBoltContext) -> None:
        """`channel_deleted`, `channel_archive` (and the `group_` ones of private channels): the channel's watches stop,
        saying why."""
        event = body.get("event", {})
        channel = event.get("channel")
        workspace = workspace_of(body, context)
        if isinstance(channel, dict):
            channel = channel.get("id")
        if channel and workspace:
            gone = "archived" if str(event.get("type", "")).endswith("archive") else "deleted"
            await self.core.stop_watches(PLATFORM, workspace, channel=str(channel),
                                         reason=f"its channel was {gone}")

    async def _where_the_bot_can_post(self, client: AsyncWebClient, event: ChatEvent, bot_user_id: str | None,
                                      send_private: PrivateSender) -> ChatEvent | None:
        """The event with what Slack says of its channel's visibility, or None (the person told how to invite the bot)
        when the bot cannot post there."""
        access = await self.membership.ensure(client, event.channel, bot_user_id)
        if access.can_post:
            # What the payload already knows to be private stays private whatever the lookup said.
            return event.model_copy(update={"channel_visibility": event.channel_visibility or access.visibility})
        try:
            await send_private(access.reason or invite_instructions(bot_user_id))
        except (SlackApiError, SlackClientError, OSError, ValueError) as error:
            logger.warning("could not say how to invite the bot (%s)", type(error).__name__)
        return None

    async def _thread_history(self, client: AsyncWebClient, event: ChatEvent, bot_user_id: str | None) -> list[HistoryMessage]:
        try:
            answer = await client.conversations_replies(channel=event.channel, ts=str(event.thread), limit=HISTORY_FETCH_LIMIT)
        except (SlackApiError, SlackClientError) as error:
            logger.warning("could not read the thread's earlier messages (%s)", type(error).__name__)
            return []
        return history_before(list(answer.get("messages") or []), event.message_id, bot_user_id)

    async def _handle(self, event: ChatEvent, *, client: AsyncWebClient, send_private: PrivateSender) -> Outcome | None:
        try:
            outcome = await self.core.handle(event)
        except Exception:
            logger.exception("the conversation core failed on a %s event", event.kind)
            await deliver([Reply(text=SOMETHING_WENT_WRONG, private=True)], client=client, event=event, thread=event.thread,
                          send_private=send_private)
            return None
        await deliver(outcome.replies, client=client, event=event, thread=reply_thread(event, outcome), send_private=send_private)
        return outcome


def build_slack_app(settings: Settings, core: ConversationHandler, *, client: AsyncWebClient | None = None,
                    dedupe: EventDeduper, membership: ChannelMembership | None = None,
                    replay_guard: ReplayGuard | None = None, installs: OAuthInstalls | None = None) -> AsyncApp:
    """The bolt app with every deepthread listener; raises ValueError without SLACK_BOT_TOKEN (or the OAuth client id
    and secret), or without SLACK_SIGNING_SECRET when there is no SLACK_APP_TOKEN (HTTP mode verifies every request).

    With SLACK_CLIENT_ID and SLACK_CLIENT_SECRET the app runs `installs` (on DATABASE_URL unless given): the OAuth
    install flow, each request authorized with its workspace's installed token, uninstalls deleting installations.
    An uninstall also deletes what is stored of the workspace (`ConversationHandler.forget_workspace`), in either mode.
    """
    problem = missing_adapter_setting(settings)
    if problem is not None:
        raise ValueError(problem)
    client = client or web_client(settings, settings.secret("slack_bot_token") or "")
    if installs is None and oauth_mode(settings):
        from bot.slack.oauth import oauth_installs  # only OAuth mode loads the installation and state stores
        from storage.db import make_engine

        installs = oauth_installs(settings, make_engine(settings.database_url), client)
    multi_workspace: dict[str, Any] = {} if installs is None else {
        "oauth_flow": installs.flow, "authorize": installs.authorize, "installation_store_bot_only": True}
    signing_secret = settings.secret("slack_signing_secret")
    app = AsyncApp(client=client, signing_secret=signing_secret or "", process_before_response=False,
                   ignoring_self_events_enabled=True, name="deepthread", **multi_workspace)
    removal = None
    if installs is not None:
        from bot.slack.oauth import InstallationRemoval

        removal = InstallationRemoval(installs.store)
    register_listeners(app, SlackListeners(core, dedupe, membership, replay_guard,
                                           forget_installation=removal.on_app_uninstalled if removal else None))
    if removal is not None:
        # `app_uninstalled` is the listeners' own (the tokens, then the workspace's threads and runs): bolt runs only
        # the first listener an event matches.
        app.event("tokens_revoked")(removal.on_tokens_revoked)
    return app


# A channel a watch posts in, gone: its watches stop (the bot_events of slack/manifest.yml).
CHANNEL_GONE_EVENTS = ("channel_deleted", "channel_archive", "group_deleted", "group_archive")


def register_listeners(app: AsyncApp, listeners: SlackListeners) -> None:
    """Attach the replay and dedupe middleware and every listener to `app`."""
    app.middleware(listeners.refuse_replayed_requests)
    app.middleware(listeners.drop_retried_events)
    # After the dedupe: assistant-thread events and the DM messages in those threads go to the assistant pane.
    app.assistant(build_assistant(listeners.core, opened_event=assistant_opened_event, answer_message=listeners.on_message))
    for command in COMMANDS:
        app.command(command)(listeners.on_command)
    app.event("app_mention")(listeners.on_mention)
    app.event("message")(listeners.on_message)
    app.event("reaction_added")(listeners.on_reaction)
    app.event("app_uninstalled")(listeners.on_app_uninstalled)
    app.event("user_change")(listeners.on_user_change)
    for channel_event in CHANNEL_GONE_EVENTS:
        app.event(channel_event)(listeners.on_channel_gone)
    for action_id in ACTION_IDS:
        app.action(action_id)(listeners.on_action)
    app.action(FEEDBACK_ACTION_ID)(listeners.on_feedback)
    app.view(COMMENT_CALLBACK_ID)(listeners.on_feedback_comment)
    app.command(WATCHES_COMMAND)(listeners.on_watches_command)
    app.action(WATCH_ACTION_ID)(listeners.on_watch_this)
    for action_id in WATCH_BUTTON_ACTIONS:
        app.action(action_id)(listeners.on_watch_button)
    app.view(WATCH_CALLBACK_ID)(listeners.on_watch_form)
