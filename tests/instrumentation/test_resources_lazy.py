"""A lock or event made per request and never waited on costs no record of its own (issue 26).

In whole-program mode a standard asyncio.Lock or Event (and anyio's Lock and Event) gets its
record only when something waits on it; until then its uses are counted on the row of the line
that made it, the same row its gone records fold into. What the findings need still comes: a
lock made lazily and then contended knows who held it, and one that deadlocks is seen.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Callable
from typing import Any

import anyio
import pytest

import asyncflow
from asyncflow.clock import FakeClock
from asyncflow.instrumentation import _sites, resources

USES = 50


def _rows(kind: str) -> list[resources.ResourceRecord]:
    """The rows of ``kind`` made in this file (earlier tests' primitives may live on)."""
    return [
        r
        for r in resources.resource_registry()
        if r.kind == kind and r.label.startswith("test_resources_lazy.py:")
    ]


async def _lock_taken_once() -> None:
    async with asyncio.Lock():
        pass


async def _anyio_lock_taken_once() -> None:
    async with anyio.Lock():
        pass


async def _event_set_and_awaited(make: Callable[[], Any]) -> None:
    event = make()
    event.set()
    await event.wait()


@pytest.mark.parametrize(
    ("kind", "use"),
    [
        ("asyncio.Lock", _lock_taken_once),
        ("anyio.Lock", _anyio_lock_taken_once),
        ("asyncio.Event", lambda: _event_set_and_awaited(asyncio.Event)),
        ("anyio.Event", lambda: _event_set_and_awaited(anyio.Event)),
    ],
    ids=["asyncio.Lock", "anyio.Lock", "asyncio.Event", "anyio.Event"],
)
async def test_a_primitive_made_per_request_and_never_waited_on_has_no_record_of_its_own(
    kind: str, use: Callable[[], Any]
) -> None:
    with asyncflow.profile("lazy", format="none", port=None), asyncflow.instrument_locks():
        made = next(resources._resource_ids)  # (ids only need to be unique)
        for _ in range(USES):
            await use()
        assert next(resources._resource_ids) - made <= 2  # the line's counting row only
        (row,) = _rows(kind)
        assert not row.alive
        assert row.folded == USES
        if kind.endswith("Lock"):
            assert resources.acquisitions(row) == resources.releases(row) == USES
            assert row.stats.wait_count == row.stats.contended == 0
        else:  # (anyio's wait() reads is_set() itself: its asyncio.Event's wait never runs)
            immediate = USES if kind == "asyncio.Event" else 0
            assert (row.stats.sets, row.stats.immediate, row.stats.wait_count) == (
                USES,
                immediate,
                0,
            )


def _has_record(lock: Any) -> bool:
    """Whether ``lock`` has a record of its own (not only its creation site), made nothing."""
    return isinstance(getattr(lock, resources._MARK, None), resources.ResourceRecord) or (
        isinstance(resources._anyio.get(id(lock)), resources.ResourceRecord)
    )


async def _holder(lock: Any, held: asyncio.Event, go: asyncio.Event) -> None:
    """Take ``lock``, say so, and hold it until ``go``."""
    async with lock:
        held.set()
        await go.wait()


async def _waiter(lock: Any) -> None:
    async with lock:
        pass


@pytest.mark.parametrize("cls", [asyncio.Lock, anyio.Lock], ids=["asyncio.Lock", "anyio.Lock"])
async def test_a_lock_contended_later_gets_a_record_that_knows_its_holder(cls: Any) -> None:
    holder = asyncflow.future(name="holder")(_holder)
    with asyncflow.profile("lazy", format="none", port=None), asyncflow.instrument_locks():
        lock, held, go = cls(), asyncio.Event(), asyncio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(holder, lock, held, go)
            await held.wait()
            assert not _has_record(lock)  # no record yet: nobody waited
            tg.start_soon(_waiter, lock)
            with anyio.fail_after(5):
                while not lock._waiters:
                    await asyncio.sleep(0)
            record = resources.resource_of(lock)
            assert record is not None
            assert _has_record(lock)
            (hold,) = resources.holds_of(record)
            assert hold.call is not None and hold.call.future.label == "holder"
            assert record.stats.waiting == 1
            go.set()
        assert record is not None
        assert resources.acquisitions(record) == resources.releases(record) == 2
        assert (record.stats.contended, record.stats.wait_count) == (1, 1)
        (row,) = [
            r
            for r in resources.resource_registry()
            if (r.label, r.kind) == (record.label, record.kind)
        ]
        assert row is record  # the live lock's own row; the line's counting row holds nothing


@pytest.mark.parametrize(
    "cls",
    [asyncio.Lock, anyio.Lock, asyncio.Condition],
    ids=["asyncio.Lock", "anyio.Lock", "asyncio.Condition"],
)
async def test_a_lock_held_when_it_gets_its_record_times_that_hold_from_then(
    cls: Any, fake_clock: FakeClock
) -> None:
    """A lock taken before it had a record (a deadlock's, typically) is known held only from
    its first contention on: its row reads at least that long a hold, not 0 ns, and that hold
    stands for itself alone, not for the untimed ones before it."""

    with asyncflow.profile("lazy", format="none", port=None), asyncflow.instrument_locks():
        lock, held, go = cls(), asyncio.Event(), asyncio.Event()
        for _ in range(3):  # never waited for: untimed, each
            async with lock:
                fake_clock.advance(1_000)
        async with anyio.create_task_group() as tg:
            tg.start_soon(_holder, lock, held, go)
            await held.wait()
            tg.start_soon(_waiter, lock)
            with anyio.fail_after(5):
                while (record := resources.resource_of(lock)) is None or not record.stats.waiting:
                    await asyncio.sleep(0)
            fake_clock.advance(2_000_000_000)
            go.set()
        assert record is not None
        st = record.stats
        assert resources.acquisitions(record) == resources.releases(record) >= 2
        assert (st.hold_max, st.hold_ns) == (2_000_000_000, 2_000_000_000)  # (no time passed after)
        first = resources.logs_of(record, "hold")[0]
        assert first.duration_ns == 2_000_000_000  # the holder's


async def test_a_lazy_anyio_lock_gets_its_record_when_the_mode_ends() -> None:
    with asyncflow.profile("lazy", format="none", port=None):
        with asyncflow.instrument_locks():
            lock = anyio.Lock()
            async with lock:
                pass
        record = resources.resource_of(lock)
        assert record is not None and record.alive
        # the only lock of its line: its use before moved from the line's row to its record
        assert resources.acquisitions(record) == 1
        async with lock:  # its hooks (anyio's classes', for good) record into it
            pass
        assert resources.acquisitions(record) == resources.releases(record) == 2
        rows = [r for r in resources.resource_registry() if r.label == record.label]
        assert rows == [record]  # one lock, one row


async def test_an_event_waited_on_before_it_is_set_gets_its_record_at_the_wait() -> None:
    with asyncflow.profile("lazy", format="none", port=None), asyncflow.instrument_locks():
        event = asyncio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(event.wait)
            with anyio.fail_after(5):
                while not event._waiters:
                    await asyncio.sleep(0)
            assert isinstance(getattr(event, resources._MARK, None), resources.ResourceRecord)
            event.set()
        record = resources.resource_of(event)
        assert record is not None
        assert (record.stats.sets, record.stats.woken, record.stats.wait_count) == (1, 1, 1)


#: anyio's go through its constructors (Lock.__new__, the backend's create_lock...): the walk
#: out past them is spared too
_MADE: dict[str, Any] = {"asyncio.Lock": asyncio.Lock, "asyncio.Event": asyncio.Event}
_MADE.update({"anyio.Lock": anyio.Lock, "anyio.Event": anyio.Event})


@pytest.mark.parametrize("kind", list(_MADE))
async def test_a_line_making_a_primitive_again_takes_its_site_without_walking_the_stack(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """uvicorn makes an Event per request at one line: the walk out to the line that made it
    (past asyncflow's hooks, constructors, asyncio's and anyio's own parts) and its label are
    worked out for the first one, and the next ones made by that very call take its site."""
    walks = [0]
    seen: list[str] = []  # (what each walk found, for the message)
    walk = _sites.creation_frame

    def counting(*args: Any, **kwargs: Any) -> Any:
        found = walk(*args, **kwargs)
        walks[0] += 1
        where = "-" if found is None else f"{found.f_code.co_filename}:{found.f_lineno}"
        seen.append(f"{threading.current_thread().name} {type(args[0]).__name__} {where}")
        return found

    cls: Any = _MADE[kind]
    with asyncflow.profile("lazy", format="none", port=None), asyncflow.instrument_locks():
        # The first anyio Event a process makes walks once for its asyncio Event, a part of
        # it made in anyio: an earlier test may have made it, or not (run alone, or under
        # pytest-xdist), so make one before counting.
        cls()
        monkeypatch.setattr(resources, "creation_frame", counting)
        here = sys._getframe().f_lineno  # (earlier tests' rows of this file may live on)
        for _ in range(USES):
            primitive = cls()
            if kind.endswith("Event"):
                primitive.set()
            else:
                async with primitive:
                    pass
        twice = [cls() for _ in range(2)]  # another line: its own row
        del primitive, twice
        rows = sorted((r for r in _rows(kind) if r.line > here), key=lambda r: r.line)
        assert [r.folded for r in rows] == [USES, 2]
        used = rows[0].stats.sets if kind.endswith("Event") else resources.acquisitions(rows[0])
        assert used == USES
    assert walks[0] == 2, seen  # each line's first


async def _condition_notified_under_its_lock() -> None:
    condition = asyncio.Condition()
    async with condition:
        condition.notify()
        condition.notify_all()


async def test_a_condition_made_per_use_and_never_waited_on_has_no_record_of_its_own() -> None:
    """A Condition taken and notified without anyone waiting on it costs its creation site
    only, as a Lock does: its holds and notifies are counted on the line's row."""
    with asyncflow.profile("lazy", format="none", port=None), asyncflow.instrument_locks():
        made = next(resources._resource_ids)
        for _ in range(USES):
            await _condition_notified_under_its_lock()
        assert next(resources._resource_ids) - made <= 2  # the line's counting row only
        # (a row that counts no folded uses is another test's condition, gone or alive)
        (row,) = [r for r in _rows("asyncio.Condition") if r.folded]
        assert not row.alive
        assert row.folded == USES
        assert resources.acquisitions(row) == resources.releases(row) == USES
        assert row.stats.notifies == 2 * USES


async def test_a_condition_waited_on_gets_its_record_at_the_wait() -> None:
    with asyncflow.profile("lazy", format="none", port=None), asyncflow.instrument_locks():
        condition = asyncio.Condition()
        async with condition:  # before anyone waits: counted on the line, then moved to it
            condition.notify_all()
        assert getattr(condition, resources._MARK, None) is None

        async def waiter() -> None:
            async with condition:
                await condition.wait()

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            with anyio.fail_after(5):
                while not condition._waiters:
                    await asyncio.sleep(0)
            record = resources.resource_of(condition)
            assert isinstance(record, resources.ResourceRecord)
            assert record.stats.waiting == 1
            async with condition:
                condition.notify()
        assert record is not None
        assert (record.stats.notifies, record.stats.woken, record.stats.wait_count) == (2, 1, 1)
        # its lock records into the condition's record from the wait on: the first notifier's
        # hold, the waiter's before its wait (made by its fast path, seen by the wait), the
        # second notifier's, the waiter's after
        assert resources.acquisitions(record) == resources.releases(record) == 4
        (row,) = [r for r in resources.resource_registry() if r.label == record.label]
        assert row is record  # the line's counting row holds nothing


async def test_a_condition_whose_lock_is_contended_gets_a_record_that_knows_its_holder() -> None:
    @asyncflow.future(name="holder")
    async def holder(condition: asyncio.Condition, held: asyncio.Event, go: asyncio.Event) -> None:
        async with condition:
            held.set()
            await go.wait()

    with asyncflow.profile("lazy", format="none", port=None), asyncflow.instrument_locks():
        condition, held, go = asyncio.Condition(), asyncio.Event(), asyncio.Event()
        inner: asyncio.Lock = condition._lock  # type: ignore[attr-defined]
        async with anyio.create_task_group() as tg:
            tg.start_soon(holder, condition, held, go)
            await held.wait()
            assert getattr(condition, resources._MARK, None) is None
            tg.start_soon(condition.acquire)
            with anyio.fail_after(5):
                while not inner._waiters:
                    await asyncio.sleep(0)
            record = resources.resource_of(condition)
            assert record is not None and record.primitive == resources.CONDITION
            assert resources.resource_of(inner) is record
            (hold,) = resources.holds_of(record)
            assert hold.call is not None and hold.call.future.label == "holder"
            go.set()
        condition.release()
        assert record is not None
        assert (record.stats.contended, record.stats.wait_count) == (1, 1)


@pytest.mark.parametrize("cls", [asyncio.Lock, anyio.Lock], ids=["asyncio.Lock", "anyio.Lock"])
async def test_the_only_lock_of_its_line_alive_at_the_end_is_one_row(cls: Any) -> None:
    """A module-level lock never waited for gets its record when the mode ends: it is one row
    with every acquisition, not the line's row with them beside its own with none. Two locks
    of one line keep the line's row (what each counted is not known apart)."""
    with asyncflow.profile("lazy", format="none", port=None):
        with asyncflow.instrument_locks():
            one = cls()
            pair = [cls() for _ in range(2)]
            for lock in (one, *pair, *pair):
                for _ in range(5):
                    async with lock:
                        pass
        (only,) = [r for r in resources.resource_registry() if _at(r) == _made_at(one)]
        assert only is resources.resource_of(one)
        assert resources.acquisitions(only) == resources.releases(only) == 5
        assert only.stats.hold_count == 5
        rows = [r for r in resources.resource_registry() if _at(r) == _made_at(pair[0])]
        assert sum(resources.acquisitions(r) for r in rows) == 20  # on the line's row


def _at(record: resources.ResourceRecord) -> tuple[str, int, str]:
    return record.file, record.line, record.kind


def _made_at(lock: Any) -> tuple[str, int, str]:
    """Where a lock of this test was made, from its record."""
    record = resources.resource_of(lock)
    assert record is not None
    return _at(record)
