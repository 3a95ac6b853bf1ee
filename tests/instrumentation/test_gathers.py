"""Gathers' last call: while a profiler runs, each ``asyncio.gather`` of tracked calls credits the
future of the call that ended last (the one it waited for); what the program sees is unchanged.
Exact on a fake clock, on both hot paths."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable

import anyio
import pytest

import asyncflow
from asyncflow.clock import FakeClock
from asyncflow.instrumentation import gathers
from asyncflow.schema import FutureEntry
from tests.support.snapshots import future_entry

Step = Callable[[], Awaitable[None]]


class Ends:
    """Children that end when told to, in the order the test chooses: each gets an event to
    wait for and sets one when it has ended (its call's end is stamped in that same step)."""

    def __init__(self, fake_clock: FakeClock, n: int) -> None:
        self.clock = fake_clock
        self.go = [asyncio.Event() for _ in range(n)]
        self.done = [asyncio.Event() for _ in range(n)]

    async def child(self, i: int, fail: bool = False) -> int:
        await self.go[i].wait()
        self.done[i].set()
        if fail:
            raise KeyError(i)
        return i

    async def end(self, *order: int) -> None:
        """End the children in ``order``, 1 us apart on the fake clock."""
        for i in order:
            self.clock.advance(1_000)
            self.go[i].set()
            with anyio.fail_after(5):
                await self.done[i].wait()
            await asyncio.sleep(0)  # the step that set done[i] returns the call right after


async def _credited() -> None:
    """The gather's outer future has ended: its done-callback (the credit) runs on the loop's
    next round, after an ``await`` of the finished future has returned already."""
    await asyncio.sleep(0)


def _entry(prof: asyncflow.Profiler, label: str) -> FutureEntry:
    return future_entry(prof.snapshot(), label)


def _counts(prof: asyncflow.Profiler, *labels: str) -> dict[str, tuple[int, int]]:
    return {
        label: (_entry(prof, label).gathers, _entry(prof, label).gathers_last) for label in labels
    }


async def test_a_gather_credits_the_future_whose_call_ended_last(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    ends = Ends(fake_clock, 6)

    @asyncflow.future(name="g_quick")
    async def quick(i: int) -> int:
        return await ends.child(i)

    @asyncflow.future(name="g_slow")
    async def slow(i: int) -> int:
        return await ends.child(i)

    # first gather: g_slow's call ends last; second: a g_quick call does
    first = asyncio.gather(quick(0), quick(1), slow(2))
    await ends.end(0, 1, 2)
    assert list(await first) == [0, 1, 2]
    second = asyncio.gather(quick(3), slow(4), quick(5))
    await ends.end(4, 3, 5)
    assert list(await second) == [3, 4, 5]

    # each future took part in both gathers (once each, however many of its calls did)
    await _credited()
    assert _counts(prof, "g_quick", "g_slow") == {"g_quick": (2, 1), "g_slow": (2, 1)}


async def test_return_exceptions_is_honoured_and_the_gather_counted(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    ends = Ends(fake_clock, 2)

    @asyncflow.future(name="g_fails")
    async def fails() -> int:
        return await ends.child(0, fail=True)

    @asyncflow.future(name="g_works")
    async def works() -> int:
        return await ends.child(1)

    outer = asyncio.gather(works(), fails(), return_exceptions=True)
    await ends.end(1, 0)  # the call that raised ended last: the gather waited for it
    result = await outer
    assert result[0] == 1 and type(result[1]) is KeyError and result[1].args == (0,)
    await _credited()
    assert _counts(prof, "g_fails", "g_works") == {"g_fails": (1, 1), "g_works": (1, 0)}


async def test_a_gather_that_failed_early_is_not_counted(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    ends = Ends(fake_clock, 2)

    @asyncflow.future(name="g_early")
    async def early() -> int:
        return await ends.child(0, fail=True)

    @asyncflow.future(name="g_late")
    async def late() -> int:
        return await ends.child(1)

    outer = asyncio.gather(early(), late())
    await ends.end(0)
    with pytest.raises(KeyError):
        await outer  # the same exception, at once: the other child still runs
    await ends.end(1)
    await _credited()
    assert _counts(prof, "g_early", "g_late") == {"g_early": (0, 0), "g_late": (0, 0)}


async def test_a_cancelled_gather_cancels_its_children_and_is_not_counted(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    ends = Ends(fake_clock, 2)
    cancelled: list[int] = []

    @asyncflow.future(name="g_cancelled")
    async def child(i: int) -> int:
        try:
            return await ends.child(i)
        except asyncio.CancelledError:
            cancelled.append(i)
            raise

    outer = asyncio.gather(child(0), child(1))
    await asyncio.sleep(0)  # both children wait
    assert outer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await outer
    assert sorted(cancelled) == [0, 1]
    await _credited()
    assert _counts(prof, "g_cancelled") == {"g_cancelled": (0, 0)}


async def test_a_gather_with_a_child_that_is_no_tracked_task_is_not_counted(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    ends = Ends(fake_clock, 2)

    @asyncflow.future(name="g_mixed")
    async def tracked() -> int:
        return await ends.child(0)

    async def untracked() -> int:  # a plain coroutine: its end is not stamped
        return await ends.child(1)

    plain: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    plain.set_result("done")
    outer = asyncio.gather(tracked(), untracked(), plain)
    await ends.end(1, 0)
    assert await outer == [0, 1, "done"]
    await _credited()
    assert _counts(prof, "g_mixed") == {"g_mixed": (0, 0)}


async def test_nested_gathers_count_the_inner_one_only(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    ends = Ends(fake_clock, 3)

    @asyncflow.future(name="g_inner")
    async def inner(i: int) -> int:
        return await ends.child(i)

    @asyncflow.future(name="g_outer")
    async def outer_child(i: int) -> int:
        return await ends.child(i)

    # the outer gather's first child is a gather (a future, not a tracked task): uncounted
    outer = asyncio.gather(asyncio.gather(inner(0), inner(1)), outer_child(2))
    await ends.end(1, 2, 0)
    assert await outer == [[0, 1], 2]
    await _credited()
    assert _counts(prof, "g_inner", "g_outer") == {"g_inner": (1, 1), "g_outer": (0, 0)}


async def test_gather_is_asyncios_own_again_once_the_profiler_stops() -> None:
    original = asyncio.gather
    with asyncflow.profile("gathers", format="none"):
        assert asyncio.gather is not original and asyncio.tasks.gather is asyncio.gather
        assert asyncio.gather.__name__ == "gather" and asyncio.gather.__doc__ == original.__doc__
        # nested handles: the wrapper goes when the last is undone
        with gathers.install():
            pass
        assert asyncio.gather is not original
        assert await asyncio.gather() == []  # no children: asyncio's answer, uncounted
    assert asyncio.gather is original and asyncio.tasks.gather is original


async def test_counts_are_bounded_and_what_they_leave_out_is_counted(
    fake_clock: FakeClock, prof: asyncflow.Profiler, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gathers, "MAX_FUTURES", 1)
    ends = Ends(fake_clock, 4)

    @asyncflow.future(name="g_first")
    async def first(i: int) -> int:
        return await ends.child(i)

    @asyncflow.future(name="g_second")
    async def second(i: int) -> int:
        return await ends.child(i)

    outer = asyncio.gather(first(0), first(1))
    await ends.end(0, 1)
    await outer
    outer = asyncio.gather(first(2), second(3))
    await ends.end(2, 3)
    await outer
    await _credited()
    assert _counts(prof, "g_first", "g_second") == {"g_first": (2, 1), "g_second": (0, 0)}
    assert gathers.dropped() == 1


async def test_a_failing_observer_leaves_the_gather_alone(
    fake_clock: FakeClock, prof: asyncflow.Profiler, monkeypatch: pytest.MonkeyPatch
) -> None:
    ends = Ends(fake_clock, 2)

    @asyncflow.future(name="g_broken")
    async def child(i: int) -> int:
        return await ends.child(i)

    before = prof.snapshot().status.internal_errors
    monkeypatch.setattr(gathers, "_lock", None)  # the credit step fails inside asyncflow
    outer = asyncio.gather(child(0), child(1))
    await ends.end(0, 1)
    assert list(await outer) == [0, 1]
    await asyncio.sleep(0)  # the outer future's done-callback has run
    assert prof.snapshot().status.internal_errors == before + 1


async def _scenarios() -> list[object]:
    """What a program sees of its gathers: results, exceptions, cancellation."""

    @asyncflow.future(name="g_seen")
    async def child(i: int) -> int:
        await asyncio.sleep(0)
        if i == 2:
            raise ValueError(i)
        return i

    seen: list[object] = [await asyncio.gather(child(0), child(1))]
    seen.append(await asyncio.gather(child(1), child(2), return_exceptions=True))
    try:
        await asyncio.gather(child(2), child(0))
    except ValueError as exc:
        seen.append(("raised", exc.args))
    outer = asyncio.gather(child(0), asyncio.sleep(10))
    await asyncio.sleep(0)
    outer.cancel()
    try:
        await outer
    except asyncio.CancelledError:
        seen.append(("cancelled", outer.done(), outer.cancelled()))
    last = asyncio.gather(child(0), child(1))
    seen.append(type(last).__name__)
    seen.append(await last)
    return [repr(s) for s in seen]


async def test_what_the_program_sees_of_its_gathers_is_unchanged() -> None:
    plain = await _scenarios()
    with asyncflow.profile("gathers", format="none"):
        watched = await _scenarios()
    assert watched == plain


@pytest.mark.skipif(sys.version_info < (3, 12), reason="eager tasks are 3.12's")
async def test_a_child_an_eager_task_ended_at_once_was_not_waited_for(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    # An eager task that ends in its first step is done before gather() returns: the gather
    # did not wait for it. (Task.get_coro() of such a task crashes CPython 3.12.1: never read.)
    loop = asyncio.get_running_loop()
    loop.set_task_factory(asyncio.eager_task_factory)  # type: ignore[attr-defined]
    try:
        ends = Ends(fake_clock, 1)

        @asyncflow.future(name="g_eager_at_once")
        async def at_once() -> int:
            return -1

        @asyncflow.future(name="g_eager_waits")
        async def waits() -> int:
            return await ends.child(0)

        outer = asyncio.gather(at_once(), waits())
        await ends.end(0)
        assert list(await outer) == [-1, 0]
        await _credited()
    finally:
        loop.set_task_factory(None)
    assert _counts(prof, "g_eager_at_once", "g_eager_waits") == {
        "g_eager_at_once": (0, 0),
        "g_eager_waits": (1, 1),
    }
