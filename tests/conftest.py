"""Fixtures every tier shares: an isolated environment and a fresh SQLite schema."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from storage.db import make_engine, make_session_factory
from storage.models import Base

SETTINGS_PREFIXES = ("DATABASE_", "REDIS_", "LLM_", "SEARCH_", "TAVILY_", "BRAVE_", "EXA_", "SEARXNG_", "FETCH_",
                     "RESEARCH_", "CHAT_", "WORKER_", "MAX_RUNS_", "ADMIN_", "SLACK_", "DISCORD_", "CANCEL_", "LOG_", "DATA_DIR")


def pytest_configure(config: pytest.Config) -> None:
    """Under xdist, say which tests are still running when none has finished for a minute (tests/quiet_notice.py)."""
    from tests.quiet_notice import register

    register(config)


@pytest.fixture(autouse=True)
def isolated_environment(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """No test reads the developer's settings or `.env`."""
    import os

    from config import Settings

    every_setting = {name.upper() for name in Settings.model_fields}
    for name in list(os.environ):
        if name.startswith(SETTINGS_PREFIXES) or name in every_setting:
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))


@pytest.fixture(autouse=True)
def new_process_knowledge() -> Iterator[None]:
    """Each test starts as a new process would: no endpoint quirks learnt by an earlier test."""
    from research.llm import forget_learnt_quirks

    forget_learnt_quirks()
    yield
    forget_learnt_quirks()


@pytest.fixture
def sqlite_engine() -> Iterator[Engine]:
    engine = make_engine("sqlite://")
    Base.metadata.create_all(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def session_factory(sqlite_engine: Engine) -> sessionmaker[Session]:
    return make_session_factory(sqlite_engine)


@pytest.fixture
def file_sessions(tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    """Sessions on a SQLite file: for tests whose threads each use a connection of their own (the in-memory database
    is one connection that every thread would share)."""
    engine = make_engine(f"sqlite:///{tmp_path}/deepthread.db")
    Base.metadata.create_all(engine)
    yield make_session_factory(engine)
    engine.dispose()
