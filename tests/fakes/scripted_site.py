"""One web host behind `httpx.MockTransport`: robots.txt, pages answered at once, scripted or held until released.

Every request is logged with the time of the injected clock, and the pages in flight are counted, so a test
can see at the wire when and how many requests a fetcher sent.
"""

from __future__ import annotations

import asyncio

import httpx

ARTICLE = "<html><head><title>Tides</title></head><body><p>The spring tide reached 6.8 metres.</p></body></html>"


class ScriptedSite:
    """Answers every path with an article unless scripted (`answers`) or held (`hold`) until `release`."""

    def __init__(self, clock: object, robots: str | None = None) -> None:
        self.clock = clock
        self.robots = robots
        self.pages: list[tuple[str, float]] = []
        self.answers: dict[str, list[httpx.Response]] = {}
        self.in_flight = 0
        self.most_in_flight = 0
        self._held: dict[str, asyncio.Event] = {}
        self._arrived: asyncio.Event | None = None

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def hold(self, path: str) -> None:
        """Answer `path` only once `release(path)` is called."""
        self._held[path] = asyncio.Event()

    def release(self, path: str) -> None:
        self._held[path].set()

    def page_times(self) -> list[float]:
        """The clock's time at each page request (robots.txt left out), in order."""
        return [at for _path, at in self.pages]

    def page_paths(self) -> list[str]:
        return [path for path, _at in self.pages]

    async def wait_for_pages(self, count: int) -> None:
        """Return once `count` page requests have arrived."""
        while len(self.pages) < count:
            arrived = self._arrival()
            arrived.clear()
            await arrived.wait()

    async def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/robots.txt":
            if self.robots is None:
                return httpx.Response(404, text="not found", headers={"content-type": "text/plain"})
            return httpx.Response(200, text=self.robots, headers={"content-type": "text/plain"})
        self.pages.append((path, self.clock()))  # type: ignore[operator]
        self._arrival().set()
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if path in self._held:
                await self._held[path].wait()
            scripted = self.answers.get(path)
            if scripted:
                return scripted.pop(0)
            return httpx.Response(200, html=ARTICLE)
        finally:
            self.in_flight -= 1

    def _arrival(self) -> asyncio.Event:
        if self._arrived is None:
            self._arrived = asyncio.Event()
        return self._arrived
