"""Faults at the end of a run: Slack failing at delivery time, and the database failing as the report is stored.

Slack is the fake Web API on loopback, reached by the real SlackMessenger; the database is a real SQLite
file (locked by a second connection) or a real PostgreSQL server that the test stops and starts again.
Delivery retries are driven by the worker's own sweep with an injected clock, so no test waits for a backoff.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import shutil
import sqlite3
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import event, select
from sqlalchemy.orm import Session, sessionmaker

from chat.message import Content, Place
from chat.slack.messenger import SlackMessenger, build_slack_client
from chat.slack.render import SlackRenderer
from chat.state import RunProgress
from research.report import Report
from storage.db import make_engine, make_session_factory
from storage.migrate import upgrade
from storage.leases import ADMITTED, claim_undelivered
from storage.models import Citation, Conversation, Run, Source
from tests.fakes.corpus import QUESTION, Corpus, options
from tests.fakes.llm import ChatRequest, HandlerResult, default_research_model, passages_in
from tests.fakes.server import free_port
from tests.fakes.slack_api import FakeSlack, SlackMessage
from tests.integration.workers import Cluster
from tests.services import ServiceUnavailable, postgres_bin_dir, unavailable
from worker.delivery import (
    DeliveryOutcome,
    DeliveryRetry,
    DeliveryTarget,
    RunDelivery,
    stored_progress,
    sweep_undelivered,
)
from worker.leases import reap
from worker.progress import InMemoryEditBucket
from worker.attempt import RunAttempt
from worker.runner import RunnerServices

pytestmark = pytest.mark.integration

REPORT_GREETING = "here is your report"
CHANNEL = "C0RESEARCH"


class WallClock:
    """The time the delivery and the sweep read, moved only by the test."""

    def __init__(self) -> None:
        self.now = dt.datetime.now(dt.timezone.utc)

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)


def migrated_sessions(url: str) -> sessionmaker[Session]:
    engine = make_engine(url)
    upgrade(url, engine=engine)
    return make_session_factory(engine)


def slack_run(sessions: sessionmaker[Session], slack: FakeSlack, *, question: str = QUESTION,
              **fields: object) -> int:
    """What the bot does for `/research`: a thread with a status message in Slack, and an admitted Run."""
    messenger = SlackMessenger(build_slack_client(slack.token, slack.api_url))
    opened = asyncio.run(messenger.open_thread(Place(platform="slack", workspace="T1", channel=CHANNEL),
                                               title=Content(text=f"<@U0ALICE1> asked: {question}"),
                                               status=Content(text="Queued…")))
    with sessions.begin() as session:
        conversation = Conversation(platform="slack", workspace="T1", channel=CHANNEL, thread=opened.thread,
                                    created_by="slack:U0ALICE1")
        run = Run(conversation=conversation, workspace="T1", mode="research", question=question,
                  requested_by="slack:U0ALICE1", status_message=opened.status.model_dump(mode="json"),
                  celery_task_id="task-1", lease_owner=ADMITTED,
                  lease_until=dt.datetime.now(dt.timezone.utc) + dt.timedelta(minutes=5), **fields)
        session.add(run)
        session.flush()
        return run.id


def slack_delivery(sessions: sessionmaker[Session], slack: FakeSlack, run_id: int, *, clock: WallClock | None = None,
                   retry: DeliveryRetry | None = None) -> RunDelivery:
    """The run's delivery as a worker builds it, speaking to the fake Slack."""
    messenger = SlackMessenger(build_slack_client(slack.token, slack.api_url))
    return RunDelivery(sessions, DeliveryTarget.load(sessions, run_id), messenger=messenger, renderer=SlackRenderer(),
                       bucket=InMemoryEditBucket(), min_interval=0.0, retry=retry, clock=clock)


def sweep(sessions: sessionmaker[Session], slack: FakeSlack, clock: WallClock,
          retry: DeliveryRetry | None = None) -> dict[int, DeliveryOutcome]:
    """One pass of the worker's resume sweep at the clock's time."""
    return asyncio.run(sweep_undelivered(
        sessions, platforms=["slack"], lease_seconds=30, now=clock(),
        delivery_for=lambda run_id: slack_delivery(sessions, slack, run_id, clock=clock, retry=retry)))


def fetch(sessions: sessionmaker[Session], run_id: int) -> Run:
    with sessions() as session:
        return session.get(Run, run_id)


def thread_messages(slack: FakeSlack, sessions: sessionmaker[Session], run_id: int) -> list[SlackMessage]:
    status = fetch(sessions, run_id).status_message
    return slack.messages(status["channel"], thread_ts=status["thread"])


def reports_in_thread(slack: FakeSlack, sessions: sessionmaker[Session], run_id: int) -> list[SlackMessage]:
    return [message for message in thread_messages(slack, sessions, run_id) if REPORT_GREETING in message.visible_text]


def status_text(slack: FakeSlack, sessions: sessionmaker[Session], run_id: int) -> str:
    status = fetch(sessions, run_id).status_message
    return slack.message(status["channel"], status["message_id"]).visible_text


def store_finished_report(sessions: sessionmaker[Session], run_id: int) -> RunProgress:
    """The run as the runner leaves it once finished: done, its report stored, its lease released."""
    report = Report(title="Zorblax turbines", question=QUESTION, body_markdown="The turbines work well.")
    with sessions.begin() as session:
        run = session.get(Run, run_id)
        run.state, run.attempt, run.finished_at = "done", 1, dt.datetime.now(dt.timezone.utc)
        run.lease_owner, run.lease_until = None, None
        run.report_json, run.report_markdown = report.model_dump(mode="json"), "The turbines work well."
    return stored_progress(sessions, run_id)


# -- Slack failing at delivery time ------------------------------------------------------------------------


def test_a_slack_outage_at_delivery_time_is_ridden_out_by_the_sweep_with_one_report_and_the_final_status(
        tmp_path: Path, slack: FakeSlack) -> None:
    sessions = migrated_sessions(f"sqlite:///{tmp_path}/deepthread.db")
    run_id = slack_run(sessions, slack)
    final = store_finished_report(sessions, run_id)
    clock = WallClock()

    slack.start_outage()
    assert asyncio.run(slack_delivery(sessions, slack, run_id, clock=clock).finish(final)) == \
        DeliveryOutcome.RETRY_SCHEDULED
    clock.advance(30)
    assert sweep(sessions, slack, clock) == {run_id: DeliveryOutcome.RETRY_SCHEDULED}, "still down: tried, counted"
    run = fetch(sessions, run_id)
    assert run.delivered_at is None and run.delivery_attempts == 2
    assert run.delivery_retry_at == clock() + dt.timedelta(seconds=60), "the wait doubles"
    assert reports_in_thread(slack, sessions, run_id) == [] and "Queued" in status_text(slack, sessions, run_id)
    refused = [call for call in slack.calls() if call.status == 500]
    assert {call.method for call in refused} >= {"chat.postMessage"}

    slack.end_outage()
    clock.advance(59)
    assert sweep(sessions, slack, clock) == {}, "not before its time"
    clock.advance(1)
    assert sweep(sessions, slack, clock) == {run_id: DeliveryOutcome.DELIVERED}
    assert len(reports_in_thread(slack, sessions, run_id)) == 1
    assert "<@U0ALICE1>" in reports_in_thread(slack, sessions, run_id)[0].text
    assert "⏳" not in status_text(slack, sessions, run_id) and "Queued" not in status_text(slack, sessions, run_id)
    assert fetch(sessions, run_id).delivered_at is not None
    clock.advance(3600)
    assert sweep(sessions, slack, clock) == {}
    assert len(reports_in_thread(slack, sessions, run_id)) == 1


def test_when_slack_keeps_refusing_the_report_the_sweep_stops_after_the_cap_with_a_plain_notice(
        tmp_path: Path, slack: FakeSlack) -> None:
    sessions = migrated_sessions(f"sqlite:///{tmp_path}/deepthread.db")
    run_id = slack_run(sessions, slack)
    final = store_finished_report(sessions, run_id)
    clock, retry = WallClock(), DeliveryRetry(max_attempts=3, first_delay_seconds=30, max_delay_seconds=60)

    # Only the report fails (a payload Slack chokes on, say): the thread itself still answers.
    slack.start_outage(["chat.postMessage"], when=lambda params: REPORT_GREETING in str(params.get("text", "")))
    outcomes = [asyncio.run(slack_delivery(sessions, slack, run_id, clock=clock, retry=retry).finish(final))]
    for wait in (30, 60):
        clock.advance(wait)
        outcomes.extend(sweep(sessions, slack, clock, retry).values())
    assert outcomes == [DeliveryOutcome.RETRY_SCHEDULED, DeliveryOutcome.RETRY_SCHEDULED, DeliveryOutcome.GIVEN_UP]

    notices = [message.visible_text for message in thread_messages(slack, sessions, run_id)
               if "could not be posted" in message.visible_text]
    assert len(notices) == 1 and "even after 3 tries" in notices[0] and f"deepthread export {run_id}" in notices[0]
    assert reports_in_thread(slack, sessions, run_id) == []
    assert "⏳" not in status_text(slack, sessions, run_id) and "Queued" not in status_text(slack, sessions, run_id)
    run = fetch(sessions, run_id)
    assert run.delivery_given_up_at is not None and run.delivered_at is None
    clock.advance(365 * 24 * 3600)
    assert claim_undelivered(sessions, ["slack"], 30, now=clock()) == []


def test_a_worker_rides_out_a_slack_outage_at_delivery_time_and_reports_once(
        tmp_path: Path, redis_url: str, slack: FakeSlack) -> None:
    from storage.redis import connect

    connect(redis_url).flushall()
    with Corpus() as corpus:
        cluster = Cluster(database_url=f"sqlite:///{tmp_path}/deepthread.db", redis_url=redis_url, corpus=corpus,
                          slack=slack, workdir=tmp_path, worker_lease_seconds="3", delivery_retry_seconds="0.5",
                          delivery_retry_max_seconds="0.5")
        try:
            cluster.start_worker("w1")
            run_id, _ = cluster.start_run(QUESTION, user="U0ALICE1")
            slack.start_outage()  # from the run's start to well past its end
            cluster.wait_for(lambda: (run := cluster.run(run_id)).state == "done" and run.delivery_attempts >= 2, 60,
                             "the run to end and its delivery to fail twice")
            assert cluster.run(run_id).delivered_at is None
            assert reports_in_thread(slack, cluster.sessions, run_id) == []
            slack.end_outage()
            cluster.wait_for(lambda: cluster.run(run_id).delivered_at, 20, "the sweep to deliver the report")
        finally:
            cluster.stop()
    assert len(reports_in_thread(slack, cluster.sessions, run_id)) == 1
    assert "⏳" not in status_text(slack, cluster.sessions, run_id)
    assert "sentences verified" in status_text(slack, cluster.sessions, run_id)


# -- the database failing as a finished run is stored -------------------------------------------------------


def interrupting_synthesis(interrupt: Callable[[], None], calls: list[str]) -> Callable[[ChatRequest], HandlerResult]:
    """The corpus's model, which calls `interrupt` the first time it writes the report: the database fails from then on."""
    def handler(request: ChatRequest) -> HandlerResult:
        if request.schema_name is None and passages_in(request):
            if not calls:
                interrupt()
            calls.append("synthesis")
        return default_research_model(request)

    return handler


def research_services(sessions: sessionmaker[Session], corpus: Corpus, sleep) -> RunnerServices:
    return RunnerServices(sessions=sessions, tools=corpus.tools(), options=options(max_rounds=1),
                          store_retry_delays=(1.0, 2.0, 4.0), sleep=sleep)


async def run_and_deliver(run_id: int, services: RunnerServices, delivery: RunDelivery) -> DeliveryOutcome | None:
    """What a worker does with a run: execute it with live status edits, then deliver its report from memory."""
    attempt = await RunAttempt.start(run_id, services, delivery=delivery)
    final = await attempt.execute(on_state=delivery.on_state) if attempt is not None else None
    if attempt is None or final is None:
        await delivery.editor.stop()
        return None
    return await delivery.finish(final, report=attempt.report)


def assert_delivered_once_with_findings(sessions: sessionmaker[Session], slack: FakeSlack, run_id: int) -> None:
    run = fetch(sessions, run_id)
    assert run.state == "done" and run.error is None and run.report_json is not None and run.delivered_at is not None
    with sessions() as session:
        for model in (Source, Citation):
            assert session.scalars(select(model).where(model.run_id == run_id)).first() is not None
    assert len(reports_in_thread(slack, sessions, run_id)) == 1
    assert "⏳" not in status_text(slack, sessions, run_id)


class SQLiteWriter:
    """A second connection to the file holding `BEGIN EXCLUSIVE` (another process writing) until released."""

    def __init__(self, path: str) -> None:
        self.connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.holding = False

    def lock(self) -> None:
        self.connection.execute("BEGIN EXCLUSIVE")
        self.holding = True

    def release(self) -> None:
        if self.holding:
            self.connection.execute("COMMIT")
            self.holding = False


def test_a_run_finishing_while_sqlite_is_write_locked_stores_and_delivers_its_report(
        tmp_path: Path, slack: FakeSlack) -> None:
    path = str(tmp_path / "deepthread.db")
    sessions = migrated_sessions(f"sqlite:///{path}")
    # SQLite's busy wait scaled down from the production 30 s, so the lock outlasts it as a 40 s lock would.
    event.listen(sessions.kw["bind"], "connect", lambda connection, _: connection.execute("PRAGMA busy_timeout=100"))
    sessions.kw["bind"].dispose()
    run_id = slack_run(sessions, slack)
    writer, waits, calls = SQLiteWriter(path), [], []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        writer.release()  # the other writer commits while the store waits to try again

    with Corpus(llm_handler=interrupting_synthesis(writer.lock, calls)) as corpus:
        services = research_services(sessions, corpus, sleep)
        outcome = asyncio.run(run_and_deliver(run_id, services, slack_delivery(sessions, slack, run_id)))
    assert waits[:1] == [1.0], "the store met the lock at least once and tried again"
    assert outcome == DeliveryOutcome.DELIVERED
    assert_delivered_once_with_findings(sessions, slack, run_id)
    assert fetch(sessions, run_id).attempt == 1, "the same attempt stored its report: nothing was redone"


class StoppablePostgres:
    """A throwaway PostgreSQL cluster on 127.0.0.1 that a test can stop and start again on the same port."""

    def __init__(self) -> None:
        self.bin_dir = postgres_bin_dir()
        self.root = tempfile.mkdtemp(prefix="deepthread-pg-faults-")
        self.data_dir = os.path.join(self.root, "data")
        self.port = free_port()
        if os.geteuid() == 0:
            os.chmod(self.root, 0o755)
            shutil.chown(self.root, user="postgres", group="postgres")
        self._pg(["initdb", "-D", self.data_dir, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"])
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _pg(self, command: list[str]) -> None:
        argv = [str(self.bin_dir / command[0]), *command[1:]]
        # initdb and pg_ctl refuse to run as root.
        subprocess.run(["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv, check=True,
                       capture_output=True)

    def start(self) -> None:
        options = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c fsync=off "
                   "-c full_page_writes=off")
        self._pg(["pg_ctl", "-D", self.data_dir, "-o", options, "-w", "-t", "60", "-l",
                  os.path.join(self.root, "log"), "start"])

    def stop(self) -> None:
        """Stop now, dropping every connection (clients then find the port refusing)."""
        self._pg(["pg_ctl", "-D", self.data_dir, "-m", "fast", "-w", "stop"])

    def remove(self) -> None:
        try:
            self._pg(["pg_ctl", "-D", self.data_dir, "-m", "immediate", "stop"])
        except subprocess.CalledProcessError:
            pass  # already stopped
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="module")
def stoppable_postgres() -> Iterator[StoppablePostgres]:
    try:
        server = StoppablePostgres()
    except ServiceUnavailable as error:
        unavailable(str(error))
    try:
        server.start()
        yield server
    finally:
        server.remove()


@pytest.fixture
def postgres_sessions(stoppable_postgres: StoppablePostgres) -> Iterator[sessionmaker[Session]]:
    if not is_up(stoppable_postgres):  # a failed test may have left it stopped
        stoppable_postgres.start()
    sessions = migrated_sessions(stoppable_postgres.url)
    with sessions.begin() as session:
        for table in ("citations", "passages", "sources", "events", "messages", "runs", "conversations"):
            session.execute(Run.metadata.tables[table].delete())
    yield sessions
    sessions.kw["bind"].dispose()


def is_up(server: StoppablePostgres) -> bool:
    return os.path.exists(os.path.join(server.data_dir, "postmaster.pid"))


def test_a_run_finishing_while_postgresql_is_stopped_is_not_failed_and_is_finished_by_the_reapers_next_attempt(
        postgres_sessions: sessionmaker[Session], stoppable_postgres: StoppablePostgres, slack: FakeSlack) -> None:
    sessions = postgres_sessions
    run_id = slack_run(sessions, slack)
    waits, calls = [], []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)  # PostgreSQL stays down through every try

    with Corpus(llm_handler=interrupting_synthesis(stoppable_postgres.stop, calls)) as corpus:
        services = research_services(sessions, corpus, sleep)
        assert asyncio.run(run_and_deliver(run_id, services, slack_delivery(sessions, slack, run_id))) is None
        assert waits == [1.0, 2.0, 4.0]
        stoppable_postgres.start()
        run = fetch(sessions, run_id)
        assert run.state == "running" and run.error is None and run.report_json is None, "not failed, nothing claimed"
        assert reports_in_thread(slack, sessions, run_id) == []

        assert reap(sessions, lambda *task: None, now=run.lease_until + dt.timedelta(seconds=1)) == [run_id]
        services = research_services(sessions, corpus, sleep)  # a worker's next task: clients of its own
        assert asyncio.run(run_and_deliver(run_id, services, slack_delivery(sessions, slack, run_id))) == \
            DeliveryOutcome.DELIVERED
    assert len(calls) == 2 and fetch(sessions, run_id).attempt == 2
    assert_delivered_once_with_findings(sessions, slack, run_id)


def test_a_run_finishing_while_postgresql_restarts_stores_and_delivers_its_report_in_the_same_attempt(
        postgres_sessions: sessionmaker[Session], stoppable_postgres: StoppablePostgres, slack: FakeSlack) -> None:
    sessions = postgres_sessions
    run_id = slack_run(sessions, slack)
    waits, calls = [], []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 2:
            stoppable_postgres.start()  # back after two refused tries

    with Corpus(llm_handler=interrupting_synthesis(stoppable_postgres.stop, calls)) as corpus:
        services = research_services(sessions, corpus, sleep)
        outcome = asyncio.run(run_and_deliver(run_id, services, slack_delivery(sessions, slack, run_id)))
    assert waits == [1.0, 2.0] and outcome == DeliveryOutcome.DELIVERED
    assert fetch(sessions, run_id).attempt == 1 and len(calls) == 1
    assert_delivered_once_with_findings(sessions, slack, run_id)
