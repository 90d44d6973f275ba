"""Time to the acknowledgement of `/research` slash commands, through the real bot in HTTP mode.

The bot runs as in production: uvicorn and starlette on 127.0.0.1, the real bolt app (signature and timestamp
check, authorization, self-event filter, event dedupe middleware), the real listener, and the real conversation
core (`bot.cli.platform_core`: SQLite in a temporary directory, admission through `worker.queue` on a real
Redis, Celery tasks sent to that Redis with no worker consuming them, status messages posted to the fake Slack Web
API). Each request is signed as Slack signs it and sent one after another over a kept-alive connection; the time
to the ack is the client-measured time from sending the request to receiving the whole response. A few
`/research help` requests (which start no run) warm the connection and bolt's one-time `auth.test` first.

After the last ack the benchmark waits for the core to finish the work it does after acknowledging, and asserts
that exactly one run per request was created.

    .venv/bin/python bench/ack.py [--requests 200] [--users 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import func, select  # noqa: E402

from chat.slack.messenger import build_slack_client  # noqa: E402
from bot.slack.app import build_slack_app  # noqa: E402
from bot.slack.dedupe import RedisEventDeduper  # noqa: E402
from bot.cli import platform_core  # noqa: E402
from bot.slack.bundle import BUNDLE as SLACK  # noqa: E402
from bot.slack.server import build_http_app  # noqa: E402
from config import Settings, load_settings  # noqa: E402
from storage.db import make_engine, make_session_factory  # noqa: E402
from storage.migrate import upgrade  # noqa: E402
from storage.models import Run  # noqa: E402
from tests.fakes.server import LoopbackServer  # noqa: E402
from tests.fakes.slack_api import FakeSlack  # noqa: E402
from tests.fakes.slack_events import ResponseUrlCatcher, SlackEventSender  # noqa: E402
from tests.services import redis_server  # noqa: E402

SIGNING_SECRET = "bench-signing-secret"
CHANNEL = "C0BENCH"
WARM_UP_REQUESTS = 5
ALL_RUNS_TIMEOUT_SECONDS = 120.0


def percentile(values: list[float], fraction: float) -> float:
    """The nearest-rank percentile of `values` (0 < fraction <= 1)."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(fraction * len(ordered) + 0.5)))
    return ordered[rank - 1]


def count_runs(settings: Settings) -> int:
    engine = make_engine(settings.database_url)
    try:
        with make_session_factory(engine)() as session:
            return int(session.scalar(select(func.count()).select_from(Run)) or 0)
    finally:
        engine.dispose()


def wait_for_runs(settings: Settings, expected: int) -> float:
    """Seconds until `expected` runs are stored; raises AssertionError after ALL_RUNS_TIMEOUT_SECONDS."""
    started = time.monotonic()
    while count_runs(settings) < expected:
        if time.monotonic() - started > ALL_RUNS_TIMEOUT_SECONDS:
            raise AssertionError(f"only {count_runs(settings)} of {expected} runs were created")
        time.sleep(0.05)
    return time.monotonic() - started


def send_commands(sender: SlackEventSender, requests: int, users: int) -> list[float]:
    """Send `requests` signed `/research` commands one after another; the seconds each took to be acknowledged."""
    for _ in range(WARM_UP_REQUESTS):
        response = sender.send(sender.command("/research", "help", user="U0WARMUP", channel=CHANNEL))
        assert response.status_code == 200, response.text
    seconds: list[float] = []
    for number in range(requests):
        request = sender.command("/research", f"question {number}: what changed in battery chemistry in 2024?",
                                 user=f"U{number % users:08d}", channel=CHANNEL)
        started = time.perf_counter()
        response = sender.send(request)
        seconds.append(time.perf_counter() - started)
        assert response.status_code == 200 and response.text == "", (response.status_code, response.text)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--users", type=int, default=20, help="distinct requesters, in turn")
    arguments = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="deepthread-bench-ack-") as workdir, redis_server() as redis_url, \
            FakeSlack() as slack, ResponseUrlCatcher() as catcher:
        settings = load_settings(database_url=f"sqlite:///{workdir}/bench.db", redis_url=redis_url, data_dir=workdir,
                                 slack_bot_token=slack.token, slack_signing_secret=SIGNING_SECRET,
                                 slack_api_url=slack.api_url)
        upgrade(settings.database_url)
        client = build_slack_client(slack.token, slack.api_url)
        core = platform_core(SLACK, settings)
        app = build_slack_app(settings, core, client=client, dedupe=RedisEventDeduper.from_url(redis_url))
        with LoopbackServer(build_http_app(app)) as server:
            sender = SlackEventSender(f"{server.url}/slack/events", SIGNING_SECRET, response_url=catcher.url)
            wall_started = time.monotonic()
            seconds = send_commands(sender, arguments.requests, arguments.users)
            sending = time.monotonic() - wall_started
            settled = wait_for_runs(settings, arguments.requests)
            sender.close()
        created = count_runs(settings)
        status_messages = len(slack.calls("chat.postMessage")) - arguments.requests

    assert created == arguments.requests, f"{created} runs for {arguments.requests} requests"
    milliseconds = [value * 1000 for value in seconds]
    p50, p99 = percentile(milliseconds, 0.50), percentile(milliseconds, 0.99)
    print(f"{arguments.requests} signed /research requests, one at a time, {arguments.users} requesters; "
          f"sent and acknowledged in {sending:.2f} s")
    print(f"time to ack: p50 {p50:.1f} ms, p90 {percentile(milliseconds, 0.90):.1f} ms, p99 {p99:.1f} ms, "
          f"max {max(milliseconds):.1f} ms, mean {statistics.fmean(milliseconds):.1f} ms")
    print(f"runs created: {created}; the core finished {settled:.2f} s after the last ack "
          f"({status_messages} status messages besides the {arguments.requests} question messages)")
    print(f"p50_ms={p50:.1f} p99_ms={p99:.1f}")


if __name__ == "__main__":
    main()
