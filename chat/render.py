"""What a platform renderer turns into messages: a run's status, its finished report, and the core's replies."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Protocol

from pydantic import BaseModel, Field

from chat.history import RunHistory
from chat.message import Content, FileUpload
from chat.state import RunProgress
from chat.watches import WatchListing
from research.report import Report

# Where a reply names the person it is about (`Reply.person`); each renderer writes its platform's mention there.
PERSON = "{person}"
_MARK = "\ue000"


class ReportDelivery(BaseModel):
    """The messages (and maybe a file) that carry one report into a thread, in posting order."""

    messages: list[Content] = Field(default_factory=list)
    file: FileUpload | None = None


class PlatformRenderer(Protocol):
    """Renders within one platform's limits; untrusted text can never ping anyone."""

    platform: str

    def status(self, progress: RunProgress, *, now: dt.datetime) -> Content: ...

    def report(self, report: Report, *, requester: str, run_id: int | None = None) -> ReportDelivery: ...

    def notice(self, text: str) -> Content:
        """Untrusted plain text as a message (nothing in it is read as markup)."""
        ...

    def reply(self, text: str, *, person: str | None = None) -> Content:
        """A reply the conversation core wrote in neutral markup (`**bold**`, `` `code` ``, `•` lists), with
        `person` (a platform-qualified user id) mentioned where the text says `{person}`."""
        ...

    def history(self, history: RunHistory) -> Content:
        """A person's run history (question, state, date, a link to each run's thread where the platform has one)."""
        ...

    def watches(self, listing: WatchListing) -> Content:
        """A channel's watches (question, schedule, next run, owner), with pause, resume and delete buttons on those
        the person may change, where the platform has buttons."""
        ...


def with_person(text: str, person: str | None, convert: Callable[[str], str], mention: Callable[[str], str]) -> str:
    """`text` converted to a platform's markup, `PERSON` replaced by `mention(person)`; without a person the
    text is converted whole, so a `{person}` typed by someone stays text."""
    if person is None:
        return convert(text)
    # A private-use character stands in for the mention while the text is converted as a whole.
    marked = text.replace(_MARK, "").replace(PERSON, _MARK)
    return convert(marked).replace(_MARK, mention(person))
