"""A run's delivery on Discord: the real RunDelivery and REST messenger against the fake Discord reached in process,
with Discord's per-channel rate limit on a fake clock, so a long report is posted at Discord's pace."""

from __future__ import annotations

import asyncio

from sqlalchemy.orm import Session, sessionmaker

from chat.discord.messenger import DiscordMessenger
from chat.discord.render import CANCEL_ID, DiscordRenderer
from chat.message import Content, Place
from chat.state import initial_progress
from research.report import Report
from storage.models import Conversation, Run
from tests.fakes.clock import FakeClock
from tests.fakes.discord_api import DiscordCall, FakeDiscord
from worker.delivery import DeliveryOutcome, DeliveryTarget, RunDelivery
from worker.progress import InMemoryEditBucket

REQUESTER = "discord:123456789012345678"
# Discord lets a bot post five messages in a channel every five seconds.
DISCORD_MESSAGE_RATE = (5, 5.0)
PARTS = 40


def forty_part_report() -> Report:
    paragraphs = [f"Paragraph {index} of the long report. " + "The array is steady. " * 80 for index in range(PARTS)]
    return Report(title="A long report", question="Why is the array steady?", body_markdown="\n\n".join(paragraphs))


def stored_discord_run(sessions: sessionmaker[Session], status: dict[str, str]) -> int:
    with sessions.begin() as session:
        conversation = Conversation(platform="discord", workspace=status["workspace"], channel=status["channel"],
                                    thread=status["thread"], created_by=REQUESTER)
        run = Run(conversation=conversation, workspace=status["workspace"], mode="research", question="q",
                  requested_by=REQUESTER, state="done", attempt=1, status_message=status,
                  report_json=forty_part_report().model_dump(mode="json"))
        session.add(run)
        session.flush()
        return run.id


def status_edits(calls: list[DiscordCall], status_path: str) -> list[tuple[int, DiscordCall]]:
    return [(index, call) for index, call in enumerate(calls) if call.method == "PATCH" and call.path == status_path]


def has_stop_button(call: DiscordCall) -> bool:
    return any(button.get("custom_id") == CANCEL_ID for row in call.json.get("components") or []
               for button in row["components"])


def test_the_status_reads_done_only_after_the_last_part_of_a_40_part_report_is_posted(session_factory) -> None:
    clock = FakeClock()
    discord = FakeDiscord(clock=clock, rate_limit=DISCORD_MESSAGE_RATE)
    renderer = DiscordRenderer(max_messages=PARTS)
    assert len(renderer.report(forty_part_report(), requester=REQUESTER, run_id=1).messages) == PARTS

    async def deliver() -> tuple[str, str, DeliveryOutcome]:
        async with discord.client() as http:
            messenger = DiscordMessenger(http, sleep=clock.sleep, clock=clock)
            opened = await messenger.open_thread(
                Place(platform="discord", workspace=str(discord.guild_id), channel=str(discord.channel_id)),
                title=Content(text="Why is the array steady?"), status=Content(text="Queued"))
            run_id = stored_discord_run(session_factory, opened.status.model_dump(mode="json"))
            delivery = RunDelivery(session_factory, DeliveryTarget.load(session_factory, run_id), messenger=messenger,
                                   renderer=renderer, bucket=InMemoryEditBucket(), min_interval=0.0)
            running = initial_progress(run_id=run_id, mode="research", question="q", requested_by=REQUESTER,
                                       attempt=1, state="running")
            done = running.model_copy(update={"state": "done", "percent": 100.0})
            # What the runner does: every state as the engine reports it (the last one "done"), then `finish`.
            await delivery.on_state(running)
            await delivery.on_state(done)
            outcome = await delivery.finish(done)
            return opened.thread, opened.status.message_id, outcome

    thread, status_id, outcome = asyncio.run(deliver())

    assert outcome == DeliveryOutcome.DELIVERED
    calls = discord.calls()
    parts = [index for index, call in enumerate(calls)
             if call.method == "POST" and call.path == f"/channels/{thread}/messages" and call.status == 200]
    assert len(parts) == PARTS
    assert any(call.answer_headers.get("X-RateLimit-Remaining") == "0" for call in calls), "posted at Discord's pace"
    edits = status_edits(calls, f"/channels/{discord.channel_id}/messages/{status_id}")
    done = [index for index, call in edits if "✅ **Done**" in call.json["content"]]
    assert done and done[0] > parts[-1], "the status reads done only once the report's last part is in the thread"
    assert all(has_stop_button(call) for index, call in edits if index < parts[-1]), "Stop stays until then"
    assert not has_stop_button(edits[-1][1])
