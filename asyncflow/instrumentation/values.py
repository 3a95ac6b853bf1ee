"""Counters, gauges, histograms and value logs the program updates itself: ``asyncflow.counter()``.

Each name gets one handle, made on first use and kept (``counter("hits")`` returns the same
object every time, so keeping it in a module global saves the lookup). An update checks whether
anybody listens, then hands the update to the recording interface
(:mod:`asyncflow.instrumentation.recording`),
whose collector implementation keeps the session's figures in the calling thread's shard (a
gauge's under its lock): exact from any number of threads. With no profiler running an update
records nothing and costs the check of its argument (done first, so that a bad one is refused
whether anybody listens or not) and one more.
"""

from __future__ import annotations

import math
import threading
from typing import Any

from asyncflow import clock as _clock
from asyncflow import stats as _stats
from asyncflow.instrumentation import _session
from asyncflow.instrumentation import recording as _recording
from asyncflow.instrumentation.recording import Metric

__all__ = [
    "KINDS",
    "MAX_METRICS",
    "OTHER_METRICS",
    "Counter",
    "Gauge",
    "Histogram",
    "Metric",
    "ValueLog",
    "counter",
    "gauge",
    "histogram",
    "metrics",
    "value",
]

KINDS = ("counter", "gauge", "histogram", "value")
#: Distinct metric names kept; past it, new names of a kind are counted under OTHER_METRICS.
MAX_METRICS = 1024
OTHER_METRICS = "(other metrics)"
#: the longest string a value log keeps (longer ones are cut)
MAX_VALUE_CHARS = 200


def _shown(v: object) -> str:
    """The program's object as an error message quotes it: cut short, and never failing (a
    repr() that raises must not replace the error; Ctrl-C while it runs goes on)."""
    try:
        text = repr(v)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:
        return f"<repr() failed: {type(exc).__name__}>"
    return text if len(text) <= 80 else f"{text[:80]}... ({len(text)} characters)"


def _number(v: object, api: str, name: str) -> None:
    """Raise unless ``v`` is a finite number (not a bool). The callers test the common cases
    inline first (an int; a float, finite when ``v - v`` is 0.0), and ``api`` is formatted
    with the metric's name only for the message: an f-string per update cost more than the
    update."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(
            f"asyncflow.{api.format(name)} needs a number, got {type(v).__qualname__}: {_shown(v)}"
        )
    if isinstance(v, float) and not math.isfinite(v):
        raise ValueError(f"asyncflow.{api.format(name)} needs a finite number, got {v!r}")


class Counter(Metric):
    """A count that only goes up: ``asyncflow.counter("requests").add()``."""

    __slots__ = ()
    kind = "counter"

    def add(self, n: float = 1) -> None:
        """Add ``n`` (default 1).

        Raises:
            TypeError: ``n`` is not a number.
            ValueError: ``n`` is negative or not finite (a counter never goes down).
        """
        # Checked first, whether anybody listens or not: a program must not start raising
        # because a profiler was turned on.
        if n.__class__ is not int and (n.__class__ is not float or n - n):
            _number(n, "counter({!r}).add(n)", self.name)
        if n < 0:
            raise ValueError(
                f"asyncflow.counter({self.name!r}).add(n) needs n >= 0, got {n!r}; "
                "a counter only goes up (use a gauge for a value that goes down)"
            )
        session = _session.active
        if session is None and not _recording.users:
            return
        if session is not None:
            # Inline, into the calling thread's own cell: no lock, no update lost.
            try:
                shard = _LOCAL.shard
            except AttributeError:
                shard = None
            if shard is None or shard.session is not session:
                shard = _recording.new_shard(session)
            st = shard.metrics.get(self)
            if st is None:
                st = shard.metrics[self] = _MetricStats(0, "counter")
            st.count += 1
            st.value += n
        if _recording.users:
            _recording.to_users_metric(self, "add", n, 0)


class Gauge(Metric):
    """A value that goes up and down: ``asyncflow.gauge("connections").set(12)``."""

    __slots__ = ()
    kind = "gauge"

    def set(self, v: float) -> None:
        """Set the gauge to ``v``.

        Raises:
            TypeError: ``v`` is not a number.
            ValueError: ``v`` is not finite.
        """
        if v.__class__ is not int and (v.__class__ is not float or v - v):
            _number(v, "gauge({!r}).set(v)", self.name)
        if _session.active is None and not _recording.users:
            return
        _gauge(self, "set", v)

    def inc(self, n: float = 1) -> None:
        """Add ``n`` (default 1) to the gauge."""
        if n.__class__ is not int and (n.__class__ is not float or n - n):
            _number(n, "gauge({!r}).inc(n)", self.name)
        if _session.active is None and not _recording.users:
            return
        _gauge(self, "add", n)

    def dec(self, n: float = 1) -> None:
        """Take ``n`` (default 1) from the gauge."""
        if n.__class__ is not int and (n.__class__ is not float or n - n):
            _number(n, "gauge({!r}).dec(n)", self.name)
        if _session.active is None and not _recording.users:
            return
        _gauge(self, "add", -n)


class Histogram(Metric):
    """A distribution of non-negative samples: ``asyncflow.histogram("batch_size").record(40)``.

    Count, sum, min and max are exact; percentiles come from the project's log-linear
    histograms (within ~1.6%), at integer resolution: record in units that make the samples
    whole numbers (bytes, items, microseconds).
    """

    __slots__ = ()
    kind = "histogram"

    def record(self, v: float) -> None:
        """Count one sample ``v`` (>= 0).

        Raises:
            TypeError: ``v`` is not a number.
            ValueError: ``v`` is negative or not finite.
        """
        if v.__class__ is not int and (v.__class__ is not float or v - v):
            _number(v, "histogram({!r}).record(v)", self.name)
        if v < 0:
            raise ValueError(
                f"asyncflow.histogram({self.name!r}).record(v) needs v >= 0, got {v!r}"
            )
        session = _session.active
        if session is None and not _recording.users:
            return
        if session is not None:
            try:
                shard = _LOCAL.shard
            except AttributeError:
                shard = None
            if shard is None or shard.session is not session:
                shard = _recording.new_shard(session)
            st = shard.metrics.get(self)
            if st is None:
                st = shard.metrics[self] = _MetricStats(0, "histogram")
            st.count += 1
            st.sum += v
            st.hist[
                _SMALL_BUCKET[v] if v.__class__ is int and v < _SMALL_LIMIT else _bucket_of(int(v))
            ] += 1
            if st.min is None or v < st.min:
                st.min = v
            if st.max is None or v > st.max:
                st.max = v
        if _recording.users:
            _recording.to_users_metric(self, "record", v, 0)


class ValueLog(Metric):
    """The last values of something, each with its time: what ``asyncflow.value()`` writes to."""

    __slots__ = ()
    kind = "value"

    def log(self, v: float | str) -> None:
        """Log ``v`` (a number or a string; a string is cut at 200 characters) with the time.

        Raises:
            TypeError: ``v`` is neither a number nor a string.
            ValueError: ``v`` is a number that is not finite.
        """
        if (
            v.__class__ is not int
            and not isinstance(v, str)
            and (v.__class__ is not float or v - v)
        ):
            _number(v, "value({!r}, v)", self.name)
        if _session.active is None and not _recording.users:
            return
        if isinstance(v, str) and len(v) > MAX_VALUE_CHARS:
            v = v[:MAX_VALUE_CHARS]
        _emit(self, "log", v, _clock.now_ns())


def _gauge(gauge: Gauge, op: str, v: Any) -> None:
    """Fold one gauge update under its lock: its value depends on the order of updates
    across threads (a set, then increments), which per-thread shards would lose."""
    session = _session.active
    if session is not None:
        with gauge.lock:
            st = gauge.stats
            if st is None or st.epoch != session.epoch:
                st = gauge.stats = _MetricStats(session.epoch, "gauge")
            st.count += 1
            current = st.value = st.value + v if op == "add" else v
            if st.min is None or current < st.min:
                st.min = current
            if st.max is None or current > st.max:
                st.max = current
    if _recording.users:
        _recording.to_users_metric(gauge, op, v, _clock.now_ns() if op == "set" else 0)


def _emit(metric: Metric, op: str, v: Any, at_ns: int) -> None:
    if _session.active is not None:
        _fold(metric, op, v, at_ns)
    if _recording.users:
        _recording.to_users_metric(metric, op, v, at_ns)


_LOCAL = _recording.LOCAL
_MetricStats = _recording.MetricStats
_fold = _recording.fold_metric
_SMALL_BUCKET = _stats.SMALL_BUCKET
_SMALL_LIMIT = _stats.SMALL_LIMIT
_bucket_of = _stats.bucket_of

_CLASSES: dict[str, type[Metric]] = {
    "counter": Counter,
    "gauge": Gauge,
    "histogram": Histogram,
    "value": ValueLog,
}
_lock = threading.Lock()
_metrics: dict[str, Metric] = {}
_others: dict[str, Metric] = {}
_next_id = 1


def _get(name: object, kind: str) -> Any:
    metric = _metrics.get(name) if isinstance(name, str) else None
    if metric is not None and metric.kind == kind:
        return metric
    if not isinstance(name, str):
        raise TypeError(
            f"asyncflow.{kind}(name) needs a string, got {type(name).__qualname__}: {_shown(name)}"
        )
    if not name.strip():
        raise ValueError(f"asyncflow.{kind}(name) must not be empty")
    if not name.isprintable():
        raise ValueError(
            f"asyncflow.{kind}({name!r}): a name must be printable (no newlines, tabs or "
            "control characters): the report and top print it as it is"
        )
    global _next_id
    with _lock:
        metric = _metrics.get(name)
        if metric is None:
            if len(_metrics) >= MAX_METRICS:
                other = _others.get(kind)
                if other is None:
                    other = _others[kind] = _CLASSES[kind](OTHER_METRICS, _next_id)
                    _next_id += 1
                other.folded += 1
                return other
            metric = _metrics[name] = _CLASSES[kind](name, _next_id)
            _next_id += 1
    if metric.kind != kind:
        raise ValueError(
            f"asyncflow.{kind}({name!r}): {name!r} is already a {metric.kind}; "
            "give each metric a name of its own"
        )
    return metric


def counter(name: str) -> Counter:
    """The counter named ``name`` (made on first use): ``asyncflow.counter("hits").add()``.

    Raises:
        TypeError: ``name`` is not a string.
        ValueError: ``name`` is empty or not printable, or already names a metric of
            another kind.
    """
    result: Counter = _get(name, "counter")
    return result


def gauge(name: str) -> Gauge:
    """The gauge named ``name`` (made on first use): ``asyncflow.gauge("open").set(3)``.

    Raises:
        TypeError: ``name`` is not a string.
        ValueError: ``name`` is empty or not printable, or already names a metric of
            another kind.
    """
    result: Gauge = _get(name, "gauge")
    return result


def histogram(name: str) -> Histogram:
    """The histogram named ``name`` (made on first use):
    ``asyncflow.histogram("batch").record(40)``.

    Raises:
        TypeError: ``name`` is not a string.
        ValueError: ``name`` is empty or not printable, or already names a metric of
            another kind.
    """
    result: Histogram = _get(name, "histogram")
    return result


def value(name: str, v: float | str) -> None:
    """Log ``v`` under ``name`` with the time, like hotpath's ``val!``: the ``metrics`` document
    keeps the last 100 values of each name (and their count, min and max).

    Raises:
        TypeError: ``name`` is not a string, or ``v`` is neither a number nor a string.
        ValueError: ``name`` is empty, not printable or names a metric of another kind, or
            ``v`` is not finite.
    """
    log: ValueLog = _get(name, "value")
    log.log(v)


def metrics() -> list[Metric]:
    """Every metric, oldest first, then those counting names past MAX_METRICS."""
    with _lock:
        return [*_metrics.values(), *_others.values()]


def reset_for_tests() -> None:
    """Forget every metric (tests only: real programs keep them for the process's life)."""
    with _lock:
        _metrics.clear()
        _others.clear()
