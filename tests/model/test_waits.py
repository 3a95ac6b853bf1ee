"""Where tasks wait: await chains and the waits they end in, named as a person would."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import anyio
import pytest

import asyncflow
from asyncflow import schema
from asyncflow.instrumentation import loops
from asyncflow.model import waits


async def _settle(tasks: list[asyncio.Task[Any]], ready: Callable[[], bool]) -> None:
    """Let the loop run until every task reached its wait (bounded, no sleeping for time)."""
    with anyio.fail_after(5):
        while not ready():
            await asyncio.sleep(0)
    for task in tasks:
        assert not task.done(), task


def _by_name(walks: list[waits.TaskWalk]) -> dict[str, waits.TaskWalk]:
    return {w.entry.name: w for w in walks}


async def test_every_kind_of_wait_is_named(prof: asyncflow.Profiler) -> None:
    loop = asyncio.get_running_loop()
    jobs = asyncflow.instrument_queue(asyncio.Queue[int](), name="jobs")
    out = asyncflow.instrument_queue(asyncio.Queue[int](1), name="out")
    out.put_nowait(0)
    lock = asyncio.Lock()
    await lock.acquire()
    pool = asyncio.Semaphore(0)
    go = asyncio.Event()
    cond = asyncio.Condition()
    release = threading.Event()
    left, right = socket.socketpair()

    @asyncflow.future(name="consumer")
    async def consumer() -> int:
        return await jobs.get()

    async def producer() -> None:
        await out.put(1)

    async def locker() -> None:
        async with lock:
            pass

    async def pooled() -> None:
        async with pool:
            pass

    async def waiter() -> None:
        await go.wait()

    async def notified() -> None:
        async with cond:
            await cond.wait()

    async def sleeper() -> None:
        await asyncio.sleep(30)

    async def gatherer() -> None:
        await asyncio.gather(sleeper(), sleeper())

    async def threaded() -> None:
        await asyncio.to_thread(release.wait)

    async def executor() -> None:
        await loop.run_in_executor(None, release.wait)

    async def grouped() -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(sleeper())

    async def reader() -> None:
        r, w = await asyncio.open_connection(sock=left)
        try:
            await r.read(1)
        finally:
            w.close()

    starts: dict[str, Callable[[], Coroutine[Any, Any, Any]]] = {
        "consumer": consumer,
        "producer": producer,
        "locker": locker,
        "pooled": pooled,
        "waiter": waiter,
        "notified": notified,
        "sleeper": sleeper,
        "gatherer": gatherer,
        "threaded": threaded,
        "executor": executor,
        "grouped": grouped,
        "reader": reader,
    }
    tasks = [asyncio.create_task(fn(), name=name) for name, fn in starts.items()]
    sleeping = tasks[list(starts).index("sleeper")]
    tasks.append(asyncio.create_task(_join(sleeping), name="joiner"))
    record = loops.see(loop)

    def everyone_waits() -> bool:
        found = _by_name(waits.walk_loop(record))
        return all(
            name in found and found[name].entry.state == "waiting" for name in [*starts, "joiner"]
        )

    try:
        await _settle(tasks, everyone_waits)
        found = _by_name(waits.walk_loop(record))
        kinds = {name: w.entry.waits_on.kind for name, w in found.items() if w.entry.waits_on}
        assert kinds["consumer"] == "queue_get"
        assert kinds["producer"] == "queue_put"
        assert kinds["locker"] == "lock"
        assert kinds["pooled"] == "semaphore"
        assert kinds["waiter"] == "event"
        assert kinds["notified"] == "condition"
        assert kinds["sleeper"] == "sleep"
        assert kinds["gatherer"] == "gather"
        assert kinds["threaded"] == "executor"
        assert kinds["executor"] == "executor"
        assert kinds["grouped"] == "taskgroup"
        assert kinds["reader"] == "io"
        assert kinds["joiner"] == "task"

        consumer_walk = found["consumer"]
        target = consumer_walk.entry.waits_on
        assert target is not None
        assert (target.label, target.description) == ("jobs", "get from queue jobs")
        assert target.ref is not None and target.ref.startswith("channel:")
        assert consumer_walk.entry.future_label == "consumer"
        assert consumer_walk.entry.age_ns is not None
        # the chain ends inside asyncio's Queue.get; the program's own line is consumer's await
        assert consumer_walk.entry.chain[-1].function == "Queue.get"
        assert consumer_walk.where is not None
        assert consumer_walk.where.function.endswith("consumer")
        assert consumer_walk.where.file == __file__

        sleep = found["sleeper"].entry.waits_on
        assert sleep is not None and sleep.remaining_ns is not None
        assert 0 < sleep.remaining_ns <= 30_000_000_000
        gather = found["gatherer"].entry.waits_on
        assert gather is not None and gather.children == 2
        threaded_target = found["threaded"].entry.waits_on
        assert threaded_target is not None and threaded_target.label == "Event.wait"
        joined = found["joiner"].entry.waits_on
        assert joined is not None and joined.label == "sleeper"
        # the test itself is the task that asked: it is in the middle of a step
        me = asyncio.current_task()
        assert me is not None and found[me.get_name()].entry.state == "running"
    finally:
        release.set()
        right.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        lock.release()
        left.close()


async def _join(task: asyncio.Task[Any]) -> None:
    await task


async def test_waits_are_counted_by_future_line_and_target(prof: asyncflow.Profiler) -> None:
    lock = asyncio.Lock()
    await lock.acquire()

    @asyncflow.future(name="worker")
    async def worker() -> None:
        async with lock:
            pass

    crew = [asyncio.create_task(worker()) for _ in range(5)]
    record = loops.see(asyncio.get_running_loop())
    try:
        await _settle(crew, lambda: len(lock._waiters or ()) == 5)
        summary = waits.summarise(waits.walk_loop(record))
        top = summary[0]
        assert (top.label, top.tasks) == ("worker", 5)
        assert top.where is not None and top.where.file == __file__
        assert top.waits_on is not None and top.waits_on.kind == "lock"
    finally:
        lock.release()
        await asyncio.gather(*crew)


async def test_another_thread_reads_on_the_loop_or_says_it_could_not(
    prof: asyncflow.Profiler,
) -> None:
    go = asyncio.Event()

    async def waiter() -> None:
        await go.wait()

    task = asyncio.create_task(waiter(), name="waiter")
    record = loops.see(asyncio.get_running_loop())
    await asyncio.sleep(0)
    with anyio.fail_after(5):
        # the loop is free while it awaits the thread: the walk runs on it, consistently
        walks, consistent = await asyncio.to_thread(waits.walk_on_loop, record, 5.0, True)
        assert consistent
        assert _by_name(walks)["waiter"].entry.waits_on is not None
        # told the loop is blocked, the reader does not wait for it, and says so
        walks, consistent = await asyncio.to_thread(waits.walk_on_loop, record, 5.0, False)
        assert not consistent
        assert "waiter" in _by_name(walks)
    go.set()
    await task


@pytest.mark.parametrize("hostile", [ValueError, KeyboardInterrupt])
def test_an_unknown_future_is_described_even_when_its_repr_raises(
    hostile: type[BaseException],
) -> None:
    class Strange(asyncio.Future[None]):
        def __repr__(self) -> str:
            raise hostile

    loop = asyncio.new_event_loop()
    try:
        target = waits.describe_future(Strange(loop=loop))
    finally:
        loop.close()
    assert (target.kind, target.description) == ("future", f"<{Strange.__qualname__}>")


async def test_asyncflow_frames_are_no_part_of_the_chain(prof: asyncflow.Profiler) -> None:
    gate = asyncflow.instrument_lock(asyncio.Lock(), name="gate")
    await gate.acquire()

    async def wait_at_gate() -> None:
        async with gate:
            pass

    task = asyncio.create_task(wait_at_gate(), name="visitor")
    record = loops.see(asyncio.get_running_loop())
    try:
        await _settle(
            [task], lambda: _by_name(waits.walk_loop(record))["visitor"].entry.state == "waiting"
        )
        entry = _by_name(waits.walk_loop(record))["visitor"].entry
        files = [f.file for f in entry.chain]
        # asyncflow's own frames are the package's files; a checkout may itself sit in a folder
        # named asyncflow (as `git clone` makes), so compare with the package's directory
        package = os.path.dirname(asyncflow.__file__) + os.sep
        assert files[0] == __file__ and not any(f.startswith(package) for f in files), files
        assert entry.chain[-1].function == "Lock.acquire"
        assert entry.waits_on is not None and entry.waits_on.label == "gate"
        assert entry.where is not None and entry.where.function.endswith("wait_at_gate")
    finally:
        gate.release()
        await task


async def test_a_task_reports_the_line_it_was_created_on(prof: asyncflow.Profiler) -> None:
    """The task tree's creation line: the frame that called create_task (asyncio's own frames
    left out: a task group's, gather's), resolved only when /tasks is built."""
    handle = asyncflow.instrument_tasks()
    release = asyncio.Event()
    started = 0

    async def child() -> None:
        nonlocal started
        started += 1
        await release.wait()

    async def parent() -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(child(), name="grouped")  # grouped's line
            await release.wait()

    here = child.__code__.co_filename
    first = parent.__code__.co_firstlineno
    made = asyncio.create_task(parent(), name="parent")  # parent's line
    plain = asyncio.ensure_future(child())
    plain.set_name("ensured")
    try:
        await _settle([made, plain], lambda: started == 2)
        tasks = {t.name: t for t in prof.snapshot().tasks.tasks}  # type: ignore[union-attr]
        assert tasks["parent"].created_at == schema.AwaitFrame(
            here, first + 7, "test_a_task_reports_the_line_it_was_created_on"
        )
        assert tasks["ensured"].created_at is not None
        assert tasks["ensured"].created_at.line == first + 8
        assert tasks["grouped"].created_at == schema.AwaitFrame(
            here, first + 2, "test_a_task_reports_the_line_it_was_created_on.<locals>.parent"
        )
        assert tasks["grouped"].parent == "parent"
    finally:
        release.set()
        await asyncio.gather(made, plain)
        handle.undo()


async def test_a_task_made_by_a_library_names_the_librarys_line(prof: asyncflow.Profiler) -> None:
    """The creation line is the frame that called create_task, asyncio's left out: a task an
    anyio task group starts is made on anyio's line (the program's start_soon is its caller's
    concern, as a library's frame is in ``where``)."""
    handle = asyncflow.instrument_tasks()
    release = asyncio.Event()
    try:
        async with anyio.create_task_group() as tg:

            async def child() -> None:
                await release.wait()

            tg.start_soon(child, name="started")
            await asyncio.sleep(0)
            tasks = {t.name: t for t in prof.snapshot().tasks.tasks}  # type: ignore[union-attr]
            site = tasks["started"].created_at
            assert site is not None and "anyio" in site.file, site
            release.set()
    finally:
        handle.undo()


def test_the_creation_line_keeps_no_frame_and_leaks_no_code() -> None:
    """The factory keeps the creating frame's code (its record's), never the frame: with the
    references of the code stay where they were (the records kept are bounded), and, with the
    cyclic GC off, what the creating frame held is let go at once."""
    import gc
    import sys

    async def leaf() -> None:
        pass

    async def maker() -> None:
        tasks = [asyncio.create_task(leaf()) for _ in range(50)]
        await asyncio.gather(*tasks)

    def rounds(n: int) -> None:
        async def main() -> None:
            with asyncflow.profile("site", format="none"):
                handle = asyncflow.instrument_tasks()
                try:
                    for _ in range(n):
                        await maker()
                finally:
                    handle.undo()

        asyncio.run(main())

    code = maker.__code__
    rounds(20)  # (the futures' bounded logs of recent calls keep some records: filled here)
    gc.collect()
    before = sys.getrefcount(code)
    gc.disable()
    try:
        rounds(20)
    finally:
        gc.enable()
    gc.collect()  # (asyncio's cycles on 3.12+ hold the last round's tasks until collected)
    assert sys.getrefcount(code) == before
    # and no frame: what the creating frame held (its locals) is let go once it ends, GC off
    held = object()

    async def holding(thing: object) -> None:
        tasks = [asyncio.create_task(leaf()) for _ in range(5)]
        await asyncio.gather(*tasks)

    async def probe() -> int:
        with asyncflow.profile("site", format="none"):
            handle = asyncflow.instrument_tasks()
            try:
                base = sys.getrefcount(held)
                await holding(held)
                return sys.getrefcount(held) - base
            finally:
                handle.undo()

    gc.disable()
    try:
        assert asyncio.run(probe()) == 0
    finally:
        gc.enable()


async def test_a_walk_from_another_thread_yields_to_the_loop_between_slices(
    prof: asyncflow.Profiler, monkeypatch: pytest.MonkeyPatch
) -> None:
    go = asyncio.Event()

    async def waiter() -> None:
        await go.wait()

    crew = [asyncio.create_task(waiter(), name=f"sliced{i}") for i in range(12)]
    record = loops.see(asyncio.get_running_loop())
    loop = asyncio.get_running_loop()
    await asyncio.sleep(0)
    # A counting probe: a callback that runs again at each turn of the loop; each task's walk
    # notes how often it had run, so the walk's slices show as the turns between them.
    turns = [0]
    walking = [True]
    seen: list[int] = []

    def probe() -> None:
        turns[0] += 1
        if walking[0]:
            loop.call_soon(probe)

    real = waits.walk_task

    def counted(*args: Any) -> waits.TaskWalk:
        seen.append(turns[0])
        return real(*args)

    monkeypatch.setattr(waits, "walk_task", counted)
    probe()
    try:
        with anyio.fail_after(5):
            walks, consistent = await asyncio.to_thread(
                waits.walk_on_loop, record, 5.0, True, True, 3
            )
    finally:
        walking[0] = False
    assert consistent
    assert {f"sliced{i}" for i in range(12)} <= set(_by_name(walks))
    # 3 tasks a slice at most: the loop turned between every 3 walks (no slice walked more)
    assert len(seen) >= 12
    assert max(seen.count(turn) for turn in set(seen)) <= 3
    assert len(set(seen)) >= len(seen) // 3
    go.set()
    await asyncio.gather(*crew)
