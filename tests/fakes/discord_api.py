"""A fake Discord on 127.0.0.1 that speaks Discord's wire formats (API v10), so discord.py and httpx run unchanged.

One server holds the REST API under `{url}/api/v10` (configure `api_url` as DISCORD_API_URL) and the Gateway WebSocket
at `{url}/gateway` (tests/fakes/discord_gateway.py). State lives in memory in the test process and is thread-safe;
every REST call is recorded, and the test drives users, commands, buttons and reactions through the gateway:

    discord_fake = FakeDiscord(message_content_intent_enabled=False).start()
    with discord_py_pointed_at(discord_fake):           # Route.BASE and DiscordWebSocket.DEFAULT_GATEWAY
        ...start a discord.Client with discord_fake.token...
    alice = discord_fake.new_user("alice")
    interaction_id = discord_fake.send_command(alice, discord_fake.channel_id, "research", {"question": "Why?"})
    discord_fake.wait_for(lambda: discord_fake.interaction_responses(interaction_id))
    discord_fake.fail_next("POST", r"/channels/\\d+/messages$", status=429, retry_after=1.5)
    discord_fake.answer_next("POST", r"/threads$", status=500, carried_out=True)  # done, but the answer lost
    discord_fake.messages(discord_fake.channel_id)         # DiscordMessage list, current state
    discord_fake.edits(channel_id, message_id)             # DiscordEdit list, with monotonic times
    discord_fake.calls("PATCH", path_contains="/messages/")  # DiscordCall list: method, path, json, status, time
    discord_fake.modal(click_id)                           # the modal the bot answered a click with, if any
    discord_fake.submit_modal(alice, click_id, {"comment": "…"})  # the person fills it in and submits it
    discord_fake.choose(alice, channel, message_id, "menu-id", ["weekly"])  # a choice in a message's select menu
    discord_fake.add_attachment("notes.pdf", data)          # an attachment on the CDN (configure `cdn_url` as
    discord_fake.cdn_requests.all()                        # DISCORD_FILE_HOSTS); every request the CDN got
    discord_fake.send_command(alice, channel, "research", {"question": "…", "file": attachment})  # ATTACHMENT option
    discord_fake.user_message(alice, thread, "", attachments=[attachment])  # a message that attaches it

From async tests use `await discord_fake.wait_for_async(...)`: `wait_for` blocks the calling thread.

Without a socket, `discord_fake.client()` reaches the same fake in process (httpx's ASGI transport) for code that
takes an `httpx.AsyncClient`; give it `clock=` (a `tests.fakes.clock.FakeClock`) and the rate-limit windows, the
nonce window and every recorded time run on that clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import json
import math
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute

from tests.fakes.discord_gateway import (
    INTENT_DIRECT_MESSAGE_REACTIONS,
    INTENT_DIRECT_MESSAGES,
    INTENT_GUILD_MEMBERS,
    INTENT_GUILD_MESSAGE_REACTIONS,
    INTENT_GUILD_MESSAGES,
    INTENT_GUILD_PRESENCES,
    INTENT_GUILDS,
    INTENT_MESSAGE_CONTENT,
    FakeGateway,
    GatewayConnection,
)
from tests.fakes.server import LoopbackFake, RecordedRequest, RequestLog

FAKE_TOKEN = "MTIzNDU2Nzg5MDEyMzQ1Njc4.fake.discord-bot-token"
API_PREFIX = "/api/v10"
# The address `client()` reaches the fake at in process: a name no socket is ever opened to.
IN_PROCESS_URL = "http://discord.test"
DISCORD_EPOCH_MS = 1_420_070_400_000

CHANNEL_TEXT, CHANNEL_DM, CHANNEL_ANNOUNCEMENT = 0, 1, 5
CHANNEL_ANNOUNCEMENT_THREAD, CHANNEL_PUBLIC_THREAD, CHANNEL_PRIVATE_THREAD = 10, 11, 12
THREAD_TYPES = frozenset({CHANNEL_ANNOUNCEMENT_THREAD, CHANNEL_PUBLIC_THREAD, CHANNEL_PRIVATE_THREAD})
MESSAGE_DEFAULT, MESSAGE_REPLY, MESSAGE_CHAT_INPUT_COMMAND = 0, 19, 20
INTERACTION_APPLICATION_COMMAND, INTERACTION_MESSAGE_COMPONENT, INTERACTION_MODAL_SUBMIT = 2, 3, 5
CALLBACK_MESSAGE, CALLBACK_DEFERRED_MESSAGE, CALLBACK_DEFERRED_UPDATE, CALLBACK_UPDATE_MESSAGE, CALLBACK_MODAL = 4, 5, 6, 7, 9
# A modal cannot answer a modal; updating a message is for a modal opened from one of its buttons (checked apart).
CALLBACKS_ALLOWED = {INTERACTION_APPLICATION_COMMAND: {4, 5, 9}, INTERACTION_MESSAGE_COMPONENT: {4, 5, 6, 7, 9},
                     INTERACTION_MODAL_SUBMIT: {4, 5, 6, 7}}
FLAG_EPHEMERAL, FLAG_LOADING = 1 << 6, 1 << 7
APP_FLAG_PRESENCE, APP_FLAG_GUILD_MEMBERS, APP_FLAG_MESSAGE_CONTENT = 1 << 12, 1 << 14, 1 << 18
OPTION_TYPES = {bool: 5, int: 4, float: 10, str: 3}
OPTION_ATTACHMENT = 11

CONTENT_LIMIT, EMBEDS_LIMIT, EMBED_TOTAL_LIMIT, EMBED_FIELDS_LIMIT, COMPONENT_ROWS_LIMIT = 2000, 10, 6000, 25, 5
EMBED_TEXT_LIMITS = {("title",): 256, ("description",): 4096, ("author", "name"): 256, ("footer", "text"): 2048}
FIELD_LIMITS = {"name": 256, "value": 1024}
THREAD_NAME_LENGTH = (1, 100)
NONCE_LIMIT = 25
FILE_SIZE_LIMIT = 10 * 1024 * 1024
COMMAND_NAME = re.compile(r"^[-_a-z0-9]{1,32}$")
# Modals (developers/docs/components/reference): a title, up to five top-level components, each a label holding one
# text input, a text display, or (deprecated) an action row holding one text input with a label of its own.
COMPONENT_ACTION_ROW, COMPONENT_TEXT_INPUT, COMPONENT_TEXT_DISPLAY, COMPONENT_LABEL = 1, 4, 10, 18
MODAL_TITLE_LIMIT, MODAL_COMPONENTS_LIMIT, CUSTOM_ID_LIMIT, LABEL_LIMIT, LABEL_DESCRIPTION_LIMIT = 45, 5, 100, 45, 100
TEXT_INPUT_LIMIT, PLACEHOLDER_LIMIT, TEXT_DISPLAY_LIMIT = 4000, 100, 4000
# Message components (developers/docs/components/reference): up to five action rows, each holding up to five buttons
# or one select menu; custom ids unique in the message; a string select offers 1 to 25 options.
COMPONENT_BUTTON, COMPONENT_STRING_SELECT = 2, 3
BUTTONS_PER_ROW, BUTTON_LABEL_LIMIT, SELECT_OPTIONS_LIMIT = 5, 80, 25
SELECT_PLACEHOLDER_LIMIT, OPTION_TEXT_LIMIT = 150, 100
BUTTON_LINK = 5

PERMISSION_ADD_REACTIONS, PERMISSION_VIEW_CHANNEL, PERMISSION_SEND_MESSAGES = 1 << 6, 1 << 10, 1 << 11
PERMISSION_EMBED_LINKS, PERMISSION_ATTACH_FILES, PERMISSION_READ_HISTORY = 1 << 14, 1 << 15, 1 << 16
PERMISSION_USE_COMMANDS, PERMISSION_MANAGE_THREADS, PERMISSION_PUBLIC_THREADS = 1 << 31, 1 << 34, 1 << 35
PERMISSION_SEND_IN_THREADS = 1 << 38
EVERYONE_PERMISSIONS = (PERMISSION_ADD_REACTIONS | PERMISSION_VIEW_CHANNEL | PERMISSION_SEND_MESSAGES
                        | PERMISSION_EMBED_LINKS | PERMISSION_ATTACH_FILES | PERMISSION_READ_HISTORY
                        | PERMISSION_USE_COMMANDS | PERMISSION_PUBLIC_THREADS | PERMISSION_SEND_IN_THREADS)
BOT_PERMISSIONS = EVERYONE_PERMISSIONS | PERMISSION_MANAGE_THREADS


def iso_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


class Snowflakes:
    """Discord ids: milliseconds since 2015 shifted left 22 bits, strictly increasing."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last = 0

    def __call__(self) -> int:
        with self._lock:
            self._last = max((int(time.time() * 1000) - DISCORD_EPOCH_MS) << 22, self._last + 1)
            return self._last


_snowflake = Snowflakes()


@dataclass(frozen=True)
class FakeUser:
    """A Discord user (or bot) as the fake knows it."""

    id: int
    username: str
    bot: bool = False

    @property
    def mention(self) -> str:
        return f"<@{self.id}>"

    def as_api(self) -> dict[str, Any]:
        return {"id": str(self.id), "username": self.username, "discriminator": "0", "avatar": None,
                "global_name": None if self.bot else self.username, "bot": self.bot, "public_flags": 0, "flags": 0,
                "banner": None, "accent_color": None, "avatar_decoration_data": None}


@dataclass
class FakeMember:
    """A user's membership of a guild."""

    user: FakeUser
    roles: list[int] = field(default_factory=list)
    joined_at: str = field(default_factory=iso_now)


@dataclass
class FakeGuild:
    """A guild: its @everyone role (id == guild id) grants `everyone_permissions`."""

    id: int
    name: str = "Deepthread Test"
    owner_id: int | None = None
    everyone_permissions: int = EVERYONE_PERMISSIONS
    members: dict[int, FakeMember] = field(default_factory=dict)

    def join(self, user: FakeUser) -> FakeMember:
        return self.members.setdefault(user.id, FakeMember(user))


@dataclass
class FakeChannel:
    """A guild text channel, a thread (`parent_id`, `owner_id`) or a DM (`recipients`, no guild)."""

    id: int
    name: str | None = "research"
    type: int = CHANNEL_TEXT
    guild_id: int | None = None
    parent_id: int | None = None
    owner_id: int | None = None
    recipients: list[FakeUser] = field(default_factory=list)
    position: int = 0
    topic: str | None = None
    created_at: str = field(default_factory=iso_now)
    message_count: int = 0
    last_message_id: int | None = None
    archived: bool = False
    auto_archive_duration: int = 1440
    # A private channel: hidden from @everyone, shown to these users (the bot among them) by member overwrites.
    private_to: list[int] | None = None

    @property
    def is_thread(self) -> bool:
        return self.type in THREAD_TYPES

    def as_api(self) -> dict[str, Any]:
        last = str(self.last_message_id) if self.last_message_id else None
        if self.type == CHANNEL_DM:
            return {"id": str(self.id), "type": self.type, "last_message_id": last, "flags": 0,
                    "recipients": [user.as_api() for user in self.recipients]}
        channel: dict[str, Any] = {"id": str(self.id), "type": self.type, "guild_id": str(self.guild_id),
                                   "name": self.name, "parent_id": str(self.parent_id) if self.parent_id else None,
                                   "last_message_id": last, "rate_limit_per_user": 0, "flags": 0}
        if self.is_thread:
            channel.update(owner_id=str(self.owner_id), message_count=self.message_count,
                           member_count=1, total_message_sent=self.message_count, applied_tags=[],
                           thread_metadata={"archived": self.archived, "auto_archive_duration": self.auto_archive_duration,
                                            "archive_timestamp": self.created_at, "locked": False,
                                            "create_timestamp": self.created_at, "invitable": True})
        else:
            channel.update(position=self.position, topic=self.topic, nsfw=False,
                           permission_overwrites=self.permission_overwrites(),
                           default_auto_archive_duration=1440)
        return channel

    def permission_overwrites(self) -> list[dict[str, Any]]:
        """Discord's overwrites: none for a public channel; for a private one, @everyone (the role whose id is the
        guild's) denied View Channel and each member it is shown to allowed it."""
        if self.private_to is None:
            return []
        hidden = {"id": str(self.guild_id), "type": 0, "allow": "0", "deny": str(PERMISSION_VIEW_CHANNEL)}
        return [hidden, *({"id": str(user_id), "type": 1, "allow": str(PERMISSION_VIEW_CHANNEL), "deny": "0"}
                          for user_id in self.private_to)]


@dataclass
class DiscordAttachment:
    """A file uploaded with a message (multipart `files[n]`)."""

    id: int
    filename: str
    data: bytes
    content_type: str | None = None
    description: str | None = None
    url: str | None = None  # the signed CDN URL `add_attachment` gave it; built from the message's channel when None


@dataclass
class DiscordEdit:
    """One edit of a message: what it said afterwards, with which allowed_mentions, and when (monotonic)."""

    at: float
    content: str
    embeds: list[dict[str, Any]]
    components: list[dict[str, Any]]
    flags: int
    allowed_mentions: dict[str, Any] | None


@dataclass
class DiscordMessage:
    """A message as Discord stores it, with its edit history, reactions and thread."""

    id: int
    channel_id: int
    guild_id: int | None
    author: FakeUser
    content: str
    posted_at: float
    timestamp: str = field(default_factory=iso_now)
    embeds: list[dict[str, Any]] = field(default_factory=list)
    components: list[dict[str, Any]] = field(default_factory=list)
    attachments: list[DiscordAttachment] = field(default_factory=list)
    mentions: list[FakeUser] = field(default_factory=list)
    mention_roles: list[int] = field(default_factory=list)
    mention_everyone: bool = False
    type: int = MESSAGE_DEFAULT
    flags: int = 0
    nonce: str | int | None = None
    allowed_mentions: dict[str, Any] | None = None
    message_reference: dict[str, Any] | None = None
    webhook_id: int | None = None
    interaction_metadata: dict[str, Any] | None = None
    edited_timestamp: str | None = None
    edits: list[DiscordEdit] = field(default_factory=list)
    reactions: dict[str, list[int]] = field(default_factory=dict)
    thread_id: int | None = None
    deleted: bool = False

    @property
    def ephemeral(self) -> bool:
        return bool(self.flags & FLAG_EPHEMERAL)


@dataclass
class DiscordCall:
    """One REST call as the fake saw it: route template, JSON (or multipart `payload_json`), files, answer, time.

    `status` is 0 for a call answered with a scripted transport error (no answer reached the caller)."""

    method: str
    path: str
    route: str
    query: dict[str, str]
    json: Any
    files: list[str]
    status: int
    at: float
    wall_time: float
    code: int | None = None
    writes_message: bool = False
    answer_headers: dict[str, str] = field(default_factory=dict)

    @property
    def allowed_mentions(self) -> dict[str, Any] | None:
        payload = self.json.get("data") if self.route.endswith("/callback") and isinstance(self.json, dict) else self.json
        return payload.get("allowed_mentions") if isinstance(payload, dict) else None


@dataclass
class InteractionResponse:
    """The callback answering an interaction, and how long after the dispatch it arrived."""

    interaction_id: int
    type: int
    data: dict[str, Any]
    at: float
    after: float

    @property
    def flags(self) -> int:
        return int(self.data.get("flags") or 0)

    @property
    def ephemeral(self) -> bool:
        return bool(self.flags & FLAG_EPHEMERAL)


@dataclass
class FakeInteraction:
    """An interaction the fake dispatched (slash command or button click) and what the bot did with it."""

    id: int
    token: str
    type: int
    user: FakeUser
    channel_id: int
    guild_id: int | None
    data: dict[str, Any]
    dispatched_at: float
    message_id: int | None = None
    responses: list[InteractionResponse] = field(default_factory=list)
    original_message_id: int | None = None
    followup_ids: list[int] = field(default_factory=list)
    modal: dict[str, Any] | None = None  # the modal the bot answered with, while it is open
    submitted: bool = False


@dataclass
class CommandSync:
    """One bulk overwrite of application commands: global (`guild_id` None) or for one guild."""

    guild_id: int | None
    commands: list[dict[str, Any]]
    at: float


@dataclass
class ScriptedAnswer:
    """An answer served instead of the real one for the next `times` calls matching `method` and `pattern`: after
    carrying the call out when `carried_out` (an answer lost on its way back), and as `error` raised to the caller when
    given (in process only)."""

    method: str | None
    pattern: re.Pattern[str]
    status: int
    body: Any
    headers: dict[str, str]
    times: int
    carried_out: bool = False
    error: Exception | None = None


class DiscordError(Exception):
    """An error answer: HTTP status and Discord's JSON error body."""

    def __init__(self, status: int, code: int, message: str, errors: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body: dict[str, Any] = {"message": message, "code": code}
        if errors:
            self.body["errors"] = errors


class FormErrors:
    """Collects Invalid Form Body errors under their field paths, nested as Discord nests them."""

    def __init__(self) -> None:
        self.errors: dict[str, Any] = {}

    def add(self, path: tuple[str | int, ...], code: str, message: str) -> None:
        node = self.errors
        for part in path:
            node = node.setdefault(str(part), {})
        node.setdefault("_errors", []).append({"code": code, "message": message})

    def too_long(self, path: tuple[str | int, ...], value: Any, limit: int) -> int:
        length = len(value) if isinstance(value, (str, list)) else 0
        if length > limit:
            self.add(path, "BASE_TYPE_MAX_LENGTH", f"Must be {limit} or fewer in length.")
        return length

    def raise_if_any(self) -> None:
        if self.errors:
            raise DiscordError(400, 50035, "Invalid Form Body", self.errors)


def message_form_errors(payload: dict[str, Any]) -> FormErrors:
    """Discord's limits on message content, embeds, components and nonce."""
    errors = FormErrors()
    if payload.get("content") is not None:
        errors.too_long(("content",), str(payload["content"]), CONTENT_LIMIT)
    embeds = payload.get("embeds") or []
    errors.too_long(("embeds",), embeds, EMBEDS_LIMIT)
    total = 0
    for index, embed in enumerate(embeds if isinstance(embeds, list) else []):
        for keys, limit in EMBED_TEXT_LIMITS.items():
            value: Any = embed
            for key in keys:
                value = value.get(key) if isinstance(value, dict) else None
            if isinstance(value, str):
                total += errors.too_long(("embeds", index, *keys), value, limit)
        fields = embed.get("fields") or []
        errors.too_long(("embeds", index, "fields"), fields, EMBED_FIELDS_LIMIT)
        for position, embed_field in enumerate(fields):
            for key, limit in FIELD_LIMITS.items():
                value = str(embed_field.get(key) or "")
                if not value:
                    errors.add(("embeds", index, "fields", position, key), "BASE_TYPE_REQUIRED", "This field is required")
                total += errors.too_long(("embeds", index, "fields", position, key), value, limit)
    if total > EMBED_TOTAL_LIMIT:
        errors.add(("embeds",), "MAX_EMBED_SIZE_EXCEEDED", f"Embed size exceeds maximum size of {EMBED_TOTAL_LIMIT}")
    errors.too_long(("components",), payload.get("components") or [], COMPONENT_ROWS_LIMIT)
    _component_errors(errors, payload.get("components") or [])
    if payload.get("nonce") is not None:
        errors.too_long(("nonce",), str(payload["nonce"]), NONCE_LIMIT)
    return errors


def _component_errors(errors: FormErrors, rows: list[Any]) -> None:
    """Discord's rules for a message's action rows, buttons and string select menus."""
    seen: set[str] = set()
    for index, row in enumerate(rows):
        path: tuple[str | int, ...] = ("components", index)
        if not isinstance(row, dict) or row.get("type") != COMPONENT_ACTION_ROW:
            errors.add((*path, "type"), "UNION_TYPE_CHOICES", "Value of field \"type\" must be one of (1,).")
            continue
        inner = row.get("components") or []
        kinds = [component.get("type") for component in inner if isinstance(component, dict)]
        if COMPONENT_STRING_SELECT in kinds and len(inner) != 1:
            errors.add((*path, "components"), "BASE_TYPE_BAD_LENGTH", "A row holds one select menu, or buttons.")
        errors.too_long((*path, "components"), inner, BUTTONS_PER_ROW)
        for position, component in enumerate(inner):
            where = (*path, "components", position)
            kind = component.get("type")
            if kind == COMPONENT_BUTTON and component.get("style") == BUTTON_LINK:
                continue
            custom_id = str(component.get("custom_id") or "")
            if not custom_id:
                errors.add((*where, "custom_id"), "BASE_TYPE_REQUIRED", "This field is required")
            errors.too_long((*where, "custom_id"), custom_id, CUSTOM_ID_LIMIT)
            if custom_id in seen:
                errors.add((*where, "custom_id"), "COMPONENT_CUSTOM_ID_DUPLICATED",
                           "Component custom id cannot be duplicated")
            seen.add(custom_id)
            if kind == COMPONENT_BUTTON:
                errors.too_long((*where, "label"), str(component.get("label") or ""), BUTTON_LABEL_LIMIT)
            elif kind == COMPONENT_STRING_SELECT:
                options = component.get("options") or []
                if not options:
                    errors.add((*where, "options"), "BASE_TYPE_REQUIRED", "This field is required")
                errors.too_long((*where, "options"), options, SELECT_OPTIONS_LIMIT)
                errors.too_long((*where, "placeholder"), str(component.get("placeholder") or ""),
                                SELECT_PLACEHOLDER_LIMIT)
                for number, option in enumerate(options):
                    for key in ("label", "value", "description"):
                        errors.too_long((*where, "options", number, key), str(option.get(key) or ""),
                                        OPTION_TEXT_LIMIT)
                if sum(bool(option.get("default")) for option in options) > int(component.get("max_values") or 1):
                    errors.add((*where, "options"), "SELECT_COMPONENT_TOO_MANY_DEFAULTS",
                               "More default options than max_values")
            else:
                errors.add((*where, "type"), "UNION_TYPE_CHOICES", "Value of field \"type\" must be one of (2, 3).")


def message_components(message: DiscordMessage) -> list[dict[str, Any]]:
    """The buttons and select menus of a message, in reading order, out of their action rows."""
    return [component for row in message.components for component in row.get("components") or []]


def is_empty_message(content: Any, embeds: Any, components: Any, attachments: Any, payload: dict[str, Any]) -> bool:
    return not (str(content or "").strip() or embeds or components or attachments
                or payload.get("sticker_ids") or payload.get("poll"))


def _text_input_errors(errors: FormErrors, path: tuple[str | int, ...], text_input: dict[str, Any], *,
                       in_label: bool) -> None:
    custom_id = str(text_input.get("custom_id") or "")
    if not custom_id:
        errors.add((*path, "custom_id"), "BASE_TYPE_REQUIRED", "This field is required")
    errors.too_long((*path, "custom_id"), custom_id, CUSTOM_ID_LIMIT)
    if text_input.get("style") not in (1, 2):
        errors.add((*path, "style"), "BASE_TYPE_CHOICES", "Value must be one of {1, 2}.")
    if in_label and text_input.get("label") is not None:
        errors.add((*path, "label"), "COMPONENT_LABEL_DEPRECATED", "A text input in a label has no label of its own.")
    if not in_label:
        label = str(text_input.get("label") or "")
        if not label:
            errors.add((*path, "label"), "BASE_TYPE_REQUIRED", "This field is required")
        errors.too_long((*path, "label"), label, LABEL_LIMIT)
    for key in ("min_length", "max_length"):
        value = text_input.get(key)
        if value is not None and not (isinstance(value, int) and 0 <= value <= TEXT_INPUT_LIMIT):
            errors.add((*path, key), "NUMBER_TYPE_MAX", f"int value should be less than or equal to {TEXT_INPUT_LIMIT}")
    errors.too_long((*path, "placeholder"), str(text_input.get("placeholder") or ""), PLACEHOLDER_LIMIT)
    errors.too_long((*path, "value"), str(text_input.get("value") or ""), TEXT_INPUT_LIMIT)


def modal_form_errors(modal: dict[str, Any]) -> FormErrors:
    """Discord's rules for a modal: custom id, title, and one to five labels, text displays or action rows."""
    errors = FormErrors()
    custom_id = str(modal.get("custom_id") or "")
    title = str(modal.get("title") or "")
    for key, value, limit in (("custom_id", custom_id, CUSTOM_ID_LIMIT), ("title", title, MODAL_TITLE_LIMIT)):
        if not value:
            errors.add(("data", key), "BASE_TYPE_REQUIRED", "This field is required")
        errors.too_long(("data", key), value, limit)
    components = modal.get("components")
    if not isinstance(components, list) or not components:
        errors.add(("data", "components"), "BASE_TYPE_REQUIRED", "This field is required")
        return errors
    errors.too_long(("data", "components"), components, MODAL_COMPONENTS_LIMIT)
    for index, component in enumerate(components):
        path: tuple[str | int, ...] = ("data", "components", index)
        kind = component.get("type") if isinstance(component, dict) else None
        if kind == COMPONENT_LABEL:
            label = str(component.get("label") or "")
            if not label:
                errors.add((*path, "label"), "BASE_TYPE_REQUIRED", "This field is required")
            errors.too_long((*path, "label"), label, LABEL_LIMIT)
            errors.too_long((*path, "description"), str(component.get("description") or ""), LABEL_DESCRIPTION_LIMIT)
            inner = component.get("component")
            if not isinstance(inner, dict) or inner.get("type") != COMPONENT_TEXT_INPUT:
                errors.add((*path, "component"), "UNION_TYPE_CHOICES", "Value of field \"type\" must be one of (4,).")
            else:
                _text_input_errors(errors, (*path, "component"), inner, in_label=True)
        elif kind == COMPONENT_TEXT_DISPLAY:
            content = str(component.get("content") or "")
            if not content:
                errors.add((*path, "content"), "BASE_TYPE_REQUIRED", "This field is required")
            errors.too_long((*path, "content"), content, TEXT_DISPLAY_LIMIT)
        elif kind == COMPONENT_ACTION_ROW:
            inner_components = component.get("components") or []
            if len(inner_components) != 1 or inner_components[0].get("type") != COMPONENT_TEXT_INPUT:
                errors.add((*path, "components"), "BASE_TYPE_BAD_LENGTH", "Must be a single text input.")
            else:
                _text_input_errors(errors, (*path, "components", 0), inner_components[0], in_label=False)
        else:
            errors.add((*path, "type"), "UNION_TYPE_CHOICES", "Value of field \"type\" must be one of (1, 10, 18).")
    return errors


def modal_text_inputs(modal: dict[str, Any]) -> list[dict[str, Any]]:
    """The text inputs of a modal, in order, wherever they sit (a label or an action row)."""
    inputs = []
    for component in modal.get("components") or []:
        if component.get("type") == COMPONENT_LABEL:
            inputs.append(component["component"])
        elif component.get("type") == COMPONENT_ACTION_ROW:
            inputs.extend(component.get("components") or [])
    return inputs


def submitted_components(modal: dict[str, Any], values: dict[str, str]) -> list[dict[str, Any]]:
    """A modal's components as Discord sends them back on submission: each input's custom id and `value`."""
    def answered(text_input: dict[str, Any]) -> dict[str, Any]:
        custom_id = text_input["custom_id"]
        return {"type": COMPONENT_TEXT_INPUT, "custom_id": custom_id, "value": values.get(custom_id, "")}

    submitted: list[dict[str, Any]] = []
    for component in modal.get("components") or []:
        kind = component.get("type")
        if kind == COMPONENT_LABEL:
            submitted.append({"type": COMPONENT_LABEL, "component": answered(component["component"])})
        elif kind == COMPONENT_ACTION_ROW:
            submitted.append({"type": COMPONENT_ACTION_ROW, "components": [answered(component["components"][0])]})
        elif kind == COMPONENT_TEXT_DISPLAY:
            submitted.append({"type": COMPONENT_TEXT_DISPLAY})
    return submitted


@dataclass
class UploadedFile:
    field: str
    filename: str
    content_type: str | None
    data: bytes


def _disposition_params(header: str) -> dict[str, str]:
    params: dict[str, str] = {}
    for match in re.finditer(r';\s*([\w*]+)="?((?:[^"\\;]|\\.)*)"?', header):
        params[match.group(1).lower()] = match.group(2)
    return params


def parse_multipart(body: bytes, content_type: str) -> tuple[dict[str, str], list[UploadedFile]]:
    """Form fields and files of a multipart/form-data body (what aiohttp and httpx send)."""
    boundary = _disposition_params(content_type).get("boundary", "").encode()
    if not boundary:
        raise ValueError("multipart body without boundary")
    fields: dict[str, str] = {}
    files: list[UploadedFile] = []
    for chunk in body.split(b"--" + boundary)[1:]:
        if chunk.startswith(b"--"):
            break
        head, _, data = chunk.removeprefix(b"\r\n").partition(b"\r\n\r\n")
        data = data.removesuffix(b"\r\n")
        headers = {}
        for line in head.decode("utf-8", "replace").split("\r\n"):
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        params = _disposition_params(headers.get("content-disposition", ""))
        if "filename" in params:
            files.append(UploadedFile(params.get("name", ""), params["filename"], headers.get("content-type"), data))
        else:
            fields[params.get("name", "")] = data.decode("utf-8")
    return fields, files


@dataclass
class ApiRequest:
    method: str
    path: str
    params: dict[str, str]
    query: dict[str, str]
    json: Any
    files: list[UploadedFile]


@dataclass
class ApiRoute:
    method: str
    template: str
    handler: Callable[[ApiRequest], tuple[int, Any]]
    auth: bool = True
    writes_message: bool = False
    pattern: re.Pattern[str] = field(init=False)

    def __post_init__(self) -> None:
        self.pattern = re.compile("^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", self.template) + "$")


@dataclass
class _Bucket:
    started: float
    count: int = 0


class FakeDiscord(LoopbackFake):
    """Discord's REST API and Gateway for one bot application, answering in Discord's shapes."""

    def __init__(self, *, token: str = FAKE_TOKEN, bot_name: str = "deepthread", guilds: list[FakeGuild] | None = None,
                 channels: list[FakeChannel] | None = None, message_content_intent_enabled: bool = False,
                 members_intent_enabled: bool = False, presence_intent_enabled: bool = False,
                 heartbeat_interval: int = 41250, interaction_timeout: float = 3.0, nonce_window: float = 300.0,
                 rate_limit: tuple[int, float] = (50, 1.0), clock: Callable[[], float] = time.monotonic) -> None:
        self.token = token
        self.clock = clock
        self.application_id = _snowflake()
        self.bot = FakeUser(self.application_id, bot_name, bot=True)
        self.owner = FakeUser(_snowflake(), "owner")
        self.message_content_intent_enabled = message_content_intent_enabled
        self.members_intent_enabled = members_intent_enabled
        self.presence_intent_enabled = presence_intent_enabled
        self.heartbeat_interval = heartbeat_interval
        self.interaction_timeout = interaction_timeout
        self.nonce_window = nonce_window
        self.rate_limit = rate_limit
        self.requests = RequestLog()
        # The CDN: attachments added apart from any message (`add_attachment`), and every request it got.
        self.cdn_requests = RequestLog()
        self._loose_attachments: dict[tuple[str, str], DiscordAttachment] = {}
        self.changed = threading.Condition(threading.RLock())
        self._lock = self.changed
        self._guilds: dict[int, FakeGuild] = {guild.id: guild for guild in guilds or [FakeGuild(_snowflake())]}
        first_guild = next(iter(self._guilds))
        default_channels = [FakeChannel(_snowflake(), "research", guild_id=first_guild)]
        self._channels: dict[int, FakeChannel] = {channel.id: channel for channel in channels or default_channels}
        self.guild_id = first_guild
        self.channel_id = next(channel.id for channel in self._channels.values() if channel.type == CHANNEL_TEXT)
        self._users: dict[int, FakeUser] = {self.bot.id: self.bot, self.owner.id: self.owner}
        self._messages: dict[int, list[DiscordMessage]] = {}
        self._calls: list[DiscordCall] = []
        self._scripts: list[ScriptedAnswer] = []
        self._in_process = False
        self._buckets: dict[str, _Bucket] = {}
        self._nonces: dict[tuple[int, str], tuple[int, float]] = {}
        self._interactions: dict[int, FakeInteraction] = {}
        self._commands: dict[int | None, list[dict[str, Any]]] = {}
        self._syncs: list[CommandSync] = []
        for guild in self._guilds.values():
            guild.owner_id = guild.owner_id or self.owner.id
            guild.join(self.bot)
        self.gateway = FakeGateway(self)
        self._routes = self._build_routes()
        self.app = Starlette(routes=[
            Route(API_PREFIX + "/{path:path}", self._api, methods=["GET", "POST", "PUT", "PATCH", "DELETE"]),
            Route("/attachments/{channel_id}/{attachment_id}/{filename}", self._attachment, methods=["GET"]),
            WebSocketRoute("/gateway", self.gateway.endpoint),
        ])

    # --- addresses -------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The loopback server's address once started; before that, for a fake reached through `client()`, the name
        only the in-process transport answers."""
        if self._server is None and self._in_process:
            return IN_PROCESS_URL
        return super().url

    def client(self) -> httpx.AsyncClient:
        """An httpx client reaching this fake in process, as the bot reaches Discord: its token, under `api_url`."""
        self._in_process = True
        return httpx.AsyncClient(base_url=self.api_url, transport=httpx.ASGITransport(app=self.app),
                                 headers={"Authorization": f"Bot {self.token}"})

    @property
    def api_url(self) -> str:
        """The REST base to configure as DISCORD_API_URL (and discord.py's `Route.BASE`)."""
        return f"{self.url}{API_PREFIX}"

    @property
    def cdn_url(self) -> str:
        """The origin attachments are served from (Discord's cdn.discordapp.com), to configure as DISCORD_FILE_HOSTS."""
        return self.url

    @property
    def gateway_url(self) -> str:
        return f"{self.url.replace('http://', 'ws://')}/gateway"

    def stop(self) -> None:
        if self._server is not None:
            self.gateway.close_connections(1001, "Fake Discord is stopping.")
        super().stop()

    # --- scripting -------------------------------------------------------------------------------

    def fail_next(self, method: str | None, path_pattern: str, *, status: int = 429, retry_after: float = 1.5,
                  times: int = 1, global_: bool = False, body: dict[str, Any] | None = None) -> None:
        """Answer the next `times` calls of `method` (None: any) whose API path matches the regex `path_pattern`
        (searched in e.g. `/channels/123/messages`) with `status`: 429 as Discord rate limits, 403 Missing
        Permissions, 500, or `body`. Nothing is stored for those calls."""
        headers: dict[str, str] = {}
        if status == 429:
            body = body or {"message": "You are being rate limited.", "retry_after": retry_after, "global": global_}
            headers = {"Retry-After": str(math.ceil(retry_after)), "X-RateLimit-Scope": "global" if global_ else "user"}
            if global_:
                headers["X-RateLimit-Global"] = "true"
        elif body is None:
            body = {"code": 50013, "message": "Missing Permissions"} if status == 403 else \
                {"message": f"{status}: {'Internal Server Error' if status >= 500 else 'Error'}", "code": 0}
        self.answer_next(method, path_pattern, status=status, body=body, headers=headers, times=times)

    def answer_next(self, method: str | None, path_pattern: str = "", *, status: int = 200, body: Any = None,
                    headers: dict[str, str] | None = None, times: int = 1, carried_out: bool = False,
                    error: Exception | None = None) -> None:
        """Answer the next `times` calls of `method` (None: any) whose API path matches the regex `path_pattern` (empty:
        any path) with `status`, `body` as JSON (None: an empty body) and `headers` over the rate-limit ones. With
        `carried_out` the call is done first, so the answer is one lost on its way back; with `error` (in process only)
        the caller gets that exception instead of an answer."""
        with self._lock:
            self._scripts.append(ScriptedAnswer(method.upper() if method else None, re.compile(path_pattern), status,
                                                body, dict(headers or {}), times, carried_out, error))

    # --- users, channels, guilds -----------------------------------------------------------------

    def new_user(self, username: str, *, bot: bool = False) -> FakeUser:
        """A new user with a fresh snowflake id."""
        user = FakeUser(_snowflake(), username, bot=bot)
        with self._lock:
            self._users[user.id] = user
        return user

    def add_member(self, user: FakeUser, guild_id: int | None = None, roles: list[int] | None = None) -> None:
        with self._lock:
            self._users[user.id] = user
            guild = self._guilds[int(guild_id or self.guild_id)]
            guild.members[user.id] = FakeMember(user, list(roles or []))
            self.changed.notify_all()

    def add_channel(self, name: str, *, guild_id: int | None = None, type: int = CHANNEL_TEXT,
                    private_to: list[FakeUser] | None = None) -> int:
        """A new guild channel, private to the bot and `private_to` when given (no CHANNEL_CREATE is sent: add
        channels before the client connects)."""
        with self._lock:
            shown_to = None if private_to is None else [self.bot.id, *(user.id for user in private_to)]
            channel = FakeChannel(_snowflake(), name, type=type, guild_id=int(guild_id or self.guild_id),
                                  position=len(self._channels), private_to=shown_to)
            self._channels[channel.id] = channel
            self.changed.notify_all()
            return channel.id

    def delete_channel(self, channel_id: int) -> None:
        """Delete a guild channel, as a server admin would: it is gone, and CHANNEL_DELETE is dispatched."""
        with self._lock:
            channel = self._channels.pop(int(channel_id))
            self.changed.notify_all()
        self.gateway.dispatch("CHANNEL_DELETE", channel.as_api())

    def remove_bot(self, guild_id: int | None = None) -> None:
        """Remove the bot from a guild, as a server admin kicking it would: GUILD_DELETE without `unavailable`."""
        self.gateway.dispatch("GUILD_DELETE", {"id": str(int(guild_id or self.guild_id))})

    def create_dm(self, user: FakeUser) -> int:
        """The DM channel between `user` and the bot (type 1, no guild), created if needed."""
        with self._lock:
            self._users[user.id] = user
            return self._dm_channel(user).id

    def create_thread(self, parent_id: int, name: str, *, owner: FakeUser, message_id: int | None = None) -> int:
        """A public thread started by a user (from `message_id` if given); dispatches THREAD_CREATE."""
        with self._lock:
            parent = self._channel(int(parent_id))
            starter = self._message(parent.id, int(message_id)) if message_id is not None else None
            if starter is not None and starter.thread_id is not None:
                raise ValueError(f"message {message_id} already has thread {starter.thread_id}")
            thread = self._new_thread(parent, name, owner, message_id=message_id)
            if starter is not None:
                starter.thread_id = thread.id
            return thread.id

    def channel(self, channel_id: int) -> FakeChannel:
        with self._lock:
            return self._channels[int(channel_id)]

    def threads(self, parent_id: int | None = None) -> list[FakeChannel]:
        with self._lock:
            return [channel for channel in self._channels.values()
                    if channel.is_thread and (parent_id is None or channel.parent_id == int(parent_id))]

    # --- driving the bot through the gateway (safe from the test thread) -------------------------

    def send_command(self, user: FakeUser, channel_id: int, name: str, options: dict[str, Any] | None = None, *,
                     guild_id: int | None = None, app_permissions: int = BOT_PERMISSIONS, locale: str = "en-US") -> int:
        """Dispatch INTERACTION_CREATE for slash command `name` with `options`; returns the interaction id."""
        with self._lock:
            channel = self._channel(int(channel_id))
            guild_id = int(guild_id) if guild_id is not None else channel.guild_id
            command, scope = self._registered_command(name, guild_id)
            declared = {option["name"]: option.get("type") for option in (command or {}).get("options") or []}
            data: dict[str, Any] = {"id": command["id"] if command else str(_snowflake()), "name": name, "type": 1,
                                    "options": [self._option(key, value, declared.get(key))
                                                for key, value in (options or {}).items()]}
            if scope is not None:
                data["guild_id"] = str(scope)
            users = {str(value.id): value.as_api() for value in (options or {}).values() if isinstance(value, FakeUser)}
            attachments = {value["id"]: copy.deepcopy(value) for value in (options or {}).values() if _is_attachment(value)}
            resolved: dict[str, Any] = {}
            if users:
                resolved["users"] = users
            if attachments:
                resolved["attachments"] = attachments
            if resolved:
                data["resolved"] = resolved
            interaction = self._dispatch_interaction(INTERACTION_APPLICATION_COMMAND, user, channel, guild_id, data,
                                                     app_permissions=app_permissions, locale=locale)
            return interaction.id

    def click_button(self, user: FakeUser, channel_id: int, message_id: int, custom_id: str, *,
                     app_permissions: int = BOT_PERMISSIONS) -> int:
        """Dispatch INTERACTION_CREATE for a click on button `custom_id` of a message; returns the interaction id."""
        with self._lock:
            channel = self._channel(int(channel_id))
            message = self._message(channel.id, int(message_id))
            interaction = self._dispatch_interaction(
                INTERACTION_MESSAGE_COMPONENT, user, channel, channel.guild_id,
                {"custom_id": custom_id, "component_type": 2}, app_permissions=app_permissions, message=message)
            return interaction.id

    def choose(self, user: FakeUser, channel_id: int, message_id: int, custom_id: str, values: list[str], *,
               app_permissions: int = BOT_PERMISSIONS) -> int:
        """`user` picks `values` in select menu `custom_id` of a message: INTERACTION_CREATE with the values, as Discord
        sends it (component type 3); returns the interaction id. As on Discord, the menu must be on the message and the
        values among its options, as many as it allows."""
        with self._lock:
            channel = self._channel(int(channel_id))
            message = self._message(channel.id, int(message_id))
            menu = next((component for component in message_components(message)
                         if component.get("custom_id") == custom_id), None)
            if menu is None or menu.get("type") != COMPONENT_STRING_SELECT:
                raise AssertionError(f"message {message_id} has no select menu {custom_id!r}")
            offered = {option["value"] for option in menu.get("options") or []}
            if set(values) - offered:
                raise AssertionError(f"the menu offers no {sorted(set(values) - offered)}")
            if not int(menu.get("min_values", 1)) <= len(values) <= int(menu.get("max_values", 1)):
                raise AssertionError(f"the menu takes {menu.get('min_values', 1)} to {menu.get('max_values', 1)} values")
            interaction = self._dispatch_interaction(
                INTERACTION_MESSAGE_COMPONENT, user, channel, channel.guild_id,
                {"custom_id": custom_id, "component_type": COMPONENT_STRING_SELECT, "values": list(values)},
                app_permissions=app_permissions, message=message)
            return interaction.id

    def submit_modal(self, user: FakeUser, interaction_id: int, values: dict[str, str], *,
                     app_permissions: int = BOT_PERMISSIONS) -> int:
        """`user` fills in the modal the bot answered interaction `interaction_id` with (`values` by the inputs' custom
        ids) and submits it: INTERACTION_CREATE for the submission, carrying the message a button of which opened it;
        returns the new interaction's id. As on Discord, only the person the modal was shown to can submit it, once,
        with every required input filled in."""
        with self._lock:
            opened = self._interactions[int(interaction_id)]
            modal = opened.modal
            if modal is None or opened.submitted:
                raise AssertionError(f"interaction {interaction_id} has no open modal")
            if user.id != opened.user.id:
                raise AssertionError("a modal is shown only to the person whose interaction opened it")
            inputs = modal_text_inputs(modal)
            known = {text_input["custom_id"] for text_input in inputs}
            if set(values) - known:
                raise AssertionError(f"the modal has no inputs {sorted(set(values) - known)}")
            for text_input in inputs:
                value = values.get(text_input["custom_id"], "")
                if text_input.get("required", True) and not value:
                    raise AssertionError(f"the modal's input {text_input['custom_id']} is required")
                if len(value) > int(text_input.get("max_length") or TEXT_INPUT_LIMIT):
                    raise AssertionError(f"the modal's input {text_input['custom_id']} takes fewer characters")
            opened.submitted = True
            channel = self._channel(opened.channel_id)
            message = self._find(channel.id, opened.message_id) if opened.message_id else None
            interaction = self._dispatch_interaction(
                INTERACTION_MODAL_SUBMIT, user, channel, opened.guild_id,
                {"custom_id": modal["custom_id"], "components": submitted_components(modal, values)},
                app_permissions=app_permissions, message=message)
            return interaction.id

    def user_message(self, user: FakeUser, channel_id: int, content: str, *, mentions: list[FakeUser] | None = None,
                     embeds: list[dict[str, Any]] | None = None, reply_to: int | None = None,
                     attachments: list[dict[str, Any]] | None = None) -> int:
        """Store a message from `user` and dispatch MESSAGE_CREATE; returns its id. As on Discord, a session that
        did not ask for MESSAGE_CONTENT gets empty content (and no attachments), unless the bot is mentioned or it is
        a DM. `attachments` are objects `add_attachment` returned: the message carries those files."""
        with self._lock:
            channel = self._channel(int(channel_id))
            self._users[user.id] = user
            if channel.guild_id is not None:
                self._guilds[channel.guild_id].join(user)
            mentioned = {mention.id: mention for mention in mentions or []}
            mentioned.update({found.id: found for found in self._users_in(content)})
            message = DiscordMessage(id=_snowflake(), channel_id=channel.id, guild_id=channel.guild_id, author=user,
                                     content=content, posted_at=self.clock(), embeds=list(embeds or []),
                                     mentions=list(mentioned.values()),
                                     attachments=[self._loose_attachment(attached) for attached in attachments or []])
            if reply_to is not None:
                replied = self._message(channel.id, int(reply_to))
                message.type, message.message_reference = MESSAGE_REPLY, self._reference(replied)
                if replied.author.id not in mentioned:
                    message.mentions.append(replied.author)
            self._store(channel, message)
            return message.id

    def add_attachment(self, name: str, data: bytes, *, content_type: str | None = None, channel_id: int | None = None,
                       description: str | None = None) -> dict[str, Any]:
        """A file on the CDN as if a person had attached it in `channel_id` (the fake's channel by default); returns
        its attachment object, with a signed CDN URL as Discord gives it in an interaction or a message."""
        attachment = DiscordAttachment(_snowflake(), name, data, content_type, description)
        channel = int(channel_id or self.channel_id)
        expires = int(time.time()) + 86_400
        signature = hashlib.sha256(f"{attachment.id}:{expires}".encode()).hexdigest()
        url = (f"{self.cdn_url}/attachments/{channel}/{attachment.id}/{quote(name)}"
               f"?ex={expires:x}&is={expires - 86_400:x}&hm={signature}&")
        attachment.url = url
        with self._lock:
            self._loose_attachments[(str(channel), str(attachment.id))] = attachment
        answer: dict[str, Any] = {"id": str(attachment.id), "filename": name, "size": len(data), "url": url,
                                  "proxy_url": url, "content_type": content_type, "flags": 0}
        if description:
            answer["description"] = description
        return answer

    def add_reaction(self, user: FakeUser, channel_id: int, message_id: int, emoji: str) -> None:
        """`user` reacts to a message with a unicode emoji; dispatches MESSAGE_REACTION_ADD."""
        with self._lock:
            channel = self._channel(int(channel_id))
            message = self._message(channel.id, int(message_id))
            self._react(channel, message, user, emoji)

    def request_reconnect(self) -> None:
        """Send RECONNECT (op 7): discord.py reconnects and RESUMEs."""
        self.gateway.request_reconnect()

    # --- reading what happened -------------------------------------------------------------------

    def calls(self, method: str | None = None, path_contains: str | None = None) -> list[DiscordCall]:
        with self._lock:
            return [call for call in self._calls if (method is None or call.method == method.upper())
                    and (path_contains is None or path_contains in call.path)]

    def message_calls(self) -> list[DiscordCall]:
        """Every call that creates or edits a message (channel messages, interaction callbacks, webhooks)."""
        with self._lock:
            return [call for call in self._calls if call.writes_message]

    def messages(self, channel_id: int) -> list[DiscordMessage]:
        """Messages not deleted in posting order, ephemeral ones included (`.ephemeral`)."""
        with self._lock:
            return [message for message in self._messages.get(int(channel_id), []) if not message.deleted]

    def message(self, channel_id: int, message_id: int) -> DiscordMessage:
        with self._lock:
            for message in self._messages.get(int(channel_id), []):
                if message.id == int(message_id):
                    return message
        raise KeyError(f"no message {message_id} in channel {channel_id}")

    def edits(self, channel_id: int, message_id: int) -> list[DiscordEdit]:
        with self._lock:
            return list(self.message(channel_id, message_id).edits)

    def interaction(self, interaction_id: int) -> FakeInteraction:
        with self._lock:
            return self._interactions[int(interaction_id)]

    def interaction_responses(self, interaction_id: int) -> list[InteractionResponse]:
        """Accepted callbacks (a second answer is refused with 40060 and only shows in `calls()`)."""
        with self._lock:
            return list(self._interactions[int(interaction_id)].responses)

    def modal(self, interaction_id: int) -> dict[str, Any] | None:
        """The modal the bot answered interaction `interaction_id` with (custom_id, title, components), if it did."""
        with self._lock:
            return copy.deepcopy(self._interactions[int(interaction_id)].modal)

    def followups(self, interaction_id: int | None = None) -> list[DiscordMessage]:
        """Messages sent through the interaction webhook (the first followup after a defer is the original)."""
        with self._lock:
            interactions = [self._interactions[int(interaction_id)]] if interaction_id else self._interactions.values()
            return [self._find(interaction.channel_id, message_id)
                    for interaction in interactions for message_id in interaction.followup_ids
                    if self._find(interaction.channel_id, message_id)]

    @property
    def identify_payloads(self) -> list[dict[str, Any]]:
        return self.gateway.identify_payloads()

    @property
    def synced_commands(self) -> list[CommandSync]:
        with self._lock:
            return list(self._syncs)

    def commands(self, guild_id: int | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return copy.deepcopy(self._commands.get(int(guild_id) if guild_id else None, []))

    def gateway_connections(self) -> list[GatewayConnection]:
        return self.gateway.connections()

    def wait_for(self, predicate: Callable[[], Any], timeout: float = 10.0) -> Any:
        """Block until `predicate()` is truthy (re-checked on every state change); returns its value."""
        with self._lock:
            result = self._lock.wait_for(predicate, timeout)
        if not result:
            raise AssertionError(f"condition not met within {timeout} s")
        return result

    async def wait_for_async(self, predicate: Callable[[], Any], timeout: float = 10.0) -> Any:
        """`wait_for` without blocking the event loop (for async tests running a discord.py client)."""
        return await asyncio.to_thread(self.wait_for, predicate, timeout)

    # --- what the gateway sends (GatewayHost) ----------------------------------------------------

    def privileged_intents_allowed(self) -> int:
        return ((INTENT_MESSAGE_CONTENT if self.message_content_intent_enabled else 0)
                | (INTENT_GUILD_MEMBERS if self.members_intent_enabled else 0)
                | (INTENT_GUILD_PRESENCES if self.presence_intent_enabled else 0))

    def application_flags(self) -> int:
        return ((APP_FLAG_MESSAGE_CONTENT if self.message_content_intent_enabled else 0)
                | (APP_FLAG_GUILD_MEMBERS if self.members_intent_enabled else 0)
                | (APP_FLAG_PRESENCE if self.presence_intent_enabled else 0))

    def ready_payload(self, session_id: str, shard: list[int] | None) -> dict[str, Any]:
        ready = {"v": 10, "user": {**self.bot.as_api(), "verified": True, "mfa_enabled": False, "email": None},
                 "guilds": [{"id": str(guild_id), "unavailable": True} for guild_id in self._guilds],
                 "session_id": session_id, "session_type": "normal", "resume_gateway_url": self.gateway_url,
                 "application": {"id": str(self.application_id), "flags": self.application_flags()},
                 "private_channels": [], "relationships": [], "presences": [], "guild_join_requests": [],
                 "geo_ordered_rtc_regions": ["loopback"], "user_settings": {}, "auth": {},
                 "_trace": ["[\"fake-gateway\",{\"micros\":0}]"]}
        if shard is not None:
            ready["shard"] = shard
        return ready

    def guild_create_payloads(self) -> list[dict[str, Any]]:
        return [self._guild_json(guild, full=True) for guild in self._guilds.values()]

    def guild_member_payloads(self, guild_id: int) -> list[dict[str, Any]]:
        guild = self._guilds.get(guild_id)
        return [self._member_json(guild, user_id) for user_id in guild.members] if guild else []

    # --- HTTP ------------------------------------------------------------------------------------

    def _build_routes(self) -> list[ApiRoute]:
        return [
            ApiRoute("GET", "/gateway", lambda request: (200, {"url": self.gateway_url}), auth=False),
            ApiRoute("GET", "/gateway/bot", self._gateway_bot),
            ApiRoute("GET", "/users/@me", lambda request: (200, self.ready_payload("", None)["user"])),
            ApiRoute("POST", "/users/@me/channels", self._open_dm),
            ApiRoute("GET", "/users/{user_id}", self._get_user),
            ApiRoute("GET", "/applications/@me", lambda request: (200, self._application_json())),
            ApiRoute("GET", "/oauth2/applications/@me", lambda request: (200, self._application_json())),
            ApiRoute("GET", "/applications/{application_id}/commands", self._get_commands),
            ApiRoute("PUT", "/applications/{application_id}/commands", self._put_commands),
            ApiRoute("GET", "/applications/{application_id}/guilds/{guild_id}/commands", self._get_commands),
            ApiRoute("PUT", "/applications/{application_id}/guilds/{guild_id}/commands", self._put_commands),
            ApiRoute("GET", "/guilds/{guild_id}", self._get_guild),
            ApiRoute("GET", "/channels/{channel_id}", lambda request: (200, self._channel_of(request).as_api())),
            ApiRoute("GET", "/channels/{channel_id}/messages", self._list_messages),
            ApiRoute("POST", "/channels/{channel_id}/messages", self._create_message, writes_message=True),
            ApiRoute("GET", "/channels/{channel_id}/messages/{message_id}", self._get_message),
            ApiRoute("PATCH", "/channels/{channel_id}/messages/{message_id}", self._edit_message, writes_message=True),
            ApiRoute("DELETE", "/channels/{channel_id}/messages/{message_id}", self._delete_message),
            ApiRoute("POST", "/channels/{channel_id}/messages/{message_id}/threads", self._thread_from_message),
            ApiRoute("POST", "/channels/{channel_id}/threads", self._thread_without_message),
            ApiRoute("PUT", "/channels/{channel_id}/messages/{message_id}/reactions/{emoji}/@me", self._put_reaction),
            ApiRoute("DELETE", "/channels/{channel_id}/messages/{message_id}/reactions/{emoji}/@me",
                     self._delete_reaction),
            ApiRoute("POST", "/channels/{channel_id}/typing", self._typing),
            ApiRoute("POST", "/interactions/{interaction_id}/{interaction_token}/callback", self._callback,
                     auth=False, writes_message=True),
            ApiRoute("POST", "/webhooks/{application_id}/{interaction_token}", self._followup, auth=False,
                     writes_message=True),
            ApiRoute("GET", "/webhooks/{application_id}/{interaction_token}/messages/{message_id}",
                     self._get_webhook_message, auth=False),
            ApiRoute("PATCH", "/webhooks/{application_id}/{interaction_token}/messages/{message_id}",
                     self._edit_webhook_message, auth=False, writes_message=True),
            ApiRoute("DELETE", "/webhooks/{application_id}/{interaction_token}/messages/{message_id}",
                     self._delete_webhook_message, auth=False),
        ]

    async def _api(self, request: Request) -> Response:
        body = await request.body()
        self.requests.add(RecordedRequest(method=request.method, host=request.headers.get("host", ""),
                                          path=request.url.path, query=dict(request.query_params),
                                          headers=dict(request.headers), body=body))
        path = "/" + request.path_params["path"]
        query = dict(request.query_params)
        content_type = request.headers.get("content-type", "")
        route, params = self._match(request.method, path)
        payload: Any = None
        files: list[UploadedFile] = []
        parse_error: DiscordError | None = None
        try:
            if content_type.startswith("multipart/form-data"):
                fields, files = parse_multipart(body, content_type)
                payload = json.loads(fields["payload_json"]) if "payload_json" in fields else dict(fields)
            elif body:
                payload = json.loads(body)
        except (ValueError, KeyError):
            parse_error = DiscordError(400, 50109, "The request body contains invalid JSON.")
        with self._lock:
            status, answer, headers, error = self._answer(request, route, ApiRequest(
                request.method, path, params, query, payload, files), parse_error)
            self._calls.append(DiscordCall(
                method=request.method, path=path, route=route.template if route else path, query=query, json=payload,
                files=[file.filename for file in files], status=0 if error else status, at=self.clock(),
                wall_time=time.time(), code=answer.get("code") if isinstance(answer, dict) else None,
                writes_message=bool(route and route.writes_message), answer_headers=dict(headers)))
            self.changed.notify_all()
        if error is not None:
            raise error
        headers["Via"] = "1.1 google"
        if answer is None:
            return Response(status_code=status, headers=headers)
        return JSONResponse(answer, status_code=status, headers=headers)

    def _match(self, method: str, path: str) -> tuple[ApiRoute | None, dict[str, str]]:
        for route in self._routes:
            found = route.pattern.match(path)
            if found and route.method == method:
                return route, found.groupdict()
        return None, {}

    def _answer(self, request: Request, route: ApiRoute | None, api_request: ApiRequest,
                parse_error: DiscordError | None) -> tuple[int, Any, dict[str, str], Exception | None]:
        """Status, body and headers of the answer to a call, and the scripted transport error to raise instead."""
        path = api_request.path
        if route is None:
            exists = any(candidate.pattern.match(path) for candidate in self._routes)
            status = 405 if exists else 404
            return status, {"message": f"{status}: {'Method Not Allowed' if exists else 'Not Found'}", "code": 0}, \
                self._take_bucket(f"{api_request.method} {path}", "")[0], None
        major = next((api_request.params[name] for name in ("channel_id", "guild_id", "interaction_token",
                                                            "interaction_id") if name in api_request.params), "")
        limit_headers, retry_after = self._take_bucket(f"{route.method} {route.template}", major)
        if route.auth and request.headers.get("authorization") != f"Bot {self.token}":
            return 401, {"message": "401: Unauthorized", "code": 0}, limit_headers, None
        script = self._scripted(api_request.method, path)
        if script is not None:
            if script.carried_out:
                self._handle(route, api_request, parse_error)
            headers = {**limit_headers, **script.headers}
            if script.status == 429:
                headers["X-RateLimit-Remaining"] = "0"
            return script.status, script.body, headers, script.error
        if retry_after is not None:
            return 429, {"message": "You are being rate limited.", "retry_after": retry_after, "global": False}, \
                {**limit_headers, "Retry-After": str(math.ceil(retry_after)), "X-RateLimit-Scope": "user"}, None
        status, answer = self._handle(route, api_request, parse_error)
        return status, answer, limit_headers, None

    @staticmethod
    def _handle(route: ApiRoute, api_request: ApiRequest, parse_error: DiscordError | None) -> tuple[int, Any]:
        """What Discord does with the call: the route's answer, or its error answer."""
        try:
            if parse_error is not None:
                raise parse_error
            return route.handler(api_request)
        except DiscordError as error:
            return error.status, error.body

    def _take_bucket(self, route_key: str, major: str) -> tuple[dict[str, str], float | None]:
        limit, window = self.rate_limit
        now = self.clock()
        bucket = self._buckets.get(f"{route_key}:{major}")
        if bucket is None or now >= bucket.started + window:
            bucket = self._buckets[f"{route_key}:{major}"] = _Bucket(now)
        bucket.count += 1
        reset_after = max(bucket.started + window - now, 0.001)
        headers = {"X-RateLimit-Limit": str(limit), "X-RateLimit-Remaining": str(max(limit - bucket.count, 0)),
                   "X-RateLimit-Reset": f"{time.time() + reset_after:.3f}", "X-RateLimit-Reset-After": f"{reset_after:.3f}",
                   "X-RateLimit-Bucket": hashlib.md5(route_key.encode()).hexdigest()}
        return headers, (round(reset_after, 3) if bucket.count > limit else None)

    def _scripted(self, method: str, path: str) -> ScriptedAnswer | None:
        for script in self._scripts:
            if (script.method is None or script.method == method) and script.pattern.search(path):
                script.times -= 1
                if script.times <= 0:
                    self._scripts.remove(script)
                return script
        return None

    async def _attachment(self, request: Request) -> Response:
        self.cdn_requests.add(RecordedRequest(method=request.method, host=request.headers.get("host", ""),
                                              path=request.url.path, query=dict(request.query_params),
                                              headers=dict(request.headers), body=await request.body()))
        with self._lock:
            loose = self._loose_attachments.get((request.path_params["channel_id"], request.path_params["attachment_id"]))
            if loose is not None:
                return Response(loose.data, media_type=loose.content_type or "application/octet-stream")
            for message in self._messages.get(int(request.path_params["channel_id"]), []):
                for attachment in message.attachments:
                    if str(attachment.id) == request.path_params["attachment_id"]:
                        return Response(attachment.data, media_type=attachment.content_type or "application/octet-stream")
        return Response(status_code=404)

    # --- lookups (under the lock) ----------------------------------------------------------------

    def _loose_attachment(self, attached: dict[str, Any]) -> DiscordAttachment:
        """The attachment `add_attachment` made and returned as `attached`."""
        for (_, attachment_id), attachment in self._loose_attachments.items():
            if attachment_id == str(attached["id"]):
                return attachment
        raise AssertionError(f"no attachment {attached['id']}: make it with add_attachment")

    def _channel(self, channel_id: int) -> FakeChannel:
        channel = self._channels.get(channel_id)
        if channel is None:
            raise DiscordError(404, 10003, "Unknown Channel")
        return channel

    def _channel_of(self, request: ApiRequest) -> FakeChannel:
        return self._channel(_as_id(request.params["channel_id"]))

    def _find(self, channel_id: int, message_id: int) -> DiscordMessage | None:
        return next((message for message in self._messages.get(channel_id, [])
                     if message.id == message_id and not message.deleted), None)

    def _message(self, channel_id: int, message_id: int) -> DiscordMessage:
        message = self._find(channel_id, message_id)
        if message is None:
            raise DiscordError(404, 10008, "Unknown Message")
        return message

    def _dm_channel(self, user: FakeUser) -> FakeChannel:
        for channel in self._channels.values():
            if channel.type == CHANNEL_DM and channel.recipients and channel.recipients[0].id == user.id:
                return channel
        channel = FakeChannel(_snowflake(), None, type=CHANNEL_DM, recipients=[user])
        self._channels[channel.id] = channel
        self.changed.notify_all()
        return channel

    def _users_in(self, content: str) -> list[FakeUser]:
        return [self._users.setdefault(int(user_id), FakeUser(int(user_id), f"user{user_id}"))
                for user_id in dict.fromkeys(re.findall(r"<@!?(\d+)>", content or ""))]

    def _registered_command(self, name: str, guild_id: int | None) -> tuple[dict[str, Any] | None, int | None]:
        for scope in ([guild_id] if guild_id else []) + [None]:
            for command in self._commands.get(scope, []):
                if command["name"] == name and command.get("type", 1) == 1:
                    return command, scope
        return None, None

    @staticmethod
    def _option(name: str, value: Any, declared_type: int | None) -> dict[str, Any]:
        if isinstance(value, FakeUser):
            return {"name": name, "type": 6, "value": str(value.id)}
        if _is_attachment(value):
            return {"name": name, "type": OPTION_ATTACHMENT, "value": str(value["id"])}
        return {"name": name, "type": declared_type or OPTION_TYPES.get(type(value), 3), "value": value}

    # --- JSON shapes -----------------------------------------------------------------------------

    def _application_json(self) -> dict[str, Any]:
        return {"id": str(self.application_id), "name": self.bot.username, "icon": None, "description": "",
                "summary": "", "type": None, "hook": True, "bot_public": False, "bot_require_code_grant": False,
                "verify_key": "0" * 64, "flags": self.application_flags(), "owner": self.owner.as_api(),
                "team": None, "bot": self.bot.as_api(), "approximate_guild_count": len(self._guilds),
                "interactions_endpoint_url": None, "redirect_uris": [], "tags": [], "rpc_origins": [],
                "integration_types_config": {"0": {}}}

    def _permissions(self, guild: FakeGuild, user_id: int) -> int:
        return BOT_PERMISSIONS if user_id == self.bot.id else guild.everyone_permissions

    def _member_json(self, guild: FakeGuild, user_id: int, *, with_user: bool = True) -> dict[str, Any]:
        membership = guild.members.get(user_id) or FakeMember(self._users[user_id])
        member = {"roles": [str(role) for role in membership.roles], "nick": None, "avatar": None, "banner": None,
                  "joined_at": membership.joined_at, "premium_since": None, "deaf": False, "mute": False, "flags": 0,
                  "pending": False, "communication_disabled_until": None}
        return {"user": membership.user.as_api(), **member} if with_user else member

    def _guild_json(self, guild: FakeGuild, *, full: bool) -> dict[str, Any]:
        everyone = {"id": str(guild.id), "name": "@everyone", "permissions": str(guild.everyone_permissions),
                    "position": 0, "color": 0, "colors": {"primary_color": 0}, "hoist": False, "managed": False,
                    "mentionable": False, "icon": None, "unicode_emoji": None, "flags": 0}
        data: dict[str, Any] = {
            "id": str(guild.id), "name": guild.name, "icon": None, "splash": None, "discovery_splash": None,
            "banner": None, "description": None, "owner_id": str(guild.owner_id), "region": "loopback",
            "afk_channel_id": None, "afk_timeout": 300, "verification_level": 0, "default_message_notifications": 0,
            "explicit_content_filter": 0, "roles": [everyone], "emojis": [], "stickers": [], "features": [],
            "mfa_level": 0, "application_id": None, "system_channel_id": None, "system_channel_flags": 0,
            "rules_channel_id": None, "public_updates_channel_id": None, "safety_alerts_channel_id": None,
            "max_members": 500000, "vanity_url_code": None, "premium_tier": 0, "premium_subscription_count": 0,
            "preferred_locale": "en-US", "nsfw_level": 0, "premium_progress_bar_enabled": False,
        }
        if full:
            channels = [channel for channel in self._channels.values() if channel.guild_id == guild.id]
            data.update(
                unavailable=False, large=False, lazy=True, member_count=len(guild.members), joined_at=iso_now(),
                channels=[_without_guild_id(channel.as_api()) for channel in channels if not channel.is_thread],
                threads=[channel.as_api() for channel in channels if channel.is_thread and not channel.archived],
                members=[self._member_json(guild, self.bot.id)], presences=[], voice_states=[], stage_instances=[],
                guild_scheduled_events=[], soundboard_sounds=[])
        return data

    def _reference(self, message: DiscordMessage) -> dict[str, Any]:
        reference = {"type": 0, "message_id": str(message.id), "channel_id": str(message.channel_id)}
        if message.guild_id:
            reference["guild_id"] = str(message.guild_id)
        return reference

    def _message_json(self, message: DiscordMessage, *, gateway: bool = False) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": str(message.id), "channel_id": str(message.channel_id), "author": message.author.as_api(),
            "content": message.content, "timestamp": message.timestamp, "edited_timestamp": message.edited_timestamp,
            "tts": False, "mention_everyone": message.mention_everyone,
            "mentions": [user.as_api() for user in message.mentions],
            "mention_roles": [str(role) for role in message.mention_roles],
            "attachments": [self._attachment_json(message, attachment) for attachment in message.attachments],
            "embeds": copy.deepcopy(message.embeds), "pinned": False, "type": message.type, "flags": message.flags,
            "components": copy.deepcopy(message.components),
        }
        if message.reactions:
            data["reactions"] = [{"count": len(users), "count_details": {"burst": 0, "normal": len(users)},
                                  "me": self.bot.id in users, "me_burst": False, "burst_colors": [],
                                  "emoji": _emoji_json(emoji)} for emoji, users in message.reactions.items() if users]
        if message.nonce is not None:
            data["nonce"] = message.nonce
        if message.webhook_id is not None:
            data.update(webhook_id=str(message.webhook_id), application_id=str(self.application_id))
        if message.interaction_metadata is not None:
            data["interaction_metadata"] = message.interaction_metadata
        if message.message_reference is not None:
            data["message_reference"] = message.message_reference
            referenced = self._find(int(message.message_reference["channel_id"]),
                                    int(message.message_reference["message_id"]))
            data["referenced_message"] = self._message_json(referenced) if referenced else None
        if message.thread_id is not None and message.thread_id in self._channels:
            data["thread"] = self._channels[message.thread_id].as_api()
        channel = self._channels.get(message.channel_id)
        if channel is not None and channel.is_thread:
            data["position"] = max(channel.message_count - 1, 0)
        if gateway and message.guild_id is not None:
            guild = self._guilds[message.guild_id]
            data["guild_id"] = str(message.guild_id)
            if not message.webhook_id:
                data["member"] = self._member_json(guild, message.author.id, with_user=False)
            data["mentions"] = [{**user.as_api(), "member": self._member_json(guild, user.id, with_user=False)}
                                if user.id in guild.members else user.as_api() for user in message.mentions]
        return data

    def _attachment_json(self, message: DiscordMessage, attachment: DiscordAttachment) -> dict[str, Any]:
        url = attachment.url or f"{self.url}/attachments/{message.channel_id}/{attachment.id}/{attachment.filename}"
        data = {"id": str(attachment.id), "filename": attachment.filename, "size": len(attachment.data), "url": url,
                "proxy_url": url, "content_type": attachment.content_type, "flags": 0}
        if attachment.description:
            data["description"] = attachment.description
        return data

    # --- storing and dispatching (under the lock) ------------------------------------------------

    def _store(self, channel: FakeChannel, message: DiscordMessage) -> None:
        self._messages.setdefault(channel.id, []).append(message)
        if not message.ephemeral:
            channel.last_message_id = message.id
            if channel.is_thread:
                channel.message_count += 1
            self._dispatch_message("MESSAGE_CREATE", channel, message)
        self.changed.notify_all()

    def _dispatch_message(self, event: str, channel: FakeChannel, message: DiscordMessage) -> None:
        private = channel.type == CHANNEL_DM
        gated = not (private or message.author.id == self.bot.id or any(user.id == self.bot.id
                                                                          for user in message.mentions))
        self.gateway.dispatch(event, self._message_json(message, gateway=True),
                              intent=INTENT_DIRECT_MESSAGES if private else INTENT_GUILD_MESSAGES, content_gated=gated)

    def _new_thread(self, parent: FakeChannel, name: str, owner: FakeUser, *, message_id: int | None = None,
                    type: int = CHANNEL_PUBLIC_THREAD, auto_archive_duration: int = 1440) -> FakeChannel:
        thread = FakeChannel(message_id or _snowflake(), name, type=type, guild_id=parent.guild_id,
                             parent_id=parent.id, owner_id=owner.id, auto_archive_duration=auto_archive_duration)
        self._channels[thread.id] = thread
        created = {**thread.as_api(), "newly_created": True}
        if owner.id == self.bot.id:
            created["member"] = {"id": str(thread.id), "user_id": str(self.bot.id), "join_timestamp": iso_now(),
                                 "flags": 1}
        self.gateway.dispatch("THREAD_CREATE", created, intent=INTENT_GUILDS)
        self.changed.notify_all()
        return thread

    def _react(self, channel: FakeChannel, message: DiscordMessage, user: FakeUser, emoji: str) -> None:
        users = message.reactions.setdefault(emoji, [])
        if user.id in users:
            return
        users.append(user.id)
        event = {"user_id": str(user.id), "channel_id": str(channel.id), "message_id": str(message.id),
                 "emoji": _emoji_json(emoji), "message_author_id": str(message.author.id), "burst": False,
                 "burst_colors": [], "type": 0}
        if channel.guild_id is not None:
            guild = self._guilds[channel.guild_id]
            guild.join(user)
            event.update(guild_id=str(channel.guild_id), member=self._member_json(guild, user.id))
        private = channel.type == CHANNEL_DM
        self.gateway.dispatch("MESSAGE_REACTION_ADD", event,
                              intent=INTENT_DIRECT_MESSAGE_REACTIONS if private else INTENT_GUILD_MESSAGE_REACTIONS)
        self.changed.notify_all()

    def _dispatch_interaction(self, kind: int, user: FakeUser, channel: FakeChannel, guild_id: int | None,
                              data: dict[str, Any], *, app_permissions: int, locale: str = "en-US",
                              message: DiscordMessage | None = None) -> FakeInteraction:
        self._users[user.id] = user
        interaction = FakeInteraction(id=_snowflake(), token="aW50ZXJhY3Rpb24" + secrets.token_urlsafe(48), type=kind,
                                      user=user, channel_id=channel.id, guild_id=guild_id, data=data,
                                      dispatched_at=self.clock(), message_id=message.id if message else None)
        payload: dict[str, Any] = {
            "id": str(interaction.id), "application_id": str(self.application_id), "type": kind, "data": data,
            "token": interaction.token, "version": 1, "channel_id": str(channel.id), "locale": locale,
            "app_permissions": str(app_permissions), "entitlements": [], "attachment_size_limit": FILE_SIZE_LIMIT,
            "authorizing_integration_owners": {"0": str(guild_id) if guild_id else "0"},
            "context": 0 if guild_id else 1,
        }
        if guild_id is not None:
            guild = self._guilds[guild_id]
            guild.join(user)
            permissions = str(self._permissions(guild, user.id))
            payload.update(guild_id=str(guild_id), guild_locale="en-US",
                           guild={"id": str(guild_id), "locale": "en-US", "features": []},
                           member={**self._member_json(guild, user.id), "permissions": permissions},
                           channel={**channel.as_api(), "permissions": permissions})
        else:
            payload.update(user=user.as_api(), channel=channel.as_api())
        if message is not None:
            payload["message"] = self._message_json(message)
        self._interactions[interaction.id] = interaction
        self.gateway.dispatch("INTERACTION_CREATE", payload)
        self.changed.notify_all()
        return interaction

    def _resolved_mentions(self, message: DiscordMessage, allowed: dict[str, Any] | None) -> None:
        """Who a bot's message actually pings: what `<@id>`, `<@&id>` and @everyone name, as allowed_mentions lets."""
        parse = allowed.get("parse", []) if allowed is not None else ["users", "roles", "everyone"]
        users = self._users_in(message.content)
        roles = [int(role) for role in dict.fromkeys(re.findall(r"<@&(\d+)>", message.content))]
        allowed_users = {int(user) for user in (allowed or {}).get("users") or []}
        allowed_roles = {int(role) for role in (allowed or {}).get("roles") or []}
        message.mentions = [user for user in users if "users" in parse or user.id in allowed_users]
        message.mention_roles = [role for role in roles if "roles" in parse or role in allowed_roles]
        message.mention_everyone = "everyone" in parse and bool(re.search(r"@(everyone|here)\b", message.content))
        if message.message_reference and (allowed is None or allowed.get("replied_user")):
            replied = self._find(int(message.message_reference["channel_id"]),
                                 int(message.message_reference["message_id"]))
            if replied is not None and all(user.id != replied.author.id for user in message.mentions):
                message.mentions.append(replied.author)

    def _new_bot_message(self, channel: FakeChannel, payload: dict[str, Any], files: list[UploadedFile], *,
                         flags: int = 0, kind: int = MESSAGE_DEFAULT, webhook: bool = False) -> DiscordMessage:
        message = DiscordMessage(id=_snowflake(), channel_id=channel.id, guild_id=channel.guild_id, author=self.bot,
                                 content=str(payload.get("content") or ""), posted_at=self.clock(),
                                 embeds=list(payload.get("embeds") or []),
                                 components=list(payload.get("components") or []), type=kind,
                                 flags=flags | (int(payload.get("flags") or 0) & ~FLAG_LOADING),
                                 nonce=payload.get("nonce"), allowed_mentions=payload.get("allowed_mentions"),
                                 webhook_id=self.application_id if webhook else None)
        message.attachments = self._attachments(payload, files)
        reference = payload.get("message_reference")
        if reference and reference.get("message_id"):
            replied = self._find(int(reference.get("channel_id") or channel.id), int(reference["message_id"]))
            if replied is None and reference.get("fail_if_not_exists", True):
                errors = FormErrors()
                errors.add(("message_reference",), "MESSAGE_REFERENCE_UNKNOWN_MESSAGE", "Unknown message")
                errors.raise_if_any()
            if replied is not None:
                message.type, message.message_reference = MESSAGE_REPLY, self._reference(replied)
        self._resolved_mentions(message, message.allowed_mentions)
        return message

    def _attachments(self, payload: dict[str, Any], files: list[UploadedFile]) -> list[DiscordAttachment]:
        described = {str(entry.get("id")): entry for entry in payload.get("attachments") or []}
        attachments = []
        for index, upload in enumerate(files):
            if len(upload.data) > FILE_SIZE_LIMIT:
                raise DiscordError(413, 40005, "Request entity too large")
            entry = described.get(str(index), {})
            attachments.append(DiscordAttachment(_snowflake(), entry.get("filename") or upload.filename, upload.data,
                                                 upload.content_type, entry.get("description")))
        return attachments

    def _check_new_message(self, payload: dict[str, Any], files: list[UploadedFile]) -> None:
        message_form_errors(payload).raise_if_any()
        if is_empty_message(payload.get("content"), payload.get("embeds"), payload.get("components"), files, payload):
            raise DiscordError(400, 50006, "Cannot send an empty message")

    def _apply_edit(self, channel: FakeChannel, message: DiscordMessage, payload: dict[str, Any],
                    files: list[UploadedFile]) -> None:
        message_form_errors(payload).raise_if_any()
        content = str(payload.get("content") or "") if "content" in payload else message.content
        embeds = list(payload.get("embeds") or []) if "embeds" in payload else message.embeds
        components = list(payload.get("components") or []) if "components" in payload else message.components
        attachments = message.attachments
        if "attachments" in payload:
            kept = {str(entry.get("id")) for entry in payload.get("attachments") or []}
            attachments = [attachment for attachment in attachments if str(attachment.id) in kept]
        attachments = attachments + self._attachments(payload, files)
        if is_empty_message(content, embeds, components, attachments, {}):
            raise DiscordError(400, 50006, "Cannot send an empty message")
        message.content, message.embeds, message.components, message.attachments = content, embeds, components, attachments
        message.flags &= ~FLAG_LOADING
        if "flags" in payload and payload["flags"] is not None:
            message.flags = (message.flags & FLAG_EPHEMERAL) | (int(payload["flags"]) & ~(FLAG_EPHEMERAL | FLAG_LOADING))
        message.allowed_mentions = payload.get("allowed_mentions", message.allowed_mentions)
        if "content" in payload:
            self._resolved_mentions(message, message.allowed_mentions)
        message.edited_timestamp = iso_now()
        message.edits.append(DiscordEdit(at=self.clock(), content=content, embeds=copy.deepcopy(embeds),
                                         components=copy.deepcopy(components), flags=message.flags,
                                         allowed_mentions=payload.get("allowed_mentions")))
        if not message.ephemeral:
            self._dispatch_message("MESSAGE_UPDATE", channel, message)
        self.changed.notify_all()

    # --- REST handlers (under the lock) ----------------------------------------------------------

    def _gateway_bot(self, request: ApiRequest) -> tuple[int, Any]:
        started = len(self.gateway.identify_payloads())
        return 200, {"url": self.gateway_url, "shards": 1, "session_start_limit": {
            "total": 1000, "remaining": max(1000 - started, 0), "reset_after": 86_400_000, "max_concurrency": 1}}

    def _get_user(self, request: ApiRequest) -> tuple[int, Any]:
        user = self._users.get(_as_id(request.params["user_id"]))
        if user is None:
            raise DiscordError(404, 10013, "Unknown User")
        return 200, user.as_api()

    def _open_dm(self, request: ApiRequest) -> tuple[int, Any]:
        user_id = _as_id((request.json or {}).get("recipient_id"))
        user = self._users.setdefault(user_id, FakeUser(user_id, f"user{user_id}"))
        return 200, self._dm_channel(user).as_api()

    def _get_guild(self, request: ApiRequest) -> tuple[int, Any]:
        guild = self._guilds.get(_as_id(request.params["guild_id"]))
        if guild is None:
            raise DiscordError(404, 10004, "Unknown Guild")
        return 200, self._guild_json(guild, full=False)

    def _command_scope(self, request: ApiRequest) -> int | None:
        if _as_id(request.params["application_id"]) != self.application_id:
            raise DiscordError(403, 50001, "Missing Access")
        if "guild_id" not in request.params:
            return None
        guild_id = _as_id(request.params["guild_id"])
        if guild_id not in self._guilds:
            raise DiscordError(403, 50001, "Missing Access")
        return guild_id

    def _get_commands(self, request: ApiRequest) -> tuple[int, Any]:
        return 200, copy.deepcopy(self._commands.get(self._command_scope(request), []))

    def _put_commands(self, request: ApiRequest) -> tuple[int, Any]:
        scope = self._command_scope(request)
        commands = request.json
        errors = FormErrors()
        if not isinstance(commands, list):
            raise DiscordError(400, 50035, "Invalid Form Body", {"_errors": [
                {"code": "LIST_TYPE_CONVERT", "message": "Only iterables may be used in a ListType"}]})
        errors.too_long((), commands, 100)
        seen: set[tuple[str, int]] = set()
        for index, command in enumerate(commands):
            name, kind = str(command.get("name", "")), int(command.get("type", 1))
            if kind == 1 and not COMMAND_NAME.match(name):
                errors.add((index, "name"), "APPLICATION_COMMAND_INVALID_NAME", "Command name is invalid")
            if kind == 1 and not 1 <= len(str(command.get("description", ""))) <= 100:
                errors.add((index, "description"), "BASE_TYPE_BAD_LENGTH", "Must be between 1 and 100 in length.")
            if (name, kind) in seen:
                errors.add((index, "name"), "APPLICATION_COMMANDS_DUPLICATE_NAME", "Application command names must be unique")
            seen.add((name, kind))
        errors.raise_if_any()
        previous = {(command["name"], command["type"]): command["id"] for command in self._commands.get(scope, [])}
        registered = []
        for command in commands:
            kind = int(command.get("type", 1))
            entry = {"id": previous.get((command["name"], kind)) or str(_snowflake()),
                     "application_id": str(self.application_id), "version": str(_snowflake()), "type": kind,
                     "name": command["name"], "name_localizations": None,
                     "description": command.get("description", ""), "description_localizations": None,
                     "options": command.get("options") or [], "nsfw": bool(command.get("nsfw", False)),
                     "default_member_permissions": command.get("default_member_permissions"),
                     "contexts": command.get("contexts"), "integration_types": command.get("integration_types") or [0]}
            if scope is not None:
                entry["guild_id"] = str(scope)
            else:
                entry["dm_permission"] = command.get("dm_permission", True)
            registered.append(entry)
        self._commands[scope] = registered
        self._syncs.append(CommandSync(guild_id=scope, commands=copy.deepcopy(registered), at=self.clock()))
        return 200, copy.deepcopy(registered)

    def _list_messages(self, request: ApiRequest) -> tuple[int, Any]:
        channel = self._channel_of(request)
        limit = min(max(int(request.query.get("limit", 50)), 1), 100)
        visible = [message for message in self._messages.get(channel.id, []) if not message.deleted and not message.ephemeral]
        if "before" in request.query:
            visible = [message for message in visible if message.id < int(request.query["before"])]
        if "after" in request.query:
            visible = [message for message in visible if message.id > int(request.query["after"])][:limit]
        return 200, [self._message_json(message) for message in reversed(visible[-limit:])]

    def _get_message(self, request: ApiRequest) -> tuple[int, Any]:
        channel = self._channel_of(request)
        return 200, self._message_json(self._message(channel.id, _as_id(request.params["message_id"])))

    def _create_message(self, request: ApiRequest) -> tuple[int, Any]:
        channel = self._channel_of(request)
        payload = request.json if isinstance(request.json, dict) else {}
        self._check_new_message(payload, request.files)
        nonce = payload.get("nonce")
        if nonce is not None and payload.get("enforce_nonce"):
            seen = self._nonces.get((channel.id, str(nonce)))
            if seen is not None and self.clock() - seen[1] <= self.nonce_window:
                original = self._find(channel.id, seen[0])
                if original is not None:
                    return 200, self._message_json(original)
        message = self._new_bot_message(channel, payload, request.files)
        if nonce is not None:
            self._nonces[(channel.id, str(nonce))] = (message.id, self.clock())
        self._store(channel, message)
        return 200, self._message_json(message)

    def _edit_message(self, request: ApiRequest) -> tuple[int, Any]:
        channel = self._channel_of(request)
        message = self._message(channel.id, _as_id(request.params["message_id"]))
        if message.author.id != self.bot.id:
            raise DiscordError(403, 50005, "Cannot edit a message authored by another user")
        self._apply_edit(channel, message, request.json if isinstance(request.json, dict) else {}, request.files)
        return 200, self._message_json(message)

    def _delete_message(self, request: ApiRequest) -> tuple[int, Any]:
        channel = self._channel_of(request)
        message = self._message(channel.id, _as_id(request.params["message_id"]))
        self._delete(channel, message)
        return 204, None

    def _delete(self, channel: FakeChannel, message: DiscordMessage) -> None:
        message.deleted = True
        if not message.ephemeral:
            deleted = {"id": str(message.id), "channel_id": str(channel.id)}
            if channel.guild_id is not None:
                deleted["guild_id"] = str(channel.guild_id)
            private = channel.type == CHANNEL_DM
            self.gateway.dispatch("MESSAGE_DELETE", deleted,
                                  intent=INTENT_DIRECT_MESSAGES if private else INTENT_GUILD_MESSAGES)
        self.changed.notify_all()

    def _thread_name(self, payload: dict[str, Any]) -> str:
        name = str(payload.get("name") or "")
        if not THREAD_NAME_LENGTH[0] <= len(name) <= THREAD_NAME_LENGTH[1]:
            errors = FormErrors()
            errors.add(("name",), "BASE_TYPE_BAD_LENGTH", "Must be between 1 and 100 in length.")
            errors.raise_if_any()
        return name

    def _thread_from_message(self, request: ApiRequest) -> tuple[int, Any]:
        channel = self._channel_of(request)
        message = self._message(channel.id, _as_id(request.params["message_id"]))
        payload = request.json if isinstance(request.json, dict) else {}
        if channel.type not in (CHANNEL_TEXT, CHANNEL_ANNOUNCEMENT):
            raise DiscordError(400, 50024, "Cannot execute action on this channel type")
        name = self._thread_name(payload)
        if message.thread_id is not None:
            raise DiscordError(400, 160004, "A thread has already been created for this message")
        kind = CHANNEL_ANNOUNCEMENT_THREAD if channel.type == CHANNEL_ANNOUNCEMENT else CHANNEL_PUBLIC_THREAD
        thread = self._new_thread(channel, name, self.bot, message_id=message.id, type=kind,
                                  auto_archive_duration=int(payload.get("auto_archive_duration") or 1440))
        message.thread_id = thread.id
        return 201, thread.as_api()

    def _thread_without_message(self, request: ApiRequest) -> tuple[int, Any]:
        channel = self._channel_of(request)
        payload = request.json if isinstance(request.json, dict) else {}
        if channel.type not in (CHANNEL_TEXT, CHANNEL_ANNOUNCEMENT):
            raise DiscordError(400, 50024, "Cannot execute action on this channel type")
        name = self._thread_name(payload)
        kind = int(payload.get("type") or CHANNEL_PRIVATE_THREAD)
        if kind not in THREAD_TYPES:
            raise DiscordError(400, 50035, "Invalid Form Body", {"type": {"_errors": [
                {"code": "BASE_TYPE_CHOICES", "message": f"Value must be one of {sorted(THREAD_TYPES)}."}]}})
        thread = self._new_thread(channel, name, self.bot, type=kind,
                                  auto_archive_duration=int(payload.get("auto_archive_duration") or 1440))
        return 201, thread.as_api()

    def _typing(self, request: ApiRequest) -> tuple[int, Any]:
        self._channel_of(request)
        return 204, None

    def _put_reaction(self, request: ApiRequest) -> tuple[int, Any]:
        channel = self._channel_of(request)
        message = self._message(channel.id, _as_id(request.params["message_id"]))
        emoji = request.params["emoji"]
        if not emoji.strip():
            raise DiscordError(400, 10014, "Unknown Emoji")
        self._react(channel, message, self.bot, emoji)
        return 204, None

    def _delete_reaction(self, request: ApiRequest) -> tuple[int, Any]:
        channel = self._channel_of(request)
        message = self._message(channel.id, _as_id(request.params["message_id"]))
        users = message.reactions.get(request.params["emoji"], [])
        if self.bot.id in users:
            users.remove(self.bot.id)
            self.changed.notify_all()
        return 204, None

    def _interaction_by_token(self, request: ApiRequest) -> FakeInteraction:
        if _as_id(request.params["application_id"]) != self.application_id:
            raise DiscordError(404, 10015, "Unknown Webhook")
        token = request.params["interaction_token"]
        interaction = next((item for item in self._interactions.values() if item.token == token), None)
        if interaction is None:
            raise DiscordError(404, 10015, "Unknown Webhook")
        return interaction

    def _callback(self, request: ApiRequest) -> tuple[int, Any]:
        interaction = self._interactions.get(_as_id(request.params["interaction_id"]))
        if interaction is None or interaction.token != request.params["interaction_token"]:
            raise DiscordError(404, 10062, "Unknown interaction")
        if interaction.responses:
            raise DiscordError(400, 40060, "Interaction has already been acknowledged.")
        after = self.clock() - interaction.dispatched_at
        if after > self.interaction_timeout:
            raise DiscordError(404, 10062, "Unknown interaction")
        body = request.json if isinstance(request.json, dict) else {}
        kind, data = body.get("type"), body.get("data") or {}
        if kind not in CALLBACKS_ALLOWED[interaction.type]:
            raise DiscordError(400, 50035, "Invalid Form Body", {"type": {"_errors": [
                {"code": "INTERACTION_RESPONSE_TYPE_INVALID", "message": "Interaction response type is invalid"}]}})
        if kind in (CALLBACK_DEFERRED_UPDATE, CALLBACK_UPDATE_MESSAGE) and interaction.message_id is None:
            raise DiscordError(400, 50035, "Invalid Form Body", {"type": {"_errors": [
                {"code": "INTERACTION_RESPONSE_TYPE_INVALID", "message": "Interaction response type is invalid"}]}})
        if kind == CALLBACK_MODAL:
            modal_form_errors(data).raise_if_any()
            interaction.modal = copy.deepcopy(data)
        channel = self._channels[interaction.channel_id]
        flags = int(data.get("flags") or 0)
        message: DiscordMessage | None = None
        if kind == CALLBACK_MESSAGE:
            self._check_new_message(data, request.files)
            message = self._interaction_message(interaction, channel, data, request.files, flags & FLAG_EPHEMERAL)
        elif kind == CALLBACK_DEFERRED_MESSAGE:
            message = self._interaction_message(interaction, channel, {}, [], (flags & FLAG_EPHEMERAL) | FLAG_LOADING)
        elif kind in (CALLBACK_DEFERRED_UPDATE, CALLBACK_UPDATE_MESSAGE):
            message = self._message(channel.id, interaction.message_id or 0)
            interaction.original_message_id = message.id
            if kind == CALLBACK_UPDATE_MESSAGE:
                self._apply_edit(channel, message, data, request.files)
        interaction.responses.append(InteractionResponse(interaction.id, kind, copy.deepcopy(data),
                                                         self.clock(), after))
        self.changed.notify_all()
        if request.query.get("with_response", "").lower() not in ("1", "true"):
            return 204, None
        answer: dict[str, Any] = {"interaction": {
            "id": str(interaction.id), "type": interaction.type,
            "response_message_id": str(message.id) if message else None,
            "response_message_loading": kind == CALLBACK_DEFERRED_MESSAGE,
            "response_message_ephemeral": bool(message and message.ephemeral)}}
        if kind in (CALLBACK_MESSAGE, CALLBACK_DEFERRED_MESSAGE, CALLBACK_UPDATE_MESSAGE) and message is not None:
            answer["resource"] = {"type": kind, "message": self._message_json(message)}
        return 200, answer

    def _interaction_message(self, interaction: FakeInteraction, channel: FakeChannel, data: dict[str, Any],
                             files: list[UploadedFile], flags: int, *, followup: bool = False) -> DiscordMessage:
        message = self._new_bot_message(channel, data, files, flags=flags, webhook=True,
                                        kind=MESSAGE_DEFAULT if followup else MESSAGE_CHAT_INPUT_COMMAND)
        message.interaction_metadata = {"id": str(interaction.id), "type": interaction.type,
                                        "user": interaction.user.as_api(),
                                        "authorizing_integration_owners": {"0": str(interaction.guild_id or 0)}}
        if not followup:
            interaction.original_message_id = message.id
        self._store(channel, message)
        return message

    def _followup(self, request: ApiRequest) -> tuple[int, Any]:
        interaction = self._interaction_by_token(request)
        if not interaction.responses:
            raise DiscordError(404, 10015, "Unknown Webhook")
        channel = self._channels[interaction.channel_id]
        data = request.json if isinstance(request.json, dict) else {}
        self._check_new_message(data, request.files)
        original = self._find(channel.id, interaction.original_message_id or 0)
        if original is not None and original.flags & FLAG_LOADING:
            # The first followup after a deferral completes the "thinking" message, keeping the defer's ephemerality.
            self._apply_edit(channel, original, {key: value for key, value in data.items() if key != "flags"},
                             request.files)
            message = original
        else:
            message = self._interaction_message(interaction, channel, data, request.files,
                                                int(data.get("flags") or 0) & FLAG_EPHEMERAL, followup=True)
        interaction.followup_ids.append(message.id)
        self.changed.notify_all()
        if request.query.get("wait", "").lower() not in ("1", "true"):
            return 204, None
        return 200, self._message_json(message)

    def _webhook_message(self, request: ApiRequest) -> tuple[FakeInteraction, FakeChannel, DiscordMessage]:
        interaction = self._interaction_by_token(request)
        wanted = request.params["message_id"]
        message_id = interaction.original_message_id if wanted == "@original" else _as_id(wanted)
        if message_id is None or (message_id != interaction.original_message_id
                                  and message_id not in interaction.followup_ids):
            raise DiscordError(404, 10008, "Unknown Message")
        channel = self._channels[interaction.channel_id]
        return interaction, channel, self._message(channel.id, message_id)

    def _get_webhook_message(self, request: ApiRequest) -> tuple[int, Any]:
        return 200, self._message_json(self._webhook_message(request)[2])

    def _edit_webhook_message(self, request: ApiRequest) -> tuple[int, Any]:
        _, channel, message = self._webhook_message(request)
        self._apply_edit(channel, message, request.json if isinstance(request.json, dict) else {}, request.files)
        return 200, self._message_json(message)

    def _delete_webhook_message(self, request: ApiRequest) -> tuple[int, Any]:
        _, channel, message = self._webhook_message(request)
        self._delete(channel, message)
        return 204, None


def _is_attachment(value: Any) -> bool:
    """Whether a command option's value is an attachment object (as `add_attachment` returns)."""
    return isinstance(value, dict) and {"id", "filename", "url"} <= set(value)


def _as_id(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise DiscordError(400, 50035, "Invalid Form Body", {"id": {"_errors": [
            {"code": "NUMBER_TYPE_COERCE", "message": f"Value \"{value}\" is not snowflake."}]}}) from None


def _emoji_json(emoji: str) -> dict[str, Any]:
    name, _, emoji_id = emoji.partition(":")
    return {"id": emoji_id or None, "name": name}


def _without_guild_id(channel: dict[str, Any]) -> dict[str, Any]:
    # Channels inside GUILD_CREATE carry no guild_id, as on Discord.
    return {key: value for key, value in channel.items() if key != "guild_id"}


@contextlib.contextmanager
def discord_py_pointed_at(fake: FakeDiscord) -> Iterator[None]:
    """Point discord.py at `fake`: REST through `Route.BASE`, the gateway through `DiscordWebSocket.DEFAULT_GATEWAY`
    (a plain `discord.Client` never asks `/gateway/bot`); both restored afterwards."""
    import discord.gateway
    import discord.http
    import yarl

    saved = discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY
    discord.http.Route.BASE = fake.api_url
    discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(fake.gateway_url)
    try:
        yield
    finally:
        discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = saved


