"""The platform bundle: everything the composition root needs to know of one chat platform.

Each platform package (`bot/slack`, `bot/discord`, `bot/console`) declares one bundle; `bot/cli.py`
lists them. The worker receives them as `chat.platform.OutboundPlatform` and never names a platform.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from chat.platform import Outbound
from config import Settings

if TYPE_CHECKING:  # the doctor pulls in the database and Redis clients, which a platform's adapter may not need
    import httpx

    from bot.doctor import Check


@dataclass(frozen=True)
class PlatformBundle:
    """One chat platform: its name, whether it is configured, how its messenger and renderer are built, how its
    adapter runs (`deepthread <adapter_command>`, what `deepthread up` starts), and what `doctor` checks."""

    name: str
    configured: Callable[[Settings], bool]
    build_outbound: Callable[[Settings], Outbound] | None = None
    adapter_command: str | None = None
    doctor: Callable[[Settings, httpx.Client], Check] | None = None
    missing_setting: str = ""

    def outbound(self, settings: Settings) -> Outbound | None:
        """The worker's messenger and renderer (None: nothing to deliver); raises LookupError when not configured."""
        if self.build_outbound is None:
            return None
        if not self.configured(settings):
            raise LookupError(f"{self.missing_setting or self.name} is not set")
        return self.build_outbound(settings)
