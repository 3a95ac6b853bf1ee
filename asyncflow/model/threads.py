"""Every thread of the process, sampled on the collector's tick: state, CPU time and CPU share.

This is the cold path: nothing here runs on the program's threads. The collector calls
:meth:`ThreadSampler.tick` every drain; it samples at most every ``THREAD_INTERVAL_NS``, and a
document asks for a fresher sample when the last one is older than ``FRESH_NS``.

Where the figures come from:

- **Linux**: ``/proc/self/task`` lists every thread (also those that Python did not start:
  a C library's, a JVM's); ``/proc/self/task/<tid>/stat`` gives its state letter and its user
  and system CPU time in clock ticks (10 ms on most kernels); the thread's CPU clock (the
  clock id glibc's ``pthread_getcpuclockid`` computes from the thread id, read with
  ``time.clock_gettime_ns``) gives its total CPU time to the nanosecond, for the shares.
- **Elsewhere** (macOS, Windows): the threads Python knows (``threading.enumerate()``), with
  their names, ids and daemon flags; state and CPU time are not measured (``None``), since no
  portable call reads another thread's CPU clock safely.

A share is CPU time over wall time, as a fraction of one CPU: 1.0 is a thread that kept one
core busy the whole interval (a saturated executor worker, a busy non-loop thread).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from asyncflow.instrumentation import _session
from asyncflow.schema import SCHEMA, ThreadEntry, ThreadsDocument

__all__ = [
    "EXITED_KEPT",
    "FRESH_NS",
    "SOURCE",
    "THREAD_INTERVAL_NS",
    "ThreadReading",
    "ThreadSampler",
    "ThreadState",
    "loop_threads",
    "read_threads",
    "threads_document",
]

#: how often the collector's tick samples the threads
THREAD_INTERVAL_NS = 500_000_000
#: a document older than this takes a fresh sample first
FRESH_NS = 100_000_000
#: threads that ended, kept (with their last figures) so a short-lived worker is still seen
EXITED_KEPT = 16

#: /proc's state letters, as the document names them
_STATES = {
    "R": "running",
    "S": "sleeping",
    "D": "waiting",  # uninterruptible sleep: disk or another blocking kernel wait
    "T": "stopped",
    "t": "stopped",  # stopped by a debugger
    "Z": "zombie",
    "X": "exited",
    "I": "sleeping",  # an idle kernel thread
}

_PROC = "/proc/self/task"
_TICK_NS = 1_000_000_000 // (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)


@dataclass(frozen=True, slots=True)
class ThreadReading:
    """One thread as the operating system shows it at one instant."""

    native_id: int
    #: the kernel's name for it (``comm``, at most 15 characters on Linux); None if unknown
    os_name: str | None
    #: ``running``, ``sleeping``, ``waiting``, ``stopped``, ``zombie``; None if unknown
    state: str | None
    #: user + system CPU time, in nanoseconds; None where the platform does not say
    cpu_ns: int | None
    user_ns: int | None
    system_ns: int | None


def _cpu_clock(tid: int) -> int | None:
    """The CPU time of thread ``tid`` (Linux), from the per-thread CPU clock glibc's
    ``pthread_getcpuclockid`` would give: ``(~tid << 3) | CPUCLOCK_PERTHREAD | CPUCLOCK_SCHED``.

    Computed from the kernel's thread id, not from a ``pthread_t``: a thread that has just
    ended gives an ``OSError`` here, never a read of freed memory.
    """
    try:
        return time.clock_gettime_ns(((~tid) << 3) | 6)
    except (OSError, OverflowError, AttributeError):
        return None


def _read_proc() -> list[ThreadReading]:
    out: list[ThreadReading] = []
    try:
        names = os.listdir(_PROC)
    except OSError:
        return out
    for entry in names:
        if not entry.isdigit():
            continue
        tid = int(entry)
        try:
            with open(f"{_PROC}/{entry}/stat", "rb") as f:
                raw = f.read()
        except OSError:  # ended between the listing and the read
            continue
        # "tid (comm) S ppid ...": comm may hold spaces and parentheses, so cut at the last ')'
        left, right = raw.find(b"("), raw.rfind(b")")
        if left < 0 or right < 0:
            continue
        fields = raw[right + 2 :].split()
        if len(fields) < 13:
            continue
        user, system = int(fields[11]) * _TICK_NS, int(fields[12]) * _TICK_NS
        cpu = _cpu_clock(tid)
        out.append(
            ThreadReading(
                native_id=tid,
                os_name=raw[left + 1 : right].decode("utf-8", "replace"),
                state=_STATES.get(fields[0].decode("ascii", "replace"), "unknown"),
                cpu_ns=cpu if cpu is not None else user + system,
                user_ns=user,
                system_ns=system,
            )
        )
    return out


def _read_python() -> list[ThreadReading]:
    return [
        ThreadReading(t.native_id, None, None, None, None, None)
        for t in threading.enumerate()
        if t.native_id is not None
    ]


def read_threads() -> list[ThreadReading]:
    """Every thread of the process now (every OS thread on Linux, Python's elsewhere)."""
    if sys.platform.startswith("linux") and os.path.isdir(_PROC):
        return _read_proc()
    return _read_python()


#: the platform's figures, as the document's ``source`` says: ``proc`` or ``threading``
SOURCE = "proc" if sys.platform.startswith("linux") else "threading"


class ThreadState:
    """One thread's figures over the profile (the sampler's record; cold path only)."""

    __slots__ = (
        "cpu_ns",
        "daemon",
        "first_cpu_ns",
        "first_ns",
        "first_wall_ns",
        "ident",
        "interval_ns",
        "last_wall_ns",
        "loop_ids",
        "max_share",
        "name",
        "native_id",
        "prev_cpu_ns",
        "python",
        "share",
        "state",
        "system_ns",
        "user_ns",
    )

    def __init__(self, reading: ThreadReading, now: int, wall: int) -> None:
        self.native_id = reading.native_id
        self.ident: int | None = None
        self.name = reading.os_name or f"thread {reading.native_id}"
        self.daemon: bool | None = None
        self.python = False
        self.state = reading.state
        self.cpu_ns = reading.cpu_ns
        self.user_ns = reading.user_ns
        self.system_ns = reading.system_ns
        #: the first sample (on the profiler's clock, which tests may fake): when first seen
        self.first_ns = now
        #: the first sample on the wall clock, which CPU time is compared with: the average
        #: share counts from here
        self.first_wall_ns = wall
        self.first_cpu_ns = reading.cpu_ns
        #: the last sample's wall time, and the CPU time the sample before it gave
        self.last_wall_ns = wall
        self.prev_cpu_ns = reading.cpu_ns
        self.interval_ns = 0
        self.share: float | None = None
        self.max_share: float | None = None
        #: ids of the instrumented event loops it runs (as ``/loop`` numbers them)
        self.loop_ids: list[int] = []

    def update(self, reading: ThreadReading, now: int) -> None:
        """Take a new sample at wall time ``now``; the share is over the time since the
        previous one."""
        wall = now - self.last_wall_ns
        if wall <= 0:  # two samples at one instant: nothing to divide
            return
        before = self.cpu_ns
        self.prev_cpu_ns = before
        self.last_wall_ns, self.interval_ns = now, wall
        self.state = reading.state
        self.cpu_ns, self.user_ns, self.system_ns = (
            reading.cpu_ns,
            reading.user_ns,
            reading.system_ns,
        )
        if reading.cpu_ns is not None and before is not None:
            share = max(0, reading.cpu_ns - before) / wall
            self.share = share
            if self.max_share is None or share > self.max_share:
                self.max_share = share

    @property
    def avg_share(self) -> float | None:
        """CPU time over wall time since the thread was first seen."""
        wall = self.last_wall_ns - self.first_wall_ns
        if wall <= 0 or self.cpu_ns is None or self.first_cpu_ns is None:
            return None
        return max(0, self.cpu_ns - self.first_cpu_ns) / wall


def _reused(state: ThreadState, reading: ThreadReading) -> bool:
    """Whether a reading of a known thread id is another thread's: its CPU clock went back."""
    return reading.cpu_ns is not None and state.cpu_ns is not None and reading.cpu_ns < state.cpu_ns


class ThreadSampler:
    """Samples every thread of the process; keeps live threads and the last exited ones.

    Args:
        read: what lists the threads (:func:`read_threads`; tests give a fake one).
        loops: what maps a Python thread ident to the ids of the event loops it runs (the
            collector's loop monitor knows).
        wall: the clock CPU time is divided by: the real one, even where the profiler's
            clock is faked, since CPU clocks cannot be (tests give a fake one with ``read``).
        python_threads: what lists Python's threads, for names, idents and daemon flags.
        interval_ns: the least time between two samples taken on the collector's tick.
    """

    def __init__(
        self,
        read: Callable[[], list[ThreadReading]] = read_threads,
        python_threads: Callable[[], Iterable[threading.Thread]] = threading.enumerate,
        interval_ns: int = THREAD_INTERVAL_NS,
        wall: Callable[[], int] = time.perf_counter_ns,
        loops: Callable[[], Mapping[int, list[int]]] | None = None,
    ) -> None:
        self._read = read
        self._wall = wall
        self._loops = loops
        self._python_threads = python_threads
        self.interval_ns = interval_ns
        self.live: dict[int, ThreadState] = {}
        self.exited: deque[ThreadState] = deque(maxlen=EXITED_KEPT)
        #: when the last sample was taken; 0 before the first
        self.sampled_ns = 0
        self.samples = 0
        #: when the last sample was tried (None: never)
        self._tried: int | None = None

    def tick(self, now: int) -> None:
        """Sample if the last sample is ``interval_ns`` old (the collector's tick calls this)."""
        if self._tried is None or now - self._tried >= self.interval_ns:
            self._safely(now)

    def fresh(self, now: int, within_ns: int = FRESH_NS) -> None:
        """Sample unless the last sample is younger than ``within_ns`` (before a document)."""
        if self._tried is None or within_ns <= 0 or now - self._tried >= within_ns:
            self._safely(now)

    def _safely(self, now: int) -> None:
        self._tried = now  # a failure is not retried on every tick either
        try:
            self.sample(now)
        except Exception as exc:  # a thread list that cannot be read must not stop the collector
            _session.internal_error("sampling the threads", exc)

    def name_loops(self) -> None:
        """Which loops each thread runs, as of now: a sample may be older than a loop's
        registration, and a document must name a loop the monitor already shows."""
        if self._loops is None:
            return
        try:
            loops = self._loops()
        except Exception as exc:
            _session.internal_error("reading the loops' threads", exc)
            return
        for state in self.live.values():
            if state.python:
                state.loop_ids = loops.get(state.ident or 0, [])

    def sample(self, now: int) -> None:
        """Read every thread now and fold the readings in (``now``: the profiler's clock)."""
        self._tried = now
        readings = self._read()
        wall = self._wall()
        python = {t.native_id: t for t in self._python_threads() if t.native_id is not None}
        loops = self._loops() if self._loops is not None else {}
        seen: set[int] = set()
        live = self.live
        for reading in readings:
            tid = reading.native_id
            if tid in _own_ended and tid not in python and tid not in live:
                continue
            seen.add(tid)
            state = live.get(tid)
            if state is not None and _reused(state, reading):
                state.state = "exited"  # its id was given to a new thread since
                self.exited.append(live.pop(tid))
                state = None
            if state is None:
                state = live[tid] = ThreadState(reading, now, wall)
            else:
                state.update(reading, wall)
            thread = python.get(tid)
            if thread is not None:
                state.python = True
                state.ident, state.name, state.daemon = thread.ident, thread.name, thread.daemon
                state.loop_ids = loops.get(thread.ident or 0, [])
            elif state.python:
                # Joined, and gone from Python's list, but the kernel has not taken it down
                # yet (join returns first): /proc may still say "running" for a moment.
                state.state, state.loop_ids = "exited", []
        if _own_ended:  # an id the kernel no longer lists may go to a thread of the program
            _own_ended.intersection_update(r.native_id for r in readings)
        for tid in [t for t in live if t not in seen]:
            gone = live.pop(tid)
            gone.state = "exited"
            self.exited.append(gone)
        self.sampled_ns = now
        self.samples += 1


#: native ids of asyncflow's own threads that ended before a sampler could know them by name
#: (the start-up import thread): the kernel may list one for a moment after its join returns,
#: nameless then, and it is neither the program's thread nor worth a line of the report
_own_ended: set[int] = set()


def own_thread_ended(thread: threading.Thread) -> None:
    """``thread``, one of asyncflow's, was joined: the samplers never list it."""
    if thread.native_id is not None:
        _own_ended.add(thread.native_id)


def loop_threads(monitor: Any) -> dict[int, list[int]]:
    """Python thread ident -> ids of the open instrumented loops it runs (``LoopMonitor``)."""
    out: dict[int, list[int]] = {}
    for state in list(monitor.states.values()):
        record = state.record
        if record.thread and not state.closed:
            out.setdefault(record.thread, []).append(record.id)
    return out


def _entry(t: ThreadState, origin: int) -> ThreadEntry:
    return ThreadEntry(
        native_id=t.native_id,
        ident=t.ident,
        name=t.name,
        python=t.python,
        daemon=t.daemon,
        asyncflow=t.python and t.name.startswith("asyncflow-"),
        state=t.state,
        cpu_ns=t.cpu_ns,
        user_ns=t.user_ns,
        system_ns=t.system_ns,
        share=t.share,
        max_share=t.max_share,
        avg_share=t.avg_share,
        interval_ns=t.interval_ns,
        first_seen_ns=max(0, t.first_ns - origin),
        loop_ids=list(t.loop_ids),
    )


def _busiest(t: ThreadState) -> tuple[float, int, int]:
    return (-(t.share or 0.0), -(t.cpu_ns or 0), t.native_id)


def threads_document(
    sampler: ThreadSampler, now: int, origin: int, within_ns: int = FRESH_NS
) -> ThreadsDocument:
    """``GET /threads``: a fresh sample unless the last is younger than ``within_ns`` (0: a
    fresh one always, as the final snapshot takes), the busiest first."""
    sampler.fresh(now, within_ns)
    sampler.name_loops()
    live = sorted(sampler.live.values(), key=_busiest)
    shares = [t.share for t in live if t.share is not None]
    return ThreadsDocument(
        schema=SCHEMA,
        source=SOURCE,
        sampled_ns=max(0, sampler.sampled_ns - origin),
        samples=sampler.samples,
        sample_interval_ns=sampler.interval_ns,
        total=len(live),
        process_share=sum(shares) if shares else None,
        threads=[_entry(t, origin) for t in [*live, *reversed(sampler.exited)]],
    )
