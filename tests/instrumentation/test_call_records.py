"""What a call's first poll reads (its loop and its task's name) and the records the compiled
path reuses: the same on both hot paths, whatever record a call gets."""

from __future__ import annotations

import asyncio
import gc
import os
import threading
from typing import Any

import pytest

import asyncflow
from asyncflow.instrumentation import futures
from asyncflow.instrumentation.futures import FutureRecord, call_field
from tests.support.compiled_path import compiled

_SET_WHEN_THEY_HAPPEN = (
    "task",
    "outcome",
    "exc_type",
    "exc_message",
    "result",
    "cancel_requests",
    "cancel_to_end",
    "cancel_outcome",
    "probe_data",
)


@compiled
def test_the_running_loop_is_asyncios_wherever_it_is_read() -> None:
    """3.11's compiled path reads asyncio's holder of the running loop instead of calling
    _get_running_loop() (a getpid() each time): the same loop in a loop, outside one, on
    another thread and in a forked child (where asyncio sees none)."""
    read = futures._speedups.running_loop
    assert read()[0] is None

    async def main() -> list[Any]:
        loop = asyncio.get_running_loop()
        seen: list[Any] = [read()[0] is loop, read()[0] is loop]
        other: list[Any] = []
        thread = threading.Thread(target=lambda: other.append(read()[0]))
        thread.start()
        thread.join(10)
        seen.append(other)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: asyncio's own answer and ours, then out at once
            try:
                os.write(w, repr((read()[0], asyncio.events._get_running_loop())).encode())
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r) as child:
            seen.append(child.read())
        os.waitpid(pid, 0)
        seen.append(read()[0] is loop)
        return seen

    assert asyncio.run(main()) == [True, True, [None], "(None, None)", True]
    assert read()[0] is None


class _NamedTask(asyncio.Task):  # type: ignore[type-arg]
    def get_name(self) -> str:
        return "named:" + super().get_name()


@pytest.mark.parametrize("factory", ["plain", "subclass"])
def test_each_call_notes_its_tasks_name(factory: str) -> None:
    @asyncflow.future
    async def inner() -> None:
        await asyncio.sleep(0)

    @asyncflow.future
    async def outer() -> None:
        await inner()
        await inner()

    async def main() -> list[str]:
        if factory == "subclass":
            asyncio.get_running_loop().set_task_factory(
                lambda loop, coro, **kw: _NamedTask(coro, loop=loop, **kw)
            )
        await asyncio.gather(
            asyncio.create_task(outer(), name="first"), asyncio.create_task(outer(), name="second")
        )
        return []

    with asyncflow.profile("names", format="none") as prof:
        asyncio.run(main())
        prof.snapshot()
        names = sorted(
            call_field(r, "task")
            for f in (outer.future_record, inner.future_record)  # type: ignore[attr-defined]
            for r in f.stats.recent
        )
    prefix = "named:" if factory == "subclass" else ""
    assert names == [f"{prefix}first"] * 3 + [f"{prefix}second"] * 3


@compiled
def test_a_reused_record_is_as_new() -> None:
    """Records freed are kept for the next calls (they are taken again: no allocation), and one
    taken again has no field of the call it recorded before (task, outcome, error, result,
    cancellation, probe data)."""
    future = FutureRecord("r", "m:r", "m.py", 1, True, "decorator")
    wrapper = futures._speedups.InstrumentedCoroutine

    async def fails() -> None:
        await asyncio.sleep(0)
        raise LookupError("gone")

    async def answers() -> str:
        return "x"

    async def sleeps() -> None:
        await asyncio.sleep(3600)

    async def main() -> None:
        with pytest.raises(LookupError):
            await wrapper(fails(), future)
        for _ in range(8):  # their records are freed below, for the fresh calls to take
            assert await wrapper(answers(), future) == "x"
        task = asyncio.create_task(wrapper(sleeps(), future))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with asyncflow.profile("reuse", format="none") as prof:
        asyncio.run(main())
        prof.snapshot()  # drained: no record waits in the collector's buffer
        assert not future.stats.live and future.stats.created == 10  # every call ended
        gc.disable()
        try:
            future.stats = futures._new_stats()  # the old records go with the old stats
            gc.collect()
            # Each call makes a coroutine and a wrapper, new objects for the cyclic GC, and a
            # record, which is not one when taken again from the free list (8 * 3 without it;
            # the profiler's thread may make an object or two meanwhile).
            fresh: list[Any] = []
            before = gc.get_count()[0]
            for _ in range(8):
                fresh.append(wrapper(answers(), future))
            assert 2 * 8 <= gc.get_count()[0] - before < 2 * 8 + 4
            for w in fresh:
                r = w._r
                assert all(call_field(r, name) is None for name in _SET_WHEN_THEY_HAPPEN)
                assert (r.polls, r.busy, r.max, r.first, r.finished, r.cancel_at) == (0,) * 6
                assert r.stats is future.stats and r.future is future
                w.close()
            assert future.stats.created == 8 and future.stats.closed == 8
        finally:
            gc.enable()
