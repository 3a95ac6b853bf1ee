"""The recording interface: what the mechanism calls, and the collector's implementation of it.

The mechanism (``@measure``, ``measure_block``, the metric handles of
:mod:`asyncflow.instrumentation.values`) decides *what* happened and *when*: it reads the clock,
keeps nesting and recursion per thread of control, and then calls a :class:`Recorder` with one
finished span or one metric update. The recorder is the policy: what to keep. asyncflow's own
recorder, :data:`COLLECTOR`, folds them into the calling thread's shard (no lock; the ``functions``
and ``metrics`` documents sum the shards on the cold side); a user's recorder, added with
:func:`add_recorder`, receives the same calls and may route them anywhere (a tracing system, a log,
a test). Two methods are called on the thread where the event happened, inline:

(For speed the mechanism does what :data:`COLLECTOR` does inline, without the call through it,
and calls the users' recorders only when there are some: ``to_users_span``/``to_users_metric``.)

``span(site, start_ns, end_ns, child_ns, error)``
    one measured call or block finished (for recursion, only the outermost call).
``metric(metric, op, value, at_ns)``
    one update of a counter, gauge, histogram or value log.

and a third, for the tracked calls of futures, by the collector:

``call(call)``
    one call of a tracked future ended (a :class:`FinishedCall`: its start
    and end, outcome, error, busy time and polls).

The coroutine wrappers count into a record of the call in place (in C where compiled: a call
through a Python method per call would cost more than all the rest of their work), and hand the
finished record to the collector's buffer; the collector folds it, then gives it to the users'
recorders, on the profiler's thread, within one drain (50 ms) of the call's end, oldest first,
while a profiler runs. Those calls are the spans asyncflow records; the other hooks keep only
counts and aggregates in place (a channel's sent/received counters and sampled delays, a
resource's waits and holds, a loop's lag), which the documents and the live reporters read.

The live reporters of the exports (Prometheus, OpenTelemetry, issue 15) sit *downstream* of the
collector: they read each collector tick's figures on the profiler's thread. A recorder sits
*upstream*: it sees every event as it happens, on the program's threads, so it must be cheap and
must not block.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import weakref
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from asyncflow import _forksafe
from asyncflow import stats as _stats
from asyncflow.instrumentation import _session

if TYPE_CHECKING:
    from asyncflow.schema import Location

__all__ = [
    "COLLECTOR",
    "ERROR_TYPES_KEPT",
    "VALUE_LOG_SIZE",
    "CollectorRecorder",
    "FinishedCall",
    "FunctionStats",
    "Metric",
    "MetricStats",
    "Recorder",
    "Site",
    "add_recorder",
    "recorders",
    "remove_recorder",
]

#: Distinct exception types counted by name per measured function; more are counted as "(other)".
ERROR_TYPES_KEPT = 16
#: The last values a value log keeps (with their time).
VALUE_LOG_SIZE = 100
_logger = logging.getLogger("asyncflow")


_site_ids = itertools.count(1)


class Site:
    """What is measured: one function or block label, and the collector's figures for it."""

    __slots__ = (
        "file",
        "folded",
        "id",
        "is_async",
        "kind",
        "line",
        "name",
        "source",
    )

    def __init__(self, name: str, kind: str, source: str, file: str, line: int, is_async: bool):
        self.id = next(_site_ids)
        self.name = name
        #: "function", "block", or "other" (the labels past MAX_NAMES)
        self.kind = kind
        self.source = source
        self.file = file
        self.line = line
        self.is_async = is_async
        #: labels counted here because the table was full (only on the OTHER_NAMES site)
        self.folded = 0

    def __repr__(self) -> str:
        return f"<asyncflow.instrumentation.timing.Site {self.name!r} {self.kind}>"


class Metric:
    """One named metric: its kind, and the collector's figures for it (``stats``)."""

    __slots__ = ("__weakref__", "folded", "id", "kind", "lock", "name", "stats")

    kind: str

    def __init__(self, name: str, metric_id: int) -> None:
        self.id = metric_id
        self.name = name
        self.lock = _forksafe.lock(self)
        #: the collector's aggregate (recording.MetricStats) of the current session, or None
        self.stats: Any = None
        #: names counted here because the table was full (only on OTHER_METRICS handles)
        self.folded = 0

    def __repr__(self) -> str:
        return f"<asyncflow.{type(self).__name__} {self.name!r}>"


@dataclass(frozen=True, slots=True)
class FinishedCall:
    """One call that finished since the previous tick."""

    future_id: int
    #: the future's label
    label: str
    location: Location
    #: ``returned``, ``raised``, ``cancelled``, ``closed`` or ``never_awaited``
    outcome: str
    #: from the call's creation to its end
    duration_ns: int
    #: the sum of its polls' durations
    busy_ns: int
    polls: int
    #: the clock (:mod:`asyncflow.clock`, monotonic ns) when the call was created, and when it
    #: ended: where the span lies in time, for a recorder that sends it on
    start_ns: int = 0
    end_ns: int = 0
    #: the qualified name of the exception type it raised (``outcome`` ``raised``), else None
    error: str | None = None


class Recorder:
    """Receives what the mechanism records. Subclass it and override what you need.

    Both methods are called inline, on the thread where the event happened (an executor's
    thread, the event loop's thread), so they must be quick and must not block or await. An
    exception raised by a recorder never reaches the program: the recorder is removed, and the
    error logged once to the ``asyncflow`` logger and counted in ``/profiler_status``.
    """

    def span(
        self,
        site: Site,
        start_ns: int,
        end_ns: int,
        child_ns: int,
        error: type[BaseException] | None,
    ) -> None:
        """One measured call or block finished.

        Args:
            site: what was measured: ``site.name`` (the label), ``site.kind`` (``"function"``
                or ``"block"``), ``site.source`` (``module:qualname``), ``site.file``,
                ``site.line``, ``site.is_async``.
            start_ns: the clock (:mod:`asyncflow.clock`, monotonic ns) when it started.
            end_ns: the clock when it returned or raised; ``end_ns - start_ns`` is its total
                (wall) time.
            child_ns: the part of that time spent in measured calls nested in it, in the same
                thread of control (its self time is the rest).
            error: the type of the exception it raised, or None when it returned.
        """

    def metric(self, metric: Metric, op: str, value: float | str, at_ns: int) -> None:
        """One update of a metric.

        Args:
            metric: the handle: ``metric.name`` and ``metric.kind`` (``"counter"``, ``"gauge"``,
                ``"histogram"`` or ``"value"``).
            op: ``"add"`` (a counter's increment, or a gauge's ``inc``/``dec`` as a signed
                delta), ``"set"`` (a gauge's new value), ``"record"`` (one histogram sample)
                or ``"log"`` (one value of a value log).
            value: the number (a value log may also log a string).
            at_ns: the clock when it happened, for ``"log"`` and ``"set"``; 0 for the others
                (not read, to keep them cheap).
        """

    def call(self, call: FinishedCall) -> None:
        """One call of a tracked future (``@asyncflow.future``, a task in whole-program mode)
        ended: a span from ``call.start_ns`` to ``call.end_ns``, with its ``outcome``,
        ``error``, ``busy_ns`` and ``polls``.

        Unlike ``span`` and ``metric``, it is called from the collector, on the profiler's
        thread, within 50 ms of the call's end, oldest first, and only while a profiler runs:
        the coroutine wrappers count in place on the program's thread (in C where compiled),
        and the collector hands each call it folds to the users' recorders.
        """


class FunctionStats:
    """The figures of one measured function or block: one thread's share (a shard's), or the
    sum over threads that the documents are built from."""

    __slots__ = (
        "calls",
        "child_ns",
        "epoch",
        "error_types",
        "errors",
        "hist",
        "max_ns",
        "self_ns",
        "total_ns",
    )

    def __init__(self, epoch: int = 0) -> None:
        self.epoch = epoch
        #: calls (in a shard: 0, the calls are the histogram's total: an update less per call)
        self.calls = 0
        self.total_ns = 0
        #: time in measured calls nested in these (a shard keeps this; self = total - child)
        self.child_ns = 0
        #: total_ns - child_ns (in the sums over shards)
        self.self_ns = 0
        self.max_ns = 0
        self.errors = 0
        #: exception type name -> calls that raised it (at most ERROR_TYPES_KEPT, then "(other)")
        self.error_types: dict[str, int] = {}
        self.hist = _stats.new_histogram()


class MetricStats:
    """The figures of one metric: one thread's share (a shard's; a gauge's are kept on the
    gauge itself, under its lock, since its value depends on the order of updates across
    threads), or the sum over threads that the documents are built from."""

    __slots__ = ("at_ns", "count", "epoch", "hist", "max", "min", "recent", "sum", "value")

    def __init__(self, epoch: int, kind: str) -> None:
        self.epoch = epoch
        #: updates (counter, gauge), samples (histogram) or values logged
        self.count = 0
        #: the counter's total, the gauge's value now, the last value logged
        self.value: Any = 0 if kind in ("counter", "gauge") else None
        #: when the last value was logged (value logs: the latest over threads is the value)
        self.at_ns = 0
        self.sum: float = 0
        self.min: float | None = None
        self.max: float | None = None
        self.hist = _stats.new_histogram() if kind == "histogram" else None
        #: (at_ns, value) of the last VALUE_LOG_SIZE values of a value log
        self.recent: deque[tuple[int, float | str]] | None = (
            deque(maxlen=VALUE_LOG_SIZE) if kind == "value" else None
        )


def _error_name(error: type[BaseException]) -> str:
    module = getattr(error, "__module__", "builtins")
    name = getattr(error, "__qualname__", "?")
    return name if module in ("builtins", None) else f"{module}.{name}"


# -- per-thread shards ----------------------------------------------------------------------------
#
# Each thread folds what it records into a shard of its own (one per thread and session): no
# lock on the hot path, and no update is lost however many threads record at once, since only
# the owning thread writes its shard. The cold side (the documents, on the profiler's thread)
# sums the shards of the session; a shard whose thread has ended is folded into the session's
# ``retired`` shard and dropped, so that threads that come and go cost no memory.


class Shard:
    """One thread's figures for one session: site -> FunctionStats, metric -> MetricStats."""

    __slots__ = ("functions", "metrics", "session", "thread")

    def __init__(self, session: object, thread: threading.Thread | None) -> None:
        self.session = session
        self.functions: dict[Any, FunctionStats] = {}
        self.metrics: dict[Any, MetricStats] = {}
        #: the thread writing it (None: the retired shard, which nobody writes)
        self.thread = weakref.ref(thread) if thread is not None else None


#: per-thread: ``LOCAL.shard`` is the calling thread's shard (the mechanism reads it inline)
LOCAL = threading.local()
_shards_lock = threading.Lock()
#: every live shard of the current session, and the retired one (threads gone), by session
_shards: list[Shard] = []
_retired: dict[object, Shard] = {}


def new_shard(session: object) -> Shard:
    """The calling thread's shard for ``session``, made now (the mechanism calls this when
    ``LOCAL.shard`` is missing or belongs to another session)."""
    shard = Shard(session, threading.current_thread())
    with _shards_lock:
        # Shards of earlier sessions are no longer read: drop them with this session's first.
        if any(s.session is not session for s in _shards):
            _shards[:] = [s for s in _shards if s.session is session]
        for old in [k for k in _retired if k is not session]:
            del _retired[old]
        _shards.append(shard)
    LOCAL.shard = shard
    return shard


def _session_shards(session: object) -> list[Shard]:
    """The shards of ``session`` (threads that ended folded into its retired shard first)."""
    with _shards_lock:
        out = []
        for shard in list(_shards):
            if shard.session is not session:
                continue
            ref = shard.thread
            thread = ref() if ref is not None else None
            if thread is None or not thread.is_alive():
                retired = _retired.get(session)
                if retired is None:
                    retired = _retired[session] = Shard(session, None)
                _fold_shard(retired, shard)
                _shards.remove(shard)
                continue
            out.append(shard)
        retired = _retired.get(session)
        if retired is not None:
            out.append(retired)
        return out


def _add_function(into: FunctionStats, st: FunctionStats) -> None:
    # One tuple display, one dict copy each: a consistent enough copy of a shard another thread
    # may be writing (each field is exact; a call finishing meanwhile may show in some only).
    total, child, max_ns, errors = st.total_ns, st.child_ns, st.max_ns, st.errors
    hist = dict(st.hist)
    types = dict(st.error_types)
    into.calls += sum(hist.values())
    into.total_ns += total
    into.child_ns += child
    into.self_ns = into.total_ns - into.child_ns
    if max_ns > into.max_ns:
        into.max_ns = max_ns
    into.errors += errors
    _stats.merge(into.hist, hist)
    for name, n in types.items():
        if name not in into.error_types and len(into.error_types) >= ERROR_TYPES_KEPT:
            name = "(other)"
        into.error_types[name] = into.error_types.get(name, 0) + n


def _add_metric(into: MetricStats, st: MetricStats) -> None:
    count, value, at_ns, total = st.count, st.value, st.at_ns, st.sum
    low, high = st.min, st.max
    hist = dict(st.hist) if st.hist is not None else None
    recent = list(st.recent) if st.recent is not None else None
    if not count:
        return
    first = not into.count
    into.count += count
    if into.recent is not None:  # a value log: the latest value logged is its value
        if first or at_ns >= into.at_ns:
            into.value, into.at_ns = value, at_ns
        if recent:  # the latest over both, in time order (a stable merge: ties keep order)
            merged = list(heapq.merge(list(into.recent), recent, key=_at))
            into.recent.clear()
            into.recent.extend(merged)
    elif into.hist is None:  # a counter: the sum of the threads' totals
        into.value += value
    into.sum += total
    if low is not None and (into.min is None or low < into.min):
        into.min = low
    if high is not None and (into.max is None or high > into.max):
        into.max = high
    if hist is not None and into.hist is not None:
        _stats.merge(into.hist, hist)


def _at(sample: tuple[int, Any]) -> int:
    return sample[0]


def _fold_shard(into: Shard, shard: Shard) -> None:
    for site, st in list(shard.functions.items()):
        total = into.functions.get(site)
        if total is None:
            total = into.functions[site] = FunctionStats()
        _add_function(total, st)
    for metric, mst in list(shard.metrics.items()):
        mtotal = into.metrics.get(metric)
        if mtotal is None:
            mtotal = into.metrics[metric] = MetricStats(0, metric.kind)
        _add_metric(mtotal, mst)


def function_totals(session: object) -> dict[Any, FunctionStats]:
    """Cold side: site -> its figures in ``session``, summed over every thread's shard."""
    out: dict[Any, FunctionStats] = {}
    for shard in _session_shards(session):
        for site, st in list(shard.functions.items()):
            total = out.get(site)
            if total is None:
                total = out[site] = FunctionStats()
            _add_function(total, st)
    return out


def metric_totals(session: Any) -> dict[Any, MetricStats]:
    """Cold side: metric -> its figures in ``session``, summed over every thread's shard (a
    gauge's are kept on the gauge, under its lock, and copied from there)."""
    out: dict[Any, MetricStats] = {}
    for shard in _session_shards(session):
        for metric, st in list(shard.metrics.items()):
            total = out.get(metric)
            if total is None:
                total = out[metric] = MetricStats(0, metric.kind)
            _add_metric(total, st)
    return out


def fold_span(
    shard: Shard,
    site: Site,
    start_ns: int,
    end_ns: int,
    child_ns: int,
    error: type[BaseException] | None,
) -> None:
    """Fold one finished span into ``shard`` (the calling thread's own)."""
    st = shard.functions.get(site)
    if st is None:
        st = shard.functions[site] = FunctionStats()
    total = end_ns - start_ns
    st.total_ns += total
    if child_ns:
        st.child_ns += child_ns
    if total > st.max_ns:
        st.max_ns = total
    st.hist[_SMALL_BUCKET[total] if 0 <= total < _SMALL_LIMIT else _stats.bucket_of(total)] += 1
    if error is not None:
        count_error(st, error)


def count_error(st: FunctionStats, error: type[BaseException]) -> None:
    """Count one call of ``st`` that raised ``error``."""
    st.errors += 1
    name = _error_name(error)
    types = st.error_types
    if name not in types and len(types) >= ERROR_TYPES_KEPT:
        name = "(other)"
    types[name] = types.get(name, 0) + 1


_SMALL_BUCKET = _stats.SMALL_BUCKET
_SMALL_LIMIT = _stats.SMALL_LIMIT


def fold_metric(metric: Metric, op: str, value: Any, at_ns: int) -> None:
    """Fold one metric update into the current session (the calling thread's shard; a gauge's
    own figures under its lock). Records nothing while no profiler runs."""
    session = _session.active
    if session is None:
        return
    if metric.kind == "gauge":
        with metric.lock:
            st = metric.stats
            if st is None or st.epoch != session.epoch:
                st = metric.stats = MetricStats(session.epoch, "gauge")
            st.count += 1
            st.value = st.value + value if op == "add" else value
            current = st.value
            if st.min is None or current < st.min:
                st.min = current
            if st.max is None or current > st.max:
                st.max = current
        return
    try:
        shard = LOCAL.shard
    except AttributeError:
        shard = None
    if shard is None or shard.session is not session:
        shard = new_shard(session)
    st = shard.metrics.get(metric)
    if st is None:
        st = shard.metrics[metric] = MetricStats(0, metric.kind)
    st.count += 1
    if op == "add":
        st.value += value
        return
    if op == "record":
        st.sum += value
        assert st.hist is not None
        st.hist[_stats.bucket_of(int(value))] += 1
    else:  # "log" (or "set" on something that is not a gauge)
        st.value = value
        st.at_ns = at_ns
        if st.recent is not None:
            st.recent.append((at_ns, value))
        if value.__class__ is str:
            return
    if st.min is None or value < st.min:
        st.min = value
    if st.max is None or value > st.max:
        st.max = value


class CollectorRecorder(Recorder):
    """asyncflow's own recorder (the policy): folds spans and metric updates into the current
    session's figures, in the calling thread's shard (no lock: only that thread writes it).
    Records nothing while no profiler runs. The mechanism does the same inline, without the
    call through this object; it is here for code that hands events to recorders itself."""

    def span(
        self,
        site: Site,
        start_ns: int,
        end_ns: int,
        child_ns: int,
        error: type[BaseException] | None,
    ) -> None:
        session = _session.active
        if session is None:
            return
        try:
            shard = LOCAL.shard
        except AttributeError:
            shard = None
        if shard is None or shard.session is not session:
            shard = new_shard(session)
        fold_span(shard, site, start_ns, end_ns, child_ns, error)

    def metric(self, metric: Metric, op: str, value: float | str, at_ns: int) -> None:
        fold_metric(metric, op, value, at_ns)


#: the collector's recorder; always first in line
COLLECTOR = CollectorRecorder()


def to_users_span(
    site: Site,
    start_ns: int,
    end_ns: int,
    child_ns: int,
    error: type[BaseException] | None,
) -> None:
    """Hand one span to each user's recorder (the mechanism calls this when ``users``)."""
    for user in users:
        try:
            user.span(site, start_ns, end_ns, child_ns, error)
        except Exception as exc:
            _failed(user, exc)


def to_users_metric(metric: Metric, op: str, value: Any, at_ns: int) -> None:
    """Hand one metric update to each user's recorder (the mechanism calls this when
    ``users``)."""
    for user in users:
        try:
            user.metric(metric, op, value, at_ns)
        except Exception as exc:
            _failed(user, exc)


class _Tee(Recorder):
    """The collector's recorder, then each user's; a user's that raises is removed."""

    def __init__(self, users: tuple[Recorder, ...]) -> None:
        self.users = users

    def span(
        self,
        site: Site,
        start_ns: int,
        end_ns: int,
        child_ns: int,
        error: type[BaseException] | None,
    ) -> None:
        COLLECTOR.span(site, start_ns, end_ns, child_ns, error)
        for user in self.users:
            try:
                user.span(site, start_ns, end_ns, child_ns, error)
            except Exception as exc:
                _failed(user, exc)

    def metric(self, metric: Metric, op: str, value: float | str, at_ns: int) -> None:
        COLLECTOR.metric(metric, op, value, at_ns)
        for user in self.users:
            try:
                user.metric(metric, op, value, at_ns)
            except Exception as exc:
                _failed(user, exc)


_lock = threading.Lock()
#: the users' recorders; empty (falsy) when only the collector listens. The mechanism's "does
#: anybody listen?" check is ``_session.active is None and not users``; it folds into the
#: calling thread's shard inline (what COLLECTOR does) and calls ``to_users_*`` when ``users``.
users: tuple[Recorder, ...] = ()
#: the collector's recorder, or a tee to the users' as well: one object to hand events to, for
#: code outside the mechanism
sink: Recorder = COLLECTOR


def _failed(user: Recorder, exc: BaseException) -> None:
    _session.internal_error(f"recorder {type(user).__qualname__}", exc)
    remove_recorder(user)


def add_recorder(recorder: Recorder) -> Recorder:
    """Send every span and metric update to ``recorder`` as well, from now on.

    While a user's recorder is installed, measured functions and metrics are recorded even
    when no profiler runs (the collector's share then records nothing).

    Args:
        recorder: a :class:`Recorder` (a subclass overriding ``span`` and/or ``metric``).

    Returns:
        ``recorder``, so that it can be removed later.

    Raises:
        TypeError: ``recorder`` is not a :class:`Recorder`.
    """
    global users, sink
    if not isinstance(recorder, Recorder):
        raise TypeError(
            f"asyncflow.instrumentation.recording.add_recorder() needs a Recorder (subclass "
            f"asyncflow.instrumentation.recording.Recorder), got {type(recorder).__qualname__}"
        )
    with _lock:
        if any(r is recorder for r in users):
            return recorder
        users = (*users, recorder)
        sink = _Tee(users)
        session = _session.active  # (the collector decides under this lock too: fold_where)
        if session is not None and type(recorder).call is not Recorder.call:
            session.keep_in_place = None  # every call finished from now on reaches the collector
    return recorder


def remove_recorder(recorder: Recorder) -> None:
    """Stop sending to ``recorder`` (nothing happens if it was not added)."""
    global users, sink
    with _lock:
        users = tuple(r for r in users if r is not recorder)
        sink = _Tee(users) if users else COLLECTOR


def recorders() -> tuple[Recorder, ...]:
    """The users' recorders installed now (the collector's own is not listed)."""
    return users
