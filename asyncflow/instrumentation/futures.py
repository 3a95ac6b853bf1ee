"""Recording coroutine calls: ``@future``, ``instrument(coro)`` and whole-program task tracking.

Every tracked call is an :class:`InstrumentedCoroutine` wrapping the user's coroutine. Each poll
(one ``send``/``throw``) reads the clock twice and updates integer counters on the call's record
and one bucket of its future's poll histogram, in place: no event per poll, no allocation on
the common path. A finished call is folded where it finishes into its future's log of recent
calls and call-duration histogram (``fold_call``), or, while a live reporter or a user's
recorder wants every call, appended to the session's bounded buffer for the collector.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import itertools
import os
import sys
import threading
import types
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Coroutine, Generator, Iterable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, overload

from asyncflow import clock as _clock
from asyncflow import config as _config
from asyncflow.instrumentation import _handing, _imports, _raised, _session, loops
from asyncflow.instrumentation._gone import AGGREGATES_KEPT, GONE_KEPT, Fold, GoneHistory, Watch
from asyncflow.stats import SMALL_BUCKET, SMALL_LIMIT, bucket_of, new_histogram

__all__ = [
    "AGGREGATES_KEPT",
    "GONE_KEPT",
    "CallRecord",
    "FutureFunction",
    "FutureRecord",
    "FutureStats",
    "InstrumentedCoroutine",
    "TaskInstrumentation",
    "accelerated",
    "current_task",
    "future",
    "instrument",
    "instrument_tasks",
    "registry",
]

_P = ParamSpec("_P")
_T = TypeVar("_T")

# Call states (docs/architecture.md, "Words"). ``running`` is not stored: a call is running
# while ``start`` is set.
PENDING = "pending"
RUNNING = "running"
SUSPENDED = "suspended"
READY = "ready"
CANCELLED = "cancelled"

# Outcomes of finished calls.
RETURNED = "returned"
RAISED = "raised"
OUTCOME_CANCELLED = "cancelled"
CLOSED = "closed"
NEVER_AWAITED = "never_awaited"
#: what a call's finalizer closes it with after it was polled: counted as closed, and as dropped
DROPPED = "dropped"

_RESULT_REPR_LIMIT = 200

#: makes a future's poll histogram: stats.new_histogram's dict, or the compiled path's own
_new_poll_histogram: Callable[[], MutableMapping[int, int]] = new_histogram


class FutureStats:
    """One session's aggregates for one future. Replaced (not cleared) when a profiler starts,
    so calls left over from an earlier session write into their own, unread, object."""

    __slots__ = (
        "busy_done",
        "call_hist",
        "cancel_raised",
        "cancel_requested",
        "cancel_swallowed",
        "cancelled",
        "closed",
        "created",
        "dropped",
        "error_types",
        "first_call",
        "first_caller",
        "idle_done",
        "live",
        "max_cancel_to_end",
        "max_poll_done",
        "max_sched",
        "never_awaited",
        "poll_hist",
        "polls_done",
        "raised",
        "recent",
        "returned",
        "sched_hist",
        "sched_total",
        "series",
    )

    def __init__(self) -> None:
        self.live: dict[int, CallRecord] = {}  # unfinished calls, by call id
        self.created = 0
        self.returned = 0
        self.raised = 0
        self.cancelled = 0
        self.closed = 0
        #: of those closed: garbage-collected after a poll, never finished (a task that nothing
        #: referenced, destroyed while pending: the loop keeps only a weak reference to a task)
        self.dropped = 0
        self.never_awaited = 0
        # Cancellation requests (a CancelledError thrown into a call) and what came of them.
        self.cancel_requested = 0  # calls that received at least one
        self.cancel_swallowed = 0  # ... and returned normally while their task was cancelling
        self.cancel_raised = 0  # ... and raised something else (TimeoutError, say)
        self.max_cancel_to_end = 0  # the longest time from a call's first request to its end
        self.polls_done = 0  # sums over finished calls; live calls are added at snapshot time
        self.busy_done = 0
        self.idle_done = 0
        self.max_poll_done = 0
        #: the two histograms, a PollHistogram each (counted in C) on the compiled path: the
        #: poll durations, bumped in place by every poll, and the call durations, bumped as
        #: each finished call is folded (fold_call)
        self.poll_hist: MutableMapping[int, int] = _new_poll_histogram()
        self.call_hist: MutableMapping[int, int] = _new_poll_histogram()
        self.recent: Any = None  # deque of recent finished calls, made by the first one folded
        self.series: Any = None  # live calls over time (collector.LiveSeries), owned by it
        #: scheduled time (see _call_soon): the sum and the longest of its calls' waits from a
        #: wake-up handed to the loop to the poll it led to, live calls included, and their
        #: histogram, bumped in place by each such poll
        self.sched_total = 0
        self.max_sched = 0
        self.sched_hist: MutableMapping[int, int] = _new_poll_histogram()
        #: when the session's first call was made (a clock reading); 0: none yet. A service's
        #: first request: what blocked its loop before then held no request up
        self.first_call = 0
        #: the id of the future whose call was polled when that first call was made (its
        #: caller, or its task's maker); 0: none
        self.first_caller = 0
        #: exception type name -> calls that raised it, over the run (bounded: _raised)
        self.error_types: dict[str, int] = {}


#: how a gone future's figures add into its aggregate (every other int field is summed); the
#: compiled FutureStats has the same fields
_FOLD = Fold(
    FutureStats,
    maximum=("max_cancel_to_end", "max_poll_done", "max_sched"),
    histogram=("call_hist", "poll_hist", "sched_hist"),
    # a gone future has no live call; _merge moves recent and adds error_types (bounded)
    left=("live", "recent", "series", "error_types", "first_call", "first_caller"),
)


class FutureRecord:
    """A tracked coroutine definition: identity and labels, plus the current session's stats."""

    __slots__ = (
        "code",
        "file",
        "folded",
        "id",
        "label",
        "line",
        "log_result",
        "owner",
        "source",
        "stats",
        "tracked_by",
    )

    def __init__(
        self, label: str, source: str, file: str, line: int, log_result: bool, tracked_by: str
    ) -> None:
        self.id = next(_future_ids)
        self.label = label
        self.source = source
        self.file = file
        self.line = line
        self.log_result = log_result
        self.tracked_by = tracked_by
        self.stats = _new_stats()
        #: what the future stands for, weakly (a decorated definition's anchor, or the code or
        #: coroutine type of instrumented ones); None when nothing is watched (an aggregate, or
        #: a record made elsewhere): never reaped
        self.owner: Watch | None = None
        #: gone futures whose figures are summed here (an aggregate); 0 for a real definition
        self.folded = 0
        #: a decorated definition's code, weakly: its death ends the future (see _define)
        self.code: weakref.ref[types.CodeType] | None = None

    @property
    def alive(self) -> bool:
        """Whether what the future stands for still exists (never, for an aggregate of gone
        futures; always, when nothing is watched)."""
        owner, code = self.owner, self.code
        return (
            not self.folded
            and (owner is None or owner() is not None)
            and (code is None or code() is not None)
        )


def _watch(record: FutureRecord, owner: object, key: tuple[int, str | None, str] | None) -> None:
    """Watch what ``record`` stands for: when it dies, the ``_by_code`` entry ``key`` goes and
    the future joins the gone history (once its last call has ended)."""
    record.owner = _history.watch(record, owner, key)


#: asyncio's own coroutines (asyncio.run's shutdown steps...): never tracked as user tasks
_ASYNCIO_DIR = os.path.dirname(asyncio.__file__) + os.sep
#: asyncflow's stand-ins for asyncio's coroutine methods (the code of ``resources``'s hook of
#: ``Event.wait``) -> the method's own code: a task running one (``asyncio.wait_for(event.wait(),
#: 5)`` on 3.11 runs the wait in a task of its own) is the method's future, named and placed as
#: asyncio's, never as asyncflow's
_stand_ins: dict[types.CodeType, types.CodeType] = {}


def stand_in(hook: Callable[..., Any], original: Callable[..., Any]) -> None:
    """Say that ``hook`` (asyncflow's) runs in the place of ``original`` (asyncio's)."""
    _stand_ins[hook.__code__] = original.__code__


_future_ids = itertools.count(1)
_call_ids = itertools.count(1)
_registry_lock = threading.Lock()
#: futures whose function or code may still be called, by id, oldest first
_registry: dict[int, FutureRecord] = {}
#: (id of the code object or coroutine type, label, kind) -> future. Keyed by id, not by the
#: object: a code object in a key would never be freed. The owner's weak reference removes the
#: entry when it dies, or for a decorated definition its code's (see _watch and _define).
_by_code: dict[tuple[int, str | None, str], FutureRecord] = {}

#: History kept of futures that are gone (function or code freed, no call left; _history): the
#: last GONE_KEPT as they were, older ones folded into one aggregate per (label, tracked_by), at
#: most AGGREGATES_KEPT of them (then into one "(other gone futures)" aggregate per tracked_by).
OTHER_GONE = "(other gone futures)"
#: recent calls an aggregate keeps in its log (a real future keeps ``recent_logs``)
AGGREGATE_LOG = 10
_GONE_IDS_KEPT = 1024
#: id of a folded future -> its aggregate, so that edges recorded with the old id keep a label
_gone_ids: OrderedDict[int, FutureRecord] = OrderedDict()


def registry() -> list[FutureRecord]:
    """Every future of the session (a copy): live ones oldest first, then the last gone ones,
    then the aggregates of older gone ones."""
    return _history.listing()


def gone_labels() -> dict[int, str]:
    """Labels of recently folded futures by their old id (for edges that still name them)."""
    with _registry_lock:
        return {fid: agg.label for fid, agg in _gone_ids.items()}


class _Anchor:
    """What a decorated definition's future watches: every function decorated with it holds it,
    and so do the last ``DEFINED_KEPT`` definitions decorated. The future lives while either
    does, so a closure decorated each time its factory runs stays one future, and names made
    per call (``name=f"fetch {url}"``) leave no more than that many futures alive."""

    __slots__ = ("__weakref__",)


#: decorated definitions kept (their anchors held) though no function of theirs is alive, the
#: most recently decorated last
DEFINED_KEPT = 256
_defined: OrderedDict[int, _Anchor] = OrderedDict()


def _code_died(watch: Watch, _code: object) -> None:
    _history.died(watch)  # a function made again from other code is another definition


def _define(
    code: types.CodeType, label: str, kind: str, make: Callable[[], FutureRecord]
) -> tuple[FutureRecord, _Anchor]:
    """The future of the definition ``(code, label, kind)`` and its anchor: the one alive, or a
    new one. It ends (joins the gone history) when its anchor dies or its code does."""
    key = (id(code), label, kind)
    _history.reap()  # with no profiler collecting, the registry stays as large as what lives
    with _registry_lock:
        record = _by_code.get(key)
        anchor = record.owner() if record is not None and record.owner is not None else None
        # An entry found is ``code``'s own: a dead code's entry went with it, before its id
        # could be given to another object. Its future may have ended (its anchor dropped).
        if record is None or anchor is None:
            record, anchor = make(), _Anchor()
            _registry[record.id] = record
            _by_code[key] = record
            watch = record.owner = _history.watch(record, anchor, key)
            record.code = weakref.ref(code, functools.partial(_code_died, watch))
        _defined[record.id] = anchor
        _defined.move_to_end(record.id)
        if len(_defined) > DEFINED_KEPT:
            _defined.popitem(last=False)  # its future ends unless a function still holds it
    return record, anchor


def reap(drain: Callable[[], object] | None = None) -> int:
    """Move the futures whose function or code is gone and whose last call has ended out of the
    registry, into the bounded history of gone futures; returns how many moved.

    While a profiler runs, only its collector reaps: it passes ``drain``, which folds the
    finished calls still in the buffer first, so that none is lost. With none running, whoever
    registers or lists futures reaps, so the registry stays as large as what is alive.
    """
    return _history.reap(drain is not None, drain)


def _calls_ended(record: FutureRecord) -> bool:
    # A call retiring takes itself out of ``live`` last: an empty ``live`` means every call's
    # figures are summed (see _retire).
    return not record.stats.live


def _tracked_by(record: FutureRecord) -> str:
    return record.tracked_by


def _aggregate(record: FutureRecord, label: str) -> FutureRecord:
    same = label == record.label
    return FutureRecord(
        label,
        record.source if same else "?",
        record.file if same else "?",
        record.line if same else 0,
        False,
        record.tracked_by,
    )


def _merge(agg: FutureRecord, record: FutureRecord) -> None:
    """Add a gone future's figures to its aggregate (under _registry_lock)."""
    a, s = agg.stats, record.stats
    _FOLD(a, s)
    _raised.merge_types(a.error_types, s.error_types)
    if s.recent:
        if a.recent is None:
            a.recent = deque(maxlen=min(AGGREGATE_LOG, s.recent.maxlen or AGGREGATE_LOG))
        for call in s.recent:  # finished calls: they now belong to the aggregate
            call.future, call.stats, call.hist = agg, a, a.poll_hist
            a.recent.append(call)
    _gone_ids[record.id] = agg
    while len(_gone_ids) > _GONE_IDS_KEPT:
        _gone_ids.popitem(last=False)


def _retire_definition(record: FutureRecord) -> None:
    """A gone decorated definition (its code died) leaves the last ones decorated: its anchor
    would take one of their places for nothing."""
    _defined.pop(record.id, None)


_history: GoneHistory[FutureRecord] = GoneHistory(
    _registry_lock,
    _registry,
    other=OTHER_GONE,
    kind=_tracked_by,
    aggregate=_aggregate,
    merge=_merge,
    retire=_retire_definition,
    final=_calls_ended,
    index=_by_code,
)


def _future_for(
    owner: object, label: str | None, tracked_by: str, make: Callable[[], FutureRecord]
) -> FutureRecord:
    key = (id(owner), label, tracked_by)
    record = _by_code.get(key)
    if record is None:
        with _registry_lock:
            record = _by_code.get(key)
            if record is None:
                record = make()
                _registry[record.id] = record
                _by_code[key] = record
                _watch(record, owner, key)
    return record


def _future_for_code(
    code: types.CodeType, module: str, label: str | None, tracked_by: str
) -> FutureRecord:
    record = _by_code.get((id(code), label, tracked_by))
    if record is not None:
        return record
    return _future_for(
        code,
        label,
        tracked_by,
        lambda: FutureRecord(
            label or code.co_qualname,
            f"{module}:{code.co_qualname}",
            code.co_filename,
            code.co_firstlineno,
            False,
            tracked_by,
        ),
    )


def _future_for_type(cls: type, label: str | None) -> FutureRecord:
    """The future of coroutine objects that have no code object (a C or Cython coroutine)."""
    module = sys.modules.get(cls.__module__)
    return _future_for(
        cls,
        label,
        "instrument",
        lambda: FutureRecord(
            label or cls.__qualname__,
            f"{cls.__module__}:{cls.__qualname__}",
            str(getattr(module, "__file__", None) or "?"),
            0,
            False,
            "instrument",
        ),
    )


class CallRecord:
    """One call's figures. Holds no reference to the coroutine, its arguments or its result."""

    __slots__ = (
        "busy",
        "call_id",
        "cancel_at",
        "cancel_outcome",
        "cancel_requests",
        "cancel_to_end",
        "created",
        "created_code",
        "created_lasti",
        "exc_message",
        "exc_type",
        "finished",
        "first",
        "future",
        "hist",
        "last",
        "max",
        "outcome",
        "parent_call",
        "polls",
        "probe_data",
        "result",
        "sched",
        "start",
        "state",
        "stats",
        "task",
        "woken",
    )

    # Declared, not initialised: set only when they happen (see __init__).
    state: str
    task: str | None
    outcome: str | None
    exc_type: str | None
    exc_message: str | None
    result: str | None
    cancel_requests: int
    cancel_to_end: int
    cancel_outcome: str
    #: for a task's call: the id of the outermost call polled when the task was made (its
    #: creating task's own), set by the task factory; read with call_field (0 or None: none)
    parent_call: int
    #: for a task's call: where the task was made, as the code object and the instruction
    #: offset (f_lasti) of the frame that called create_task (asyncio's own frames left out),
    #: set by the task factory; the line is resolved only when a document is built
    #: (model/waits.py). Read with getattr (unset: unknown)
    created_code: types.CodeType
    created_lasti: int
    #: owned by the poll probe (asyncflow.instrumentation.probes), if one wants to keep figures on
    #: the call itself; never set or read by asyncflow
    probe_data: Any

    def __init__(self, future: FutureRecord, stats: FutureStats, now: int) -> None:
        self.future = future
        self.stats = stats
        self.hist = stats.poll_hist
        self.call_id = call_id = next(_call_ids)
        self.start = 0  # clock reading at the start of the poll in progress; 0 when not running
        self.polls = 0
        self.busy = 0
        self.max = 0
        self.last = 0
        self.created = now
        self.first = 0
        self.finished = 0
        self.cancel_at = 0  # when the first cancellation was thrown into the call; 0 for none
        #: for a task's own call: when the task's wake-up was handed to its loop (call_soon),
        #: until the poll it leads to starts; 0: none pending (see _call_soon)
        self.woken = 0
        self.sched = 0  # the call's scheduled time: the sum of those waits
        # Set only when they happen (read with call_field()): state (once finished), task,
        # outcome, exc_type, exc_message, result, cancel_requests, cancel_to_end and
        # cancel_outcome. Leaving them unset saves ~100 ns per call.
        stats.live[call_id] = self
        stats.created += 1
        if not stats.first_call:
            stats.first_call = now
            stats.first_caller = _polled_future_id()


def call_field(r: CallRecord, name: str) -> Any:
    """A field that is set only when it happens (``task``, ``outcome``...), or None."""
    return getattr(r, name, None)


def call_state(r: CallRecord) -> str:
    """The call's state now; live states are derived, so polls need not store them."""
    if r.finished:
        state: str = r.state
        return state
    if r.start:
        return RUNNING
    return SUSPENDED if r.first else PENDING


if sys.version_info < (3, 12):
    # 3.11's asyncio.current_task() is a Python function; its C-level dict is 3x cheaper.
    _current_tasks: dict[Any, asyncio.Task[Any]] | None = getattr(
        asyncio.tasks, "_current_tasks", None
    )
else:
    _current_tasks = None
_get_running_loop = asyncio.events._get_running_loop


def current_task() -> asyncio.Task[Any] | None:
    """The task running on this thread's loop now; None outside a loop or a task."""
    loop = _get_running_loop()
    if loop is None:  # driven by hand, outside any event loop
        return None
    return _current_tasks.get(loop) if _current_tasks is not None else asyncio.current_task(loop)


def _first_poll(r: CallRecord, t0: int) -> None:
    r.first = t0
    loop = _get_running_loop()
    if loop is None:  # driven by hand, outside any event loop
        return
    if id(loop) != loops.last_key:
        loops.see(loop)
    task = _current_tasks.get(loop) if _current_tasks is not None else asyncio.current_task(loop)
    if task is not None:
        r.task = task.get_name()


# Scheduled waits are often longer than SMALL_LIMIT (a loop with a hundred ready tasks queues
# each for 100 us or more), where bucket_of() costs ~170 ns. Below _MID_LIMIT (~67 ms) the bucket
# is still the table's, shifted: a duration and its value shifted right by _MID_SHIFT bits share
# their top bits, so their buckets differ by _MID_OFFSET (the same power-of-two rows, shifted);
# exact, as tests/instrumentation/test_scheduled.py checks against bucket_of().
_MID_SHIFT = 10
_MID_LIMIT = SMALL_LIMIT << _MID_SHIFT
_MID_OFFSET = bucket_of(SMALL_LIMIT) - SMALL_BUCKET[SMALL_LIMIT >> _MID_SHIFT]


def _scheduled(r: CallRecord, t0: int) -> None:
    """The poll starting at ``t0`` is the one the call's task was woken for: the time since
    its wake-up was handed to the loop is the call's scheduled time (the loop's queueing
    delay). Counted once per wake-up, on the future's figures at once (live calls included)."""
    woken = r.woken
    r.woken = 0
    ns = t0 - woken if t0 > woken else 0
    r.sched += ns
    st = r.stats
    st.sched_total += ns
    if ns > st.max_sched:
        st.max_sched = ns
    st.sched_hist[
        SMALL_BUCKET[ns]
        if ns < SMALL_LIMIT
        else SMALL_BUCKET[ns >> _MID_SHIFT] + _MID_OFFSET
        if ns < _MID_LIMIT
        else bucket_of(ns)
    ] += 1


def _end_poll(r: CallRecord, t0: int) -> int:
    now = _clock.now_ns()
    dt = now - t0
    r.start = 0
    r.polls += 1
    r.busy += dt
    r.last = dt
    if dt > r.max:
        r.max = dt
    r.hist[SMALL_BUCKET[dt] if 0 <= dt < SMALL_LIMIT else bucket_of(dt)] += 1
    return now


def _truncate(text: str) -> str:
    return text if len(text) <= _RESULT_REPR_LIMIT else text[: _RESULT_REPR_LIMIT - 1] + "…"


def _short_repr(value: object) -> str:
    try:
        return _truncate(repr(value))
    except (KeyboardInterrupt, SystemExit):
        raise  # the program's (Ctrl-C while repr() ran): see _finish_poll
    except BaseException as exc:  # the program's repr failed: logged as such, and counted
        _session.internal_error("repr() of a logged result", exc)
        return f"<repr() failed: {type(exc).__name__}>"


def _short_str(exc: BaseException) -> str:
    try:
        return _truncate(str(exc))
    except BaseException as err:
        return f"<str() failed: {type(err).__name__}>"


def _note_raised(r: CallRecord, now: int) -> None:
    """A tracked call raised in a task: the task is remembered (weakly) until someone retrieves
    its exception, for the never-retrieved finding (on the raising path only, never a poll's).
    A tracked task is noted by its own outermost call; a task asyncflow does not track (under
    ``@asyncflow.future`` alone) by each tracked call that raises in it, the outermost last."""
    task = current_task()
    if task is None:
        return
    outer = getattr(task.get_coro(), "_r", None)
    if outer is not None and outer is not r:
        return  # a tracked task's inner call: its exception goes to whoever awaits it
    _raised.note(task, r.future.id, r.call_id, r.exc_type or "", r.exc_message or "", now)


def _finish_poll(r: CallRecord, t0: int, exc: BaseException) -> None:
    """The last poll of a call ended with ``exc`` leaving the coroutine (StopIteration included)."""
    if r.finished:  # e.g. "cannot reuse already awaited coroutine": the call ended before
        return
    interrupted: BaseException | None = None
    try:
        now = _end_poll(r, t0)
        if isinstance(exc, StopIteration):
            r.state = READY
            r.outcome = RETURNED
            r.stats.returned += 1
            if r.future.log_result:
                try:
                    r.result = _short_repr(exc.value)
                except (KeyboardInterrupt, SystemExit) as interrupt:  # while repr() ran
                    _session.internal_error("repr() of a logged result", interrupt)
                    r.result = f"<repr() failed: {type(interrupt).__name__}>"
                    interrupted = interrupt  # the program's: raised once the call is recorded
        elif isinstance(exc, asyncio.CancelledError):
            r.state = CANCELLED
            r.outcome = OUTCOME_CANCELLED
            r.stats.cancelled += 1
        else:
            r.state = READY
            r.outcome = RAISED
            r.stats.raised += 1
            r.exc_type = type(exc).__qualname__
            r.exc_message = _short_str(exc)
            _raised.count_type(r.stats.error_types, r.exc_type)
            _note_raised(r, now)
        if r.cancel_at:
            _after_cancel(r, exc, now)
        _retire(r, now)
    except Exception as err:  # observing never breaks the program
        _session.internal_error("recording a finished call", err)
    if interrupted is not None:
        raise interrupted


#: What became of a call that was asked to cancel (``CallRecord.cancel_outcome``).
CANCEL_HONOURED = "cancelled"  # CancelledError left it: it did cancel
CANCEL_SWALLOWED = "swallowed"  # it returned normally while its task was still cancelling
CANCEL_WITHDRAWN = "withdrawn"  # it returned normally after the request was withdrawn
CANCEL_RAISED = "raised"  # it raised something else (asyncio.timeout's TimeoutError...)


def _cancel_requested(r: CallRecord, now: int) -> None:
    """A CancelledError is being thrown into the call (Task.cancel(), a timeout...)."""
    if not r.cancel_at:
        r.cancel_at = now
        r.cancel_requests = 1
        r.stats.cancel_requested += 1
    else:
        r.cancel_requests += 1


def _after_cancel(r: CallRecord, exc: BaseException, now: int) -> None:
    st = r.stats
    r.cancel_to_end = spent = now - r.cancel_at
    if spent > st.max_cancel_to_end:
        st.max_cancel_to_end = spent
    if isinstance(exc, asyncio.CancelledError):
        r.cancel_outcome = CANCEL_HONOURED
    elif isinstance(exc, StopIteration):
        # A task whose cancellation was caught and not withdrawn (uncancel(), as asyncio.timeout
        # does) still counts it in cancelling(): the call swallowed it.
        task = current_task()
        if task is not None and task.cancelling():
            r.cancel_outcome = CANCEL_SWALLOWED
            st.cancel_swallowed += 1
        else:
            r.cancel_outcome = CANCEL_WITHDRAWN
    else:
        r.cancel_outcome = CANCEL_RAISED
        st.cancel_raised += 1


def _close_record(r: CallRecord, outcome: str) -> None:
    """A call that ends without its coroutine finishing: closed, or garbage-collected."""
    if r.finished:
        return
    r.state = CANCELLED
    r.start = 0
    if outcome == NEVER_AWAITED:
        r.stats.never_awaited += 1
    else:
        r.stats.closed += 1
        if outcome == DROPPED:  # (its finalizer's: a closed call, counted as dropped too)
            r.stats.dropped += 1
            outcome = CLOSED
    r.outcome = outcome
    _retire(r, _clock.now_ns())


def _retire(r: CallRecord, now: int) -> None:
    r.finished = now
    st = r.stats
    st.polls_done += r.polls
    st.busy_done += r.busy
    if r.first:
        st.idle_done += now - r.first - r.busy
    if r.max > st.max_poll_done:
        st.max_poll_done = r.max
    session = _session.active
    try:
        if session is not None:
            keep = session.keep_in_place
            if keep is not None:
                fold_call(r, keep)
            else:
                session.finished.append(r)
                session.appended += 1
    finally:
        # Last, and whatever failed before: once a gone future's ``live`` is empty, the reaper
        # may fold its figures (see reap).
        st.live.pop(r.call_id, None)


def fold_call(r: CallRecord, keep: int) -> bool:
    """Fold one finished call into its future's figures: its duration into ``call_hist``, the
    call into the log of recent calls (``keep`` long, made on first use); False for a call of
    an earlier session, which is not this one's to count.

    Where the call finishes, unless the collector wants every call (``keep_in_place``): a
    record folded at once goes back to the free list as soon as the log drops it, where one
    waiting ~50 ms for the collector survived into the older GC generations, with every call
    of a busy program beside it."""
    st = r.stats
    if st is not r.future.stats:
        return False
    ns = r.finished - r.created
    st.call_hist[SMALL_BUCKET[ns] if 0 <= ns < SMALL_LIMIT else bucket_of(ns)] += 1
    recent = st.recent
    if recent is None:
        # Made before the check: making it may run a collection, a finalizer or another thread
        # that folds a call of this future first. The first log set is the log.
        made: deque[CallRecord] = deque(maxlen=keep)
        with _first_log_lock:
            recent = st.recent
            if recent is None:
                recent = st.recent = made
    recent.append(r)
    return True


#: taken only to set a future's first log of recent calls (reentrant: a signal handler may
#: finish a call on this thread meanwhile)
_first_log_lock = threading.RLock()


def _normalize_throw(typ: Any, val: Any, tb: Any) -> BaseException:
    """The exception a generator would build from the legacy ``throw(type, value, tb)`` form."""
    if isinstance(typ, BaseException):
        exc = typ
    elif isinstance(val, typ):
        exc = val
    elif val is None:
        exc = typ()
    elif isinstance(val, tuple):
        exc = typ(*val)
    else:
        exc = typ(val)
    if tb is not None:
        exc = exc.with_traceback(tb)
    return exc


# ---- the calls being polled on each thread --------------------------------------------------


class _PollSlot:
    """The innermost call being polled on one thread (its wrapper, whose ``_outer`` names the
    call polled around it, and so on out), as the compiled path keeps it in C. A wrapper sent
    into while its own poll runs (from another thread, or by its own coroutine) leaves it alone.

    The blocked-loop monitor reads another thread's slot, and sampled messages and waits this
    thread's, so nobody reads the locals of a running frame: on 3.11 and 3.12 that would leave
    a snapshot of them on the frame, and a snapshot taken while a poll passes its call's
    exception on makes a cycle (exception, traceback, frame, snapshot) that kept the
    coroutine, its code and its caller's locals alive until the cyclic GC ran.
    """

    __slots__ = ("__weakref__", "inner")

    def __init__(self) -> None:
        self.inner: InstrumentedCoroutine[Any] | None = None


#: the most links followed from a thread's innermost call out (deeper than any real program)
WALK_LIMIT = 1_000_000


class _Here(threading.local):
    slot: _PollSlot | None = None


_here = _Here()
_IDLE: Any = object()  # the ``_outer`` of a wrapper not being polled
#: thread id -> that thread's slot, for as long as the thread lives (its local holds it)
_slots: weakref.WeakValueDictionary[int, _PollSlot] = weakref.WeakValueDictionary()


def _polled_future_id() -> int:
    """The id of the future whose call is polled on this thread now (the caller of a call made
    now, or the maker of a task); 0: none. Read once a future, at its first call."""
    slot = _here.slot
    inner = slot.inner if slot is not None else None
    return inner._r.future.id if inner is not None else 0


def _new_slot() -> _PollSlot:
    """This thread's slot, made at its first poll."""
    slot = _here.slot = _PollSlot()
    _slots[threading.get_ident()] = slot
    return slot


def _leave(slot: _PollSlot, w: InstrumentedCoroutine[Any]) -> None:
    """``w``'s poll ended: the slot names the call polled around it again.

    Polls on a thread end in the order opposite to their starts, but for greenlets that switch
    in the middle of one: then ``w`` may be further out in the chain, and is unlinked there.
    """
    outer = w._outer
    w._outer = None  # still claimed: the caller ends the claim (_IDLE) once it is done
    inner = slot.inner
    if inner is w:
        slot.inner = outer
        return
    while inner is not None and inner is not _IDLE:
        if inner._outer is w:
            inner._outer = outer
            return
        inner = inner._outer


def _running_calls_py(thread: int) -> tuple[Any, Any]:
    """The records of the innermost and the outermost calls being polled on ``thread`` now."""
    slot = _slots.get(thread)
    inner = slot.inner if slot is not None else None
    if inner is None:
        return None, None
    outer = inner
    for _ in range(WALK_LIMIT):  # read while that thread runs: a bound, should a link be stale
        nxt = outer._outer
        if nxt is None or nxt is _IDLE:
            break
        outer = nxt
    return inner._r, outer._r


def _running_call_py() -> Any:
    """The record of the innermost call being polled on this thread now, or None."""
    slot = _here.slot
    inner = slot.inner if slot is not None else None
    return inner._r if inner is not None else None


# ---- the per-poll probe seam (asyncflow.instrumentation.probes is its public face) -------------

#: (probe, probe.begin, probe.end) while a poll probe is set, else None: read once per poll
_poll_probe: tuple[Any, Callable[[Any], Any], Callable[..., Any]] | None = None
_PROBE_FAILED = object()  # the token of a begin() that raised: its end() is not called


def set_poll_probe(probe: Any) -> Any:
    """Set (or with None remove) the observer of every poll, on both hot paths; returns the
    previous one. See asyncflow.instrumentation.probes for the contract."""
    global _poll_probe
    previous = _poll_probe[0] if _poll_probe is not None else None
    if probe is None:
        _poll_probe = None
        if _speedups is not None:
            _speedups.set_poll_probe(None, None, None)
        return previous
    begin, end = probe.begin, probe.end
    _poll_probe = (probe, begin, end)
    if _speedups is not None:
        _speedups.set_poll_probe(probe, begin, end)
    return previous


def _probe_failed(probe: Any, err: BaseException) -> None:
    """A probe raised: it is removed (if it is still the one set) and the error counted, once."""
    try:
        if _poll_probe is not None and _poll_probe[0] is probe:
            set_poll_probe(None)
        _session.internal_error("a poll probe (removed)", err)
    except Exception:  # observing never breaks the program
        pass


def _probe_outcome(exc: BaseException) -> str:
    if isinstance(exc, StopIteration):
        return RETURNED
    if isinstance(exc, asyncio.CancelledError):
        return OUTCOME_CANCELLED
    return RAISED


def _probe_end(
    probe: tuple[Any, Any, Any], r: CallRecord, token: Any, t0: int, polls: int, outcome: str
) -> None:
    if token is _PROBE_FAILED:
        return
    # The poll recorded its duration (r.last) unless the call had ended before it.
    dt = r.last if r.polls == polls + 1 else _clock.now_ns() - t0
    try:
        probe[2](r, token, t0, dt, outcome)
    except Exception as err:
        _probe_failed(probe[0], err)


def _probed_poll(w: InstrumentedCoroutine[Any], value: Any, thrown: Any) -> Any:
    """One poll, as InstrumentedCoroutine.send (``thrown`` None) or .throw (``thrown`` its
    arguments) do, between the probe's begin() and end(): outside the timed part."""
    probe = _poll_probe
    r = w._r
    token: Any = _PROBE_FAILED
    if probe is not None:
        try:
            token = probe[1](r)
        except Exception as err:
            _probe_failed(probe[0], err)
    t0 = _clock.now_ns()
    if t0 >= _handing.due:
        _handing.hand_over()
        t0 = _clock.now_ns()
    if r.woken:
        _scheduled(r, t0)
    if not r.first:
        _first_poll(r, t0)
    if thrown is not None:
        typ = thrown[0]
        if isinstance(typ, asyncio.CancelledError) or (
            isinstance(typ, type) and issubclass(typ, asyncio.CancelledError)
        ):
            _cancel_requested(r, t0)
        typ = None
    polls = r.polls
    r.start = t0
    slot = _here.slot or _new_slot()
    w._outer = slot.inner
    slot.inner = w
    try:
        if thrown is None:
            out = w._coro.send(value)
        elif thrown[1] is None and thrown[2] is None:
            out = w._coro.throw(thrown[0])
        else:
            out = w._coro.throw(_normalize_throw(*thrown))
    except BaseException as exc:
        _leave(slot, w)
        _finish_poll(r, t0, exc)
        if probe is not None:
            _probe_end(probe, r, token, t0, polls, _probe_outcome(exc))
        raise
    finally:
        thrown = None  # the thrown exception's traceback holds this frame (see throw)
    _leave(slot, w)
    _end_poll(r, t0)
    if probe is not None:
        _probe_end(probe, r, token, t0, polls, SUSPENDED)
    return out


class InstrumentedCoroutine(Coroutine[Any, Any, _T]):
    """A tracked call: behaves as the coroutine it wraps, and records each poll.

    ``asyncio.Task`` and ``await`` accept it (it is registered as a ``Coroutine``); attributes it
    does not define (``cr_frame``, ``cr_code``, ``__name__``...) are the wrapped coroutine's.
    """

    __slots__ = ("_coro", "_outer", "_r")

    def __init__(self, coro: Coroutine[Any, Any, _T], future: FutureRecord) -> None:
        self._coro = coro
        self._r = CallRecord(future, future.stats, _clock.now_ns())
        #: while polled: the call polled around this one on its thread (see _PollSlot), None
        #: if none is; _IDLE while not polled
        self._outer: Any = _IDLE

    def send(self, value: Any = None) -> Any:
        if self._outer is not _IDLE:  # sent into during its own poll: not a poll of its own
            return self._coro.send(value)
        # Claimed before any other code runs (a probe's begin, the first poll's look-ups), where
        # another thread could send into it meanwhile.
        self._outer = None
        try:
            if _poll_probe is not None:  # the only cost of the probe seam when no probe is set
                return _probed_poll(self, value, None)
            r = self._r
            t0 = _clock.now_ns()
            if t0 >= _handing.due:  # the profiler's thread wants the GIL (_handing)
                _handing.hand_over()
                t0 = _clock.now_ns()
            woken = r.woken
            if woken:  # a task's own call, woken by its loop: _scheduled(r, t0), inlined
                r.woken = 0
                ns = t0 - woken if t0 > woken else 0
                r.sched += ns
                st = r.stats
                st.sched_total += ns
                if ns > st.max_sched:
                    st.max_sched = ns
                st.sched_hist[
                    SMALL_BUCKET[ns]
                    if ns < SMALL_LIMIT
                    else SMALL_BUCKET[ns >> _MID_SHIFT] + _MID_OFFSET
                    if ns < _MID_LIMIT
                    else bucket_of(ns)
                ] += 1
            if not r.first:
                _first_poll(r, t0)
            r.start = t0
            slot = _here.slot or _new_slot()
            self._outer = slot.inner
            slot.inner = self
            try:
                out = self._coro.send(value)
            except BaseException as exc:
                _leave(slot, self)
                _finish_poll(r, t0, exc)
                raise
            if slot.inner is self:  # _leave(slot, self), inlined
                slot.inner = self._outer
            else:
                _leave(slot, self)
            # _end_poll(r, t0), inlined: the hottest line of asyncflow (one call saved ~60 ns)
            dt = _clock.now_ns() - t0
            r.start = 0
            r.polls += 1
            r.busy += dt
            r.last = dt
            if dt > r.max:
                r.max = dt
            r.hist[SMALL_BUCKET[dt] if 0 <= dt < SMALL_LIMIT else bucket_of(dt)] += 1
            return out
        finally:
            self._outer = _IDLE

    # ``await`` drives the iterator with __next__ when it sends None.
    __next__ = send

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        if self._outer is not _IDLE:  # thrown into during its own poll: not a poll of its own
            return (
                self._coro.throw(typ)
                if val is None and tb is None
                else self._coro.throw(_normalize_throw(typ, val, tb))
            )
        self._outer = None  # claimed at once, as in send()
        try:
            if _poll_probe is not None:
                thrown: tuple[Any, Any, Any] | None = (typ, val, tb)
                typ = val = tb = None
                try:
                    return _probed_poll(self, None, thrown)
                finally:
                    thrown = None  # see below: no cycle through this frame's locals
            r = self._r
            t0 = _clock.now_ns()
            if t0 >= _handing.due:
                _handing.hand_over()
                t0 = _clock.now_ns()
            if r.woken:
                _scheduled(r, t0)
            if not r.first:
                _first_poll(r, t0)
            if isinstance(typ, asyncio.CancelledError) or (
                isinstance(typ, type) and issubclass(typ, asyncio.CancelledError)
            ):
                _cancel_requested(r, t0)
            r.start = t0
            slot = _here.slot or _new_slot()
            self._outer = slot.inner
            slot.inner = self
            try:
                if val is None and tb is None:
                    out = self._coro.throw(typ)
                else:
                    out = self._coro.throw(_normalize_throw(typ, val, tb))
            except BaseException as exc:
                _leave(slot, self)
                _finish_poll(r, t0, exc)
                raise
            _leave(slot, self)
            _end_poll(r, t0)
            return out
        finally:
            # The thrown exception's traceback holds this frame: drop our references to it so
            # no cycle keeps the coroutine's locals alive until the cyclic GC runs.
            typ = val = tb = None
            self._outer = _IDLE

    def close(self) -> None:
        if self._outer is not _IDLE:  # closed during its own poll: the coroutine refuses it
            self._coro.close()
            return
        try:
            self._coro.close()
        finally:
            r = self._r
            if not r.finished:
                _close_record(r, CLOSED)

    def __await__(self) -> Generator[Any, None, _T]:
        return self

    def __getattr__(self, name: str) -> Any:
        # cr_frame, cr_code, cr_await, cr_running, __name__, __qualname__... of the real coroutine
        return getattr(self._coro, name)

    @property  # type: ignore[misc]  # (read-only, where object's can be assigned)
    def __class__(self) -> type:
        """The coroutine type, as ``unittest.mock``'s spec makes it: ``isinstance()`` (so
        ``inspect.iscoroutine()``, which httpx's trace extension and trio's threads ask) says of
        the call what it says of the coroutine it wraps; ``type()`` is still this class."""
        return types.CoroutineType

    def __repr__(self) -> str:
        return repr(self._coro)

    def __del__(self) -> None:
        try:
            r = self._r
            if not r.finished:
                _close_record(r, NEVER_AWAITED if not r.first else DROPPED)
        except Exception as err:  # never raise from a finalizer; at shutdown globals may be gone
            if _session is not None:
                _session.internal_error("finalizing a call", err)


def _compiled_base() -> tuple[type, ...]:
    """FutureFunction's first base where the extension is built: its ``FunctionBase``, whose
    instances the compiled path calls straight into C (see the end of this module). Inert while
    the class has its own ``__call__``, the reference."""
    if _config.no_extensions():
        return ()
    try:
        base = importlib.import_module("asyncflow.instrumentation._speedups").FunctionBase
    except (ImportError, AttributeError):  # not built, or built from older sources
        return ()
    return (base,) if isinstance(base, type) else ()


class FutureFunction(*_compiled_base(), Generic[_P, _T]):  # type: ignore[misc]
    """What ``@asyncflow.future`` returns: calls the function and tracks the coroutine it returns.

    It looks like a coroutine function to ``inspect.iscoroutinefunction`` (also on 3.11, where
    there is no marker), binds as a method, pickles by name and keeps the function's metadata.
    """

    # The two attributes every call reads are slots, which the compiled __call__ reads at their
    # offsets; the rest of the function's metadata goes to __dict__ (functools.update_wrapper).
    __slots__ = ("__dict__", "__weakref__", "__wrapped__", "_anchor", "future_record")

    __wrapped__: Callable[_P, Coroutine[Any, Any, _T]]
    future_record: FutureRecord
    #: keeps its definition's future alive (see _define)
    _anchor: _Anchor

    def __init__(self, fn: Callable[_P, Coroutine[Any, Any, _T]], record: FutureRecord) -> None:
        functools.update_wrapper(self, fn)
        inner = fn.func if isinstance(fn, functools.partial) else fn
        # Attributes inspect looks for to treat us as function-like (and read CO_COROUTINE from).
        self.__code__ = inner.__code__
        self.__defaults__ = getattr(inner, "__defaults__", None)
        self.__kwdefaults__ = getattr(inner, "__kwdefaults__", None)
        self.future_record = record

    def __call__(self, *args: _P.args, **kwargs: _P.kwargs) -> Coroutine[Any, Any, _T]:
        coro = self.__wrapped__(*args, **kwargs)
        if _session.active is None:
            return coro  # nobody listens: the call costs one extra function call, no more
        try:
            return InstrumentedCoroutine(coro, self.future_record)
        except BaseException:  # (at the recursion limit): the call fails, as it would plainly
            coro.close()  # and its coroutine, never run, must not warn that it was not awaited
            raise

    def __get__(self, obj: object, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        return types.MethodType(self, obj)

    def __reduce__(self) -> str:
        return str(self.__dict__["__qualname__"])

    def __repr__(self) -> str:
        return f"<asyncflow.future {self.__module__}.{self.__dict__['__qualname__']}>"


@overload
def future(
    fn: Callable[_P, Coroutine[Any, Any, _T]], /
) -> Callable[_P, Coroutine[Any, Any, _T]]: ...
@overload
def future(
    *, name: str | None = None, log_result: bool = False
) -> Callable[[Callable[_P, Coroutine[Any, Any, _T]]], Callable[_P, Coroutine[Any, Any, _T]]]: ...
def future(
    fn: Callable[_P, Coroutine[Any, Any, _T]] | None = None,
    /,
    *,
    name: str | None = None,
    log_result: bool = False,
) -> Any:
    """Track every call of an ``async def`` function. Use bare or as ``@future(name=...)``.

    Args:
        fn: the coroutine function (when used bare).
        name: the future's label; defaults to the function's qualified name.
        log_result: keep a truncated ``repr()`` of each call's return value in its log entry.

    Returns:
        A callable that behaves like ``fn``; with ``ASYNCFLOW_DISABLE=1``, ``fn`` itself.

    Raises:
        TypeError: ``fn`` is not a coroutine function, or an option has the wrong type.
    """
    _config.check_type("future", "name", name, str, optional=True)
    _config.check_type("future", "log_result", log_result, bool)

    def decorate(f: Callable[_P, Coroutine[Any, Any, _T]]) -> Callable[_P, Coroutine[Any, Any, _T]]:
        if isinstance(f, FutureFunction):
            return f  # already tracked: decorating twice must not count every call twice
        if not inspect.iscoroutinefunction(f):
            raise TypeError(
                f"@asyncflow.future needs an 'async def' function, got {f!r}; "
                "for a coroutine object use asyncflow.instrument(coro)"
            )
        if _config.disabled():
            return f
        _accept_tracked_in_anyio()
        inner = inspect.unwrap(f.func if isinstance(f, functools.partial) else f)
        code: types.CodeType = inner.__code__
        qualname = getattr(f, "__qualname__", code.co_qualname)
        label = name or qualname
        source = f"{getattr(f, '__module__', '?')}:{qualname}"
        # One future per definition, not per function object: a closure decorated each time
        # its factory runs is one function in the source, and one row in every view. The
        # definition is the code of the function called (a wrapper's own, so that a wrapper of
        # a tracked function, whose location is the wrapped one's, never adds its calls to the
        # same future), its label, module and name, and whether results are logged.
        called = _called(f)
        kind = f"decorator {source}{' log' if log_result else ''}"
        if isinstance(called, FutureFunction):
            kind += " of a tracked function"
        record, anchor = _define(
            called.__code__ if isinstance(called, types.FunctionType) else code,
            label,
            kind,
            lambda: FutureRecord(
                label, source, code.co_filename, code.co_firstlineno, log_result, "decorator"
            ),
        )
        tracked = FutureFunction(f, record)
        tracked._anchor = anchor
        return tracked

    if fn is None:
        return decorate
    return decorate(fn)


def _called(f: Any) -> Any:
    """What calling ``f`` runs first, through bound methods and partials."""
    while True:
        if isinstance(f, types.MethodType):
            f = f.__func__
        elif isinstance(f, functools.partial):
            f = f.func
        else:
            return f


def instrument(
    coro: Coroutine[Any, Any, _T], *, name: str | None = None
) -> Coroutine[Any, Any, _T]:
    """Track one coroutine object; the result can be awaited or given to ``create_task``.

    Args:
        coro: a coroutine object (what calling an ``async def`` function returns).
        name: the future's label; calls of the same code and name are grouped together.

    Returns:
        The tracked coroutine, or ``coro`` itself when no profiler runs or asyncflow is disabled.

    Raises:
        TypeError: ``coro`` is not a coroutine object.
    """
    if isinstance(coro, InstrumentedCoroutine):
        return coro
    if not asyncio.iscoroutine(coro):
        raise TypeError(
            f"asyncflow.instrument() needs a coroutine object, got {type(coro).__qualname__}: "
            f"{coro!r}; decorate coroutine functions with @asyncflow.future instead"
        )
    _config.check_type("instrument", "name", name, str, optional=True)
    if _session.active is None or _config.disabled():
        return coro
    # Native coroutines, and what else asyncio takes for one: generator-based coroutines
    # (``@types.coroutine``, 3.11's ``_wrap_awaitable``) and objects registered as Coroutine.
    code = getattr(coro, "cr_code", None) or getattr(coro, "gi_code", None)
    if isinstance(code, types.CodeType):
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        module = frame.f_globals.get("__name__", "?") if frame is not None else "?"
        record = _future_for_code(code, str(module), name, "instrument")
    else:
        record = _future_for_type(type(coro), name)
    return InstrumentedCoroutine(coro, record)


#: whole-program mode's include/exclude patterns (an ``asyncflow.filtering.TargetFilter``, set
#: while a profiler with patterns runs): called with a task's coroutine, False leaves it untracked
task_filter: Callable[[Any], bool] | None = None


def install_filter(include: Iterable[str], exclude: Iterable[str]) -> Callable[[Any], bool] | None:
    """Make the task factory consult these patterns (none: track every task); returns the
    filter installed, or None."""
    from asyncflow.filtering import TargetFilter

    global task_filter
    target = TargetFilter(include, exclude)
    task_filter = target if target else None
    return task_filter


def uninstall_filter(target: Callable[[Any], bool] | None) -> None:
    """Stop filtering, if ``target`` is still the filter installed."""
    global task_filter
    if target is not None and task_filter is target:
        task_filter = None


# ---- scheduled time: a task's wake-up, stamped where it is handed to its loop ---------------
#
# asyncio wakes a task by handing its step to the loop: a future it awaits completes and
# schedules the task's wake-up with ``loop.call_soon`` (a sleep's timer does it when it comes
# due, a new task's first step is scheduled so too); the loop runs it when it reaches it in its
# ready queue, and the task polls its coroutine. The time between is the task's scheduled time,
# the loop's queueing delay. While a profiler runs, asyncio's ``call_soon`` stamps that moment
# on the task's own call (when it is tracked: whole-program mode, or a tracked call made a
# task), and the poll it leads to counts the wait (``_scheduled``): a clock read per wake-up,
# no allocation, no done callback. uvloop's loop has its own call_soon, not stamped.

#: asyncio's call_soon, which _call_soon stands in for while a profiler runs (hook_wakes)
_loop_call_soon: Callable[..., Any] = asyncio.BaseEventLoop.call_soon
#: asyncio's tasks: its C Task and the Python one (``_PyTask``, where a version has it)
_TASK_TYPES: tuple[type, ...] = (asyncio.Task, getattr(asyncio.tasks, "_PyTask", asyncio.Task))
_TASK_CLASSES = frozenset(_TASK_TYPES)  # the common case, without isinstance()
#: asyncio's own call_soon, as imported; _call_soon inlines it (out of debug mode) when the
#: method it stands in for is this one, not a program's own
_ASYNCIOS_CALL_SOON = _loop_call_soon
#: asyncio's own ``_check_closed``, as imported: the compiled hook reads ``_closed`` in its
#: place where a loop's class has not put its own
_ASYNCIOS_CHECK_CLOSED: Any = asyncio.BaseEventLoop.__dict__.get("_check_closed")
_asyncios_own = True
#: what stands for it while hooked: _call_soon, or its compiled twin; None before the first hook
_hook: Any = None


def _call_soon(
    self: asyncio.BaseEventLoop, callback: Callable[..., Any], *args: Any, context: Any = None
) -> asyncio.Handle:
    """``asyncio.BaseEventLoop.call_soon`` while a profiler runs: a task's wake-up or first
    step (a method of the task) stamps the moment on the task's call, then asyncio's runs.
    (The compiled path's is a method in C, ``_speedups.wake_hook``, with this behaviour.)"""
    task = getattr(callback, "__self__", None)
    if task.__class__ in _TASK_CLASSES or isinstance(task, _TASK_TYPES):
        coro: Any = getattr(task, "_coro", None)
        # (exact: the wrappers have no subclasses; type(), as their __class__ is the coroutine's)
        tracked = type(coro) in _TRACKED
        if not tracked:  # an untracked task: its first tracked call is its own, as known here
            coro = _awaited_call(coro)
            tracked = coro is not None
        if tracked:
            r = coro._r
            if not r.woken and not r.finished:
                try:
                    r.woken = _clock.now_ns()
                except Exception as err:  # observing never breaks the program (a fake clock)
                    _session.internal_error("stamping a task's wake-up", err)
    if _asyncios_own and not self._debug:  # type: ignore[attr-defined]
        # asyncio's call_soon, inlined: no second frame nor repacking of the arguments (~185
        # ns of the pure-Python path's every wake-up). Out of debug mode it is these two calls
        # (3.11 to 3.13 alike), made through ``self`` so that a loop's overrides still run.
        self._check_closed()  # type: ignore[attr-defined]
        return self._call_soon(callback, args, context)  # type: ignore[attr-defined,no-any-return]
    handle: asyncio.Handle = _loop_call_soon(self, callback, *args, context=context)
    if self._debug:  # type: ignore[attr-defined]  # (the program's line is where, not this)
        where = handle._source_traceback  # type: ignore[attr-defined]
        if where:
            del where[-1]
    return handle


# It stands for asyncio's: a misuse's error names asyncio's method, as it would unprofiled.
_call_soon.__name__, _call_soon.__qualname__ = "call_soon", "BaseEventLoop.call_soon"


#: frames of an untracked task's coroutine followed down to a tracked call it awaits
WAKE_HOPS = 4


def _awaited_call(coro: Any) -> Any:
    """The tracked call an untracked task's suspended coroutine awaits, through at most
    ``WAKE_HOPS`` untracked coroutines and generators (anyio's ``TaskHandle._run_coro``
    awaiting the coroutine given to ``start_soon``, a task filtered out awaiting the program's
    call): the one the task's wake-up resumes. None if there is none that near."""
    for _ in range(WAKE_HOPS):
        kind = type(coro)
        if kind is types.CoroutineType:
            coro = coro.cr_await
        elif kind is types.GeneratorType:
            coro = coro.gi_yieldfrom
        else:
            return None
        if type(coro) in _TRACKED:
            return coro
    return None


def _stamp_woken(coro: Any) -> None:
    """The task whose own call ``coro`` is was just woken: the moment is stamped on the call,
    for its next poll (see _scheduled), unless a wake-up is stamped already or it ended."""
    try:
        r = coro._r
        if not r.woken and not r.finished:
            r.woken = _clock.now_ns()
    except Exception as err:  # observing never breaks the program
        _session.internal_error("stamping a task's wake-up", err)


def hook_wakes() -> None:
    """A profiler starts: asyncio's loops stamp each task's wake-up (see _call_soon)."""
    global _loop_call_soon, _asyncios_own, _hook
    current = asyncio.BaseEventLoop.__dict__.get("call_soon")
    if current is None or current is _hook:
        return
    _loop_call_soon = current
    _asyncios_own = current is _ASYNCIOS_CALL_SOON
    _hook = _call_soon
    if _speedups is not None:
        _hook = _speedups.wake_hook(
            asyncio.BaseEventLoop,
            current,
            _stamp_woken,
            InstrumentedCoroutinePy,
            _ASYNCIOS_CHECK_CLOSED if _asyncios_own else None,
        )
    setattr(asyncio.BaseEventLoop, "call_soon", _hook)  # noqa: B010 (typed apart)


def unhook_wakes() -> None:
    """The profiler stops (idempotent): asyncio's call_soon is asyncio's again, unless the
    program has put its own in its place meanwhile, which stays."""
    if _hook is not None and asyncio.BaseEventLoop.__dict__.get("call_soon") is _hook:
        setattr(asyncio.BaseEventLoop, "call_soon", _loop_call_soon)  # noqa: B010


def _anyio_task_coro(coro: Any) -> Any:
    """anyio 4.14 and later start each task group task from ``TaskHandle._run_coro()``, which
    awaits the coroutine the program gave: that one names the task (else every anyio task
    would be one future, ``TaskHandle._run_coro``). None when it is a tracked call already,
    which tracks itself; the wrapper itself if it holds no plain coroutine."""
    code = coro.cr_code
    if "anyio" not in code.co_filename:
        return coro
    import gc  # (built in: imported once, then a look-up)

    # The handle is the coroutine's ``self``: among what the coroutine holds (its locals), the
    # object whose class's _run_coro this is. Never through ``cr_frame.f_locals``: on 3.11 and
    # 3.12 that stores {'self': handle} on the frame, which the method's own ``del self``
    # cannot clear, and a failed task's exception was then kept by a cycle through it.
    handle = next(
        (
            held
            for held in gc.get_referents(coro)
            if getattr(getattr(type(held), "_run_coro", None), "__code__", None) is code
        ),
        None,
    )
    inner = getattr(handle, "_coro", None)
    if isinstance(inner, _TRACKED):
        return None
    return inner if type(inner) is types.CoroutineType else coro


class _TaskFactory:
    """The task factory ``instrument_tasks`` installs; chains to the one it found."""

    __slots__ = ("__weakref__", "enabled", "previous")

    def __init__(self, previous: Any) -> None:
        self.previous = previous
        self.enabled = True

    def __call__(
        self, loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any
    ) -> asyncio.Future[Any]:
        if self.enabled and _session.active is not None and type(coro) is types.CoroutineType:
            try:
                record = _task_record(coro)
                if record is not None:
                    coro = InstrumentedCoroutine(coro, record)
            except Exception as err:  # observing never breaks the program
                _session.internal_error("instrumenting a task", err)
        if self.enabled and _session.active is not None and type(coro) is InstrumentedCoroutine:
            # the task tree (a coroutine tracked here, or a tracked function's, made before)
            parent = _parent_call()
            if parent and parent != coro._r.call_id:
                coro._r.parent_call = parent
            try:
                _note_creation(coro._r, sys._getframe(1))
            except Exception as err:  # observing never breaks the program
                _session.internal_error("noting where a task was made", err)
        previous = self.previous
        if previous is None:
            made: asyncio.Task[Any] = asyncio.Task(coro, loop=loop, **kwargs)
            created_at = getattr(made, "_source_traceback", None)  # (debug mode's, or None)
            if created_at and created_at[-1].filename == __file__:
                del created_at[-1]  # this frame, as the compiled factory has none
            return made
        task: asyncio.Future[Any] = previous(loop, coro, **kwargs)
        return task


#: asyncio's own files and this one: a task's creation line is the first frame outside them
#: (the program's create_task, not asyncio's, a task group's or gather's, nor the loop's
#: create_task that asyncflow stands in, _CreateTask); prefixes, for str.startswith
_NOT_CREATORS = (os.path.dirname(asyncio.__file__) + os.sep, __file__)
#: frames looked at, at most, for a task's creation line (asyncio's create_task is two deep)
_SITE_WALK = 8


def _note_creation(r: CallRecord, frame: types.FrameType | None) -> None:
    """The task whose call ``r`` is is being made from ``frame`` (the loop's create_task): the
    first frame outside asyncio (and asyncflow's stand-in) is where, kept as its code and
    instruction offset (no line computed, no string made; the frame itself is not kept). The
    compiled factory does this in C (``note_creation``)."""
    for _ in range(_SITE_WALK):
        if frame is None:
            return
        code = frame.f_code
        if not code.co_filename.startswith(_NOT_CREATORS):
            r.created_code = code
            r.created_lasti = frame.f_lasti
            return
        frame = frame.f_back


def _parent_call() -> int:
    """The id of the outermost call polled on this thread now (0: none): where a task is made,
    its creating task's own call. The task tree's one store per task, no frame read."""
    if accelerated:  # the compiled path's slots (its own factory does this in C)
        outer = running_on_thread(threading.get_ident())[1]
        return int(outer.call_id) if outer is not None else 0
    slot = _here.slot
    wrapper = slot.inner if slot is not None else None
    if wrapper is None:
        return 0
    for _ in range(WALK_LIMIT):
        nxt = wrapper._outer
        if nxt is None or nxt is _IDLE:
            break
        wrapper = nxt
    return int(wrapper._r.call_id)


def _task_record(coro: types.CoroutineType[Any, Any, Any]) -> FutureRecord | None:
    """The future a new task's coroutine is tracked under, or None (filtered out, asyncio's
    own). The compiled task factory reads the common case from ``_by_code`` itself."""
    named = coro  # the coroutine whose function names the task
    if coro.cr_code.co_qualname == "TaskHandle._run_coro":
        named = _anyio_task_coro(coro)
    # include/exclude patterns (asyncflow.filtering): decided once per code object
    if named is None or (task_filter is not None and not task_filter(named)):
        return None
    code = named.cr_code
    record = _by_code.get((id(code), None, "task"))
    if record is not None:
        return record
    original = _stand_ins.get(code)
    if original is not None:  # asyncio's method, run by asyncflow's hook: asyncio's future
        return _future_for_code(original, "asyncio", None, "task")
    if not code.co_filename.startswith(_ASYNCIO_DIR):
        frame = named.cr_frame
        module = frame.f_globals.get("__name__", "?") if frame else "?"
        record = _future_for_code(code, str(module), None, "task")
    return record


#: Whether this Python's ``BaseEventLoop.create_task`` names a task factory's unnamed task "None"
#: (None: not asked yet; see _names_unnamed_tasks_none).
_NAMES_UNNAMED_TASKS_NONE: bool | None = None


def _names_unnamed_tasks_none() -> bool:
    """Whether ``BaseEventLoop.create_task`` calls ``set_name(None)`` on the task a task factory
    made for it when it was given no name, naming it "None": 3.13.0 to 3.13.2 do
    (python/cpython#130033); 3.11 and 3.12 name a factory's task only when given a name, and
    3.13.3 and 3.14 hand the factory the name. Asked once of the method itself, with a stand-in
    loop and factory, not of the version number."""
    global _NAMES_UNNAMED_TASKS_NONE
    if _NAMES_UNNAMED_TASKS_NONE is None:
        seen: list[object] = []

        class Made:
            def set_name(self, name: object) -> None:
                seen.append(name)

        class Loop:
            def _check_closed(self) -> None:
                pass

            def _task_factory(self, loop: object, coro: object, **kwargs: Any) -> Made:
                return Made()

        try:
            asyncio.BaseEventLoop.create_task(Loop(), None)  # type: ignore[arg-type]
        except Exception:  # another create_task than any seen: it names nothing "None" itself
            seen = []
        _NAMES_UNNAMED_TASKS_NONE = None in seen
    return _NAMES_UNNAMED_TASKS_NONE


class _CreateTask:
    """A loop's ``create_task`` while asyncflow's task factory is its only one, where asyncio
    would name the factory's unnamed tasks "None" (see _names_unnamed_tasks_none):
    what asyncio does with no factory (the task made with its name, the debug-mode creation
    traceback ending at the caller), the task made by the factory. With any other factory, the
    loop's own method, whose names are then that Python's."""

    __slots__ = ("__weakref__", "loop", "original")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Weak, and the class's function: the loop holds this in its __dict__ (see executors).
        self.loop = weakref.ref(loop)
        self.original = type(loop).create_task

    def __call__(self, coro: Any, *, name: str | None = None, context: Any = None) -> Any:
        loop: Any = self.loop()
        if loop is None:
            raise RuntimeError("create_task() of an event loop that no longer exists")
        factory = loop._task_factory
        if type(factory) is not _TaskFactory or not factory.enabled or factory.previous is not None:
            return self.original(loop, coro, name=name, context=context)
        loop._check_closed()
        # Only the arguments given: the compiled factory's fast path takes (loop, coro) and
        # ``context=``; a name goes to asyncio.Task, which then draws no number.
        task: Any
        if name is None:
            task = factory(loop, coro) if context is None else factory(loop, coro, context=context)
        elif context is None:
            task = factory(loop, coro, name=name)
        else:
            task = factory(loop, coro, name=name, context=context)
        created_at = getattr(task, "_source_traceback", None)
        while created_at and created_at[-1].filename == __file__:
            del created_at[-1]  # (asyncio leaves out its create_task's own frame likewise)
        return task


def _create_task_of(loop: asyncio.AbstractEventLoop) -> _CreateTask | None:
    """The loop's create_task of asyncflow's, if any: read as an attribute, never through
    ``vars(loop)`` (see ``executors._hook_of``)."""
    current = getattr(loop, "create_task", None)
    return current if isinstance(current, _CreateTask) else None


class TaskInstrumentation:
    """Handle returned by :func:`instrument_tasks`; ``undo()`` (or leaving ``with``) restores."""

    __slots__ = ("_factory", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop | None, factory: _TaskFactory | None):
        # Weak: the handle must not keep a closed loop alive (per-loop state dies with the loop).
        self._loop = weakref.ref(loop) if loop is not None else None
        self._factory = factory

    @property
    def active(self) -> bool:
        """Whether tasks created now on the loop are tracked through this handle."""
        factory = self._factory
        return factory is not None and factory.enabled

    def undo(self) -> None:
        """Stop tracking new tasks and put back the task factory that was there before.

        Idempotent. If another factory was installed on top of ours since, ours stays in the
        chain but passes every task through untouched.
        """
        factory, self._factory = self._factory, None
        if factory is None or not factory.enabled:
            return
        factory.enabled = False
        previous = factory.previous
        loop = self._loop() if self._loop is not None else None
        if loop is not None and loop.get_task_factory() is factory:
            loop.set_task_factory(previous)
        if loop is not None and _create_task_of(loop) is not None:
            del loop.create_task  # the class's shows again

    def __enter__(self) -> TaskInstrumentation:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.undo()


def instrument_tasks(loop: asyncio.AbstractEventLoop | None = None) -> TaskInstrumentation:
    """Whole-program mode: track every task created on ``loop`` from now on.

    Calls are grouped into futures by the task's coroutine (its qualified name and location).
    The loop's existing task factory (a user's, or ``asyncio.eager_task_factory``) keeps working:
    asyncflow's factory wraps the coroutine and hands it on.

    Args:
        loop: the event loop; defaults to the running loop.

    Returns:
        A handle whose ``undo()`` restores the previous task factory.

    Raises:
        RuntimeError: no loop was given and none is running.
        TypeError: ``loop`` is not an event loop.
    """
    if loop is None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                "asyncflow.instrument_tasks() was called with no running event loop; call it "
                "from inside a coroutine, or pass loop="
            ) from None
    elif not isinstance(loop, asyncio.AbstractEventLoop):
        raise TypeError(f"asyncflow.instrument_tasks(loop=...) needs an event loop, got {loop!r}")
    elif loop.is_closed():
        raise RuntimeError(
            f"asyncflow.instrument_tasks(loop=...) was given a closed event loop: {loop!r}"
        )
    if _config.disabled():
        return TaskInstrumentation(loop, None)
    current = loop.get_task_factory()
    if isinstance(current, _TaskFactory) and current.enabled:
        # Already tracked: a second handle would count nothing twice; its undo is a no-op.
        return TaskInstrumentation(loop, None)
    factory = _TaskFactory(current)
    loop.set_task_factory(factory)
    if (
        current is None
        and getattr(type(loop), "create_task", None) is asyncio.BaseEventLoop.create_task
        and _create_task_of(loop) is None
        and _names_unnamed_tasks_none()
    ):
        loop.create_task = _CreateTask(loop)  # type: ignore[method-assign]
    loops.see(loop, on_its_thread=loop is _get_running_loop())
    return TaskInstrumentation(loop, factory)


def reset_for_session() -> None:
    """Give every known future fresh stats and forget the gone ones: a new profiler starts
    from zero."""
    with _registry_lock:
        # The last definitions decorated are kept for the profile that decorated them: the
        # next starts with those alive only because a function decorated with them is.
        _defined.clear()
        _history.forget(_fresh_stats)
        _gone_ids.clear()


def _fresh_stats(record: FutureRecord) -> None:
    record.stats = _new_stats()


# The compiled hot path (asyncflow/instrumentation/_speedups.c) takes the place of
# InstrumentedCoroutine and CallRecord where it is built, unless ASYNCFLOW_NO_EXTENSIONS=1: the
# same records, figures and semantics, and it calls back into the helpers above (_first_poll,
# _finish_poll, _cancel_requested, _close_record...) on every path but the common ones. The
# Python classes stay the reference; the test suite runs on both.
InstrumentedCoroutinePy = InstrumentedCoroutine
CallRecordPy = CallRecord
FutureStatsPy = FutureStats
#: whether the compiled hot path records calls (``accelerated`` in /profiler_status)
accelerated = False
#: thread id -> the records of the innermost and outermost calls being polled on that thread
#: now (None, None when none is), from the slots of the path that records calls
running_on_thread: Callable[[int], tuple[Any, Any]] = _running_calls_py
#: the record of the innermost call being polled on the calling thread, or None
running_call_here: Callable[[], Any] = _running_call_py
#: the collector's fold of finished calls, compiled (collector.Collector._fold_finished_py is
#: the reference); None on the pure-Python path
fold_finished: Callable[..., Any] | None = None


def _new_stats() -> FutureStats:
    """A future's fresh figures: counted in C (``_speedups.FutureStats``) while the compiled
    CallRecord records the calls, in Python ints while the Python one does (no extension, or
    benchmarks/run.py's pure-Python column, which swaps CallRecord back for a while)."""
    if CallRecord is CallRecordPy:
        return FutureStatsPy()
    return FutureStats()


def _load_speedups() -> Any:
    if _config.no_extensions():
        return None
    try:
        speedups = importlib.import_module("asyncflow.instrumentation._speedups")
        for name in _SPEEDUPS_NAMES:  # an extension built from older sources lacks some
            getattr(speedups, name)
        speedups.setup(globals(), vars(_clock), vars(_session))
    except (ImportError, RuntimeError, AttributeError):  # not built, or out of step
        return None
    Coroutine.register(speedups.InstrumentedCoroutine)
    Mapping.register(speedups.PollHistogram)
    return speedups


#: what this module takes from the extension (checked before it is set up)
_SPEEDUPS_NAMES = (
    "CallRecord",
    "FutureStats",
    "InstrumentedCoroutine",
    "PollHistogram",
    "FunctionBase",
    "calls_without_method",
    "fold_finished",
    "running_call",
    "running_calls",
    "route_hook",  # (new with wake_hook's fifth argument: an older build lacks it)
    "set_poll_probe",
    "setup",
    "task_factory_call",
)
_py_future_call = FutureFunction.__call__
_py_task_factory_call = _TaskFactory.__call__
_speedups = _load_speedups()
if _speedups is not None:
    accelerated = True
    running_on_thread = _speedups.running_calls
    running_call_here = _speedups.running_call
    fold_finished = _speedups.fold_finished
    _new_poll_histogram = _speedups.PollHistogram
    if not TYPE_CHECKING:
        InstrumentedCoroutine = _speedups.InstrumentedCoroutine
        CallRecord = _speedups.CallRecord
        FutureStats = _speedups.FutureStats  # its counters are C integers
        if issubclass(FutureFunction, _speedups.FunctionBase):  # the same, without a frame
            del FutureFunction.__call__  # (nor a bound method): the base's call, in C
            _speedups.calls_without_method(FutureFunction)
        _TaskFactory.__call__ = _speedups.task_factory_call  # likewise


#: the types of a tracked call: the compiled one where there is one
_TRACKED: tuple[type, ...] = (
    (InstrumentedCoroutinePy, _speedups.InstrumentedCoroutine)
    if _speedups is not None
    else (InstrumentedCoroutinePy,)
)
_ANYIO_BACKEND = "anyio._backends._asyncio"
_anyio_adapted = False


def iscoroutine(obj: object) -> bool:
    """``inspect.iscoroutine``, and true of a tracked call too: it stands for a coroutine."""
    return inspect.iscoroutine(obj) or isinstance(obj, _TRACKED)


def _accept_tracked_in_anyio() -> None:
    """anyio 4.4 to 4.13 start a task group's task only from a native coroutine (their
    ``_spawn`` checks ``inspect.iscoroutine``): ``tg.start_soon(tracked)`` raised TypeError
    where it ran untracked. Once the program imports anyio's asyncio backend (asyncflow never
    does), its check accepts tracked calls too. Asked for by the first ``@asyncflow.future``."""
    global _anyio_adapted
    if not _anyio_adapted:
        _anyio_adapted = True
        _imports.after_import(_ANYIO_BACKEND, _adapt_anyio)


def _adapt_anyio(module: types.ModuleType) -> None:
    if getattr(module, "iscoroutine", None) is inspect.iscoroutine:  # (4.16 has no such check)
        module.iscoroutine = iscoroutine  # type: ignore[attr-defined]
