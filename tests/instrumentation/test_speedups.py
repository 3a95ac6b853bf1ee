"""The compiled hot path (asyncflow/instrumentation/_speedups.c) against its pure-Python reference.

The same scenarios drive calls through both implementations of ``InstrumentedCoroutine`` on a
fake clock, and everything either records (every field of the call's record and of its future's
stats, the poll histogram) and everything the program observes (results, exceptions, warnings)
must be equal. The rest of the suite runs on whichever path was chosen at import; ``.ci/run``
runs it on both. Tests that need the compiled module skip where it was not built.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import gc
import inspect
import os
import subprocess
import sys
import time
import types
import warnings
from collections.abc import Callable, Coroutine, Generator
from typing import Any, cast

import pytest

import asyncflow
from asyncflow import stats
from asyncflow.clock import FakeClock
from asyncflow.instrumentation import futures, streams
from asyncflow.instrumentation.futures import FutureRecord, call_field, call_state
from asyncflow.model.collector import Collector
from tests.support.compiled_path import STATS_COUNTERS as _STATS_FIELDS
from tests.support.compiled_path import compiled

Wrap = Callable[[Coroutine[Any, Any, Any]], Any]

_RECORD_FIELDS = ("polls", "busy", "max", "last", "start")
_OPTIONAL_FIELDS = (
    "outcome",
    "exc_type",
    "exc_message",
    "result",
    "cancel_requests",
    "cancel_to_end",
    "cancel_outcome",
)


def _record(r: Any, origin: int) -> dict[str, Any]:
    """Every field of a call's record, times relative to ``origin``."""
    seen: dict[str, Any] = {name: getattr(r, name) for name in _RECORD_FIELDS}
    for name in ("created", "first", "finished", "cancel_at"):
        value = getattr(r, name)
        seen[name] = value - origin if value else 0
    seen.update((name, call_field(r, name)) for name in _OPTIONAL_FIELDS)
    seen["state"] = call_state(r)
    seen["has_task"] = call_field(r, "task") is not None
    return seen


def _future_stats(future: FutureRecord) -> dict[str, Any]:
    st = future.stats
    seen: dict[str, Any] = {name: getattr(st, name) for name in _STATS_FIELDS}
    seen["poll_hist"] = {b: n for b, n in st.poll_hist.items() if n}
    seen["live"] = len(st.live)
    return seen


Scenario = Callable[[Wrap, FakeClock], Coroutine[Any, Any, list[Any]]]
SCENARIOS: list[Scenario] = []


def scenario(fn: Scenario) -> Scenario:
    SCENARIOS.append(fn)
    return fn


@scenario
async def returns_after_polls(wrap: Wrap, clock: FakeClock) -> list[Any]:
    async def work(n: int) -> int:
        for _ in range(n):
            clock.advance(70)
            await asyncio.sleep(0)
        clock.advance(100_000)  # beyond the small buckets
        return n * 2

    task = asyncio.create_task(wrap(work(3)))
    clock.advance(5)
    return [await task, await wrap(work(0))]


@scenario
async def raises(wrap: Wrap, clock: FakeClock) -> list[Any]:
    async def fails() -> None:
        clock.advance(30)
        await asyncio.sleep(0)
        clock.advance(40)
        raise LookupError("no such key " * 30)

    try:
        await wrap(fails())
    except LookupError as exc:
        return [type(exc).__name__, len(str(exc))]
    return ["no error"]


@scenario
async def cancelled_by_its_task(wrap: Wrap, clock: FakeClock) -> list[Any]:
    async def sleeper() -> None:
        await asyncio.sleep(3600)

    task = asyncio.create_task(wrap(sleeper()))
    await asyncio.sleep(0)
    clock.advance(10)
    task.cancel("why")
    clock.advance(20)
    try:
        await task
    except asyncio.CancelledError as exc:
        return [exc.args, task.cancelled()]
    return ["not cancelled"]


@scenario
async def swallows_cancellation(wrap: Wrap, clock: FakeClock) -> list[Any]:
    async def stubborn() -> str:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            clock.advance(9)
            return "swallowed"
        return "slept"

    task = asyncio.create_task(wrap(stubborn()))
    await asyncio.sleep(0)
    task.cancel()
    return [await task, task.cancelling()]


@scenario
async def timeout_raises_something_else(wrap: Wrap, clock: FakeClock) -> list[Any]:
    async def slow() -> None:
        async with asyncio.timeout(0):
            await asyncio.sleep(3600)

    try:
        await wrap(slow())
    except TimeoutError:
        return ["timed out"]
    return ["no timeout"]


@scenario
async def closed_and_never_awaited(wrap: Wrap, clock: FakeClock) -> list[Any]:
    async def hang() -> None:
        await asyncio.Event().wait()

    started = wrap(hang())
    started.send(None)
    clock.advance(3)
    started.close()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        forgotten = wrap(hang())
        del forgotten
        gc.collect()
    return [[str(w.message).split("'")[0] for w in caught]]


@scenario
async def dropped_while_suspended(wrap: Wrap, clock: FakeClock) -> list[Any]:
    """Polled, then let go unfinished: its finalizer closes it, counted as closed and dropped
    (a task destroyed while pending is this); the call it awaited is closed by it, not dropped."""

    async def inner() -> None:
        await asyncio.Event().wait()

    async def outer() -> None:
        await wrap(inner())

    w = wrap(outer())
    w.send(None)
    clock.advance(4)
    del w
    gc.collect()
    return []


@scenario
async def driven_by_hand(wrap: Wrap, clock: FakeClock) -> list[Any]:
    async def two_steps() -> tuple[int, int]:
        got = await asyncio.sleep(0, result=5)
        return got, 7

    seen: list[Any] = []
    w = wrap(two_steps())
    seen.append(w.send(None))  # sleep(0) yields None to its driver
    try:
        w.send(None)
    except StopIteration as stop:
        seen.append(stop.value)
    try:
        w.send(None)
    except RuntimeError as exc:  # "cannot reuse already awaited coroutine"
        seen.append(str(exc))
    w2 = wrap(two_steps())
    seen.append(next(w2))
    try:
        next(w2)
    except StopIteration as stop:
        seen.append(stop.value)
    return seen


@scenario
async def thrown_into(wrap: Wrap, clock: FakeClock) -> list[Any]:
    async def catcher() -> str:
        try:
            await asyncio.sleep(0)
        except KeyError as exc:
            await asyncio.sleep(0)
            return f"caught {exc!r}"
        return "nothing"

    seen: list[Any] = []
    w = wrap(catcher())
    w.send(None)
    seen.append(w.throw(KeyError("one")))  # caught: it suspends again
    try:
        w.send(None)
    except StopIteration as stop:
        seen.append(stop.value)
    w = wrap(catcher())
    w.send(None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # throw(typ, val) on 3.12+
        seen.append(w.throw(KeyError, "legacy"))
    w.close()
    w = wrap(catcher())
    try:
        w.throw(ValueError)  # before the first poll: it never starts
    except ValueError as exc:
        seen.append(repr(exc))
    return seen


@scenario
async def logs_its_result(wrap: Wrap, clock: FakeClock) -> list[Any]:
    async def answer() -> str:
        return "x" * 300

    return [len(await wrap(answer()))]


@scenario
async def not_a_native_coroutine(wrap: Wrap, clock: FakeClock) -> list[Any]:
    """Generator-based coroutines, and an object registered as a Coroutine whose ``__next__``
    differs from ``send(None)``: both wrappers use ``send``."""

    @types.coroutine
    def legacy() -> Generator[Any, None, int]:
        yield
        return 42

    class Odd(Coroutine[Any, Any, str]):
        def __init__(self) -> None:
            self.sent: list[Any] = []

        def send(self, value: Any) -> Any:
            self.sent.append(value)
            if len(self.sent) > 1:
                raise StopIteration("odd done")
            return None

        def throw(self, *args: Any) -> Any:
            raise args[0]

        def close(self) -> None:
            pass

        def __next__(self) -> Any:
            raise AssertionError("__next__ is not how the wrapper polls")

        def __await__(self) -> Generator[Any, None, str]:
            raise AssertionError("not awaited directly")

    odd = Odd()
    return [await wrap(legacy()), await wrap(odd), odd.sent]


def _drive(
    impl: Any, scn: Scenario, log_result: bool, stats_cls: Any = None
) -> tuple[list[Any], list[Any], Any]:
    clock = FakeClock()
    previous = asyncflow.clock.set_clock(clock)
    try:
        future = FutureRecord("scn", "m:scn", "m.py", 1, log_result, "decorator")
        if stats_cls is not None:
            future.stats = stats_cls()
        calls: list[Any] = []

        def wrap(coro: Coroutine[Any, Any, Any]) -> Any:
            w = impl(coro, future)
            calls.append(w._r)
            return w

        async def main() -> list[Any]:
            with asyncflow.profile("parity", format="none"):
                return await scn(wrap, clock)

        seen = asyncio.run(main())
        origin = FakeClock()()
        return seen, [_record(r, origin) for r in calls], _future_stats(future)
    finally:
        asyncflow.clock.set_clock(previous)


@compiled
@pytest.mark.parametrize("log_result", [False, True])
@pytest.mark.parametrize("scn", SCENARIOS, ids=lambda s: s.__name__)
def test_same_records_as_the_reference(scn: Scenario, log_result: bool) -> None:
    python = _drive(futures.InstrumentedCoroutinePy, scn, log_result, futures.FutureStatsPy)
    assert python[1] and all(r["state"] != "running" for r in python[1])
    # The compiled wrapper with the compiled stats (C counters), and either with the other's
    # stats (the compiled wrapper's fallback to Python ints, the Python helpers on C counters).
    for impl, stats_cls in [
        (futures._speedups.InstrumentedCoroutine, futures._speedups.FutureStats),
        (futures._speedups.InstrumentedCoroutine, futures.FutureStatsPy),
        (futures.InstrumentedCoroutinePy, futures._speedups.FutureStats),
    ]:
        c = _drive(impl, scn, log_result, stats_cls)
        assert c[0] == python[0]  # what the program saw
        assert c[1] == python[1]  # every call's record
        assert c[2] == python[2]  # the future's stats and poll histogram


def test_the_implementation_is_chosen_at_import() -> None:
    if futures.accelerated:
        assert futures.InstrumentedCoroutine is futures._speedups.InstrumentedCoroutine
        assert futures.CallRecord is futures._speedups.CallRecord
        assert futures.running_on_thread is futures._speedups.running_calls
    else:
        assert futures.InstrumentedCoroutine is futures.InstrumentedCoroutinePy
        assert futures.CallRecord is futures.CallRecordPy
        assert futures.running_on_thread is futures._running_calls_py
    assert futures.InstrumentedCoroutine.__name__ == "InstrumentedCoroutine"


def test_no_extensions_forces_the_pure_python_path() -> None:
    code = (
        "import asyncflow, asyncio\n"
        "from asyncflow.instrumentation import futures\n"
        "async def main():\n"
        "    with asyncflow.profile('x', format='none') as p:\n"
        "        return futures.accelerated, p.snapshot().status.accelerated\n"
        "print(asyncio.run(main()))\n"
    )
    env = {**os.environ, "ASYNCFLOW_NO_EXTENSIONS": "1", "ASYNCFLOW_PORT": "0"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "(False, False)"


async def test_status_says_which_path_records(prof: asyncflow.Profiler) -> None:
    assert prof.snapshot().status.accelerated is futures.accelerated


@compiled
def test_bucket_of_matches_the_histograms() -> None:
    values = [*range(-3, 4_200), *(1 << k for k in range(63)), *((1 << k) - 1 for k in range(63))]
    values += [int(1.37**k) for k in range(130)]
    for ns in values:
        assert futures._speedups.bucket_of(ns) == stats.bucket_of(ns), ns
    assert futures._speedups.BUCKETS == stats.BUCKETS


@compiled
def test_the_clock_is_the_profilers_clock(fake_clock: FakeClock) -> None:
    assert futures._speedups.now_ns() == fake_clock()
    fake_clock.advance(12)
    assert futures._speedups.now_ns() == fake_clock()


@compiled
def test_the_real_clock_is_perf_counter_ns() -> None:
    import time

    before = time.perf_counter_ns()
    read = futures._speedups.now_ns()
    after = time.perf_counter_ns()
    assert before <= read <= after


@compiled
async def test_the_wrapper_looks_like_the_coroutine_it_wraps(prof: asyncflow.Profiler) -> None:
    async def named() -> None:
        await asyncio.sleep(0)

    coro = named()
    w: Any = asyncflow.instrument(coro)
    assert type(w) is futures._speedups.InstrumentedCoroutine
    assert w._coro is coro and isinstance(w._r, futures._speedups.CallRecord)
    seen_as: object = w
    assert asyncio.iscoroutine(seen_as) and isinstance(seen_as, Coroutine)
    assert inspect.iscoroutine(seen_as) and seen_as.__class__ is types.CoroutineType
    assert (w.__name__, w.__qualname__, w.cr_code) == (
        coro.__name__,
        coro.__qualname__,
        coro.cr_code,
    )
    assert repr(w) == repr(coro) and w.cr_frame is coro.cr_frame
    assert w.__await__() is w
    assert futures.InstrumentedCoroutine[int] is not None  # subscriptable, as the Python class
    with pytest.raises(AttributeError):
        w._coro = None
    with pytest.raises(AttributeError):
        _ = w.no_such_attribute
    await w


@compiled
def test_a_record_made_from_python_registers_as_the_reference_does() -> None:
    future = FutureRecord("r", "m:r", "m.py", 1, False, "decorator")
    r = futures._speedups.CallRecord(future, future.stats, 123)
    assert future.stats.live == {r.call_id: r} and future.stats.created == 1
    assert (r.created, r.polls, r.first, r.future, r.hist) == (123, 0, 0, future, {})
    assert call_field(r, "outcome") is None
    r.state = "ready"
    assert r.state == "ready"
    with pytest.raises(TypeError):
        r.polls = "many"


_FIGURES = [pytest.param(futures.InstrumentedCoroutinePy, futures.FutureStatsPy, id="reference")]
if futures._speedups is not None:
    _FIGURES += [
        pytest.param(futures._speedups.InstrumentedCoroutine, stats_cls, id=f"compiled-{kind}")
        for stats_cls, kind in [(futures._speedups.FutureStats, "c"), (futures.FutureStatsPy, "py")]
    ]


@pytest.mark.parametrize(("impl", "stats_cls"), _FIGURES)
def test_a_futures_first_call_names_the_call_it_was_made_in(impl: Any, stats_cls: Any) -> None:
    """Whichever wrapper makes the first call and whichever kind of figures it counts in, the
    future notes when that call was made and the future whose call was polled then."""
    inner = FutureRecord("inner", "m:inner", "m.py", 1, False, "decorator")
    inner.stats = stats_cls()

    async def leaf() -> int:
        return 7

    @asyncflow.future
    async def outer() -> int:
        return int(await impl(leaf(), inner))

    async def main() -> int:
        with asyncflow.profile("first caller", format="none"):
            return await outer()

    assert asyncio.run(main()) == 7
    assert inner.stats.first_call > 0
    assert inner.stats.first_caller == cast(Any, outer).future_record.id != 0


@types.coroutine
def _suspend(value: Any) -> Generator[Any, Any, None]:
    """A suspension point that yields ``value`` (the calls below are driven by hand)."""
    yield value


def _live_call(fn: Any) -> Any:
    (call,) = fn.future_record.stats.live.values()
    return call


@compiled
def test_nested_polls_of_a_chain_hand_each_other_their_clock_readings(
    prof: asyncflow.Profiler,
) -> None:
    mark = object()

    @asyncflow.future
    async def inner() -> None:
        await _suspend(mark)
        await _suspend(mark)

    @asyncflow.future
    async def outer() -> None:
        await inner()

    w = outer()
    assert w.send(None) is mark
    o, i = _live_call(outer), _live_call(inner)
    # The first poll: the outer call's code runs before the inner call starts, but what the
    # inner poll yields passes up unchanged, so both polls end at the inner poll's reading.
    assert o.first <= i.first and o.first + o.last == i.first + i.last
    assert w.send(None) is mark
    # A step through the chain: the outer poll resumes the inner one with no code between, and
    # the inner poll's yield passes up: one reading at each end, shared.
    assert (o.polls, i.polls) == (2, 2) and o.last == i.last
    with pytest.raises(StopIteration):
        w.send(None)


def _spin_until_the_clock_moves() -> None:
    moved = time.perf_counter_ns()
    while time.perf_counter_ns() == moved:
        pass


@compiled
@pytest.mark.parametrize("passes_up", [False, True], ids=["its-own", "the-inner-one"])
def test_a_call_that_drives_another_by_hand_ends_its_poll_at_its_own_reading(
    prof: asyncflow.Profiler, passes_up: bool
) -> None:
    """The relay yields something of its own, or what the tracked call it drives yielded: the
    same object, but the relay worked after it and does not await the call through."""
    mark, own = object(), object()

    @asyncflow.future
    async def inner() -> None:
        await _suspend(mark)

    @types.coroutine
    def relay(coro: Any) -> Generator[Any, Any, None]:
        """Drives a tracked call by hand, works, and yields."""
        yielded = coro.send(None)
        _spin_until_the_clock_moves()
        yield yielded if passes_up else own

    @asyncflow.future
    async def outer() -> None:
        await relay(inner())

    w = outer()
    assert w.send(None) is (mark if passes_up else own)
    o, i = _live_call(outer), _live_call(inner)
    assert o.first + o.last > i.first + i.last  # its own reading, after the relay's work
    w.close()


@compiled
@pytest.mark.skipif(not hasattr(asyncio, "eager_task_factory"), reason="3.12+")
def test_a_poll_that_ran_an_eager_task_reads_the_clock_itself(prof: asyncflow.Profiler) -> None:
    @asyncflow.future
    async def child() -> None:
        await asyncio.sleep(0)  # its first step, run eagerly inside the outer poll, yields None

    @asyncflow.future
    async def outer() -> int:
        task = asyncio.get_running_loop().create_task(child())
        c = _live_call(child)
        child_ended = c.first + c.last
        _spin_until_the_clock_moves()
        await asyncio.sleep(0)  # yields None too, after work of its own
        o = _live_call(outer)
        await task
        return int(o.first + o.last > child_ended)

    async def main() -> int:
        asyncio.get_running_loop().set_task_factory(asyncio.eager_task_factory)  # type: ignore[attr-defined, unused-ignore]
        return await outer()

    assert asyncio.run(main()) == 1


@compiled
def test_a_decorated_function_is_called_through_its_compiled_base(
    prof: asyncflow.Profiler,
) -> None:
    speedups = futures._speedups
    assert "__call__" not in vars(futures.FutureFunction)  # the base's, in C
    vectorcall_flag = 1 << 11  # Py_TPFLAGS_HAVE_VECTORCALL: called without an argument tuple
    assert futures.FutureFunction.__flags__ & vectorcall_flag

    class Box:
        @asyncflow.future
        async def add(self, x: int, *, y: int = 0) -> int:
            return x + y

    box = Box()
    assert asyncio.run(Box.add(box, 1, y=2)) == 3 and asyncio.run(box.add(4)) == 4
    assert Box.__dict__["add"].future_record.stats.created == 2
    seen: list[tuple[Any, ...]] = []

    def reference(self: Any, *args: Any, **kwargs: Any) -> Any:  # as benchmarks/run.py swaps
        seen.append(args)
        return futures._py_future_call(self, *args, **kwargs)

    futures.FutureFunction.__call__ = reference  # type: ignore[method-assign]
    try:  # 3.11 keeps the class's vectorcall flag: the C call finds the new __call__ itself
        assert asyncio.run(box.add(5, y=1)) == 6 and seen == [(box, 5)]
        box.add.__dict__["__call__"] = None  # an instance attribute is not what Python calls
        assert asyncio.run(box.add(1)) == 1 and len(seen) == 2
        del box.add.__dict__["__call__"]
        speedups.calls_without_method(futures.FutureFunction, False)
        assert not futures.FutureFunction.__flags__ & vectorcall_flag
        assert asyncio.run(box.add(5, y=1)) == 6 and len(seen) == 3
    finally:
        del futures.FutureFunction.__call__  # the C call again
        speedups.calls_without_method(futures.FutureFunction)
    assert futures.FutureFunction.__flags__ & vectorcall_flag
    assert asyncio.run(box.add(7)) == 7 and len(seen) == 3
    assert Box.__dict__["add"].future_record.stats.created == 6
    with pytest.raises(TypeError, match="subclass of FunctionBase"):
        speedups.calls_without_method(Box)

    class OwnCall(speedups.FunctionBase):  # type: ignore[misc, name-defined]
        def __call__(self) -> str:
            return "own"

    with pytest.raises(TypeError, match="defines __call__"):
        speedups.calls_without_method(OwnCall)
    assert OwnCall()() == "own"


@compiled
def test_no_reference_is_leaked_on_any_path(prof: asyncflow.Profiler) -> None:
    """Every path (return, raise, cancel, close, throw, never awaited) leaves the reference
    counts of what passed through it, and the number of live objects, as they were."""
    result, error = object(), KeyError("k")

    async def returns() -> object:
        await asyncio.sleep(0)
        return result

    async def raises() -> None:
        await asyncio.sleep(0)
        raise error

    async def hangs() -> None:
        await asyncio.Event().wait()

    async def rounds(n: int) -> None:
        for _ in range(n):
            assert await asyncflow.instrument(returns()) is result
            with contextlib.suppress(KeyError):
                await asyncflow.instrument(raises())
            task = asyncio.create_task(asyncflow.instrument(hangs()))
            await asyncio.sleep(0)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            w = asyncflow.instrument(hangs())
            w.send(None)
            with contextlib.suppress(KeyError):
                w.throw(error)
            w = asyncflow.instrument(hangs())
            w.send(None)
            w.close()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                forgotten = asyncflow.instrument(hangs())
                del forgotten

    def counts() -> tuple[int, int, int]:
        prof.snapshot()  # the collector folds every finished call: only the recent ones stay
        gc.collect()
        return sys.getrefcount(result), sys.getrefcount(error), len(gc.get_objects())

    asyncio.run(rounds(50))  # warm up: caches, interned ints, the histogram's buckets
    error.__traceback__ = None
    before = counts()
    asyncio.run(rounds(500))
    error.__traceback__ = None
    after = counts()
    assert after[:2] == before[:2]
    assert after[2] - before[2] < 200, (before, after)  # 3,000 calls: none of them kept


@pytest.mark.parametrize(
    ("value", "forced"),
    [("", False), ("0", False), ("no", False), ("1", True), ("yes", True), (" ON ", True)],
)
def test_no_extensions_is_read_like_every_switch(value: str, forced: bool) -> None:
    assert asyncflow.config.no_extensions({"ASYNCFLOW_NO_EXTENSIONS": value}) is forced
    assert asyncflow.config.no_extensions({}) is False


def test_the_report_header_says_when_the_python_path_recorded() -> None:
    from asyncflow.render.report import render_table
    from asyncflow.schema import FuturesDocument, ProfilerStatus, Snapshot

    def header(accelerated: bool | None) -> str:
        status = ProfilerStatus(
            1, "svc", "0", 1, "3.11", 10**9, False, 0, 0, 0, None, 0, 0, 0, 0, accelerated
        )
        snap = Snapshot(1, status, FuturesDocument(1, 0, 0, 0, []))
        return render_table(snap, (50.0,), limit=0).splitlines()[0]

    assert header(False).endswith(" · pure-Python hot path")
    assert "pure-Python" not in header(True) and "pure-Python" not in header(None)


@compiled
def test_every_slot_is_read_in_place() -> None:
    """The compiled path finds every slot it reads at its offset: a renamed or retyped slot in
    futures.py, _session.py or streams.py would silently take the slow attribute path."""
    assert futures._speedups is not None
    assert all(futures._speedups.fields().values()), futures._speedups.fields()


@compiled
def test_each_step_is_its_own_awaitable(prof: asyncflow.Profiler) -> None:
    """Steps come from a free list: one still held is never handed out again, and a step is
    awaited once, as a coroutine is."""

    async def numbers() -> Any:
        for i in range(4):
            yield i

    async def main() -> None:
        it: Any = asyncflow.stream(numbers(), name="steps")
        first = it.__anext__()
        assert await first == 0
        second = it.__anext__()
        assert second is not first
        with pytest.raises(RuntimeError, match="cannot reuse"):
            await first
        assert await second == 1
        del first, second
        for expected in (2, 3):
            assert await it.__anext__() == expected
        with pytest.raises(StopAsyncIteration):
            await it.__anext__()

    asyncio.run(main())


@compiled
def test_no_reference_is_leaked_by_wrapped_iterables(prof: asyncflow.Profiler) -> None:
    """Items, errors, cancellation and abandoned iterations through the compiled stream wrapper
    leave the reference counts and the number of live objects as they were, with the cyclic GC
    off (nothing may need it)."""
    item, error = object(), KeyError("k")

    async def gives(n: int) -> Any:
        for _ in range(n):
            yield item

    async def fails() -> Any:
        yield item
        raise error

    async def hangs() -> Any:
        yield item
        await asyncio.Event().wait()
        yield item

    async def rounds(n: int) -> None:
        for _ in range(n):
            assert [x async for x in asyncflow.stream(gives(3))] == [item] * 3
            with contextlib.suppress(KeyError):
                async for _x in asyncflow.stream(fails()):
                    pass
            it: Any = asyncflow.stream(hangs())
            assert await it.__anext__() is item
            task = asyncio.ensure_future(it.__anext__())
            await asyncio.sleep(0)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await it.aclose()
            abandoned: Any = asyncflow.stream(gives(5))
            assert await abandoned.__anext__() is item
            await abandoned.aclose()
            del abandoned

    def counts() -> tuple[int, int, int]:
        prof.snapshot()
        gc.collect()
        return sys.getrefcount(item), sys.getrefcount(error), len(gc.get_objects())

    asyncio.run(rounds(20))
    error.__traceback__ = None
    before = counts()
    gc.disable()
    try:
        asyncio.run(rounds(300))
        error.__traceback__ = None
        after_no_gc = sys.getrefcount(item), sys.getrefcount(error)
    finally:
        gc.enable()
    after = counts()
    assert after_no_gc == before[:2]  # nothing waited for the cyclic GC to let go of them
    assert after[:2] == before[:2]
    assert after[2] - before[2] < 200, (before, after)


@compiled
def test_a_streams_counters_are_c_integers_read_as_ints() -> None:
    """On the compiled path a stream's ``items`` and ``arm`` are C integers (StreamCounter),
    read and set from Python as ints, beside the reference's other attributes."""
    assert streams.StreamStatsC is not None
    st = streams.StreamStatsC()
    reference = streams.StreamStatsPy()
    assert set(streams.StreamStatsPy.__slots__) <= set(dir(st))
    assert (st.items, st.arm, st.interval) == (reference.items, reference.arm, 1)
    st.items = 2**40
    st.items += 1
    assert st.items == 2**40 + 1 and type(st.items) is int
    with pytest.raises(TypeError, match="counter is an int, not str"):
        st.arm = "1"
    with pytest.raises(TypeError, match="cannot be deleted"):
        del st.items
    with pytest.raises(OverflowError):
        st.items = 2**70
    assert st.items == 2**40 + 1


@compiled
@pytest.mark.parametrize("counted_in", ["c", "python"])
def test_the_compiled_wrapper_counts_in_either_kind_of_stats(counted_in: str) -> None:
    """The compiled wrapper counts and samples alike in C counters and in the reference's
    Python ints (benchmarks/run.py swaps them for its pure-Python column)."""

    async def numbers(n: int) -> Any:
        for i in range(n):
            yield i

    async def main() -> list[int]:
        it: Any = asyncflow.stream(numbers(30), name=f"counted in {counted_in}")
        if counted_in == "python":
            it._iteration.record.stats = streams.StreamStatsPy()
            fresh = streams.InstrumentedAsyncIterator(numbers(30), it._iteration.record)
            it = fresh
        return [i async for i in it]

    with asyncflow.profile("counters", format="none", sampling=4) as prof:
        assert streams.InstrumentedAsyncIterator is streams.InstrumentedAsyncIteratorC
        assert asyncio.run(main()) == list(range(30))
        snap = prof.snapshot()
    assert snap.streams is not None
    (entry,) = [s for s in snap.streams.streams if s.label == f"counted in {counted_in}"]
    assert (entry.items_yielded, entry.timed_count, entry.sampling_interval) == (30, 8, 4)


_FACTORY_CALLS = [pytest.param("reference", id="reference")]
if futures._speedups is not None:
    _FACTORY_CALLS.append(pytest.param("compiled", id="compiled"))


@pytest.mark.parametrize("impl", _FACTORY_CALLS)
def test_the_task_factory_tracks_alike_on_both_paths(
    impl: str, prof: asyncflow.Profiler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whole-program mode's factory, compiled or the reference: every way a task is made (a
    context, a name, a direct call with other keywords, a replaced asyncio.Task, a coroutine
    already tracked) gives the same tasks and the same records."""
    if impl == "reference":
        monkeypatch.setattr(futures._TaskFactory, "__call__", futures._py_task_factory_call)
    made: list[str] = []

    class CountedTask(asyncio.Task):  # type: ignore[type-arg]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            made.append(kwargs.get("name") or "?")
            super().__init__(*args, **kwargs)

    async def leaf(n: int) -> int:
        await asyncio.sleep(0)
        return n

    tracked_leaf = asyncflow.future(name=f"decorated leaf {impl}")(leaf)

    async def main() -> list[Any]:
        loop = asyncio.get_running_loop()
        with asyncflow.instrument_tasks():
            factory: Any = loop.get_task_factory()
            tasks = [
                asyncio.create_task(leaf(1)),
                loop.create_task(leaf(2), name="named"),
                asyncio.create_task(leaf(3), context=contextvars.copy_context()),
                factory(loop, leaf(4), name="direct"),
                asyncio.create_task(tracked_leaf(5)),  # already tracked: not wrapped again
            ]
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(asyncio, "Task", CountedTask)
                tasks.append(asyncio.create_task(leaf(6)))
            results = await asyncio.gather(*tasks)
        return [results, [t.get_name() for t in tasks[1:4:2]], type(tasks[-1]) is CountedTask]

    results, names, counted = asyncio.run(main())
    assert results == [1, 2, 3, 4, 5, 6]
    assert names == ["named", "direct"] and counted and made == ["?"]
    snap = prof.snapshot()
    # (by its own qualified name: another test's ``leaf`` may still be alive, its future too)
    (tasks,) = [f for f in snap.futures.futures if f.label.endswith("both_paths.<locals>.leaf")]
    assert tasks.call_count == 5  # leaf(1), (2), (3), (4), (6): one future, by the code
    (decorated,) = [f for f in snap.futures.futures if f.label == f"decorated leaf {impl}"]
    assert decorated.call_count == 1


@pytest.mark.parametrize("impl", _FACTORY_CALLS)
def test_a_failure_to_track_a_task_still_makes_the_task(
    impl: str, prof: asyncflow.Profiler, monkeypatch: pytest.MonkeyPatch
) -> None:
    if impl == "reference":
        monkeypatch.setattr(futures._TaskFactory, "__call__", futures._py_task_factory_call)

    def broken(coro: Any) -> Any:
        raise LookupError("no record")

    async def first_sight() -> str:
        return "ran"

    async def main() -> str:
        with asyncflow.instrument_tasks():
            monkeypatch.setattr(futures, "_task_record", broken)
            task = asyncio.create_task(first_sight())
            return await task

    errors = prof.snapshot().status.internal_errors
    assert asyncio.run(main()) == "ran"
    status = prof.snapshot().status
    assert status.internal_errors == errors + 1
    assert "instrumenting a task" in (status.last_internal_error or "")


@pytest.mark.parametrize("impl", _FACTORY_CALLS)
def test_an_interrupt_while_tracking_a_task_reaches_the_program(
    impl: str, prof: asyncflow.Profiler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only errors of asyncflow's own are swallowed: a KeyboardInterrupt raised while a task is
    being tracked goes on to the program, as it would have there without asyncflow."""
    if impl == "reference":
        monkeypatch.setattr(futures._TaskFactory, "__call__", futures._py_task_factory_call)

    def interrupted(coro: Any) -> Any:
        raise KeyboardInterrupt

    async def first_sight() -> str:
        return "ran"

    async def main() -> None:
        with asyncflow.instrument_tasks():
            monkeypatch.setattr(futures, "_task_record", interrupted)
            coro = first_sight()
            try:
                with pytest.raises(KeyboardInterrupt):
                    asyncio.create_task(coro)  # noqa: RUF006 (it raises: no task)
            finally:
                coro.close()

    errors = prof.snapshot().status.internal_errors
    asyncio.run(main())
    assert prof.snapshot().status.internal_errors == errors


@compiled
def test_no_reference_is_leaked_by_the_task_factory(prof: asyncflow.Profiler) -> None:
    """Tasks made through the compiled factory (tracked, with a context, chained to a factory
    of the program's, failing to track, called with other keywords) leave the reference counts
    and the number of live objects as they were, GC off."""
    result = object()
    real_task_record = futures._task_record

    async def job() -> object:
        return result

    async def untracked() -> object:
        return result

    def failing(coro: Any) -> Any:
        if coro.cr_code is untracked.__code__:
            raise LookupError("no record")
        return real_task_record(coro)

    def programs(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> Any:
        return asyncio.Task(coro, loop=loop, **kwargs)

    async def rounds(n: int) -> None:
        loop = asyncio.get_running_loop()
        with asyncflow.instrument_tasks():
            factory: Any = loop.get_task_factory()
            for _ in range(n):
                assert await asyncio.create_task(job()) is result
                ctx = contextvars.copy_context()
                assert await asyncio.create_task(job(), context=ctx) is result
                assert await loop.create_task(job(), name="named") is result
                assert await factory(loop, job(), name="direct") is result  # the reference's
                assert await asyncio.create_task(untracked()) is result
        loop.set_task_factory(programs)
        try:
            with asyncflow.instrument_tasks():
                for _ in range(n):
                    assert await asyncio.create_task(job()) is result
        finally:
            loop.set_task_factory(None)

    futures._task_record = failing  # restored below

    def counts() -> tuple[int, int]:
        prof.snapshot()
        gc.collect()
        return sys.getrefcount(result), len(gc.get_objects())

    errors = prof.snapshot().status.internal_errors
    try:
        asyncio.run(rounds(20))
        before = counts()
        gc.disable()
        try:
            asyncio.run(rounds(300))
            after_no_gc = sys.getrefcount(result)
        finally:
            gc.enable()
    finally:
        futures._task_record = real_task_record
    after = counts()
    assert after_no_gc == before[0]
    assert after[0] == before[0] and abs(after[1] - before[1]) < 50, (before, after)
    assert prof.snapshot().status.internal_errors == errors + 320  # every failing round


@compiled
def test_the_compiled_fold_matches_the_reference() -> None:
    """The collector's fold of finished calls, compiled and in Python, on the same calls: C
    and Python records, a call of an earlier session (not counted), a full log of recent calls,
    the live reporter and the users' recorders; and an error midway keeps the count taken."""

    class Live:
        def __init__(self) -> None:
            self.added: list[int] = []

        def add(self, r: Any) -> None:
            self.added.append(r.created)

    def scene() -> tuple[Any, Any, list[int], FutureRecord]:
        future = FutureRecord("fold", "m:fold", "m.py", 1, False, "decorator")
        earlier = futures._new_stats()
        finished: Any = collections.deque()
        for created, took in ((10, 5), (20, 70), (30, 9_000), (40, 2**40)):
            r = futures._speedups.CallRecord(future, future.stats, created)
            r.finished = created + took
            finished.append(r)
        python = futures.CallRecordPy(future, future.stats, 50)
        python.finished = 50 + 123
        finished.append(python)
        late = futures._speedups.CallRecord(future, earlier, 60)
        late.finished = 61
        finished.append(late)
        given: list[int] = []
        collector = types.SimpleNamespace(
            session=types.SimpleNamespace(finished=finished),
            options=types.SimpleNamespace(recent_logs=3),
            live=Live(),
            taken=0,
        )
        return collector, finished, given, future

    def outcome(collector: Any, future: FutureRecord, folded: int, given: list[int]) -> Any:
        st = future.stats
        return (
            folded,
            collector.taken,
            dict(st.call_hist),
            [r.created for r in st.recent],
            st.recent.maxlen,
            collector.live.added,
            given,
        )

    ref, finished, given, future = scene()
    folded = Collector._fold_finished_py(ref, finished)
    python = outcome(ref, future, folded, given)
    ours, finished, given, future = scene()
    folded = futures._speedups.fold_finished(ours, finished, 3, ours.live, None)
    assert outcome(ours, future, folded, given) == python
    assert python[:2] == (5, 6) and python[3] == [30, 40, 50]

    ours, finished, given, future = scene()
    folded = futures._speedups.fold_finished(
        ours, finished, 3, None, lambda r: given.append(r.created)
    )
    assert (folded, given, ours.live.added) == (5, [10, 20, 30, 40, 50], [])

    ours, finished, given, future = scene()

    def fails(r: Any) -> None:
        if r.created == 30:
            raise LookupError("a recorder failed")

    with pytest.raises(LookupError):
        futures._speedups.fold_finished(ours, finished, 3, None, fails)
    assert ours.taken == 3 and len(finished) == 3  # the third was taken, the rest wait


def test_a_task_of_code_seen_before_follows_each_session_and_filter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The compiled factory remembers the future it found for a code object, while the table
    it found it in is unchanged: each profile counts its own calls, and a filter set after
    the code was seen still leaves its tasks untracked."""

    async def seen(n: int) -> int:
        await asyncio.sleep(0)
        return n

    def session(untracked: bool = False) -> int:
        async def main() -> list[int]:
            with asyncflow.instrument_tasks():
                return list(await asyncio.gather(*(asyncio.create_task(seen(i)) for i in range(5))))

        with asyncflow.profile("seen", format="none") as prof:
            if untracked:  # (set once the profile started, which installs its own patterns)
                monkeypatch.setattr(futures, "task_filter", lambda coro: False)
            assert asyncio.run(main()) == [0, 1, 2, 3, 4]
        calls = [f.call_count for f in prof.snapshot().futures.futures if f.label.endswith(".seen")]
        return sum(calls)

    assert session() == 5
    assert session() == 5  # its own five, not ten
    assert session(untracked=True) == 0


@compiled
def test_a_decorated_functions_subclass_is_read_as_its_class_says() -> None:
    """The compiled call reads ``__wrapped__`` and ``future_record`` in their slots on
    FutureFunction and on a subclass that keeps them (own_code.OwnFunction), and through the
    attribute where a subclass puts its own in their place."""

    async def work() -> int:
        return 1

    decorated: Any = asyncflow.future(name="slot of its own")(work)
    other: Any = asyncflow.future(name="the property's")(work)  # (alive: its future is listed)
    elsewhere = other.future_record

    class Kept(type(decorated)):  # type: ignore[misc]
        pass

    class Redirected(type(decorated)):  # type: ignore[misc]
        @property
        def future_record(self) -> Any:
            return elsewhere

        @future_record.setter
        def future_record(self, value: Any) -> None:
            pass

    kept = Kept(work, decorated.future_record)
    redirected = Redirected(work, decorated.future_record)

    async def main() -> list[int]:
        return [await kept(), await redirected(), await kept()]

    with asyncflow.profile("sub", format="none") as prof:
        assert asyncio.run(main()) == [1, 1, 1]
    counts = {f.label: f.call_count for f in prof.snapshot().futures.futures}
    assert counts["slot of its own"] == 2 and counts["the property's"] == 1
