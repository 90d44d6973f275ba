"""Time to the acknowledgement of `/research` slash commands, through the real bot in HTTP mode.

The bot runs as in production: uvicorn and starlette on 127.0.0.1, the real bolt app (signature and timestamp
check, authorization, self-event filter, event dedupe middleware), the real listener, and the real conversation
core (`bot.cli.platform_core`: SQLite in a temporary directory, admission through `worker.queue` on a real
Redis, Celery tasks sent to that Redis with no worker consuming them, status messages posted to the fake Slack Web
API). Each request is signed as Slack signs it and sent one after another over a kept-alive connection; the time
to the ack is the client-measured time from sending the request to receiving the whole response. A few
`/research help` requests (which start no run) warm the connection and bolt's one-time `auth.test` first.

After the last ack the benchmark waits until every command is answered: a run stored for it, or a private refusal
at its `response_url` (no worker takes runs here, so each requester's runs past MAX_QUEUED_PER_USER are refused, and
everyone's once the workspace has MAX_QUEUED_PER_WORKSPACE waiting); it asserts that none is left unanswered, that
nobody (and no workspace) has more runs waiting than its cap, and that a new person's command right after the burst
is acknowledged and answered as quickly as ever: its run stored, or, the workspace's queue being full, refused.
`--workspace-cap` sets MAX_QUEUED_PER_WORKSPACE (the settings' default unless given; 0 is off).

    .venv/bin/python bench/ack.py [--requests 200] [--users 20] [--workspace-cap N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import func, select  # noqa: E402

from chat.slack.messenger import build_slack_client  # noqa: E402
from bot.slack.app import build_slack_app  # noqa: E402
from bot.slack.dedupe import RedisEventDeduper  # noqa: E402
from bot.cli import platform_core  # noqa: E402
from bot.slack.bundle import BUNDLE as SLACK  # noqa: E402
from bot.slack.server import build_http_app  # noqa: E402
from config import load_settings  # noqa: E402
from storage.db import Sessions, make_engine, make_session_factory  # noqa: E402
from storage.admission import waiting  # noqa: E402
from storage.migrate import upgrade  # noqa: E402
from storage.models import Run  # noqa: E402
from tests.fakes.server import LoopbackServer  # noqa: E402
from tests.fakes.slack_api import FakeSlack  # noqa: E402
from tests.fakes.slack_events import ResponseUrlCatcher, SlackEventSender  # noqa: E402
from tests.services import redis_server  # noqa: E402

SIGNING_SECRET = "bench-signing-secret"
CHANNEL = "C0BENCH"
WARM_UP_REQUESTS = 5
ALL_ANSWERS_TIMEOUT_SECONDS = 120.0


def percentile(values: list[float], fraction: float) -> float:
    """The nearest-rank percentile of `values` (0 < fraction <= 1)."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(fraction * len(ordered) + 0.5)))
    return ordered[rank - 1]


def questions_with_runs(sessions: Sessions) -> tuple[list[str], dict[str, int]]:
    """The questions of every stored run, and how many runs each requester has waiting in the queue."""
    with sessions() as session:
        questions = list(session.scalars(select(Run.question)))
        rows = session.execute(select(Run.requested_by, func.count()).where(waiting()).group_by(Run.requested_by))
        return questions, {str(user): int(count) for user, count in rows}


@dataclass
class Command:
    """One `/research` request sent: its question and the `response_url` path its private replies go to."""

    question: str
    response_path: str
    ack_seconds: float = 0.0


@dataclass
class Answers:
    """What became of each command: a run, a private refusal at its `response_url`, or nothing (yet)."""

    runs: int
    refused: int  # by either queue cap
    refused_for_workspace: int  # of those, by the workspace's
    other_replies: int
    unanswered: int


def answers(sessions: Sessions, catcher: ResponseUrlCatcher, sent: list[Command]) -> Answers:
    questions = set(questions_with_runs(sessions)[0])
    replied = {response.path: response.payload.get("text", "") for response in catcher.responses()}
    runs = refused = for_workspace = other = unanswered = 0
    for command in sent:
        reply = replied.get(command.response_path, "")
        if command.question in questions:
            runs += 1
        elif "runs waiting in the queue" in reply:
            refused += 1
            for_workspace += reply.startswith("This workspace already has")
        elif command.response_path in replied:
            other += 1
        else:
            unanswered += 1
    return Answers(runs=runs, refused=refused, refused_for_workspace=for_workspace, other_replies=other,
                   unanswered=unanswered)


def wait_for_answers(sessions: Sessions, catcher: ResponseUrlCatcher, sent: list[Command]) -> tuple[float, Answers]:
    """Seconds until every command has its run or its reply (or ALL_ANSWERS_TIMEOUT_SECONDS passed), and the tally."""
    started = time.monotonic()
    while True:
        tally = answers(sessions, catcher, sent)
        if tally.unanswered == 0 or time.monotonic() - started > ALL_ANSWERS_TIMEOUT_SECONDS:
            return time.monotonic() - started, tally
        time.sleep(0.1)


def send_command(sender: SlackEventSender, question: str, user: str) -> Command:
    """Send one signed `/research` command; it must be acknowledged with an empty 200."""
    request = sender.command("/research", question, user=user, channel=CHANNEL)
    response_url = parse_qs(request.body)["response_url"][0]
    started = time.perf_counter()
    response = sender.send(request)
    seconds = time.perf_counter() - started
    assert response.status_code == 200 and response.text == "", (response.status_code, response.text)
    return Command(question=question, response_path=urlsplit(response_url).path, ack_seconds=seconds)


def send_commands(sender: SlackEventSender, requests: int, users: int) -> list[Command]:
    """Send `requests` signed `/research` commands one after another, from `users` requesters in turn."""
    for _ in range(WARM_UP_REQUESTS):
        response = sender.send(sender.command("/research", "help", user="U0WARMUP", channel=CHANNEL))
        assert response.status_code == 200, response.text
    return [send_command(sender, f"question {number}: what changed in battery chemistry in 2024?",
                         f"U{number % users:08d}") for number in range(requests)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--users", type=int, default=20, help="distinct requesters, in turn")
    parser.add_argument("--workspace-cap", type=int, default=None,
                        help="MAX_QUEUED_PER_WORKSPACE (default: the settings' default; 0 is off)")
    arguments = parser.parse_args()
    caps = {} if arguments.workspace_cap is None else {"max_queued_per_workspace": arguments.workspace_cap}

    with tempfile.TemporaryDirectory(prefix="deepthread-bench-ack-") as workdir, redis_server() as redis_url, \
            FakeSlack() as slack, ResponseUrlCatcher() as catcher:
        settings = load_settings(database_url=f"sqlite:///{workdir}/bench.db", redis_url=redis_url, data_dir=workdir,
                                 slack_bot_token=slack.token, slack_signing_secret=SIGNING_SECRET,
                                 slack_api_url=slack.api_url, **caps)
        upgrade(settings.database_url)
        engine = make_engine(settings.database_url)  # the benchmark's own reads, one pool for all its polls
        sessions = make_session_factory(engine)
        client = build_slack_client(slack.token, slack.api_url)
        core = platform_core(SLACK, settings)
        app = build_slack_app(settings, core, client=client, dedupe=RedisEventDeduper.from_url(redis_url))
        with LoopbackServer(build_http_app(app)) as server:
            sender = SlackEventSender(f"{server.url}/slack/events", SIGNING_SECRET, response_url=catcher.url)
            wall_started = time.monotonic()
            sent = send_commands(sender, arguments.requests, arguments.users)
            sending = time.monotonic() - wall_started
            settled, tally = wait_for_answers(sessions, catcher, sent)
            # Right after the burst, a new person's command: acknowledged, and its run stored, as quickly as ever.
            after = send_command(sender, "one more question: is the app still answering?", "U0AFTER01")
            next_answer_s, after_tally = wait_for_answers(sessions, catcher, [after])
            sender.close()
        waiting_by_user = questions_with_runs(sessions)[1]
        engine.dispose()

    milliseconds = [command.ack_seconds * 1000 for command in sent]
    p50, p99 = percentile(milliseconds, 0.50), percentile(milliseconds, 0.99)
    print(f"{arguments.requests} signed /research requests, one at a time, {arguments.users} requesters; "
          f"sent and acknowledged in {sending:.2f} s")
    print(f"time to ack: p50 {p50:.1f} ms, p90 {percentile(milliseconds, 0.90):.1f} ms, p99 {p99:.1f} ms, "
          f"max {max(milliseconds):.1f} ms, mean {statistics.fmean(milliseconds):.1f} ms")
    slowest = sorted(range(len(milliseconds)), key=lambda index: milliseconds[index], reverse=True)[:5]
    print("slowest acks (request number, ms): " + ", ".join(f"{index + 1} {milliseconds[index]:.0f}" for index in slowest))
    print(f"answered {settled:.2f} s after the last ack: {tally.runs} runs, {tally.refused} private refusals "
          f"({tally.refused_for_workspace} for the workspace's queue; MAX_QUEUED_PER_USER="
          f"{settings.max_queued_per_user}, MAX_QUEUED_PER_WORKSPACE={settings.max_queued_per_workspace}; no worker "
          f"takes runs here), {tally.other_replies} other replies, {tally.unanswered} unanswered; most waiting for "
          f"one person: {max(waiting_by_user.values(), default=0)}, in all: {sum(waiting_by_user.values())}")
    became = "its run stored" if after_tally.runs else "refused (the workspace's queue is full)"
    print(f"a new command after the burst: acknowledged in {after.ack_seconds * 1000:.1f} ms, "
          f"{became} {next_answer_s:.2f} s later")
    assert tally.unanswered == 0 and tally.other_replies == 0, tally
    assert after_tally.runs + after_tally.refused_for_workspace == 1, after_tally
    assert max(waiting_by_user.values(), default=0) <= settings.max_queued_per_user, waiting_by_user
    assert not settings.max_queued_per_workspace or sum(waiting_by_user.values()) <= settings.max_queued_per_workspace
    print(f"p50_ms={p50:.1f} p99_ms={p99:.1f} runs={tally.runs} refused={tally.refused} "
          f"refused_for_workspace={tally.refused_for_workspace} unanswered={tally.unanswered} "
          f"next_ack_ms={after.ack_seconds * 1000:.1f} next_answer_s={next_answer_s:.2f} "
          f"next={'run' if after_tally.runs else 'refused'}")


if __name__ == "__main__":
    main()
