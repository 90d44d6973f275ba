"""Run in a CPU pool's process: what it has imported (this module itself imports nothing more than `sys`)."""

from __future__ import annotations

import sys


def has_imported(module: str) -> bool:
    return module in sys.modules
