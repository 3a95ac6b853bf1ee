"""Executors: jobs that ``run_in_executor``, ``asyncio.to_thread`` and anyio hand to threads.

:func:`instrument_executors` puts a ``run_in_executor`` of its own on the loop (an instance
attribute: the loop keeps its class). Each job of a thread pool is wrapped in a :class:`_Job`
that reads the clock when a worker thread picks it up and when it ends: the time it was
*queued* (submitted, no thread free) and the time it *ran*. Jobs are counted by the function run
(``to_thread``'s function, not the ``Context.run`` that carries it) and by the tracked future
that submitted them. Only a pool known to run each job as it is given, on a thread of this
process, has its jobs wrapped: the stdlib's ThreadPoolExecutor, or a subclass that submits as it
does (see :func:`_runs_jobs_here`). Any other executor (a process pool, another library's pool
such as loky's, which pickles each job) receives exactly what the program gave: its jobs are
counted, and timed from submission to completion. Arguments asyncio itself refuses at the call
(a coroutine, a coroutine function, something not callable) reach it untouched. anyio's
``to_thread.run_sync`` runs jobs on anyio's own worker threads behind a capacity limiter: each
limiter is an executor, whose jobs are queued while they wait for a token.

A record watches its executor (or the loop, for a loop's default executor) weakly. Once that is
freed and its last job has ended, the record leaves the registry for the bounded history of
gone executors (see ``_gone``): memory follows the executors alive, and every total stays exact.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import inspect
import itertools
import sys
import threading
import weakref
from collections.abc import Callable, Sized
from types import ModuleType
from typing import Any

from asyncflow import _forksafe, stats
from asyncflow import clock as _clock
from asyncflow.instrumentation import _imports, _session
from asyncflow.instrumentation._gone import AGGREGATES_KEPT, GONE_KEPT, Fold, GoneHistory, Watch
from asyncflow.instrumentation.channels import caller

__all__ = [
    "AGGREGATES_KEPT",
    "GONE_KEPT",
    "MAX_FUNCTIONS",
    "ExecutorInstrumentation",
    "ExecutorRecord",
    "ExecutorStats",
    "anyio_trio_patches",
    "executor_registry",
    "function_name",
    "instrument_executors",
    "reap",
    "trio_patches",
]

#: Functions counted separately per executor; the rest are counted together. An aggregate of
#: gone executors keeps as many submitting futures too (their jobs stay in its totals).
MAX_FUNCTIONS = 100
_OTHER = "(other functions)"


class JobFigures:
    """Jobs of one function, or of one submitting future, on one executor."""

    __slots__ = ("jobs", "max_queued_ns", "max_run_ns", "queued_ns", "raised", "run_ns")

    def __init__(self) -> None:
        self.jobs = 0
        self.raised = 0
        self.queued_ns = 0
        self.max_queued_ns = 0
        self.run_ns = 0
        self.max_run_ns = 0

    def add(self, queued: int, ran: int, raised: bool) -> None:
        self.jobs += 1
        self.raised += raised
        self.queued_ns += queued
        self.run_ns += ran
        if queued > self.max_queued_ns:
            self.max_queued_ns = queued
        if ran > self.max_run_ns:
            self.max_run_ns = ran

    def merge(self, other: JobFigures) -> None:
        """Add another's jobs (a gone executor's, into an aggregate)."""
        _JOBS_FOLD(self, other)


#: how a gone executor's jobs of one function add into its aggregate's (every other int field
#: is summed)
_JOBS_FOLD = Fold(JobFigures, maximum=("max_queued_ns", "max_run_ns"))


class ExecutorStats:
    """One session's figures for one executor. Counts are exact; every job is timed."""

    __slots__ = (
        "by_function",
        "by_future",
        "cancelled",
        "completed",
        "max_queued_ns",
        "max_run_ns",
        "max_running",
        "queued_hist",
        "queued_ns",
        "raised",
        "run_hist",
        "run_ns",
        "running",
        "started",
        "submitted",
    )

    def __init__(self) -> None:
        self.submitted = 0
        self.started = 0
        self.running = 0
        #: the most jobs running at once: all its workers busy, or not (a pool never busy at
        #: once is not saturated, however long a job waited to be handed to a thread)
        self.max_running = 0
        self.completed = 0
        self.raised = 0
        self.cancelled = 0  # cancelled before a worker picked them up: they never ran
        self.queued_ns = 0
        self.max_queued_ns = 0
        self.run_ns = 0
        self.max_run_ns = 0
        self.queued_hist = stats.new_histogram()
        self.run_hist = stats.new_histogram()
        self.by_function: dict[str, JobFigures] = {}
        #: future id -> figures of the jobs its calls submitted
        self.by_future: dict[int, JobFigures] = {}

    @property
    def queued(self) -> int:
        """Jobs waiting for a worker thread now."""
        return max(0, self.submitted - self.started - self.cancelled)


#: how a gone executor's figures add into its aggregate (every other int field is summed)
_FOLD = Fold(
    ExecutorStats,
    maximum=("max_queued_ns", "max_run_ns", "max_running"),
    histogram=("queued_hist", "run_hist"),
    left=("by_future", "by_function", "running"),  # none runs on a gone one; _merge adds jobs
)


class ExecutorRecord:
    """An executor jobs were submitted to: identity, label, and the session's figures."""

    __slots__ = (
        "__weakref__",
        "_owner",
        "folded",
        "id",
        "kind",
        "label",
        "limiter_id",
        "lock",
        "max_workers",
        "stats",
    )

    def __init__(self, label: str, kind: str) -> None:
        self.id = next(_ids)
        self.label = label
        #: ``thread`` or ``process``
        self.kind = kind
        # The executor, or for a loop's default executor the loop (which makes it lazily).
        # Weak: observing must not keep either (or their threads) alive. When it dies, the
        # record is queued to be reaped. None for an aggregate of gone executors.
        self._owner: Watch | None = None
        #: gone executors whose figures are summed here (an aggregate); 0 for a real one
        self.folded = 0
        #: the most workers it may start, as last seen (kept once the executor is gone)
        self.max_workers: int | None = None
        #: for anyio's or trio's threads behind a capacity limiter: the limiter's resource id,
        #: when it has a record (its waits are this pool's queue); 0: it has none; None: not
        #: looked up yet
        self.limiter_id: int | None = None
        #: jobs end on worker threads: their figures are folded under this lock (cold enough)
        self.lock = _forksafe.lock(self)
        self.stats = ExecutorStats()

    @property
    def alive(self) -> bool:
        """Whether the executor (or the loop whose default executor it is) still exists (never,
        for an aggregate)."""
        owner = self._owner
        return owner is not None and owner() is not None

    def executor(self) -> Any:
        """The executor object now, if it exists."""
        owner = self._owner() if self._owner is not None else None
        if isinstance(owner, asyncio.AbstractEventLoop):
            return getattr(owner, "_default_executor", None)
        return owner

    def workers(self) -> tuple[int | None, int]:
        """(most worker threads or processes it may start, those it has started now)."""
        executor = self.executor()
        if executor is None:
            return self.max_workers, 0
        tokens = getattr(executor, "total_tokens", None)
        if tokens is not None:  # an anyio CapacityLimiter in front of anyio's worker threads
            self.max_workers = int(tokens) if tokens != float("inf") else None
            return self.max_workers, int(getattr(executor, "borrowed_tokens", 0))
        most = getattr(executor, "_max_workers", None)
        self.max_workers = most if isinstance(most, int) else None
        started = getattr(executor, "_threads", None) or getattr(executor, "_processes", None)
        # (read by name from any executor: another library's attribute may be no collection)
        return self.max_workers, len(started) if isinstance(started, Sized) else 0

    def start(self, job: _Job | None = None) -> None:
        with self.lock:
            if job is not None and job.written_off:  # it ran after all: not cancelled
                job.written_off = False
                self.stats.cancelled -= 1
            st = self.stats
            st.started += 1
            st.running = running = st.running + 1
            if running > st.max_running:
                st.max_running = running

    def end(
        self, function: str, future_id: int | None, queued: int, ran: int, raised: bool
    ) -> None:
        """A job ended after waiting ``queued`` ns for a thread and running ``ran`` ns."""
        with self.lock:
            st = self.stats
            st.running = max(0, st.running - 1)
            st.completed += 1
            st.raised += raised
            st.queued_ns += queued
            st.run_ns += ran
            st.max_queued_ns = max(st.max_queued_ns, queued)
            st.max_run_ns = max(st.max_run_ns, ran)
            stats.record(st.queued_hist, queued)
            stats.record(st.run_hist, ran)
            figures = st.by_function.get(function)
            if figures is None:
                if len(st.by_function) >= MAX_FUNCTIONS:
                    function = _OTHER
                figures = st.by_function.setdefault(function, JobFigures())
            figures.add(queued, ran, raised)
            if future_id is not None:
                st.by_future.setdefault(future_id, JobFigures()).add(queued, ran, raised)

    def never_started(self, job: _Job) -> None:
        """asyncio cancelled the job's future before the job started. Its pool may have given
        it to a worker already (too late to cancel it there): then it runs, and its start,
        under the same lock, takes the cancellation back."""
        with self.lock:
            if job.started:
                return
            job.written_off = True
            self.stats.cancelled += 1

    def refused(self) -> None:
        """A job counted as submitted was refused (the pool was shut down): it never was."""
        with self.lock:
            self.stats.submitted -= 1


_ids = itertools.count(1)
_lock = threading.Lock()
#: executors seen and not reaped yet, by id, oldest first
_registry: dict[int, ExecutorRecord] = {}
#: id of the executor (or loop) -> its record. Keyed by id, not by the object, which must not
#: be kept; the owner's weak reference removes the entry when it dies, before the id can be
#: reused (see ``_gone.GoneHistory.watch``).
_by_owner: dict[int, ExecutorRecord] = {}
#: Gone executors: the last GONE_KEPT as they were, older ones folded into one aggregate per
#: (label, kind), at most AGGREGATES_KEPT (then one "(other gone executors)" per kind).
OTHER_GONE = "(other gone executors)"


def _record_of(owner: Any, label: str) -> ExecutorRecord:
    key = id(owner)
    record = _by_owner.get(key)  # the caller holds ``owner``: its entry cannot go meanwhile
    if record is None:
        with _lock:
            record = _by_owner.get(key)
            if record is None:
                process = isinstance(owner, concurrent.futures.ProcessPoolExecutor)
                record = _by_owner[key] = ExecutorRecord(label, "process" if process else "thread")
                record._owner = _history.watch(record, owner, key)
                _registry[record.id] = record
    return record


def executor_registry() -> list[ExecutorRecord]:
    """Every executor of the session (a copy): live ones oldest first, then the last gone
    ones, then the aggregates of older gone ones."""
    return _history.listing()


def reap(*, collecting: bool = False) -> int:
    """Move the executors that are gone, and whose jobs have all ended, out of the registry,
    into the bounded history of gone executors (see ``_gone.GoneHistory.reap``); returns how
    many moved."""
    return _history.reap(collecting)


def reset_for_session() -> None:
    """Fresh figures for every executor still alive; the gone ones are forgotten."""
    with _lock:
        _history.forget(_fresh_stats)


def _fresh_stats(record: ExecutorRecord) -> None:
    record.stats = ExecutorStats()


def _final(record: ExecutorRecord) -> bool:
    """Whether every job of a gone executor has ended (a thread pool's workers run the jobs
    queued before it was freed; a process job ends in a callback on the loop)."""
    st = record.stats
    return not st.running and not st.queued


def _kind(record: ExecutorRecord) -> str:
    return record.kind


def _aggregate(record: ExecutorRecord, label: str) -> ExecutorRecord:
    return ExecutorRecord(label, record.kind)


def _merge(agg: ExecutorRecord, record: ExecutorRecord) -> None:
    """Add a gone executor's figures to its aggregate (under _lock; and the aggregate's own,
    which readers take to read one consistent state)."""
    with agg.lock:
        if record.max_workers is not None:
            agg.max_workers = max(agg.max_workers or 0, record.max_workers)
        a, s = agg.stats, record.stats
        _FOLD(a, s)
        for function, figures in s.by_function.items():
            into = a.by_function.get(function)
            if into is None:
                if len(a.by_function) >= MAX_FUNCTIONS:
                    function = _OTHER
                into = a.by_function.setdefault(function, JobFigures())
            into.merge(figures)
        for future_id, figures in s.by_future.items():
            into = a.by_future.get(future_id)
            if into is None and len(a.by_future) < MAX_FUNCTIONS:
                into = a.by_future[future_id] = JobFigures()
            if into is not None:
                into.merge(figures)


_history: GoneHistory[ExecutorRecord] = GoneHistory(
    _lock,
    _registry,
    other=OTHER_GONE,
    kind=_kind,
    aggregate=_aggregate,
    merge=_merge,
    final=_final,
    index=_by_owner,
)


def function_name(fn: Any) -> str:
    """The qualified name of what a job runs, through ``partial`` and ``Context.run``."""
    for _ in range(8):
        if isinstance(fn, functools.partial):
            inner = fn.func
            # to_thread submits partial(Context.run, func, *args): the job is func
            if getattr(inner, "__self__", None).__class__ is contextvars.Context and fn.args:
                fn = fn.args[0]
            else:
                fn = inner
            continue
        break
    name = getattr(fn, "__qualname__", None) or getattr(type(fn), "__qualname__", "?")
    module = getattr(fn, "__module__", None)
    return f"{module}.{name}" if module and module != "builtins" else str(name)


class _Job:
    """What a worker thread runs in place of the submitted function: it times the job."""

    __slots__ = ("fn", "function", "future_id", "record", "started", "submitted", "written_off")

    def __init__(
        self, record: ExecutorRecord, fn: Callable[..., Any], future_id: int | None
    ) -> None:
        self.record = record
        self.fn = fn
        self.function = function_name(fn)
        self.future_id = future_id
        self.submitted = _clock.now_ns()
        self.started = 0
        #: counted as cancelled before it started (see ExecutorRecord.never_started)
        self.written_off = False

    @property
    def __name__(self) -> Any:  # what trio names a worker thread after
        return getattr(self.fn, "__name__", None)

    def __call__(self, *args: Any) -> Any:
        record = self.record
        self.started = t0 = _clock.now_ns()
        record.start(self)
        raised = True
        try:
            result = self.fn(*args)
            raised = False
            return result
        finally:
            try:
                record.end(
                    self.function, self.future_id, t0 - self.submitted, _clock.now_ns() - t0, raised
                )
            except Exception as err:  # observing never breaks the program
                _session.internal_error("recording an executor job", err)


def _default_label(loop: asyncio.AbstractEventLoop) -> str:
    return f"default executor ({type(loop).__qualname__} 0x{id(loop):x})"


def _label(executor: concurrent.futures.Executor) -> str:
    prefix = getattr(executor, "_thread_name_prefix", "") or ""
    name = type(executor).__qualname__
    return f"{name} {prefix}".strip() if prefix and not prefix.startswith(name) else name


#: The methods of ThreadPoolExecutor that decide what becomes of a job: a subclass that
#: overrides one may do anything with it (3.14's InterpreterPoolExecutor, a ThreadPoolExecutor,
#: pickles each job through ``prepare_context``).
_JOB_PATH = tuple(
    name
    for name in ("submit", "prepare_context")
    if hasattr(concurrent.futures.ThreadPoolExecutor, name)
)


def _runs_jobs_here(executor: object) -> bool:
    """Whether the executor is known to run each job, as it was given, on a thread of this
    process: the stdlib's ThreadPoolExecutor, or a subclass that overrides none of the methods
    that handle a job (one that only names its threads, say). None stands for a loop's default
    executor not made yet: asyncio makes a ThreadPoolExecutor (and ``set_default_executor``
    takes nothing else, from 3.11; uvloop, whose default executor cannot be read, is taken at
    that word). Anything else (a process pool, another library's pool) is timed from outside,
    since a job wrapped for timing may no longer pickle or be understood."""
    if executor is None:
        return True
    base = concurrent.futures.ThreadPoolExecutor
    if not isinstance(executor, base):
        return False
    for cls in type(executor).__mro__:  # the classes before the stdlib's, in lookup order
        if cls is base:
            return True
        if any(name in vars(cls) for name in _JOB_PATH):
            return False
    return False


#: asyncio's test of a coroutine function (3.12 and later name it ``_iscoroutinefunction``)
_iscoroutinefunction: Callable[[Any], bool] = getattr(
    asyncio.coroutines, "_iscoroutinefunction", inspect.iscoroutinefunction
)


def _refused_by_asyncio(func: object) -> bool:
    """Whether asyncio refuses ``func`` at the call (``BaseEventLoop._check_callback``, in debug
    mode; uvloop, always): a coroutine, a coroutine function, or something not callable. Such a
    job is handed on untouched, so that the ``TypeError`` is asyncio's own, raised at the call
    (a wrapper would be callable, and a coroutine function's job would "succeed")."""
    return not callable(func) or asyncio.iscoroutine(func) or _iscoroutinefunction(func)


class _RunInExecutor:
    """The loop's ``run_in_executor`` while executors are instrumented."""

    __slots__ = ("__weakref__", "enabled", "loop", "original")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Weak, and the class's function rather than a bound method: the loop holds this in
        # its __dict__, and must not be kept alive by it.
        self.loop = weakref.ref(loop)
        self.original = type(loop).run_in_executor
        self.enabled = True

    def __call__(
        self, executor: concurrent.futures.Executor | None, func: Callable[..., Any], *args: Any
    ) -> asyncio.Future[Any]:
        loop = self.loop()
        if loop is None:
            raise RuntimeError("run_in_executor() of an event loop that no longer exists")
        original = self.original
        if not self.enabled or _session.active is None or _refused_by_asyncio(func):
            return original(loop, executor, func, *args)
        try:
            if executor is None:
                record = _record_of(loop, _default_label(loop))
                here = _runs_jobs_here(getattr(loop, "_default_executor", None))
            else:
                record = _record_of(executor, _label(executor))
                here = _runs_jobs_here(executor)
            if record.max_workers is None:
                record.workers()  # note its size while it exists
            _, future_id = caller()
            with record.lock:
                record.stats.submitted += 1
            if here:
                job: Any = _Job(record, func, future_id)
                submitted = job
            else:  # the executor gets the job as it is (it may pickle it): timed from outside
                job = None
                submitted = func
        except Exception as err:  # observing never breaks the program
            _session.internal_error("instrumenting an executor job", err)
            return original(loop, executor, func, *args)
        try:
            future = original(loop, executor, submitted, *args)
        except BaseException:
            # Counted as queued for good otherwise: a gone executor waits for its queued jobs
            # to end before it is reaped.
            record.refused()
            raise
        if job is not None:
            future.add_done_callback(functools.partial(_check_started, job))
        else:
            record.start()
            future.add_done_callback(_untimed_end(record, func, future_id))
        return future


def _check_started(job: _Job, future: asyncio.Future[Any]) -> None:
    if future.cancelled():
        job.record.never_started(job)


def _untimed_end(
    record: ExecutorRecord, func: Any, future_id: int | None
) -> Callable[[asyncio.Future[Any]], None]:
    submitted = _clock.now_ns()
    function = function_name(func)

    def end(future: asyncio.Future[Any]) -> None:
        raised = future.cancelled() or future.exception() is not None
        record.end(function, future_id, 0, _clock.now_ns() - submitted, raised)

    return end


#: reentrant: a hook asked for after an import that just happened runs at once, in the call
_anyio_lock = threading.RLock()
_anyio_users = 0
_anyio_original: Any = None
#: cancels the hook waiting for anyio's backend to be imported
_anyio_pending: Callable[[], None] | None = None


def _limited(limiter: Any, threads: str = "anyio worker threads") -> str:
    """``anyio worker threads (a limiter of 4)``: the jobs behind a limiter of the program's
    own (not its repr, an address)."""
    tokens = getattr(limiter, "total_tokens", None)
    if isinstance(tokens, int | float) and tokens != float("inf"):
        return f"{threads} (a limiter of {int(tokens)})"
    return f"{threads} (a limiter)"


def _submitted(limiter: Any, label: str, func: Callable[..., Any]) -> _Job:
    """A job for ``func``, submitted now to the worker threads behind ``limiter``."""
    record = _record_of(limiter, label)
    if record.limiter_id is None:  # (its waits are this pool's queue)
        from asyncflow.instrumentation.resources import resource_of

        found = resource_of(limiter)
        record.limiter_id = found.id if found is not None else 0  # (0: looked, none)
    record.workers()  # note its size while it exists
    _, future_id = caller()
    job = _Job(record, func, future_id)
    with record.lock:
        record.stats.submitted += 1
    return job


def _limiter_argument(rest: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The ``limiter`` of anyio's ``run_sync_in_worker_thread(func, args, abandon_on_cancel,
    limiter)``, given by name or in its place."""
    return kwargs.get("limiter") or (rest[1] if len(rest) > 1 else None)


def _anyio_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    """anyio's ``to_thread.run_sync``, on either backend: its worker threads, behind a capacity
    limiter (40 tokens by default). A job is queued while it waits for a token. On trio, the
    job it hands to trio's ``to_thread.run_sync`` is counted here only (see _counted_already)."""

    async def run_sync_in_worker_thread(
        cls: Any, func: Callable[..., Any], args: Any, *rest: Any, **kwargs: Any
    ) -> Any:
        if _session.active is None:
            return await original(cls, func, args, *rest, **kwargs)
        try:
            limiter = _limiter_argument(rest, kwargs)
            default = limiter is None
            if default:  # (on trio, it wraps trio's default: one pool, whoever submits to it)
                limiter = cls.current_default_thread_limiter()
                limiter = getattr(limiter, "_CapacityLimiter__original", None) or limiter
            label = "anyio worker threads" if default else _limited(limiter)
            job = _submitted(limiter, label, func)
        except Exception as err:  # observing never breaks the program
            _session.internal_error("instrumenting an anyio worker thread job", err)
            return await original(cls, func, args, *rest, **kwargs)
        try:
            return await original(cls, job, args, *rest, **kwargs)
        finally:
            if not job.started:  # cancelled while it waited for a token: it never ran
                job.record.never_started(job)

    return run_sync_in_worker_thread


def _counted_already(fn: Any) -> bool:
    """Whether ``fn`` is the closure anyio's trio backend hands to trio's ``to_thread.run_sync``
    around a job that anyio's hook counted (by the function the program gave)."""
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            if type(cell.cell_contents) is _Job:
                return True
        except ValueError:  # an empty cell
            continue
    return False


def _trio_hook(original: Callable[..., Any], to_thread: ModuleType) -> Callable[..., Any]:
    """trio's ``to_thread.run_sync``: trio's worker threads, behind a capacity limiter (trio's
    default one of 40 tokens unless one is given). A job is queued while it waits for a token
    and a thread."""

    @functools.wraps(original)
    async def run_sync(sync_fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if (
            _session.active is None
            or not callable(sync_fn)
            or _is_async(sync_fn)  # (trio's own error, as ever)
            or _counted_already(sync_fn)
        ):
            return await original(sync_fn, *args, **kwargs)
        try:
            limiter = kwargs.get("limiter")
            if limiter is None:
                label, limiter = "trio worker threads", to_thread.current_default_thread_limiter()
            else:
                label = _limited(limiter, "trio worker threads")
            job = _submitted(limiter, label, sync_fn)
        except Exception as err:  # observing never breaks the program
            _session.internal_error("instrumenting a trio worker thread job", err)
            return await original(sync_fn, *args, **kwargs)
        try:
            return await original(job, *args, **kwargs)
        finally:
            if not job.started:  # cancelled while it waited for a token: it never ran
                job.record.never_started(job)

    return run_sync


def _is_async(fn: Any) -> bool:
    """A coroutine function (or a partial of one), which trio refuses in a thread."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return inspect.iscoroutinefunction(fn)


def trio_patches(trio: ModuleType) -> list[tuple[Any, str, Any]]:
    """What times the jobs of trio's worker threads: ``trio.to_thread.run_sync`` (the program
    imported trio; anyio's trio backend, imported after, takes it from there too). Returns
    (owner, name, value) triples to set; none when this trio has another layout."""
    to_thread = getattr(trio, "to_thread", None)
    original = getattr(to_thread, "run_sync", None)
    if to_thread is None or not inspect.iscoroutinefunction(original):
        return []
    if not callable(getattr(to_thread, "current_default_thread_limiter", None)):
        return []
    return [(to_thread, "run_sync", _trio_hook(original, to_thread))]


def anyio_trio_patches(backend: ModuleType) -> list[tuple[Any, str, Any]]:
    """What times the jobs of anyio's ``to_thread.run_sync`` on its trio backend, by the
    function the program gave (not the wrapper anyio hands trio) and behind its limiter."""
    cls = getattr(backend, "TrioBackend", None)
    original = vars(cls).get("run_sync_in_worker_thread") if cls is not None else None
    if not isinstance(original, classmethod):
        return []
    return [(cls, "run_sync_in_worker_thread", classmethod(_anyio_hook(original.__func__)))]


#: anyio's asyncio backend. asyncflow never imports it: an import on the program's running loop
#: blocks it (100 ms and more on a loaded machine). It is hooked once the program has loaded it.
_ANYIO_BACKEND = "anyio._backends._asyncio"


def _anyio_backend() -> Any:
    module = sys.modules.get(_ANYIO_BACKEND)
    backend = getattr(module, "AsyncIOBackend", None)  # (None while the module is loading)
    if backend is None or "run_sync_in_worker_thread" not in vars(backend):
        return None  # not loaded (yet), or another anyio layout: its threads are not followed
    return backend


def _sync_anyio_hook() -> None:
    """Install the hook while it has users, remove it with the last (under _anyio_lock).

    Until the program loads anyio's backend, a hook waits for its import instead."""
    global _anyio_original, _anyio_pending
    backend = _anyio_backend()
    if backend is None:
        if _anyio_users > 0 and _anyio_pending is None and _ANYIO_BACKEND not in sys.modules:
            _anyio_pending = _imports.after_import(_ANYIO_BACKEND, _anyio_loaded)
        elif _anyio_users == 0 and _anyio_pending is not None:
            _anyio_pending()
            _anyio_pending = None
        return
    if _anyio_pending is not None:
        _anyio_pending()
        _anyio_pending = None
    if _anyio_users > 0 and _anyio_original is None:
        _anyio_original = vars(backend)["run_sync_in_worker_thread"]
        backend.run_sync_in_worker_thread = classmethod(_anyio_hook(_anyio_original.__func__))
    elif _anyio_users == 0 and _anyio_original is not None:
        backend.run_sync_in_worker_thread = _anyio_original
        _anyio_original = None


def _anyio_loaded(module: object) -> None:
    """The program loaded anyio's backend: install the hook if it is still wanted."""
    global _anyio_pending
    with _anyio_lock:
        _anyio_pending = None
        _sync_anyio_hook()


def _use_anyio(delta: int) -> None:
    """Count users of the anyio hook: installed by the first, removed with the last."""
    global _anyio_users
    with _anyio_lock:
        _anyio_users += delta
        _sync_anyio_hook()


def _hook_of(loop: asyncio.AbstractEventLoop) -> _RunInExecutor | None:
    """The hook on the loop, if any. Read as an attribute, never through ``vars(loop)``: on
    3.11 reading the instance dict turns the loop's inline attribute values into a dict, and
    then no method call on the loop in asyncio's Python code is specialized (about 10,000
    instructions more an aiohttp request, measured with callgrind)."""
    current = getattr(loop, "run_in_executor", None)
    return current if isinstance(current, _RunInExecutor) else None


class ExecutorInstrumentation:
    """Handle returned by :func:`instrument_executors`; ``undo()`` (or leaving ``with``)
    gives the loop its own ``run_in_executor`` back."""

    __slots__ = ("_hook", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, hook: _RunInExecutor | None) -> None:
        self._loop = weakref.ref(loop)
        self._hook = hook

    @property
    def active(self) -> bool:
        """Whether jobs submitted on the loop now are recorded through this handle."""
        return self._hook is not None and self._hook.enabled

    def undo(self) -> None:
        """Stop recording jobs; idempotent."""
        hook, self._hook = self._hook, None
        if hook is None or not hook.enabled:
            return
        hook.enabled = False
        _use_anyio(-1)
        loop = self._loop()
        if loop is not None and _hook_of(loop) is hook:
            del loop.run_in_executor  # the class's method shows through again

    def __enter__(self) -> ExecutorInstrumentation:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.undo()


def instrument_executors(loop: asyncio.AbstractEventLoop | None = None) -> ExecutorInstrumentation:
    """Record every job submitted through ``loop.run_in_executor`` (``asyncio.to_thread`` too).

    Args:
        loop: the event loop; defaults to the running loop.

    Returns:
        A handle whose ``undo()`` stops recording.

    Raises:
        RuntimeError: no loop was given and none is running, or the loop is closed.
        TypeError: ``loop`` is not an event loop.
    """
    if loop is None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                "asyncflow.instrument_executors() was called with no running event loop; call "
                "it from inside a coroutine, or pass loop="
            ) from None
    elif not isinstance(loop, asyncio.AbstractEventLoop):
        raise TypeError(
            f"asyncflow.instrument_executors(loop=...) needs an event loop, got {loop!r}"
        )
    if loop.is_closed():
        raise RuntimeError(
            f"asyncflow.instrument_executors(loop=...) was given a closed event loop: {loop!r}"
        )
    current = _hook_of(loop)
    if current is not None and current.enabled:
        return ExecutorInstrumentation(loop, None)  # already: a second handle counts nothing
    hook = _RunInExecutor(loop)
    loop.run_in_executor = hook  # type: ignore[method-assign, assignment]
    _use_anyio(+1)
    return ExecutorInstrumentation(loop, hook)
