"""Warnings a newcomer's read of real services found wrong (the review of c959ce6): each is a
program shaped like the service that misled, with the problem (or its absence) planted, and the
warning it must or must not get."""

from __future__ import annotations

import threading

import anyio
import pytest
from anyio.streams.memory import MemoryObjectReceiveStream

import asyncflow

from .test_lints import _findings

# (autouse: this module's tests, too, start without the primitives of earlier tests)
from .test_lints import _no_primitives_of_earlier_tests as _no_primitives_of_earlier_tests

ITEMS = 600


def _write_line(line: str) -> int:
    return len(line)  # the file's write, on a worker thread


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_writer_awaiting_a_thread_for_each_item_does_not_busy_wait(backend: str) -> None:
    """An export's last stage: ``async for order in stream: await f.write(...)`` on an
    ``anyio.open_file``. Each item is a message received and a job awaited on a worker thread,
    and anyio checkpoints around both (a yield each, as ``sleep(0)`` does): about five short
    polls an item, sub-millisecond apart. It waits on something every time, so it does not
    spin, whatever the backend (on trio the thread's job is not seen: the messages alone
    account for its polls)."""

    @asyncflow.future(name="write_out")
    async def write_out(inp: MemoryObjectReceiveStream[str]) -> int:
        written = 0
        async with inp:
            async for line in inp:
                written += await anyio.to_thread.run_sync(_write_line, line)
        return written

    async def main() -> int:
        if backend == "asyncio":  # (anyio's worker threads, as asyncflow run counts them)
            asyncflow.instrument_executors()
        tx, rx = anyio.create_memory_object_stream[str](50)
        asyncflow.instrument_memory_stream(tx, rx, name="orders")
        result = 0

        async def read() -> None:
            nonlocal result
            result = await write_out(rx)

        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            async with tx:
                for i in range(ITEMS):
                    await tx.send(f"order {i}\n")
        return result

    with asyncflow.profile("export", format="none", port=None, sampling=1) as prof:
        written = anyio.run(main, backend=backend)
        assert written == sum(len(f"order {i}\n") for i in range(ITEMS))
        futures = {f.label: f for f in prof.snapshot().futures.futures}
        assert futures["write_out"].total_polls >= 3 * ITEMS  # (it yields many times an item)
        findings = _findings(prof)
    assert [f.message for f in findings if f.kind == "busy-wait"] == []


def test_a_pool_never_busy_at_once_is_not_saturated() -> None:
    """anyio's default worker threads (40) running a few microseconds' job at a time: a job
    waits longer to be handed to a thread than it runs, and that is all. A pool is saturated
    only once all its workers were busy at once; the same jobs behind a limiter of one are."""

    def tiny() -> int:
        return 1

    async def main(limiter: anyio.CapacityLimiter | None) -> int:
        asyncflow.instrument_executors()
        total = 0
        for _ in range(50):
            total += await anyio.to_thread.run_sync(tiny, limiter=limiter)
        return total

    async def crowded() -> int:
        limiter = anyio.CapacityLimiter(1)
        asyncflow.instrument_executors()
        results: list[int] = []

        async def one() -> None:
            results.append(await anyio.to_thread.run_sync(_slow_job, limiter=limiter))

        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(one)
        return sum(results)

    with asyncflow.profile("pool", format="none", port=None, sampling=1) as prof:
        assert anyio.run(main, None) == 50
        idle = [f for f in _findings(prof) if f.kind == "executor-saturated"]
        assert anyio.run(crowded) == 8
        busy = [f for f in _findings(prof) if f.kind == "executor-saturated"]
    assert idle == []
    assert [f.evidence["max_workers"] for f in busy] == [1]


def _slow_job() -> int:
    threading.Event().wait(0.01)  # a synchronous client's call: its thread waits
    return 1
