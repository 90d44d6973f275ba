"""The conversation core's watch desk: "Watch this" under a report, and `/watches` — list a channel's watches, pause,
resume or delete one (its owner or an admin), and, where the platform does not tell each person's time zone, set
the workspace's (`/watches timezone Europe/Paris`).

Every reply is private to the person who asked. The SQL is storage.watches'; firing is the worker's (worker.watches).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Collection

from bot.conversation.events import ChatEvent, Outcome, Reply
from chat.render import PlatformRenderer
from chat.watches import WatchListing, WatchSummary
from storage.db import Sessions
from storage.vocabulary import WatchLimits, zone_of
from storage.watches import (
    WatchAction,
    WatchRefused,
    WatchView,
    achange_watch,
    acreate_watch,
    aset_workspace_timezone,
    awatches_in,
    aworkspace_timezone,
    may_change,
)

WATCH_ACTIONS: dict[str, WatchAction] = {"watch_pause": "pause", "watch_resume": "resume", "watch_delete": "delete"}
DONE_WORDS: dict[WatchAction, str] = {"pause": "paused", "resume": "resumed", "delete": "deleted"}

USAGE = ("`/watches` lists this channel's watches. `/watches pause N`, `/watches resume N` and `/watches delete N` "
         "change watch N (its owner or an admin). `/watches timezone Europe/Paris` sets this workspace's time zone for "
         "new watches. To make a watch, press **Watch this** under a finished report.")


def handles(event: ChatEvent) -> bool:
    """Whether `event` is the watch desk's: `/watches`, "Watch this", or a watch's button."""
    return event.command == "watches" or (event.kind == "action" and event.action is not None
                                          and (event.action == "watch" or event.action in WATCH_ACTIONS))


class WatchDesk:
    """Carries out what people ask of watches, and says how it went."""

    def __init__(self, sessions: Sessions, renderer: PlatformRenderer, *, admins: Collection[str],
                 limits: WatchLimits, clock: Callable[[], dt.datetime] | None = None) -> None:
        self.sessions = sessions
        self.renderer = renderer
        self.admins = frozenset(admins)
        self.limits = limits
        self.clock = clock  # None: the database's clock

    async def handle(self, event: ChatEvent) -> Outcome:
        try:
            if event.action == "watch":
                return await self._watch(event)
            if event.action in WATCH_ACTIONS:
                return await self._change(event, WATCH_ACTIONS[event.action], event.watch_id)
            return await self._command(event)
        except WatchRefused as refused:
            return _private(str(refused))

    async def _command(self, event: ChatEvent) -> Outcome:
        words = event.text.split()
        if not words or words[0].lower() == "list":
            return await self.listing(event)
        verb = words[0].lower()
        if verb in ("timezone", "tz"):
            return await self._timezone(event, words[1:])
        action = WATCH_ACTIONS.get(f"watch_{verb}")
        if action is not None and len(words) == 2 and words[1].lstrip("#").isdigit():
            return await self._change(event, action, int(words[1].lstrip("#")))
        return _private(USAGE)

    async def _watch(self, event: ChatEvent) -> Outcome:
        if event.action_run_id is None or event.watch_schedule is None:
            return _private("Choose how often the watch runs (daily, weekly or monthly) and at what hour.")
        timezone = event.timezone or await aworkspace_timezone(self.sessions, platform=event.platform,
                                                               workspace=event.workspace)
        try:
            zone_of(timezone)
        except ValueError:
            timezone = "UTC"  # a platform's odd zone name: UTC, and the reply says so
        schedule = event.watch_schedule.model_copy(update={"timezone": timezone})
        watch = await acreate_watch(self.sessions, run_id=event.action_run_id, by=event.user, schedule=schedule,
                                    one_thread=event.watch_one_thread, limits=self.limits,
                                    now=self.clock() if self.clock else None,
                                    where=(event.platform, event.workspace, event.channel))
        summary = self._summary(watch, event.user)
        where = " in this thread" if watch.one_thread else ""
        return _private(f"🔭 Watching “{watch.question}” {schedule.describe()}, {summary.next_run_words()}. Each "
                        f"run{where} opens with what changed since the last; when nothing did, it says so in one "
                        f"line. `/watches` pauses, resumes or deletes it.")

    async def _change(self, event: ChatEvent, action: WatchAction, watch_id: int | None) -> Outcome:
        if watch_id is None:
            return _private(USAGE)
        watch = await achange_watch(self.sessions, watch_id, action, by=event.user, admins=self.admins,
                                    limits=self.limits, now=self.clock() if self.clock else None,
                                    where=(event.platform, event.workspace))
        if watch is None:
            return _private(f"Watch #{watch_id} is deleted; its past reports stay in their threads.")
        summary = self._summary(watch, event.user)
        next_run = f", {summary.next_run_words()}" if summary.next_run_words() else ""
        return _private(f"Watch #{watch_id} {DONE_WORDS[action]}: {summary.when}{next_run}.")

    async def _timezone(self, event: ChatEvent, words: list[str]) -> Outcome:
        if not words:
            current = await aworkspace_timezone(self.sessions, platform=event.platform, workspace=event.workspace)
            return _private(f"New watches here use the time zone {current}. Set it with `/watches timezone "
                            "Europe/Paris` (an IANA name).")
        if self.admins and event.user not in self.admins:
            return _private("Only an admin can set this workspace's time zone.")
        try:
            zone_of(words[0])
        except ValueError as error:
            return _private(f"{error}.")
        await aset_workspace_timezone(self.sessions, platform=event.platform, workspace=event.workspace,
                                      timezone=words[0], by=event.user, now=self.clock() if self.clock else None)
        return _private(f"New watches here now run on {words[0]} time. Existing watches keep theirs.")

    async def listing(self, event: ChatEvent) -> Outcome:
        """The channel's watches, each with the buttons the person may use."""
        watches = await awatches_in(self.sessions, platform=event.platform, workspace=event.workspace,
                                    channel=event.channel)
        listing = WatchListing(watches=[self._summary(watch, event.user) for watch in watches])
        content = self.renderer.watches(listing)
        return Outcome(replies=[Reply(text=content.text, private=True, content=content)])

    def _summary(self, watch: WatchView, viewer: str) -> WatchSummary:
        return WatchSummary(watch_id=watch.id, question=watch.question, schedule=watch.schedule, state=watch.state,
                            stopped_reason=watch.stopped_reason, next_due_at=watch.next_due_at,
                            created_by=watch.created_by, one_thread=watch.one_thread,
                            may_change=may_change(watch, viewer, self.admins))


def _private(text: str) -> Outcome:
    return Outcome(replies=[Reply(text=text, private=True)])
