"""Real Celery worker processes for integration tests, and the bot's side of starting a Slack run."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from chat.platform import Outbound
from chat.message import Content, MessageRef, Place
from chat.slack.messenger import SlackMessenger, build_slack_client
from chat.slack.render import SlackRenderer
from chat.state import initial_progress
from config import Settings, load_settings
from storage.db import make_engine, make_session_factory
from storage.migrate import upgrade
from storage.models import Conversation, Run
from storage.redis import connect
from storage.vocabulary import RunOptions
from tests.fakes.corpus import Corpus
from tests.fakes.slack_api import FakeSlack
from tests.waiting import wait_for
from worker.queue import Limits, Queue, SendTask, celery_sender

ROOT = Path(__file__).resolve().parents[2]


class Cluster:
    """A database, a Redis, the fakes, and any number of `deepthread worker` processes sharing them."""

    def __init__(self, *, database_url: str, redis_url: str, corpus: Corpus, workdir: Path, slack: FakeSlack | None = None,
                 **settings: str) -> None:
        slack_settings = {"SLACK_BOT_TOKEN": slack.token, "SLACK_API_URL": slack.api_url,
                          "SLACK_SIGNING_SECRET": "test-secret", "SLACK_FILE_HOSTS": slack.file_host,
                          } if slack is not None else {}
        self.environment = {
            **os.environ, **corpus.environment(),
            "DATABASE_URL": database_url, "REDIS_URL": redis_url, **slack_settings,
            "RESEARCH_MAX_ROUNDS": "1", "LOG_LEVEL": "WARNING",
            **{name.upper(): str(value) for name, value in settings.items()},
        }
        self.workdir = workdir
        self.slack = slack
        self.workers: dict[str, subprocess.Popen[bytes]] = {}
        self._send_task: SendTask | None = None
        engine = make_engine(database_url)
        upgrade(database_url, engine=engine)
        self.sessions: sessionmaker[Session] = make_session_factory(engine)
        self.redis = connect(redis_url)
        self.settings = load_settings(**{name.lower(): value for name, value in self.environment.items()
                                         if name.lower() in Settings.model_fields})

    def start_worker(self, name: str, concurrency: int = 4) -> subprocess.Popen[bytes]:
        log = open(self.workdir / f"{name}.log", "wb")
        process = subprocess.Popen(
            [sys.executable, "-m", "bot.cli", "worker", f"--concurrency={concurrency}", f"--hostname={name}@%h"],
            env=self.environment, cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        self.workers[name] = process
        return process

    def start_beat(self, name: str) -> subprocess.Popen[bytes]:
        """A `deepthread beat` process on the cluster's settings (its ticks go to the workers' queue)."""
        log = open(self.workdir / f"{name}.log", "wb")
        process = subprocess.Popen([sys.executable, "-m", "bot.cli", "beat"], env=self.environment, cwd=self.workdir,
                                   stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.workers[name] = process
        return process

    def fire_watch(self, watch_id: int, outbound: Outbound | None = None) -> int:
        """One watch tick, as a worker runs it for the beat, at the watch's due time (an injected clock); returns the
        run it fired. `outbound` is how the tick speaks on the watch's platform (a skipped window's line)."""
        from storage.watches import FiringLimits, watch_of
        from worker.watches import WatchTick

        watch = watch_of(self.sessions, watch_id)
        assert watch is not None
        due = watch.next_due_at
        tick = WatchTick(self.sessions, self.queue(), FiringLimits.from_settings(self.settings), claim_seconds=60,
                         platform_parts=lambda _: outbound, clock=lambda: due + dt.timedelta(seconds=1))
        fired = asyncio.run(tick())
        assert [outcome.outcome for outcome in fired] == ["fired"], fired
        assert fired[0].run_id is not None
        return fired[0].run_id

    def kill(self, name: str) -> None:
        os.killpg(self.workers[name].pid, signal.SIGKILL)
        self.workers[name].wait(timeout=10)

    def stop(self) -> None:
        for process in self.workers.values():
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                    process.wait(timeout=10)
                except (subprocess.TimeoutExpired, ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)

    def log(self, name: str) -> str:
        return (self.workdir / f"{name}.log").read_text(errors="replace")

    def queue(self) -> Queue:
        # A sender of its own, as the bot has: the worker module's app keeps the broker of the first test that used it.
        if self._send_task is None:
            self._send_task = celery_sender(self.settings)
        return Queue(self.sessions, self.redis, Limits(self.settings.max_runs_per_user, self.settings.max_runs_per_workspace),
                     self._send_task)

    def start_run(self, question: str, *, user: str = "U1", workspace: str = "T1", channel: str = "C1",
                  mode: str = "research", options: RunOptions | None = None) -> tuple[int, int | None]:
        """What the bot does for `/research`: a root message, a status message in its thread, a Run, submit."""
        assert self.slack is not None, "start_run speaks Slack: give the cluster a FakeSlack"
        messenger = SlackMessenger(build_slack_client(self.slack.token, self.slack.api_url))

        async def post() -> tuple[MessageRef, MessageRef]:
            root = await messenger.post(Place(platform="slack", workspace=workspace, channel=channel),
                                        Content(text=f"<@{user}> asked: {question}"))
            status = await messenger.post(Place(platform="slack", workspace=workspace, channel=channel,
                                                thread=root.message_id), Content(text="Queued…"))
            if messenger.client.session is not None:
                await messenger.client.session.close()  # its connections belong to this asyncio.run's loop
            return root, status

        root, status = asyncio.run(post())
        with self.sessions.begin() as session:
            conversation = Conversation(platform="slack", workspace=workspace, channel=channel, thread=root.message_id,
                                        created_by=f"slack:{user}")
            run = Run(conversation=conversation, workspace=workspace, mode=mode, question=question,
                      options=options or RunOptions(), requested_by=f"slack:{user}",
                      status_message=status.model_dump(mode="json"))
            session.add(run)
            session.flush()
            run_id = run.id
        position = self.queue().submit(run_id)
        if position is not None:
            waiting = initial_progress(run_id=run_id, mode=mode, question=question, requested_by=f"slack:{user}")
            content = SlackRenderer().status(waiting.model_copy(update={"queue_position": position}),
                                             now=dt.datetime.now(dt.timezone.utc))
            asyncio.run(self._edit_once(messenger, status, content))
        return run_id, position

    @staticmethod
    async def _edit_once(messenger: SlackMessenger, ref: MessageRef, content: Content) -> None:
        await messenger.edit(ref, content)
        if messenger.client.session is not None:
            await messenger.client.session.close()

    def run(self, run_id: int) -> Run:
        with self.sessions() as session:
            return session.get(Run, run_id)

    def wait_for(self, predicate: Callable[[], Any], timeout: float, message: str) -> Any:
        """`tests.waiting.wait_for` at a pace kind to the database, the workers' logs added to a timeout."""
        try:
            return wait_for(predicate, message, timeout, interval=0.1)
        except AssertionError:
            logs = "\n".join(f"--- {name}\n{self.log(name)[-3000:]}" for name in self.workers)
            raise AssertionError(f"timed out after {timeout} s waiting for {message}\n{logs}") from None

    def newest_run_is_fetching(self) -> bool:
        """Whether the newest run is research that has started fetching pages (a moment to stop it mid-run)."""
        from storage.models import Event

        with self.sessions() as session:
            newest = session.scalars(select(Run).order_by(Run.id.desc())).first()
            return newest is not None and newest.mode == "research" and newest.state == "running" and session.scalars(
                select(Event).where(Event.run_id == newest.id, Event.phase == "fetch")).first() is not None

    def wait_for_state(self, run_id: int, states: Collection[str], timeout: float = 60) -> Run:
        return self.wait_for(lambda: (run := self.run(run_id)) is not None and run.state in states and run,
                             timeout, f"run {run_id} to reach {states}")
