"""Recording synchronisation primitives in place: ``instrument_lock(obj)``, ``instrument_locks()``.

A *resource* is a lock, semaphore, condition, event, barrier or capacity limiter. Calls *wait*
on it and *hold* it. asyncio's primitives stay the user's objects, of their own class, with their
own waiter deques: asyncflow sets per-instance ``acquire``/``release`` (``wait``, ``set``...)
that call the original methods, as ``async with`` and ``Condition.wait`` already reach them
through the instance. The hooks hold the primitive (through its bound methods), so an
instrumented primitive is freed by the cyclic collector rather than at once; a weak reference
there would break ``f = lock.acquire; del lock; await f()``. In whole-program mode asyncio's own
Lock, Condition and Event classes carry the hooks instead, which find an instance's record on
it: one made per request goes with its last reference, and a Lock or Event (anyio's Lock and
Event too) gets a record only once something waits on it (until then its uses count on its
creation line's row). anyio's primitives are slotted: their asyncio backend classes' methods are
wrapped once, for good, and find an instance's record (or a lazy Lock's site) in a table keyed
by ``id()`` (an uninstrumented anyio primitive then pays one dict lookup).

Whether an ``acquire()`` will wait is read before it starts, from the fields the primitive's
own fast path reads (``_locked``, ``_value``, ``_waiters``): an acquisition that waits is timed
from its call to its return. One that does not wait keeps the call that holds it, so that "who
holds this lock, since when" and "whose permits never came back" have answers. Acquisitions,
releases, waits and signals are counted exactly; hold durations, the durations of waits that
got what they waited for (the longest always) and the signals' log are sampled (every one while
the resource is quiet, about a thousand a second when it is busy), each timed one standing for
those since the previous one, as channels time messages; a wait given up is timed on its own.
With no profiler running, the hooks only forward.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import threading
import types
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any, Literal, NamedTuple, TypeVar

from asyncflow import clock as _clock
from asyncflow import config as _config
from asyncflow.instrumentation import _imports, _session
from asyncflow.instrumentation import futures as _futures_module
from asyncflow.instrumentation._gone import AGGREGATES_KEPT, GONE_KEPT, Fold, GoneHistory
from asyncflow.instrumentation._nested import Nested
from asyncflow.instrumentation._sites import (
    _ANYIO_CHAIN,
    _ASYNCIO_DIR,
    _constructs,
    creation_frame,
    site_label,
)
from asyncflow.instrumentation._sites import _anyio as _anyio_dir
from asyncflow.instrumentation.futures import (
    CallRecord,
    _current_tasks,
    _get_running_loop,
)
from asyncflow.stats import SMALL_BUCKET, SMALL_LIMIT, bucket_of, new_histogram

__all__ = [
    "AGGREGATES_KEPT",
    "BARRIER",
    "CONDITION",
    "EVENT",
    "GONE_KEPT",
    "HOLDS_KEPT",
    "LIMITER",
    "LOCK",
    "RESOURCE_LOG_SIZE",
    "SEMAPHORE",
    "Hold",
    "LockInstrumentation",
    "LogRecord",
    "Probe",
    "ResourceEdge",
    "ResourceRecord",
    "ResourceStats",
    "acquisitions",
    "holds_of",
    "instrument_lock",
    "instrument_locks",
    "logs_of",
    "probe",
    "reap",
    "releases",
    "reset_for_session",
    "resource_of",
    "resource_registry",
]

# Families of primitives: which figures apply (docs/architecture.md, "Words": resource).
LOCK = "lock"
SEMAPHORE = "semaphore"
CONDITION = "condition"
EVENT = "event"
BARRIER = "barrier"
LIMITER = "capacity_limiter"

#: recent waits, holds and signals kept per resource (each log on its own)
RESOURCE_LOG_SIZE = 100
#: open holds remembered per resource (with who holds them); more are counted, not named
HOLDS_KEPT = 1024
#: Gone resources: the last GONE_KEPT as they were, older ones folded into one aggregate per
#: (label, kind), at most AGGREGATES_KEPT (then one "(other gone resources)" per kind).
OTHER_GONE = "(other gone resources)"

_MARK = "_asyncflow_resource"
_T = TypeVar("_T")

# Outcomes of a wait, and the signals that are logged.
ACQUIRED = "acquired"
CANCELLED = "cancelled"
RAISED = "raised"
BROKEN = "broken"
WOKEN = "woken"  # an event was set, a condition notified, a barrier passed


class ResourceEdge:
    """What one future did with one resource: its waits (every one), its holds (each sampled
    hold weighted by the holds it stands for, as channels' edges are), its signals."""

    __slots__ = (
        "hold_count",
        "hold_max",
        "hold_ns",
        "signals",
        "wait_count",
        "wait_max",
        "wait_ns",
    )

    def __init__(self) -> None:
        self.wait_count = 0
        self.wait_ns = 0
        self.wait_max = 0
        self.hold_count = 0
        self.hold_ns = 0
        self.hold_max = 0
        #: sets of an event, notifies of a condition, aborts/resets of a barrier
        self.signals = 0


#: how a gone resource's edge adds into its aggregate's (every other int field is summed)
_EDGE_FOLD = Fold(ResourceEdge, maximum=("hold_max", "wait_max"))


class ResourceStats:
    """One session's figures for one resource; reset in place when a profiler starts (the
    hooks hold them directly)."""

    __slots__ = (
        "abandoned",
        "aborts",
        "broken",
        "clears",
        "contended",
        "edges",
        "hold_count",
        "hold_hist",
        "hold_interval",
        "hold_log",
        "hold_max",
        "hold_ns",
        "hold_timed",
        "immediate",
        "last_hold",
        "last_signal",
        "last_wait",
        "max_waiting",
        "next_hold",
        "next_signal",
        "next_wait",
        "notifies",
        "open_waits",
        "passes",
        "resets",
        "sampled_hold",
        "sampled_signal",
        "sampled_wait",
        "sets",
        "signal_count",
        "signal_interval",
        "signal_log",
        "unmatched",
        "untracked",
        "wait_count",
        "wait_failed",
        "wait_hist",
        "wait_interval",
        "wait_log",
        "wait_max",
        "wait_ns",
        "wait_timed",
        "waiting",
        "woken",
    )

    def __init__(self) -> None:
        # Acquisitions and releases are not counted apart, to spare the path nobody contends
        # two updates: acquired = hold_count + holds open + abandoned, released = hold_count +
        # unmatched (see acquisitions() and releases()).
        self.contended = 0  # acquisitions that had to wait
        self.unmatched = 0  # releases with no hold seen (acquired before it was watched)
        self.untracked = 0  # holds open beyond HOLDS_KEPT: counted, not named
        self.abandoned = 0  # holds still open when the primitive was freed
        self.wait_count = 0  # waits that ended, whatever the outcome
        self.wait_failed = 0  # ... of which ended in an exception (cancelled, timed out...)
        self.wait_ns = 0
        self.wait_max = 0
        self.wait_hist = new_histogram()
        # Waits that got what they waited for (a notify_all() herd wakes every waiter) are
        # timed as holds are: every one while they are few, a sample when they come close
        # together (and the longest yet), each standing for those since the one before in the
        # total, the histogram and the edges; a wait given up is timed on its own.
        self.wait_timed = 0  # waits timed on their own (in the histogram, each weighted)
        self.sampled_wait = 0  # the waits ended that the weighted figures stand for
        self.wait_interval = 1
        self.next_wait = 1  # the wait count at which the next wait is timed
        self.last_wait = 0  # when the last sampled wait ended
        self.immediate = 0  # event waits that found it set: counted, not timed
        # event, condition (and barrier) waits that returned: each a task woken by a set, a
        # notify (or the last party); a condition's herd reads as woken per notify
        self.woken = 0
        self.waiting = 0  # waiting now
        self.max_waiting = 0
        # the waits going on now, by when each began (start ns -> how many began then): what
        # they have waited so far, and the longest, for a report written while they wait (a
        # deadlock's at SIGTERM, an event never set)
        self.open_waits: dict[int, int] = {}
        self.hold_count = 0  # holds that ended (released): exact
        # Every hold's start is read (holders now say since when), but only a sample of holds
        # is timed at its end (see _session.next_interval): each timed hold stands for the
        # holds since the previous one in the total, the histogram and the edges; the
        # maximum is over the timed holds. Every hold is timed while the resource is quiet.
        self.hold_ns = 0
        self.hold_max = 0
        self.hold_hist = new_histogram()
        self.hold_timed = 0  # holds in the histogram
        self.hold_interval = 1
        self.next_hold = 1  # the hold count at which the next hold is sampled
        self.sampled_hold = 0  # the hold count at the last sampled hold
        self.last_hold = 0  # when the last sampled hold began
        self.signal_count = 0  # every signal below, for the log's index
        # signals are logged (and given to their futures' edges) at the sampling interval, as
        # holds are timed: each logged one stands for those since the one logged before
        self.sampled_signal = 0
        self.signal_interval = 1
        self.next_signal = 1
        self.last_signal = 0
        self.sets = 0
        self.clears = 0
        self.notifies = 0
        self.passes = 0  # barrier waits that returned
        self.broken = 0  # barrier waits that raised BrokenBarrierError
        self.aborts = 0
        self.resets = 0
        # future id (None: not inside a tracked call) -> ResourceEdge
        self.edges: dict[int | None, ResourceEdge] = {}
        # logs are made on first use: most resources never fill all three
        self.wait_log: deque[tuple[Any, ...]] | None = None
        self.hold_log: deque[tuple[Any, ...]] | None = None
        self.signal_log: deque[tuple[Any, ...]] | None = None


#: how a gone resource's figures add into its aggregate (every other int field is summed)
_FOLD = Fold(
    ResourceStats,
    maximum=("hold_max", "max_waiting", "wait_max"),
    histogram=("hold_hist", "wait_hist"),
    left=(
        # sampling state, and what is now (a gone one's holds are abandoned by _retire)
        "hold_interval",
        "last_hold",
        "last_signal",
        "last_wait",
        "next_hold",
        "next_signal",
        "next_wait",
        "sampled_hold",
        "sampled_signal",
        "sampled_wait",
        "signal_interval",
        "wait_interval",
        "untracked",
        "waiting",
        "open_waits",
        # added by _merge
        "edges",
        "hold_log",
        "signal_log",
        "wait_log",
    ),
)


def _no_target() -> None:
    return None


#: shared by the records that never use them (see ResourceRecord: holds, pending, _refs)
_NO_HOLDS: list[Any] = []
_NO_PENDING: set[int] = set()
_NO_REFS: list[Any] = []


class ResourceRecord:
    """An instrumented primitive: identity, labels, open holds and this session's figures."""

    __slots__ = (
        "__weakref__",
        "_refs",
        "_target",
        "bound",
        "file",
        "folded",
        "handoff_ns",
        "held_polls",
        "holds",
        "id",
        "initial",
        "kind",
        "label",
        "line",
        "loop",
        "match",
        "pending",
        "primitive",
        "slot",
        "stats",
        "yielded",
    )

    def __init__(
        self,
        label: str,
        kind: str,
        primitive: str,
        file: str,
        line: int,
        target: Any,
        initial: float | None = None,
        bound: float | None = None,
        record_id: int | None = None,
    ) -> None:
        self.id = next(_resource_ids) if record_id is None else record_id
        self.label = label
        #: ``asyncio.Lock``, ``anyio.CapacityLimiter``, ``app.MyLock``...
        self.kind = kind
        #: the family: LOCK, SEMAPHORE, CONDITION, EVENT, BARRIER or LIMITER
        self.primitive = primitive
        self.file = file
        self.line = line
        #: a semaphore's value, a limiter's tokens, a barrier's parties when instrumented
        self.initial = initial
        #: a bounded semaphore's (or anyio semaphore's) most
        self.bound = bound
        #: gone resources whose figures are summed here (an aggregate); 0 for a real one
        self.folded = 0
        #: semaphores match a release with the releasing task's own hold; a lock (or a
        #: condition's lock) has one hold at most, kept in ``slot``
        self.match = primitive in (SEMAPHORE, LIMITER)
        #: the hold of a lock: [since, call record or None]; [None, None] while not held.
        #: Two item stores per acquisition, where a list of tuples costs an allocation.
        self.slot: list[Any] = [None, None]
        #: holds of a semaphore or limiter open now: (since, holder key, call record or None),
        #: oldest first; the key is the holding task's id (or the borrower's). Other kinds
        #: share one empty list, never added to: a primitive made per request (an event, a
        #: lock) then costs the collector's young generation a few objects fewer.
        self.holds: list[tuple[int, int, CallRecord | None]] = [] if self.match else _NO_HOLDS
        #: holder keys inside an anyio acquire now (its own rollback release is not a release);
        #: made by _bind for an anyio primitive, the shared empty set for the others
        self.pending: set[int] = _NO_PENDING
        #: when an anyio release last handed the primitive to a waiter (its hold begins then)
        self.handoff_ns = 0
        #: the loop the primitive ran on last, to find the running task without asking asyncio
        #: (see _task_for); dropped when the primitive is gone
        self.loop: Any = None
        #: an anyio lock's holds that spanned an await (a task blocked meanwhile waited on
        #: them), and its holder call's polls when it was acquired
        self.yielded = 0
        self.held_polls = -1
        #: weak references that keep the id table clean (anyio's; made by _bind)
        self._refs: list[Any] = _NO_REFS
        self._target: Callable[[], Any] = _no_target
        if target is not None:
            self._target = _history.watch(self, target)
        self.stats = ResourceStats()

    @property
    def alive(self) -> bool:
        """Whether the primitive still exists."""
        return self._target() is not None

    def target(self) -> Any:
        """The primitive itself, or None once it is gone (cold path only)."""
        return self._target()


# ---------------------------------------------------------------------------------------------
# Recording, shared by every kind. Each function is called only while a profiler runs.

try:  # loop -> its running task: the dict asyncio's C tasks keep (3.11 to 3.13)
    import _asyncio

    _c_tasks: dict[Any, Any] | None = _asyncio._current_tasks  # type: ignore[attr-defined]
except (ImportError, AttributeError):  # pragma: no cover - no C accelerator, or 3.14
    _c_tasks = _current_tasks
_current_task = asyncio.current_task
_running_call_here = _futures_module.running_call_here


def _task_for(record: ResourceRecord) -> Any:
    """The task running now, caching on the record the loop it was found on.

    Reading the running loop costs a ``getpid()`` system call on 3.11, more than everything
    else an acquisition records; a primitive runs on one loop, so the loop is asked for again
    only when the one it ran on last has no task running.
    """
    if _c_tasks is not None:
        task = _c_tasks.get(record.loop)
        if task is None:
            loop = record.loop = _get_running_loop()
            task = _c_tasks.get(loop)
        return task
    loop = _get_running_loop()  # pragma: no cover - 3.14's per-thread tasks
    return None if loop is None else _current_task(loop)


def _call_for(record: ResourceRecord) -> CallRecord | None:
    """The call that waits, holds or signals now (see _call_of); None outside a task."""
    return None if _task_for(record) is None else _running_call_here()


def _call_of(task: Any) -> CallRecord | None:
    """The call that waits or holds for ``task``, the one running now: the innermost tracked
    call on this thread, as for channels (not the task's own coroutine, often a wrapper)."""
    if task is None:
        return None
    r: CallRecord | None = _running_call_here()
    return r


def _edge(st: ResourceStats, call: CallRecord | None) -> ResourceEdge:
    fid = call.future.id if call is not None else None
    edge = st.edges.get(fid)
    if edge is None:
        edge = st.edges[fid] = ResourceEdge()
    return edge


def _held(record: ResourceRecord, now: int, key: int, call: CallRecord | None) -> None:
    """Count one acquisition, and open its hold."""
    st = record.stats
    if not record.match:
        slot = record.slot
        slot[1] = call
        slot[0] = now
        return
    holds = record.holds
    if len(holds) < HOLDS_KEPT:
        holds.append((now, key, call))
    else:
        st.untracked += 1


def _released(record: ResourceRecord, key: int) -> None:
    """Count one release, and close the hold it ends: the releasing task's own (semaphores),
    else the oldest; a lock's only one."""
    st = record.stats
    if not record.match:
        slot = record.slot
        since = slot[0]
        if since is None:
            _unmatched(st)
            return
        call = slot[1]
        slot[0] = slot[1] = None
        _hold_ended(st, since, call)
        return
    holds = record.holds
    if not holds:
        _unmatched(st)
        return
    if len(holds) > 1:
        since, _, call = holds.pop(_own_hold(holds, key))
    else:
        since, _, call = holds.pop()
    _hold_ended(st, since, call)


def _hold_ended(st: ResourceStats, since: int, call: CallRecord | None) -> None:
    st.hold_count = count = st.hold_count + 1
    if count >= st.next_hold and since > 0:  # a negative since is a tick: not for timing
        _sample_hold(st, since, call)


def _own_hold(holds: list[tuple[int, int, Any]], key: int) -> int:
    """The releasing task's own hold, newest first; else the oldest hold."""
    for i in range(len(holds) - 1, -1, -1):
        if holds[i][1] == key:
            return i
    return 0


def _unmatched(st: ResourceStats) -> None:
    if st.untracked:  # one of the holds beyond HOLDS_KEPT: ended, untimed
        st.untracked -= 1
        st.hold_count += 1
    else:
        st.unmatched += 1


def _sample_hold(st: ResourceStats, since: int, call: CallRecord | None) -> None:
    """Time a hold that ended now, standing for the holds since the last one timed: into the
    totals, the histogram, its future's edge and the log, each weighted."""
    spent = _clock.now_ns() - since
    count = st.hold_count
    weight = count - st.sampled_hold
    st.sampled_hold = count
    st.hold_timed += 1
    st.hold_ns += spent * weight
    if spent > st.hold_max:
        st.hold_max = spent
    bucket = SMALL_BUCKET[spent] if 0 <= spent < SMALL_LIMIT else bucket_of(spent)
    st.hold_hist[bucket] += weight
    edge = _edge(st, call)
    edge.hold_count += weight
    edge.hold_ns += spent * weight
    if spent > edge.hold_max:
        edge.hold_max = spent
    st.hold_interval = interval = _session.next_interval(st.hold_interval, since - st.last_hold)
    st.last_hold = since
    st.next_hold = count + interval
    log = st.hold_log
    if log is None:
        log = st.hold_log = deque(maxlen=RESOURCE_LOG_SIZE)
    if call is None:
        log.append((count - 1, since, spent, None, None))
    else:
        log.append((count - 1, since, spent, call.call_id, call.future.id))


def _wait_began(st: ResourceStats, since: int) -> None:
    """A wait begins at ``since``: one more waiting (the most at once), and open since then."""
    opened = st.open_waits
    opened[since] = opened.get(since, 0) + 1
    st.waiting = waiting = st.waiting + 1
    if waiting > st.max_waiting:
        st.max_waiting = waiting


def _wait_over(st: ResourceStats, since: int) -> None:
    """The wait begun at ``since`` is over (whatever its outcome): one fewer waiting."""
    st.waiting -= 1
    opened = st.open_waits
    left = opened.pop(since, 0) - 1
    if left > 0:
        opened[since] = left


def _waited(
    record: ResourceRecord, since: int, now: int, call: CallRecord | None, outcome: str
) -> None:
    """Count one wait that ended, with its outcome.

    A wait that got what it waited for (acquired, woken) is timed as holds are: at the sampling
    interval, or when it is the longest yet, standing for those since the one timed before in
    the total, the histogram and the edges (a contended lock, or events passed back and forth,
    end thousands a second); one given up (cancelled, timed out, broken) is timed on its own.
    """
    st = record.stats
    _wait_over(st, since)
    st.wait_count = count = st.wait_count + 1
    spent = now - since
    if outcome in (ACQUIRED, WOKEN):
        if count >= st.next_wait or spent > st.wait_max:
            _wait_sampled(st, since, now, call, count, outcome)
        return
    st.wait_failed += 1
    st.sampled_wait += 1  # (timed on its own: no sampled wait stands for it)
    _wait_timed(st, since, spent, call, 1, count, outcome)


def _wait_sampled(
    st: ResourceStats, since: int, now: int, call: CallRecord | None, count: int, outcome: str
) -> None:
    """Time the ``count``-th wait, which ended ``now``, standing for the waits since the one timed
    before, and set when the next one is timed (the sampling interval, as for holds)."""
    weight = count - st.sampled_wait
    st.sampled_wait = count
    st.wait_interval = interval = _session.next_interval(st.wait_interval, now - st.last_wait)
    st.last_wait = now
    st.next_wait = count + interval
    _wait_timed(st, since, now - since, call, weight, count, outcome)


def _wait_timed(
    st: ResourceStats,
    since: int,
    spent: int,
    call: CallRecord | None,
    weight: int,
    count: int,
    outcome: str,
) -> None:
    """Time the ``count``-th wait, ``spent`` long, standing for ``weight`` waits: into the totals,
    the histogram, its future's edge and the log."""
    st.wait_timed += 1
    st.wait_ns += spent * weight
    st.wait_hist[SMALL_BUCKET[spent] if 0 <= spent < SMALL_LIMIT else bucket_of(spent)] += weight
    if spent > st.wait_max:
        st.wait_max = spent
    if call is None:
        fid = call_id = None
    else:
        fid, call_id = call.future.id, call.call_id
    edge = st.edges.get(fid)
    if edge is None:
        edge = st.edges[fid] = ResourceEdge()
    edge.wait_count += weight
    edge.wait_ns += spent * weight
    if spent > edge.wait_max:
        edge.wait_max = spent
    log = st.wait_log
    if log is None:
        log = st.wait_log = deque(maxlen=RESOURCE_LOG_SIZE)
    log.append((count - 1, since, spent, call_id, fid, outcome))


def _signalled(record: ResourceRecord, action: str) -> None:
    """Log a set, clear, notify, abort or reset (its kind counted by the caller), by the call
    running now: as holds are timed, at the sampling interval, each logged one standing for the
    signals since the one before in its future's edge (events passed back and forth are set and
    cleared thousands of times a second)."""
    st = record.stats
    st.signal_count = count = st.signal_count + 1
    if count >= st.next_signal:
        _signal_sampled(record, action, count)


def _signal_sampled(record: ResourceRecord, action: str, count: int) -> None:
    """Log the ``count``-th signal, standing for those since the one logged before, and set when
    the next one is logged (see _signalled)."""
    st = record.stats
    now = _clock.now_ns()
    weight = count - st.sampled_signal
    st.sampled_signal = count
    st.signal_interval = interval = _session.next_interval(st.signal_interval, now - st.last_signal)
    st.last_signal = now
    st.next_signal = count + interval
    call = _call_for(record)
    _edge(st, call).signals += weight
    log = st.signal_log
    if log is None:
        log = st.signal_log = deque(maxlen=RESOURCE_LOG_SIZE)
    call_id, fid = (call.call_id, call.future.id) if call is not None else (None, None)
    log.append((count - 1, now, call_id, fid, action))


def _outcome(exc: BaseException) -> str:
    if isinstance(exc, asyncio.CancelledError):
        return CANCELLED
    if isinstance(exc, asyncio.BrokenBarrierError):
        return BROKEN
    return RAISED


def _broken(where: str, err: Exception) -> None:
    _session.internal_error(where, err)


# ---------------------------------------------------------------------------------------------
# asyncio: per-instance hooks


def _std_lock_busy(lock: Any) -> bool:
    """Whether ``Lock.acquire`` (3.11 to 3.13) will wait: the negation of its fast path."""
    if lock._locked:
        return True
    waiters = lock._waiters
    return bool(waiters) and not all(w.cancelled() for w in waiters)


def _std_semaphore_busy(lock: Any) -> bool:
    """Whether ``Semaphore.acquire`` (3.11 to 3.13) will wait: it waits when ``locked()``."""
    return lock._value == 0 or any(not w.cancelled() for w in (lock._waiters or ()))


def _locked(lock: Any) -> bool:
    """A subclass with its own acquire: whether it is locked, near enough."""
    return bool(lock.locked())


def _lock_busy(primitive: Any) -> Callable[[Any], bool]:
    """Whether ``acquire()`` is about to wait, as a function of the primitive: the negation of
    its own fast path (read through its private fields, as its own methods do)."""
    cls = type(primitive)
    if issubclass(cls, asyncio.Lock) and cls.acquire is asyncio.Lock.acquire:
        return _std_lock_busy
    if (
        issubclass(cls, asyncio.Semaphore)
        and cls.acquire is asyncio.Semaphore.acquire
        and cls.locked is asyncio.Semaphore.locked
    ):
        return _std_semaphore_busy
    return _locked


#: Which of asyncio's own fast paths a hook runs in place of calling the method. On 3.11 to 3.13
#: (read there) ``Lock.acquire`` begins ``if not locked and no live waiter: _locked = True;
#: return True``, ``Semaphore.acquire`` ``if not locked(): _value -= 1; return True``, the
#: releases wake a waiter only when there is one, and ``Event.wait`` returns True when set.
#: Running those few lines here spares the path nobody contends a coroutine (its frame, its
#: StopIteration) and a call; anything else (a subclass's own method, a version not read,
#: a state where it may wait) goes through the primitive's own method, as before.
_INLINE = (3, 11) <= sys.version_info < (3, 14)
_GENERIC, _STD_LOCK, _STD_SEMAPHORE = 0, 1, 2


def _bound(method: Any, func: Any, obj: Any) -> bool:
    """Whether ``method`` is ``func`` bound to ``obj`` (and so runs exactly its lines)."""
    return getattr(method, "__func__", None) is func and getattr(method, "__self__", None) is obj


def _inline_acquire(lock: Any, acquire: Any) -> int:
    """Whose fast path an acquire hook may run inline: _STD_LOCK, _STD_SEMAPHORE or _GENERIC."""
    if not _INLINE:
        return _GENERIC
    if _bound(acquire, _LOCK_ACQUIRE, lock) or _bound(acquire, _std_lock_acquire, lock):
        return _STD_LOCK
    if (
        _bound(acquire, _SEMAPHORE_ACQUIRE, lock) or _bound(acquire, _std_semaphore_acquire, lock)
    ) and type(lock).locked is asyncio.Semaphore.locked:
        return _STD_SEMAPHORE
    return _GENERIC


def _inline_release(lock: Any, release: Any) -> int:
    """Whose release a release hook may run inline: _STD_LOCK, _STD_SEMAPHORE or _GENERIC."""
    if not _INLINE:
        return _GENERIC
    cls = type(lock)
    if (
        _bound(release, _LOCK_RELEASE, lock) or _bound(release, _std_lock_release, lock)
    ) and cls._wake_up_first is vars(asyncio.Lock)["_wake_up_first"]:
        return _STD_LOCK
    if (
        _bound(release, _SEMAPHORE_RELEASE, lock) or _bound(release, _std_semaphore_release, lock)
    ) and cls._wake_up_next is vars(asyncio.Semaphore)["_wake_up_next"]:
        return _STD_SEMAPHORE
    return _GENERIC


#: asyncio's own methods, which the standard classes' hooks call with the primitive (no bound
#: method kept per instance)
_LOCK_ACQUIRE = asyncio.Lock.acquire
_LOCK_RELEASE = asyncio.Lock.release
_SEMAPHORE_ACQUIRE = asyncio.Semaphore.acquire
_SEMAPHORE_RELEASE = asyncio.Semaphore.release
_CONDITION_WAIT = asyncio.Condition.wait
_CONDITION_NOTIFY = asyncio.Condition.notify
_CONDITION_NOTIFY_ALL = asyncio.Condition.notify_all
_EVENT_WAIT = asyncio.Event.wait
_EVENT_SET = asyncio.Event.set
_EVENT_CLEAR = asyncio.Event.clear

# The hooks are module-level functions of the primitive, which find its record on it (a standard
# lock's, semaphore's, condition's: bound to it, or its class's in whole-program mode), or
# closures over the record and the primitive only (a subclass's), and everything else they do is
# a module-level function given those: a closure per helper over every local cost some twenty
# objects, made at a primitive's creation and collected with it.


def _note_hold(record: ResourceRecord, session: _session.Session) -> None:
    """Open the hold of an acquisition that did not wait: who holds it, and since when.

    Only a hold that will be timed needs the clock; the others note when they began to the
    collector's last tick, negated to say so (holds_of() reads it back).
    """
    st = record.stats  # reset in place, never replaced; so are the slot and the holds
    now = _clock.now_ns() if st.hold_count >= st.next_hold - 1 else -session.tick
    task = _task_for(record)
    call = _running_call_here() if task is not None else None  # see _call_of
    if not record.match:
        slot = record.slot
        slot[1] = call
        slot[0] = now
    elif len(record.holds) < HOLDS_KEPT:
        record.holds.append((now, id(task), call))
    else:
        st.untracked += 1


def _note_release(record: ResourceRecord) -> None:
    """Close the hold a release ends (a profiler is running); time it if it is sampled."""
    st = record.stats
    if not record.match:
        slot = record.slot
        since = slot[0]
        if since is None:
            _unmatched(st)
            return
        call = slot[1]
        slot[0] = slot[1] = None
    else:
        holds = record.holds
        if not holds:
            _unmatched(st)
            return
        if len(holds) == 1:
            since, _, call = holds.pop()
        else:
            since, _, call = holds.pop(_own_hold(holds, id(_task_for(record))))
    st.hold_count = count = st.hold_count + 1
    if count >= st.next_hold and since > 0:  # (a hold not timed waits for the next)
        _sample_hold(st, since, call)


async def _acquire_may_wait(
    record: ResourceRecord,
    lock: Any,
    busy: Callable[[Any], bool],
    acquire: Callable[..., Any],
    *args: Any,
) -> Any:
    """The primitive's own acquire (``acquire(*args)``), timed as a wait if it is about to
    wait."""
    session = _session.active
    if session is None:
        return await acquire(*args)
    try:
        waits = busy(lock)
    except Exception as err:
        _broken("reading a lock's state", err)
        waits = False
    if waits:
        return await _contended(record, acquire, *args)
    result = await acquire(*args)
    try:
        _note_hold(record, session)
    except Exception as err:  # observing never breaks the program
        _broken("recording an acquisition", err)
    return result


#: the attribute that holds the record a standard lock's or semaphore's hooks record into (a
#: condition's lock: the condition's), read with a default: None on the classes while their
#: hooks are set on them (whole-program mode, see _hook_locks), absent otherwise.
_LOCK_RECORD = "_asyncflow_lock"


async def _std_lock_acquire(self: asyncio.Lock) -> Literal[True]:
    """``acquire`` of a standard ``asyncio.Lock`` (or a condition's): its fast path in place."""
    if self._locked or self._waiters:  # type: ignore[attr-defined]  # it may wait
        record: Any = getattr(self, _LOCK_RECORD, None)
        if type(record) is _Site:  # contended: now it is worth a record
            record = _materialize(self, record)
        if record is None:
            return await _LOCK_ACQUIRE(self)
        if _session.active is not None and _std_lock_busy(self):
            # _acquire_may_wait's wait, and _contended's, written out: two coroutines less for
            # every contended acquire
            began = _contention_began(record)
            try:
                await _LOCK_ACQUIRE(self)
            except BaseException as exc:
                _contention_raised(record, began, exc)
                raise
            _contention_ended(record, began)
            return True
        result: Literal[True] = await _acquire_may_wait(
            record, self, _std_lock_busy, _LOCK_ACQUIRE, self
        )
        return result
    self._locked = True  # type: ignore[attr-defined]  # Lock.acquire's fast path
    session = _session.active
    if session is not None:
        record = getattr(self, _LOCK_RECORD, None)
        if type(record) is _Site:  # who holds it, should a waiter come (see _materialize)
            self._asyncflow_holder = _running_call_here()  # type: ignore[attr-defined]
        elif record is not None:
            # _note_hold(record, session), written out: this runs on every `async with`
            try:
                st = record.stats
                now = _clock.now_ns() if st.hold_count >= st.next_hold - 1 else -session.tick
                slot = record.slot
                slot[1] = _running_call_here()  # the call polled on this thread now
                slot[0] = now
            except Exception as err:  # observing never breaks the program
                _broken("recording an acquisition", err)
    return True


async def _std_semaphore_acquire(self: asyncio.Semaphore) -> Literal[True]:
    """``acquire`` of a standard ``asyncio.Semaphore``: its fast path in place."""
    record: ResourceRecord | None = getattr(self, _LOCK_RECORD, None)
    if record is None:  # (a subclass's locked() may differ: asyncio's own method decides)
        return await _SEMAPHORE_ACQUIRE(self)
    if self._value == 0 or self._waiters:  # it may wait
        if _session.active is not None and _std_semaphore_busy(self):
            # _acquire_may_wait's wait, and _contended's, written out: two coroutines less for
            # every contended acquire
            began = _contention_began(record)
            try:
                await _SEMAPHORE_ACQUIRE(self)
            except BaseException as exc:
                _contention_raised(record, began, exc)
                raise
            _contention_ended(record, began)
            return True
        result: Literal[True] = await _acquire_may_wait(
            record, self, _std_semaphore_busy, _SEMAPHORE_ACQUIRE, self
        )
        return result
    self._value -= 1  # Semaphore.acquire's fast path
    session = _session.active
    if session is not None:
        try:
            _note_hold(record, session)
        except Exception as err:
            _broken("recording an acquisition", err)
    return True


def _std_lock_release(self: asyncio.Lock) -> None:
    """``release`` of a standard ``asyncio.Lock`` (or a condition's), in place."""
    if self._locked:  # type: ignore[attr-defined]  # Lock.release
        self._locked = False  # type: ignore[attr-defined]
        if self._waiters:
            self._wake_up_first()  # type: ignore[attr-defined]
    else:
        _LOCK_RELEASE(self)  # its RuntimeError, from its own frame
    if _session.active is None:
        return
    record: Any = getattr(self, _LOCK_RECORD, None)
    if record is None:
        return
    if type(record) is _Site:  # never waited for: counted on its creation site
        record.record.stats.hold_count += 1
        if record.primitive == CONDITION:  # and on itself, for its record (_materialize_condition)
            self._asyncflow_holds = getattr(self, "_asyncflow_holds", 0) + 1  # type: ignore[attr-defined]
        return
    # _note_release(record), written out for a lock: this runs on every `async with`
    try:
        slot = record.slot
        since = slot[0]
        if since is None:
            _unmatched(record.stats)
            return
        call = slot[1]
        slot[0] = slot[1] = None
        st = record.stats
        st.hold_count = count = st.hold_count + 1
        if count >= st.next_hold and since > 0:
            _sample_hold(st, since, call)
    except Exception as err:
        _broken("recording a release", err)


def _std_semaphore_release(self: asyncio.Semaphore) -> None:
    """``release`` of a standard ``asyncio.Semaphore``, in place."""
    self._value += 1  # Semaphore.release
    if self._waiters:
        self._wake_up_next()
    if _session.active is not None:
        record: ResourceRecord | None = getattr(self, _LOCK_RECORD, None)
        if record is not None:
            try:
                _note_release(record)
            except Exception as err:
                _broken("recording a release", err)


_STD_ACQUIRE: dict[int, Callable[..., Any]] = {
    _STD_LOCK: _std_lock_acquire,
    _STD_SEMAPHORE: _std_semaphore_acquire,
}
_STD_RELEASE: dict[int, Callable[..., Any]] = {
    _STD_LOCK: _std_lock_release,
    _STD_SEMAPHORE: _std_semaphore_release,
}


def _lock_hooks(
    record: ResourceRecord, lock: Any, acquire: Callable[[], Any], release: Callable[[], None]
) -> tuple[Callable[[], Any] | None, Callable[[], None] | None]:
    """``acquire``/``release`` for a lock, semaphore or condition whose lock is ``lock``: the
    standard classes' fast paths in place (see _INLINE), anything else through the primitive's
    own methods.

    A standard lock or semaphore (or a condition's) records through the module's functions,
    which find the record on ``lock``: bound to it here, or, while their class has them
    (whole-program mode), through the class: then no hook is made (None), and the primitive
    holds no method of its own that holds it, so that its last reference frees it.
    """
    quick_acquire = _inline_acquire(lock, acquire)
    quick_release = _inline_release(lock, release)
    if quick_acquire == quick_release != _GENERIC and (
        getattr(lock, _LOCK_RECORD, None) in (None, record)
    ):
        object.__setattr__(lock, _LOCK_RECORD, record)
        std_acquire, std_release = _STD_ACQUIRE[quick_acquire], _STD_RELEASE[quick_release]
        if _bound(acquire, std_acquire, lock) and _bound(release, std_release, lock):
            return None, None  # the class's own (whole-program mode)
        return types.MethodType(std_acquire, lock), types.MethodType(std_release, lock)
    busy = _lock_busy(lock)

    async def acquire_hook() -> Any:
        return await _acquire_may_wait(record, lock, busy, acquire)

    def release_hook() -> None:
        release()  # first: one that raises (not acquired, too many times) releases nothing
        if _session.active is not None:
            try:
                _note_release(record)
            except Exception as err:
                _broken("recording a release", err)

    return acquire_hook, release_hook


async def _contended(record: ResourceRecord, acquire: Callable[..., Any], *args: Any) -> Any:
    """An acquisition that waits (``acquire(*args)``): timed from the call to its return (or
    its exception)."""
    began = _contention_began(record)
    try:
        result = await acquire(*args)
    except BaseException as exc:
        _contention_raised(record, began, exc)
        raise
    _contention_ended(record, began)
    return result


#: (since, the waiting task's id, its call) of a contended acquisition under way
_Began = tuple[int, int, "CallRecord | None"]


def _contention_began(record: ResourceRecord) -> _Began:
    """A contended acquisition begins (see _contended; the standard lock's and semaphore's
    hooks await asyncio's acquire between this and _contention_ended themselves: a coroutine
    less for every contended acquire)."""
    since = _clock.now_ns()
    task = _task_for(record)
    call = _call_of(task)
    _wait_began(record.stats, since)
    return since, id(task), call


def _contention_raised(record: ResourceRecord, began: _Began, exc: BaseException) -> None:
    try:
        _waited(record, began[0], _clock.now_ns(), began[2], _outcome(exc))
    except Exception as err:
        _broken("recording a wait", err)


def _contention_ended(record: ResourceRecord, began: _Began) -> None:
    try:
        now = _clock.now_ns()
        since, key, call = began
        record.stats.contended += 1
        _waited(record, since, now, call, ACQUIRED)
        _held(record, now, key, call)
    except Exception as err:
        _broken("recording an acquisition", err)


async def _timed_wait(
    record: ResourceRecord,
    ready: Callable[[], bool] | None,
    on_return: Callable[[Any], None] | None,
    wait: Callable[..., Any],
    *args: Any,
    **kwargs: Any,
) -> Any:
    """``wait(*args, **kwargs)`` timed in full (see _timed_wait_hook)."""
    if _session.active is None:
        return await wait(*args, **kwargs)
    st = record.stats
    try:
        if ready is not None and ready():
            st.immediate += 1
            return await wait(*args, **kwargs)
        since = _clock.now_ns()
        call = _call_for(record)
        _wait_began(st, since)
    except Exception as err:
        _broken("recording a wait", err)
        return await wait(*args, **kwargs)
    try:
        result = await wait(*args, **kwargs)
    except BaseException as exc:
        _wait_raised(record, since, call, exc)
        raise
    try:
        if on_return is not None:
            on_return(result)
    except Exception as err:
        _broken("recording a wait", err)
    _woken(record, since, call)
    return result


def _wait_raised(
    record: ResourceRecord, since: int, call: CallRecord | None, exc: BaseException
) -> None:
    """A timed wait (an event's, a condition's, a barrier's) ended in ``exc``."""
    try:
        outcome = _outcome(exc)
        if outcome == BROKEN:
            record.stats.broken += 1
        _waited(record, since, _clock.now_ns(), call, outcome)
    except Exception as err:
        _broken("recording a wait", err)


def _woken(record: ResourceRecord, since: int, call: CallRecord | None) -> None:
    """A timed wait returned: its task was woken."""
    try:
        record.stats.woken += 1
        _waited(record, since, _clock.now_ns(), call, WOKEN)
    except Exception as err:
        _broken("recording a wait", err)


def _timed_wait_hook(
    record: ResourceRecord,
    wait: Callable[..., Any],
    ready: Callable[[], bool] | None,
    on_return: Callable[[Any], None] | None = None,
) -> Callable[..., Any]:
    """``Event.wait``, ``Condition.wait``, ``Barrier.wait``: each blocking call timed in full.

    ``ready()`` says the call will return at once (an event already set): counted, not timed.
    """

    async def wait_hook(*args: Any, **kwargs: Any) -> Any:
        return await _timed_wait(record, ready, on_return, wait, *args, **kwargs)

    return wait_hook


def _event_wait_hook(
    record: ResourceRecord, event: Any, wait: Callable[[], Any]
) -> Callable[[], Any]:
    """``wait`` of an event whose ``is_set`` and ``wait`` are asyncio's own: a wait on a set
    event is counted, written out in full (and run in place where _INLINE)."""
    if not (_INLINE and _bound(wait, asyncio.Event.wait, event)):

        async def wait_hook() -> Any:
            if event._value:
                if _session.active is not None:
                    record.stats.immediate += 1
                return await wait()
            return await _timed_wait(record, None, None, wait)

        return wait_hook

    async def inline_wait_hook() -> Any:
        if event._value:  # Event.wait's fast path
            if _session.active is not None:
                record.stats.immediate += 1
            return True
        return await _timed_wait(record, None, None, _EVENT_WAIT, event)

    return inline_wait_hook


def _count_signal(record: ResourceRecord, action: str, count: str) -> None:
    """Count and log a set, clear... (a profiler is running)."""
    try:
        st = record.stats
        setattr(st, count, getattr(st, count) + 1)
        _signalled(record, action)
    except Exception as err:
        _broken("recording a signal", err)


def _std_event_signals(
    record: ResourceRecord, event: Any
) -> tuple[Callable[[], None], Callable[[], None]]:
    """``set`` and ``clear`` of an event whose own are asyncio's (3.11 to 3.13)."""

    def set_hook() -> None:
        _EVENT_SET(event)
        if _session.active is not None:
            _count_signal(record, "set", "sets")

    def clear_hook() -> None:
        _EVENT_CLEAR(event)
        if _session.active is not None:
            _count_signal(record, "clear", "clears")

    return set_hook, clear_hook


def _signal_hook(
    record: ResourceRecord, method: Callable[..., _T], action: str, count: str
) -> Callable[..., _T]:
    """``set``, ``clear``, ``notify``...: forwarded, then counted and logged."""

    def signal_hook(*args: Any, **kwargs: Any) -> _T:
        result = method(*args, **kwargs)
        if _session.active is not None:
            _count_signal(record, action, count)
        return result

    return signal_hook


def _async_signal_hook(
    record: ResourceRecord, method: Callable[..., Any], action: str, count: str
) -> Callable[..., Any]:
    """``Barrier.abort`` and ``reset``: counted once they are done."""

    async def signal_hook(*args: Any, **kwargs: Any) -> Any:
        result = await method(*args, **kwargs)
        if _session.active is not None:
            try:
                st = record.stats
                setattr(st, count, getattr(st, count) + 1)
                _signalled(record, action)
            except Exception as err:
                _broken("recording a signal", err)
        return result

    return signal_hook


def _set_hooks(obj: Any, hooks: dict[str, Any]) -> None:
    # Set as attributes, never through vars(obj)[...]: a key stored in the instance dict that
    # way turns its shared-key table into a plain one, and every attribute read then costs more.
    setattr_ = object.__setattr__
    for name, hook in hooks.items():
        setattr_(obj, name, hook)


def _condition_hooks(obj: Any, record: ResourceRecord) -> None:
    """``wait``, ``notify`` and ``notify_all`` of a condition whose class is not asyncio's own
    (or where _INLINE is off): closures around its own methods."""
    in_all = [False]  # 3.11's notify_all() calls self.notify(): count it once

    def notify_all_hook() -> None:
        in_all[0] = True
        try:
            notify_all()
        finally:
            in_all[0] = False
        if _session.active is not None:
            _count_signal(record, "notify_all", "notifies")

    def notify_hook(n: int = 1) -> None:
        notify(n)
        if _session.active is not None and not in_all[0]:
            _count_signal(record, "notify", "notifies")

    notify, notify_all = obj.notify, obj.notify_all
    _set_hooks(
        obj,
        {
            "wait": _timed_wait_hook(record, obj.wait, None),
            "notify": notify_hook,
            "notify_all": notify_all_hook,
        },
    )


async def _std_condition_wait(self: asyncio.Condition) -> Literal[True]:
    """``wait`` of an ``asyncio.Condition``: its wake-ups counted, a sample of them timed.

    A ``notify_all()`` herd runs this for every waiter per notify, so it is written out (no
    _timed_wait, _woken, _waited: a coroutine less is a third of its cost), and, as holds are,
    a wake-up is timed only at the sampling interval: each timed one stands for those since the
    one timed before (``sampled_wait``) in the total, the histogram and the edges, and the others
    read the clock once, when they begin (a wait given up is timed on its own, see _waited).
    """
    record: Any = getattr(self, _LOCK_RECORD, None)
    if type(record) is _Site:  # a wait: now it is worth a record
        record = _materialize(self, record)
    if record is None or _session.active is None:
        return await _CONDITION_WAIT(self)
    try:
        since = _clock.now_ns()
        st = record.stats
        _wait_began(st, since)
    except Exception as err:
        _broken("recording a wait", err)
        return await _CONDITION_WAIT(self)
    try:
        result = await _CONDITION_WAIT(self)
    except BaseException as exc:
        # (a condition's wait runs in a task: the call polled on this thread now is its own)
        _wait_raised(record, since, _running_call_here(), exc)
        raise
    try:
        st.woken += 1
        _wait_over(st, since)
        st.wait_count = count = st.wait_count + 1
        if count >= st.next_wait:
            _wakeup_timed(st, since, count)
    except Exception as err:
        _broken("recording a wait", err)
    return result


def _wakeup_timed(st: ResourceStats, since: int, count: int) -> None:
    """Time a condition's wake-up that ended now (the ``count``-th wait), standing for the
    wake-ups since the one timed before (see _std_condition_wait)."""
    # (the waiting task's own call: see _std_condition_wait)
    _wait_sampled(st, since, _clock.now_ns(), _running_call_here(), count, WOKEN)


def _std_condition_notify(self: asyncio.Condition, n: int = 1) -> None:
    """``notify`` of an ``asyncio.Condition``: counted and logged."""
    _CONDITION_NOTIFY(self, n)
    record: Any = getattr(self, _LOCK_RECORD, None)
    if record is not None and _session.active is not None:
        if type(record) is _Site:  # nobody waited on it yet: counted on its creation site
            _lazy_notify(self, record)
        else:
            _count_signal(record, "notify", "notifies")


def _std_condition_notify_all(self: asyncio.Condition) -> None:
    """``notify_all`` of an ``asyncio.Condition``: counted and logged once."""
    record: Any = getattr(self, _LOCK_RECORD, None)
    if record is None:
        return _CONDITION_NOTIFY_ALL(self)
    # notify_all's own line (3.11 to 3.13), not through self.notify, which would count it again
    _CONDITION_NOTIFY(self, len(self._waiters))
    if _session.active is not None:
        if type(record) is _Site:
            _lazy_notify(self, record)
        else:
            _count_signal(record, "notify_all", "notifies")
    return None


def _lazy_notify(condition: Any, site: _Site) -> None:
    """Count a notify of a condition without a record on its creation site, and on itself: a
    record made for it later takes its own (see _materialize_condition)."""
    site.record.stats.notifies += 1
    condition._asyncflow_notifies = getattr(condition, "_asyncflow_notifies", 0) + 1


_STD_CONDITION: dict[str, Callable[..., Any]] = {
    "wait": _std_condition_wait,
    "notify": _std_condition_notify,
    "notify_all": _std_condition_notify_all,
}


def _bound_condition_hooks(obj: Any) -> dict[str, Any]:
    return {name: types.MethodType(func, obj) for name, func in _STD_CONDITION.items()}


def _instrument_asyncio(obj: Any, record: ResourceRecord) -> None:
    """Install the per-instance hooks of an asyncio primitive (under _instrument_lock)."""
    primitive = record.primitive
    if primitive in (LOCK, SEMAPHORE):
        acquire, release = _lock_hooks(record, obj, obj.acquire, obj.release)
        if acquire is not None and release is not None:
            _set_hooks(obj, {"acquire": acquire, "release": release})
    elif primitive == CONDITION:
        inner = obj._lock
        acquire, release = _lock_hooks(record, inner, obj.acquire, obj.release)
        if acquire is not None and release is not None:
            _set_hooks(obj, {"acquire": acquire, "release": release})
        if getattr(inner, _MARK, None) is None and isinstance(inner, asyncio.Lock):
            # the await chain of a task waiting for the condition's lock names the condition
            object.__setattr__(inner, _MARK, record)
        if _INLINE and type(obj) is asyncio.Condition:
            object.__setattr__(obj, _LOCK_RECORD, record)
            if vars(asyncio.Condition).get("wait") is not _std_condition_wait:
                _set_hooks(obj, _bound_condition_hooks(obj))
            # else the class's own (whole-program mode)
        else:
            _condition_hooks(obj, record)
    elif primitive == EVENT:
        if type(obj) is asyncio.Event and asyncio.Event.__dict__.get(_EVENT_RECORD, 0) is None:
            # whole-program mode: the class's hooks record for it (see _hook_events)
            object.__setattr__(obj, _EVENT_RECORD, record)
            _class_hooked.add(obj)
        else:
            _instance_event_hooks(obj, record)
    elif primitive == BARRIER:

        def passed(index: Any) -> None:
            record.stats.passes += 1

        _set_hooks(
            obj,
            {
                "wait": _timed_wait_hook(record, obj.wait, None, passed),
                "abort": _async_signal_hook(record, obj.abort, "abort", "aborts"),
                "reset": _async_signal_hook(record, obj.reset, "reset", "resets"),
            },
        )
    object.__setattr__(obj, _MARK, record)


def _instance_event_hooks(obj: Any, record: ResourceRecord) -> None:
    """Install an event's per-instance hooks (under _instrument_lock)."""
    cls = type(obj)
    if cls.is_set is asyncio.Event.is_set and cls.wait is asyncio.Event.wait:
        wait = _event_wait_hook(record, obj, obj.wait)
    else:
        wait = _timed_wait_hook(record, obj.wait, obj.is_set)
    if _INLINE and _bound(obj.set, _EVENT_SET, obj) and _bound(obj.clear, _EVENT_CLEAR, obj):
        set_hook, clear_hook = _std_event_signals(record, obj)
    else:
        set_hook = _signal_hook(record, obj.set, "set", "sets")
        clear_hook = _signal_hook(record, obj.clear, "clear", "clears")
    _set_hooks(obj, {"wait": wait, "set": set_hook, "clear": clear_hook})


# In whole-program mode an instrumented asyncio.Event (not a subclass) records through hooks set
# on the class, which find its record on it: per-instance hooks hold the event, which holds them,
# so each event made per request (uvicorn's, the one inside httpcore's anyio Event) was garbage
# for the cyclic collector, whose extra collections cost a FastAPI service some 45 µs a request.
# An event that is not instrumented pays one attribute read (the class's None) per call.

#: the attribute that holds an event's record for the class-level hooks (None on the class).
#: Read with a default: a subclass's per-instance hooks made while the mode is on keep the
#: class-level methods, bound, after it ends (and the class's None is gone).
_EVENT_RECORD = "_asyncflow_event"
#: the events the class-level hooks record for: given per-instance hooks when the mode ends
_class_hooked: weakref.WeakSet[asyncio.Event] = weakref.WeakSet()


async def _class_event_wait(self: asyncio.Event) -> Literal[True]:
    record: Any = getattr(self, _EVENT_RECORD, None)
    if self._value:  # type: ignore[attr-defined]  # Event.wait's fast path
        if record is not None and _session.active is not None:
            (record.record if type(record) is _Site else record).stats.immediate += 1
        return True
    if type(record) is _Site:  # a wait that blocks: now it is worth a record
        record = _materialize(self, record)
    if record is None or _session.active is None:
        return await _EVENT_WAIT(self)
    # _timed_wait, _woken and _waited, written out: events passed back and forth wait thousands
    # of times a second, and a coroutine less is a fifth of what a wait adds. The waiting call
    # is asked for only when the wait is timed: it is the one polled on this thread when the
    # wait ends too (its task is the one that resumes), as for a condition's wake-up.
    try:
        since = _clock.now_ns()
        st = record.stats
        _wait_began(st, since)
    except Exception as err:
        _broken("recording a wait", err)
        return await _EVENT_WAIT(self)
    try:
        result: Literal[True] = await _EVENT_WAIT(self)
    except BaseException as exc:
        _wait_raised(record, since, _call_for(record), exc)
        raise
    try:
        now = _clock.now_ns()
        st.woken += 1
        _wait_over(st, since)
        st.wait_count = count = st.wait_count + 1
        if count >= st.next_wait or now - since > st.wait_max:
            _wait_sampled(st, since, now, _call_for(record), count, WOKEN)
    except Exception as err:
        _broken("recording a wait", err)
    return result


def _class_event_set(self: asyncio.Event) -> None:
    _EVENT_SET(self)
    record: Any = getattr(self, _EVENT_RECORD, None)
    if record is not None and _session.active is not None:
        if type(record) is _Site:  # nobody waited for it yet: counted on its creation site
            record.record.stats.sets += 1
            return
        # _count_signal and _signalled, written out: events passed back and forth are set and
        # cleared thousands of times a second
        try:
            st = record.stats
            st.sets += 1
            st.signal_count = count = st.signal_count + 1
            if count >= st.next_signal:
                _signal_sampled(record, "set", count)
        except Exception as err:
            _broken("recording a signal", err)


def _class_event_clear(self: asyncio.Event) -> None:
    self._value = False  # type: ignore[attr-defined]  # Event.clear (the class's own: _hook_events)
    record: Any = getattr(self, _EVENT_RECORD, None)
    if record is not None and _session.active is not None:
        if type(record) is _Site:
            record.record.stats.clears += 1
            return
        try:  # (as a set's, above)
            st = record.stats
            st.clears += 1
            st.signal_count = count = st.signal_count + 1
            if count >= st.next_signal:
                _signal_sampled(record, "clear", count)
        except Exception as err:
            _broken("recording a signal", err)


_CLASS_EVENT_HOOKS = {
    "wait": _class_event_wait,
    "set": _class_event_set,
    "clear": _class_event_clear,
}
for _name, _hook in _CLASS_EVENT_HOOKS.items():  # as asyncio's own, to a traceback or a reader
    _hook.__name__, _hook.__qualname__ = _name, f"Event.{_name}"
    _hook.__doc__ = getattr(asyncio.Event, _name).__doc__
_futures_module.stand_in(_class_event_wait, _EVENT_WAIT)  # (a task of its own: asyncio's)


def _hook_events() -> bool:
    """Set the class-level hooks on asyncio.Event (whole-program mode begins); False where the
    standard class's methods are not the ones read here (then per-instance hooks, as before)."""
    cls = asyncio.Event
    if not _INLINE or any(
        vars(cls).get(name) is not own
        for name, own in (("wait", _EVENT_WAIT), ("set", _EVENT_SET), ("clear", _EVENT_CLEAR))
    ):
        return False
    setattr(cls, _EVENT_RECORD, None)
    for name, hook in _CLASS_EVENT_HOOKS.items():
        setattr(cls, name, hook)
    return True


def _unhook_events() -> None:
    """asyncio.Event's own methods again (the mode ends); the events instrumented meanwhile
    keep recording, through hooks of their own."""
    cls = asyncio.Event
    for name, own in (("wait", _EVENT_WAIT), ("set", _EVENT_SET), ("clear", _EVENT_CLEAR)):
        setattr(cls, name, own)
    delattr(cls, _EVENT_RECORD)
    for event in list(_class_hooked):
        record = getattr(event, _EVENT_RECORD, None)
        if isinstance(record, ResourceRecord):
            object.__delattr__(event, _EVENT_RECORD)  # (never through vars(): see _set_hooks)
            _instance_event_hooks(event, record)
    _class_hooked.clear()


# In whole-program mode asyncio's Lock and Condition record through the module's functions
# above, set on their classes, as asyncio.Event does: per-instance hooks held the primitive,
# which held them, and every lock made per request was garbage for the cyclic collector. An
# instrumented one keeps its record under _LOCK_RECORD; one that is not pays one attribute read
# (the class's None) when it is acquired or released. A Semaphore keeps its per-instance hooks
# (the same functions, bound): a pool is made once, not per request, and one freed before the
# exit report is read as gone, whose leaked permits the findings then no longer name (the
# connection pool example's "permits never given back" became a contention warning).

#: (class, method name, asyncio's own, the hook)
_CLASS_LOCK_HOOKS: tuple[tuple[type[Any], str, Any, Any], ...] = (
    (asyncio.Lock, "acquire", _LOCK_ACQUIRE, _std_lock_acquire),
    (asyncio.Lock, "release", _LOCK_RELEASE, _std_lock_release),
    (asyncio.Condition, "wait", _CONDITION_WAIT, _std_condition_wait),
    (asyncio.Condition, "notify", _CONDITION_NOTIFY, _std_condition_notify),
    (asyncio.Condition, "notify_all", _CONDITION_NOTIFY_ALL, _std_condition_notify_all),
)


for _cls, _method, _own, _std in _CLASS_LOCK_HOOKS:  # as asyncio's own, to a reader
    _std.__name__, _std.__qualname__ = _method, f"{_cls.__name__}.{_method}"
    _std.__doc__ = _own.__doc__
    _std.__wrapped__ = _own  # the await-chain walk reads it


def _hook_locks() -> bool:
    """Set the class-level hooks on asyncio's Lock and Condition (whole-program mode begins);
    False where their methods are not the ones read here (per-instance hooks then)."""
    if not _INLINE or any(
        vars(cls).get(name) is not own for cls, name, own, _ in _CLASS_LOCK_HOOKS
    ):
        return False
    for cls, name, _, hook in _CLASS_LOCK_HOOKS:
        setattr(cls, name, hook)
    for cls in (asyncio.Lock, asyncio.Condition):
        setattr(cls, _LOCK_RECORD, None)
    return True


def _unhook_locks() -> None:
    """asyncio's own methods again (the mode ends); the primitives instrumented meanwhile keep
    recording, through the same functions bound to each (under _instrument_lock)."""
    for cls, name, own, _ in _CLASS_LOCK_HOOKS:
        setattr(cls, name, own)
    for cls in (asyncio.Lock, asyncio.Condition):
        delattr(cls, _LOCK_RECORD)
    with _lock:
        records = list(_registry.values())
    for record in records:
        obj = record.target()
        if obj is None or getattr(obj, _LOCK_RECORD, None) is not record:
            continue
        if record.primitive == CONDITION:
            if _bound(obj.wait, _CONDITION_WAIT, obj):  # the class's, until now
                _set_hooks(obj, _bound_condition_hooks(obj))
            continue  # (its acquire and release are its lock's, bound when it was made)
        for name, own, std in (
            ("acquire", _LOCK_ACQUIRE, _std_lock_acquire),
            ("release", _LOCK_RELEASE, _std_lock_release),
        ):
            if _bound(getattr(obj, name), own, obj):  # the class's, until now
                object.__setattr__(obj, name, types.MethodType(std, obj))


def _asyncio_primitive(obj: Any) -> tuple[str, float | None, float | None] | None:
    """(family, initial, bound) of an asyncio primitive, or None."""
    if isinstance(obj, asyncio.BoundedSemaphore):
        return SEMAPHORE, obj._value, getattr(obj, "_bound_value", None)
    if isinstance(obj, asyncio.Semaphore):
        return SEMAPHORE, obj._value, None
    if isinstance(obj, asyncio.Lock):
        return LOCK, None, None
    if isinstance(obj, asyncio.Condition):
        return CONDITION, None, None
    if isinstance(obj, asyncio.Event):
        return EVENT, None, None
    if isinstance(obj, asyncio.Barrier):
        return BARRIER, obj.parties, None
    return None


def _kind(obj: Any) -> str:
    cls = type(obj)
    if cls.__module__ == "asyncio.locks":
        return f"asyncio.{cls.__name__}"
    if cls.__module__ == "anyio._backends._asyncio":
        return f"anyio.{cls.__name__}"
    if cls.__module__ == "anyio._core._synchronization":
        return f"anyio.{cls.__name__.removesuffix('Adapter')}"
    return f"{cls.__module__}.{cls.__qualname__}"


# ---------------------------------------------------------------------------------------------
# anyio: its asyncio backend's Lock, Semaphore and CapacityLimiter are its own (slotted, with
# their own waiter queues); its Event is an asyncio.Event inside, instrumented as such.

#: id(anyio primitive) -> its record (or, for a Lock made in whole-program mode and never
#: waited for, its _LazyAnyio); an entry leaves when the primitive is freed
_anyio: dict[int, ResourceRecord | _LazyAnyio] = {}
_anyio_patched = False


class _LazyAnyio(weakref.ref):  # type: ignore[type-arg]
    """An anyio Lock that has only its creation site (see _lazy): the one object it costs,
    which also takes its entry out of _anyio when it is freed, and notes its holder (anyio's
    primitives are slotted: nothing can be set on them)."""

    __slots__ = ("held", "holder", "key", "site")

    key: int
    site: _Site
    #: the call that holds it (noted after its acquire returned: anyio's checkpoint is over)
    holder: CallRecord | None
    held: bool


def _forget_lazy(ref: _LazyAnyio) -> None:  # runs when the lock is freed, in any thread
    if _anyio.get(ref.key) is ref:
        _anyio.pop(ref.key, None)


def _bind(obj: Any, record: ResourceRecord) -> None:
    key = id(obj)
    _anyio[key] = record
    if record._refs is _NO_REFS:  # its first anyio primitive: the sets an anyio record uses
        record._refs = []
        record.pending = set()

    def forget(_: object) -> None:  # runs when obj is freed, in any thread: no lock
        _anyio.pop(key, None)

    record._refs.append(weakref.ref(obj, forget))


#: anyio's modules whose classes are hooked, once the program has loaded them: asyncflow never
#: imports anyio (an import on the program's running loop blocks it, and a program that does
#: not use anyio must not find it in sys.modules)
_ANYIO_SYNC = "anyio._core._synchronization"
_ANYIO_ASYNCIO = "anyio._backends._asyncio"
_ANYIO_NAMES = ("Lock", "Semaphore", "CapacityLimiter", "Event")

_anyio_found: dict[str, Any] | None = None


def _anyio_module_classes(module_name: str, suffix: str = "") -> dict[str, Any]:
    """The four classes of one of anyio's modules, if it is loaded and has the known layout."""
    module = sys.modules.get(module_name)
    found = {f"{n}{suffix}": getattr(module, f"{n}{suffix}", None) for n in _ANYIO_NAMES}
    return {} if any(cls is None for cls in found.values()) else found


def _anyio_adapter_classes() -> dict[str, Any]:
    return _anyio_module_classes(_ANYIO_SYNC, "Adapter")


def _anyio_asyncio_classes() -> dict[str, Any]:
    return _anyio_module_classes(_ANYIO_ASYNCIO)


def _anyio_classes() -> dict[str, Any]:
    """anyio's asyncio backend classes and its adapters (``LockAdapter``...), those of them the
    program has loaded: the adapters come with ``import anyio``, the backend with its first
    use on asyncio."""
    global _anyio_found
    if _anyio_found is not None:
        return _anyio_found
    found = {
        **_anyio_asyncio_classes(),
        **_anyio_adapter_classes(),
    }
    if len(found) == 2 * len(_ANYIO_NAMES):
        _anyio_found = found  # (both loaded: they stay)
    return found


def _patch_anyio() -> None:
    """Wrap the methods of the anyio classes loaded now, each class once (under
    _instrument_lock): the asyncio backend's primitives, and the adapters' getters."""
    _patch_anyio_asyncio()
    _patch_anyio_adapters()


_anyio_adapters_patched = False


def _patch_anyio_adapters() -> bool:
    """An adapter (made outside any event loop) gives its record to the backend primitive it
    makes on first use. False while anyio is not loaded."""
    global _anyio_adapters_patched
    if _anyio_adapters_patched:
        return True
    classes = _anyio_adapter_classes()
    if not classes:
        return False
    for adapter, attr, internal in (
        ("LockAdapter", "_lock", "_internal_lock"),
        ("SemaphoreAdapter", "_semaphore", "_internal_semaphore"),
        ("CapacityLimiterAdapter", "_limiter", "_internal_limiter"),
        ("EventAdapter", "_event", "_internal_event"),
    ):
        cls = classes[adapter]
        prop = cls.__dict__.get(attr)
        if isinstance(prop, property) and prop.fget is not None:
            setattr(cls, attr, property(_adapter_getter(prop.fget, internal)))
    _anyio_adapters_patched = True
    return True


def _patch_anyio_asyncio() -> bool:
    """Wrap the asyncio backend's Lock, Semaphore and CapacityLimiter methods once. False
    while that backend is not loaded."""
    global _anyio_patched
    if _anyio_patched:
        return True
    classes = _anyio_asyncio_classes()
    if not classes:
        return False
    lock, sem, limiter = classes["Lock"], classes["Semaphore"], classes["CapacityLimiter"]

    def lock_busy(obj: Any, key: int) -> bool:
        owner = obj._owner_task
        return (owner is not None or bool(obj._waiters)) and id(owner) != key

    def sem_busy(obj: Any, key: int) -> bool:
        return not (obj._value > 0 and not obj._waiters)

    for cls, busy in ((lock, lock_busy), (sem, sem_busy)):
        cls.acquire = _anyio_acquire(cls.acquire, busy, borrower=False)
        cls.acquire_nowait = _anyio_nowait(cls.acquire_nowait, borrower=False)
        cls.release = _anyio_release(cls.release, borrower=False)

    def limiter_busy(obj: Any, key: int) -> bool:
        borrowers = obj._borrowers
        if any(id(b) == key for b in borrowers):
            return False  # it will raise RuntimeError at once
        return bool(obj._wait_queue) or len(borrowers) >= obj._total_tokens

    for name, hook in (
        ("acquire_on_behalf_of", _anyio_acquire(limiter.acquire_on_behalf_of, limiter_busy, True)),
        ("acquire_on_behalf_of_nowait", _anyio_nowait(limiter.acquire_on_behalf_of_nowait, True)),
        ("release_on_behalf_of", _anyio_release(limiter.release_on_behalf_of, True)),
    ):
        setattr(limiter, name, hook)
    _anyio_patched = True
    return True


# anyio's trio backend: its Lock, Semaphore and CapacityLimiter wrap trio's own (slotted, each
# in a private attribute). trio, like anyio on asyncio, takes ownership and then yields.

_ANYIO_TRIO = "anyio._backends._trio"
_anyio_trio_patched = False


def _anyio_trio_classes() -> dict[str, Any]:
    """anyio's trio backend classes, once the program has loaded that backend, if this anyio
    has the known layout; asyncflow never imports it (nor trio)."""
    module = sys.modules.get(_ANYIO_TRIO)
    names = ("Lock", "Semaphore", "CapacityLimiter")
    found = {name: getattr(module, name, None) for name in names}
    if any(cls is None or not hasattr(cls, f"_{name}__original") for name, cls in found.items()):
        return {}
    return found


def _trio_key(record: ResourceRecord, borrower: Any) -> tuple[int, CallRecord | None]:
    """(holder key, tracked call) on trio: the borrower's id, else the running trio task's."""
    if borrower is None:
        borrower = sys.modules["trio"].lowlevel.current_task()
    return id(borrower), _running_call_here()


def _patch_anyio_trio() -> bool:
    """Wrap anyio's trio backend classes' methods once (under _instrument_lock); False while
    that backend is not loaded (or has another layout)."""
    global _anyio_trio_patched
    if _anyio_trio_patched:
        return True
    classes = _anyio_trio_classes()
    if not classes:
        return False
    lock, sem, limiter = classes["Lock"], classes["Semaphore"], classes["CapacityLimiter"]

    def lock_busy(obj: Any, key: int) -> bool:
        inner = obj._Lock__original
        owner = inner._owner
        return (owner is not None or bool(inner._lot)) and id(owner) != key

    def sem_busy(obj: Any, key: int) -> bool:
        inner = obj._Semaphore__original
        return not (inner._value > 0 and not inner._lot)

    def limiter_busy(obj: Any, key: int) -> bool:
        inner = obj._CapacityLimiter__original
        borrowers = inner._borrowers
        if any(id(b) == key for b in borrowers):
            return False  # it will raise RuntimeError at once
        return bool(inner._lot) or len(borrowers) >= inner._total_tokens

    # anyio's trio CapacityLimiter passes acquire() straight to trio's: both ways are hooked
    by_task = ("acquire", "acquire_nowait", "release")
    by_borrower = ("acquire_on_behalf_of", "acquire_on_behalf_of_nowait", "release_on_behalf_of")
    for cls, busy, (acquire, nowait, release), borrower in (
        (lock, lock_busy, by_task, False),
        (sem, sem_busy, by_task, False),
        (limiter, limiter_busy, by_task, False),
        (limiter, limiter_busy, by_borrower, True),
    ):
        setattr(cls, acquire, _anyio_acquire(getattr(cls, acquire), busy, borrower, _trio_key))
        setattr(cls, nowait, _anyio_nowait(getattr(cls, nowait), borrower, _trio_key))
        setattr(cls, release, _anyio_release(getattr(cls, release), borrower, _trio_key))

    # ``async with`` on it passes straight to trio's limiter too: through the hooked methods
    # instead, as trio's own ``async with`` does (acquire, then release)
    async def __aenter__(self: Any) -> None:
        await self.acquire()

    async def __aexit__(self: Any, *exc_info: object) -> None:
        self.release()

    limiter.__aenter__, limiter.__aexit__ = __aenter__, __aexit__
    _anyio_trio_patched = True
    return True


def _anyio_key(record: ResourceRecord, borrower: Any) -> tuple[int, CallRecord | None]:
    """(holder key, tracked call): the key is the borrower's id, else the running task's."""
    task = _task_for(record)
    if task is None:
        return (0, None) if borrower is None else (id(borrower), None)
    return id(task if borrower is None else borrower), _running_call_here()


def _anyio_acquire(
    original: Callable[..., Any],
    busy: Callable[[Any, int], bool],
    borrower: bool,
    key_of: Callable[[ResourceRecord, Any], tuple[int, CallRecord | None]] | None = None,
) -> Callable[..., Any]:
    key_of = key_of or _anyio_key

    async def acquire(self: Any, *args: Any) -> Any:
        record: Any = _anyio.get(id(self))
        if record is None or _session.active is None:
            return await original(self, *args)
        if type(record) is _LazyAnyio:  # an anyio Lock with its creation site only
            if self._owner_task is None and not self._waiters:  # it will not wait
                result = await original(self, *args)
                _lazy_anyio_held(self, record)
                return result
            record = _materialize_anyio(self, record)  # contended: now it is worth a record
            if record is None:
                return await original(self, *args)
        try:
            key, call = key_of(record, args[0] if borrower else None)
            blocked = busy(self, key)
            # anyio takes ownership, then yields (a checkpoint): the hold begins now. A task
            # blocked behind a lock whose owner is still in its own acquire (that checkpoint,
            # or woken and not yet run) waits on the loop, not on anyone holding the lock,
            # as it would not have waited at all on an asyncio.Lock.
            waits = blocked and (record.match or record.slot[0] is not None)
            yielded = record.yielded
            since = _clock.now_ns()
            if waits:
                _wait_began(record.stats, since)
            record.pending.add(key)
        except Exception as err:
            _broken("reading an anyio primitive's state", err)
            return await original(self, *args)
        try:
            result = await original(self, *args)
        except BaseException as exc:
            record.pending.discard(key)
            if waits:
                try:
                    _waited(record, since, _clock.now_ns(), call, _outcome(exc))
                except Exception as err:
                    _broken("recording a wait", err)
            raise
        record.pending.discard(key)
        try:
            if blocked:  # owned since the release that handed it over, not since it ran
                now = _clock.now_ns()
                handoff = record.handoff_ns
                since_ns, since = since, handoff if since <= handoff <= now else now
                if not waits and record.yielded != yielded:  # behind a hold that awaited
                    waits = True
                    _wait_began(record.stats, since_ns)
                if waits:
                    record.stats.contended += 1
                    _waited(record, since_ns, since, call, ACQUIRED)
            _held(record, since, key, call)
            if not record.match:
                record.held_polls = call.polls if call is not None else -1
        except Exception as err:
            _broken("recording an acquisition", err)
        return result

    acquire.__wrapped__ = original  # type: ignore[attr-defined]  # the walk finds its lock by it
    return acquire


def _anyio_nowait(
    original: Callable[..., Any],
    borrower: bool,
    key_of: Callable[[ResourceRecord, Any], tuple[int, CallRecord | None]] | None = None,
) -> Callable[..., Any]:
    key_of = key_of or _anyio_key

    def acquire_nowait(self: Any, *args: Any) -> Any:
        result = original(self, *args)
        record: Any = _anyio.get(id(self))
        if type(record) is _LazyAnyio:
            if _session.active is not None:
                _lazy_anyio_held(self, record)
        elif record is not None and _session.active is not None:
            try:
                key, call = key_of(record, args[0] if borrower else None)
                if key not in record.pending:  # the blocking acquire's own first try
                    _held(record, _clock.now_ns(), key, call)
                    if not record.match:
                        record.held_polls = call.polls if call is not None else -1
            except Exception as err:
                _broken("recording an acquisition", err)
        return result

    acquire_nowait.__wrapped__ = original  # type: ignore[attr-defined]  # the walk finds its lock by it
    return acquire_nowait


def _anyio_release(
    original: Callable[..., Any],
    borrower: bool,
    key_of: Callable[[ResourceRecord, Any], tuple[int, CallRecord | None]] | None = None,
) -> Callable[..., Any]:
    key_of = key_of or _anyio_key

    def release(self: Any, *args: Any) -> Any:
        result = original(self, *args)
        record: Any = _anyio.get(id(self))
        if type(record) is _LazyAnyio:  # never waited for: counted on its creation site
            if _session.active is not None:
                record.site.record.stats.hold_count += 1
                record.held = False
                record.holder = None
        elif record is not None and _session.active is not None:
            try:
                key, call = (id(args[0]), None) if borrower else key_of(record, None)
                if key not in record.pending:  # an acquire undoing itself (cancelled)
                    if not record.match and _awaited_holding(record, call):
                        record.yielded += 1
                    _released(record, key)
                if record.pending:  # anyio hands it to a waiter now, not when the waiter runs
                    record.handoff_ns = _clock.now_ns()
            except Exception as err:
                _broken("recording a release", err)
        return result

    release.__wrapped__ = original  # type: ignore[attr-defined]  # the walk finds its lock by it
    return release


def _lazy_anyio_held(lock: Any, ref: _LazyAnyio) -> None:
    """A lazy anyio Lock was acquired without waiting: note who holds it; if a waiter gave it
    a record meanwhile (during anyio's checkpoint), the hold opens on that record now."""
    try:
        now: Any = _anyio.get(id(lock))
        if now is ref:
            ref.holder = _running_call_here()
            ref.held = True
        elif type(now) is ResourceRecord:
            key, call = _anyio_key(now, None)
            now.pending.discard(key)
            _held(now, _clock.now_ns(), key, call)
            now.held_polls = call.polls if call is not None else -1
    except Exception as err:  # observing never breaks the program
        _broken("recording an acquisition", err)


def _materialize_anyio(lock: Any, ref: _LazyAnyio) -> ResourceRecord | None:
    """The record of a lazy anyio Lock, made now: a task is about to wait for it (or the mode
    ends, or a view asks). Its holder is the call its uncontended acquire noted; an owner still
    in anyio's checkpoint after taking it holds it from when that acquire returns."""
    try:
        with _instrument_lock:
            existing: Any = _anyio.get(id(lock))
            if type(existing) is ResourceRecord:
                return existing
            site = ref.site
            record = ResourceRecord(
                site.label, site.kind, site.primitive, site.file, site.line, lock
            )
            _bind(lock, record)  # (replaces ref, which goes with its last reference)
            _figures_move(site, record)
            owner = lock._owner_task
            if owner is not None:
                if ref.held:
                    _found_held(record, ref.holder)
                else:  # inside its acquire: as if the hook had seen it begin
                    record.pending.add(id(owner))
            if site.record.folded > 0:  # it folds into the site's record again when gone
                site.record.folded -= 1
            _register(record)
        return record
    except Exception as err:  # observing never breaks the program
        _broken("instrumenting a primitive", err)
        return None


def _awaited_holding(record: ResourceRecord, call: CallRecord | None) -> bool:
    """Whether the hold of an anyio lock that ``call`` releases now spanned an await: its call
    was polled again since the acquisition (an untracked or another call: it may have)."""
    held: CallRecord | None = record.slot[1]
    return held is None or held is not call or held.polls != record.held_polls


def _adapter_getter(fget: Callable[[Any], Any], internal: str) -> Callable[[Any], Any]:
    """An anyio adapter (made outside any event loop) makes its backend primitive on first use:
    that primitive takes the adapter's record."""

    def getter(self: Any) -> Any:
        before = getattr(self, internal)
        result = fget(self)
        if before is None and result is not None:
            record = _anyio.get(id(self))
            if type(record) is ResourceRecord:  # (an adapter is never lazy)
                try:
                    with _instrument_lock:
                        _attach_anyio(result, record)
                except Exception as err:
                    _broken("instrumenting an anyio primitive", err)
        return result

    return getter


def _attach_anyio(obj: Any, record: ResourceRecord) -> None:
    """Make ``obj`` (an anyio backend primitive) record into ``record`` (under the lock)."""
    patched = _patch_anyio_trio() if type(obj).__module__ == _ANYIO_TRIO else _patch_anyio_asyncio()
    if not patched:
        return  # (its class is not one asyncflow knows how to hook)
    if record.primitive == EVENT:
        inner = getattr(obj, "_event", None)  # an asyncio.Event (none on trio: not followed)
        if type(inner) is not asyncio.Event:
            return
        if getattr(inner, _MARK, None) is None:
            _instrument_asyncio(inner, record)
        _bind(obj, record)
    elif id(obj) not in _anyio:
        _bind(obj, record)


def _anyio_primitive(obj: Any) -> tuple[str, float | None, float | None] | None:
    """(family, initial, bound) of an anyio primitive, or None."""
    mod = type(obj).__module__
    if not mod.startswith("anyio."):
        return None
    cls = type(obj)
    for name, family in (
        ("Lock", LOCK),
        ("Semaphore", SEMAPHORE),
        ("CapacityLimiter", LIMITER),
        ("Event", EVENT),
    ):
        if cls is _anyio_class(mod, name) or issubclass(cls, _known_anyio(name)):
            if family == SEMAPHORE:
                return family, obj.value, obj.max_value
            return family, obj.total_tokens if family == LIMITER else None, None
    return None


def _anyio_class(module: str, name: str) -> Any:
    """anyio's class ``name`` in ``module`` (a backend, or the adapters'), if loaded."""
    if module == _ANYIO_SYNC:
        name += "Adapter"
    return getattr(sys.modules.get(module), name, None)


def _known_anyio(name: str) -> tuple[type[Any], ...]:
    """The classes of anyio's primitive ``name`` loaded now: its adapter and its backends'."""
    found = [_anyio_classes().get(name), _anyio_classes().get(f"{name}Adapter")]
    found.append(_anyio_trio_classes().get(name))
    return tuple(cls for cls in found if cls is not None)


def _is_adapter(obj: Any) -> bool:
    return type(obj).__name__.endswith("Adapter") and type(obj).__module__.startswith("anyio.")


# ---------------------------------------------------------------------------------------------
# The public API

_instrument_lock = threading.RLock()  # one object instrumented once, whichever threads ask


def resource_of(obj: Any) -> ResourceRecord | None:
    """The record of an instrumented primitive, or None (cold path: the await-chain walk)."""
    # Never through obj.__dict__: reading it turns the instance's inline attribute values into
    # a dict object on 3.11, and every attribute read of the primitive then costs more.
    record = getattr(obj, _MARK, None)
    if isinstance(record, ResourceRecord):
        return record
    if isinstance(obj, (asyncio.Lock, asyncio.Event, asyncio.Condition)):  # only its site: made now
        site = getattr(obj, _EVENT_RECORD if isinstance(obj, asyncio.Event) else _LOCK_RECORD, None)
        if type(site) is _Site:
            return _materialize(obj, site)
    entry = _anyio.get(id(obj))
    if type(entry) is _LazyAnyio:
        return _materialize_anyio(obj, entry)
    found = entry if type(entry) is ResourceRecord else None
    if (  # anyio's Event recorded on its asyncio.Event (never importing anyio here)
        found is None
        and type(obj).__module__.startswith("anyio.")
        and type(obj) is _anyio_classes().get("Event")
    ):
        inner = getattr(obj, "_event", None)
        found = resource_of(inner) if type(inner) is asyncio.Event else None
        if found is not None:
            with _instrument_lock:
                _bind(obj, found)
    return found


def instrument_lock(obj: _T, *, name: str | None = None) -> _T:
    """Record every acquisition, hold and wait of a synchronisation primitive, in place.

    Args:
        obj: an ``asyncio.Lock``, ``Semaphore``, ``BoundedSemaphore``, ``Condition``,
            ``Event`` or ``Barrier`` (or a subclass), or an anyio ``Lock``, ``Semaphore``,
            ``CapacityLimiter`` or ``Event``.
        name: the resource's label; defaults to its class and id.

    Returns:
        ``obj`` itself, behaving exactly as before. Instrumenting it again changes nothing
        (a ``name`` given then relabels it).

    Raises:
        TypeError: ``obj`` is not one of those primitives, or ``name`` is not a string.
    """
    found = _asyncio_primitive(obj) or _anyio_primitive(obj)
    if found is None:
        raise TypeError(
            "asyncflow.instrument_lock() needs an asyncio Lock, Semaphore, BoundedSemaphore, "
            "Condition, Event or Barrier, or an anyio Lock, Semaphore, CapacityLimiter or "
            f"Event, got {type(obj).__qualname__}: {obj!r}"
        )
    _config.check_type("instrument_lock", "name", name, str, optional=True)
    if _config.disabled():
        return obj
    frame = sys._getframe(1)
    site = (frame.f_code.co_filename, frame.f_lineno)
    _instrument(obj, found, name, site)
    return obj


def _instrument(
    obj: Any,
    found: tuple[str, float | None, float | None],
    name: str | None,
    site: tuple[str, int],
    label: str | None = None,
) -> ResourceRecord:
    with _instrument_lock:
        existing = resource_of(obj)
        if existing is not None:
            if name is not None:
                existing.label = name
            return existing
        primitive, initial, bound = found
        anyio = type(obj).__module__.startswith("anyio.")
        record = ResourceRecord(
            name or label or f"{type(obj).__name__.removesuffix('Adapter')}@{id(obj):x}",
            _kind(obj),
            primitive,
            site[0],
            site[1],
            obj,
            initial,
            bound,
        )
        if not anyio:
            _instrument_asyncio(obj, record)
        else:
            _patch_anyio()
            if _is_adapter(obj):
                _bind(obj, record)
                internal = getattr(obj, _ADAPTER_INTERNAL[record.primitive], None)
                if internal is not None:
                    _attach_anyio(internal, record)
            else:
                _attach_anyio(obj, record)
        _register(record)
        return record


_ADAPTER_INTERNAL = {
    LOCK: "_internal_lock",
    SEMAPHORE: "_internal_semaphore",
    LIMITER: "_internal_limiter",
    EVENT: "_internal_event",
}


class LockInstrumentation:
    """Handle returned by :func:`instrument_locks`; ``undo()`` (or leaving ``with``) restores."""

    __slots__ = ("_on",)

    def __init__(self, on: bool) -> None:
        self._on = on

    @property
    def active(self) -> bool:
        """Whether primitives created now are instrumented through this handle."""
        return self._on

    def undo(self) -> None:
        """Stop instrumenting new primitives, once every handle in use has been undone
        (whole-program mode nests: a program that calls ``instrument_locks()`` itself under
        ``asyncflow run`` shares the mode ``run`` turned on); those already instrumented keep
        recording. Idempotent."""
        with _instrument_lock:
            if not self._on:
                return
            self._on = False
            _whole_program.leave()

    def __enter__(self) -> LockInstrumentation:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.undo()


_ADAPTER_PROPERTIES = frozenset({"_lock", "_semaphore", "_limiter", "_event"})


# A lock or event made per request and used without anyone waiting on it (uvicorn's Event, a
# lock taken once) cost a record of its own: some 8 µs on the program's thread to make it, as
# much again on the profiler's to reap and fold it. In whole-program mode a standard
# asyncio.Lock or Event now gets its record only when something waits on it: a contended
# acquire, or a wait for an event not set. Until then it carries its creation site (one _Site a
# line), whose counting record takes its uses: acquisitions, sets, clears, waits that found it
# set. The site's record is the aggregate the gone records of that line fold into, so the report
# shows one row a line, as before. An uncontended acquire notes its holder on the lock, so that
# a deadlock's or a contention's record, made when the waiter comes, knows who holds it.

#: creation sites kept for primitives without a record of their own; beyond, records as before
LAZY_SITES_KEPT = 1024


class _Site:
    """A creation site of standard locks or events that have no record yet (see above)."""

    __slots__ = ("file", "kind", "label", "line", "made", "primitive", "record")

    def __init__(self, file: str, line: int, label: str, kind: str, primitive: str) -> None:
        self.file = file
        self.line = line
        self.label = label
        self.kind = kind
        self.primitive = primitive
        #: this session's counting record: the aggregate of (label, kind); set by _site_record
        self.record: ResourceRecord
        #: the primitives ever counted on it (one: all it counted is that one's)
        self.made = 0


def _figures_move(site: _Site, record: ResourceRecord) -> None:
    """A primitive of ``site`` gets its own ``record`` now. When it is the only one ever
    counted there, what the site's row counted is its own: the figures move to its record,
    and the site's row, left empty, is not listed (else one lock alive at exit read as two
    rows, the site's with its acquisitions and its own with none)."""
    counting = site.record
    if site.made == 1 and counting.folded == 1 and counting.id in _site_rows:
        _merge(record, counting)
        _fresh_stats(counting)
        st = record.stats  # (untimed: the first of each timed from now stands for itself)
        st.sampled_hold, st.sampled_wait = st.hold_count, st.wait_count
        st.sampled_signal = st.signal_count


#: (file, line, label, class) -> its _Site
_lazy_sites: dict[tuple[str, int, str, type[Any]], _Site] = {}
_site_ids = itertools.count(1)
#: ids of the sites' counting records (this session's)
_site_rows: set[int] = set()
#: the primitives made without a record while the mode is on: each gets one when it ends
_lazy_made: weakref.WeakSet[Any] = weakref.WeakSet()


def _site_record(site: _Site) -> None:
    """Give ``site`` this session's counting record: the aggregate gone records of its label
    fold into (under _lock)."""
    key = (site.label, site.kind)
    record = _history.aggregates.get(key)
    if record is None:
        # numbered apart: the primitives of a line keep their numbers (`deadlock.py:24 #1`)
        record = ResourceRecord(
            site.label,
            site.kind,
            site.primitive,
            site.file,
            site.line,
            None,
            record_id=-next(_site_ids),
        )
        _history.aggregates[key] = record
        _site_rows.add(record.id)
    site.record = record


def _lazy(
    obj: Any, found: tuple[str, float | None, float | None], at: tuple[str, int], label: str
) -> bool:
    """Give a standard lock or event made in whole-program mode its creation site instead of
    a record; False when it gets a record now (another class, or too many sites)."""
    cls = target = type(obj)
    if _anyio_patched and cls is _anyio_classes().get("Lock"):
        attr, carrier = "", obj  # (its hooks are anyio's classes', for good)
    elif cls is asyncio.Lock:
        attr, carrier = _LOCK_RECORD, obj
    elif cls is asyncio.Condition:
        if not _condition_lock_free(obj):
            return False
        attr, carrier = _LOCK_RECORD, obj
    elif cls is asyncio.Event:
        attr, carrier = _EVENT_RECORD, obj
    elif cls.__module__.startswith("anyio.") and cls is _anyio_classes().get("Event"):
        # (asyncio backend) its asyncio.Event carries the site
        attr, carrier, target = _EVENT_RECORD, getattr(obj, "_event", None), asyncio.Event
        if type(carrier) is not asyncio.Event:
            return False
    else:
        return False
    if attr and target.__dict__.get(attr, 0) is not None:  # the class's hooks are not on
        return False
    key = (at[0], at[1], label, cls)
    site = _lazy_sites.get(key)
    if site is None:
        with _lock:
            site = _lazy_sites.get(key)
            if site is None:
                if len(_lazy_sites) >= LAZY_SITES_KEPT:
                    return False
                site = _Site(at[0], at[1], label, _kind(obj), found[0])
                _site_record(site)
                _lazy_sites[key] = site
    if attr:
        _carry(carrier, attr, site)
        return True
    _lazy_anyio(obj, site)
    return True


def _lazy_anyio(lock: Any, site: _Site) -> None:
    """An anyio Lock (made now) takes its creation site instead of a record."""
    ref = _LazyAnyio(lock, _forget_lazy)
    ref.key, ref.site, ref.holder, ref.held = id(lock), site, None, False
    _anyio[ref.key] = ref
    site.record.folded += 1
    site.made += 1


def _condition_lock_free(condition: Any) -> bool:
    """Whether a standard Condition's lock is asyncio's own Lock with nothing of asyncflow's on
    it (the one the Condition made): then it can carry the condition's site (see _carry)."""
    inner = getattr(condition, "_lock", None)
    return (
        type(inner) is asyncio.Lock
        and getattr(inner, _LOCK_RECORD, None) is None
        and getattr(inner, _MARK, None) is None
    )


def _carry(carrier: Any, attr: str, site: _Site) -> None:
    """``carrier`` (made now) carries its creation site instead of a record. A Condition's lock
    carries it too, so that its holds are counted on the site and its first contended acquire
    makes the condition's record (a weak reference leads back to the condition)."""
    object.__setattr__(carrier, attr, site)
    if type(carrier) is asyncio.Condition:
        inner = carrier._lock  # type: ignore[attr-defined]
        object.__setattr__(inner, _LOCK_RECORD, site)
        object.__setattr__(inner, _OWNER, weakref.ref(carrier))
    site.record.folded += 1
    site.made += 1
    _lazy_made.add(carrier)


#: the attribute of a lazy Condition's lock that leads back to the condition (a weak reference:
#: the condition holds its lock)
_OWNER = "_asyncflow_owner"


def _materialize(obj: Any, site: _Site) -> ResourceRecord | None:
    """The record of a lock or event that had only its creation site, made now: something
    waits on it (or the mode ends). A lock held now is held by the call its fast path noted."""
    try:
        with _instrument_lock:
            if site.primitive == CONDITION and type(obj) is asyncio.Lock:  # a condition's lock
                owner = getattr(obj, _OWNER, None)
                obj = owner() if owner is not None else None
                if obj is None:
                    return None
            existing = getattr(obj, _MARK, None)
            if isinstance(existing, ResourceRecord):
                return existing
            record = ResourceRecord(
                site.label, site.kind, site.primitive, site.file, site.line, obj
            )
            if site.primitive == CONDITION:
                _materialize_condition(obj, record)
            elif site.primitive == EVENT:
                object.__setattr__(obj, _EVENT_RECORD, record)
                _class_hooked.add(obj)
            else:
                object.__setattr__(obj, _LOCK_RECORD, record)
                holder = getattr(obj, "_asyncflow_holder", None)
                if holder is not None:
                    object.__delattr__(obj, "_asyncflow_holder")
                if obj._locked:
                    _found_held(record, holder)
            object.__setattr__(obj, _MARK, record)
            if site.primitive != CONDITION:  # (a condition's own counts moved already)
                _figures_move(site, record)
            if site.record.folded > 0:  # it folds into the site's record again when gone
                site.record.folded -= 1
            _register(record)
        _lazy_made.discard(obj)
        return record
    except Exception as err:  # observing never breaks the program
        _broken("instrumenting a primitive", err)
        return None


def _materialize_condition(condition: Any, record: ResourceRecord) -> None:
    """A lazy Condition's record installed as a new one's is (under _instrument_lock); its lock
    held now is held by the call its fast path noted."""
    inner = condition._lock
    holder = getattr(inner, "_asyncflow_holder", None)
    # its uses so far move from its creation site's row to its record (a notify_all() before
    # the first waiter came is one of its signals)
    site = getattr(condition, _LOCK_RECORD)
    holds = getattr(inner, "_asyncflow_holds", 0)
    notifies = getattr(condition, "_asyncflow_notifies", 0)
    if type(site) is _Site:
        site.record.stats.hold_count -= holds
        site.record.stats.notifies -= notifies
    record.stats.hold_count += holds
    record.stats.notifies += notifies
    for obj, name in (
        (inner, "_asyncflow_holder"),
        (inner, _OWNER),
        (inner, "_asyncflow_holds"),
        (condition, "_asyncflow_notifies"),
    ):
        if getattr(obj, name, None) is not None:
            object.__delattr__(obj, name)
    object.__setattr__(inner, _LOCK_RECORD, record)  # (as _lock_hooks finds it: its own)
    _instrument_asyncio(condition, record)
    record.stats.sampled_hold += holds  # (untimed: the first hold timed stands for itself)
    if inner._locked:
        _found_held(record, holder)


def _found_held(record: ResourceRecord, holder: CallRecord | None) -> None:
    """Open the hold of a lock found held as it gets its record: by the call its fast path
    noted, since now at the latest (when it was taken is not known).

    Timed from now, a hold that outlasts its first contention reads at least as long as it
    was seen held: the locks of a deadlock read how long they were stuck, not 0 ns.
    """
    record.slot[1] = holder
    record.slot[0] = _clock.now_ns()


def _materialize_lazy() -> None:
    """Whole-program mode ends: every lock and event still without a record gets one, and
    keeps recording through hooks of its own (under _instrument_lock)."""
    for obj in list(_lazy_made):
        site = getattr(obj, _EVENT_RECORD if isinstance(obj, asyncio.Event) else _LOCK_RECORD, None)
        if type(site) is _Site:
            _materialize(obj, site)
    _lazy_made.clear()
    for ref in [r for r in list(_anyio.values()) if type(r) is _LazyAnyio]:
        lock = ref()
        if lock is not None:
            _materialize_anyio(lock, ref)


#: (code, class) of asyncio's and anyio's lines that make a primitive of that class for their own
#: use (a Condition's lock, anyio's Event's asyncio.Event, twice per anyio.Event()): the walk
#: out to the creator is skipped when the line makes one again
_part_makers: dict[tuple[int, type[Any]], types.CodeType] = {}
_PART_MAKERS_KEPT = 256
# (keyed by the code's id, the code kept as the value and checked: a code object's hash is worked
# out from its contents at every lookup)

#: (id(code), instruction offset, class) of a program's call that made a standard asyncio.Lock
#: or asyncio.Event itself, lazily -> (that code, its _Site): what that call makes next takes the
#: site at once, without the walk out to it and its label (uvicorn makes an Event a request).
#: Emptied when whole-program mode ends (the sites' class-level hooks go then).
_direct_sites: dict[tuple[int, int, type[Any]], tuple[types.CodeType, _Site]] = {}
_DIRECT_SITES_KEPT = 1024

#: The same for anyio's Lock and Event (lazy), made through anyio's constructor chain: (class,
#: id() of the codes of the backend's maker, of its caller and of the program's call, and that
#: call's instruction offset) -> (those codes, its _Site). The chain decides the walk's answer
#: (creation_frame reads only its frames' codes), so the same chain takes the same site; it
#: spares an anyio.Lock() or anyio.Event() made per request the walk, its label and its lookups.
_anyio_sites: dict[tuple[Any, int, int, int, int], tuple[tuple[Any, ...], _Site]] = {}
#: id() of the codes that make anyio's lazy primitives (the backend's create_lock/create_event)
_anyio_makers: set[int] = set()


def _anyio_direct(self: Any, cls: Any, caller: types.FrameType) -> bool:
    """Whether ``self`` (an anyio Lock or Event, just made by ``caller``) took its site from
    _anyio_sites."""
    f1 = caller.f_back
    if f1 is None:
        return False
    f2 = f1.f_back
    if f2 is None:
        return False
    code = caller.f_code
    hit = _anyio_sites.get((cls, id(code), id(f1.f_code), id(f2.f_code), f2.f_lasti))
    if hit is None or hit[0] != (code, f1.f_code, f2.f_code):
        return False
    site = hit[1]
    if site.primitive == EVENT:
        inner = getattr(self, "_event", None)
        if type(inner) is not asyncio.Event or getattr(inner, _EVENT_RECORD, None) is not None:
            return False
        _carry(inner, _EVENT_RECORD, site)
        return True
    if id(self) in _anyio:
        return False
    _lazy_anyio(self, site)
    return True


def _remember_anyio_chain(
    self: Any, cls: Any, caller: types.FrameType, frame: types.FrameType
) -> None:
    """``self`` got its site lazily at ``frame``, two calls out from ``caller``: the next one
    made through the same chain takes it at once (see _anyio_sites)."""
    f1 = caller.f_back
    if f1 is None or f1.f_back is not frame:
        return
    site: Any = _anyio.get(id(self)) if cls is _anyio_classes().get("Lock") else None
    site = site.site if type(site) is _LazyAnyio else getattr(self._event, _EVENT_RECORD, None)
    if type(site) is not _Site:
        return
    if len(_anyio_sites) >= _DIRECT_SITES_KEPT:
        _anyio_sites.clear()
    codes = (caller.f_code, f1.f_code, frame.f_code)
    _anyio_sites[(cls, id(codes[0]), id(codes[1]), id(codes[2]), frame.f_lasti)] = (codes, site)
    _anyio_makers.add(id(caller.f_code))


def _makes_parts(caller: types.FrameType, obj: Any) -> bool:
    """Whether ``caller`` alone decides that ``obj`` is a library's part (see creation_frame):
    asyncio's code, or anyio's outside its chain of constructors, not ``obj``'s own."""
    code = caller.f_code
    filename = code.co_filename
    if not filename.startswith(_ASYNCIO_DIR):
        anyio_dir = _anyio_dir()
        if anyio_dir is None or not filename.startswith(anyio_dir):
            return False
        if code.co_name in _ANYIO_CHAIN and code.co_name != "__init__":
            return False  # on the way out to the program's line
    return not _constructs(code, obj)


def _init_hook(original: Callable[..., None], describe: Callable[[Any], Any]) -> Any:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        before = getattr(self, "_event", None)  # anyio's Event: made, then __init__ again
        original(self, *args, **kwargs)
        try:
            caller = sys._getframe(1)
            code, cls = caller.f_code, type(self)
            if id(code) in _anyio_makers and _anyio_direct(self, cls, caller):
                return
            direct = _direct_sites.get((id(code), caller.f_lasti, cls))
            if direct is not None and direct[0] is code:  # this call made one before
                attr = _EVENT_RECORD if cls is asyncio.Event else _LOCK_RECORD
                # (a new one: not one whose __init__ runs again, see resource_of below)
                if (
                    getattr(self, attr, None) is None
                    and getattr(self, _MARK, None) is None
                    and (cls is not asyncio.Condition or _condition_lock_free(self))
                ):
                    _carry(self, attr, direct[1])  # _lazy, shortened
                    return
            site = getattr(before, _EVENT_RECORD, None)
            if type(site) is _Site:  # its new asyncio.Event carries its site (counted once)
                object.__setattr__(self._event, _EVENT_RECORD, site)
                _lazy_made.add(self._event)
                return
            maker = (id(code), cls)
            if _part_makers.get(maker) is code:
                return
            if type(_anyio.get(id(self))) is _LazyAnyio:  # anyio's Lock: its __init__ again
                return
            existing = resource_of(self)
            if existing is not None:
                if existing.primitive == EVENT and cls.__module__.startswith("anyio."):
                    with _instrument_lock:  # anyio's __init__ ran again: a new asyncio.Event
                        _attach_anyio(self, existing)
                return
            # Where the program made it, and its label there (``file:line``, with the column when
            # the line makes more than one thing, as queues are labelled); None when asyncio or
            # anyio made it for their own use (a Condition's lock, a Barrier's condition, an
            # anyio Event's asyncio.Event...)
            frame = creation_frame(self, caller, library_parts=True)
            if frame is None:
                if _makes_parts(caller, self):
                    if len(_part_makers) >= _PART_MAKERS_KEPT:
                        _part_makers.clear()
                    _part_makers[maker] = code
                return
            at, label = (frame.f_code.co_filename, frame.f_lineno), site_label(frame)
            found = describe(self)
            if found is None:
                return
            if not _lazy(self, found, at, label):
                _instrument(self, found, None, at, label)
            elif frame is not caller and cls.__module__.startswith("anyio."):
                _remember_anyio_chain(self, cls, caller, frame)
            elif frame is caller and cls in (asyncio.Event, asyncio.Lock, asyncio.Condition):
                if len(_direct_sites) >= _DIRECT_SITES_KEPT:
                    _direct_sites.clear()
                attr = _EVENT_RECORD if cls is asyncio.Event else _LOCK_RECORD
                _direct_sites[(id(code), caller.f_lasti, cls)] = (code, getattr(self, attr))
        except Exception as err:
            _broken("instrumenting a new primitive", err)

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    return __init__


def instrument_locks() -> LockInstrumentation:
    """Whole-program mode for primitives: every asyncio (and anyio) lock, semaphore,
    condition, event and barrier created from now on is instrumented, labelled by where it was
    created (``file:line``). Primitives asyncio or anyio make for their own use (a Condition's
    lock, a Barrier's condition) are part of the primitive that made them.

    Calls nest: while one handle is in use, another call (the program's own, under
    ``asyncflow run``) shares the same mode; new primitives are left alone again once every
    handle is undone.

    Returns:
        A handle whose ``undo()`` stops instrumenting new primitives.
    """
    if _config.disabled():
        return LockInstrumentation(False)
    with _instrument_lock:
        _whole_program.enter()
    return LockInstrumentation(True)


def _hook_primitives() -> dict[type[Any], Any]:
    """Instrument every primitive created from now on (under _instrument_lock); returns the
    classes' own __init__ (None: inherited)."""
    originals: dict[type[Any], Any] = {}
    for cls in (
        asyncio.Lock,
        asyncio.Semaphore,
        asyncio.Condition,
        asyncio.Event,
        asyncio.Barrier,
    ):
        originals[cls] = cls.__dict__.get("__init__")
        cls.__init__ = _init_hook(cls.__init__, _asyncio_primitive)  # type: ignore[method-assign]
    _hook_events()
    _hook_locks()
    global _anyio_pending
    _anyio_pending = [
        _imports.after_import(module, _anyio_hooks(originals, patch, classes))
        for module, patch, classes in (
            (_ANYIO_SYNC, _patch_anyio_adapters, _anyio_adapter_classes),
            (_ANYIO_ASYNCIO, _patch_anyio_asyncio, _anyio_asyncio_classes),
            (_ANYIO_TRIO, _patch_anyio_trio, _anyio_trio_classes),
        )
    ]
    return originals


#: cancel the hooks waiting for anyio's modules, while whole-program mode is on
_anyio_pending: list[Callable[[], None]] = []


def _anyio_hooks(
    originals: dict[type[Any], Any],
    patch: Callable[[], bool],
    classes: Callable[[], dict[str, Any]],
) -> Callable[[Any], None]:
    """What hooks one of anyio's modules once the program loads it, in whole-program mode:
    its primitives are instrumented as they are made (asyncflow never imports anyio)."""

    def loaded(_: object) -> None:
        with _instrument_lock:
            if not patch():
                return  # another anyio: its primitives are left alone
            for cls in classes().values():
                if cls not in originals:
                    originals[cls] = cls.__dict__.get("__init__")
                    cls.__init__ = _init_hook(cls.__init__, _anyio_primitive)

    return loaded


def _unhook_primitives(originals: dict[type[Any], Any]) -> None:
    for cancel in _anyio_pending:
        cancel()
    _anyio_pending.clear()
    _direct_sites.clear()
    _anyio_sites.clear()
    _anyio_makers.clear()
    _materialize_lazy()
    if asyncio.Event.__dict__.get(_EVENT_RECORD, 0) is None:
        _unhook_events()
    if asyncio.Lock.__dict__.get(_LOCK_RECORD, 0) is None:
        _unhook_locks()
    for cls, init in originals.items():
        if init is None:  # it had none of its own: inherited again
            del cls.__init__
        else:
            cls.__init__ = init


#: whole-program mode: on while any handle of instrument_locks() is not undone
_whole_program: Nested[dict[type[Any], Any]] = Nested(_hook_primitives, _unhook_primitives)


# ---------------------------------------------------------------------------------------------
# The registry the collector reads (cold path)

_resource_ids = itertools.count(1)
_lock = threading.Lock()
#: resources instrumented and not reaped yet, by id, oldest first
_registry: dict[int, ResourceRecord] = {}


def _register(record: ResourceRecord) -> None:
    _history.register(record)


def resource_registry() -> list[ResourceRecord]:
    """Every resource of the session (a copy): live ones oldest first, then the last gone ones,
    then the aggregates of older gone ones (a creation site's row among them, unless nothing
    was counted on it: its primitives all got records of their own)."""
    return [r for r in _history.listing() if r.folded or not _site_row_empty(r)]


def _site_row_empty(record: ResourceRecord) -> bool:
    """Whether ``record`` is a creation site's counting row with nothing counted on it."""
    if record.id not in _site_rows:
        return False
    st = record.stats
    return not (st.hold_count or st.unmatched or st.sets or st.clears or st.immediate)


def reap(*, collecting: bool = False) -> int:
    """Move the resources that are gone out of the registry, into the bounded history of gone
    resources (see ``_gone.GoneHistory.reap``); returns how many moved."""
    return _history.reap(collecting)


def _retire(record: ResourceRecord) -> None:
    """A reaped resource: the holds still open are abandoned, and nobody waits any more."""
    slot = record.slot
    held = len(record.holds) + record.stats.untracked + (slot[0] is not None)
    record.stats.abandoned += held
    record.holds.clear()
    slot[0] = slot[1] = None
    record.stats.waiting = 0
    record.stats.open_waits.clear()
    record.loop = None


def _record_kind(record: ResourceRecord) -> str:
    return record.kind


def _aggregate(record: ResourceRecord, label: str) -> ResourceRecord:
    same = label == record.label
    return ResourceRecord(
        label,
        record.kind,
        record.primitive,
        record.file if same else "?",
        record.line if same else 0,
        None,
        record.initial,
        record.bound,
    )


def _merge(agg: ResourceRecord, record: ResourceRecord) -> None:
    """Add a gone resource's figures to its aggregate (under _lock)."""
    a, s = agg.stats, record.stats
    _FOLD(a, s)
    for fid, edge in s.edges.items():
        into = a.edges.get(fid)
        if into is None:
            into = a.edges[fid] = ResourceEdge()
        _EDGE_FOLD(into, edge)
    for log_name in ("wait_log", "hold_log", "signal_log"):
        entries = getattr(s, log_name)
        if entries:
            into_log = getattr(a, log_name)
            if into_log is None:
                into_log = deque(maxlen=RESOURCE_LOG_SIZE)
                setattr(a, log_name, into_log)
            into_log.extend(entries)


_history: GoneHistory[ResourceRecord] = GoneHistory(
    _lock,
    _registry,
    other=OTHER_GONE,
    kind=_record_kind,
    aggregate=_aggregate,
    merge=_merge,
    retire=_retire,
)


def reset_for_session() -> None:
    """Give every resource fresh figures and forget those that are gone: a new profiler starts
    from zero. Holds open now stay open (their holders still hold them)."""
    with _lock:
        _history.forget(_fresh_stats)
        _site_rows.clear()
        for site in _lazy_sites.values():  # the aggregates are gone: fresh counting records
            _site_record(site)


def _fresh_stats(record: ResourceRecord) -> None:
    st = record.stats
    waiting, opened = st.waiting, st.open_waits
    st.__init__()  # type: ignore[misc]
    st.waiting = st.max_waiting = waiting
    st.open_waits = opened  # (still waiting: since when stays true)


# ---------------------------------------------------------------------------------------------
# Read models for the views (cold path): typed, so that views never unpack hot-path tuples.


class Hold(NamedTuple):
    """A hold open now."""

    since_ns: int
    call: CallRecord | None


class LogRecord(NamedTuple):
    """One entry of a resource's logs; ``duration_ns`` is None for signals."""

    #: the entry's number among this log's entries since the session started
    position: int
    timestamp_ns: int
    duration_ns: int | None
    call_id: int | None
    future_id: int | None
    #: a wait's outcome, a hold's ``released``, or a signal's action
    outcome: str


class Probe(NamedTuple):
    """The primitive's own state now, read from it."""

    alive: bool
    locked: bool | None
    value: float | None
    is_set: bool | None
    #: tasks in the primitive's own waiter queue now
    queued: int
    broken: bool | None


def acquisitions(record: ResourceRecord) -> int:
    """Successful acquisitions (exact): holds ended, open now, or left open when it was freed."""
    st = record.stats
    open_now = len(record.holds) + st.untracked + (record.slot[0] is not None)
    return st.hold_count + open_now + st.abandoned


def releases(record: ResourceRecord) -> int:
    """Releases (exact), those of holds acquired before it was watched included."""
    st = record.stats
    return st.hold_count + st.unmatched


def holds_of(record: ResourceRecord) -> list[Hold]:
    """The holds open now, oldest first (a copy)."""
    since, call = record.slot  # one read of the pair: it may change under us, never tear
    held = [Hold(abs(since), call)] if since is not None else []  # (negative: to a tick)
    return held + [Hold(abs(since), call) for since, _, call in list(record.holds)]


def logs_of(record: ResourceRecord, which: str) -> list[LogRecord]:
    """One of a resource's logs (``wait``, ``hold`` or ``signal``), oldest first."""
    st = record.stats
    if which == "wait":
        return [LogRecord(*entry) for entry in list(st.wait_log or ())]
    if which == "hold":
        return [
            LogRecord(i, ts, d, cid, fid, "released")
            for i, ts, d, cid, fid in list(st.hold_log or ())
        ]
    if which == "signal":
        return [
            LogRecord(i, ts, None, cid, fid, action)
            for i, ts, cid, fid, action in list(st.signal_log or ())
        ]
    raise ValueError(f"logs_of(which=...) is 'wait', 'hold' or 'signal', got {which!r}")


_GONE = Probe(False, None, None, None, 0, None)


def probe(record: ResourceRecord) -> Probe:
    """Read the primitive's state now (from any thread: a few attribute reads)."""
    obj = record.target()
    if obj is None:
        return _GONE
    try:
        return _probe(record, obj)
    except Exception:  # a primitive in a state we do not know: say only that it is there
        return Probe(True, None, None, None, 0, None)


def _queued(waiters: Any) -> int:
    try:
        return sum(1 for w in list(waiters or ()) if not _done(w))
    except RuntimeError:  # changed size under us
        return len(waiters or ())


def _done(waiter: Any) -> bool:
    fut = waiter[1] if isinstance(waiter, tuple) else waiter
    done = getattr(fut, "done", None)
    return bool(done()) if callable(done) else False


def _probe(record: ResourceRecord, obj: Any) -> Probe:
    primitive = record.primitive
    if type(obj).__module__.startswith("anyio."):
        if _is_adapter(obj):
            inner = getattr(obj, _ADAPTER_INTERNAL[primitive], None)
            if inner is None:
                if primitive == EVENT:
                    return Probe(True, None, None, bool(obj.is_set()), 0, None)
                value = obj.value if primitive == SEMAPHORE else None
                if primitive == LIMITER:
                    value = obj.total_tokens
                return Probe(True, False, value, None, 0, None)
            obj = inner
        if primitive == LOCK:
            return Probe(True, obj._owner_task is not None, None, None, len(obj._waiters), None)
        if primitive == SEMAPHORE:
            return Probe(True, obj._value == 0, obj._value, None, len(obj._waiters), None)
        if primitive == LIMITER:
            free = obj._total_tokens - len(obj._borrowers)
            return Probe(True, free <= 0, free, None, len(obj._wait_queue), None)
        event = obj._event
        return Probe(True, None, None, bool(event._value), _queued(event._waiters), None)
    if primitive == LOCK:
        return Probe(True, bool(obj._locked), None, None, _queued(obj._waiters), None)
    if primitive == SEMAPHORE:
        value = obj._value
        return Probe(True, value == 0, value, None, _queued(obj._waiters), None)
    if primitive == CONDITION:
        lock = obj._lock
        return Probe(True, bool(lock.locked()), None, None, _queued(obj._waiters), None)
    if primitive == EVENT:
        return Probe(True, None, None, bool(obj._value), _queued(obj._waiters), None)
    if primitive == BARRIER:
        return Probe(True, None, float(obj.n_waiting), None, obj.n_waiting, bool(obj.broken))
    return Probe(True, None, None, None, 0, None)
