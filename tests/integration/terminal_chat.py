"""`deepthread chat` in a pseudo-terminal (pexpect), on a test cluster's settings, its screen logged to `chat.log`."""

from __future__ import annotations

import sys
from pathlib import Path

import pexpect

from tests.integration.workers import Cluster


# The screen's size, also in the environment: a test runner's worker (xdist) sets COLUMNS=80 and LINES=24, which
# rich would believe over the pseudo-terminal.
SCREEN = {"COLUMNS": "160", "LINES": "50"}


def spawn_chat(cluster: Cluster, tmp_path: Path) -> pexpect.spawn:
    """`deepthread chat` on the cluster's settings in a 160×50 pseudo-terminal, once it shows its prompt."""
    environment = {**cluster.environment, **SCREEN, "DATA_DIR": str(tmp_path / "data")}
    child = pexpect.spawn(sys.executable, ["-m", "bot.cli", "chat"], env=environment, cwd=str(tmp_path),
                          encoding="utf-8", codec_errors="replace", timeout=60,
                          dimensions=(50, 160))
    child.logfile_read = open(tmp_path / "chat.log", "w")
    child.expect("deepthread")
    child.expect_exact("/help")
    child.expect("› ")
    return child
