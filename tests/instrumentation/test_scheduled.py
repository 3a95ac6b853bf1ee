"""Scheduled time: a task's wait from its wake-up (handed to its loop) to the poll it leads to,
per call and per future, exact on a fake clock, on both hot paths."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import asyncflow
from asyncflow.clock import FakeClock
from asyncflow.instrumentation import futures
from asyncflow.schema import FutureEntry
from tests.support.snapshots import future_calls, future_entry

_future, _calls = future_entry, future_calls


async def test_exact_scheduled_time_of_a_woken_task(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    go = asyncio.Event()

    @asyncflow.future(name="sched_waiter")
    async def waiter() -> None:
        await go.wait()

    task = asyncio.create_task(waiter())  # its first step is handed to the loop now
    fake_clock.advance(2_000)  # ... and waits 2 us before the loop runs it
    await asyncio.sleep(0)
    go.set()  # its wake-up is handed to the loop now
    fake_clock.advance(7_000_000)  # the loop is held 7 ms before it can run it
    await task

    snap = prof.snapshot()
    entry = _future(snap, "sched_waiter")
    assert (entry.scheduled_ns, entry.scheduled_polls) == (7_002_000, 2)
    assert entry.max_scheduled_ns == 7_000_000
    assert entry.scheduled_delay_ns["p99"] == 7_000_000  # within a bucket, at most the max
    assert entry.scheduled_ns <= entry.idle_ns + 2_000  # the wake-ups' waits are idle time
    assert [c.scheduled_ns for c in _calls(snap, "sched_waiter")] == [7_002_000]


async def test_a_loop_held_by_another_task_makes_a_woken_call_wait(
    prof: asyncflow.Profiler,
) -> None:
    """Real time: the waiter is woken while another task holds the loop for 50 ms; its
    scheduled time is at least that, and the holder's own is not."""
    go = asyncio.Event()

    @asyncflow.future(name="sched_woken")
    async def woken() -> None:
        await go.wait()

    @asyncflow.future(name="sched_holder")
    async def holder() -> None:
        go.set()
        time.sleep(0.05)  # holds the loop: the woken call's wake-up waits in the ready queue

    task = asyncio.create_task(woken())
    await asyncio.sleep(0)
    await asyncio.create_task(holder())
    await task

    entry = _future(prof.snapshot(), "sched_woken")
    assert entry.scheduled_polls == 2
    assert entry.max_scheduled_ns >= 50_000_000
    assert entry.scheduled_ns >= 50_000_000
    assert _future(prof.snapshot(), "sched_holder").max_scheduled_ns < 50_000_000


async def test_whole_program_mode_measures_every_task(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    go = asyncio.Event()

    async def sched_plain() -> None:
        await go.wait()

    with asyncflow.instrument_tasks():
        task = asyncio.create_task(sched_plain())
        await asyncio.sleep(0)
        go.set()
        fake_clock.advance(3_000)
        await task
    entry = _future(
        prof.snapshot(), "test_whole_program_mode_measures_every_task.<locals>.sched_plain"
    )
    assert (entry.scheduled_ns, entry.scheduled_polls) == (3_000, 2)


async def test_a_call_awaited_in_its_callers_task_has_none(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    """Only a task's own call is woken by the loop: one awaited inside another call's poll is
    resumed by that poll, whose task is the one woken."""

    @asyncflow.future(name="sched_inner")
    async def inner() -> None:
        await asyncio.sleep(0)

    @asyncflow.future(name="sched_outer")
    async def outer() -> None:
        await inner()

    await outer()
    assert _future(prof.snapshot(), "sched_outer").scheduled_polls == 1  # (the first one)
    entry = _future(prof.snapshot(), "sched_inner")
    assert (entry.scheduled_ns, entry.scheduled_polls, entry.scheduled_delay_ns) == (0, 0, {})


async def test_call_soon_is_asyncios_again_after_the_profile() -> None:
    original = asyncio.BaseEventLoop.__dict__["call_soon"]
    with asyncflow.profile("sched", format="none"):
        assert asyncio.BaseEventLoop.__dict__["call_soon"] is futures._hook
        ran: list[int] = []
        handle = asyncio.get_running_loop().call_soon(ran.append, 1)
        assert isinstance(handle, asyncio.Handle)
        await asyncio.sleep(0)
        assert ran == [1]
    assert asyncio.BaseEventLoop.__dict__["call_soon"] is original


async def test_a_task_stepping_again_waits_behind_the_others(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    """``sleep(0)``: the task hands its own next step to the loop as its poll ends, and it
    waits behind what was queued before it."""

    @asyncflow.future(name="sched_stepper")
    async def stepper() -> None:
        await asyncio.sleep(0)

    @asyncflow.future(name="sched_other")
    async def other() -> None:
        fake_clock.advance(5_000)

    tasks = [asyncio.create_task(stepper()), asyncio.create_task(other())]
    await asyncio.gather(*tasks)
    entry = _future(prof.snapshot(), "sched_stepper")
    assert (entry.scheduled_ns, entry.scheduled_polls, entry.max_scheduled_ns) == (5_000, 2, 5_000)


async def test_pythons_own_task_is_measured_too(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    go = asyncio.Event()

    @asyncflow.future(name="sched_pytask")
    async def waiter() -> None:
        await go.wait()

    task = asyncio.tasks._PyTask(waiter())  # type: ignore[attr-defined]
    await asyncio.sleep(0)
    go.set()
    fake_clock.advance(4_000)
    await task
    entry = _future(prof.snapshot(), "sched_pytask")
    assert (entry.scheduled_ns, entry.scheduled_polls) == (4_000, 2)


async def test_a_call_soon_the_program_set_meanwhile_stays() -> None:
    original = asyncio.BaseEventLoop.__dict__["call_soon"]

    def programs(self: asyncio.BaseEventLoop, *args: object, **kwargs: object) -> object:
        return original(self, *args, **kwargs)

    try:
        with asyncflow.profile("sched", format="none"):
            setattr(asyncio.BaseEventLoop, "call_soon", programs)  # noqa: B010
        assert asyncio.BaseEventLoop.__dict__["call_soon"] is programs
    finally:
        setattr(asyncio.BaseEventLoop, "call_soon", original)  # noqa: B010


def test_uvloop_schedules_with_its_own_call_soon() -> None:
    """uvloop's loop has a call_soon of its own, which asyncflow does not replace: its tasks'
    scheduled time stays 0, as the docs say, and nothing else changes."""
    uvloop = pytest.importorskip("uvloop")

    async def main() -> FutureEntry:
        go = asyncio.Event()

        @asyncflow.future(name="sched_uvloop")
        async def waiter() -> int:
            await go.wait()
            return 3

        with asyncflow.profile("sched", format="none") as prof:
            task = asyncio.create_task(waiter())
            await asyncio.sleep(0)
            go.set()
            assert await task == 3
            return _future(prof.snapshot(), "sched_uvloop")

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        entry = runner.run(main())
    assert (entry.total_polls, entry.scheduled_ns, entry.scheduled_polls) == (2, 0, 0)


async def test_a_handles_source_traceback_is_the_programs_in_debug_mode() -> None:
    """In asyncio's debug mode a handle keeps where it was scheduled from: the program's line,
    never asyncflow's call_soon, with or without a profiler."""
    loop = asyncio.get_running_loop()
    loop.set_debug(True)

    def scheduled_here() -> str:
        handle = loop.call_soon(print)
        handle.cancel()
        frame = handle._source_traceback[-1]  # type: ignore[attr-defined]
        return f"{frame.name}: {frame.line}"

    assert scheduled_here() == "scheduled_here: handle = loop.call_soon(print)"
    with asyncflow.profile("sched", format="none"):
        assert scheduled_here() == "scheduled_here: handle = loop.call_soon(print)"


def test_no_reference_is_leaked_by_the_stamp(prof: asyncflow.Profiler) -> None:
    """Wake-ups stamped (a task's first step, its own next step, a wake-up by a future, a
    callback that is no task's, with and without keywords) leave the reference counts and the
    number of live objects as they were, GC off."""
    import gc
    import sys

    result = object()

    @asyncflow.future(name="sched_leak")
    async def job() -> object:
        await asyncio.sleep(0)
        fut = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(fut.set_result, result)
        return await fut

    async def rounds(n: int) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(n):
            assert await asyncio.create_task(job()) is result
            loop.call_soon(len, "", context=None)

    def counts() -> tuple[int, int]:
        prof.snapshot()
        gc.collect()
        return sys.getrefcount(result), len(gc.get_objects())

    asyncio.run(rounds(20))
    before = counts()
    gc.disable()
    try:
        asyncio.run(rounds(300))
        after_no_gc = sys.getrefcount(result)
    finally:
        gc.enable()
    after = counts()
    assert after_no_gc == before[0]
    # (fewer objects is no leak: an earlier test's garbage may go meanwhile)
    assert after[0] == before[0] and after[1] - before[1] < 50, (before, after)
    assert _future(prof.snapshot(), "sched_leak").scheduled_polls == 320 * 3  # every poll


async def test_a_misused_call_soon_says_so_as_asyncios_does() -> None:
    loop = asyncio.get_running_loop()
    with pytest.raises(TypeError) as plain:
        loop.call_soon(len, "", end="")  # type: ignore[call-arg]
    with asyncflow.profile("sched", format="none"), pytest.raises(TypeError) as profiled:
        loop.call_soon(len, "", end="")  # type: ignore[call-arg]
    assert str(profiled.value) == str(plain.value)


def test_the_long_waits_bucket_is_bucket_ofs() -> None:
    """Waits between SMALL_LIMIT and ~67 ms are bucketed by the small table, shifted (the
    pure-Python path's cheaper count): exactly bucket_of()'s bucket, at every power of two's
    edges and between."""
    from asyncflow.stats import SMALL_BUCKET, SMALL_LIMIT, bucket_of

    shift, limit, offset = futures._MID_SHIFT, futures._MID_LIMIT, futures._MID_OFFSET
    edges = [1 << b for b in range(16, limit.bit_length())]
    values = [v + d for v in edges for d in (-1, 0, 1, 1023, 1024, 1025)] + [limit - 1]
    values += list(range(SMALL_LIMIT, 4 * SMALL_LIMIT, 7))
    for ns in values:
        if SMALL_LIMIT <= ns < limit:
            assert SMALL_BUCKET[ns >> shift] + offset == bucket_of(ns), ns


class _CountingLoop(asyncio.SelectorEventLoop):
    """A program's loop that overrides the parts asyncio's call_soon calls."""

    scheduled = 0
    checked = 0

    def _check_closed(self) -> None:
        self.checked += 1
        super()._check_closed()  # type: ignore[misc]

    def _call_soon(self, callback: Any, args: Any, context: Any) -> asyncio.Handle:
        self.scheduled += 1
        return super()._call_soon(callback, args, context)  # type: ignore[misc,no-any-return]


def test_a_loops_own_parts_of_call_soon_still_run_out_of_debug_mode() -> None:
    """Out of debug mode the pure-Python stand-in runs asyncio's call_soon inlined: a loop's
    overrides of what that calls still run, as often as unprofiled, and the wait is measured."""

    async def steps() -> int:
        for _ in range(5):
            await asyncio.sleep(0)
        return 7

    def run(profiled: bool) -> tuple[int, int, int]:
        loop = _CountingLoop()
        try:

            async def main() -> int:
                loop.set_debug(False)
                if not profiled:
                    return await asyncio.create_task(steps())
                with asyncflow.profile("sched", format="none") as prof:
                    handle = asyncflow.instrument_tasks()
                    try:
                        result = await asyncio.create_task(steps())
                    finally:
                        handle.undo()
                    entry = _future(
                        prof.snapshot(),
                        "test_a_loops_own_parts_of_call_soon_still_run_out_of_debug_mode.<locals>.steps",
                    )
                    assert entry.scheduled_polls == 6
                return result

            before = loop.scheduled, loop.checked
            result = loop.run_until_complete(main())
            return result, loop.scheduled - before[0], loop.checked - before[1]
        finally:
            loop.close()

    plain, profiled = run(False), run(True)
    assert plain[0] == profiled[0] == 7
    # the profile's own start and stop schedule a few callbacks of their own: at least as many
    assert profiled[1] >= plain[1] > 0 and profiled[2] >= plain[2] > 0


def test_a_closed_loop_refuses_call_soon_as_asyncios_does() -> None:
    loop = asyncio.new_event_loop()
    loop.close()
    with pytest.raises(RuntimeError) as plain:
        loop.call_soon(print)
    with asyncflow.profile("sched", format="none"), pytest.raises(RuntimeError) as profiled:
        loop.call_soon(print)
    assert str(profiled.value) == str(plain.value) == "Event loop is closed"


async def test_a_method_of_another_object_scheduled_first_leaves_tasks_stamped(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    """The compiled stamp remembers the type of the latest callback owner that was no task, to
    ask no isinstance() of the next; a task of a Task subclass, made by a program's factory,
    is still a task, whatever was scheduled before it."""

    class Owner:
        def ping(self) -> None:
            pass

    class MyTask(asyncio.Task):  # type: ignore[type-arg]
        pass

    async def sched_sub() -> None:
        for _ in range(3):
            await asyncio.sleep(0)
            fake_clock.advance(1_000)

    loop = asyncio.get_running_loop()
    loop.set_task_factory(lambda loop, coro, **kw: MyTask(coro, loop=loop, **kw))
    try:
        with asyncflow.instrument_tasks():
            owner = Owner()
            for _ in range(3):
                loop.call_soon(owner.ping)  # a method of no task's, asked about once
            task = asyncio.create_task(sched_sub())
            assert type(task) is MyTask
            await task
    finally:
        loop.set_task_factory(None)
    entry = _future(
        prof.snapshot(),
        "test_a_method_of_another_object_scheduled_first_leaves_tasks_stamped.<locals>.sched_sub",
    )
    assert entry.scheduled_polls == 4  # the first step and each of the three wake-ups


async def test_a_call_an_untracked_task_awaits_is_woken_as_the_tasks_own(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    """A task whose coroutine is not tracked (filtered out, or made before the tracking) and
    awaits a tracked call through untracked frames: its wake-ups resume that call, the first
    tracked one of its task, whose scheduled time they are (from its first wake-up: the task's
    first step runs untracked code first)."""
    go = asyncio.Event()

    @asyncflow.future(name="sched_awaited")
    async def awaited() -> None:
        await go.wait()

    async def middle() -> None:  # (untracked: no decorator, no task factory)
        await awaited()

    async def outer() -> None:
        await middle()

    task = asyncio.create_task(outer())
    await asyncio.sleep(0)
    go.set()
    fake_clock.advance(4_000)  # the loop is held 4 us before it runs the wake-up
    await task
    entry = _future(prof.snapshot(), "sched_awaited")
    assert (entry.scheduled_ns, entry.scheduled_polls) == (4_000, 1)


async def test_an_anyio_task_group_tasks_call_is_woken_as_the_tasks_own(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    """anyio 4.14 and later run each task group task in ``TaskHandle._run_coro()``, which
    awaits the coroutine given to ``start_soon``; whole-program mode tracks that call (the
    task's name), not anyio's wrapper. The stages of an anyio pipeline read their scheduled
    time as asyncio tasks' own calls do."""
    import anyio

    started, go = anyio.Event(), anyio.Event()

    @asyncflow.future(name="sched_anyio")
    async def waiter() -> None:
        started.set()
        await go.wait()

    with asyncflow.instrument_tasks():
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await started.wait()
            go.set()
            fake_clock.advance(6_000)  # the loop is held 6 us before it runs the wake-up
    entry = _future(prof.snapshot(), "sched_anyio")
    assert (entry.scheduled_ns, entry.scheduled_polls) == (6_000, 1), entry
