"""What deepthread keeps on disk is this user's only: DATA_DIR and the SQLite database's directory are made 0700, the
database file (and its WAL) 0600, whatever the umask lets others read."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from storage.db import make_engine
from storage.redis import EmbeddedRedis

pytestmark = pytest.mark.integration


def mode(path: Path) -> str:
    return oct(stat.S_IMODE(path.stat().st_mode))


@pytest.fixture
def readable_umask() -> Iterator[None]:
    """The usual umask, which leaves new files readable by everyone."""
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def test_the_sqlite_database_and_its_directory_are_created_for_this_user_only(tmp_path: Path,
                                                                              readable_umask: None) -> None:
    database = tmp_path / "data" / "deepthread.db"
    engine = make_engine(f"sqlite:///{database}")
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE t (x INTEGER)"))
        connection.execute(text("INSERT INTO t VALUES (1)"))
        assert (mode(database.parent), mode(database)) == ("0o700", "0o600")
        assert mode(Path(f"{database}-wal")) == "0o600"
    engine.dispose()


def test_an_existing_database_directory_keeps_its_mode(tmp_path: Path, readable_umask: None) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    engine = make_engine(f"sqlite:///{shared}/deepthread.db")
    with engine.connect() as connection:
        connection.execute(text("SELECT 1"))
    engine.dispose()
    assert (mode(shared), mode(shared / "deepthread.db")) == ("0o755", "0o600")


def test_the_data_directory_of_the_embedded_redis_is_created_for_this_user_only(tmp_path: Path,
                                                                                 readable_umask: None) -> None:
    embedded = EmbeddedRedis(str(tmp_path / "data")).start()
    try:
        assert mode(tmp_path / "data") == "0o700"
    finally:
        embedded.stop()
