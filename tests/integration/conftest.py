"""Integration fixtures: a real PostgreSQL and a real Redis on 127.0.0.1, started once per session; a Redis that a test
can stop; migrated databases on both engines; the fake Slack Web API; the Slack `world` (the app, a worker and the
fakes)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from storage.db import make_engine, make_session_factory
from storage.migrate import upgrade
from tests.fakes.slack_api import FakeSlack
from tests.integration.restartable_redis import RestartableRedis
from tests.services import ServiceUnavailable, create_database, postgres_server, redis_server, unavailable

if TYPE_CHECKING:
    from tests.integration.slack_harness import SlackWorld

_database_names = itertools.count(1)
# The `world` fixture's fakes unless a test says otherwise: a little slow, as the outside world is.
QUICK_FAKES: dict[str, Any] = {"llm_latency": 0.3, "page_latency": 0.3}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "world(corpus=None, **settings): the Corpus arguments and the settings of the "
                                       "`world` fixture, for a module (pytestmark) or one test")


@pytest.fixture(scope="session")
def postgres_server_url() -> Iterator[str]:
    try:
        with postgres_server() as url:
            yield url
    except ServiceUnavailable as error:
        unavailable(str(error))


@pytest.fixture
def postgres_url(postgres_server_url: str) -> str:
    """A fresh, empty database on the session's PostgreSQL server."""
    return create_database(postgres_server_url, f"deepthread_test_{next(_database_names)}")


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    try:
        with redis_server() as url:
            yield url
    except ServiceUnavailable as error:
        unavailable(str(error))


@pytest.fixture
def outage_redis() -> Iterator[RestartableRedis]:
    server = RestartableRedis()
    try:
        server.start()
    except ServiceUnavailable as error:
        unavailable(str(error))
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def sessions(request: pytest.FixtureRequest, tmp_path) -> Iterator[sessionmaker[Session]]:
    """Sessions on a freshly migrated database: once on SQLite, once on the session's PostgreSQL."""
    url = f"sqlite:///{tmp_path}/deepthread.db" if request.param == "sqlite" else request.getfixturevalue("postgres_url")
    engine = make_engine(url)
    upgrade(url, engine=engine)
    yield make_session_factory(engine)
    engine.dispose()


@pytest.fixture
def slack() -> Iterator[FakeSlack]:
    with FakeSlack() as fake:
        yield fake


@pytest.fixture
def world(request: pytest.FixtureRequest, tmp_path: Path, redis_url: str) -> Iterator[SlackWorld]:
    """The Slack app, a worker and the fakes (tests/integration/slack_harness.py), the fakes a little slow; a
    `pytest.mark.world(corpus={...}, **settings)` on the module or the test gives other Corpus arguments or settings."""
    from tests.fakes.corpus import Corpus
    from tests.integration.slack_harness import slack_world

    marker = request.node.get_closest_marker("world")
    settings = dict(marker.kwargs) if marker is not None else {}
    with Corpus(**settings.pop("corpus", QUICK_FAKES)) as corpus:
        yield from slack_world(tmp_path, redis_url, corpus, **settings)
