"""A real redis-server that a test can stop and start again on the same loopback port, coming back empty as after a crash."""

from __future__ import annotations

import shutil
import subprocess
import tempfile

from tests.fakes.server import free_port
from tests.services import redis_server_binary, wait_until_answering


class RestartableRedis:
    """A redis-server on one loopback port that a test can stop and start again; it comes back empty."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._workdir = tempfile.mkdtemp(prefix="deepthread-redis-outage-")
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self._process = subprocess.Popen(
            [redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self._workdir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until_answering(self.url, self._process)

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait(timeout=10)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self._workdir, ignore_errors=True)
