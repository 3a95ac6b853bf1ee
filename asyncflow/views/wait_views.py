"""Pure functions from the wait recorders' state to documents: executors, tasks, never-awaited.

The companions of :mod:`asyncflow.views.documents` for what tasks wait on. Built on the
profiler's thread, in time proportional to what they return.
"""

from __future__ import annotations

import bisect
import heapq
import operator
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

import orjson

from asyncflow import clock, schema, stats
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
    TaskEntry,
    TasksDocument,
    WaitSummary,
    WaitTarget,
)
from asyncflow.views.paging import at_most

__all__ = [
    "READ_MOST_NS",
    "TASK_WALK_TIMEOUT",
    "WALK_MOST",
    "TaskReading",
    "executor_entry",
    "executors_document",
    "never_awaited_entries",
    "read_tasks",
    "responsive_loops",
    "task_tree",
    "tasks_document",
]

#: How long a document waits for a responsive loop to read its own tasks, in seconds (while
#: the walk's slices keep coming, it waits on).
TASK_WALK_TIMEOUT = 0.25
#: The longest one reading walks (from when it began to list the tasks): past it, the tasks
#: walked are the reading (``walked`` says how many), so that the first ``/tasks`` of 100,000
#: live tasks answers within a second.
READ_MOST_NS = 500_000_000
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
            max_running=st.max_running,
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
            limiter_id=record.limiter_id or None,
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
    """The live tasks as read once: the first ``WALK_MOST`` of them in the list's order
    (tracked calls oldest first, then the others by loop and name) walked, each with the tasks
    that await it and its parent, and how many live tasks there were in all.

    Each walked task is kept as its entry's JSON and a few plain values (what the task tree
    needs), made in the slice that walked it: a reading of 10,000 tasks holds no object per
    task for the garbage collector to count (its full collections, which the objects of a
    reading would bring on, stall a program with 20,000 tasks 0.2-0.6 s)."""

    __slots__ = ("alive", "consistent", "entries", "spent_ns", "total", "waits")

    def __init__(
        self,
        entries: list[bytes],
        waits: list[WaitSummary],
        total: int,
        consistent: bool,
        spent_ns: int,
        alive: dict[int, int] | None = None,
    ) -> None:
        #: each walked task's entry (``TaskEntry``) as JSON, in the list's order
        self.entries = entries
        #: the waiting tasks walked, counted by future, line and target
        self.waits = waits
        #: live tasks in all (``len(entries)`` of them were walked)
        self.total = total
        #: live tasks by loop (its record's id), as listed: a document of the same moment
        #: counts them from here instead of listing them again
        self.alive = alive or {}
        #: whether every loop was read on its own thread
        self.consistent = consistent
        #: what reading them took: the loops' time in the walks' slices and this thread's CPU
        self.spent_ns = spent_ns

    def task_entries(self, start: int = 0, end: int | None = None) -> list[TaskEntry]:
        """The entries from ``start`` to ``end``, as objects."""
        return [_task_entry(e) for e in self.entries[start:end]]

    def tasks_json(self, offset: int, limit: int | None) -> bytes:
        """``GET /tasks``'s page from ``offset`` as JSON (a ``TasksDocument``), made of the
        entries' JSON as it is."""
        page = self.entries[offset : None if limit is None else offset + limit]
        return b"".join(
            (
                b'{"schema":%d,"total":%d,"consistent":%s,"tasks":['
                % (SCHEMA, self.total, b"true" if self.consistent else b"false"),
                b",".join(page),
                b'],"waits":',
                schema.dumps(self.waits),
                b',"walked":%d}' % len(self.entries),
            )
        )


class _Kept:
    """What a reading keeps of the walks, as each is made (in the slice that walked it): its
    entry as JSON and a few plain values (numbers and strings, which the garbage collector
    does not track), in lists side by side; the task tree's maps and the summary of where the
    tasks wait, filled as they come. Walking a task thus leaves no object for the collector to
    count: the tuples kept before (two or three a task) brought on a collection every few
    hundred tasks, and in a reading of 10,000 the full collection of the program's heap that
    it was due (64-72 ms of its loop with 20,000 live tasks)."""

    def __init__(self) -> None:
        #: each walked task's age (-1: not a tracked call), loop, name, the call that made it
        #: (0: unknown) and its entry's JSON, in the order walked
        self.ages: list[int] = []
        self.loop_ids: list[int] = []
        self.names: list[str] = []
        self.parent_calls: list[int] = []
        self.entries: list[bytes] = []
        #: task name -> the names of the tasks that await it; call id -> the task it runs in
        self.awaiters: dict[str, list[str]] = {}
        self.by_call: dict[int, str] = {}
        self.counts: Counter[tuple[Any, ...]] = Counter()
        self.samples: dict[tuple[Any, ...], WaitSummary] = {}

    def keep(self, walk: TaskWalk) -> None:
        entry, where = walk.entry, walk.where
        if entry.state == "waiting":  # (as summarise counts them)
            key = (
                entry.future_id,
                entry.future_label or entry.coroutine,
                (where.file, where.line) if where is not None else None,
                walk.wait_key,
            )
            self.counts[key] += 1
            if key not in self.samples:
                self.samples[key] = summarise((walk,))[0]
        name = entry.name
        for awaited in entry.awaits:
            self.awaiters.setdefault(awaited, []).append(name)
        for call in entry.chain_calls:
            self.by_call[call] = name
        self.ages.append(-1 if entry.age_ns is None else entry.age_ns)
        self.loop_ids.append(entry.loop_id)
        self.names.append(name)
        self.parent_calls.append(walk.parent_call)
        self.entries.append(schema.dumps(entry))

    def summary(self) -> list[WaitSummary]:
        return [replace(self.samples[key], tasks=count) for key, count in self.counts.most_common()]

    def tree(self, loops: int) -> list[bytes]:
        """The entries in the list's order, each with the tasks that await it and its parent
        (as :func:`task_tree` gives them)."""
        order: Iterable[int] = range(len(self.entries))
        if loops > 1:  # each loop's walks are in order already: only the loops interleave
            ages, loop_ids, names = self.ages, self.loop_ids, self.names
            order = sorted(order, key=lambda i: (ages[i] < 0, -ages[i], loop_ids[i], names[i]))
        awaiters, by_call = self.awaiters, self.by_call
        entries = []
        for i in order:
            entry, name, parent_call = self.entries[i], self.names[i], self.parent_calls[i]
            theirs = awaiters.get(name)
            parent = by_call.get(parent_call) if parent_call else None
            if theirs or parent:
                fields = orjson.loads(entry)
                fields["awaiters"], fields["parent"] = sorted(theirs or ()), parent
                entry = orjson.dumps(fields)
            entries.append(entry)
        return entries


def _task_entry(data: bytes) -> TaskEntry:
    """A ``TaskEntry`` from its JSON, made directly (``schema.load`` checks every field's type:
    about 1 ms an entry, 10 s for a reading of 10,000)."""
    fields = orjson.loads(data)
    try:
        fields["chain"] = [AwaitFrame(**f) for f in fields["chain"]]
        fields["held_at"] = [AwaitFrame(**f) for f in fields["held_at"]]
        for name in ("where", "created_at"):
            if fields.get(name) is not None:
                fields[name] = AwaitFrame(**fields[name])
        if fields.get("waits_on") is not None:
            fields["waits_on"] = WaitTarget(**fields["waits_on"])
        return TaskEntry(**fields)
    except (TypeError, KeyError):  # a field this does not know of: the schema's own loader
        return schema.load(TaskEntry, orjson.loads(data))


#: the place of a task that is no tracked call, after every tracked one
_UNTRACKED = 1 << 62
_coro_of = operator.methodcaller("get_coro")


def _chosen(
    records: list[LoopRecord], most: int, alive: dict[int, int]
) -> tuple[int, dict[int, list[Any]]]:
    """How many live tasks the loops have (each loop's noted in ``alive``), and the first
    ``most`` of them in the list's order, by loop: tracked calls oldest first (by when the
    call was made), then the others by loop and name. Read without their frames (safe from
    any thread), and tracked calls without their names, which a task without one of its own
    is given when first asked: the first reading of 100,000 tasks spent 0.4 s ordering them
    by tuples of four."""
    tasks: list[Any] = []
    loop_of: list[int] = []
    created: list[int] = []
    for record in records:
        listed = loop_tasks(record)
        alive[record.id] = len(listed)
        tasks += listed
        loop_of += [record.id] * len(listed)
        created += [
            c._r.created if type(c) is InstrumentedCoroutine else _UNTRACKED
            for c in map(_coro_of, listed)
        ]
    total = len(tasks)
    # (one sort of numbers, in C: 100,000 in some 20 ms, where a heap of them took 0.2 s)
    chosen = sorted(range(total), key=created.__getitem__)[:most]
    tracked = bisect.bisect_left(chosen, _UNTRACKED, key=created.__getitem__)
    del chosen[tracked:]

    def by_name(i: int) -> tuple[int, str]:
        return loop_of[i], tasks[i].get_name()

    start = 0
    while start < len(chosen):  # calls made at one time (a coarse clock): by loop and name
        end = start + 1
        while end < len(chosen) and created[chosen[end]] == created[chosen[start]]:
            end += 1
        if end - start > 1:
            chosen[start:end] = sorted(chosen[start:end], key=by_name)
        start = end
    if len(chosen) < most and len(chosen) < total:
        others = [i for i in range(total) if created[i] == _UNTRACKED]
        chosen += heapq.nsmallest(most - len(chosen), others, key=by_name)
    by_loop: dict[int, list[Any]] = {}
    for i in chosen:
        by_loop.setdefault(loop_of[i], []).append(tasks[i])
    return total, by_loop


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
    deadline = clock.now_ns() + READ_MOST_NS
    records = list(loop_registry() if loops is None else loops)
    alive: dict[int, int] = {}
    total, by_loop = _chosen(records, most, alive)
    spent = time.thread_time_ns() - began
    kept = _Kept()
    consistent = True
    for record in records:
        mine = by_loop.get(record.id)
        if not mine:
            continue
        _, on_its_thread, loop_ns = read_on_loop(
            record,
            TASK_WALK_TIMEOUT,
            responsive(record),
            outside,
            tasks=mine,
            keep=kept.keep,
            deadline_ns=deadline,
        )
        spent += loop_ns
        consistent = consistent and on_its_thread
    began = time.thread_time_ns()
    entries = kept.tree(len(by_loop))
    waits = kept.summary()
    spent += time.thread_time_ns() - began
    return TaskReading(entries, waits, total, consistent, spent, alive)


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
    return TasksDocument(
        schema=SCHEMA,
        total=reading.total,
        consistent=reading.consistent,
        tasks=reading.task_entries(offset, None if limit is None else offset + limit),
        waits=reading.waits,
        walked=len(reading.entries),
    )
