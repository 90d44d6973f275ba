"""Driving the real bolt app in-process: the app over a core and the fake Slack Web API, signed requests dispatched
straight into it, and waiting until the listeners it started in the background are done."""

from __future__ import annotations

import asyncio
from typing import Any

from slack_bolt.async_app import AsyncApp
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_bolt.response import BoltResponse

from bot.slack.app import build_slack_app
from bot.slack.dedupe import MemoryEventDeduper
from chat.slack.messenger import build_slack_client
from config import load_settings
from tests.fakes.slack_api import FakeSlack
from tests.fakes.slack_events import SlackEventSender, SlackRequest
from tests.waiting import HANG_GUARD_SECONDS

SECRET = "unit-signing-secret"


def make_app(slack: FakeSlack, core: Any) -> AsyncApp:
    """The bolt app as `deepthread slack` builds it, over `core`, talking to the fake `slack`."""
    settings = load_settings(slack_bot_token=slack.token, slack_signing_secret=SECRET, slack_api_url=slack.api_url)
    return build_slack_app(settings, core, client=build_slack_client(slack.token, slack.api_url), dedupe=MemoryEventDeduper())


async def dispatch(app: AsyncApp, sender: SlackEventSender, request: SlackRequest, **headers: Any) -> BoltResponse:
    """`request`, signed by `sender`, handed to the app as bolt's HTTP adapter would; the app's answer."""
    signed = {name.lower(): value for name, value in sender.headers(request, **headers).items()}
    return await app.async_dispatch(AsyncBoltRequest(body=request.body, headers=signed))


async def listeners_finished() -> None:
    """Wait until every listener bolt started in the background has returned, so one that should do nothing is done."""
    others = {task for task in asyncio.all_tasks() if task is not asyncio.current_task()}
    if others:
        _, pending = await asyncio.wait(others, timeout=HANG_GUARD_SECONDS)
        assert not pending, f"listeners still running: {pending}"
