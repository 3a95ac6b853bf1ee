"""The compiled _put/_get of FIFO queues record exactly what the Python reference hooks do."""

from __future__ import annotations

import asyncio
import collections
import weakref
from typing import Any

import pytest

import asyncflow
from asyncflow import clock
from asyncflow.clock import FakeClock
from asyncflow.instrumentation import _session, queues
from asyncflow.instrumentation.channels import ChannelStats, Edge

pytestmark = pytest.mark.skipif(queues._FifoHook is None, reason="the compiled path is not built")


def _figures(st: ChannelStats) -> dict[str, Any]:
    """Every figure of a channel's stats, as plain values."""

    def plain(value: Any) -> Any:
        if isinstance(value, Edge):
            return (value.count, value.delay_sum, value.delay_max, dict(value.delay_hist))
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if hasattr(value, "maxlen"):  # the logs
            return list(value)
        return value

    return {name: plain(getattr(st, name)) for name in ChannelStats.__slots__}


def _instrument(q: asyncio.Queue[int], name: str, compiled: bool) -> ChannelStats:
    saved = queues._FifoHook
    queues._FifoHook = saved if compiled else None
    try:
        asyncflow.instrument_queue(q, name=name)
    finally:
        queues._FifoHook = saved
    record = queues._record_of(q)
    assert record is not None
    return record.stats


async def test_same_figures_as_the_reference() -> None:
    with asyncflow.profile("fifo", format="none"):
        compiled_q: asyncio.Queue[int] = asyncio.Queue(8)
        reference_q: asyncio.Queue[int] = asyncio.Queue(8)
        compiled = _instrument(compiled_q, "c", compiled=True)
        reference = _instrument(reference_q, "py", compiled=False)
        assert type(compiled_q._put).__name__ == "FifoHook"
        assert type(reference_q._put).__name__ == "function"
        for q in (compiled_q, reference_q):
            fake_clock = FakeClock()  # each queue's run on the same times
            previous = clock.set_clock(fake_clock)
            got = []
            for n in range(300):
                fake_clock.advance(1_000 + 7 * n)
                q.put_nowait(n)
                if n % 3 == 0:
                    q.put_nowait(-n)
                if n % 50 == 49:
                    q._queue.clear()  # type: ignore[attr-defined]  # behind the queue's back
                if n % 70 == 69:
                    q._queue.append(10_000 + n)  # type: ignore[attr-defined]  # never put
                while q.qsize() > 2:
                    fake_clock.advance(500)
                    got.append(q.get_nowait())
            while not q.empty():
                got.append(q.get_nowait())
            clock.set_clock(previous)
            assert got and len(got) < 400
        assert compiled.taken > 0 and compiled.timed > 0 and compiled.skew > 0
        assert compiled.unpaired > 0
        assert _figures(compiled) == _figures(reference)


async def test_a_replaced_storage_is_followed_as_by_the_reference() -> None:
    # `q._queue = collections.deque()` empties a queue: both hooks put into and take from the
    # queue's storage of the moment, and count alike
    with asyncflow.profile("fifo-replaced", format="none"):
        compiled_q: asyncio.Queue[int] = asyncio.Queue()
        reference_q: asyncio.Queue[int] = asyncio.Queue()
        compiled = _instrument(compiled_q, "c", compiled=True)
        reference = _instrument(reference_q, "py", compiled=False)
        runs = []
        for q in (compiled_q, reference_q):
            fake_clock = FakeClock()  # each queue's run on the same times
            previous = clock.set_clock(fake_clock)
            got = []
            for n in range(190):
                fake_clock.advance(1_000 + 7 * n)
                q.put_nowait(n)
                if n % 40 == 39:
                    q._queue = collections.deque()  # type: ignore[attr-defined]
                if n % 60 == 59:  # a new storage with items never put, the oldest gone
                    kept = list(q._queue)[1:]  # type: ignore[attr-defined]
                    q._queue = collections.deque([*kept, -n, -1])  # type: ignore[attr-defined]
                if n % 3 == 0 and not q.empty():
                    got.append(q.get_nowait())
            while not q.empty():
                got.append(q.get_nowait())
            clock.set_clock(previous)
            runs.append(got)
        assert runs[0] == runs[1] and -179 in runs[0] and 39 not in runs[0]
        assert compiled.skew > 0 and compiled.unpaired > 0
        assert _figures(compiled) == _figures(reference)


async def test_a_broken_figure_is_an_internal_error_not_the_programs() -> None:
    errors = _session.errors.count
    with asyncflow.profile("broken", format="none"):
        q: asyncio.Queue[int] = asyncio.Queue()
        st = _instrument(q, "broken", compiled=True)
        st.sent = "not a number"  # type: ignore[assignment]
        q.put_nowait(1)  # the item still goes in
        assert _session.errors.count == errors + 1
        assert q.get_nowait() == 1  # gets never fail for the observer's sake
        st.taken = None  # type: ignore[assignment]
        q.put_nowait(2)
        with pytest.raises(TypeError):  # the reference's own get, which adds to taken, raises too
            q._get()
        # mended: the queue's record is reaped whenever the queue is collected, perhaps at the
        # next queue instrumented in another test, and reaping reads the figures
        st.sent = st.taken = 0


def test_hooks_take_the_arguments_of_asyncio_queue_hooks() -> None:
    queue: asyncio.Queue[int] = asyncio.Queue()
    _instrument(queue, "args", compiled=True)
    q: Any = queue  # the hooks' own signatures
    with pytest.raises(TypeError, match="exactly one argument"):
        q._put()
    with pytest.raises(TypeError, match="no arguments"):
        q._get(1)
    with pytest.raises(ValueError, match="kind"):
        queues._FifoHook("sideways", weakref.ref(q), q._queue, ChannelStats(), print)
    with pytest.raises(TypeError, match="weak reference"):
        queues._FifoHook("put", q, q._queue, ChannelStats(), print)
    assert all(q._put.fields().values())  # every figure read at its slot's offset
