"""Instrumented synchronisation primitives: exact figures on the fake clock, holders, logs,
anyio's own primitives, whole-program mode, bounded memory, and CPython's own lock tests."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import gc
import importlib.util
import inspect
import io
import os
import sys
import threading
import unittest
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import anyio
import pytest

import asyncflow
from asyncflow import clock
from asyncflow.clock import FakeClock
from asyncflow.instrumentation import _session, resources
from asyncflow.instrumentation.resources import (
    LockInstrumentation,
    ResourceRecord,
    instrument_lock,
    instrument_locks,
    resource_of,
)
from asyncflow.schema import ResourceEntry, ResourceLogs, ResourcesDocument, dumps, load
from asyncflow.views.resource_views import (
    find_resource,
    resource_entry,
    resource_flow,
    resource_logs,
)

MS = 1_000_000
_T = TypeVar("_T")


def _record(obj: object) -> ResourceRecord:
    record = resource_of(obj)
    assert record is not None, f"{obj!r} is not instrumented"
    return record


def _entry(prof: asyncflow.Profiler, obj: object) -> ResourceEntry:
    collector = prof._collector
    assert collector is not None
    labels: dict[int | None, str] = {f.id: f.label for f in collector.futures()}
    labels[None] = "(untracked)"
    entry = resource_entry(
        _record(obj), labels, clock.now_ns(), collector.session.start_ns, (50.0, 100.0)
    )
    # every entry survives the wire: serialised and loaded back, it is the same document
    assert load(ResourceEntry, __import__("orjson").loads(dumps(entry))) == entry
    return entry


def _logs(prof: asyncflow.Profiler, obj: object) -> ResourceLogs:
    collector = prof._collector
    assert collector is not None
    return resource_logs(_record(obj), collector.session.start_ns)


@pytest.fixture
def whole_program() -> Iterator[LockInstrumentation]:
    with instrument_locks() as handle:
        yield handle


# -- the public API --------------------------------------------------------------------------------


async def test_instrument_lock_returns_the_same_object_of_the_same_class() -> None:
    for make in (
        asyncio.Lock,
        asyncio.Semaphore,
        asyncio.BoundedSemaphore,
        asyncio.Condition,
        asyncio.Event,
        lambda: asyncio.Barrier(2),
    ):
        obj = make()
        assert instrument_lock(obj) is obj
        assert type(obj) is type(make())
        assert isinstance(obj, type(make()))
        assert repr(obj).startswith(f"<asyncio.locks.{type(obj).__name__} object at")
        if hasattr(obj, "acquire"):
            assert inspect.iscoroutinefunction(obj.acquire)
            assert asyncio.iscoroutinefunction(obj.acquire)
        record = _record(obj)
        assert instrument_lock(obj) is obj  # again: nothing changes
        assert _record(obj) is record
        instrument_lock(obj, name="renamed")
        assert record.label == "renamed"


async def test_instrument_lock_refuses_anything_else() -> None:
    import threading as _threading

    for bad in (object(), _threading.Lock(), asyncio.Queue(), 3, anyio.Condition()):
        with pytest.raises(TypeError, match=r"instrument_lock\(\) needs an asyncio Lock"):
            instrument_lock(bad)
    with pytest.raises(TypeError, match=r"instrument_lock\(name=\.\.\.\) must be a str"):
        instrument_lock(asyncio.Lock(), name=5)  # type: ignore[arg-type]


async def test_disabled_leaves_the_primitive_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCFLOW_DISABLE", "1")
    lock = asyncio.Lock()
    assert instrument_lock(lock) is lock
    assert resource_of(lock) is None
    with instrument_locks() as handle:
        assert not handle.active
        assert resource_of(asyncio.Lock()) is None


def test_two_threads_instrumenting_one_lock_register_it_once() -> None:
    lock = asyncio.Lock()
    start = threading.Barrier(8)

    def instrument() -> None:
        start.wait(5)
        instrument_lock(lock)

    threads = [threading.Thread(target=instrument) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    record = _record(lock)
    assert [r for r in resources.resource_registry() if r.target() is lock] == [record]

    async def use() -> None:
        async with lock:
            pass

    with asyncflow.profile("threads", format="none"):
        asyncio.run(use())
    assert resources.acquisitions(record) == 1  # one hook, not eight stacked


# -- exact figures ---------------------------------------------------------------------------------


async def test_a_contended_lock_has_exact_waits_holds_holders_and_logs(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    lock = instrument_lock(asyncio.Lock(), name="db")
    holding = asyncio.Event()
    go = asyncio.Event()

    @asyncflow.future(name="holder")
    async def holder() -> str:
        async with lock:
            holding.set()
            await go.wait()
            fake_clock.advance(5 * MS)
        return "held"

    @asyncflow.future(name="waiter")
    async def waiter() -> str:
        async with lock:
            fake_clock.advance(2 * MS)
        return "waited"

    with anyio.fail_after(5):
        first = asyncio.create_task(holder())
        await holding.wait()
        start = clock.now_ns()
        second = asyncio.create_task(waiter())
        await asyncio.sleep(0)  # the waiter now waits for the lock
        entry = _entry(prof, lock)
        assert entry.locked is True
        assert entry.waiters_now == 1
        (held,) = entry.holders
        assert (held.label, held.call_state, held.outcome) == ("holder", "suspended", None)
        assert held.since_ns == start - prof._collector.session.start_ns  # type: ignore[union-attr]
        go.set()
        assert list(await asyncio.gather(first, second)) == ["held", "waited"]

    entry = _entry(prof, lock)
    assert (entry.kind, entry.primitive, entry.state, entry.locked) == (
        "asyncio.Lock",
        "lock",
        "active",
        False,
    )
    assert (entry.acquisitions, entry.contended_acquisitions, entry.releases) == (2, 1, 2)
    assert (entry.waits, entry.failed_waits, entry.total_wait_ns, entry.max_wait_ns) == (
        1,
        0,
        5 * MS,
        5 * MS,
    )
    assert (entry.holds, entry.total_hold_ns, entry.max_hold_ns, entry.timed_holds) == (
        2,
        7 * MS,
        5 * MS,
        2,
    )
    assert entry.hold_ns["p100"] == 5 * MS
    assert (entry.waiters_now, entry.max_waiters, entry.holders) == (0, 1, [])
    by_label = {f.label: f for f in entry.futures}
    assert (by_label["holder"].holds, by_label["holder"].total_hold_ns) == (1, 5 * MS)
    assert by_label["holder"].waits == 0
    assert (by_label["waiter"].waits, by_label["waiter"].total_wait_ns) == (1, 5 * MS)
    assert (by_label["waiter"].holds, by_label["waiter"].total_hold_ns) == (1, 2 * MS)
    logs = _logs(prof, lock)
    assert [(e.duration_ns, e.outcome) for e in logs.wait_logs] == [(5 * MS, "acquired")]
    assert [(e.index, e.duration_ns, e.outcome) for e in logs.hold_logs] == [
        (1, 2 * MS, "released"),
        (0, 5 * MS, "released"),
    ]
    waiter_call = logs.wait_logs[0].call_id
    assert waiter_call is not None and logs.hold_logs[0].call_id == waiter_call


async def test_a_cancelled_wait_is_a_failed_wait_and_no_hold(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    lock = instrument_lock(asyncio.Lock())
    await lock.acquire()
    waiting = asyncio.create_task(lock.acquire())
    await asyncio.sleep(0)
    fake_clock.advance(3 * MS)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0):
            await lock.acquire()
    lock.release()
    entry = _entry(prof, lock)
    assert (entry.acquisitions, entry.contended_acquisitions, entry.releases) == (1, 0, 1)
    assert (entry.waits, entry.failed_waits, entry.max_wait_ns) == (2, 2, 3 * MS)
    assert [e.outcome for e in _logs(prof, lock).wait_logs] == ["cancelled", "cancelled"]
    assert not lock.locked()


async def test_semaphore_permits_and_who_holds_them(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    sem = instrument_lock(asyncio.BoundedSemaphore(2), name="pool")
    release = asyncio.Event()

    @asyncflow.future(name="user")
    async def user(n: int) -> int:
        async with sem:
            await release.wait()
        return n

    @asyncflow.future(name="leaky")
    async def leaky() -> None:
        await sem.acquire()
        raise ValueError("forgot to give the permit back")

    with anyio.fail_after(5):
        users = [asyncio.create_task(user(n)) for n in range(3)]
        await asyncio.sleep(0)
        entry = _entry(prof, sem)
        assert entry.permits is not None
        assert (entry.permits.initial, entry.permits.bound) == (2, 2)
        assert (entry.permits.available, entry.permits.held) == (0, 2)
        assert [h.label for h in entry.holders] == ["user", "user"]
        assert (entry.locked, entry.waiters_now) == (True, 1)
        fake_clock.advance(4 * MS)
        release.set()
        assert await asyncio.gather(*users) == [0, 1, 2]
        with pytest.raises(ValueError, match="forgot"):
            await asyncio.create_task(leaky())
    with pytest.raises(ValueError, match="released too many times"):
        for _ in range(3):
            sem.release()  # the first gives leaky's permit back; the second is one too many
    entry = _entry(prof, sem)
    assert (entry.acquisitions, entry.contended_acquisitions, entry.releases) == (4, 1, 4)
    assert (entry.waits, entry.total_wait_ns) == (1, 4 * MS)
    assert entry.permits is not None and entry.permits.held == 0
    assert entry.holders == []


async def test_a_permit_never_given_back_names_its_holder_and_how_it_ended(
    prof: asyncflow.Profiler,
) -> None:
    sem = instrument_lock(asyncio.Semaphore(3), name="connections")

    @asyncflow.future(name="leaky")
    async def leaky() -> None:
        await sem.acquire()
        raise ConnectionError("lost")

    with pytest.raises(ConnectionError), anyio.fail_after(5):
        await asyncio.create_task(leaky())  # a task of its own: the call is the holder
    entry = _entry(prof, sem)
    (holder,) = entry.holders
    assert (holder.label, holder.call_state, holder.outcome) == ("leaky", "ready", "raised")
    assert entry.permits is not None
    assert (entry.permits.available, entry.permits.held) == (2, 1)


async def test_a_release_by_another_task_ends_the_oldest_hold(prof: asyncflow.Profiler) -> None:
    sem = instrument_lock(asyncio.Semaphore(0))  # a semaphore used as a signal

    async def consumer() -> None:
        await sem.acquire()

    consumers = [asyncio.create_task(consumer()) for _ in range(2)]
    await asyncio.sleep(0)
    sem.release()
    sem.release()
    with anyio.fail_after(5):
        await asyncio.gather(*consumers)
    # Both releases came before the consumers' acquisitions returned: they ended no hold. The
    # third ends the oldest hold, whoever took it.
    sem.release()
    entry = _entry(prof, sem)
    assert (entry.acquisitions, entry.releases, entry.unmatched_releases) == (2, 3, 2)
    assert len(entry.holders) == 1


async def test_event_sets_clears_and_waits(fake_clock: FakeClock, prof: asyncflow.Profiler) -> None:
    event = instrument_lock(asyncio.Event(), name="ready")

    @asyncflow.future(name="wait_for_it")
    async def wait_for_it() -> bool:
        return await event.wait()

    @asyncflow.future(name="announce")
    async def announce() -> None:
        event.set()

    with anyio.fail_after(5):
        waiters = [asyncio.create_task(wait_for_it()) for _ in range(2)]
        await asyncio.sleep(0)
        entry = _entry(prof, event)
        assert entry.event is not None
        assert (entry.event.is_set, entry.event.sets, entry.waiters_now) == (False, 0, 2)
        fake_clock.advance(6 * MS)
        await asyncio.create_task(announce())
        assert await asyncio.gather(*waiters) == [True, True]
        assert await event.wait() is True  # set: returns at once
    event.clear()
    entry = _entry(prof, event)
    assert entry.event is not None
    assert (entry.event.is_set, entry.event.sets, entry.event.clears) == (False, 1, 1)
    assert entry.event.immediate_waits == 1
    assert (entry.waits, entry.total_wait_ns, entry.max_waiters) == (2, 12 * MS, 2)
    assert entry.locked is None and entry.permits is None
    by_label = {f.label: f for f in entry.futures}
    assert (by_label["announce"].signals, by_label["wait_for_it"].waits) == (1, 2)
    assert [e.outcome for e in _logs(prof, event).signal_logs] == ["clear", "set"]


async def test_an_event_nobody_sets_shows_its_waiters(prof: asyncflow.Profiler) -> None:
    event = instrument_lock(asyncio.Event(), name="never")
    waiting = asyncio.create_task(event.wait())
    await asyncio.sleep(0)
    entry = _entry(prof, event)
    assert entry.event is not None
    assert (entry.event.sets, entry.waiters_now, entry.waits) == (0, 1, 0)
    waiting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiting
    entry = _entry(prof, event)
    assert (entry.waits, entry.failed_waits, entry.waiters_now) == (1, 1, 0)


async def test_condition_waits_and_notifies(prof: asyncflow.Profiler) -> None:
    cond = instrument_lock(asyncio.Condition(), name="jobs")
    jobs: list[int] = []

    async def consumer() -> int:
        async with cond:
            await cond.wait_for(lambda: bool(jobs))
            return jobs.pop()

    with anyio.fail_after(5):
        consumers = [asyncio.create_task(consumer()) for _ in range(2)]
        await asyncio.sleep(0)
        async with cond:
            jobs.append(1)
            cond.notify()
        async with cond:
            jobs.append(2)
            cond.notify_all()
        assert sorted(await asyncio.gather(*consumers)) == [1, 2]
    entry = _entry(prof, cond)
    assert entry.condition is not None and entry.condition.notifies == 2
    assert entry.primitive == "condition"
    assert entry.waits >= 2  # each consumer waited at least once for its notification
    assert entry.acquisitions == entry.releases  # wait() releases and reacquires the lock
    assert [e.outcome for e in _logs(prof, cond).signal_logs] == ["notify_all", "notify"]


async def test_barrier_passes_and_abort(fake_clock: FakeClock, prof: asyncflow.Profiler) -> None:
    barrier = instrument_lock(asyncio.Barrier(2), name="phase")
    with anyio.fail_after(5):
        first = asyncio.create_task(barrier.wait())
        await asyncio.sleep(0)
        fake_clock.advance(MS)
        assert sorted([await barrier.wait(), await first]) == [0, 1]
        stuck = asyncio.create_task(barrier.wait())
        await asyncio.sleep(0)
        await barrier.abort()
        with pytest.raises(asyncio.BrokenBarrierError):
            await stuck
    entry = _entry(prof, barrier)
    assert entry.barrier is not None
    assert (entry.barrier.parties, entry.barrier.broken) == (2, True)
    assert (entry.barrier.passes, entry.barrier.broken_waits, entry.barrier.aborts) == (2, 1, 1)
    assert (entry.waits, entry.failed_waits) == (3, 1)
    assert max(e.duration_ns or 0 for e in _logs(prof, barrier).wait_logs) == MS


async def test_nothing_is_recorded_while_no_profiler_runs() -> None:
    lock = instrument_lock(asyncio.Lock())
    async with lock:
        pass
    record = _record(lock)
    assert resources.acquisitions(record) == 0
    assert record.stats.hold_count == 0


async def test_an_error_inside_asyncflow_never_reaches_the_program(
    prof: asyncflow.Profiler,
) -> None:
    lock = instrument_lock(asyncio.Lock())
    record = _record(lock)
    record.stats.edges = None  # type: ignore[assignment]  # a recorder gone wrong
    before = _session.errors.count
    async with lock:
        pass
    assert not lock.locked()
    assert _session.errors.count > before


async def test_a_new_session_starts_from_zero_but_keeps_the_holds_open(
    prof: asyncflow.Profiler,
) -> None:
    sem = instrument_lock(asyncio.Semaphore(2))
    async with sem:
        pass
    await sem.acquire()
    resources.reset_for_session()
    record = _record(sem)
    assert (record.stats.hold_count, record.stats.wait_count) == (0, 0)
    assert len(resources.holds_of(record)) == 1
    sem.release()
    assert (record.stats.hold_count, record.stats.unmatched) == (1, 0)


# -- anyio -----------------------------------------------------------------------------------------


async def test_anyio_lock_semaphore_limiter_and_event(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    lock = instrument_lock(anyio.Lock(), name="alock")
    sem = instrument_lock(anyio.Semaphore(1, max_value=1), name="asem")
    limiter = instrument_lock(anyio.CapacityLimiter(1), name="alimiter")
    event = instrument_lock(anyio.Event(), name="aevent")
    assert type(lock).__module__ == "anyio._backends._asyncio"  # the very same object

    async def use(primitive: Any) -> None:
        async with primitive:
            fake_clock.advance(MS)
            await anyio.sleep(0)

    with anyio.fail_after(5):
        for primitive in (lock, sem, limiter):
            async with anyio.create_task_group() as tg:
                tg.start_soon(use, primitive)
                tg.start_soon(use, primitive)
        async with anyio.create_task_group() as tg:
            tg.start_soon(event.wait)
            await anyio.sleep(0)
            event.set()
    for primitive, kind in ((lock, "anyio.Lock"), (sem, "anyio.Semaphore")):
        entry = _entry(prof, primitive)
        assert (entry.kind, entry.acquisitions, entry.releases) == (kind, 2, 2)
        assert (entry.contended_acquisitions, entry.waits) == (1, 1)
        assert entry.max_hold_ns >= MS and entry.holders == []
    entry = _entry(prof, limiter)
    assert (entry.kind, entry.primitive, entry.acquisitions, entry.releases) == (
        "anyio.CapacityLimiter",
        "capacity_limiter",
        2,
        2,
    )
    assert entry.permits is not None and (entry.permits.initial, entry.permits.available) == (1, 1)
    entry = _entry(prof, event)
    assert entry.kind == "anyio.Event" and entry.event is not None
    assert (entry.event.is_set, entry.event.sets, entry.waits) == (True, 1, 1)
    with pytest.raises(ValueError, match="released too many times"):
        sem.release()


async def test_anyio_cancelled_acquire_is_not_a_release(prof: asyncflow.Profiler) -> None:
    lock = instrument_lock(anyio.Lock())

    async def give_up() -> None:
        with anyio.move_on_after(0):
            await lock.acquire()  # waits, then is cancelled: neither held nor released

    async with lock, anyio.create_task_group() as tg:
        tg.start_soon(give_up)
    with anyio.CancelScope() as scope:
        scope.cancel()
        with contextlib.suppress(anyio.get_cancelled_exc_class()):
            await lock.acquire()  # cancelled before it could take the (free) lock
    entry = _entry(prof, lock)
    assert (entry.acquisitions, entry.releases, entry.unmatched_releases) == (1, 1, 0)
    assert (entry.waits, entry.failed_waits) == (1, 1)
    assert not lock.locked()


async def test_anyio_primitives_made_outside_a_loop_record_once_used(
    prof: asyncflow.Profiler,
) -> None:
    lock, event = await _outside_any_loop(lambda: (anyio.Lock(), anyio.Event()))
    assert type(lock).__name__ == "LockAdapter"
    instrument_lock(lock, name="module lock")
    instrument_lock(event, name="module event")
    async with lock:
        pass
    async with anyio.create_task_group() as tg:
        tg.start_soon(event.wait)  # its first use makes the asyncio event it records through
        await anyio.sleep(0)
        event.set()
    entry = _entry(prof, lock)
    assert (entry.kind, entry.acquisitions, entry.releases) == ("anyio.Lock", 1, 1)
    entry = _entry(prof, event)
    assert entry.event is not None and (entry.event.sets, entry.event.is_set) == (1, True)


async def _outside_any_loop(make: Callable[[], _T]) -> _T:
    """What ``make`` returns, made on a thread that runs no event loop and knows of none.

    Not ``asyncio.to_thread``: it copies the caller's context into the thread, and anyio 4.16
    keeps the running backend in a context variable, so there anyio would see the test's
    asyncio backend and make its asyncio primitives, not the adapters made outside a loop.
    """
    return await asyncio.get_running_loop().run_in_executor(None, contextvars.Context().run, make)


# -- whole-program mode ----------------------------------------------------------------------------


class _MyLock(asyncio.Lock):
    def __init__(self) -> None:
        super().__init__()
        self.extra = 1


async def test_instrument_locks_labels_every_new_primitive_by_its_creation_site(
    whole_program: LockInstrumentation, prof: asyncflow.Profiler
) -> None:
    line = sys._getframe().f_lineno
    lock = asyncio.Lock()
    cond = asyncio.Condition()
    barrier = asyncio.Barrier(1)
    sem = asyncio.BoundedSemaphore()
    mine = _MyLock()
    alock = anyio.Lock()
    for offset, obj, kind in (
        (1, lock, "asyncio.Lock"),
        (2, cond, "asyncio.Condition"),
        (3, barrier, "asyncio.Barrier"),
        (4, sem, "asyncio.BoundedSemaphore"),
        (5, mine, f"{__name__}._MyLock"),
        (6, alock, "anyio.Lock"),
    ):
        record = _record(obj)
        site = line + offset
        assert (record.label, record.kind, record.line) == (f"test_resources.py:{site}", kind, site)
        assert record.file == __file__
    assert mine.extra == 1  # its own __init__ ran to the end
    # a Condition's lock and a Barrier's condition are parts of them, not resources of their own
    assert resource_of(getattr(cond, "_lock")) is _record(cond)  # noqa: B009
    assert resource_of(getattr(barrier, "_cond")) is None  # noqa: B009
    async with cond:
        pass
    assert await barrier.wait() == 0
    assert resources.acquisitions(_record(cond)) == 1
    # a nested call (the program's own, under `asyncflow run`) shares the mode; undoing it
    # leaves the outer handle's mode on
    inner = instrument_locks()
    assert inner.active
    inner.undo()
    inner.undo()
    assert not inner.active and whole_program.active
    assert resource_of(asyncio.Lock()) is not None
    whole_program.undo()
    assert not whole_program.active
    assert resource_of(asyncio.Lock()) is None
    assert asyncio.Lock.__init__ is not None and resource_of(anyio.Lock()) is None


async def test_primitives_made_by_libraries_for_their_own_use_are_left_out(
    whole_program: LockInstrumentation,
) -> None:
    before = {r.id for r in resources.resource_registry()}
    send, receive = anyio.create_memory_object_stream[int]()
    async with anyio.create_task_group() as tg:
        tg.start_soon(send.send, 1)  # blocks on an anyio-internal Event until received
        await anyio.sleep(0)
        assert await receive.receive() == 1
    send.close()
    receive.close()
    queue: asyncio.Queue[int] = asyncio.Queue()  # its join() waits on an asyncio-internal Event
    queue.put_nowait(1)
    queue.get_nowait()
    queue.task_done()
    await queue.join()
    made = [r for r in resources.resource_registry() if r.id not in before]
    assert made == []


# -- memory ----------------------------------------------------------------------------------------


async def test_short_lived_locks_fold_into_a_bounded_history(
    whole_program: LockInstrumentation, prof: asyncflow.Profiler
) -> None:
    n = resources.GONE_KEPT + 150

    async def once() -> None:
        lock = asyncio.Lock()  # one creation site: one label
        async with lock:
            await asyncio.sleep(0)

    for _ in range(n):
        await once()
    gc.collect()
    # The collector reaps what is gone, on its thread: a reap of the test's own could return
    # while the collector's, on its tick, held records chosen but not yet moved (still listed).
    prof.snapshot()
    registry = resources.resource_registry()
    label = f"test_resources.py:{once.__code__.co_firstlineno + 1}"
    mine = [r for r in registry if r.label == label]
    gone = [r for r in mine if r.folded == 0]
    (aggregate,) = [r for r in mine if r.folded]
    assert len(gone) <= resources.GONE_KEPT and all(not r.alive for r in gone)
    assert aggregate.folded + len(gone) == n
    assert resources.acquisitions(aggregate) == aggregate.folded
    assert len(resources._registry) < 50  # live ones only: the rest is bounded history
    assert find_resource(aggregate.id) is aggregate
    nodes, _ = resource_flow(prof._collector, lambda fid: f"future:{fid}")  # type: ignore[arg-type]
    assert f"resource:{aggregate.id}" in {node.id for node in nodes}


def test_without_a_profiler_the_registry_reaps_itself() -> None:
    with instrument_locks():
        for _ in range(resources.GONE_KEPT + 50):
            asyncio.Event()
    gc.collect()
    resources.reap()
    assert len(resources._registry) < 10
    assert len(resources.resource_registry()) <= resources.GONE_KEPT + resources.AGGREGATES_KEPT


# -- the documents ---------------------------------------------------------------------------------


async def test_resources_document_pages_most_waited_first(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    from asyncflow.views.resource_views import resources_document

    quiet = instrument_lock(asyncio.Lock(), name="quiet")
    busy = instrument_lock(asyncio.Lock(), name="busy")
    async with quiet:
        pass
    await busy.acquire()
    waiting = asyncio.create_task(busy.acquire())
    await asyncio.sleep(0)
    fake_clock.advance(MS)
    busy.release()
    with anyio.fail_after(5):
        await waiting
    busy.release()
    collector = prof._collector
    assert collector is not None
    doc = resources_document(collector, clock.now_ns())
    assert load(ResourcesDocument, __import__("orjson").loads(dumps(doc))) == doc
    labels = [r.label for r in doc.resources]
    assert labels.index("busy") < labels.index("quiet")
    assert (doc.total, doc.offset, doc.limit) == (len(labels), 0, len(labels))
    at = labels.index("busy")
    page = resources_document(collector, clock.now_ns(), at, 1)
    assert (page.limit, [r.label for r in page.resources]) == (1, ["busy"])
    nodes, edges = resource_flow(collector, lambda fid: f"future:{fid}")
    busy_id = f"resource:{_record(busy).id}"
    assert busy_id in {n.id for n in nodes}
    assert [(e.source, e.messages) for e in edges if e.target == busy_id] == [("future:None", 2)]


# -- CPython's own tests of asyncio's locks --------------------------------------------------------


def _cpython_lock_tests() -> unittest.TestSuite | None:
    if importlib.util.find_spec("test.test_asyncio.test_locks") is None:
        return None
    test_locks = importlib.import_module("test.test_asyncio.test_locks")
    return unittest.defaultTestLoader.loadTestsFromModule(test_locks)


@pytest.mark.parametrize("profiling", [True, False], ids=["profiler running", "no profiler"])
def test_cpython_lock_tests_pass_on_instrumented_primitives(profiling: bool) -> None:
    suite = _cpython_lock_tests()
    if suite is None:
        pytest.skip("this Python has no test.test_asyncio package")
    before = {r.id for r in resources.resource_registry()}
    stream = io.StringIO()
    with contextlib.ExitStack() as stack:
        if profiling:
            stack.enter_context(asyncflow.profile("cpython", format="none"))
        stack.enter_context(instrument_locks())
        result = unittest.TextTestRunner(stream=stream, verbosity=0).run(suite)
    asyncio.set_event_loop_policy(None)
    assert result.wasSuccessful(), stream.getvalue()
    assert result.testsRun >= 60
    made = [r for r in resources.resource_registry() if r.id not in before]
    kinds = {r.primitive for r in made}
    assert {"lock", "semaphore", "condition", "event", "barrier"} <= kinds
    if profiling:
        assert sum(resources.acquisitions(r) for r in made) > 50
        assert sum(r.stats.wait_count for r in made) > 20


def test_undo_puts_back_every_constructor() -> None:
    before = {cls: cls.__dict__.get("__init__") for cls in (asyncio.Lock, asyncio.Event)}
    handle = instrument_locks()
    assert asyncio.Lock.__dict__["__init__"] is not before[asyncio.Lock]
    handle.undo()
    handle.undo()  # twice: nothing more
    assert {cls: cls.__dict__.get("__init__") for cls in before} == before


async def test_anyio_primitives_made_at_import_time_are_labelled_where_made(
    whole_program: LockInstrumentation, prof: asyncflow.Profiler
) -> None:
    def module_level() -> tuple[Any, Any, Any]:
        line = sys._getframe().f_lineno
        made = anyio.Lock(), anyio.Semaphore(2), anyio.CapacityLimiter(3)
        assert all(_record(p).line == line + 1 for p in made)
        return made

    lock, sem, limiter = await _outside_any_loop(module_level)  # no event loop there
    assert [type(p).__name__ for p in (lock, sem, limiter)] == [
        "LockAdapter",
        "SemaphoreAdapter",
        "CapacityLimiterAdapter",
    ]
    before = len(resources.resource_registry())
    for primitive in (lock, sem, limiter):
        async with primitive:
            pass
    assert len(resources.resource_registry()) == before  # their backend objects add none
    for primitive, kind in ((lock, "anyio.Lock"), (sem, "anyio.Semaphore")):
        entry = _entry(prof, primitive)
        assert (entry.kind, entry.acquisitions, entry.releases) == (kind, 1, 1)
    entry = _entry(prof, limiter)
    assert entry.permits is not None and (entry.permits.initial, entry.acquisitions) == (3, 1)


async def test_primitives_made_on_one_line_get_labels_of_their_own(
    prof: asyncflow.Profiler,
) -> None:
    with asyncflow.instrument_locks():
        cache, pool = asyncio.Lock(), asyncio.Semaphore(2)  # two made on one line
        alone = asyncio.Event()
    line = inspect.currentframe().f_lineno - 2  # type: ignore[union-attr]
    labels = [asyncflow_resource(x).label for x in (cache, pool, alone)]
    name = os.path.basename(__file__)
    assert labels[0].startswith(f"{name}:{line}:") and labels[1].startswith(f"{name}:{line}:")
    assert labels[0] != labels[1]
    assert labels[2] == f"{name}:{line + 1}"  # alone on its line: no column


def asyncflow_resource(obj: object) -> Any:
    from asyncflow.instrumentation.resources import resource_of

    record = resource_of(obj)
    assert record is not None
    return record


async def test_an_untimed_hold_says_since_when_to_the_collectors_tick(
    fake_clock: FakeClock,
) -> None:
    with asyncflow.profile("ticks", format="none", port=None, sampling=1000) as prof:
        gate = asyncflow.instrument_lock(asyncio.Lock(), name="gate")
        for _ in range(3):  # the first hold is timed; the next ones are not
            async with gate:
                fake_clock.advance(10)
        fake_clock.advance(5_000)
        await gate.acquire()
        try:
            entry = next(r for r in prof.snapshot().resources.resources if r.label == "gate")  # type: ignore[union-attr]
            (holder,) = entry.holders
            assert (entry.acquisitions, entry.timed_holds) == (4, 1)
            # noted to the collector's last tick, never in the future, never before the start
            assert 0 <= holder.since_ns <= 5_030
            assert holder.held_ns >= 0
        finally:
            gate.release()
