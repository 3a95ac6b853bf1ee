"""The hooks run asyncio's own fast paths in place for the standard classes only: a subclass's
overrides still run, and the figures stay exact either way."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import asyncflow
from asyncflow.instrumentation import resources
from asyncflow.instrumentation.resources import instrument_lock, resource_of


class _CountingLock(asyncio.Lock):
    def __init__(self) -> None:
        super().__init__()
        self.wakes = 0

    def _wake_up_first(self) -> None:
        self.wakes += 1
        super()._wake_up_first()  # type: ignore[misc]


class _CountingSemaphore(asyncio.Semaphore):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.checks = 0

    def locked(self) -> bool:
        self.checks += 1
        return super().locked()


async def _use(primitive: Any, n: int) -> None:
    for _ in range(n):
        async with primitive:
            pass


@pytest.mark.parametrize("profiling", [True, False], ids=["profiler running", "no profiler"])
async def test_a_subclass_override_still_runs(profiling: bool) -> None:
    lock, sem = _CountingLock(), _CountingSemaphore(2)
    plain_lock, plain_sem = _CountingLock(), _CountingSemaphore(2)
    await _use(plain_lock, 3)
    await _use(plain_sem, 3)
    with asyncflow.profile("inline", format="none", port=None) if profiling else _nothing():
        instrument_lock(lock)
        instrument_lock(sem)
        await _use(lock, 3)
        await _use(sem, 3)
    assert lock.wakes == plain_lock.wakes == 3
    # (while profiling, asking whether an acquire of a subclass will wait calls its locked())
    assert sem.checks == plain_sem.checks == 3 if not profiling else sem.checks >= 3
    assert (lock.locked(), sem._value) == (False, 2)


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


async def test_uncontended_figures_stay_exact_on_the_inline_paths() -> None:
    lock, sem, event = asyncio.Lock(), asyncio.BoundedSemaphore(3), asyncio.Event()
    event.set()
    with asyncflow.profile("inline", format="none", port=None):
        for primitive in (lock, sem, event):
            instrument_lock(primitive)
        await _use(lock, 5)
        await _use(sem, 4)
        for _ in range(6):
            assert await event.wait() is True
        await lock.acquire()
        await sem.acquire()
        await sem.acquire()
        lr, sr, er = resource_of(lock), resource_of(sem), resource_of(event)
        assert lr is not None and sr is not None and er is not None
        assert (resources.acquisitions(lr), resources.releases(lr)) == (6, 5)
        assert (resources.acquisitions(sr), resources.releases(sr)) == (6, 4)
        assert (len(resources.holds_of(lr)), len(resources.holds_of(sr))) == (1, 2)
        assert (lock.locked(), sem._value) == (True, 1)
        assert er.stats.immediate == 6
        assert lr.stats.contended == sr.stats.contended == 0
        lock.release()
        sem.release()
        sem.release()
        with pytest.raises(RuntimeError):
            lock.release()  # the lock's own error, still raised
        with pytest.raises(ValueError):
            sem.release()  # BoundedSemaphore's own over-release
        assert (resources.releases(lr), resources.releases(sr)) == (6, 6)
        assert resources.holds_of(lr) == resources.holds_of(sr) == []
