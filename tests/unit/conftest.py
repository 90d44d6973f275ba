"""Unit fixtures: the search providers' wire fake, in process, and a client that reaches it; the conversation core's
world without a chat platform; a worker's two event loops."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

import httpx
import pytest
from sqlalchemy.orm import Session, sessionmaker

from tests.fakes.search_api import FakeSearchAPI

if TYPE_CHECKING:
    from tests.unit.conversation_world import World
    from worker.attempt import WorkerLoops


@pytest.fixture
def api() -> FakeSearchAPI:
    return FakeSearchAPI()


@pytest.fixture
async def http(api: FakeSearchAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with api.client() as client:
        yield client


@pytest.fixture
def world(session_factory: sessionmaker[Session]) -> World:
    """The conversation core over the test's SQLite, with a recording messenger (tests/unit/conversation_world.py)."""
    from tests.unit.conversation_world import World

    return World(session_factory)


@pytest.fixture
def worker_loops() -> Iterator[WorkerLoops]:
    """A worker's runs loop and delivery loop (worker.attempt.WorkerLoops), stopped after the test."""
    from worker.attempt import WorkerLoops
    from worker.loop import RunLoop

    both = WorkerLoops(runs=RunLoop(blocking_threads=4, name="test-runs"),
                       delivery=RunLoop(blocking_threads=4, name="test-delivery"))
    yield both
    both.runs.stop()
    both.delivery.stop()
