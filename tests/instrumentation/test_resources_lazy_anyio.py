"""An anyio Lock made per request and taken without contention costs no record (issue 26/28).

httpcore makes an anyio Lock per connection and request and takes it once or twice; each got a
record of its own (a weak reference, its stats, its id-table entry), 25-28 µs a lock. Like
asyncio's Lock in whole-program mode, it now gets one only when a task waits for it: until then
its holds are counted on the row of the line that made it, and a contended one still knows its
holder, its waits and anyio's checkpoint-after-acquire.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import anyio
import pytest

import asyncflow
from asyncflow.instrumentation import _sites, resources

USES = 50


def _rows() -> list[resources.ResourceRecord]:
    """The anyio.Lock rows made in this file (earlier tests' primitives may live on)."""
    return [
        r
        for r in resources.resource_registry()
        if r.kind == "anyio.Lock" and r.label.startswith("test_resources_lazy_anyio.py:")
    ]


async def _taken_once() -> None:
    async with anyio.Lock():
        pass


async def test_an_anyio_lock_made_per_request_and_taken_once_has_no_record_of_its_own() -> None:
    with asyncflow.profile("lazy", format="none", port=None), asyncflow.instrument_locks():
        made = next(resources._resource_ids)  # (ids only need to be unique)
        for _ in range(USES):
            await _taken_once()
        assert next(resources._resource_ids) - made <= 2  # the line's counting row only
        (row,) = _rows()
        assert not row.alive
        assert row.folded == USES
        assert resources.acquisitions(row) == resources.releases(row) == USES
        assert row.stats.wait_count == row.stats.contended == 0


async def test_a_lazy_anyio_lock_contended_later_gets_a_record_that_knows_its_holder() -> None:
    @asyncflow.future(name="holder")
    async def holder(lock: anyio.Lock, held: anyio.Event, go: anyio.Event) -> None:
        async with lock:
            held.set()
            await go.wait()

    async def waiter(lock: anyio.Lock) -> None:
        async with lock:
            pass

    with asyncflow.profile("lazy", format="none", port=None), asyncflow.instrument_locks():
        lock, held, go = anyio.Lock(), anyio.Event(), anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(holder, lock, held, go)
            await held.wait()
            assert resources._anyio.get(id(lock)) is None or not isinstance(
                resources._anyio.get(id(lock)), resources.ResourceRecord
            )  # no record yet: nobody waited
            tg.start_soon(waiter, lock)
            with anyio.fail_after(5):
                while not lock._waiters:  # type: ignore[attr-defined]
                    await asyncio.sleep(0)
            record = resources.resource_of(lock)
            assert record is not None
            (hold,) = resources.holds_of(record)
            assert hold.call is not None and hold.call.future.label == "holder"
            assert record.stats.waiting == 1
            go.set()
        assert record is not None
        assert resources.acquisitions(record) == resources.releases(record) == 2
        assert (record.stats.contended, record.stats.wait_count) == (1, 1)
        assert resources.resource_of(lock) is record
        (row,) = [r for r in resources.resource_registry() if r.label == record.label]
        assert row is record  # the live lock's own row; the line's counting row holds nothing


async def test_a_lazy_anyio_lock_gets_its_record_when_the_mode_ends() -> None:
    with asyncflow.profile("lazy", format="none", port=None):
        with asyncflow.instrument_locks():
            lock = anyio.Lock()
            async with lock:
                pass
        record = resources.resource_of(lock)
        assert record is not None and record.alive
        assert resources.acquisitions(record) == 0  # (its use before counts on its line's row)
        async with lock:  # its hooks (anyio's classes', for good) record into it
            pass
        assert resources.acquisitions(record) == resources.releases(record) == 1


@pytest.mark.parametrize("kind", ["anyio.Lock", "anyio.Event"])
async def test_a_line_making_an_anyio_primitive_again_takes_its_site_without_walking_the_stack(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """anyio.Lock() and anyio.Event() go through anyio's constructors (Lock.__new__, the
    backend's create_lock...): the walk out past them to the program's line and its label are
    worked out for the first one a line makes, and the next ones take that line's site."""
    walks = [0]
    walk = _sites.creation_frame

    def counting(*args: Any, **kwargs: Any) -> Any:
        walks[0] += 1
        return walk(*args, **kwargs)

    monkeypatch.setattr(resources, "creation_frame", counting)
    cls: Any = anyio.Lock if kind == "anyio.Lock" else anyio.Event
    with asyncflow.profile("lazy", format="none", port=None), asyncflow.instrument_locks():
        here = sys._getframe().f_lineno  # (earlier tests' rows of this file may live on)
        for _ in range(USES):
            primitive = cls()
            if kind == "anyio.Event":
                primitive.set()
            else:
                async with primitive:
                    pass
        twice = [cls() for _ in range(2)]  # another line: its own row
        del primitive, twice
        rows = sorted(
            (
                r
                for r in resources.resource_registry()
                if r.kind == kind and r.label.startswith("test_resources_lazy_anyio.py:")
                if r.line > here
            ),
            key=lambda r: r.line,
        )
        assert [r.folded for r in rows] == [USES, 2]
        used = rows[0].stats.sets if kind == "anyio.Event" else resources.acquisitions(rows[0])
        assert used == USES
    assert walks[0] == 2  # each line's first
