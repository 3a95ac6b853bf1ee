"""Instrumented primitives behave exactly as plain ones: the same scenarios, run plain,
instrumented one by one, and instrumented whole-program (a profiler running), give the same
order of acquisitions, results, exceptions, cancellations and states."""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import anyio
import pytest

import asyncflow
from asyncflow.instrumentation.resources import instrument_lock, instrument_locks, resource_of

_T = TypeVar("_T")
Wrap = Callable[[_T], _T]
Scenario = Callable[[Callable[[Any], Any]], Awaitable[list[Any]]]


def _state(obj: object) -> str:
    """A primitive's repr without its address: ``[locked, waiters:2]``."""
    match = re.search(r"\[.*\]", repr(obj))
    return match.group(0) if match else repr(obj)


def _exc(exc: BaseException) -> tuple[str, str]:
    return type(exc).__name__, str(exc)


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def lock_contention(wrap: Callable[[Any], Any]) -> list[Any]:
    """FIFO hand-over, a waiter cancelled in the queue, one cancelled just after it was woken,
    a timed-out acquire, release of an unlocked lock."""
    lock = wrap(asyncio.Lock())
    seen: list[Any] = [_state(lock), lock.locked()]

    async def worker(name: str) -> str:
        async with lock:
            seen.append(("in", name, _state(lock)))
            await asyncio.sleep(0)
        seen.append(("out", name))
        return name

    await lock.acquire()
    tasks = {n: asyncio.create_task(worker(n)) for n in "abcde"}
    await _settle()
    seen.append(_state(lock))
    tasks["b"].cancel()  # cancelled while queued
    lock.release()
    await asyncio.sleep(0)
    tasks["a"].cancel()  # woken (its future done), cancelled before it ran
    await _settle()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(0):
            await lock.acquire()
    seen.append(asyncio.current_task().cancelling())  # type: ignore[union-attr]
    results = await asyncio.gather(*tasks.values(), return_exceptions=True)
    seen.append([r if isinstance(r, str) else _exc(r) for r in results])
    try:
        lock.release()
    except RuntimeError as exc:
        seen.append(_exc(exc))
    seen.append([_state(lock), lock.locked()])
    return seen


async def semaphores(wrap: Callable[[Any], Any]) -> list[Any]:
    """FIFO order with a value above one, a cancelled waiter, over-release of a bounded one,
    ``locked()`` at every step."""
    sem = wrap(asyncio.Semaphore(2))
    seen: list[Any] = [_state(sem)]

    async def worker(name: str) -> str:
        await sem.acquire()
        seen.append(("in", name, sem.locked()))
        await asyncio.sleep(0)
        sem.release()
        return name

    tasks = [asyncio.create_task(worker(n)) for n in "abcdef"]
    await asyncio.sleep(0)
    tasks[3].cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    seen.append([r if isinstance(r, str) else _exc(r) for r in results])
    bounded = wrap(asyncio.BoundedSemaphore(1))
    async with bounded:
        seen.append(_state(bounded))
    try:
        bounded.release()
    except ValueError as exc:
        seen.append(_exc(exc))
    seen.append([_state(sem), _state(bounded), sem.locked(), bounded.locked()])
    zero = wrap(asyncio.Semaphore(0))
    waiter = asyncio.create_task(zero.acquire())
    await asyncio.sleep(0)
    zero.release()
    zero.release()
    seen.append([await waiter, _state(zero)])
    with pytest.raises(ValueError, match="initial value must be >= 0"):
        asyncio.Semaphore(-1)
    return seen


async def conditions(wrap: Callable[[Any], Any]) -> list[Any]:
    """wait_for, notify(n), notify_all, a cancelled wait that reacquires the lock, misuse."""
    cond = wrap(asyncio.Condition())
    items: list[int] = []
    seen: list[Any] = []

    async def consumer(name: str) -> int:
        async with cond:
            value = await cond.wait_for(lambda: bool(items))
            seen.append(("woke", name, value, cond.locked()))
            return items.pop(0)

    tasks = [asyncio.create_task(consumer(n)) for n in "abc"]
    await _settle()
    async with cond:
        items.extend([1, 2])
        cond.notify(2)
    await _settle()
    async with cond:
        items.append(3)
        cond.notify_all()
    seen.append(await asyncio.gather(*tasks))

    async def cancelled_wait() -> bool:
        async with cond:
            try:
                await cond.wait()
            except asyncio.CancelledError:
                return bool(cond.locked())  # the lock is held again when the cancellation arrives
        return False

    task = asyncio.create_task(cancelled_wait())
    await _settle()
    task.cancel()
    seen.append(await task)
    for misuse in (cond.wait(), cond.wait_for(lambda: True)):
        try:
            await misuse
        except RuntimeError as exc:
            seen.append(_exc(exc))
    try:
        cond.notify()
    except RuntimeError as exc:
        seen.append(_exc(exc))
    shared = wrap(asyncio.Lock())
    cond2 = wrap(asyncio.Condition(shared))
    async with cond2:
        seen.append([shared.locked(), cond2.locked(), _state(cond2)])
    seen.append(_state(cond))
    return seen


async def events(wrap: Callable[[Any], Any]) -> list[Any]:
    """Waiters woken in order by set(), clear() before they run, a cancelled wait."""
    event = wrap(asyncio.Event())
    seen: list[Any] = [_state(event), event.is_set()]

    async def waiter(name: str) -> str:
        result = await event.wait()
        seen.append(("woke", name, result, event.is_set()))
        return name

    tasks = [asyncio.create_task(waiter(n)) for n in "abc"]
    await asyncio.sleep(0)
    tasks[1].cancel()
    event.set()
    event.clear()  # already woken: they still return True
    results = await asyncio.gather(*tasks, return_exceptions=True)
    seen.append([r if isinstance(r, str) else _exc(r) for r in results])
    event.set()
    seen.append([await event.wait(), _state(event)])
    return seen


async def barriers(wrap: Callable[[Any], Any]) -> list[Any]:
    """Indices, draining, abort while waiting, reset, misuse."""
    barrier = wrap(asyncio.Barrier(3))
    seen: list[Any] = [_state(barrier), barrier.parties]

    async def party(name: str) -> Any:
        try:
            async with barrier as index:
                return (name, index)
        except asyncio.BrokenBarrierError as exc:
            return (name, _exc(exc))

    first = await asyncio.gather(*(party(n) for n in "abc"))
    seen.append(first)
    waiting = [asyncio.create_task(party(n)) for n in "de"]
    await _settle()
    seen.append([barrier.n_waiting, _state(barrier)])
    await barrier.abort()
    seen.append(await asyncio.gather(*waiting))
    seen.append([barrier.broken, _state(barrier), await party("late")])
    await barrier.reset()
    seen.append([barrier.broken, _state(barrier)])
    with pytest.raises(ValueError, match="parties must be > 0"):
        asyncio.Barrier(0)
    return seen


async def task_groups(wrap: Callable[[Any], Any]) -> list[Any]:
    """Waiters in a TaskGroup cancelled by a sibling's failure; uncancel counts unchanged."""
    lock = wrap(asyncio.Lock())
    event = wrap(asyncio.Event())
    seen: list[Any] = []

    async def blocked() -> None:
        try:
            async with lock:
                await event.wait()
        except asyncio.CancelledError:
            seen.append(("cancelled", asyncio.current_task().cancelling()))  # type: ignore[union-attr]
            raise

    async def fail() -> None:
        await asyncio.sleep(0)
        raise KeyError("boom")

    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(blocked())
            tg.create_task(blocked())
            tg.create_task(fail())
    except* KeyError as group:
        seen.append([_exc(e) for e in group.exceptions])
    seen.append([lock.locked(), _state(lock), event.is_set()])
    return seen


async def anyio_primitives(wrap: Callable[[Any], Any]) -> list[Any]:
    """anyio's own Lock, Semaphore, CapacityLimiter and Event, with cancel scopes."""
    lock = wrap(anyio.Lock())
    sem = wrap(anyio.Semaphore(1, max_value=1))
    limiter = wrap(anyio.CapacityLimiter(2))
    event = wrap(anyio.Event())
    seen: list[Any] = []

    async def worker(name: str, primitive: Any) -> None:
        async with primitive:
            seen.append(("in", name))
            await anyio.sleep(0)

    for primitive in (lock, sem, limiter):
        async with anyio.create_task_group() as tg:
            for name in "abc":
                tg.start_soon(worker, name, primitive)
        with anyio.move_on_after(0) as scope:
            async with primitive:
                await anyio.sleep(1)
        seen.append(scope.cancelled_caught)
    async with lock:
        try:
            await lock.acquire()
        except RuntimeError as exc:
            seen.append(_exc(exc))
    try:
        sem.release()
    except ValueError as exc:
        seen.append(_exc(exc))
    try:
        limiter.release()
    except RuntimeError as exc:
        seen.append(_exc(exc))
    async with anyio.create_task_group() as tg:
        tg.start_soon(event.wait)
        await anyio.sleep(0)
        seen.append(event.statistics().tasks_waiting)
        event.set()
    seen.append([event.is_set(), lock.locked(), sem.value, limiter.borrowed_tokens])
    seen.append([lock.statistics().tasks_waiting, limiter.statistics().tasks_waiting])
    return seen


SCENARIOS: list[Scenario] = [
    lock_contention,
    semaphores,
    conditions,
    events,
    barriers,
    task_groups,
    anyio_primitives,
]


def _identity(obj: _T) -> _T:
    return obj


def _explicit(obj: _T) -> _T:
    result = instrument_lock(obj)
    assert resource_of(obj) is not None
    return result


def _whole_program(obj: _T) -> _T:
    assert resource_of(obj) is not None, f"{obj!r} was not instrumented at its creation"
    return obj


@contextlib.contextmanager
def _mode(name: str) -> Iterator[Callable[[Any], Any]]:
    if name == "plain":
        yield _identity
        return
    with asyncflow.profile("transparency", format="none"):
        if name == "explicit":
            yield _explicit
        elif name == "whole program, unasked":
            # nothing asks for a primitive's record: one waited on gets it then, the others
            # never do (the lazy path a real service's per-request primitives take)
            with instrument_locks():
                yield _identity
        else:
            with instrument_locks():
                yield _whole_program


def _run(scenario: Scenario, wrap: Callable[[Any], Any], eager: bool) -> list[Any]:
    async def main() -> list[Any]:
        if eager:
            asyncio.get_running_loop().set_task_factory(asyncio.eager_task_factory)  # type: ignore[attr-defined]
        with anyio.fail_after(10):
            return await scenario(wrap)

    return asyncio.run(main())


EAGER = [False, True] if sys.version_info >= (3, 12) else [False]


@pytest.mark.parametrize("eager", EAGER, ids=lambda e: "eager tasks" if e else "tasks")
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
def test_instrumented_primitives_behave_exactly_as_plain_ones(
    scenario: Scenario, eager: bool
) -> None:
    with _mode("plain") as wrap:
        plain = _run(scenario, wrap, eager)
    for mode in ("explicit", "whole program", "whole program, unasked"):
        with _mode(mode) as wrap:
            assert _run(scenario, wrap, eager) == plain, mode


def test_the_scenarios_do_see_what_they_compare() -> None:
    """The comparison is not vacuous: the plain runs saw waits, cancellations and errors."""
    with _mode("plain") as wrap:
        lock = _run(lock_contention, wrap, False)
        sem = _run(semaphores, wrap, False)
        barrier = _run(barriers, wrap, False)
    assert lock[2] == "[locked, waiters:5]"
    *_, results, misuse, unlocked = lock
    assert unlocked == ["[unlocked]", False]
    assert results[1:] == [("CancelledError", ""), "c", "d", "e"]
    assert misuse == ("RuntimeError", "Lock is not acquired.")
    assert ("ValueError", "BoundedSemaphore released too many times") in sem
    assert ("d", ("BrokenBarrierError", "Abort or reset of barrier")) in barrier[4]
