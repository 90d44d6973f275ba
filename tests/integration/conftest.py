"""Integration fixtures: a real PostgreSQL and a real Redis on 127.0.0.1, started once per session."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from tests.services import ServiceUnavailable, create_database, postgres_server, redis_server, unavailable

_database_names = itertools.count(1)


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
