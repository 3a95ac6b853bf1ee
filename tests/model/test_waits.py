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
