"""What the worker knows of a chat platform: its name, and how to speak on it (built by the composition root)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from chat.message import Messenger
from chat.render import PlatformRenderer
from research.files import FileDownloader

if TYPE_CHECKING:
    from config import Settings


@dataclass(frozen=True)
class Outbound:
    """A platform's messenger and renderer, built from Settings, and its way to the files shared on it (None: it
    has none)."""

    messenger: Messenger
    renderer: PlatformRenderer
    files: FileDownloader | None = None


class OutboundPlatform(Protocol):
    """A platform as the worker sees it (bot.platform.PlatformBundle in production)."""

    @property
    def name(self) -> str:
        """The platform's name in stored conversations and places."""
        ...

    def outbound(self, settings: Settings) -> Outbound | None:
        """The messenger and renderer the worker delivers with; None when the platform shows runs itself (the
        terminal follows stored events and answer drafts, storage.answer_drafts); raises LookupError naming the
        missing setting when it is not configured."""
        ...
