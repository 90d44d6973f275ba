"""What a platform renderer turns into messages: a run's status, and its finished report."""

from __future__ import annotations

import datetime as dt
from typing import Protocol

from pydantic import BaseModel, Field

from bot.messenger.base import Content, FileUpload
from bot.render.state import RunProgress
from research.report import Report


class ReportDelivery(BaseModel):
    """The messages (and maybe a file) that carry one report into a thread, in posting order."""

    messages: list[Content] = Field(default_factory=list)
    file: FileUpload | None = None


class PlatformRenderer(Protocol):
    """Renders within one platform's limits; untrusted text can never ping anyone."""

    platform: str

    def status(self, progress: RunProgress, *, now: dt.datetime) -> Content: ...

    def report(self, report: Report, *, requester: str, run_id: int | None = None) -> ReportDelivery: ...

    def notice(self, text: str) -> Content: ...
