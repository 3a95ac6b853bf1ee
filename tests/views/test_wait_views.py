"""The documents of waits: executors, tasks and never-awaited coroutines, from real programs."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import warnings
import weakref
from collections.abc import AsyncIterator
from typing import Any

import anyio
import orjson
import pytest

import asyncflow
from asyncflow import schema
from asyncflow.instrumentation import coroutines, loops
from asyncflow.model import waits
from asyncflow.views import documents, wait_views


def checksum(data: bytes) -> int:
    return sum(data) % 251


async def test_executors_document_names_functions_and_submitting_futures(
    prof: asyncflow.Profiler,
) -> None:
    loop = asyncio.get_running_loop()

    @asyncflow.future(name="upload")
    async def upload(data: bytes) -> int:
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            return await loop.run_in_executor(pool, checksum, data)

    with asyncflow.instrument_executors():
        assert await asyncio.create_task(upload(b"abc")) == checksum(b"abc")
        futures = [upload.future_record]  # type: ignore[attr-defined]
        document = wait_views.executors_document((50.0, 99.0), futures)
    (entry,) = [e for e in document.executors if e.label == "ThreadPoolExecutor"]
    assert (entry.kind, entry.submitted, entry.completed, entry.queued, entry.running) == (
        "thread",
        1,
        1,
        0,
        0,
    )
    assert [(g.name, g.jobs) for g in entry.functions] == [(f"{__name__}.checksum", 1)]
    assert [(g.name, g.jobs) for g in entry.futures] == [("upload", 1)]
    assert set(entry.run_ns) == {"p50", "p99"}
    # the document round-trips through the wire schema
    assert schema.load(schema.ExecutorsDocument, document_json(document)) == document


def document_json(document: object) -> object:
    return orjson.loads(schema.dumps(document))


async def test_tasks_document_pages_and_counts_every_wait(prof: asyncflow.Profiler) -> None:
    lock = asyncio.Lock()
    await lock.acquire()

    @asyncflow.future(name="worker")
    async def worker() -> None:
        async with lock:
            pass

    crew = [asyncio.create_task(worker(), name=f"w{i}") for i in range(4)]
    record = loops.see(asyncio.get_running_loop())
    try:
        with anyio.fail_after(5):
            while len(lock._waiters or ()) < 4:
                await asyncio.sleep(0)
        document = wait_views.tasks_document(0, 2, lambda _: True, [record])
        assert document.total == len(asyncio.all_tasks())  # the workers, this test, its runner
        assert len(document.tasks) == 2
        assert all(t.future_label == "worker" for t in document.tasks)  # tracked calls first
        (summary,) = [w for w in document.waits if w.label == "worker"]
        assert summary.tasks == 4 and summary.waits_on is not None
        assert summary.waits_on.kind == "lock"
        assert schema.load(schema.TasksDocument, document_json(document)) == document
    finally:
        lock.release()
        await asyncio.gather(*crew)


async def test_a_reading_walks_at_most_its_bound_oldest_tracked_calls_first(
    prof: asyncflow.Profiler,
) -> None:
    go = asyncio.Event()

    @asyncflow.future(name="held")
    async def held() -> None:
        await go.wait()

    crew = []
    for i in range(6):  # one at a time: each call is made after the one before it
        crew.append(asyncio.create_task(held(), name=f"h{i}"))
        await asyncio.sleep(0)
    record = loops.see(asyncio.get_running_loop())
    try:
        reading = wait_views.read_tasks(lambda _: True, [record], most=3)
        assert reading.total == len(asyncio.all_tasks())  # every live task is counted
        assert [e.name for e in reading.task_entries()] == ["h0", "h1", "h2"]  # and 3 walked
        # each kept as its JSON: no object per task for the garbage collector to count
        assert not any(gc.is_tracked(e) for e in reading.entries)
        document = wait_views.tasks_document(2, 5, lambda _: True, reading=reading)
        assert document.walked == 3 and document.total == reading.total
        assert [t.name for t in document.tasks] == ["h2"]  # a page of the walked tasks
        # the endpoint's JSON, made of the entries' JSON as kept, is the same document
        assert schema.load(schema.TasksDocument, orjson.loads(reading.tasks_json(2, 5))) == document
        (summary,) = document.waits
        assert summary.label == "held" and summary.tasks == 3
    finally:
        go.set()
        await asyncio.gather(*crew)


@contextlib.asynccontextmanager
async def _waiting(prefix: str, n: int) -> AsyncIterator[loops.LoopRecord]:
    """``n`` tasks named ``prefix0``... waiting on an event until the block ends; yields the
    running loop's record."""
    go = asyncio.Event()

    async def waiter() -> None:
        await go.wait()

    crew = [asyncio.create_task(waiter(), name=f"{prefix}{i}") for i in range(n)]
    record = loops.see(asyncio.get_running_loop())
    await asyncio.sleep(0)
    try:
        yield record
    finally:
        go.set()
        await asyncio.gather(*crew)


async def test_the_deadlock_watch_reads_a_loop_in_slices(
    prof: asyncflow.Profiler, monkeypatch: pytest.MonkeyPatch
) -> None:
    # each slice's clock is up after its first task
    monkeypatch.setattr(waits, "SLICE_NS", 0, raising=False)
    turns = [0]
    seen: list[int] = []
    real = waits.walk_task

    def counted(*args: Any) -> waits.TaskWalk:
        seen.append(turns[0])
        return real(*args)

    async with _waiting("s", 8) as record:
        monkeypatch.setattr(waits, "walk_task", counted)
        asked = documents._ask(asyncio.get_running_loop(), record)
        with anyio.fail_after(5):
            while not asked.done():  # the counting probe: one turn of the loop each
                turns[0] += 1
                await asyncio.sleep(0)
    walks, _ = asked.result()
    assert {f"s{i}" for i in range(8)} <= {w.entry.name for w in walks}
    assert len(set(seen)) == len(seen)  # one task a turn: the loop ran between them


@pytest.mark.parametrize("given_up", [False, True])
async def test_the_deadlock_watchs_reading_is_freed_without_the_garbage_collector(
    prof: asyncflow.Profiler, monkeypatch: pytest.MonkeyPatch, given_up: bool
) -> None:
    # Twice a second the watch reads every task. The callbacks of its futures held the reading,
    # and a future keeps its callbacks: the reading, its walks and their entries were a cycle,
    # and the program's process ran a collection of the garbage collector for them.
    made: list[weakref.ref[waits.SlicedWalk]] = []

    class Watched(waits.SlicedWalk):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(weakref.ref(self))

    monkeypatch.setattr(documents, "SlicedWalk", Watched)
    async with _waiting("f", 3) as record:
        gc.disable()
        try:
            asked = documents._ask(asyncio.get_running_loop(), record)
            if given_up:
                assert asked.cancel()
            with anyio.fail_after(5):
                while made[0]() is not None:  # (the loop drops its callback once it ran)
                    await asyncio.sleep(0)
            assert asked.cancelled() if given_up else asked.result()[0]
        finally:
            gc.enable()


async def forgotten() -> None:
    pass


def test_never_awaited_entries() -> None:
    coroutines.reset_for_session()
    with asyncflow.track_never_awaited(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        forgotten()  # type: ignore[unused-coroutine]
        gc.collect()
    (entry,) = wait_views.never_awaited_entries()
    assert (entry.function, entry.count) == ("forgotten", 1)
    assert entry.location == schema.Location(__file__, forgotten.__code__.co_firstlineno)
    coroutines.reset_for_session()
