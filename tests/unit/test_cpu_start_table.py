"""The CPU pool's watchdog reads when and where a task started from memory its children write; a read torn by a child
writing meanwhile must never make it kill process 0 (the worker's whole process group: a worker vanished at a
thousand runs, with only "a CPU task ran past its 20.0 s limit; killing its process" in its log)."""

from __future__ import annotations

import multiprocessing
import os
import signal

import pytest

from research import cpu
from research.cpu import SupervisedPool, _StartTable


class ChildWritesOnFirstRead(list[int]):
    """A slot array whose first read of `slot` lets a child record its task there first (pid, time, token last)."""

    def __init__(self, table: _StartTable, slot: int, token: int, pid: int, started_at: float) -> None:
        super().__init__(table.tokens)
        self.table, self.slot, self.token, self.pid, self.started_at = table, slot, token, pid, started_at
        self.written = False

    def __getitem__(self, index):  # type: ignore[override]
        if index == self.slot and not self.written:
            self.written = True
            self.table.pids[self.slot] = self.pid
            self.table.started_at[self.slot] = self.started_at
            super().__setitem__(self.slot, self.token)
        return super().__getitem__(index)


def test_a_task_recorded_while_the_watchdog_reads_its_slot_is_seen_whole_or_not_at_all() -> None:
    table = _StartTable(multiprocessing.get_context("spawn"))
    token = 7
    table.tokens = ChildWritesOnFirstRead(table, token % cpu._START_TABLE_SLOTS, token, pid=4321, started_at=123.5)  # type: ignore[assignment]
    assert table.start_of(token) in (None, (4321, 123.5))
    assert table.start_of(token) == (4321, 123.5)


def test_a_slot_with_no_process_is_not_a_started_task() -> None:
    table = _StartTable(multiprocessing.get_context("spawn"))
    table.tokens[3] = 3  # a token with the slot's first pid and time (0, 0.0)
    assert table.start_of(3) is None


def test_the_watchdog_never_kills_a_process_group_or_its_own_process(monkeypatch: pytest.MonkeyPatch) -> None:
    killed: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: killed.append((pid, sig)))
    pool = SupervisedPool(1)
    try:
        for pid in (0, -1, os.getpid()):
            pool._retire(pool._generation, "timeout", kill_pid=pid)
    finally:
        monkeypatch.undo()
        pool.shutdown(wait=True)
    assert (0, signal.SIGKILL) not in killed and killed == []
