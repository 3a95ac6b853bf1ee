"""CPU time and allocations per poll: opt-in, exact on fake clocks, free and absent when off."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import pytest

import asyncflow
from asyncflow import clock, cpu
from asyncflow.config import resolve_options
from asyncflow.instrument import probes
from asyncflow.report import render_table

MS = 1_000_000


class FakeCpu:
    """A thread CPU clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def fake_cpu() -> FakeCpu:
    return FakeCpu()


def _poll_figures(prof: asyncflow.Profiler) -> cpu.PollFigures:
    collector = prof._collector
    assert collector is not None and collector.poll_figures is not None
    return collector.poll_figures


@asyncflow.future(name="stuck")
async def stuck(fake: clock.FakeClock, cpu_clock: FakeCpu, polls: int) -> str:
    """Each poll holds the loop 40 ms (fake) and uses 2 ms of CPU (fake)."""
    for i in range(polls):
        fake.advance(40 * MS)
        cpu_clock.now += 2 * MS
        if i < polls - 1:
            await asyncio.sleep(0)
    return "done"


async def test_cpu_time_per_poll_is_exact_and_names_a_poll_off_the_cpu(
    fake_clock: clock.FakeClock, fake_cpu: FakeCpu
) -> None:
    with asyncflow.profile("cpu", format="none", port=None, cpu=True) as prof:
        _poll_figures(prof)._thread_time = fake_cpu
        with anyio.fail_after(10):
            assert await stuck(fake_clock, fake_cpu, 3) == "done"
        snap = prof.snapshot()
    (entry,) = [f for f in snap.futures.futures if f.label == "stuck"]
    assert entry.busy_ns == 120 * MS and entry.allocations is None
    c = entry.cpu
    assert c is not None
    assert (c.polls, c.busy_ns, c.cpu_ns, c.off_cpu_ns) == (3, 120 * MS, 6 * MS, 114 * MS)
    assert (c.max_poll_cpu_ns, c.worst_poll_busy_ns) == (2 * MS, 40 * MS)
    assert c.worst_poll_cpu_ns == 2 * MS
    (log,) = [g for g in snap.future_logs if g.future_id == entry.id]
    (call,) = log.calls
    assert call.cpu_ns == 6 * MS and call.allocated_bytes is None
    assert c.worst_poll_call_id == call.call_id
    # 40 ms is under the long-poll threshold (100 ms): no warning yet; at 30 ms there is one.
    assert "off-cpu-poll" not in {w.kind for w in snap.warnings}
    with asyncflow.profile("cpu", format="none", port=None, cpu=True, warn="long_poll=0.03") as p2:
        _poll_figures(p2)._thread_time = fake_cpu
        await stuck(fake_clock, fake_cpu, 1)
        snap = p2.snapshot()
    (warning,) = [w for w in snap.warnings if w.kind == "off-cpu-poll"]
    line = stuck.__code__.co_firstlineno
    assert warning.message == (
        f"A poll of `stuck` (test_cpu_alloc.py:{line}) held the loop 40 ms but used 2 ms of "
        "CPU: it was blocked in a system call, waiting for the GIL, or not scheduled"
    )
    assert warning.evidence["busy_ns"] == 40 * MS and warning.evidence["cpu_ns"] == 2 * MS
    assert "off cpu" in render_table(snap, (50.0,), 0)


async def test_a_computing_poll_is_not_called_off_the_cpu(
    fake_clock: clock.FakeClock, fake_cpu: FakeCpu
) -> None:
    @asyncflow.future(name="busy")
    async def busy() -> None:
        fake_clock.advance(200 * MS)
        fake_cpu.now += 190 * MS

    with asyncflow.profile("cpu", format="none", port=None, cpu=True) as prof:
        _poll_figures(prof)._thread_time = fake_cpu
        await busy()
        snap = prof.snapshot()
    kinds = {w.kind for w in snap.warnings}
    assert "long-poll" in kinds and "off-cpu-poll" not in kinds


class FakeHeap:
    """tracemalloc.get_traced_memory, with a heap the test grows and shrinks."""

    def __init__(self) -> None:
        self.current = 10_000

    def __call__(self) -> tuple[int, int]:
        return self.current, self.current


async def test_allocations_per_poll_are_exact(fake_clock: clock.FakeClock) -> None:
    heap = FakeHeap()

    @asyncflow.future(name="grows")
    async def grows() -> None:
        heap.current += 5000  # first poll: 5000 bytes left allocated
        await asyncio.sleep(0)
        heap.current -= 3000  # second: 3000 released
        await asyncio.sleep(0)
        heap.current += 700

    with asyncflow.profile("alloc", format="none", port=None, allocations=True) as prof:
        figures = _poll_figures(prof)
        figures._traced = heap
        assert figures.cpu is False
        await grows()
        snap = prof.snapshot()
    (entry,) = [f for f in snap.futures.futures if f.label == "grows"]
    a = entry.allocations
    assert a is not None and entry.cpu is None
    assert (a.polls, a.allocated_bytes, a.freed_bytes, a.max_poll_bytes) == (3, 5700, 3000, 5000)
    (log,) = [g for g in snap.future_logs if g.future_id == entry.id]
    assert (log.calls[0].allocated_bytes, log.calls[0].freed_bytes) == (5700, 3000)
    assert log.calls[0].cpu_ns is None


async def test_tracemalloc_is_started_and_stopped_only_when_asyncflow_started_it() -> None:
    import tracemalloc

    assert not tracemalloc.is_tracing()
    with asyncflow.profile("alloc", format="none", port=None, allocations=True):
        assert tracemalloc.is_tracing()
    assert not tracemalloc.is_tracing()
    tracemalloc.start()
    try:
        with asyncflow.profile("alloc", format="none", port=None, allocations=True):
            pass
        assert tracemalloc.is_tracing()  # the program's own tracing is left alone
    finally:
        tracemalloc.stop()


async def test_off_by_default_and_no_probe_is_set() -> None:
    assert resolve_options("x", {}, {}).cpu is False
    assert resolve_options("x", {}, {}).allocations is False
    assert resolve_options("x", {}, {"ASYNCFLOW_CPU": "1"}).cpu is True
    explicit = resolve_options("x", {"allocations": False}, {"ASYNCFLOW_ALLOCATIONS": "yes"})
    assert explicit.allocations is False
    with pytest.raises(ValueError, match="ASYNCFLOW_CPU"):
        resolve_options("x", {}, {"ASYNCFLOW_CPU": "maybe"})
    with asyncflow.profile("off", format="none", port=None) as prof:
        assert probes.poll_probe() is None  # nothing runs around polls: the seam costs a check
        await asyncflow.instrument(asyncio.sleep(0))
        snap = prof.snapshot()
    assert all(f.cpu is None and f.allocations is None for f in snap.futures.futures)
    assert all(c.cpu_ns is None for log in snap.future_logs for c in log.calls)


async def test_the_probe_leaves_with_the_profiler() -> None:
    with asyncflow.profile("on", format="none", port=None, cpu=True, allocations=True):
        assert isinstance(probes.poll_probe(), cpu.PollFigures)
    assert probes.poll_probe() is None


async def test_beside_the_trace_recorder_both_see_every_poll(tmp_path: Any) -> None:
    with asyncflow.profile("both", format="none", port=None, cpu=True, trace=True) as prof:
        probe = probes.poll_probe()
        assert isinstance(probe, cpu.Composite) and isinstance(probe.inner, cpu.PollFigures)
        await asyncflow.instrument(_real_work())
        snap = prof.snapshot()
        trace = prof.trace()
    assert probes.poll_probe() is None  # each took its own back
    entry = next(f for f in snap.futures.futures if f.label == "_real_work")
    assert entry.cpu is not None and entry.cpu.polls == 2
    assert any(e.get("name") == "_real_work" for e in trace["traceEvents"])


async def _real_work() -> int:
    total = sum(range(10_000))
    await asyncio.sleep(0)
    return total


async def test_transparent_results_exceptions_and_cancellation() -> None:
    async def raises() -> None:
        await asyncio.sleep(0)
        raise KeyError("k")

    async def scenario() -> list[Any]:
        out: list[Any] = [await asyncflow.instrument(_real_work())]
        try:
            await asyncflow.instrument(raises())
        except KeyError as exc:
            out.append(repr(exc))
        task = asyncio.create_task(asyncflow.instrument(asyncio.sleep(10)))
        await asyncio.sleep(0)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            out.append("cancelled")
        return out

    plain = await scenario()
    with asyncflow.profile("t", format="none", port=None, cpu=True, allocations=True):
        with anyio.fail_after(10):
            measured = await scenario()
    assert measured == plain == [49995000, "KeyError('k')", "cancelled"]


def test_a_probe_that_fails_is_dropped_and_the_other_goes_on() -> None:
    class Broken:
        def begin(self, record: Any) -> Any:
            raise RuntimeError("broken probe")

        def end(self, *args: Any) -> None:
            raise AssertionError("end is not called after a failed begin")

    figures = cpu.PollFigures(cpu=True, allocations=False)
    both = cpu.Composite(Broken(), figures)

    class Record:
        call_id, max = 1, 0
        future = type("F", (), {"id": 7})()

    record = Record()
    token = both.begin(record)
    both.end(record, token, 0, 5, probes.SUSPENDED)
    assert both.outer is None and figures.futures[7].polls == 1
