"""Unit fixtures: the search providers' wire fake, in process, and a client that reaches it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from tests.fakes.search_api import FakeSearchAPI


@pytest.fixture
def api() -> FakeSearchAPI:
    return FakeSearchAPI()


@pytest.fixture
async def http(api: FakeSearchAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with api.client() as client:
        yield client
