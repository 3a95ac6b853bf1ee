"""The recording interface: what the mechanism calls, and the collector's implementation of it.

The mechanism (``@measure``, ``measure_block``, the metric handles of :mod:`asyncflow.values`)
decides *what* happened and *when*: it reads the clock, keeps nesting and recursion per thread of
control, and then calls a :class:`Recorder` with one finished span or one metric update. The
recorder is the policy: what to keep. asyncflow's own recorder, :data:`COLLECTOR`, folds them into
the aggregates the profiler serves (``functions`` and ``metrics`` documents); a user's recorder,
added with :func:`add_recorder`, receives the same calls and may route them anywhere (a tracing
system, a log, a test). Two methods, both called on the thread where the event happened, inline:

``span(site, start_ns, end_ns, child_ns, error)``
    one measured call or block finished (for recursion, only the outermost call).
``metric(metric, op, value, at_ns)``
    one update of a counter, gauge, histogram or value log.

How the other hooks map onto it (they keep their own, cheaper, in-place records today; the
mapping says what a user's recorder would receive if they were routed through it): a tracked
call of a future is a span (``created`` to ``finished``; its polls are spans nested in time); a
channel's send and receive are ``add`` updates of its sent/received counters and a ``record``
of the message's delay; a resource's wait and hold are spans; a loop's lag is a ``record``.

The live reporters of the exports (Prometheus, OpenTelemetry, issue 15) sit *downstream* of the
collector: they read each collector tick's figures on the profiler's thread. A recorder sits
*upstream*: it sees every event as it happens, on the program's threads, so it must be cheap and
must not block.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import TYPE_CHECKING

from asyncflow import stats as _stats
from asyncflow.instrument import _session

if TYPE_CHECKING:
    from asyncflow.timing import Site
    from asyncflow.values import Metric

__all__ = [
    "COLLECTOR",
    "ERROR_TYPES_KEPT",
    "VALUE_LOG_SIZE",
    "CollectorRecorder",
    "FunctionStats",
    "MetricStats",
    "Recorder",
    "add_recorder",
    "recorders",
    "remove_recorder",
]

#: Distinct exception types counted by name per measured function; more are counted as "(other)".
ERROR_TYPES_KEPT = 16
#: The last values a value log keeps (with their time).
VALUE_LOG_SIZE = 100
_logger = logging.getLogger("asyncflow")


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


class FunctionStats:
    """The collector's aggregate of one measured function or block, for one session."""

    __slots__ = (
        "calls",
        "epoch",
        "error_types",
        "errors",
        "hist",
        "max_ns",
        "self_ns",
        "total_ns",
    )

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.calls = 0
        self.total_ns = 0
        self.self_ns = 0
        self.max_ns = 0
        self.errors = 0
        #: exception type name -> calls that raised it (at most ERROR_TYPES_KEPT, then "(other)")
        self.error_types: dict[str, int] = {}
        self.hist = _stats.new_histogram()


class MetricStats:
    """The collector's aggregate of one metric, for one session."""

    __slots__ = ("count", "epoch", "hist", "max", "min", "recent", "sum", "value")

    def __init__(self, epoch: int, kind: str) -> None:
        self.epoch = epoch
        #: updates (counter, gauge), samples (histogram) or values logged
        self.count = 0
        #: the counter's total, the gauge's value now, the last value logged
        self.value: float | str | None = 0 if kind in ("counter", "gauge") else None
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


class CollectorRecorder(Recorder):
    """asyncflow's own recorder (the policy): folds spans and metric updates into the current
    session's aggregates, under each site's lock so that counts from many threads are exact.
    Records nothing while no profiler runs."""

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
        total = end_ns - start_ns
        with site.lock:
            st = site.stats
            if st is None or st.epoch != session.epoch:
                st = site.stats = FunctionStats(session.epoch)
            st.calls += 1
            st.total_ns += total
            st.self_ns += total - child_ns
            if total > st.max_ns:
                st.max_ns = total
            st.hist[
                _stats.SMALL_BUCKET[total]
                if 0 <= total < _stats.SMALL_LIMIT
                else _stats.bucket_of(total)
            ] += 1
            if error is not None:
                st.errors += 1
                name = _error_name(error)
                types = st.error_types
                if name not in types and len(types) >= ERROR_TYPES_KEPT:
                    name = "(other)"
                types[name] = types.get(name, 0) + 1

    def metric(self, metric: Metric, op: str, value: float | str, at_ns: int) -> None:
        session = _session.active
        if session is None:
            return
        with metric.lock:
            st = metric.stats
            if st is None or st.epoch != session.epoch:
                st = metric.stats = MetricStats(session.epoch, metric.kind)
            st.count += 1
            if op == "add":
                st.value = st.value + value
            elif op == "set" or op == "log":
                st.value = value
            if op == "record":
                v: float = value  # type: ignore[assignment]
                st.sum += v
                n = int(v)
                assert st.hist is not None
                st.hist[_stats.bucket_of(n)] += 1
            if op == "log" and st.recent is not None:
                st.recent.append((at_ns, value))
            current = value if op == "record" else st.value
            if metric.kind != "counter" and isinstance(current, (int, float)):
                if st.min is None or current < st.min:
                    st.min = current
                if st.max is None or current > st.max:
                    st.max = current


#: the collector's recorder; always first in line
COLLECTOR = CollectorRecorder()


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
#: anybody listen?" check is ``_session.active is None and not users``.
users: tuple[Recorder, ...] = ()
#: what the mechanism calls: the collector's recorder, or a tee to the users' as well
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
            f"asyncflow.recording.add_recorder() needs a Recorder (subclass "
            f"asyncflow.recording.Recorder), got {type(recorder).__qualname__}"
        )
    with _lock:
        if any(r is recorder for r in users):
            return recorder
        users = (*users, recorder)
        sink = _Tee(users)
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
