"""The web as an in-process httpx transport: fixed responses by host and path, and every host that was asked for."""

from __future__ import annotations

import httpx


class RecordingSite(httpx.AsyncBaseTransport):
    """Stands in for the network: records each request's Host header and answers from `pages` (path to response)."""

    def __init__(self, pages: dict[str, httpx.Response]) -> None:
        self.pages = pages
        self.hosts: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.hosts.append(request.headers["host"])
        return self.pages.get(f"{request.headers['host']}{request.url.path}", httpx.Response(404))
