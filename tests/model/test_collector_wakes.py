"""How often the profiler's thread wakes: the collector's drain rides the loop monitor's ticks.

Each wake-up of the profiler's thread takes the GIL from the program (it is handed over: the
program's threads let it go until the thread waits again), so a drain on a timer of its own
beside the monitor's ticks cost a busy service a wake-up more, 20 times a second.
"""

from __future__ import annotations

import selectors
import threading

import pytest

import asyncflow
from asyncflow import profiler
from asyncflow.model.collector import Collector
from asyncflow.model.monitor import LoopMonitor

#: ticks to watch: about a second (no loop watched: a tick every 26 ms)
TICKS = 30


def test_the_drain_wakes_the_profilers_thread_no_more_than_the_monitors_ticks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ticks, drains, waits = [0], [0], [0]
    enough = threading.Event()
    tick, drain, make_selector = LoopMonitor.tick, Collector.drain, profiler._events_selector

    def counting_tick(self: LoopMonitor) -> None:
        ticks[0] += 1
        if ticks[0] >= TICKS:
            enough.set()
        tick(self)

    def counting_drain(self: Collector) -> int:
        drains[0] += 1
        return drain(self)

    def counting_selector() -> selectors.BaseSelector:
        selector = make_selector()
        select = selector.select

        def counted(timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
            if timeout is None or timeout > 0:  # the thread goes to sleep: it wakes after
                waits[0] += 1
            return select(timeout)

        selector.select = counted  # type: ignore[method-assign]
        return selector

    monkeypatch.setattr(LoopMonitor, "tick", counting_tick)
    monkeypatch.setattr(Collector, "drain", counting_drain)
    monkeypatch.setattr(profiler, "_events_selector", counting_selector)
    with asyncflow.profile("wakes", format="none", port=None):
        assert enough.wait(30), "the loop monitor did not tick"
        seen_ticks, seen_drains, seen_waits = ticks[0], drains[0], waits[0]
    # Every drain happened on a wake-up the monitor ticked on: the thread slept once a tick
    # (and once more at most, the start's and the stop's wake-ups aside).
    assert seen_drains >= TICKS // 4, (seen_drains, seen_ticks)
    assert seen_waits <= seen_ticks + 2, (seen_waits, seen_ticks, seen_drains)
