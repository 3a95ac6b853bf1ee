"""The collector's wake-ups: one timer ticks the loop monitor and drains, at their own paces."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator

import pytest

from asyncflow import collector, monitor
from asyncflow.collector import DRAIN_INTERVAL, Collector
from asyncflow.config import resolve_options
from asyncflow.instrument import _session, loops


@pytest.fixture
def col() -> Iterator[Collector]:
    """A collector that no profiler drives: the test wakes it, by calling ``tick``."""
    made = Collector(_session.Session(0, 0), resolve_options("test", {}))
    yield made
    made.monitor.stop()  # its monitor hears of new loops until then


def watch_only(monkeypatch: pytest.MonkeyPatch, *watched: asyncio.AbstractEventLoop) -> None:
    """The instrumented loops are ``watched`` alone (not those other tests left alive)."""
    records = [loops.LoopRecord(loop, id(loop)) for loop in watched]
    monkeypatch.setattr(monitor, "loop_registry", lambda: records)


def drains_of(col: Collector, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The tick numbers (from 1) on which ``col`` drained, appended as it drains."""
    drained: list[int] = []
    ticks = [0]
    original_tick, original_drain = col.tick, col.drain

    def tick() -> float:
        ticks[0] += 1
        return original_tick()

    def drain() -> int:
        drained.append(ticks[0])
        return original_drain()

    monkeypatch.setattr(col, "tick", tick)
    monkeypatch.setattr(col, "drain", drain)
    return drained


async def test_a_watched_loop_is_ticked_every_interval_and_drained_every_drain_interval(
    col: Collector, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop = asyncio.get_running_loop()
    watch_only(monkeypatch, loop)
    drained = drains_of(col, monkeypatch)
    interval = col.monitor.interval
    per_drain = round(DRAIN_INTERVAL / interval)
    assert per_drain == 2  # the default threshold: a tick every 25 ms, a drain every 50 ms
    delays = []
    for _ in range(3 * per_drain):
        delays.append(col.tick())
        (state,) = col.monitor.states.values()
        assert state.pending, "each tick posts the loop's heartbeat"
        state.beat(state.token)  # the loop runs it, on time
    assert delays == [interval] * len(delays)
    assert drained == [1, 3, 5]  # the first wake drains, then every DRAIN_INTERVAL of wakes


@pytest.mark.parametrize("threshold", [0.02, 0.06, 0.12, 0.2])
async def test_a_finished_call_waits_no_longer_than_the_drain_interval(
    threshold: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    options = resolve_options("test", {"block_threshold": threshold})
    made = Collector(_session.Session(0, 0), options)
    try:
        watch_only(monkeypatch, asyncio.get_running_loop())
        drained = drains_of(made, monkeypatch)
        delays = [made.tick() for _ in range(40)]  # delays[k]: the wait after tick k + 1
    finally:
        made.monitor.stop()
    assert set(delays) == {made.monitor.interval}
    assert drained[0] == 1
    for last, following in itertools.pairwise(drained):
        assert sum(delays[last - 1 : following - 1]) <= DRAIN_INTERVAL + 1e-9


def test_with_no_loop_open_to_watch_the_thread_wakes_only_to_drain(
    col: Collector, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop = asyncio.new_event_loop()  # instrumented, not running yet: watched all the same
    watch_only(monkeypatch, loop)
    drained = drains_of(col, monkeypatch)
    assert col.tick() == col.monitor.interval  # to post its heartbeat once it runs
    loop.close()
    assert [col.tick(), col.tick()] == [DRAIN_INTERVAL, DRAIN_INTERVAL]
    assert drained == [1, 2, 3]
    watch_only(monkeypatch)
    assert col.tick() == DRAIN_INTERVAL


async def test_a_running_loop_registered_while_none_is_watched_wakes_the_thread_at_once(
    col: Collector, monkeypatch: pytest.MonkeyPatch
) -> None:
    woken: list[str] = []
    col.monitor.on_watch = lambda: woken.append("now")
    watch_only(monkeypatch)
    col.tick()
    assert not col.monitor.watching
    record = loops.LoopRecord(asyncio.get_running_loop(), 0)
    _session.active = col.session  # a profiler is running
    try:
        col.monitor._registered(record)
        assert woken == ["now"], "the next tick would have been a drain interval away"
        col.monitor._registered(record)  # its thread became known: ticking already
    finally:
        _session.active = None
    assert woken == ["now"]


def test_the_early_wake_ticks_now_and_stops_with_the_collector(
    col: Collector, monkeypatch: pytest.MonkeyPatch
) -> None:
    watch_only(monkeypatch)
    loop = asyncio.new_event_loop()

    def timers() -> list[asyncio.TimerHandle]:
        return [t for t in loop._scheduled if not t.cancelled()]  # type: ignore[attr-defined]

    try:
        col.start(loop)
        loop.call_soon(loop.stop)
        loop.run_forever()  # the first wake: no loop to watch, the next a drain interval away
        (first,) = timers()
        assert first.when() - loop.time() == pytest.approx(DRAIN_INTERVAL, abs=0.01)
        col._wake_now()  # a loop to watch was registered: the wake is now, and one timer left
        (second,) = timers()
        assert first.cancelled() and second is not first
        col.stop()
        assert timers() == []
        col._wake_now()  # a wake posted before the stop schedules nothing
        assert timers() == []
    finally:
        loop.close()


def test_a_failing_drain_is_counted_and_the_wakes_go_on(
    col: Collector, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> int:
        raise RuntimeError("folding failed")

    monkeypatch.setattr(col, "drain", broken)
    watch_only(monkeypatch)
    before = _session.errors.count
    assert col.tick() == DRAIN_INTERVAL
    assert col.tick() == DRAIN_INTERVAL
    assert _session.errors.count == before + 2
    assert _session.errors.last == "collecting: RuntimeError: folding failed"


def test_the_drain_interval_is_read_when_it_ticks(
    col: Collector, monkeypatch: pytest.MonkeyPatch
) -> None:
    watch_only(monkeypatch)
    monkeypatch.setattr(collector, "DRAIN_INTERVAL", 3600)
    assert col.tick() == 3600
