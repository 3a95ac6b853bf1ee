"""Instrumented async iterators and generators: transparency, states, per-item waits."""

from __future__ import annotations

import asyncio
import functools
import inspect
import traceback
import types
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

import pytest

import asyncflow
from asyncflow.clock import FakeClock
from asyncflow.schema import Snapshot, StreamEntry, StreamLogs

Gen = Callable[[], AsyncIterator[int]]


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
    # The cancelled task was handed the generator's own asend(): cancelling it throws
    # CancelledError into the generator, which ends there. The decorated generator is the real
    # one and says so; the wrapper's step was cancelled before it started, and only the
    # aclose() afterwards ended its generator.
    for label, cancelled in (("numbers-decorated", 1), ("numbers-wrapped", 0)):
        entry, _ = _stream(snap, label)
        assert entry.items_yielded == 5 + 6 + 3 + 1, entry.instances
        assert entry.instances == {
            "active": 0,
            "exhausted": 1,
            "closed": 2 - cancelled,
            "cancelled": cancelled,
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


async def test_the_decorated_function_is_a_real_async_generator_function() -> None:
    offset = 100

    @asyncflow.stream(name="closure")
    async def shifted(xs: list[int]) -> AsyncIterator[int]:
        for x in xs:
            yield x + offset

    with asyncflow.profile("real", format="none") as prof:
        gen = shifted([1, 2])
        assert type(gen) is types.AsyncGeneratorType
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
    assert tracked == plain
    assert plain[-1][2] == 'raise LookupError("the third line of the body")'


def test_without_source_the_wrapper_still_counts() -> None:
    namespace: dict[str, Any] = {}
    exec("async def gen(n):\n    for i in range(n):\n        yield i\n", namespace)
    tracked = asyncflow.stream(name="from-exec")(namespace["gen"])
    assert inspect.isasyncgenfunction(tracked)

    async def run() -> list[int]:
        return [i async for i in tracked(4)]

    with asyncflow.profile("exec", format="none") as prof:
        assert asyncio.run(run()) == [0, 1, 2, 3]
        snap = prof.snapshot()
    entry, _ = _stream(snap, "from-exec")
    assert (entry.items_yielded, entry.state) == (4, "exhausted")


async def test_sampled_items_stand_for_the_items_between_them(fake_clock: FakeClock) -> None:
    @asyncflow.stream(name="sampled", log_items=True)
    async def steady() -> AsyncIterator[int]:
        for i in range(40):
            fake_clock.advance(30)  # each item takes 30 ns to make
            yield i

    with asyncflow.profile("sampled", format="none", sampling=8) as prof:
        async for _ in steady():
            fake_clock.advance(70)  # and 70 ns to use
        snap = prof.snapshot()
    entry, logs = _stream(snap, "sampled")
    assert (entry.items_yielded, entry.sampling_interval) == (40, 8)
    assert [e.index for e in reversed(logs.items)] == [0, 8, 16, 24, 32]
    assert entry.timed_count == 5 and {e.wait_ns for e in logs.items} == {30}
    # Weighted totals: each timed item stands for the eight since the previous one.
    assert entry.total_wait_ns == 30 * (1 + 8 * 4)
    assert entry.consumer_ns == 70 * (1 + 8 * 4)


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
