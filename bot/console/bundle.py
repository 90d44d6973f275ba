"""The terminal platform bundle: always at hand; `deepthread chat` follows its runs' stored events itself."""

from __future__ import annotations

from bot.platform import PlatformBundle
from chat.message import Place
from config import Settings

NAME = "cli"
# The terminal is one channel with one person; each session or `deepthread research` is a thread in it.
TERMINAL = Place(platform=NAME, workspace="local", channel="terminal")
TERMINAL_USER = f"{NAME}:local"


def configured(settings: Settings) -> bool:
    return True


# No outbound part: the terminal redraws its runs from their stored events (and answers from their drafts in Redis).
BUNDLE = PlatformBundle(name=NAME, configured=configured)
