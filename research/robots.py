"""robots.txt rules per origin (RFC 9309), parsed by protego and cached for the life of a fetcher."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit, urlunsplit

from protego import Protego
from pydantic import BaseModel, ConfigDict


class RobotsAnswer(BaseModel):
    """What fetching an origin's /robots.txt produced: an HTTP status and body, or no status when unreachable."""

    http_status: int | None = None
    body: str = ""
    problem: str | None = None


RobotsFetch = Callable[[str], Awaitable[RobotsAnswer]]


class RobotsRules(BaseModel):
    """The rules for one origin: parsed robots.txt, allow-all, or disallow-all with the reason why."""

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True)

    parser: Protego | None = None
    disallow_all_because: str | None = None

    def refusal(self, url: str, product_token: str) -> str | None:
        """Return why robots.txt forbids `url` for our product token, or None when it is allowed."""
        if self.disallow_all_because is not None:
            return self.disallow_all_because
        if self.parser is None or self.parser.can_fetch(url, product_token):
            return None
        parts = urlsplit(url)
        return f"robots.txt disallows {parts.path or '/'}"

    def crawl_delay(self, product_token: str) -> float | None:
        """Seconds robots.txt asks our product token to leave between requests, or None when it asks for no delay."""
        if self.parser is None:
            return None
        delay = self.parser.crawl_delay(product_token)
        return float(delay) if delay is not None and delay > 0 else None


def rules_from_answer(answer: RobotsAnswer) -> RobotsRules:
    """Turn a robots.txt fetch into rules: 2xx parsed, 4xx allows everything, 5xx or unreachable disallows everything (RFC 9309)."""
    status = answer.http_status
    if status is None:
        problem = answer.problem or "unreachable"
        return RobotsRules(disallow_all_because=f"robots.txt unreachable ({problem}), so every path is disallowed")
    if 200 <= status < 300:
        return RobotsRules(parser=Protego.parse(answer.body))
    if 400 <= status < 500:
        return RobotsRules()
    return RobotsRules(disallow_all_because=f"robots.txt answered HTTP {status}, so every path is disallowed")


def robots_url_for(url: str) -> str:
    """Return the /robots.txt URL of the origin (scheme, host and port) that `url` belongs to."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme.lower(), parts.netloc.lower(), "/robots.txt", "", ""))


def product_token_of(user_agent: str) -> str:
    """Return the product token robots.txt groups match against: the User-Agent's first word before any '/'."""
    first_word = user_agent.strip().split()[0] if user_agent.strip() else ""
    return first_word.split("/")[0].lower()


class RobotsCache:
    """Fetches each origin's robots.txt once (concurrent callers share the fetch) and answers whether a URL may be fetched."""

    def __init__(self, fetch_robots: RobotsFetch, user_agent: str) -> None:
        self._fetch_robots = fetch_robots
        self.product_token = product_token_of(user_agent)
        self._rules: dict[str, asyncio.Task[RobotsRules]] = {}

    async def refusal(self, url: str) -> str | None:
        """Return why robots.txt forbids `url`, or None when allowed; a robots.txt that cannot be read disallows everything."""
        robots_url = robots_url_for(url)
        if urlsplit(url).path == "/robots.txt":
            return None
        task = self._rules.get(robots_url)
        if task is None:
            task = asyncio.create_task(self._load(robots_url), name=f"robots {robots_url}")
            self._rules[robots_url] = task
        # Shielded so that one caller's cancellation does not cancel the fetch other callers share.
        rules = await asyncio.shield(task)
        return rules.refusal(url, self.product_token)

    async def _load(self, robots_url: str) -> RobotsRules:
        try:
            answer = await self._fetch_robots(robots_url)
        except Exception as error:  # a robots fetch that blows up counts as unreachable, never as permission
            answer = RobotsAnswer(problem=type(error).__name__)
        return rules_from_answer(answer)

    def crawl_delay(self, url: str) -> float | None:
        """The crawl delay of `url`'s origin once its robots.txt is loaded (after `refusal`), or None."""
        task = self._rules.get(robots_url_for(url))
        if task is None or not task.done() or task.cancelled() or task.exception() is not None:
            return None
        return task.result().crawl_delay(self.product_token)

    def cached_origins(self) -> list[str]:
        """Return the robots.txt URLs fetched or being fetched so far."""
        return list(self._rules)
