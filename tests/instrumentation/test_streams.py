"""Instrumented async iterators and generators: transparency, states, per-item waits."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import inspect
import os
import traceback
import types
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

import pytest

import asyncflow
from asyncflow.clock import FakeClock
from asyncflow.instrumentation import streams
from asyncflow.schema import Snapshot, StreamEntry, StreamLogs

Gen = Callable[[], AsyncIterator[int]]

_WRAPPER_IMPLS = [pytest.param(streams.InstrumentedAsyncIteratorPy, id="python-wrapper")]
if streams.InstrumentedAsyncIteratorC is not None:
    _WRAPPER_IMPLS.append(pytest.param(streams.InstrumentedAsyncIteratorC, id="compiled-wrapper"))


@pytest.fixture(autouse=True, params=_WRAPPER_IMPLS)
def wrapper_impl(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Every test runs with each implementation of the wrapped iterator: the pure-Python
    reference and, where it is built, the compiled one."""
    monkeypatch.setattr(streams, "InstrumentedAsyncIterator", request.param)
    return request.param


def _stream(snap: Snapshot, label: str) -> tuple[StreamEntry, StreamLogs]:
    assert snap.streams is not None
    (entry,) = [s for s in snap.streams.streams if s.label == label]
    (logs,) = [log for log in snap.stream_logs if log.stream_id == entry.id]
    return entry, logs


def make(track: Callable[[Any], Any]) -> Gen:
    @track
    async def numbers() -> AsyncIterator[int]:
        total = 0
        try:
            for i in range(5):
                try:
                    sent = yield i
                except KeyError as exc:
                    yield -len(str(exc))
                    continue
                if sent is not None:
                    total += sent
                await asyncio.sleep(0)
            if total > 100:
                raise ValueError(f"total {total}")
        finally:
            await asyncio.sleep(0)

    return numbers  # type: ignore[no-any-return]


async def _scenario(numbers: Gen) -> list[Any]:
    seen: list[Any] = [[i async for i in numbers()]]
    it: Any = numbers()
    seen.append(await it.__anext__())
    seen.append(await it.asend(50))
    seen.append(await it.athrow(KeyError("boom")))
    seen.append(await it.asend(60))
    try:
        await it.asend(70)
        await it.__anext__()
        await it.__anext__()  # the loop ends: total > 100 raises
    except ValueError as exc:
        seen.append(str(exc))
    early = numbers()
    async for i in early:
        if i == 2:
            break
    await early.aclose()  # type: ignore[attr-defined]
    waiting = numbers()
    await waiting.__anext__()
    task = asyncio.ensure_future(waiting.__anext__())
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        seen.append("cancelled")
    await waiting.aclose()  # type: ignore[attr-defined]
    return seen


def _identity(fn: Any) -> Any:
    return fn


async def test_streams_behave_exactly_as_before() -> None:
    plain = await _scenario(make(_identity))
    with asyncflow.profile("streams", format="none") as prof:
        decorated = make(asyncflow.stream(name="numbers-decorated"))
        assert inspect.isasyncgenfunction(decorated)
        tracked = await _scenario(decorated)
        plain_fn = make(_identity)
        wrapped = await _scenario(lambda: asyncflow.stream(plain_fn(), name="numbers-wrapped"))
        snap = prof.snapshot()
    assert tracked == plain
    assert wrapped == plain
    # The cancelled task was handed the wrapper's step, cancelled before it started: it asked
    # the generator for nothing, and only the aclose() afterwards ended the generator.
    for label in ("numbers-decorated", "numbers-wrapped"):
        entry, _ = _stream(snap, label)
        assert entry.items_yielded == 5 + 6 + 3 + 1, entry.instances
        assert entry.instances == {
            "active": 0,
            "exhausted": 1,
            "closed": 2,
            "cancelled": 0,
            "failed": 1,
        }


async def test_waits_and_consumer_time_on_a_fake_clock(fake_clock: FakeClock) -> None:
    @asyncflow.stream(name="ticks", log_items=True)
    async def ticks() -> AsyncIterator[str]:
        for i in range(3):
            fake_clock.advance(100 * (i + 1))  # the producer's work for item i
            yield f"tick {i}"

    with asyncflow.profile("ticks", format="none") as prof:
        async for _ in ticks():
            fake_clock.advance(1_000)  # the consumer's work between items
        snap = prof.snapshot()
    entry, logs = _stream(snap, "ticks")
    assert (entry.items_yielded, entry.total_wait_ns, entry.max_wait_ns) == (3, 600, 300)
    assert (
        entry.consumer_ns == 2_000 + 1_000
    )  # between items, and before the final StopAsyncIteration
    assert entry.state == "exhausted"
    assert [(e.index, e.wait_ns, e.item) for e in logs.items] == [
        (2, 300, "'tick 2'"),
        (1, 200, "'tick 1'"),
        (0, 100, "'tick 0'"),
    ]


def test_misuse() -> None:
    async def not_a_generator() -> None:
        pass

    with pytest.raises(TypeError, match="async generator function"):
        asyncflow.stream(not_a_generator)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="needs an async iterable"):
        asyncflow.stream(42)  # type: ignore[call-overload]


class _Base:
    def scale(self) -> int:
        return 10


class _Source(_Base):
    def __init__(self) -> None:
        self.__secret = 3  # name-mangled: the rewritten method must mangle alike

    @asyncflow.stream(name="method")
    async def items(self, n: int, *, bump: int = 0) -> AsyncGenerator[Any, Any]:
        """Yields n items."""
        for i in range(n):
            reply = yield i * super().scale() + self.__secret + bump
            if reply is not None:
                yield reply  # a bare statement yield after an assignment yield
        total = sum([(yield -1)])  # a yield inside an expression
        yield total


async def test_the_decorated_function_is_still_an_async_generator_function() -> None:
    offset = 100

    @asyncflow.stream(name="closure")
    async def shifted(xs: list[int]) -> AsyncIterator[int]:
        for x in xs:
            yield x + offset

    with asyncflow.profile("real", format="none") as prof:
        assert inspect.isasyncgenfunction(shifted)
        gen = shifted([1, 2])
        assert isinstance(gen, AsyncGenerator)  # asend, athrow, aclose: the generator's
        # what a library asks of an async generator, as it would be told without asyncflow
        assert inspect.isasyncgen(gen) and isinstance(gen, types.AsyncGeneratorType)
        assert type(gen) is not types.AsyncGeneratorType  # (it is still the wrapper)
        assert gen.ag_code is inspect.unwrap(shifted).__code__
        assert [x async for x in gen] == [101, 102]
        src = _Source()
        it: Any = src.items(2, bump=1)
        got = [await it.__anext__(), await it.asend("echo"), await it.__anext__()]
        got += [await it.__anext__(), await it.asend(7)]
        with pytest.raises(StopAsyncIteration):
            await it.asend(None)
        snap = prof.snapshot()
    assert got == [4, "echo", 14, -1, 7]
    assert _Source.items.__doc__ == "Yields n items."
    assert _Source.items.__qualname__ == "_Source.items"
    assert inspect.signature(_Source.items) == inspect.signature(inspect.unwrap(_Source.items))
    method, _ = _stream(snap, "method")
    assert method.items_yielded == 5 and method.state == "exhausted"
    closure, _ = _stream(snap, "closure")
    assert closure.items_yielded == 2


def test_tracebacks_show_the_generators_own_lines() -> None:
    def plain_trace(track: Callable[[Any], Any]) -> list[tuple[str, int | None, str | None]]:
        @track
        async def failing() -> AsyncIterator[int]:
            yield 1
            raise LookupError("the third line of the body")

        async def run() -> None:
            async for _ in failing():
                pass

        try:
            asyncio.run(run())
        except LookupError as exc:
            return [(f.filename, f.lineno, f.line) for f in traceback.extract_tb(exc.__traceback__)]
        raise AssertionError("no error")

    plain = plain_trace(_identity)
    with asyncflow.profile("trace", format="none"):
        tracked = plain_trace(asyncflow.stream)
    if streams.InstrumentedAsyncIterator is streams.InstrumentedAsyncIteratorPy:
        # the reference's wrapper shows its own frame (_step) above the generator's
        tracked = [f for f in tracked if not f[0].startswith(_ASYNCFLOW_DIR)]
    assert tracked == plain
    assert plain[-1][2] == 'raise LookupError("the third line of the body")'


def test_without_source_the_wrapper_still_counts() -> None:
    namespace: dict[str, Any] = {}
    exec("async def gen(n):\n    for i in range(n):\n        yield i\n", namespace)
    tracked = asyncflow.stream(name="from-exec")(namespace["gen"])
    assert inspect.isasyncgenfunction(tracked)

    async def run() -> list[int]:
        return [i async for i in tracked(4)]

    gc.collect()  # the function the other wrapper's run made is gone: a new profile omits it
    with asyncflow.profile("exec", format="none") as prof:
        assert asyncio.run(run()) == [0, 1, 2, 3]
        snap = prof.snapshot()
    entry, _ = _stream(snap, "from-exec")
    assert (entry.items_yielded, entry.state) == (4, "exhausted")


async def _sampled(
    fake_clock: FakeClock, name: str, items: int, use: Callable[[int], int]
) -> tuple[StreamEntry, StreamLogs]:
    """A stream of ``items`` items that take 30 ns each to make and ``use(i)`` ns each to use,
    iterated once with one item in eight timed: its entry and logs."""

    @asyncflow.stream(name=name, log_items=True)
    async def made() -> AsyncIterator[int]:
        for i in range(items):
            fake_clock.advance(30)
            yield i

    with asyncflow.profile(name, format="none", sampling=8) as prof:
        async for i in made():
            fake_clock.advance(use(i))
        snap = prof.snapshot()
    return _stream(snap, name)


async def test_sampled_items_stand_for_the_items_between_them(fake_clock: FakeClock) -> None:
    entry, logs = await _sampled(fake_clock, "sampled", 40, lambda i: 70)
    assert (entry.items_yielded, entry.sampling_interval) == (40, 8)
    assert [e.index for e in reversed(logs.items)] == [0, 8, 16, 24, 32]
    assert entry.timed_count == 5 and {e.wait_ns for e in logs.items} == {30}
    # Weighted totals: each timed item stands for the eight since the previous one.
    assert entry.total_wait_ns == 30 * (1 + 8 * 4)
    # The consumer's time is the iteration's whole time less those waits (the seven items
    # after the last timed one are in the whole time, not yet in the waits' estimate).
    assert entry.consumer_ns == 40 * (30 + 70) - entry.total_wait_ns


async def test_the_consumers_time_holds_when_its_time_between_items_varies(
    fake_clock: FakeClock,
) -> None:
    """A consumer that is slow on the items that are not timed (it waits on a full channel
    now and then): one timed gap standing for eight read its time 30 times off, once. The
    iteration's whole time, less the waits, reads it within one interval of waits."""

    def use(i: int) -> int:
        return 10_000 if i % 8 == 4 else 10  # slow between untimed items

    entry, _ = await _sampled(fake_clock, "uneven", 100, use)
    assert entry.sampling_interval == 8
    spent = sum(use(i) for i in range(100))
    assert abs(entry.consumer_ns - spent) <= 8 * 30, (entry.consumer_ns, spent)


async def test_the_log_keeps_the_last_timed_items(fake_clock: FakeClock) -> None:
    @asyncflow.stream(name="long", log_items=True)
    async def long() -> AsyncIterator[int]:
        for i in range(250):
            fake_clock.advance(i)  # item i waits i ns
            yield i

    with asyncflow.profile("long", format="none", sampling=1) as prof:
        assert [i async for i in long()] == list(range(250))
        snap = prof.snapshot()
    entry, logs = _stream(snap, "long")
    assert entry.timed_count == 250
    newest = list(range(249, 249 - streams.STREAM_LOG_SIZE, -1))
    assert [(e.index, e.wait_ns, e.item) for e in logs.items] == [(i, i, repr(i)) for i in newest]


async def test_an_aggregate_of_gone_streams_keeps_their_last_items(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A gone stream folded into its label's aggregate hands it its last items."""
    monkeypatch.setattr(streams._history, "kept", 0)  # every gone stream is folded at once
    with asyncflow.profile("folded", format="none", sampling=1) as prof:
        for count in (0, 6, 12):
            namespace: dict[str, Any] = {}
            exec("async def gone(n):\n    for i in range(n):\n        yield i\n", namespace)
            tracked = asyncflow.stream(log_items=True)(namespace["gone"])
            assert [i async for i in tracked(count)] == list(range(count))
            del namespace, tracked  # the code goes with them
        gc.collect()
        snap = prof.snapshot()
    assert snap.streams is not None
    (aggregate,) = [s for s in snap.streams.streams if s.label == "gone"]
    (logs,) = [log for log in snap.stream_logs if log.stream_id == aggregate.id]
    assert aggregate.folded_count == 3 and aggregate.items_yielded == 0 + 6 + 12
    # the second's six items, then the third's twelve: the last ten, newest first
    assert [(e.index, e.item) for e in logs.items] == [(i, repr(i)) for i in range(11, 1, -1)]


def test_a_wrapped_function_is_not_mistaken_for_the_one_it_wraps() -> None:
    def doubled(fn: Callable[[int], AsyncIterator[int]]) -> Callable[[int], AsyncIterator[int]]:
        @functools.wraps(fn)  # inspect.getsource() would show fn's source, not this one's
        async def wrapper(n: int) -> AsyncIterator[int]:
            async for x in fn(n):
                yield x * 2

        return wrapper

    @asyncflow.stream(name="doubled")
    @doubled
    async def count(n: int) -> AsyncIterator[int]:
        for i in range(n):
            yield i

    async def run() -> list[int]:
        return [i async for i in count(3)]

    with asyncflow.profile("wrapped", format="none") as prof:
        assert asyncio.run(run()) == [0, 2, 4]
        snap = prof.snapshot()
    entry, _ = _stream(snap, "doubled")
    assert (entry.items_yielded, entry.state) == (3, "exhausted")


# -- the decorated function behaves as the undecorated one -------------------------------------
#
# Each reproduction runs a generator undecorated and decorated and compares everything the
# program can observe: the values, the exception and its traceback (file, lines, columns,
# function and source line of every frame). ``asend`` goes through the wrapper's ``_step`` on
# both paths, whose frame the comparison leaves out (``__anext__`` of the compiled wrapper has
# no frame of asyncflow's: see test_tracebacks_show_the_generators_own_lines).

Frame = tuple[str, int | None, int | None, int | None, int | None, str, str | None]
_ASYNCFLOW_DIR = os.path.dirname(asyncflow.__file__)


def _frames(exc: BaseException, *, skip_asyncflow: bool) -> list[Frame]:
    return [
        (f.filename, f.lineno, f.end_lineno, f.colno, f.end_colno, f.name, f.line)
        for f in traceback.extract_tb(exc.__traceback__)
        if not (skip_asyncflow and f.filename.startswith(_ASYNCFLOW_DIR))
    ]


async def _observe(gen: Any, *, skip_asyncflow: bool = False) -> list[Any]:
    """Everything a consumer sees of one iteration, sending each item back."""
    seen: list[Any] = []
    it = gen()
    reply = None
    try:
        while True:
            item = await it.asend(reply)
            seen.append(item)
            reply = item
    except StopAsyncIteration:
        seen.append("stop")
    except Exception as exc:
        seen.append((type(exc), str(exc), _frames(exc, skip_asyncflow=skip_asyncflow)))
    return seen


async def _compare(make_gen: Callable[[Callable[[Any], Any]], Any], label: str) -> StreamEntry:
    """Runs the generator undecorated and decorated; asserts they behave alike."""
    plain = await _observe(make_gen(_identity))
    with asyncflow.profile(label, format="none") as prof:
        decorated = make_gen(asyncflow.stream(name=label))
        tracked = await _observe(decorated, skip_asyncflow=True)
        snap = prof.snapshot()
    entry, _ = _stream(snap, label)
    assert tracked == plain
    return entry


def _raising_items(track: Callable[[Any], Any]) -> Any:
    @track
    async def items() -> AsyncGenerator[Any, Any]:
        with contextlib.suppress(ZeroDivisionError):
            yield 1 / 0  # a statement: its expression raised, nothing was yielded
        try:
            got = yield dict[str, int]()["missing"]  # an assignment
            yield got
        except KeyError:
            pass
        with contextlib.suppress(IndexError):
            print((yield [][1]))  # inside an expression
        with contextlib.suppress(UnboundLocalError):
            yield later  # type: ignore[has-type,used-before-def]  # noqa: F821  # not bound yet
        later = "later"
        yield later
        yield None.attribute  # type: ignore[attr-defined]  # uncaught: ends the iteration

    return items


async def test_an_item_whose_expression_raised_is_not_counted() -> None:
    entry = await _compare(_raising_items, "raising items")
    assert entry.items_yielded == 1
    assert entry.instances["failed"] == 1


async def test_the_wrapper_counts_the_same_items() -> None:
    plain = await _observe(_raising_items(_identity))
    with asyncflow.profile("wrapped count", format="none") as prof:
        gen = _raising_items(_identity)
        wrapped = await _observe(lambda: asyncflow.stream(gen(), name="wrapped raising"))
        snap = prof.snapshot()
    entry, _ = _stream(snap, "wrapped raising")
    assert [x for x in wrapped if not isinstance(x, tuple)] == [
        x for x in plain if not isinstance(x, tuple)
    ]
    assert entry.items_yielded == 1


def test_every_kind_of_function_is_wrapped_and_counted() -> None:
    namespace: dict[str, Any] = {}
    exec("async def no_source():\n    yield 1\n", namespace)

    @asyncflow.stream(name="reserved")
    async def reserved() -> AsyncIterator[int]:
        _asyncflow_it = 1  # a name asyncflow once kept for itself: nothing is reserved now
        yield _asyncflow_it

    @asyncflow.stream(name="compiled")
    async def compiled() -> AsyncIterator[int]:
        yield 1

    async def generator() -> AsyncIterator[int]:
        yield 1

    no_source = asyncflow.stream(name="no source")(namespace["no_source"])
    partial = asyncflow.stream(name="partial")(functools.partial(generator))

    async def run() -> list[int]:
        got = []
        for fn in (no_source, reserved, compiled, partial):
            got += [i async for i in fn()]
        got += [i async for i in asyncflow.stream(generator(), name="iterable")]
        return got

    gc.collect()  # the function the other wrapper's run made is gone: a new profile omits it
    with asyncflow.profile("modes", format="none") as prof:
        assert asyncio.run(run()) == [1, 1, 1, 1, 1]
        snap = prof.snapshot()
    for label in ("no source", "reserved", "compiled", "partial", "iterable"):
        entry, _ = _stream(snap, label)
        assert (entry.items_yielded, entry.state) == (1, "exhausted"), label
        assert (entry.mode, entry.fallback_reason) == ("wrapped", None), label


async def test_the_generator_does_not_keep_a_yielded_item_alive() -> None:
    class Item:
        pass

    def make(track: Callable[[Any], Any]) -> Any:
        @track
        async def items() -> AsyncIterator[Item]:
            while True:
                yield Item()  # an expression: evaluated before it is counted

        return items

    alive = []
    with asyncflow.profile("kept", format="none") as prof:
        for track in (_identity, asyncflow.stream(name="not kept")):
            it = make(track)()
            item = await it.__anext__()
            ref = weakref.ref(item)
            del item
            alive.append(ref() is not None)  # while the generator waits at its yield
            await it.aclose()
        snap = prof.snapshot()
    assert alive == [False, False]
    assert _stream(snap, "not kept")[0].items_yielded == 1


# -- asyncflow.stream(iterable) driven through __anext__: the step each implementation makes ---


async def _observe_next(it: Any, *, skip_asyncflow: bool) -> list[Any]:
    """Everything a consumer sees driving ``it`` with ``__anext__`` (as ``async for`` does)."""
    seen: list[Any] = []
    try:
        while True:
            seen.append(await it.__anext__())
    except StopAsyncIteration:
        seen.append("stop")
    except Exception as exc:
        seen.append((type(exc), str(exc), _frames(exc, skip_asyncflow=skip_asyncflow)))
    return seen


class _Countdown:
    """An async iterator that is not a generator: ``async def __anext__``."""

    def __init__(self, n: int, fail: bool = False) -> None:
        self.n = n
        self.fail = fail

    def __aiter__(self) -> _Countdown:
        return self

    async def __anext__(self) -> int:
        await asyncio.sleep(0)
        if self.n == 0:
            if self.fail:
                raise LookupError("counted down")
            raise StopAsyncIteration
        self.n -= 1
        return self.n


async def test_wrapped_iterables_behave_exactly_as_before(wrapper_impl: Any) -> None:
    for make_it in (
        lambda: _Countdown(3),
        lambda: _Countdown(2, fail=True),
        lambda: _raising_items(_identity)(),
    ):
        plain = await _observe_next(make_it(), skip_asyncflow=False)
        with asyncflow.profile("next", format="none"):
            wrapped_it = asyncflow.stream(make_it(), name="next")
            # a generator's wrapper is of a subclass with its asend, athrow and aclose
            assert isinstance(wrapped_it, wrapper_impl)
            # the compiled step has no Python frame: nothing of asyncflow's in the traceback
            compiled = wrapper_impl is streams.InstrumentedAsyncIteratorC
            wrapped = await _observe_next(wrapped_it, skip_asyncflow=not compiled)
        assert wrapped == plain


class _Slow(_Countdown):
    """Waits on ``gate`` after its first item (not a generator: closing a step midway leaves
    no generator running for the loop's shutdown to trip on)."""

    def __init__(self, n: int, gate: asyncio.Event) -> None:
        super().__init__(n)
        self.gate = gate

    async def __anext__(self) -> int:
        if self.n < 2:
            await self.gate.wait()
        return await super().__anext__()


class _Watched(_Countdown):
    asked: list[int] = []  # noqa: RUF012

    async def __anext__(self) -> int:
        self.asked.append(self.n)
        return await super().__anext__()


class _Bad:
    def __aiter__(self) -> _Bad:
        return self

    def __anext__(self) -> int:
        return 3  # not awaitable


async def test_a_step_cancelled_or_closed_midway_ends_the_iteration() -> None:
    gate = asyncio.Event()

    def slow() -> _Slow:
        return _Slow(2, gate)

    with asyncflow.profile("midway", format="none") as prof:
        it = asyncflow.stream(slow(), name="cancelled midway")
        assert await it.__anext__() == 1
        task = asyncio.ensure_future(it.__anext__())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        it2 = asyncflow.stream(slow(), name="closed midway")
        assert await it2.__anext__() == 1
        step: Any = it2.__anext__()
        step.send(None)  # suspended inside the generator, at gate.wait()
        step.close()
        with pytest.raises(RuntimeError):
            step.send(None)  # a step is awaited once
        never: Any = it2.__anext__()  # never driven: asks the generator for nothing
        never.close()
        snap = prof.snapshot()
    cancelled, _ = _stream(snap, "cancelled midway")
    closed, _ = _stream(snap, "closed midway")
    assert cancelled.items_yielded == 1 and cancelled.instances["cancelled"] == 1
    assert closed.items_yielded == 1 and closed.instances["closed"] == 1


async def test_a_step_thrown_into_before_it_starts_asks_for_nothing() -> None:
    asked = _Watched.asked
    asked.clear()
    with asyncflow.profile("unstarted", format="none") as prof:
        it = asyncflow.stream(_Watched(2), name="unstarted")
        step: Any = it.__anext__()
        with pytest.raises(KeyError):
            step.throw(KeyError("before"))
        assert asked == []
        assert [i async for i in it] == [1, 0]
        snap = prof.snapshot()
    entry, _ = _stream(snap, "unstarted")
    assert entry.items_yielded == 2 and entry.instances["exhausted"] == 1


async def test_a_step_is_a_coroutine_for_asyncio() -> None:
    with asyncflow.profile("task step", format="none"):
        it = asyncflow.stream(_Countdown(2), name="task step")
        step: Any = it.__anext__()
        assert asyncio.iscoroutine(step)
        assert await asyncio.create_task(step) == 1
        assert await asyncio.wait_for(it.__anext__(), 30) == 0


async def test_an_invalid_anext_fails_as_await_does() -> None:
    async def consume(it: Any) -> str:
        try:
            async for _ in it:
                pass
        except TypeError as exc:
            return str(exc)
        return "no error"

    plain = await consume(_Bad())
    with asyncflow.profile("bad", format="none") as prof:
        bad: Any = _Bad()
        wrapped = await consume(asyncflow.stream(bad, name="bad"))
        snap = prof.snapshot()
    # The one difference: the error is raised where the wrapper awaits the bad object, so it
    # reads as await's own message rather than async for's (on both paths).
    assert plain == "'async for' received an invalid object from __anext__: int"
    assert wrapped == "object int can't be used in 'await' expression"
    entry, _ = _stream(snap, "bad")
    assert entry.items_yielded == 0 and entry.instances["failed"] == 1


async def test_a_decorated_generator_under_asynccontextmanager_behaves_as_before() -> None:
    """Decorated generators are wrapped: contextlib's context manager over one still sees the
    same entry, exit, exception chaining and cancellation, and each use is one iteration."""

    def build(track: Callable[[Any], Any]) -> Any:
        @contextlib.asynccontextmanager
        @track
        async def resource(log: list[str]) -> AsyncIterator[str]:
            log.append("open")
            try:
                yield "r"
            except KeyError as exc:
                log.append(f"caught {exc!r}")
                raise ValueError("wrapped") from exc
            finally:
                log.append("close")

        return resource

    async def scenario(resource: Any) -> list[str]:
        log: list[str] = []
        async with resource(log) as r:
            log.append(r)
        try:
            async with resource(log):
                raise KeyError("k")
        except ValueError as exc:
            log.append(f"{type(exc).__name__} {exc} cause={exc.__cause__!r}")
        try:
            async with resource(log):
                raise asyncio.CancelledError
        except asyncio.CancelledError:
            log.append("cancelled")
        return log

    plain = await scenario(build(_identity))
    with asyncflow.profile("acm", format="none") as prof:
        tracked = await scenario(build(asyncflow.stream(name="resource")))
        snap = prof.snapshot()
    assert tracked == plain
    assert plain[-1] == "cancelled" and "ValueError wrapped cause=KeyError('k')" in plain
    entry, _ = _stream(snap, "resource")
    assert entry.items_yielded == 3
    assert entry.instances == {
        "active": 0,
        "exhausted": 1,
        "closed": 0,
        "cancelled": 1,
        "failed": 1,
    }


# -- memory: the records of definitions that are gone ----------------------------------------------


def _ticks_type() -> type:
    """A type of its own, as a class statement run again makes one."""

    class Ticks:
        def __init__(self) -> None:
            self.n = 0

        def __aiter__(self) -> Ticks:
            return self

        async def __anext__(self) -> int:
            self.n += 1
            if self.n > 4:
                raise StopAsyncIteration
            return self.n

    return Ticks


async def test_a_stream_whose_type_dies_while_it_is_iterated_is_folded_after_its_end(
    prof: asyncflow.Profiler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cyclic GC clears a dying type's weak references before it runs the finalizers of its
    iterators, which end their iterations: a record whose type is gone while an iteration is
    active waits for that end before it is folded, and no figure is lost."""
    monkeypatch.setattr(streams._history, "kept", 0)  # every gone stream is folded at once
    first, second = _ticks_type(), _ticks_type()
    ticks = first()
    wrapped = asyncflow.stream(ticks, name="retyped")
    assert await wrapped.__anext__() == 1
    ticks.__class__ = second  # iterated on, and nothing holds the type it was wrapped as
    owner = weakref.ref(first)
    del ticks, first
    gc.collect()
    assert owner() is None
    entry, _ = _stream(prof.snapshot(), "retyped")  # the collector reaps: not final yet
    assert not entry.alive and entry.folded_count == 0 and entry.state == "active"
    assert [i async for i in wrapped] == [2, 3, 4]
    entry, _ = _stream(prof.snapshot(), "retyped")
    assert entry.folded_count == 1 and not entry.alive
    assert entry.items_yielded == 4
    assert entry.instances == {
        "active": 0,
        "exhausted": 1,
        "closed": 0,
        "cancelled": 0,
        "failed": 0,
    }


async def test_an_abandoned_generator_of_a_gone_function_is_counted_closed(
    prof: asyncflow.Profiler,
) -> None:
    """The wrapper's finalizer ends the iteration while its generator still holds the code: the
    end is counted on the record before the record can be reaped."""
    namespace: dict[str, Any] = {}
    exec("async def abandoned(n):\n    for i in range(n):\n        yield i\n", namespace)
    wrapped = asyncflow.stream(namespace["abandoned"](5))
    code = weakref.ref(namespace["abandoned"].__code__)
    assert [await wrapped.__anext__(), await wrapped.__anext__()] == [0, 1]
    del namespace, wrapped
    for _ in range(3):  # the loop's finalizer hook closes the abandoned generator
        await asyncio.sleep(0)
        gc.collect()
    assert code() is None
    entry, logs = _stream(prof.snapshot(), "abandoned")
    assert not entry.alive and entry.items_yielded == 2 and len(logs.items) == 2
    assert entry.instances == {
        "active": 0,
        "exhausted": 0,
        "closed": 1,
        "cancelled": 0,
        "failed": 0,
    }


class _Ticks:
    """An async iterator that is no generator: no asend, athrow or aclose."""

    def __init__(self, n: int) -> None:
        self.left = list(range(n))

    def __aiter__(self) -> _Ticks:
        return self

    async def __anext__(self) -> int:
        if not self.left:
            raise StopAsyncIteration
        return self.left.pop(0)


class _ClosableTicks(_Ticks):
    """One with an aclose() of its own, and still no asend or athrow."""

    closed = False

    async def aclose(self) -> None:
        self.closed = True


async def _drain(it: Any) -> list[int]:
    """As generic stream helpers do: iterate, then close what can be closed."""
    items = [x async for x in it]
    if hasattr(it, "aclose"):
        await it.aclose()
    return items


async def _three() -> AsyncIterator[int]:
    for i in range(3):
        yield i


async def test_a_wrapped_iterator_offers_exactly_the_methods_of_what_it_wraps() -> None:
    methods = ("asend", "athrow", "aclose")
    with asyncflow.profile("methods", format="none") as prof:
        plain = asyncflow.stream(_Ticks(3), name="plain")
        assert [hasattr(plain, name) for name in methods] == [False, False, False]
        assert isinstance(plain, AsyncIterator) and not isinstance(plain, AsyncGenerator)
        assert await _drain(plain) == [0, 1, 2]
        with pytest.raises(AttributeError):
            plain.aclose  # type: ignore[attr-defined]  # noqa: B018
        ticks = _ClosableTicks(2)
        closable = asyncflow.stream(ticks, name="closable")
        assert [hasattr(closable, name) for name in methods] == [False, False, True]
        assert not isinstance(closable, AsyncGenerator) and isinstance(closable, _ClosableTicks)
        assert await _drain(closable) == [0, 1] and ticks.closed
        gen = asyncflow.stream(_three(), name="generator")
        assert [hasattr(gen, name) for name in methods] == [True, True, True]
        assert isinstance(gen, AsyncGenerator)
        assert await _drain(gen) == [0, 1, 2]
        assert type(plain) is not type(gen)
        assert all(isinstance(w, streams.InstrumentedAsyncIterator) for w in (plain, gen))
        snap = prof.snapshot()
    for label in ("plain", "closable", "generator"):
        entry, _ = _stream(snap, label)
        assert entry.items_yielded == (2 if label == "closable" else 3)
