"""A run's lease is kept from a thread of its own: a blocked runs loop cannot let it lapse, and a lost lease stops the
attempt without a write. SQLite in a file (the keeper's thread and the attempt each take a connection)."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Callable

import httpx
import pytest
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from research.budget import CancelToken, ResearchOptions
from research.engine import ResearchTools
from research.llm import LLMClient
from research.providers import SearchConfig
from storage.leases import HeldLease
from storage.models import Message, Run
from tests.attempts import admitted_run, execute_stored
from tests.fakes.llm import ChatRequest, FakeLLM, HandlerResult, default_research_model
from tests.fakes.resolver import DictResolver
from worker.leases import LEASE_LOST, LeaseKeeper
from worker.runner import RunnerServices

LEASE_SECONDS = 0.6
# Longest the test waits for something that should happen within a lease or two.
PATIENCE_SECONDS = 20.0


@pytest.fixture
def sessions(file_sessions: sessionmaker[Session]) -> sessionmaker[Session]:
    return file_sessions


def lease_of(sessions: sessionmaker[Session], run_id: int) -> tuple[int, dt.datetime | None]:
    with sessions() as session:
        run = session.get_one(Run, run_id)
        return run.attempt, run.lease_until


def services_with(sessions: sessionmaker[Session], handler: Callable[[ChatRequest], HandlerResult], *,
                  latency: float = 0.0) -> RunnerServices:
    """A chat run's services whose model answers with `handler` (called on the runs' event loop) after `latency`."""
    model = FakeLLM(handler, latency=latency)
    nowhere = httpx.AsyncClient(transport=httpx.MockTransport(lambda request: httpx.Response(404)))
    tools = ResearchTools(llm=LLMClient(model.config(), http_client=model.http_client()), search_config=SearchConfig(),
                          search_http=nowhere, resolver=DictResolver({}))
    return RunnerServices(sessions=sessions, tools=tools, options=ResearchOptions(), lease_seconds=LEASE_SECONDS)


def block_until(condition: Callable[[], bool]) -> bool:
    """Block the calling thread (here: the runs' event loop) until `condition` holds; whether it did in time."""
    deadline = time.monotonic() + PATIENCE_SECONDS
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


def test_the_lease_is_renewed_while_the_runs_event_loop_is_blocked(sessions: sessionmaker[Session]) -> None:
    """The model's answer holds the runs' loop (nothing else on it can run) until the lease has been renewed three
    times, several lease lengths in all; the attempt then finishes and stores its outcome."""
    run_id = admitted_run(sessions, mode="chat")
    renewals: list[dt.datetime] = []

    def renewed_three_times() -> bool:
        until = lease_of(sessions, run_id)[1]
        if until is not None and (not renewals or until > renewals[-1]):
            renewals.append(until)
        return len(renewals) >= 4  # the lease taken by the attempt, then three renewals

    def answer_holding_the_loop(request: ChatRequest) -> HandlerResult:
        blocked_through = block_until(renewed_three_times)
        assert blocked_through, f"the lease was renewed {len(renewals) - 1} times while the loop was blocked"
        return default_research_model(request)

    final = asyncio.run(execute_stored(run_id, services_with(sessions, answer_holding_the_loop)))

    assert len(renewals) >= 4
    assert final is not None and final.state == "done"
    with sessions() as session:
        run = session.get_one(Run, run_id)
        assert (run.state, run.attempt, run.lease_owner) == ("done", 1, None)


def test_an_attempt_whose_lease_passes_to_another_stops_and_writes_nothing(sessions: sessionmaker[Session]) -> None:
    """While the model takes its time, the reaper gives the run to a second attempt: the keeper's next pass stops the
    first, which stores neither an outcome nor the bot's reply; the run stays the second attempt's."""
    run_id = admitted_run(sessions, mode="chat")
    services = services_with(sessions, default_research_model, latency=PATIENCE_SECONDS)

    def pass_the_run_on_once_started() -> None:
        assert block_until(lambda: lease_of(sessions, run_id)[0] == 1)
        with sessions.begin() as session:
            session.execute(update(Run).where(Run.id == run_id).values(attempt=Run.attempt + 1, lease_owner="worker-b"))

    async def attempt() -> tuple[str | None, object]:
        cancel = CancelToken()
        reaper = asyncio.create_task(asyncio.to_thread(pass_the_run_on_once_started))
        final = await execute_stored(run_id, services, cancel=cancel)
        await reaper
        return cancel.cancelled_by, final

    started = time.monotonic()
    stopped_by, final = asyncio.run(attempt())

    assert (stopped_by, final) == (LEASE_LOST, None)
    assert time.monotonic() - started < PATIENCE_SECONDS, "stopped by the keeper, not by the model's answer"
    with sessions() as session:
        run = session.get_one(Run, run_id)
        assert (run.state, run.attempt, run.lease_owner, run.report_json) == ("running", 2, "worker-b", None)
        assert session.scalar(select(func.count()).select_from(Message).where(Message.role == "assistant")) == 0


def test_one_pass_renews_every_held_lease_and_stops_only_the_lost_ones(sessions: sessionmaker[Session]) -> None:
    first, second = admitted_run(sessions, mode="chat", thread="1.0"), admitted_run(sessions, mode="chat", thread="2.0")
    with sessions.begin() as session:
        for run_id in (first, second):
            session.execute(update(Run).where(Run.id == run_id).values(state="running", attempt=1,
                                                                        lease_owner=f"owner-{run_id}"))
    keeper = LeaseKeeper(sessions, LEASE_SECONDS, interval=3600)  # passes run only when the test asks

    async def hold_both() -> tuple[CancelToken, CancelToken]:
        kept, lost = CancelToken(), CancelToken()
        with keeper.keeping(HeldLease(first, 1, f"owner-{first}"), kept), \
                keeper.keeping(HeldLease(second, 1, "someone-else"), lost):
            await asyncio.to_thread(keeper.renew)
            await asyncio.sleep(0)  # the cancel is delivered in this loop
        return kept, lost

    before = lease_of(sessions, first)[1]
    kept, lost = asyncio.run(hold_both())
    keeper.stop()
    assert not kept.cancelled and lease_of(sessions, first)[1] != before
    assert lost.cancelled_by == LEASE_LOST


def test_a_lease_whose_run_just_ended_in_its_attempt_is_let_go_not_reported_lost(
        sessions: sessionmaker[Session], caplog: pytest.LogCaptureFixture) -> None:
    """The attempt stored its outcome (the run ended, its owner cleared) and has not left `keeping` yet, its loop
    busy: a renewal pass in between neither stops it nor warns; a run passed to another attempt still is lost."""
    ended, taken = admitted_run(sessions, mode="chat", thread="1.0"), admitted_run(sessions, mode="chat", thread="2.0")
    with sessions.begin() as session:
        session.execute(update(Run).where(Run.id == ended).values(state="done", attempt=1, lease_owner=None,
                                                                   lease_until=None))
        session.execute(update(Run).where(Run.id == taken).values(state="running", attempt=2, lease_owner="worker-b"))
    keeper = LeaseKeeper(sessions, LEASE_SECONDS, interval=3600)

    async def hold_both() -> tuple[CancelToken, CancelToken]:
        finishing, superseded = CancelToken(), CancelToken()
        with keeper.keeping(HeldLease(ended, 1, "worker-a"), finishing), \
                keeper.keeping(HeldLease(taken, 1, "worker-a"), superseded):
            await asyncio.to_thread(keeper.renew)
            await asyncio.sleep(0)
        return finishing, superseded

    with caplog.at_level("WARNING", logger="worker.leases"):
        finishing, superseded = asyncio.run(hold_both())
    keeper.stop()
    assert not finishing.cancelled
    assert superseded.cancelled_by == LEASE_LOST
    assert [record.getMessage() for record in caplog.records] == [f"run {taken} attempt 1 lost its lease; stopping it"]


def test_a_lease_is_known_held_without_a_query_only_while_lately_granted(sessions: sessionmaker[Session]) -> None:
    """`holds` answers from what the keeper saw: true from the lease's taking (or a renewal) for two thirds of a lease,
    then false until the next renewal; false when the taking's time is unknown, a renewal found it lost, or the block
    was left. A status edit skips its ownership query only while it is true."""
    run_id, other = admitted_run(sessions, mode="chat", thread="1.0"), admitted_run(sessions, mode="chat", thread="2.0")
    with sessions.begin() as session:
        session.execute(update(Run).where(Run.id == run_id).values(state="running", attempt=1, lease_owner="worker-a"))
        session.execute(update(Run).where(Run.id == other).values(state="running", attempt=2, lease_owner="worker-b"))
    now = [100.0]
    keeper = LeaseKeeper(sessions, 30.0, interval=3600, clock=lambda: now[0])
    mine, lost, unknown = HeldLease(run_id, 1, "worker-a"), HeldLease(other, 1, "worker-a"), HeldLease(other, 3, "x")

    async def hold() -> list[bool]:
        seen = []
        with keeper.keeping(mine, CancelToken(), taken_at=now[0] - 1), keeper.keeping(lost, CancelToken(), taken_at=now[0]), \
                keeper.keeping(unknown, CancelToken()):
            seen += [keeper.holds(mine), keeper.holds(lost), keeper.holds(unknown)]
            now[0] += 19.5  # 20.5 s since the taking: two thirds of 30 s passed
            seen.append(keeper.holds(mine))
            await asyncio.to_thread(keeper.renew)  # granted again now (the other one is found lost)
            seen += [keeper.holds(mine), keeper.holds(lost)]
        seen.append(keeper.holds(mine))
        return seen

    assert asyncio.run(hold()) == [True, True, False, False, True, False, False]
    keeper.stop()
