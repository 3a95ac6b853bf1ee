"""anyio's Lock takes ownership and then yields (a checkpoint): that yield is part of the hold,
and tasks queued behind another's acquire did not wait on the lock (issue 26).

Twelve tasks that hold a lock for no time, beside a task that keeps the loop busy, read no
waits with asyncio.Lock (the holder never yields while holding it); with anyio's Lock they must
read the same, not the loop's lag as lock waits. A holder that awaits while holding it is
contention with either lock.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable
from typing import Any

import anyio
import pytest

import asyncflow
from asyncflow.schema import ResourceEntry
from asyncflow.views import lints

ROUNDS = 5
TASKS = 12


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


async def _program(
    make_lock: Callable[[], Any], hold: float
) -> tuple[ResourceEntry, list[lints.Finding]]:
    """TASKS tasks take the lock ROUNDS times each (holding it ``hold`` seconds across an
    await, or for no time), while another task keeps the loop busy 5 ms a step."""
    gc.collect()  # earlier tests' locks are freed by the cyclic GC only: gone, not listed
    with asyncflow.profile("anyio-lock", format="none", port=None) as prof:
        lock = asyncflow.instrument_lock(make_lock(), name="shared")
        done = asyncio.Event()

        async def cpu() -> None:
            while not done.is_set():
                _busy(0.005)
                await asyncio.sleep(0)

        @asyncflow.future(name="worker")  # tracked, as under asyncflow run
        async def worker() -> None:
            for _ in range(ROUNDS):
                async with lock:
                    if hold:
                        await asyncio.sleep(hold)
                await asyncio.sleep(0.001)

        with anyio.fail_after(30):
            spinner = asyncio.create_task(cpu())
            await asyncio.gather(*(worker() for _ in range(TASKS)))
            done.set()
            await spinner
        snapshot = prof.snapshot()
    assert snapshot.resources is not None
    live = [r for r in snapshot.resources.resources if r.label == "shared" and r.state == "active"]
    (entry,) = live
    assert entry.acquisitions == entry.releases == ROUNDS * TASKS
    found = lints.evaluate(lints.documents_of(snapshot), lints.Thresholds())
    return entry, [f for f in found if f.kind == "lock-contention"]


@pytest.mark.parametrize("make_lock", [asyncio.Lock, anyio.Lock], ids=["asyncio", "anyio"])
async def test_a_lock_held_for_no_time_reads_no_waits(make_lock: Callable[[], Any]) -> None:
    entry, findings = await _program(make_lock, hold=0)
    assert (entry.contended_acquisitions, entry.waits, entry.total_wait_ns) == (0, 0, 0)
    assert entry.max_waiters == 0
    assert not findings


async def test_anyio_checkpoint_after_acquire_is_held() -> None:
    """The hold of an uncontended acquisition begins when the lock is taken, before anyio's
    checkpoint: beside a task that holds the loop 5 ms a step, each hold lasts about a step."""
    entry, _ = await _program(anyio.Lock, hold=0)
    assert entry.timed_holds == entry.holds == ROUNDS * TASKS
    assert entry.total_hold_ns >= ROUNDS * TASKS * 1_000_000  # each ~5 ms; allow a loaded box


@pytest.mark.parametrize("make_lock", [asyncio.Lock, anyio.Lock], ids=["asyncio", "anyio"])
async def test_awaiting_while_holding_is_contention_with_either_lock(
    make_lock: Callable[[], Any],
) -> None:
    entry, findings = await _program(make_lock, hold=0.002)
    assert entry.contended_acquisitions >= lints.Thresholds().contention_min_waits
    assert entry.total_wait_ns > 2 * entry.total_hold_ns
    assert [f.subject.label for f in findings] == ["shared"]
