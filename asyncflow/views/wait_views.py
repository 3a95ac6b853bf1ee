"""Pure functions from the wait recorders' state to documents: executors, tasks, never-awaited.

The companions of :mod:`asyncflow.views.documents` for what tasks wait on. Built on the
profiler's thread, in time proportional to what they return.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

from asyncflow import stats
from asyncflow.instrumentation.coroutines import Site, never_awaited
from asyncflow.instrumentation.executors import ExecutorRecord, JobFigures, executor_registry
from asyncflow.instrumentation.futures import FutureRecord
from asyncflow.instrumentation.loops import LoopRecord, loop_registry
from asyncflow.model.monitor import LoopMonitor
from asyncflow.model.waits import TaskWalk, summarise, walk_on_loop
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
    "executor_entry",
    "executors_document",
    "never_awaited_entries",
    "responsive_loops",
    "task_tree",
    "task_walks",
    "tasks_document",
]

#: How long a document waits for a responsive loop to read its own tasks, in seconds.
TASK_WALK_TIMEOUT = 0.25


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


def task_walks(
    responsive: Callable[[LoopRecord], bool],
    loops: Iterable[LoopRecord] | None = None,
    outside: bool = True,
) -> tuple[list[TaskWalk], bool]:
    """Every live task on every watched loop (or on ``loops``), tracked calls oldest first,
    each with the tasks that await it; and whether every loop was read on its own thread.
    With ``outside`` False, a loop that does not answer is left out instead of read from
    this thread (the collector's watch: a deadlocked loop is idle, and answers)."""
    walks: list[TaskWalk] = []
    consistent = True
    for record in loop_registry() if loops is None else loops:
        found, on_its_thread = walk_on_loop(record, TASK_WALK_TIMEOUT, responsive(record), outside)
        walks.extend(found)
        consistent = consistent and on_its_thread
    return task_tree(walks), consistent


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
) -> TasksDocument:
    """``GET /tasks``: every live task on every watched loop, oldest loop first; the summary of
    where they wait counts all of them, the list is one page.

    Args:
        offset: tasks to skip.
        limit: most tasks to return; None for all.
        responsive: whether a loop answers now (a blocked loop is read from outside at once).
        loops: the loops to read; defaults to every watched loop.
    """
    walks, consistent = task_walks(responsive, loops)
    page = walks[offset : None if limit is None else offset + limit]
    return TasksDocument(
        schema=SCHEMA,
        total=len(walks),
        consistent=consistent,
        tasks=[w.entry for w in page],
        waits=summarise(walks),
    )
