"""Observing reads no frame's ``f_locals``: on 3.11 and 3.12 reading them stores a snapshot of
the locals on the frame, which keeps alive what the code deleted (anyio's ``del self  # Break
the reference cycle``), so a failed task's exception waited for the cyclic collector.

On 3.13 ``f_locals`` is a write-through proxy (PEP 667) that stores nothing: there these tests
pass either way, and still check that what the locals were read for is found.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

import asyncflow
from asyncflow.instrumentation import resources
from asyncflow.model import monitor, waits


class _Done(Exception):
    pass


@pytest.fixture
def no_cyclic_gc() -> Iterator[None]:
    """Only reference counts free objects while the test runs."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def _failing() -> None:
    raise _Done


async def _exception_of_a_failed_anyio_task() -> weakref.ref[_Done]:
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_failing)
    except* _Done as excs:
        (done,) = excs.exceptions
        assert isinstance(done, _Done)
        ref = weakref.ref(done)
        del done
    return ref


async def test_a_failed_anyio_task_leaves_no_reference_cycle(no_cyclic_gc: None) -> None:
    # As anyio's test_exception_refcycles_parent_task: the exception is freed by reference
    # counting alone, with tasks tracked as without.
    assert (await _exception_of_a_failed_anyio_task())() is None
    with asyncflow.profile("anyio-cycles", format="none"), asyncflow.instrument_tasks():
        assert (await _exception_of_a_failed_anyio_task())() is None


async def test_a_tracked_anyio_task_is_still_named_by_its_own_function() -> None:
    with asyncflow.profile("anyio-names", format="none") as prof, asyncflow.instrument_tasks():
        async with anyio.create_task_group() as tg:
            tg.start_soon(asyncio.sleep, 0)
            tg.start_soon(_named_by_me)
        snap = prof.snapshot()
    labels = {f.label for f in snap.futures.futures}
    assert any(label.endswith("_named_by_me") for label in labels)
    assert not any("TaskHandle._run_coro" in label for label in labels)


async def _named_by_me() -> None:
    await asyncio.sleep(0)


async def test_the_waits_walk_keeps_nothing_a_waiting_frame_holds() -> None:
    q: asyncio.Queue[int] = asyncflow.instrument_queue(asyncio.Queue(), name="inbox")
    lock = asyncflow.instrument_lock(asyncio.Lock(), name="door")
    getter = asyncio.create_task(q.get())
    sleeper = asyncio.create_task(asyncio.sleep(30))
    await lock.acquire()
    locker = asyncio.create_task(lock.acquire())
    await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    before = sys.getrefcount(q), sys.getrefcount(lock)
    walked = [waits.walk_task(t, 0, None, 0, loop.time()) for t in (getter, sleeper, locker)]
    # Nothing of the frames' locals kept: a snapshot of Queue.get's (or Lock.acquire's) locals
    # stored on its frame held the queue (the lock) until the task ended.
    assert (sys.getrefcount(q), sys.getrefcount(lock)) == before
    got, slept, locked = (w.entry.waits_on for w in walked)
    assert got is not None and (got.kind, got.label) == ("queue_get", "inbox")
    assert slept is not None and slept.kind == "sleep" and slept.remaining_ns
    assert 29e9 < slept.remaining_ns <= 30e9
    assert locked is not None and (locked.kind, locked.label) == ("lock", "door")
    for task in (getter, sleeper, locker):
        task.cancel()
    await asyncio.gather(getter, sleeper, locker, return_exceptions=True)
    lock.release()


async def test_the_waits_walk_still_reads_every_waiting_site() -> None:
    # what the frames' locals were read for, found from what the coroutines hold
    release = threading.Event()
    other = asyncio.create_task(asyncio.sleep(30), name="other")

    def blocking() -> None:
        release.wait(10)

    async def grouped() -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(asyncio.sleep(30))
            group.create_task(asyncio.sleep(30))

    starts: dict[str, Any] = {
        "threaded": asyncio.to_thread(blocking),
        "timed": asyncio.wait_for(other, 30),
        "waiting": asyncio.wait([other, asyncio.create_task(asyncio.sleep(0))]),
        "grouped": grouped(),
    }
    tasks = {name: asyncio.create_task(coro, name=name) for name, coro in starts.items()}
    try:
        for _ in range(5):
            await asyncio.sleep(0)
        loop = asyncio.get_running_loop()
        found = {
            name: waits.walk_task(task, 0, None, 0, loop.time()).entry.waits_on
            for name, task in tasks.items()
        }
        described = {name: w.description for name, w in found.items() if w is not None}
        assert described == {
            "threaded": "to_thread(test_the_waits_walk_still_reads_every_waiting_site.<locals>"
            ".blocking)",
            "timed": "wait_for task other",
            "waiting": "asyncio.wait on 1 of 2",
            "grouped": "task group of 2 tasks",
        }
    finally:
        release.set()
        for task in [*tasks.values(), other]:
            task.cancel()
        await asyncio.gather(*tasks.values(), other, return_exceptions=True)


def _in_selector(thread: threading.Thread) -> bool:
    frame = sys._current_frames().get(thread.ident or 0)
    back = frame.f_back if frame is not None else None
    return back is not None and back.f_code.co_name == "_run_once"


def test_the_loop_monitor_keeps_nothing_the_loops_frame_holds() -> None:
    loop = asyncio.new_event_loop()
    other = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        for _ in range(1000):  # until its thread waits in the selector, which it then does
            if _in_selector(thread):  # until a callback comes
                break
            threading.Event().wait(0.01)
        else:
            pytest.fail("the loop's thread never waited in its selector")
        before = sys.getrefcount(loop)
        assert monitor.sample_loop(thread.ident or 0, loop).idle
        assert not monitor.sample_loop(thread.ident or 0, other).idle  # not that loop
        # a snapshot of _run_once's locals stored on its frame held the loop (and what the
        # frame deletes) for as long as the selector waited
        assert sys.getrefcount(loop) == before
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
        other.close()


class _Marker:
    pass


class _LabelledLock(asyncio.Lock):
    def __init__(self) -> None:
        marker = _Marker()
        self.marker = weakref.ref(marker)
        super().__init__()  # instrumented here, by asyncio.Lock's __init__ of whole-program mode
        del marker
        self.kept = self.marker() is not None


class _LabelledQueue(asyncio.Queue[int]):
    def __init__(self) -> None:
        marker = _Marker()
        self.marker = weakref.ref(marker)
        super().__init__()
        del marker
        self.kept = self.marker() is not None


def test_labelling_a_new_primitive_or_queue_keeps_nothing_its_creator_holds(
    no_cyclic_gc: None,
) -> None:
    with asyncflow.instrument_locks(), asyncflow.instrument_queues():
        line = sys._getframe().f_lineno
        lock = _LabelledLock()
        queue = _LabelledQueue()
    # a snapshot of __init__'s locals, stored on its frame when the label was worked out, kept
    # what __init__ deleted until __init__ returned
    assert not lock.kept and not queue.kept
    # a subclass's own __init__ is no part of the label: the line that made the object is
    record = resources.resource_of(lock)
    assert record is not None and record.label == f"test_frame_locals.py:{line + 1}"
    channel: Any = getattr(queue, "_asyncflow_channel", None)
    assert channel is not None and channel.label == f"test_frame_locals.py:{line + 2}"
