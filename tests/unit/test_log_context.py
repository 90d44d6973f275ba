"""The run's log context: each run's lines carry its own id and details, in its tasks and threads, and nowhere else."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator

import pytest

from bot.logs import JsonLogFormatter
from ops.log_context import (
    RunContextFilter,
    current_run_context,
    describe_run,
    logged_as_run,
    run_log_context,
    set_run_phase,
)


class Lines(logging.Handler):
    """Keeps each record as the JSON line LOG_FORMAT=json would write, run context included."""

    def __init__(self) -> None:
        super().__init__()
        self.addFilter(RunContextFilter())
        self.setFormatter(JsonLogFormatter())
        self.lines: list[dict[str, object]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(self.format(record)))


@pytest.fixture
def lines() -> Iterator[Lines]:
    handler = Lines()
    logger = logging.getLogger("deepthread.test.log_context")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.propagate = True


log = logging.getLogger("deepthread.test.log_context")


def test_runs_sharing_one_loop_each_tag_their_own_lines_in_child_tasks_and_threads(lines: Lines) -> None:
    both_started = asyncio.Event()
    started: list[int] = []

    async def run(run_id: int, workspace: str) -> None:
        with run_log_context(run_id):
            describe_run(conversation_id=run_id * 10, platform="slack", workspace=workspace)
            started.append(run_id)
            if len(started) == 2:
                both_started.set()
            await both_started.wait()  # both runs are bound before either logs: the contexts must not mix
            log.info("in the run's task")
            await asyncio.gather(asyncio.create_task(_log_in_child_task()), asyncio.to_thread(log.info, "in a thread"))

    async def both() -> None:
        await asyncio.gather(run(1, "T1"), run(2, "T2"))

    asyncio.run(both())
    assert len(lines.lines) == 6
    for line in lines.lines:
        assert (line["conversation_id"], line["workspace"], line["platform"]) == \
            (line["run_id"] * 10, f"T{line['run_id']}", "slack"), line  # type: ignore[operator]
    assert sorted(line["run_id"] for line in lines.lines) == [1, 1, 1, 2, 2, 2]


async def _log_in_child_task() -> None:
    log.info("in a child task")


def test_a_phase_set_in_one_task_shows_on_the_lines_of_the_runs_other_tasks(lines: Lines) -> None:
    async def run() -> None:
        with run_log_context(7):
            phase_set = asyncio.Event()

            async def lease_keeper() -> None:  # started before the phase, like the runner's lease renewal
                await phase_set.wait()
                log.info("renewed the lease")

            keeper = asyncio.create_task(lease_keeper())
            set_run_phase("fetch")
            phase_set.set()
            await keeper

    asyncio.run(run())
    assert [(line["run_id"], line.get("phase")) for line in lines.lines] == [(7, "fetch")]


def test_lines_outside_a_run_carry_no_run_fields(lines: Lines) -> None:
    with run_log_context(3):
        set_run_phase("search")
    describe_run(platform="slack")  # outside a run: nothing to describe, no error
    set_run_phase("verify")
    log.info("between runs")
    assert current_run_context() is None
    assert set(lines.lines[0]) == {"time", "level", "logger", "thread", "message"}


def test_binding_the_run_already_bound_keeps_its_details_for_the_outer_layer(lines: Lines) -> None:
    @logged_as_run
    def execute(*, run_id: int) -> None:  # the runner, inside the Celery task that bound the run first
        describe_run(conversation_id=5, platform="discord", workspace="G1")

    with run_log_context(4):
        execute(run_id=4)
        log.info("the task succeeded")
    assert lines.lines[0]["platform"] == "discord" and lines.lines[0]["run_id"] == 4


def test_logged_as_run_tags_functions_and_coroutine_functions_by_their_run_id(lines: Lines) -> None:
    class Runtime:
        @logged_as_run
        def run(self, run_id: int) -> str:
            log.info("sync")
            return asyncio.run(work(run_id + 1))

    @logged_as_run
    async def work(run_id: int) -> str:
        log.info("async")
        return "done"

    assert Runtime().run(11) == "done"
    assert [line["run_id"] for line in lines.lines] == [11, 12]
    assert current_run_context() is None
