"""`deepthread chat` in a pseudo-terminal (pexpect), on a test cluster's settings, its screen logged to `chat.log`."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pexpect

from tests.fakes.corpus import Corpus
from tests.integration.workers import Cluster


# The screen's size, also in the environment: a test runner's worker (xdist) sets COLUMNS=80 and LINES=24, which
# rich would believe over the pseudo-terminal.
SCREEN = {"COLUMNS": "160", "LINES": "50"}


def spawn_chat(cluster: Cluster, tmp_path: Path, environment: dict[str, str] | None = None) -> pexpect.spawn:
    """`deepthread chat` on the cluster's settings (and `environment`'s, such as TZ) in a 160×50 pseudo-terminal, once
    it shows its prompt."""
    environment = {**cluster.environment, **SCREEN, "DATA_DIR": str(tmp_path / "data"), **(environment or {})}
    child = pexpect.spawn(sys.executable, ["-m", "bot.cli", "chat"], env=environment, cwd=str(tmp_path),
                          encoding="utf-8", codec_errors="replace", timeout=60,
                          dimensions=(50, 160))
    child.logfile_read = open(tmp_path / "chat.log", "w")
    child.expect("deepthread")
    child.expect_exact("/help")
    child.expect("› ")
    return child


@contextlib.contextmanager
def chat_with_a_worker(corpus: Corpus, tmp_path: Path, redis_url: str, *, chat_environment: dict[str, str] | None = None,
                       **cluster_options: Any) -> Iterator[tuple[Cluster, pexpect.spawn]]:
    """A worker on a fresh Redis and SQLite database in `tmp_path`, and `deepthread chat` beside it at its prompt
    (with `chat_environment` added to the cluster's); both stopped afterwards."""
    from storage.redis import connect

    connect(redis_url).flushall()
    cluster = Cluster(database_url=f"sqlite:///{tmp_path}/deepthread.db", redis_url=redis_url, corpus=corpus,
                      workdir=tmp_path, **cluster_options)
    cluster.start_worker("w1")
    child: pexpect.spawn | None = None
    try:
        child = spawn_chat(cluster, tmp_path, chat_environment)
        yield cluster, child
    finally:
        if child is not None and child.isalive():
            child.terminate(force=True)
        cluster.stop()
