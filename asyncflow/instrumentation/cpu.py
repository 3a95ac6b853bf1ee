"""CPU time and allocations per poll (opt-in): a poll probe beside the busy time.

Busy time says how long a poll held the event loop; CPU time says how much of that the thread
spent computing. A poll that held the loop 40 ms on 2 ms of CPU was not computing: it was in a
blocking system call, waiting for the GIL another thread held, or taking page faults. Both are
opt-in, because each costs system calls on every poll:

- ``cpu=True`` (``ASYNCFLOW_CPU=1``, ``asyncflow run --cpu``): the polling thread's CPU clock
  (``time.thread_time_ns``, exact) is read before and after each poll: two system calls per
  poll. Where the platform gives a thread's user and system time apart (Linux:
  ``getrusage(RUSAGE_THREAD)``) it is read too, two more system calls, for the split: how much
  was the program's own code (user) and how much the kernel working for it (system: system
  calls, page faults). getrusage cannot replace the clock: for the running thread it is only
  brought up to date at the scheduler's tick or a context switch (a 500 µs poll reads 28 µs or
  2 ms), so per poll the split is coarse; summed over many polls it converges, and it need
  not add up to ``cpu_ns`` exactly. Elsewhere the split is null.
- ``allocations=True`` (``ASYNCFLOW_ALLOCATIONS=1``, ``--allocations``): ``tracemalloc``'s
  traced memory is read around each poll. It
  starts ``tracemalloc`` if the program has not (and stops it at the end only then), and
  ``tracemalloc`` slows every allocation of the whole program, profiled or not. Figures are
  net: the bytes a poll left allocated, growth and release summed apart. Memory allocated by
  another thread while a poll runs counts in that poll. The COUNT is net too: CPython has no
  counter of allocations made, only of blocks in use (``sys.getallocatedblocks()``, the small
  object allocator's blocks: objects up to 512 bytes; larger ones are in the bytes only), so
  ``allocated_blocks`` is the blocks a poll left in use (allocated minus freed during it; can
  be negative). It is opt-in on its own (``allocations="blocks"``), because each read walks
  every arena: measured in ``benchmarks/panel.py``, it adds about as much to a poll as
  tracemalloc itself (more with a large heap).

The probe runs outside the timed part of a poll (see ``asyncflow.instrumentation.probes``); polls
nest, so the figures are inclusive, like busy time. The figures live on the call's record
(``probe_data``) and, summed per future, here; the views read them through :func:`call_figures`
and :func:`future_figures`.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from asyncflow.instrumentation import _session, probes

__all__ = [
    "CallFigures",
    "Composite",
    "FutureFigures",
    "PollFigures",
    "attach",
    "call_figures",
    "detach",
    "future_figures",
]


class CallFigures:
    """One call's CPU time and allocations so far (its record's ``probe_data``)."""

    __slots__ = (
        "alloc_bytes",
        "allocations",
        "blocks",
        "cpu",
        "cpu_ns",
        "freed_bytes",
        "future",
        "max_cpu_ns",
        "owner",
        "system_ns",
        "user_ns",
    )

    def __init__(self, owner: PollFigures, future: FutureFigures) -> None:
        #: the probe that measured it (a call that outlives its profiler is measured afresh
        #: by the next one), and its future's sums there
        self.owner = owner
        self.future = future
        #: which figures were measured (the others stay 0 and mean nothing)
        self.cpu = owner.cpu
        self.allocations = owner.allocations
        self.cpu_ns = 0
        #: user and system parts of cpu_ns (meaningful when the owner's ``split``)
        self.user_ns = 0
        self.system_ns = 0
        #: the CPU time of the call's longest poll (by busy time)
        self.max_cpu_ns = 0
        self.alloc_bytes = 0
        self.freed_bytes = 0
        #: net small-object blocks its polls left in use (allocated minus freed)
        self.blocks = 0


class FutureFigures:
    """A future's CPU time and allocations, summed over every measured poll of its calls."""

    __slots__ = (
        "alloc_bytes",
        "blocks",
        "cpu_ns",
        "freed_bytes",
        "max_alloc_bytes",
        "max_cpu_ns",
        "measured_busy_ns",
        "polls",
        "system_ns",
        "user_ns",
        "worst_busy_ns",
        "worst_call_id",
        "worst_cpu_ns",
    )

    def __init__(self) -> None:
        #: polls measured, and their busy time (polls before the probe was set are not)
        self.polls = 0
        self.measured_busy_ns = 0
        self.cpu_ns = 0
        self.user_ns = 0
        self.system_ns = 0
        self.max_cpu_ns = 0
        #: the poll that held the loop longest off the CPU (busy minus CPU): its busy and CPU
        self.worst_busy_ns = 0
        self.worst_cpu_ns = 0
        self.worst_call_id = 0
        self.alloc_bytes = 0
        self.freed_bytes = 0
        self.max_alloc_bytes = 0
        self.blocks = 0


def thread_rusage() -> Callable[[], Any] | None:
    """A call giving the calling thread's user and system time apart, or None where the
    platform has none (``resource.RUSAGE_THREAD`` is Linux's)."""
    try:
        import resource

        who = resource.RUSAGE_THREAD
        resource.getrusage(who)
    except (ImportError, AttributeError, OSError, ValueError):
        return None
    return functools.partial(resource.getrusage, who)


def _us_ns(seconds: float) -> int:
    """A getrusage time difference (seconds, microsecond resolution) in nanoseconds."""
    return round(seconds * 1_000_000) * 1000


class PollFigures:
    """The poll probe: CPU time and/or allocations of every poll of every tracked call.

    Per-future sums are kept here, by future id; a future polled on two threads at once may
    lose an update to a race between them (each thread's own figures are exact).
    """

    def __init__(self, *, cpu: bool, allocations: bool, blocks: bool = False) -> None:
        self.cpu = cpu
        self.allocations = allocations or blocks
        self.futures: dict[int, FutureFigures] = {}
        #: whether this probe started tracemalloc (and so stops it)
        self.started_tracemalloc = False
        self._thread_time = time.thread_time_ns
        #: getrusage(RUSAGE_THREAD) where there is one: user and system time apart
        self._rusage = thread_rusage()
        self.split = self._rusage is not None
        self._traced = tracemalloc.get_traced_memory
        #: ``allocations="blocks"``: count the net blocks too (two arena walks per poll)
        self.count_blocks = blocks
        self._blocks = sys.getallocatedblocks
        if cpu and not allocations:  # the common case, without a branch it does not need
            split = self.split
            self.begin = self._begin_split if split else self._begin_cpu  # type: ignore[method-assign]
            self.end = self._end_split if split else self._end_cpu  # type: ignore[method-assign]

    def _call(self, record: Any) -> CallFigures:
        """The call's figures, made at its first measured poll."""
        call = getattr(record, "probe_data", None)
        if call is None or call.owner is not self:
            fid = record.future.id
            fut = self.futures.get(fid)
            if fut is None:
                fut = self.futures[fid] = FutureFigures()
            call = record.probe_data = CallFigures(self, fut)
        return call

    def _begin_cpu(self, record: Any) -> int:
        return self._thread_time()

    def _end_cpu(
        self, record: Any, token: int, t0_ns: int, dt_ns: int, outcome: str, cpu: int = -1
    ) -> None:
        if cpu < 0:
            cpu = self._thread_time() - token
        call = getattr(record, "probe_data", None)
        if call is None or call.owner is not self:
            call = self._call(record)
        fut = call.future
        call.cpu_ns += cpu
        fut.polls += 1
        fut.measured_busy_ns += dt_ns
        fut.cpu_ns += cpu
        if dt_ns >= record.max:
            call.max_cpu_ns = cpu
        if cpu > fut.max_cpu_ns:
            fut.max_cpu_ns = cpu
        if dt_ns - cpu > fut.worst_busy_ns - fut.worst_cpu_ns:
            fut.worst_busy_ns, fut.worst_cpu_ns = dt_ns, cpu
            fut.worst_call_id = record.call_id

    def _begin_split(self, record: Any) -> Any:
        return (self._rusage(), self._thread_time())  # type: ignore[misc]

    def _end_split(self, record: Any, token: Any, t0_ns: int, dt_ns: int, outcome: str) -> None:
        cpu = self._thread_time() - token[1]
        now, before = self._rusage(), token[0]  # type: ignore[misc]
        user = _us_ns(now.ru_utime - before.ru_utime)
        system = _us_ns(now.ru_stime - before.ru_stime)
        self._end_cpu(record, 0, t0_ns, dt_ns, outcome, cpu)
        call = record.probe_data
        call.user_ns += user
        call.system_ns += system
        call.future.user_ns += user
        call.future.system_ns += system

    def _cpu_now(self) -> Any:
        if self.split:
            return (self._rusage(), self._thread_time())  # type: ignore[misc]
        return self._thread_time()

    def begin(self, record: Any) -> Any:
        if self.allocations:  # the CPU clock read last, nearest the poll
            traced = self._traced()[0]
            blocks = self._blocks() if self.count_blocks else 0
            return (traced, blocks, self._cpu_now() if self.cpu else 0)
        return self._cpu_now()

    def end(self, record: Any, token: Any, t0_ns: int, dt_ns: int, outcome: str) -> None:
        cpu0 = token[2] if self.allocations else token
        user = system = cpu = 0
        if self.cpu:
            if self.split:
                cpu = self._thread_time() - cpu0[1]
                now = self._rusage()  # type: ignore[misc]
                user = _us_ns(now.ru_utime - cpu0[0].ru_utime)
                system = _us_ns(now.ru_stime - cpu0[0].ru_stime)
            else:
                cpu = self._thread_time() - cpu0
        grown = blocks = 0
        if self.allocations:
            if self.count_blocks:
                blocks = self._blocks() - token[1]
            grown = self._traced()[0] - token[0]
        call = self._call(record)
        fut = call.future
        fut.polls += 1
        fut.measured_busy_ns += dt_ns
        if self.cpu:
            call.cpu_ns += cpu
            fut.cpu_ns += cpu
            call.user_ns += user
            call.system_ns += system
            fut.user_ns += user
            fut.system_ns += system
            if dt_ns >= record.max:
                call.max_cpu_ns = cpu
            if cpu > fut.max_cpu_ns:
                fut.max_cpu_ns = cpu
            if dt_ns - cpu > fut.worst_busy_ns - fut.worst_cpu_ns:
                fut.worst_busy_ns, fut.worst_cpu_ns = dt_ns, cpu
                fut.worst_call_id = record.call_id
        if self.allocations:
            call.blocks += blocks
            fut.blocks += blocks
            if grown >= 0:
                call.alloc_bytes += grown
                fut.alloc_bytes += grown
                if grown > fut.max_alloc_bytes:
                    fut.max_alloc_bytes = grown
            else:
                call.freed_bytes -= grown
                fut.freed_bytes -= grown


class Composite:
    """Two probes where the seam takes one (the trace recorder's and this one): each gets its
    own begin and end; one that raises is dropped, counted and logged, and the other goes on."""

    __slots__ = ("inner", "outer")

    def __init__(self, outer: Any, inner: Any) -> None:
        #: the probe that was set first (it stays outermost: its begin first, its end last)
        self.outer: Any = outer
        self.inner: Any = inner

    def begin(self, record: Any) -> Any:
        outer, inner = self.outer, self.inner
        a = b = None
        if outer is not None:
            try:
                a = outer.begin(record)
            except Exception as exc:
                self.outer = None
                _session.internal_error("a poll probe (removed)", exc)
        if inner is not None:
            try:
                b = inner.begin(record)
            except Exception as exc:
                self.inner = None
                _session.internal_error("a poll probe (removed)", exc)
        return (outer, a, inner, b)

    def end(self, record: Any, token: Any, t0_ns: int, dt_ns: int, outcome: str) -> None:
        outer, a, inner, b = token
        if inner is not None and self.inner is inner:
            try:
                inner.end(record, b, t0_ns, dt_ns, outcome)
            except Exception as exc:
                self.inner = None
                _session.internal_error("a poll probe (removed)", exc)
        if outer is not None and self.outer is outer:
            try:
                outer.end(record, a, t0_ns, dt_ns, outcome)
            except Exception as exc:
                self.outer = None
                _session.internal_error("a poll probe (removed)", exc)


_lock = threading.Lock()


def attach(cpu: bool, allocations: bool | str) -> PollFigures | None:
    """Start measuring polls (the profiler's start, after the trace recorder's probe is set);
    returns the probe, or None when neither figure was asked for. ``allocations="blocks"``
    counts the net allocated blocks too."""
    if not (cpu or allocations):
        return None
    probe = PollFigures(cpu=cpu, allocations=bool(allocations), blocks=allocations == "blocks")
    with _lock:
        if allocations and not tracemalloc.is_tracing():
            tracemalloc.start()
            probe.started_tracemalloc = True
        previous = probes.set_poll_probe(probe)
        if previous is not None:  # the trace recorder's: both see every poll
            probes.set_poll_probe(Composite(previous, probe))
    return probe


def detach(probe: PollFigures | None) -> None:
    """Stop measuring (before the trace recorder takes its probe back); idempotent. The
    figures stay readable for the final snapshot."""
    if probe is None:
        return
    with _lock:
        current = probes.poll_probe()
        if current is probe:
            probes.set_poll_probe(None)
        elif isinstance(current, Composite) and current.inner is probe:
            probes.set_poll_probe(current.outer)  # put the trace recorder's back alone
        elif isinstance(current, Composite):
            current.inner = None if current.inner is probe else current.inner
        if probe.started_tracemalloc and tracemalloc.is_tracing():
            tracemalloc.stop()
            probe.started_tracemalloc = False


def call_figures(record: Any) -> CallFigures | None:
    """A call's figures, if its polls were measured."""
    data = getattr(record, "probe_data", None)
    return data if isinstance(data, CallFigures) else None


def future_figures(probe: PollFigures | None, future_id: int) -> FutureFigures | None:
    """A future's figures in a profile (``probe``: its collector's), if a poll was measured."""
    return probe.futures.get(future_id) if probe is not None else None
