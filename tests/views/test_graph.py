"""The wait-for graph: who waits on whom, the deadlocks in it, and the task tree."""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Callable
from typing import Any

import anyio
import pytest

import asyncflow
from asyncflow import schema
from asyncflow.render.report import render_table
from asyncflow.views import documents, graph, lints


@pytest.fixture(autouse=True)
def _no_primitives_of_earlier_tests() -> None:
    gc.collect()  # an earlier test's lock, held when it was left, is no holder here


async def _settle(ready: Callable[[], bool]) -> None:
    """Let the loop run until ``ready()`` (bounded; no sleeping for time)."""
    with anyio.fail_after(5):
        while not ready():
            await asyncio.sleep(0)


def _graph(prof: asyncflow.Profiler) -> schema.GraphDocument:
    snap = prof.snapshot()
    assert snap.graph is not None
    return snap.graph


def _deadlocks(prof: asyncflow.Profiler) -> list[lints.Finding]:
    findings = lints.evaluate(lints.documents_of(prof.snapshot()), lints.Thresholds())
    return [f for f in findings if f.kind == "deadlock"]


async def _cancel(*tasks: asyncio.Task[Any]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_lock_order_deadlock_is_a_cycle_and_an_error(prof: asyncflow.Profiler) -> None:
    asyncflow.instrument_tasks()
    first = asyncflow.instrument_lock(asyncio.Lock(), name="accounts")
    second = asyncflow.instrument_lock(asyncio.Lock(), name="accounts")
    both = asyncio.Event()

    async def transfer(a: asyncio.Lock, b: asyncio.Lock) -> None:
        async with a:
            await both.wait()
            async with b:
                pass

    one = asyncio.create_task(transfer(first, second), name="one")
    two = asyncio.create_task(transfer(second, first), name="two")
    await _settle(lambda: first.locked() and second.locked())
    both.set()
    await _settle(lambda: len(asyncflow.instrument_lock(first)._waiters or ()) == 1)
    await _settle(lambda: len(second._waiters or ()) == 1)
    try:
        g = _graph(prof)
        (cycle,) = g.cycles
        assert sorted(cycle.tasks) == ["one", "two"]
        assert len(cycle.nodes) == 4  # task, lock, task, lock
        stuck = {n.label for n in g.nodes if n.stuck}
        assert stuck == {"one", "two"}
        held = [e for e in g.edges if e.relation == "held_by"]
        assert {e.target for e in held} == {"task:one", "task:two"}
        # where each took what it holds: the `async with a:` line of transfer
        lines = {e.where.line for e in held if e.where is not None}
        assert len(lines) == 1
        (finding,) = _deadlocks(prof)
        assert finding.severity == "error"
        assert "`one`" in finding.message and "`two`" in finding.message
        # two locks created with one label get distinct names
        assert "accounts #" in finding.message
        resources = prof.snapshot().resources
        assert resources is not None
        names = graph.resource_names(resources.resources)
        assert len(set(names.values())) == len(names)
        # ... in the resources document too
        mine = sorted((r.id, r.name) for r in resources.resources if r.label == "accounts")
        assert [name for _, name in mine] == [f"accounts #{i}" for i, _ in mine]
        assert len(mine) == 2
        assert f"taken at test_graph.py:{lines.pop()}" in finding.message
        # the table report has a section for the stuck tasks
        text = render_table(prof.snapshot(), (50.0,), 10)
        assert "stuck tasks (2, in 1 deadlock)" in text
    finally:
        await _cancel(one, two)


def test_tasks_awaiting_each_other_form_a_cycle(prof: asyncflow.Profiler) -> None:
    """Two tasks that await each other. Cancelling either recurses without end in asyncio
    (each cancels what it awaits), so they run on a loop of their own, left unfinished."""
    loop = asyncio.new_event_loop()
    asyncflow.instrument_tasks(loop)
    tasks: dict[str, asyncio.Task[None]] = {}

    async def wait_for(other: str) -> None:
        await asyncio.sleep(0)
        await tasks[other]

    async def start() -> None:
        tasks["ping"] = asyncio.create_task(wait_for("pong"), name="ping")
        tasks["pong"] = asyncio.create_task(wait_for("ping"), name="pong")
        with anyio.fail_after(5):
            while not all(getattr(t, "_fut_waiter", None) is not None for t in tasks.values()):
                await asyncio.sleep(0)

    worker = threading.Thread(target=loop.run_until_complete, args=(start(),))
    worker.start()
    worker.join(10)
    try:
        g = _graph(prof)
        (cycle,) = g.cycles
        assert sorted(cycle.tasks) == ["ping", "pong"]
        assert {e.relation for e in g.edges if e.source in cycle.nodes} == {"awaits"}
        (finding,) = _deadlocks(prof)
        assert "awaits task `pong`" in finding.message or "awaits task `ping`" in finding.message
        walked = {t.name: t for t in prof.snapshot().tasks.tasks}  # type: ignore[union-attr]
        assert walked["ping"].awaits == ["pong"] and walked["ping"].awaiters == ["pong"]
    finally:
        loop.close()
        for task in tasks.values():
            task.get_coro().close()
        tasks.clear()


async def test_a_healthy_program_with_locks_and_queues_has_an_acyclic_graph(
    prof: asyncflow.Profiler,
) -> None:
    asyncflow.instrument_tasks()
    lock = asyncflow.instrument_lock(asyncio.Lock(), name="cache")
    jobs = asyncflow.instrument_queue(asyncio.Queue[int](2), name="jobs")
    release = asyncio.Event()

    async def holder() -> None:
        async with lock:
            await release.wait()

    async def waiter() -> None:
        async with lock:
            pass

    async def producer() -> None:
        for i in range(10):
            await jobs.put(i)

    async def consumer() -> None:
        await jobs.get()  # a consumer the channel has seen, then busy elsewhere for a while
        await release.wait()
        while True:
            await jobs.get()

    running = [
        asyncio.create_task(holder(), name="holder"),
        *(asyncio.create_task(waiter(), name=f"waiter-{i}") for i in range(3)),
        asyncio.create_task(producer(), name="producer"),
        asyncio.create_task(consumer(), name="consumer"),
    ]
    await _settle(lambda: jobs.full() and lock.locked() and len(lock._waiters or ()) == 3)
    try:
        g = _graph(prof)
        assert g.cycles == [] and not any(n.stuck for n in g.nodes)
        relations = {(e.source, e.relation, e.target) for e in g.edges}
        # each edge once, however many tasks wait on the lock (three) or the queue
        assert len(g.edges) == len(relations)
        assert ("task:waiter-0", "waits", "resource:" + _ref(g, "cache")) in relations
        assert ("resource:" + _ref(g, "cache"), "held_by", "task:holder") in relations
        assert ("task:producer", "waits", f"channel:{_ref(g, 'jobs')}") in relations
        assert (f"channel:{_ref(g, 'jobs')}", "received_by", "task:consumer") in relations
        assert _deadlocks(prof) == []
        release.set()
        await _settle(lambda: jobs.empty() and not lock.locked())
        g2 = _graph(prof)
        assert g2.cycles == []
    finally:
        await _cancel(*running)


def _ref(g: schema.GraphDocument, label: str) -> str:
    return next(n.id for n in g.nodes if n.label == label).split(":", 1)[1]


async def test_the_task_tree_shows_a_task_groups_children(prof: asyncflow.Profiler) -> None:
    asyncflow.instrument_tasks()
    release = asyncio.Event()
    started = 0

    async def child() -> None:
        nonlocal started
        started += 1
        await release.wait()

    async def parent() -> None:
        async with asyncio.TaskGroup() as tg:
            for i in range(3):
                tg.create_task(child(), name=f"child-{i}")

    task = asyncio.create_task(parent(), name="parent")
    await _settle(lambda: started == 3)
    try:
        tasks = {t.name: t for t in prof.snapshot().tasks.tasks}  # type: ignore[union-attr]
        assert tasks["parent"].awaits == ["child-0", "child-1", "child-2"]
        for i in range(3):
            entry = tasks[f"child-{i}"]
            assert entry.parent == "parent"
            assert entry.awaiters == ["parent"]
        g = _graph(prof)
        awaits = {(e.source, e.target) for e in g.edges if e.relation == "awaits"}
        assert awaits == {("task:parent", f"task:child-{i}") for i in range(3)}
        assert g.cycles == []
    finally:
        release.set()
        await task


async def test_an_anyio_lock_order_deadlock_begun_in_an_owners_acquire_is_a_cycle(
    prof: asyncflow.Profiler,
) -> None:
    """Whole-program anyio locks have their creation site only until a task waits behind a
    holder. ``one`` queues on ``b`` while ``two`` is still in ``b``'s acquire (anyio's
    checkpoint after taking it): no holder yet, so ``b`` stays without a record. The deadlock
    is found all the same: the walk of the tasks gives ``b`` its record."""
    asyncflow.instrument_tasks()
    with asyncflow.instrument_locks():
        a, b = anyio.Lock(), anyio.Lock()

    async def take(first: anyio.Lock, then: anyio.Lock) -> None:
        async with first, then:
            pass

    one = asyncio.create_task(take(a, b), name="one")
    two = asyncio.create_task(take(b, a), name="two")
    await _settle(lambda: len(a._waiters) == 1 and len(b._waiters) == 1)  # type: ignore[attr-defined]
    try:
        (finding,) = _deadlocks(prof)
        assert finding.severity == "error"
        assert "`one`" in finding.message and "`two`" in finding.message
    finally:
        await _cancel(one, two)


async def test_the_collector_keeps_a_deadlock_nobody_asked_for(
    prof: asyncflow.Profiler,
) -> None:
    """The watch on the collector's tick puts a deadlock in the warnings, then the tasks are
    cancelled (as a program's shutdown would): the warning stays, as one that held earlier."""
    asyncflow.instrument_tasks()
    a = asyncflow.instrument_lock(asyncio.Lock(), name="a")
    b = asyncflow.instrument_lock(asyncio.Lock(), name="b")
    both = asyncio.Event()

    async def take(x: asyncio.Lock, y: asyncio.Lock) -> None:
        async with x:
            await both.wait()
            async with y:
                pass

    one = asyncio.create_task(take(a, b), name="one")
    two = asyncio.create_task(take(b, a), name="two")
    await _settle(lambda: a.locked() and b.locked())
    both.set()
    await _settle(lambda: len(a._waiters or ()) == 1 and len(b._waiters or ()) == 1)
    collector = prof._collector
    assert collector is not None
    book = documents.warning_book(collector)
    with anyio.fail_after(5):
        while not book.holds("deadlock"):
            await asyncio.sleep(0.01)  # the collector's thread ticks every 50 ms
    await _cancel(one, two)
    warnings = [w for w in prof.snapshot().warnings if w.kind == "deadlock"]
    assert [(w.severity, w.active) for w in warnings] == [("error", False)]
