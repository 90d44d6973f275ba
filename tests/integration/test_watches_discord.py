"""Watches through Discord: "Watch this" under a research report opens a private form (how often, at what hour,
where), `/watches` lists, pauses, resumes and deletes, and sets the server's time zone. The real discord.py client and
the real conversation core in this process, a real worker delivering the report, the fake Discord on 127.0.0.1, real
Redis, and the fake LLM, search provider and web corpus."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bot.discord.watches import NEW_THREAD_LABEL, THIS_THREAD_LABEL
from storage.models import Run, Watch
from storage.vocabulary import WEEKDAYS, WatchLimits, WatchSchedule, zone_of
from storage.watches import WatchView, all_watches, create_watch, workspace_timezone
from tests.fakes.corpus import QUESTION, Corpus
from tests.fakes.discord_api import DiscordMessage, FakeDiscord, FakeUser
from tests.integration.discord_harness import BotThread, buttons_of, chosen, discord_urls_nowhere, menus_of
from tests.integration.workers import Cluster
from tests.run_rows import all_runs

pytestmark = pytest.mark.integration

FINISHED = {"done", "failed", "cancelled", "timed_out"}
HOW_OFTEN, AT_WHAT_HOUR = "How often", "At what hour"
WATCH_THIS = "Watch this"


def thread_of(run: Run) -> int:
    assert run.status_message is not None
    return int(run.status_message["thread"])


@dataclass
class WatchWorld:
    cluster: Cluster
    fake: FakeDiscord
    asker: FakeUser
    other: FakeUser
    admin: FakeUser
    bot: BotThread
    corpus: Corpus

    def wait(self, predicate: Any, what: str, timeout: float = 20) -> Any:
        return self.cluster.wait_for(predicate, timeout, what)

    def restart_bot(self) -> None:
        """Stop the bot and start a new one: nothing it held in memory survives."""
        self.bot.stop()
        self.bot = BotThread(self.cluster.settings).start()
        self.wait(self.bot.ready_or_failed, "the bot's READY")
        assert self.bot.error is None, self.bot.error

    def researched(self) -> tuple[Run, DiscordMessage]:
        """`/research` by the asker, run to its end by the worker: the run and the report's last message (the one with
        buttons)."""
        self.fake.send_command(self.asker, self.fake.channel_id, "research", {"question": QUESTION})
        run_id = self.wait(lambda: (runs := all_runs(self.cluster.sessions)) and runs[0].id, "the run")
        run = self.cluster.wait_for_state(run_id, FINISHED, 60)
        assert run.state == "done", run.error
        thread = thread_of(run)
        last = self.wait(lambda: [message for message in self.fake.messages(thread)
                                  if message.author.id == self.fake.bot.id and WATCH_THIS in buttons_of(message)],
                         "the report's buttons")[-1]
        return run, last

    def open_form(self, user: FakeUser, report: DiscordMessage) -> DiscordMessage:
        """`user` clicks Watch this under the report: the private form the bot answers with."""
        click = self.fake.click_button(user, report.channel_id, report.id, buttons_of(report)[WATCH_THIS])
        [form] = self.wait(lambda: [message for message in self.fake.followups(click) if message.components],
                           "the watch form")
        assert form.ephemeral
        return form

    def choose(self, user: FakeUser, form: DiscordMessage, menu: str, value: str) -> DiscordMessage:
        """`user` picks `value` in the form's `menu`; the form as the bot drew it again, with the choice shown."""
        self.fake.choose(user, form.channel_id, form.id, menus_of(form)[menu]["custom_id"], [value])
        return self.wait(lambda: (drawn := self.fake.message(form.channel_id, form.id))
                         and chosen(menus_of(drawn)[menu]) == [value] and drawn, f"{menu} = {value}")

    def confirm(self, user: FakeUser, form: DiscordMessage, label: str) -> DiscordMessage:
        """`user` presses one of the form's Watch buttons: the form, replaced by the core's answer."""
        self.fake.click_button(user, form.channel_id, form.id, buttons_of(form)[label])
        return self.wait(lambda: (answered := self.fake.message(form.channel_id, form.id))
                         and not answered.components and answered, "the form's answer")

    def watch(self, report: DiscordMessage) -> WatchView:
        """The asker watches the report's question as the form first offers it (weekly, 09:00, a thread a run)."""
        before = len(self.watches())
        self.confirm(self.asker, self.open_form(self.asker, report), NEW_THREAD_LABEL)
        return self.wait(lambda: len(watches := self.watches()) > before and watches[-1], "the watch")

    def watches(self) -> list[WatchView]:
        return all_watches(self.cluster.sessions)

    def command(self, user: FakeUser, **options: str) -> DiscordMessage:
        """`/watches` with `options` (action, value) in the channel: the private answer."""
        interaction = self.fake.send_command(user, self.fake.channel_id, "watches", options)
        [answer] = self.wait(lambda: self.fake.followups(interaction), "the answer to /watches")
        assert answer.ephemeral and not answer.mentions
        return answer

    def click(self, user: FakeUser, message: DiscordMessage, custom_id: str) -> DiscordMessage:
        """`user` clicks `custom_id` on `message`: the private answer."""
        click = self.fake.click_button(user, message.channel_id, message.id, custom_id)
        [answer] = self.wait(lambda: self.fake.followups(click), "the answer to the click")
        assert answer.ephemeral
        return answer


@pytest.fixture
def world(tmp_path: Path, redis_url: str) -> Iterator[WatchWorld]:
    from storage.redis import connect

    connect(redis_url).flushall()
    with discord_urls_nowhere(), Corpus() as corpus, FakeDiscord(message_content_intent_enabled=True) as fake:
        asker, other, admin = fake.new_user("asker"), fake.new_user("other"), fake.new_user("admin")
        for user in (asker, other, admin):
            fake.add_member(user)
        cluster = Cluster(database_url=f"sqlite:///{tmp_path}/deepthread.db", redis_url=redis_url, corpus=corpus,
                          workdir=tmp_path, discord_bot_token=fake.token, discord_api_url=fake.api_url,
                          discord_guild_ids=str(fake.guild_id), admin_user_ids=f"discord:{admin.id}")
        cluster.start_worker("w1")
        bot = BotThread(cluster.settings).start()
        world = WatchWorld(cluster, fake, asker, other, admin, bot, corpus)
        try:
            world.wait(bot.ready_or_failed, "the bot's READY")
            assert bot.error is None, bot.error
            yield world
        finally:
            world.bot.stop()
            cluster.stop()


def today_in(zone: str) -> set[dt.date]:
    """Today in `zone`, as a set: joined with a later look, a test running over midnight accepts either day."""
    return {dt.datetime.now(zone_of(zone)).date()}


def test_watch_this_makes_a_watch_in_the_server_s_time_zone_through_a_form_that_survives_a_restart(
        world: WatchWorld) -> None:
    fake = world.fake
    run, report = world.researched()
    assert list(buttons_of(report)) == ["Export Markdown", "👍", "👎", WATCH_THIS]
    thread = thread_of(run)
    assert [message.id for message in fake.messages(thread) if WATCH_THIS in buttons_of(message)] == [report.id], \
        "only the report's last message offers it"

    days = today_in("UTC")
    form = world.open_form(world.asker, report)
    days |= today_in("UTC")
    assert "UTC" in form.content
    menus = menus_of(form)
    assert chosen(menus[HOW_OFTEN]) == ["weekly"] and chosen(menus[AT_WHAT_HOUR]) == ["9"]
    assert len(menus[AT_WHAT_HOUR]["options"]) == 24
    weekly = next(option["label"] for option in menus[HOW_OFTEN]["options"] if option["value"] == "weekly")
    assert weekly in {f"Weekly on {WEEKDAYS[day.weekday()]}" for day in days}

    world.restart_bot()  # the form is its custom ids: nothing of it was kept in memory
    form = world.choose(world.asker, form, HOW_OFTEN, "monthly")
    form = world.choose(world.asker, form, AT_WHAT_HOUR, "21")
    assert chosen(menus_of(form)[HOW_OFTEN]) == ["monthly"], "a choice keeps the other"
    form = world.choose(world.asker, form, HOW_OFTEN, "weekly")
    form = world.choose(world.asker, form, AT_WHAT_HOUR, "9")
    answer = world.confirm(world.asker, form, NEW_THREAD_LABEL)
    assert answer.ephemeral and "Watching" in answer.content and "UTC" in answer.content

    [watch] = world.watches()
    assert (watch.schedule.cadence, watch.schedule.hour, watch.schedule.minute) == ("weekly", 9, 0)
    assert watch.schedule.timezone == "UTC" and f"Weekly on {WEEKDAYS[watch.schedule.weekday or 0]}" == weekly
    assert (watch.one_thread, watch.created_by, watch.channel) == (False, f"discord:{world.asker.id}",
                                                                   str(fake.channel_id))

    refused = world.command(world.admin, action="timezone", value="Mars/Olympus_Mons")
    assert "unknown time zone 'Mars/Olympus_Mons'" in refused.content
    assert workspace_timezone(world.cluster.sessions, platform="discord", workspace=str(fake.guild_id)) == "UTC"
    assert "Europe/Paris" in world.command(world.admin, action="timezone", value="Europe/Paris").content
    assert "deleted" in world.command(world.asker, action="delete", value=str(watch.id)).content
    assert world.watches() == []

    days = today_in("Europe/Paris")
    form = world.open_form(world.asker, report)
    days |= today_in("Europe/Paris")
    assert "Europe/Paris" in form.content
    form = world.choose(world.asker, form, HOW_OFTEN, "monthly")
    world.confirm(world.asker, form, THIS_THREAD_LABEL)
    [in_paris] = world.wait(world.watches, "the second watch")
    assert (in_paris.schedule.cadence, in_paris.schedule.timezone, in_paris.one_thread) == ("monthly", "Europe/Paris",
                                                                                           True)
    assert in_paris.schedule.day in {day.day for day in days}


def test_owners_and_admins_change_a_watch_from_its_listing_and_anyone_else_is_refused(world: WatchWorld) -> None:
    _, report = world.researched()
    watch = world.watch(report)
    number = f"#{watch.id}"

    listing = world.command(world.asker)
    assert number in listing.content and f"<@{world.asker.id}>" in listing.content and "Zorblax" in listing.content
    assert buttons_of(listing) == {f"Pause {number}": f"deepthread:watches:pause:{watch.id}",
                                   f"Delete {number}": f"deepthread:watches:delete:{watch.id}"}
    seen_by_other = world.command(world.other, action="list")
    assert number in seen_by_other.content and not seen_by_other.components

    refused = world.click(world.other, listing, buttons_of(listing)[f"Pause {number}"])
    assert "Only the person who made this watch, or an admin, can pause it" in refused.content
    assert world.watches()[0].state == "active"

    paused = world.click(world.asker, listing, buttons_of(listing)[f"Pause {number}"])
    assert f"Watch {number} paused" in paused.content and world.watches()[0].state == "paused"
    listing = world.command(world.asker)
    assert set(buttons_of(listing)) == {f"Resume {number}", f"Delete {number}"}
    world.click(world.asker, listing, buttons_of(listing)[f"Resume {number}"])
    assert world.watches()[0].state == "active"

    as_admin = world.command(world.admin)
    assert f"Pause {number}" in buttons_of(as_admin), "an admin may change anyone's watch"
    world.click(world.admin, as_admin, buttons_of(as_admin)[f"Pause {number}"])
    assert world.watches()[0].state == "paused"

    deleted = world.click(world.asker, listing, buttons_of(listing)[f"Delete {number}"])
    assert "deleted" in deleted.content and world.watches() == []


def test_the_watches_command_is_synced_with_its_actions_and_value(world: WatchWorld) -> None:
    [watches] = [command for command in world.fake.commands(world.fake.guild_id) if command["name"] == "watches"]
    options = {option["name"]: option for option in watches["options"]}
    assert [choice["value"] for choice in options["action"]["choices"]] == ["list", "pause", "resume", "delete",
                                                                           "timezone"]
    assert not options["action"].get("required") and not options["value"].get("required")


def test_a_deleted_channels_watches_stop_saying_why(world: WatchWorld) -> None:
    fake = world.fake
    doomed = fake.add_channel("doomed")  # added after READY: the bot learns of it from the guild's next fetch, if any
    with world.cluster.sessions.begin() as session:
        for channel in (doomed, fake.channel_id):
            session.add(Watch(platform="discord", workspace=str(fake.guild_id), channel=str(channel), thread="1",
                              created_by=f"discord:{world.asker.id}", question=f"In {channel}?",
                              schedule=WatchSchedule(cadence="daily", hour=9),
                              next_due_at=dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=1)))
    world.restart_bot()  # its guild cache now holds the new channel

    fake.delete_channel(doomed)

    def states() -> dict[str, tuple[str, str | None]]:
        return {watch.channel: (watch.state, watch.stopped_reason) for watch in all_watches(world.cluster.sessions)}
    world.wait(lambda: states()[str(doomed)][0] == "stopped", "the deleted channel's watch to stop")
    assert states() == {str(doomed): ("stopped", "its channel was deleted"), str(fake.channel_id): ("active", None)}


def test_a_server_the_app_is_removed_from_has_its_watches_stopped_saying_why(world: WatchWorld) -> None:
    fake = world.fake
    elsewhere = str(fake.guild_id + 1)
    with world.cluster.sessions.begin() as session:
        for workspace in (str(fake.guild_id), elsewhere):
            session.add(Watch(platform="discord", workspace=workspace, channel=str(fake.channel_id), thread="1",
                              created_by=f"discord:{world.asker.id}", question=f"In {workspace}?",
                              schedule=WatchSchedule(cadence="daily", hour=9),
                              next_due_at=dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=1)))

    fake.remove_bot()

    def states() -> dict[str, tuple[str, str | None]]:
        return {watch.workspace: (watch.state, watch.stopped_reason) for watch in all_watches(world.cluster.sessions)}
    world.wait(lambda: states()[str(fake.guild_id)][0] == "stopped", "the server's watch to stop")
    assert states() == {str(fake.guild_id): ("stopped", "the app was removed from the server"),
                        elsewhere: ("active", None)}


def test_a_watchs_run_posts_its_changes_in_a_thread_of_its_own_then_says_when_nothing_changed(
        world: WatchWorld) -> None:
    run, _ = world.researched()
    watch = create_watch(world.cluster.sessions, run_id=run.id, by=f"discord:{world.asker.id}",
                         schedule=WatchSchedule(cadence="weekly", hour=9, weekday=0), one_thread=False,
                         limits=WatchLimits(5, "daily"))
    changed = world.corpus.pages[1]
    world.corpus.change_figure(changed, changed.numbers[0], "9,999")
    threads_before = {thread.id for thread in world.fake.threads(world.fake.channel_id)}

    second = world.cluster.fire_watch(watch.id)
    world.wait(lambda: world.cluster.run(second).delivered_at is not None, "the watch's run delivered", timeout=90)
    stored = world.cluster.run(second)
    assert stored.state == "done", stored.error
    changes = [(change["kind"], change["after"]) for change in stored.report_json["watch"]["changes"]]
    assert changes == [("figure", "9,999")]
    [thread] = [thread for thread in world.fake.threads(world.fake.channel_id) if thread.id not in threads_before]
    assert thread.name.startswith("🔭 Watch:") and "1 change since" in thread.name
    posted = "\n".join(message.content for message in world.fake.messages(thread.id))
    assert "What changed since" in posted and "9,999" in posted

    third = world.cluster.fire_watch(watch.id)
    world.wait(lambda: world.cluster.run(third).delivered_at is not None, "the second watch run delivered", timeout=90)
    assert {thread.id for thread in world.fake.threads(world.fake.channel_id)} == threads_before | {thread.id}
    quiet = [message.content for message in world.fake.messages(thread.id) if "nothing changed" in message.content]
    assert len(quiet) == 1
