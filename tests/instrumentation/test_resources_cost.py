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


def _waiting(condition: asyncio.Condition) -> int:
    """Tasks inside ``condition.wait()``, not notified yet."""
    return sum(not w.done() for w in condition._waiters)


#: waiters of the herd, and the items each notify_all() is for
HERD, ITEMS = 20, 50


async def test_a_herds_wakeups_are_each_counted_and_a_sample_timed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A notify_all() herd (issue 28) wakes every waiter per item: each wake-up is counted, and,
    as holds are, only a sample of them is timed while they come close together, each standing
    for the wake-ups since the one timed before. The clock is read once a wake-up (when its wait
    began, for a wait given up), not twice, and the call waiting is asked for only when timed."""
    reads = [0]
    clock = asyncflow.clock.now_ns

    def counting() -> int:
        reads[0] += 1
        return clock()

    # (one in 8 timed, whatever the speed: the tests' profilers time everything)
    with asyncflow.profile("cost", format="none", port=None, sampling=8):
        condition = asyncflow.instrument_lock(asyncio.Condition(), name="wake-ups")
        items: list[int] = []

        async def consume() -> None:
            while True:
                async with condition:
                    await condition.wait_for(lambda: bool(items))
                    if items.pop() < 0:
                        return

        with anyio.fail_after(10):
            tasks = [asyncio.create_task(consume()) for _ in range(HERD)]
            monkeypatch.setattr(asyncflow.clock, "now_ns", counting)
            for item in [*range(ITEMS), *[-1] * HERD]:
                while items or _waiting(condition) < sum(not t.done() for t in tasks):
                    await asyncio.sleep(0)
                async with condition:
                    items.append(item)
                    condition.notify_all()
            await asyncio.gather(*tasks)
            monkeypatch.setattr(asyncflow.clock, "now_ns", clock)
        record = resources.resource_of(condition)
        assert record is not None
        st = record.stats
        woken = HERD * ITEMS + sum(range(1, HERD + 1))
        assert st.woken == st.wait_count == woken and st.wait_failed == 0
        # the timed wake-ups stand for every one up to the last timed, in every weighted figure
        timed_for = sum(st.wait_hist.values())
        assert timed_for == sum(e.wait_count for e in st.edges.values())
        assert woken - 4096 < timed_for <= woken
        assert 0 < st.wait_timed < woken / 4
        assert len(st.wait_log or ()) == min(st.wait_timed, resources.RESOURCE_LOG_SIZE)
    assert reads[0] < 1.5 * woken


#: tasks contending for a lock, and the times each takes it
CONTENDERS, TAKES = 20, 50


@pytest.mark.parametrize(
    "make", [asyncio.Lock, lambda: asyncio.Semaphore(2)], ids=["Lock", "Semaphore"]
)
async def test_contended_acquisitions_are_each_counted_and_a_sample_timed(make: Any) -> None:
    """A lock (or a pool's semaphore) that many tasks take in turn ends thousands of waits a
    second: each is counted, and, as holds are, only a sample is timed, each standing for those
    since the one timed before; the longest wait is always timed (one behind a 30 ms hold)."""
    with asyncflow.profile("cost", format="none", port=None, sampling=8):
        lock = asyncflow.instrument_lock(make(), name="taken in turn")

        async def take(hold: float) -> None:
            for _ in range(TAKES):
                async with lock:
                    await asyncio.sleep(hold)
                    hold = 0

        with anyio.fail_after(10):
            await asyncio.gather(take(0.03), *(take(0) for _ in range(CONTENDERS - 1)))
        record = resources.resource_of(lock)
        assert record is not None
        st = record.stats
        assert resources.acquisitions(record) == CONTENDERS * TAKES
        assert st.wait_count == st.contended and st.wait_failed == 0
        assert st.contended > CONTENDERS * TAKES / 2
        timed_for = sum(st.wait_hist.values())
        assert timed_for == sum(e.wait_count for e in st.edges.values()) == st.sampled_wait
        assert st.wait_count - 4096 < timed_for <= st.wait_count
        assert 0 < st.wait_timed < st.wait_count / 4
        if isinstance(lock, asyncio.Lock):  # (a semaphore's other permit goes round meanwhile)
            assert st.wait_max >= 30_000_000  # behind the long hold


async def test_events_passed_back_and_forth_are_each_counted_and_a_sample_timed() -> None:
    """Two tasks handing the turn to each other through two events: every wait is counted as a
    wake-up, and a sample of them timed; every set and clear is counted, and a sample logged."""
    turns = 2000
    with asyncflow.profile("cost", format="none", port=None, sampling=8):
        ping = asyncflow.instrument_lock(asyncio.Event(), name="ping")
        pong = asyncflow.instrument_lock(asyncio.Event(), name="pong")

        async def player(mine: asyncio.Event, theirs: asyncio.Event, first: bool) -> None:
            for _ in range(turns):
                if not first:
                    await mine.wait()
                    mine.clear()
                theirs.set()
                if first:
                    await mine.wait()
                    mine.clear()

        with anyio.fail_after(10):
            await asyncio.gather(player(ping, pong, True), player(pong, ping, False))
        for event in (ping, pong):
            record = resources.resource_of(event)
            assert record is not None
            st = record.stats
            assert st.sets == st.clears == turns
            assert st.woken + st.immediate == turns and st.wait_failed == 0
            assert st.wait_count == st.woken
            assert sum(st.wait_hist.values()) == st.sampled_wait <= st.wait_count
            assert 0 < st.wait_timed < st.wait_count / 4
            # its sets and clears: each counted, a sample logged and given to the call that made
            # it, standing for those since the one before
            assert st.signal_count == 2 * turns
            assert sum(e.signals for e in st.edges.values()) == st.sampled_signal
            assert st.signal_count - 8 < st.sampled_signal <= st.signal_count
            assert len(st.signal_log or ()) < turns / 4
