"""`/history` and in-thread exports through Discord: the real discord.py client (gateway and REST) and the real
conversation core on their own event loop, against the fake Discord on 127.0.0.1, with a private channel (hidden from
@everyone by its permission overwrites). Runs are finished in the database as a worker would finish them."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from bot.conversation.core import ConversationCore, build_core
from bot.discord.bundle import BUNDLE as DISCORD
from config import Settings, load_settings
from storage.models import Run
from tests.fakes.discord_api import DiscordMessage, FakeDiscord, FakeUser
from tests.integration.discord_harness import BotThread, discord_urls_nowhere
from tests.run_rows import all_runs, finish_run, migrated_sqlite, one_source_report, queue_without_workers
from tests.waiting import HANG_GUARD_SECONDS, wait_for

pytestmark = pytest.mark.integration


def recording_core(sessions: sessionmaker[Session]) -> Callable[[Settings], ConversationCore]:
    """The real core over the test's database; submitted runs are only recorded (no worker)."""
    def build(settings: Settings) -> ConversationCore:
        outbound = DISCORD.outbound(settings)
        assert outbound is not None
        return build_core(settings, outbound.messenger, outbound.renderer, sessions=sessions,
                          queue=queue_without_workers(sessions))
    return build


@dataclass
class DiscordHistoryWorld:
    fake: FakeDiscord
    sessions: sessionmaker[Session]
    asker: FakeUser
    other: FakeUser
    general: int
    secret: int

    def runs(self) -> list[Run]:
        return all_runs(self.sessions)

    def research(self, question: str, *, channel: int, user: FakeUser | None = None) -> Run:
        """`/research question`, then the run finished with a report, as a worker would."""
        before = len(self.runs())
        self.fake.send_command(user or self.asker, channel, "research", {"question": question})
        run = wait_for(lambda: len(runs := self.runs()) > before and runs[-1].status_message and runs[-1], "run")
        finish_run(self.sessions, run.id, report=one_source_report(question))
        return run

    def history(self, *, channel: int, user: FakeUser | None = None) -> DiscordMessage:
        """`/history` and the ephemeral follow-up it is answered with."""
        interaction = self.fake.send_command(user or self.asker, channel, "history")
        [answer] = self.fake.wait_for(lambda: self.fake.followups(interaction), HANG_GUARD_SECONDS)
        return answer


@pytest.fixture
def world(tmp_path: Path) -> Iterator[DiscordHistoryWorld]:
    with (migrated_sqlite(tmp_path) as (database_url, sessions), discord_urls_nowhere(),
          FakeDiscord(message_content_intent_enabled=True) as fake):
        asker, other = fake.new_user("asker"), fake.new_user("other")
        for user in (asker, other):
            fake.add_member(user)
        general = fake.add_channel("general")
        secret = fake.add_channel("launch-team", private_to=[asker])
        settings = load_settings(database_url=database_url, discord_bot_token=fake.token, discord_api_url=fake.api_url,
                                 discord_guild_ids=str(fake.guild_id))
        bot = BotThread(settings, build_core=recording_core(sessions)).start()
        try:
            wait_for(bot.ready_or_failed, "READY")
            assert bot.error is None, bot.error
            yield DiscordHistoryWorld(fake, sessions, asker, other, general, secret)
        finally:
            bot.stop()


def test_history_is_ephemeral_with_jump_links_and_never_shows_a_private_channels_run_elsewhere(
        world: DiscordHistoryWorld) -> None:
    fake = world.fake
    public = world.research("How do tides work?", channel=fake.channel_id)
    world.research("What is our secret launch date?", channel=world.secret)
    world.research("Why is the sea salty?", channel=fake.channel_id, user=world.other)

    elsewhere = world.history(channel=world.general)
    assert elsewhere.ephemeral
    jump = f"https://discord.com/channels/{fake.guild_id}/{public.status_message['thread']}"
    assert f"[How do tides work?]({jump})" in elsewhere.content and "done" in elsewhere.content
    assert "secret launch" not in elsewhere.content, "a private channel's run is listed only there"
    assert "salty" not in elsewhere.content, "another person's run in another channel is not listed"

    in_public = world.history(channel=fake.channel_id)
    assert "How do tides work?" in in_public.content and "Why is the sea salty?" in in_public.content
    assert "secret launch" not in in_public.content

    inside = world.history(channel=world.secret)
    assert "What is our secret launch date?" in inside.content and "How do tides work?" in inside.content
    assert not inside.mentions and len(world.runs()) == 3, "history starts nothing and pings nobody"


def test_a_direct_messages_runs_are_listed_only_in_that_direct_message(world: DiscordHistoryWorld) -> None:
    dm = world.fake.create_dm(world.asker)
    world.research("A question asked in private", channel=dm)
    assert "asked in private" not in world.history(channel=world.general).content
    assert "asked in private" in world.history(channel=dm).content


def test_export_in_a_reports_thread_attaches_html_json_and_markdown_files(world: DiscordHistoryWorld) -> None:
    fake = world.fake
    run = world.research("How do tides work?", channel=fake.channel_id)
    thread = int(run.status_message["thread"])

    def attachments() -> dict[str, Any]:
        return {attachment.filename: attachment for message in fake.messages(thread)
                if message.author.id == fake.bot.id for attachment in message.attachments}

    for output_format in ("html", "json", "md"):
        fake.user_message(world.asker, thread, f"export {output_format}")
        fake.wait_for(lambda: f"deepthread-report-{run.id}.{output_format}" in attachments(), HANG_GUARD_SECONDS)
    files = attachments()
    assert set(files) == {f"deepthread-report-{run.id}.{suffix}" for suffix in ("html", "json", "md")}
    assert files[f"deepthread-report-{run.id}.html"].data.decode().startswith("<!DOCTYPE html>")
    assert json.loads(files[f"deepthread-report-{run.id}.json"].data)["run_id"] == run.id
    assert "What we found about How do tides work?" in files[f"deepthread-report-{run.id}.md"].data.decode()
