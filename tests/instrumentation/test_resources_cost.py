"""What an instrumented primitive costs the program, counted rather than timed (issue 26).

On a real service the primitives' hooks ran per request: httpcore's pool and connection locks
(anyio) several times a request, uvicorn's per-request Event's ``set()``. Each asked asyncio for
the running loop (on 3.11 a ``getpid()`` system call) to find the running task; a primitive runs
on one loop, so its record keeps that loop and asks again only when it has no task running.
"""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import pytest

import asyncflow
from asyncflow.instrumentation import resources

USES = 50


@pytest.fixture
def loop_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the hooks' reads of asyncio's running loop."""
    reads = [0]
    original = asyncio.events._get_running_loop

    def counting() -> Any:
        reads[0] += 1
        return original()

    monkeypatch.setattr(resources, "_get_running_loop", counting)
    return reads


@pytest.mark.parametrize(
    "make",
    [anyio.Lock, lambda: anyio.Semaphore(2), asyncio.Lock, lambda: asyncio.Semaphore(2)],
    ids=["anyio.Lock", "anyio.Semaphore", "asyncio.Lock", "asyncio.Semaphore"],
)
async def test_a_primitive_used_again_does_not_ask_for_the_running_loop_again(
    make: Any, loop_reads: list[int]
) -> None:
    with asyncflow.profile("cost", format="none", port=None):
        primitive = asyncflow.instrument_lock(make(), name="pool")
        for _ in range(USES):
            async with primitive:
                pass
        record = resources.resource_of(primitive)
        assert record is not None
        assert resources.acquisitions(record) == resources.releases(record) == USES
    assert loop_reads[0] <= 1


async def test_an_event_set_again_does_not_ask_for_the_running_loop_again(
    loop_reads: list[int],
) -> None:
    with asyncflow.profile("cost", format="none", port=None):
        event = asyncflow.instrument_lock(asyncio.Event(), name="ready")
        for _ in range(USES):
            event.set()
            await event.wait()
            event.clear()
        record = resources.resource_of(event)
        assert record is not None
        assert (record.stats.sets, record.stats.clears) == (USES, USES)
    assert loop_reads[0] <= 1
