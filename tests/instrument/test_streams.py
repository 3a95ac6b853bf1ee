"""Instrumented async iterators and generators: transparency, states, per-item waits."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Callable
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
