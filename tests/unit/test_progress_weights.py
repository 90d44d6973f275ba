"""The progress percent: weighted by what phases cost, moving through every phase, never backwards."""

from __future__ import annotations

import asyncio
from typing import Any

from research.engine import (
    PROGRESS_WEIGHTS,
    ROUND_PHASES,
    SYNTHESIS_TIME_CONSTANT,
    ProgressMeter,
    phase_progress,
    synthesis_progress,
)
from research.events import Progress
from tests.fakes.clock import FakeClock


def run_percents(rounds: int) -> list[float]:
    """The percent after each step of a run that uses all its rounds, in run order (no gap check after the last)."""
    percents = [phase_progress("decompose")]
    for round_number in range(1, rounds + 1):
        phases = ROUND_PHASES if round_number < rounds else ROUND_PHASES[:-1]
        percents.extend(phase_progress(phase, round_number=round_number, rounds=rounds) for phase in phases)
    percents.extend([phase_progress("synthesize", 0.0), phase_progress("synthesize"), phase_progress("verify")])
    return percents


def test_weights_share_out_the_whole_bar_and_synthesis_has_the_largest_share() -> None:
    assert sum(PROGRESS_WEIGHTS.values()) == 100
    assert max(PROGRESS_WEIGHTS, key=PROGRESS_WEIGHTS.__getitem__) == "synthesize"


def test_phase_bounds_are_decompose_5_gathering_45_synthesis_90_verify_100() -> None:
    assert phase_progress("decompose") == 5
    assert phase_progress("search", 0.0, round_number=1, rounds=3) == 5
    assert phase_progress("gap_check", round_number=3, rounds=3) == 45
    assert phase_progress("synthesize", 0.0) == 45
    assert phase_progress("synthesize") == 90
    assert phase_progress("verify") == 100


def test_percent_rises_at_every_step_of_every_round() -> None:
    for rounds in (1, 2, 3, 5):
        percents = run_percents(rounds)
        assert all(earlier < later for earlier, later in zip(percents, percents[1:])), (rounds, percents)


def test_a_round_gets_an_equal_slice_of_gathering_with_the_gap_check_inside_it() -> None:
    assert phase_progress("gap_check", round_number=1, rounds=2) == 25
    assert phase_progress("search", 0.0, round_number=2, rounds=2) == 25
    assert 5 < phase_progress("read", round_number=1, rounds=2) < phase_progress("gap_check", round_number=1, rounds=2)


def test_synthesis_progress_approaches_but_never_reaches_the_end_of_synthesis() -> None:
    assert synthesis_progress(0.0) == 45
    assert synthesis_progress(SYNTHESIS_TIME_CONSTANT) == 45 + 45 * (1 - 2.718281828459045 ** -1)
    seconds = [0.5, 1, 5, 15, 30, 60, 120, 600, 86_400]
    percents = [synthesis_progress(second) for second in seconds]
    assert all(earlier <= later for earlier, later in zip(percents, percents[1:]))
    assert all(round(percent, 1) < 90 for percent in percents)


class Recorded:
    """A sink that keeps the events it is sent."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    async def __call__(self, event: Any) -> None:
        self.events.append(event)

    @property
    def percents(self) -> list[float]:
        return [event.percent for event in self.events if isinstance(event, Progress)]


def test_meter_never_reports_a_percent_behind_the_last_one() -> None:
    sink = Recorded()
    meter = ProgressMeter(sink, lambda: {"results": 3})

    async def main() -> None:
        for percent in (5, 30, 25, 30, 30.04, 45, 120):
            await meter.reach(percent)

    asyncio.run(main())
    assert sink.percents == [5, 30, 45, 100]
    assert sink.events[0].counts == {"results": 3}


def test_meter_ticks_through_a_long_phase_and_stops_when_it_ends() -> None:
    clock = FakeClock()
    sink = Recorded()
    started = clock()
    ten_minutes_passed = asyncio.Event()

    async def sleep(seconds: float) -> None:
        await clock.sleep(seconds)
        if clock() - started >= 600:
            ten_minutes_passed.set()
        await asyncio.sleep(0)  # let the phase itself run between ticks, as a real sleep would

    meter = ProgressMeter(sink, dict, clock=clock, sleep=sleep)

    async def main() -> None:
        await meter.reach(45)
        async with meter.ticking(synthesis_progress):
            await ten_minutes_passed.wait()
        still_running = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        assert still_running == [], "the meter kept ticking after the phase ended"

    asyncio.run(main())
    assert set(clock.sleeps) == {1.0}
    ticked = sink.percents[1:]
    assert ticked[0] == round(synthesis_progress(1.0), 1)
    assert ticked[29] == round(synthesis_progress(30.0), 1)
    assert all(earlier < later for earlier, later in zip(sink.percents, sink.percents[1:]))
    assert max(sink.percents) < 90
