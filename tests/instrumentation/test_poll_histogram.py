"""A future's poll histogram and the clock as the compiled hot path reads them.

On the compiled path a future's poll histogram is a ``PollHistogram`` counted in C; on the
pure-Python path it is ``stats.new_histogram()``'s dict. The cold path reads either as a
mapping, so both must give the same buckets, counts, percentiles and merges. The compiled path
also caches the module globals it reads per poll (``clock.now_ns``...): a clock rebound between
two polls, by ``set_clock`` or by assignment, must be the one the next poll reads.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, MutableMapping
from typing import Any

import pytest

import asyncflow
from asyncflow import clock, stats
from asyncflow.clock import FakeClock
from asyncflow.instrumentation import futures
from asyncflow.instrumentation.futures import FutureRecord

compiled = pytest.mark.skipif(
    futures._speedups is None,
    reason="the compiled hot path is not built here, or ASYNCFLOW_NO_EXTENSIONS=1",
)

DURATIONS = [0, 1, 63, 64, 65, 100, 1_000, 4_095, 70_000, 1 << 40, (1 << 63) - 1, 5, 5, 1_000]


def _bumped(hist: MutableMapping[int, int], durations: list[int]) -> MutableMapping[int, int]:
    for ns in durations:
        hist[stats.bucket_of(ns)] += 1  # what both hot paths do per poll
    return hist


def _poll_histogram() -> Any:
    assert futures._speedups is not None
    return futures._speedups.PollHistogram()


def test_a_future_counts_polls_in_the_paths_histogram() -> None:
    hist = futures.FutureStats().poll_hist
    if futures.accelerated:
        assert type(hist) is futures._speedups.PollHistogram
    else:
        assert type(hist) is type(stats.new_histogram())
    assert isinstance(hist, Mapping) and len(hist) == 0 and hist == {}


@compiled
def test_the_compiled_histogram_reads_as_the_reference_does() -> None:
    reference = _bumped(stats.new_histogram(), DURATIONS)
    hist = _bumped(_poll_histogram(), DURATIONS)
    assert hist == dict(reference) and dict(reference) == dict(hist)
    assert list(hist.items()) == sorted(reference.items())
    assert list(hist) == list(hist.keys()) == sorted(reference)
    assert list(hist.values()) == [n for _, n in sorted(reference.items())]
    assert len(hist) == len(reference)
    qs = [50, 90, 99, 99.9, 100]
    assert stats.percentiles(hist, qs) == stats.percentiles(reference, qs)
    assert stats.percentiles(_poll_histogram(), qs) == {}


@compiled
def test_histograms_merge_either_way() -> None:
    a = _bumped(_poll_histogram(), DURATIONS)
    reference = _bumped(stats.new_histogram(), DURATIONS)
    stats.merge(a, reference)  # a gone future folded into an aggregate, and back
    stats.merge(reference, a)
    once = _bumped(stats.new_histogram(), DURATIONS)
    assert dict(a) == {b: 2 * n for b, n in once.items()}
    assert dict(reference) == {b: 3 * n for b, n in once.items()}


@compiled
def test_an_empty_bucket_reads_zero_and_is_not_a_key() -> None:
    hist = _poll_histogram()
    assert hist[7] == 0 and 7 not in hist and hist.get(7) is None and hist.get(7, 0) == 0
    hist[7] += 0
    assert len(hist) == 0 and hist == {}
    hist[7] = 3
    assert hist[7] == 3 and 7 in hist and hist.get(7) == 3 and len(hist) == 1
    assert hist != {7: 4} and hist == {7: 3}
    assert repr(hist) == "PollHistogram({7: 3})"
    hist[7] = 0
    assert len(hist) == 0 and 7 not in hist
    hist[stats.BUCKETS - 1] = 1
    del hist[stats.BUCKETS - 1]
    assert hist == {}
    with pytest.raises(KeyError):
        del hist[5]


@compiled
def test_bad_buckets_and_counts_are_refused() -> None:
    hist = _poll_histogram()
    with pytest.raises(KeyError, match=str(stats.BUCKETS)):
        hist[stats.BUCKETS] = 1
    with pytest.raises(KeyError):
        _ = hist[-1]
    with pytest.raises(TypeError, match="bucket is an int, not str"):
        _ = hist["7"]
    with pytest.raises(TypeError, match="count is an int, not float"):
        hist[7] = 1.0
    with pytest.raises(ValueError, match="from 0 to 2\\*\\*64-1, not -1"):
        hist[7] = -1
    with pytest.raises(ValueError, match="not 18446744073709551616"):
        hist[7] = 1 << 64
    with pytest.raises(TypeError):
        hash(hist)
    assert hist == {} and "7" not in hist and 1.5 not in hist
    with pytest.raises(TypeError, match="no arguments"):
        futures._speedups.PollHistogram({1: 2})


@compiled
def test_the_largest_count_is_kept_exactly() -> None:
    hist = _poll_histogram()
    hist[3] = (1 << 64) - 2
    hist[3] += 1
    assert hist[3] == (1 << 64) - 1 and hist.items() == [(3, (1 << 64) - 1)]


@compiled
@pytest.mark.parametrize("rebind", ["set_clock", "assignment"])
def test_a_clock_rebound_between_polls_is_the_next_polls_clock(
    rebind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = FakeClock(1_000), FakeClock(50_000)
    monkeypatch.setattr(clock, "now_ns", first)
    future = FutureRecord("c", "m:c", "m.py", 1, False, "decorator")

    async def steps() -> None:
        first.advance(10)
        await asyncio.sleep(0)
        second.advance(700)
        await asyncio.sleep(0)

    w: Any = futures._speedups.InstrumentedCoroutine(steps(), future)
    w.send(None)  # first poll: 10 ns on the first clock
    assert (w._r.created, w._r.first, w._r.last) == (1_000, 1_000, 10)
    if rebind == "set_clock":
        clock.set_clock(second)
    else:
        monkeypatch.setattr(clock, "now_ns", second)
    assert futures._speedups.now_ns() == 50_000
    w.send(None)  # second poll: 700 ns on the second clock
    assert (w._r.polls, w._r.last) == (2, 700)
    with pytest.raises(StopIteration):
        w.send(None)
    assert (w._r.polls, w._r.finished) == (3, 50_700)
    assert dict(future.stats.poll_hist) == {0: 1, 10: 1, stats.bucket_of(700): 1}


@compiled
async def test_a_profiler_started_after_the_first_call_is_seen_at_once() -> None:
    @asyncflow.future
    async def job() -> int:
        await asyncio.sleep(0)
        return 1

    assert await job() == 1  # no profiler: not tracked (and the session global read)
    with asyncflow.profile("late", format="none"):
        w: Any = job()
        assert type(w) is futures._speedups.InstrumentedCoroutine
        assert await w == 1
        assert w._r.polls == 2 and sum(dict(w._r.hist).values()) == 2
    coro = job()  # the profiler stopped: not tracked any more
    assert type(coro) is not futures._speedups.InstrumentedCoroutine
    assert await coro == 1


def _driven_by_hand(impl: Any, log_result: bool) -> tuple[list[Any], dict[str, Any]]:
    """A tracked call driven with send() (as trio or a hand-written driver does), on a fake
    clock: what the driver saw, and what the call's record and its future's stats say."""
    fake = FakeClock()
    previous = clock.set_clock(fake)
    try:
        future = FutureRecord("h", "m:h", "m.py", 1, log_result, "decorator")

        async def sleeps() -> None:
            await asyncio.sleep(0)

        async def body() -> str:
            fake.advance(30)
            await sleeps()  # a bare yield: driven by hand, there is no loop
            fake.advance(5_000)
            return "done"

        with asyncflow.profile("by-hand", format="none"):
            w = impl(body(), future)
            seen: list[Any] = [w.send(None)]
            try:
                w.send(None)
            except StopIteration as stop:
                seen.append(stop.value)
        r, st = w._r, future.stats
        record = {
            name: getattr(r, name, None)
            for name in ("polls", "busy", "max", "last", "outcome", "result", "state")
        }
        record["finished"] = r.finished - r.created
        record.update((name, getattr(st, name)) for name in ("returned", "polls_done", "busy_done"))
        record["poll_hist"] = dict(st.poll_hist)
        return seen, record
    finally:
        clock.set_clock(previous)


@compiled
@pytest.mark.parametrize("log_result", [False, True])
def test_a_call_driven_by_send_records_as_the_reference(log_result: bool) -> None:
    python = _driven_by_hand(futures.InstrumentedCoroutinePy, log_result)
    c = _driven_by_hand(futures._speedups.InstrumentedCoroutine, log_result)
    assert c == python
    assert python[0] == [None, "done"] and python[1]["outcome"] == "returned"
    assert python[1]["result"] == ("'done'" if log_result else None)
    assert python[1]["poll_hist"] == {30: 1, stats.bucket_of(5_000): 1}
