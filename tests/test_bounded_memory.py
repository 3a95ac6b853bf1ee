"""Memory follows what is alive: thousands of short-lived functions, queues and streams leave a
bounded history (the last few as they were, older ones folded per label), with exact totals.

Small versions of benchmarks/memory.py: they assert how many records stay and that memory per
object made stays small, never how fast anything is.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import os
import tracemalloc
import types
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import pytest

import asyncflow
from asyncflow import clock
from asyncflow.instrumentation import channels, executors, futures, streams
from asyncflow.schema import ChannelEntry, FutureEntry, Snapshot, StreamEntry
from asyncflow.views import documents as views

N = 1_000  # per batch: one fills the bounded history, the second must not grow it
#: what a gone future or channel may still cost once the history is full, per object made:
#: nothing, but for the bounded structures' turnover between two measures (a dense record,
#: never dropped, cost 36-53 KB; a sparse one, never dropped, ~2 KB, which the counts of
#: records kept catch)
BYTES_PER_GONE_OBJECT = 2_048


def _futures(snap: Snapshot, match: Callable[[FutureEntry], bool]) -> list[FutureEntry]:
    return [f for f in snap.futures.futures if match(f)]


def _channels(snap: Snapshot, match: Callable[[ChannelEntry], bool]) -> list[ChannelEntry]:
    assert snap.channels is not None
    return [c for c in snap.channels.channels if match(c)]


def _streams(snap: Snapshot, match: Callable[[StreamEntry], bool]) -> list[StreamEntry]:
    assert snap.streams is not None
    return [s for s in snap.streams.streams if match(s)]


_ASYNCFLOW_FILES = os.path.join(os.path.dirname(asyncflow.__file__), "*")


def _held_by_asyncflow() -> int:
    """Bytes allocated by asyncflow's code (the innermost Python frame is asyncflow's) since
    tracing started, and still alive. The interpreter's own tables (3.13 grows one as code
    objects are made) are not asyncflow's to bound."""
    snapshot = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.Filter(True, _ASYNCFLOW_FILES)]
    )
    return sum(stat.size for stat in snapshot.statistics("filename"))


async def _growth_per_object(
    prof: asyncflow.Profiler, batch: Callable[[int], Awaitable[Any]]
) -> float:
    """How much more asyncflow holds after a second batch of N than after the first (which
    filled the bounded history), per object."""
    tracemalloc.start()
    try:
        held = []
        for b in range(2):
            await batch(b)
            await asyncio.sleep(0)  # the loop lets go of the last task it ran
            gc.collect()
            prof.snapshot()  # the collector reaps what is gone
            held.append(_held_by_asyncflow())
    finally:
        tracemalloc.stop()
    return (held[1] - held[0]) / N


_TEMPLATE = compile("async def template(value):\n    return value\n", "<made>", "exec")
_TEMPLATE_CODE = next(c for c in _TEMPLATE.co_consts if hasattr(c, "co_code"))


def _new_coroutine_function(name: str) -> Callable[[int], Any]:
    """A function with a code object of its own, as ``exec`` makes one (cheaper than exec)."""
    code = _TEMPLATE_CODE.replace(co_name=name, co_qualname=name)
    fn: Callable[[int], Any] = types.FunctionType(code, {})
    return fn


async def test_functions_made_by_exec_and_called_once_leave_a_bounded_history() -> None:
    codes: list[weakref.ref[Any]] = []

    async def batch(b: int) -> None:
        for i in range(N):
            # 600 names, more than the aggregates kept; the same ones in both batches, as new
            # names would grow the interpreter's table of interned strings, not asyncflow
            fn = _new_coroutine_function(f"f{i % 600}")
            codes.append(weakref.ref(fn.__code__))
            # instrument() groups calls by code object, as whole-program mode does for tasks
            assert await asyncflow.instrument(fn(i)) == i

    with asyncflow.profile("exec", format="none") as prof:
        growth = await _growth_per_object(prof, batch)
        snap = prof.snapshot()
    made = _futures(snap, lambda f: f.label.startswith("f") or f.folded_count > 0)
    # every call is counted exactly once, in its own entry or in an aggregate
    assert sum(f.call_count for f in made) == 2 * N
    assert sum(f.outcomes.returned for f in made) == 2 * N
    gone = [f for f in made if not f.alive and not f.folded_count]
    aggregates = [f for f in made if f.folded_count]
    assert len(gone) == futures.GONE_KEPT
    assert len(aggregates) <= futures.AGGREGATES_KEPT + 1
    assert sum(f.folded_count for f in aggregates) == 2 * N - futures.GONE_KEPT
    assert any(f.label == futures.OTHER_GONE for f in aggregates)  # more labels than kept
    # the registry keeps no code object alive
    assert sum(ref() is not None for ref in codes) == 0
    assert growth < BYTES_PER_GONE_OBJECT, growth


async def test_one_decorator_applied_many_times_is_one_future() -> None:
    """A closure decorated each time its factory runs is one definition: one future, alive
    while its code may run again, with every call; no record per function object made."""

    def make() -> Callable[[int], Any]:
        @asyncflow.future(name="worker")
        async def worker(i: int) -> int:
            await asyncio.sleep(0)
            return i

        return worker

    async def batch(b: int) -> None:
        for i in range(N):
            assert await make()(i) == i

    with asyncflow.profile("factory", format="none") as prof:
        growth = await _growth_per_object(prof, batch)
        snap = prof.snapshot()
    (worker,) = _futures(snap, lambda f: f.label == "worker")
    assert worker.call_count == worker.outcomes.returned == 2 * N
    assert worker.total_polls == 2 * 2 * N
    assert worker.alive and worker.folded_count == 0 and worker.tracked_by == "decorator"
    assert growth < BYTES_PER_GONE_OBJECT, growth


async def test_names_made_per_call_leave_a_bounded_number_of_futures() -> None:
    """``name=f"fetch {i}"`` inside a factory: each name is a definition of its own, kept while
    it is among the last ``DEFINED_KEPT`` decorated, then gone and folded."""

    def make(name: str) -> Callable[[int], Any]:
        @asyncflow.future(name=name)
        async def fetch(i: int) -> int:
            await asyncio.sleep(0)
            return i

        return fetch

    async def batch(b: int) -> None:
        for i in range(N):
            assert await make(f"fetch /item/{b}-{i}")(i) == i

    with asyncflow.profile("names", format="none") as prof:
        growth = await _growth_per_object(prof, batch)
        snap = prof.snapshot()
    made = _futures(snap, lambda f: f.label.startswith("fetch /item/") or f.folded_count > 0)
    assert sum(f.call_count for f in made) == 2 * N
    assert sum(f.alive for f in made) == futures.DEFINED_KEPT
    assert growth < BYTES_PER_GONE_OBJECT, growth
    # with no profiler running, the registry stays as small
    for i in range(2 * futures.DEFINED_KEPT):
        await make(f"fetch /other/{i}")(i)
    kept = [r for r in futures.registry() if r.label.startswith("fetch /") and r.alive]
    assert len(kept) == futures.DEFINED_KEPT
    assert all(r.label.startswith("fetch /other/") for r in kept)
    # the next profile starts with none of them: no function decorated with them is alive
    with asyncflow.profile("next", format="none") as prof:
        after = prof.snapshot()
    assert not _futures(after, lambda f: f.label.startswith("fetch /"))


async def test_a_decorator_applied_to_code_made_anew_folds_into_one_aggregate() -> None:
    """Functions made with ``exec`` and decorated: each code object is its own definition; gone,
    they leave the last few as they were and one aggregate of their label."""

    async def batch(b: int) -> None:
        for i in range(N):
            handler = asyncflow.future(name="handler")(_new_coroutine_function("handler"))
            assert await handler(i) == i

    with asyncflow.profile("exec-decorated", format="none") as prof:
        growth = await _growth_per_object(prof, batch)
        snap = prof.snapshot()
    made = "<made>"  # the label alone may be another test's too
    handlers = _futures(snap, lambda f: f.label == "handler" and f.location.file == made)
    assert sum(f.call_count for f in handlers) == 2 * N
    (aggregate,) = [f for f in handlers if f.folded_count]
    assert aggregate.folded_count == 2 * N - futures.GONE_KEPT
    assert aggregate.tracked_by == "decorator" and aggregate.poll_duration_ns
    assert not aggregate.alive
    assert len(handlers) == futures.GONE_KEPT + 1
    assert not {h.id for h in handlers} & set(futures._defined)  # their places are given up
    logs = {log.future_id: log for log in snap.future_logs}
    assert logs[aggregate.id].calls  # its recent calls, now its own
    assert all(c.future_id == aggregate.id for c in logs[aggregate.id].calls)
    assert growth < BYTES_PER_GONE_OBJECT, growth


async def test_short_lived_queues_fold_per_label_and_count_the_messages_they_lost() -> None:
    async def batch(b: int) -> None:
        for i in range(N):
            q: asyncio.Queue[int] = asyncio.Queue()  # every queue is made on this line
            q.put_nowait(i)
            assert q.get_nowait() == i
            if i % 2:
                q.put_nowait(i)  # left unread: lost when the queue is freed

    with asyncflow.profile("queues", format="none") as prof:
        with asyncflow.instrument_queues():
            growth = await _growth_per_object(prof, batch)
        snap = prof.snapshot()
    made = _channels(snap, lambda c: c.label.startswith("test_bounded_memory.py:"))
    assert len({c.label for c in made}) == 1
    assert sum(c.sent_count for c in made) == 2 * (N + N // 2)
    assert sum(c.received_count for c in made) == 2 * N
    assert sum(c.lost_count for c in made) == 2 * (N // 2)
    assert all(c.state == "closed" for c in made)
    (aggregate,) = [c for c in made if c.folded_count]
    assert aggregate.folded_count == 2 * N - channels.GONE_KEPT
    assert len(made) == channels.GONE_KEPT + 1
    assert sum(e.messages for e in aggregate.senders) == aggregate.sent_count
    assert growth < BYTES_PER_GONE_OBJECT, growth


async def test_short_lived_memory_streams_fold_per_label() -> None:
    async def batch(b: int) -> None:
        for i in range(N):
            send, receive = asyncflow.instrument_memory_stream(
                *anyio.create_memory_object_stream[int](1), name="short"
            )
            with send, receive:
                send.send_nowait(i)
                assert receive.receive_nowait() == i

    with asyncflow.profile("streams", format="none") as prof:
        growth = await _growth_per_object(prof, batch)
        snap = prof.snapshot()
    made = _channels(snap, lambda c: c.label == "short")
    assert sum(c.sent_count for c in made) == sum(c.received_count for c in made) == 2 * N
    assert len(made) == channels.GONE_KEPT + 1
    assert growth < BYTES_PER_GONE_OBJECT, growth


_GENERATOR_TEMPLATE = compile(
    "async def template(n):\n    for i in range(n):\n        yield i\n", "<made>", "exec"
)
_GENERATOR_CODE = next(c for c in _GENERATOR_TEMPLATE.co_consts if hasattr(c, "co_code"))


def _new_async_generator_function(name: str) -> Callable[[int], AsyncIterator[int]]:
    """An async generator function with a code object of its own, as ``exec`` makes one."""
    code = _GENERATOR_CODE.replace(co_name=name, co_qualname=name)
    fn: Callable[[int], AsyncIterator[int]] = types.FunctionType(code, {})
    return fn


def _iterated(how: str, fn: Callable[[int], AsyncIterator[int]], n: int) -> AsyncIterator[int]:
    """A generator of ``fn`` wrapped by ``asyncflow.stream()``, or made by ``fn`` decorated."""
    return asyncflow.stream(fn(n)) if how == "wrapped" else asyncflow.stream(fn)(n)


@pytest.mark.parametrize("how", ["wrapped", "decorated"])
async def test_async_generators_of_functions_made_by_exec_leave_a_bounded_history(
    how: str,
) -> None:
    codes: list[weakref.ref[Any]] = []
    iterated = 0

    async def batch(b: int) -> None:
        nonlocal iterated
        for i in range(N):
            # 600 names, more than the aggregates kept (the same ones in both batches)
            fn = _new_async_generator_function(f"agen{i % 600}")
            codes.append(weakref.ref(fn.__code__))
            n = i % 3 + 1
            assert [item async for item in _iterated(how, fn, n)] == list(range(n))
            iterated += n

    with asyncflow.profile("generators", format="none") as prof:
        growth = await _growth_per_object(prof, batch)
        snap = prof.snapshot()
    made = _streams(snap, lambda s: s.label.startswith("agen") or s.folded_count > 0)
    # every item and every iteration is counted exactly once, in its own entry or an aggregate
    assert sum(s.items_yielded for s in made) == iterated
    assert sum(s.instances["exhausted"] for s in made) == 2 * N
    assert not any(s.alive for s in made)
    gone = [s for s in made if not s.folded_count]
    aggregates = [s for s in made if s.folded_count]
    assert len(gone) == streams.GONE_KEPT
    assert len(aggregates) <= streams.AGGREGATES_KEPT + 1
    assert sum(s.folded_count for s in aggregates) == 2 * N - streams.GONE_KEPT
    assert any(s.label == streams.OTHER_GONE for s in aggregates)  # more labels than kept
    # the registry keeps no code object alive
    assert sum(ref() is not None for ref in codes) == 0
    assert growth < BYTES_PER_GONE_OBJECT, growth


#: what asyncflow may hold for a live stream definition iterated once (its record, figures, log
#: of one item, weak reference and index entry): 1.5 KB on 3.11, where a log made as a deque of
#: 100 entries took 2.2 KB
BYTES_PER_LIVE_STREAM = 1_800


async def test_a_stream_definition_with_a_short_log_costs_little(prof: asyncflow.Profiler) -> None:
    tracemalloc.start()
    try:
        before = _held_by_asyncflow()
        kept = []
        for i in range(N):
            tracked = asyncflow.stream(_new_async_generator_function(f"live{i % 600}"))
            assert [item async for item in tracked(1)] == [0]  # one item, timed and logged
            kept.append(tracked)
        gc.collect()
        prof.snapshot()
        held = (_held_by_asyncflow() - before) / N
    finally:
        tracemalloc.stop()
    snap = prof.snapshot()
    live = _streams(snap, lambda s: s.label.startswith("live"))
    assert len(live) == N and all(s.alive and s.timed_count == 1 for s in live)
    assert held < BYTES_PER_LIVE_STREAM, held


async def test_without_a_profiler_stream_records_stay_as_many_as_what_is_alive() -> None:
    codes: list[weakref.ref[Any]] = []
    n = streams.GONE_KEPT + 150
    for i in range(n):
        fn = _new_async_generator_function(f"bare{i}")
        codes.append(weakref.ref(fn.__code__))
        gen = fn(2)
        assert asyncflow.stream(gen) is gen  # nothing to record: it is iterated as it is
        assert [item async for item in gen] == [0, 1]
        assert [item async for item in _iterated("decorated", fn, 2)] == [0, 1]
    del fn, gen  # the last generator holds its code
    gc.collect()
    registry = streams.stream_registry()  # with nobody to collect, listing reaps
    assert not [r for r in streams._registry.values() if r.label.startswith("bare")]
    kept = streams.GONE_KEPT + streams.AGGREGATES_KEPT + 1  # and "(other gone streams)"
    assert len(registry) <= len(streams._registry) + kept
    assert sum(ref() is not None for ref in codes) == 0
    # a new profiler starts from zero: the gone streams are forgotten
    with asyncflow.profile("after", format="none") as prof:
        snap = prof.snapshot()
    assert not _streams(snap, lambda s: not s.alive or s.folded_count > 0)


async def test_short_lived_executors_fold_per_label_with_exact_totals() -> None:
    loop = asyncio.get_running_loop()

    async def batch(b: int) -> None:
        for i in range(N):
            # 300 labels, more than the aggregates kept (the same ones in both batches)
            with concurrent.futures.ThreadPoolExecutor(1, f"short{i % 300}") as pool:
                assert await loop.run_in_executor(pool, abs, -i) == i

    with asyncflow.profile("executors", format="none") as prof:
        with asyncflow.instrument_executors():
            growth = await _growth_per_object(prof, batch)
        made = [
            r
            for r in executors.executor_registry()
            if r.label.startswith("ThreadPoolExecutor short") or r.folded
        ]
        snap = prof.snapshot()
        # the collector reaped every one: the registry holds only what is alive
        assert not [r for r in executors._registry.values() if r in made]
    # every job is counted exactly once, in its own entry or in an aggregate
    assert sum(r.stats.submitted for r in made) == sum(r.stats.completed for r in made) == 2 * N
    assert sum(r.stats.by_function["abs"].jobs for r in made) == 2 * N
    assert not any(r.alive for r in made)
    gone = [r for r in made if not r.folded]
    aggregates = [r for r in made if r.folded]
    assert len(gone) == executors.GONE_KEPT
    assert len(aggregates) == executors.AGGREGATES_KEPT + 1
    assert sum(r.folded for r in aggregates) == 2 * N - executors.GONE_KEPT
    assert any(r.label == executors.OTHER_GONE for r in aggregates)  # more labels than kept
    # and the documents list them, with the same totals
    assert snap.executors is not None
    entries = [e for e in snap.executors.executors if e.id in {r.id for r in made}]
    assert len(entries) == len(made) and sum(e.completed for e in entries) == 2 * N
    assert sum(e.folded_count for e in entries) == 2 * N - executors.GONE_KEPT
    assert growth < BYTES_PER_GONE_OBJECT, growth


async def test_a_page_of_futures_builds_only_its_own_entries(
    prof: asyncflow.Profiler, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = []
    for i in range(50):

        @asyncflow.future(name=f"page-{i}")
        async def step(n: int) -> None:
            for _ in range(n):
                await asyncio.sleep(0)

        made.append(step)  # alive: listed as they are
        await step(i % 7)
    full = prof.snapshot().futures.futures
    built: list[int] = []
    original = views.future_entry

    def counting(
        record: futures.FutureRecord, now: int, qs: tuple[float, ...], *more: Any
    ) -> FutureEntry:
        built.append(record.id)
        return original(record, now, qs, *more)

    monkeypatch.setattr(views, "future_entry", counting)
    collector = prof._collector
    assert collector is not None
    page = views.futures_document(collector, clock.now_ns(), offset=5, limit=10)
    assert len(built) == 10 and page.total == len(full)
    # the same futures, in the same order, as the whole list has there (no call is live)
    assert [(f.id, f.busy_ns, f.total_polls) for f in page.futures] == [
        (f.id, f.busy_ns, f.total_polls) for f in full[5:15]
    ]
