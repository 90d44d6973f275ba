"""`deepthread up` with the command given in place of `deepthread worker`: `python -m tests.integration.up_with_worker
PROGRAM ARGUMENT…`, for tests of how `up` stops a worker that behaves as told."""

from __future__ import annotations

import sys

from bot.cli import _up

if __name__ == "__main__":
    _up(worker_argv=sys.argv[1:])
