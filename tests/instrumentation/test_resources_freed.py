"""An instrumented primitive made per request is freed when its last reference goes (issue 26).

uvicorn makes an ``asyncio.Event`` per request, httpcore an anyio ``Event`` (an
``asyncio.Event`` inside). Hooks set on the instance hold the event, which holds them: every such
event was garbage for the cyclic collector, whose extra collections cost a FastAPI service about
45 µs a request. In whole-program mode an instrumented ``asyncio.Event`` records through hooks
on its class instead, and goes with its last reference, as without asyncflow.
"""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest

import asyncflow
from asyncflow.instrumentation import resources


@pytest.fixture
def no_cyclic_collector() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


async def _use(event: Any) -> None:
    """Wait for the event in a task while it is set (a timed wait), then once more, set."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(event.wait)
        await asyncio.sleep(0)
        event.set()
    await event.wait()


def _inner(event: Any) -> Any:
    """The asyncio.Event that carries the hooks: the event itself, or anyio's inside it."""
    return event if isinstance(event, asyncio.Event) else event._event


@pytest.mark.parametrize("make", [asyncio.Event, anyio.Event], ids=["asyncio", "anyio"])
async def test_an_event_made_per_request_is_freed_by_its_last_reference(
    make: Callable[[], Any], no_cyclic_collector: None
) -> None:
    with asyncflow.profile("freed", format="none", port=None), asyncflow.instrument_locks():
        event = make()
        await _use(event)
        record = resources.resource_of(event)
        assert record is not None
        assert (record.stats.sets, record.stats.wait_count) == (1, 1)
        assert resources.acquisitions(record) == 0
        refs = [weakref.ref(event), weakref.ref(_inner(event))]
        del event
        assert [ref() for ref in refs] == [None, None]


async def test_an_event_keeps_recording_after_whole_program_mode_ends() -> None:
    with asyncflow.profile("freed", format="none", port=None):
        with asyncflow.instrument_locks():
            event = asyncio.Event()
        assert asyncio.Event.wait is resources._EVENT_WAIT
        assert asyncio.Event.set is resources._EVENT_SET
        await _use(event)
        event.clear()
        record = resources.resource_of(event)
        assert record is not None
        assert (record.stats.sets, record.stats.clears, record.stats.immediate) == (1, 1, 1)


async def test_an_event_made_outside_whole_program_mode_is_left_alone() -> None:
    with asyncflow.profile("freed", format="none", port=None):
        with asyncflow.instrument_locks():
            pass
        event = asyncio.Event()
        await _use(event)
        assert resources.resource_of(event) is None


class _MyEvent(asyncio.Event):
    pass


async def test_an_event_subclass_made_in_whole_program_mode_works_after_it_ends() -> None:
    with asyncflow.profile("freed", format="none", port=None):
        with asyncflow.instrument_locks():
            event = _MyEvent()
        await _use(event)
        event.clear()
        record = resources.resource_of(event)
        assert record is not None
        assert (record.stats.sets, record.stats.clears, record.stats.wait_count) == (1, 1, 1)


async def _use_lock(lock: Any) -> None:
    """Take the lock, once while another task waits for it (a timed wait and hold), then once
    alone; a condition is notified too."""
    async with anyio.create_task_group() as tg:
        await lock.acquire()
        tg.start_soon(lock.acquire)
        await asyncio.sleep(0)
        lock.release()
    lock.release()
    async with lock:
        if isinstance(lock, asyncio.Condition):
            lock.notify_all()


_LOCKS: list[Callable[[], Any]] = [
    asyncio.Lock,
    lambda: asyncio.Semaphore(1),
    asyncio.Condition,
]


@pytest.mark.parametrize("make", [asyncio.Lock, asyncio.Condition], ids=["lock", "condition"])
async def test_a_lock_made_per_request_is_freed_by_its_last_reference(
    make: Callable[[], Any], no_cyclic_collector: None
) -> None:
    with asyncflow.profile("freed", format="none", port=None), asyncflow.instrument_locks():
        lock = make()
        await _use_lock(lock)
        record = resources.resource_of(lock)
        assert record is not None
        assert (resources.acquisitions(record), resources.releases(record)) == (3, 3)
        assert (record.stats.contended, record.stats.wait_count) == (1, 1)
        refs = [weakref.ref(lock)]
        del lock
        assert [ref() for ref in refs] == [None]


@pytest.mark.parametrize("make", _LOCKS, ids=["lock", "semaphore", "condition"])
async def test_a_lock_keeps_recording_after_whole_program_mode_ends(
    make: Callable[[], Any],
) -> None:
    with asyncflow.profile("freed", format="none", port=None):
        with asyncflow.instrument_locks():
            lock = make()
        assert asyncio.Lock.acquire is resources._LOCK_ACQUIRE
        assert asyncio.Semaphore.acquire is resources._SEMAPHORE_ACQUIRE
        await _use_lock(lock)
        record = resources.resource_of(lock)
        assert record is not None
        assert (resources.acquisitions(record), resources.releases(record)) == (3, 3)
        assert (record.stats.contended, record.stats.wait_count) == (1, 1)
        if isinstance(lock, asyncio.Condition):
            assert record.stats.notifies == 1
