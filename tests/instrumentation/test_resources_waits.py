"""Resource figures that agree with one another: waits given up and a condition's waits are
waits, in the document and in the report's row; a condition's and an event's wake-ups."""

from __future__ import annotations

import asyncio

import anyio
import pytest

import asyncflow
from asyncflow.instrumentation.resources import instrument_lock
from asyncflow.render.report import render_table
from asyncflow.schema import ResourceEntry


def _resource(prof: asyncflow.Profiler, label: str) -> ResourceEntry:
    document = prof.snapshot().resources
    assert document is not None
    (entry,) = [r for r in document.resources if r.label == label]
    return entry


def _row(prof: asyncflow.Profiler, label: str) -> dict[str, str]:
    """The report's row of a resource, by column (columns are two spaces apart)."""
    lines = render_table(prof.snapshot(), (50.0, 99.0), 0).splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("resource "))
    header = lines[at]
    columns = [c for c in header.split("  ") if c.strip()]
    (line,) = [line for line in lines[at + 1 :] if line.startswith(label + " ")]
    cells = [c.strip() for c in line.split("  ") if c.strip()]
    assert len(cells) == len(columns), (header, line)
    return {c.strip(): cell for c, cell in zip(columns, cells, strict=True)}


async def test_a_deadlock_given_up_counts_every_wait(prof: asyncflow.Profiler) -> None:
    """Two tasks take two locks in opposite order and are cancelled by a timeout: each lock
    had one wait, given up, and the row says so beside its wait total."""
    first = instrument_lock(asyncio.Lock(), name="first")
    second = instrument_lock(asyncio.Lock(), name="second")
    both_hold = asyncio.Barrier(2)

    async def transfer(a: asyncio.Lock, b: asyncio.Lock) -> None:
        async with a:
            await both_hold.wait()
            async with b:
                pass

    tasks = [
        asyncio.create_task(transfer(first, second)),
        asyncio.create_task(transfer(second, first)),
    ]
    with anyio.fail_after(5):
        while not all(lock._waiters for lock in (first, second)):
            await asyncio.sleep(0)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    entry = _resource(prof, "first")
    assert (entry.waits, entry.failed_waits, entry.contended_acquisitions) == (1, 1, 0)
    assert entry.total_wait_ns > 0
    row = _row(prof, "first")
    assert row["waited"] == "1 (1 gave up)"
    assert row["held by"] == "-"


def _waiting(cond: asyncio.Condition) -> int:
    """Tasks inside ``cond.wait()`` now, not yet notified."""
    return sum(1 for w in cond._waiters if not w.done())


async def test_a_conditions_waits_are_its_waits_and_its_wakeups_counted(
    prof: asyncflow.Profiler,
) -> None:
    """Ten waiters woken by one notify_all per item, only one of them finding an item: the
    condition's waits are waits in the row, and its wake-ups per notify read ten."""
    cond = instrument_lock(asyncio.Condition(), name="herd")
    items: list[int] = []
    taken: list[int] = []

    async def consumer() -> None:
        while True:
            async with cond:
                await cond.wait_for(lambda: bool(items))
                item = items.pop()
            if item < 0:
                return
            taken.append(item)

    with anyio.fail_after(5):
        consumers = [asyncio.create_task(consumer()) for _ in range(10)]
        for item in [*range(5), *[-1] * 10]:
            while items or _waiting(cond) < sum(1 for c in consumers if not c.done()):
                await asyncio.sleep(0)
            async with cond:
                items.append(item)
                cond.notify_all()
        await asyncio.gather(*consumers)
    assert sorted(taken) == list(range(5))
    entry = _resource(prof, "herd")
    assert entry.condition is not None and entry.condition.notifies == 15
    # every waiter was woken by every notify_all while it waited: 10 x 5, then 10 + 9 + ... + 1
    assert entry.signals == 15
    assert entry.woken == 10 * 5 + sum(range(1, 11))
    row = _row(prof, "herd")
    assert int(row["waited"].split()[0].replace(",", "")) == entry.waits >= entry.woken


async def test_an_events_wakeups_are_its_waiters(prof: asyncflow.Profiler) -> None:
    event = instrument_lock(asyncio.Event(), name="go")

    with anyio.fail_after(5):
        waiters = [asyncio.create_task(event.wait()) for _ in range(4)]
        while len(event._waiters) < 4:
            await asyncio.sleep(0)
        event.set()
        await asyncio.gather(*waiters)
        assert await event.wait()  # set already: immediate, no wake-up
    entry = _resource(prof, "go")
    assert (entry.signals, entry.woken, entry.waits) == (1, 4, 4)
    assert _row(prof, "go")["waited"] == "4"


@pytest.mark.parametrize("timeout", [True, False])
async def test_a_wait_given_up_on_an_event_is_no_wakeup(
    prof: asyncflow.Profiler, timeout: bool
) -> None:
    event = instrument_lock(asyncio.Event(), name=f"never-{timeout}")
    with anyio.fail_after(5):
        if timeout:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.001):
                    await event.wait()
        else:
            waiter = asyncio.create_task(event.wait())
            while not event._waiters:
                await asyncio.sleep(0)
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
    entry = _resource(prof, f"never-{timeout}")
    assert (entry.signals, entry.woken, entry.waits, entry.failed_waits) == (0, 0, 1, 1)
    assert _row(prof, f"never-{timeout}")["waited"] == "1 (1 gave up)"
