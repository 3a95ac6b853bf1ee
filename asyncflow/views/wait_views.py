"""Pure functions from the wait recorders' state to documents: executors, tasks, never-awaited.

The companions of :mod:`asyncflow.views.documents` for what tasks wait on. Built on the
profiler's thread, in time proportional to what they return.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from asyncflow import stats
from asyncflow.instrumentation.coroutines import Site, never_awaited
from asyncflow.instrumentation.executors import ExecutorRecord, JobFigures, executor_registry
from asyncflow.instrumentation.futures import FutureRecord, InstrumentedCoroutine
from asyncflow.instrumentation.loops import LoopRecord, loop_registry
from asyncflow.model.monitor import LoopMonitor
from asyncflow.model.waits import TaskWalk, loop_tasks, read_on_loop, summarise
from asyncflow.schema import (
    SCHEMA,
    AwaitFrame,
    ExecutorEntry,
    ExecutorsDocument,
    JobGroup,
    Location,
    NeverAwaitedEntry,
    TasksDocument,
)
from asyncflow.views.paging import at_most

__all__ = [
    "TASK_WALK_TIMEOUT",
    "WALK_MOST",
    "TaskReading",
    "executor_entry",
    "executors_document",
    "never_awaited_entries",
    "read_tasks",
    "responsive_loops",
    "task_tree",
    "task_walks",
    "tasks_document",
]

#: How long a document waits for a responsive loop to read its own tasks, in seconds (while
#: the walk's slices keep coming, it waits on).
TASK_WALK_TIMEOUT = 0.25
#: Tasks one reading walks at the most, the first in the list's order: past it, what a
#: document lists and counts is theirs (``walked``), and ``total`` counts every live task.
#: About 0.2 s of the loop's time, in slices, at 20 µs a task.
WALK_MOST = 10_000


def _group(name: str, future_id: int | None, figures: JobFigures) -> JobGroup:
    return JobGroup(
        name=name,
        future_id=future_id,
        jobs=figures.jobs,
        raised=figures.raised,
        queued_ns=figures.queued_ns,
        max_queued_ns=figures.max_queued_ns,
        run_ns=figures.run_ns,
        max_run_ns=figures.max_run_ns,
    )


def executor_entry(
    record: ExecutorRecord,
    percentiles: tuple[float, ...],
    future_label: Callable[[int], str],
) -> ExecutorEntry:
    """One executor's figures over the session."""
    with record.lock:  # worker threads fold jobs in under it: read one consistent state
        st = record.stats
        functions = sorted(st.by_function.items(), key=lambda kv: (-kv[1].run_ns, kv[0]))
        futures = sorted(st.by_future.items(), key=lambda kv: (-kv[1].jobs, kv[0]))
        most, workers = record.workers()
        return ExecutorEntry(
            id=record.id,
            label=record.label,
            kind=record.kind,
            state="alive" if record.alive else "gone",
            max_workers=most,
            workers=workers,
            submitted=st.submitted,
            queued=st.queued,
            running=st.running,
            completed=st.completed,
            raised=st.raised,
            cancelled=st.cancelled,
            queued_ns=at_most(stats.percentiles(st.queued_hist, percentiles), st.max_queued_ns),
            total_queued_ns=st.queued_ns,
            max_queued_ns=st.max_queued_ns,
            run_ns=at_most(stats.percentiles(st.run_hist, percentiles), st.max_run_ns),
            total_run_ns=st.run_ns,
            max_run_ns=st.max_run_ns,
            functions=[_group(name, None, f) for name, f in functions],
            futures=[_group(future_label(fid), fid, f) for fid, f in futures],
            folded_count=record.folded,
        )


def executors_document(
    percentiles: tuple[float, ...], futures: Iterable[FutureRecord]
) -> ExecutorsDocument:
    """``GET /executors``: every executor, busiest first."""
    labels = {f.id: f.label for f in futures}

    def label(future_id: int) -> str:
        return labels.get(future_id, f"future {future_id}")

    records = executor_registry()
    records.sort(key=lambda r: (-r.stats.submitted, r.id))
    return ExecutorsDocument(SCHEMA, [executor_entry(r, percentiles, label) for r in records])


def _site_entry(site: Site) -> NeverAwaitedEntry:
    created = site.created_at
    return NeverAwaitedEntry(
        function=site.function,
        location=Location(site.file, site.line),
        created_at=AwaitFrame(created[0], created[1], created[2]) if created else None,
        count=site.count,
    )


def never_awaited_entries() -> list[NeverAwaitedEntry]:
    """Functions whose coroutines were never awaited, most often first."""
    return [_site_entry(site) for site in never_awaited()]


def responsive_loops(monitor: LoopMonitor, now: int) -> Callable[[LoopRecord], bool]:
    """Whether a loop answers now: no blocked episode under way, its heartbeat not late."""

    def responsive(record: LoopRecord) -> bool:
        state = monitor.states.get(record.id)
        if state is None:
            return True
        return state.ongoing is None and state.lag_now(now) < monitor.threshold_ns // 2

    return responsive


class TaskReading:
    """The live tasks as read once: the walks of the first ``WALK_MOST`` of them in the list's
    order (tracked calls oldest first, then the others by loop and name), each with the tasks
    that await it, and how many live tasks there were in all."""

    __slots__ = ("consistent", "spent_ns", "total", "walks")

    def __init__(self, walks: list[TaskWalk], total: int, consistent: bool, spent_ns: int) -> None:
        self.walks = walks
        #: live tasks in all (``len(walks)`` of them were walked)
        self.total = total
        #: whether every loop was read on its own thread
        self.consistent = consistent
        #: what reading them took: the loops' time in the walks' slices and this thread's CPU
        self.spent_ns = spent_ns


def _list_key(task: Any, loop_id: int) -> tuple[bool, int, int, str]:
    """A task's place in the list, read without its frames (safe from any thread): tracked
    calls oldest first (by when the call was made), then the others by loop and name."""
    coro = task.get_coro()
    if type(coro) is InstrumentedCoroutine:
        return False, coro._r.created, loop_id, task.get_name()
    return True, 0, loop_id, task.get_name()


def read_tasks(
    responsive: Callable[[LoopRecord], bool],
    loops: Iterable[LoopRecord] | None = None,
    outside: bool = True,
    most: int = WALK_MOST,
) -> TaskReading:
    """Every live task on every watched loop (or on ``loops``) listed, and the first ``most``
    of them walked, each loop's on its own thread in slices (see
    :func:`~asyncflow.model.waits.walk_on_loop`). With ``outside`` False, a loop that does
    not answer is left out instead of read from this thread (the collector's watch: a
    deadlocked loop is idle, and answers)."""
    began = time.thread_time_ns()
    records = list(loop_registry() if loops is None else loops)
    keyed = [(_list_key(t, r.id), t, r) for r in records for t in loop_tasks(r)]
    total = len(keyed)
    chosen = keyed if total <= most else heapq.nsmallest(most, keyed, key=_first)
    by_loop: dict[int, list[Any]] = {}
    for _, task, record in chosen:
        by_loop.setdefault(record.id, []).append(task)
    del keyed, chosen
    spent = time.thread_time_ns() - began
    walks: list[TaskWalk] = []
    consistent = True
    for record in records:
        tasks = by_loop.get(record.id)
        if not tasks:
            continue
        found, on_its_thread, loop_ns = read_on_loop(
            record, TASK_WALK_TIMEOUT, responsive(record), outside, tasks=tasks
        )
        walks.extend(found)
        spent += loop_ns
        consistent = consistent and on_its_thread
    began = time.thread_time_ns()
    walks = task_tree(walks)
    spent += time.thread_time_ns() - began
    return TaskReading(walks, total, consistent, spent)


def _first(item: tuple[Any, ...]) -> Any:
    return item[0]


def task_walks(
    responsive: Callable[[LoopRecord], bool],
    loops: Iterable[LoopRecord] | None = None,
    outside: bool = True,
) -> tuple[list[TaskWalk], bool]:
    """The walks of :func:`read_tasks` (tracked calls oldest first, each with the tasks that
    await it), and whether every loop was read on its own thread."""
    reading = read_tasks(responsive, loops, outside)
    return reading.walks, reading.consistent


def task_tree(walks: list[TaskWalk]) -> list[TaskWalk]:
    """The walks of every loop's tasks, each with the tasks that await it and its parent,
    tracked calls oldest first."""
    # The task tree: who awaits each task (each waiting task names what it awaits), and who
    # made it (the live task whose chain holds the call its factory noted).
    awaiters: dict[str, list[str]] = {}
    by_call: dict[int, str] = {}
    for walk in walks:
        for name in walk.entry.awaits:
            awaiters.setdefault(name, []).append(walk.entry.name)
        for call in walk.entry.chain_calls:
            by_call[call] = walk.entry.name
    for walk in walks:
        theirs = awaiters.get(walk.entry.name)
        parent = by_call.get(walk.parent_call) if walk.parent_call else None
        if theirs or parent:
            walk.entry = replace(walk.entry, awaiters=sorted(theirs or ()), parent=parent)
    # Tracked calls oldest first, then the others by name: a stuck call is near the top.
    walks.sort(
        key=lambda w: (
            w.entry.age_ns is None,
            -(w.entry.age_ns or 0),
            w.entry.loop_id,
            w.entry.name,
        )
    )
    return walks


def tasks_document(
    offset: int,
    limit: int | None,
    responsive: Callable[[LoopRecord], bool],
    loops: Iterable[LoopRecord] | None = None,
    reading: TaskReading | None = None,
) -> TasksDocument:
    """``GET /tasks``: every live task on every watched loop, tracked calls oldest first; the
    summary of where they wait counts every task walked (all of them up to ``WALK_MOST``),
    the list is one page of them.

    Args:
        offset: tasks to skip.
        limit: most tasks to return; None for all.
        responsive: whether a loop answers now (a blocked loop is read from outside at once).
        loops: the loops to read; defaults to every watched loop.
        reading: the tasks as read already (a document built lately), instead of reading them.
    """
    if reading is None:
        reading = read_tasks(responsive, loops)
    walks = reading.walks
    page = walks[offset : None if limit is None else offset + limit]
    return TasksDocument(
        schema=SCHEMA,
        total=reading.total,
        consistent=reading.consistent,
        tasks=[w.entry for w in page],
        waits=summarise(walks),
        walked=len(walks),
    )
