"""The ``functions`` and ``user_metrics`` documents, from the recording interface's aggregates.

Pure functions of the collector's state, run on the profiler's thread; they read each site's and
metric's figures of the current session (those of an earlier session are not shown).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from asyncflow import stats
from asyncflow.instrumentation import _session
from asyncflow.instrumentation import recording as _recording
from asyncflow.instrumentation import timing as _measure
from asyncflow.instrumentation import values as _values
from asyncflow.schema import (
    SCHEMA,
    FunctionEntry,
    FunctionsDocument,
    Location,
    MetricEntry,
    MetricsDocument,
    ValueSample,
)
from asyncflow.views.paging import at_most, within

if TYPE_CHECKING:
    from asyncflow.model.collector import Collector

__all__ = ["function_entry", "functions_document", "metric_entry", "metrics_document"]


def function_entry(
    site: _measure.Site,
    st: Any,
    elapsed_ns: int,
    qs: tuple[float, ...],
    running: tuple[int, int] | None = None,
    now: int = 0,
) -> FunctionEntry:
    """One measured function or block, from its figures ``st`` (a recording.FunctionStats
    summed over threads by :func:`asyncflow.instrumentation.recording.function_totals`: nobody
    writes it)."""
    calls, total, self_ns, max_ns, errors = st.calls, st.total_ns, st.self_ns, st.max_ns, st.errors
    types, hist = st.error_types, st.hist
    return FunctionEntry(
        id=site.id,
        label=site.name,
        kind=site.kind,
        source=site.source,
        location=Location(site.file, site.line),
        is_async=site.is_async,
        call_count=calls,
        error_count=errors,
        errors=dict(sorted(types.items(), key=lambda kv: (-kv[1], kv[0]))),
        total_ns=total,
        self_ns=self_ns,
        mean_ns=total // calls if calls else 0,
        max_ns=max_ns,
        duration_ns=at_most(stats.percentiles(hist, qs), max_ns),
        share=round(total / elapsed_ns, 6) if elapsed_ns > 0 else 0.0,
        running_count=running[0] if running else 0,
        current_elapsed_ns=max(0, now - running[1]) if running else 0,
    )


def functions_document(
    collector: Collector, now: int, offset: int = 0, limit: int | None = None
) -> FunctionsDocument:
    """``GET /functions``: every function and block measured in this session (or running now),
    most total time first (then most calls, then label)."""
    elapsed = max(0, now - collector.session.start_ns)
    qs = collector.options.percentiles
    totals = _recording.function_totals(collector.session)
    running = _measure.running_now() if collector.session is _session.active else {}
    entries = []
    folded = 0
    for site in _measure.sites():
        st = totals.get(site)
        now_running = running.get(site)
        if now_running is None and (st is None or not st.calls):
            continue
        entries.append(
            function_entry(site, st or _recording.FunctionStats(), elapsed, qs, now_running, now)
        )
        if site.kind == "other":
            folded = site.folded
    entries.sort(key=lambda e: (-e.total_ns, -e.call_count, e.label))
    end = len(entries) if limit is None or limit <= 0 else offset + limit
    return FunctionsDocument(
        schema=SCHEMA,
        total=len(entries),
        offset=offset,
        limit=limit or 0,
        elapsed_ns=elapsed,
        functions=entries[offset:end],
        labels_folded=folded,
    )


def metric_entry(
    metric: _values.Metric, st: Any, qs: tuple[float, ...], origin: int = 0
) -> MetricEntry:
    """One metric, from its figures ``st`` (a recording.MetricStats summed over threads by
    :func:`asyncflow.instrumentation.recording.metric_totals`: nobody writes it); the times of a
    value log's values count from ``origin`` (the profiler's start)."""
    count, value, low, high, total = st.count, st.value, st.min, st.max, st.sum
    hist = st.hist
    recent = list(st.recent) if st.recent is not None else []
    return MetricEntry(
        id=metric.id,
        name=metric.name,
        kind=metric.kind,
        count=count,
        value=value,
        min=low,
        max=high,
        sum=total,
        percentiles=within(stats.percentiles(hist, qs), low, high) if hist is not None else {},
        recent=[ValueSample(max(0, at - origin), v) for at, v in recent],
    )


def metrics_document(
    collector: Collector, now: int, offset: int = 0, limit: int | None = None
) -> MetricsDocument:
    """``GET /user_metrics``: the program's counters, gauges, histograms and value logs updated
    in this session, by kind then name. ``recent`` times count from the profiler's start."""
    session = collector.session
    origin = session.start_ns
    qs = collector.options.percentiles
    order = {kind: i for i, kind in enumerate(_values.KINDS)}
    totals = _recording.metric_totals(session)
    entries = []
    folded = 0
    for metric in _values.metrics():
        st = totals.get(metric)
        if st is None and metric.kind == "gauge":  # kept on the gauge, under its lock
            with metric.lock:
                own = metric.stats
                if own is not None and own.epoch == session.epoch:
                    st = _recording.MetricStats(own.epoch, "gauge")
                    st.count, st.value, st.min, st.max = own.count, own.value, own.min, own.max
        if st is None or not st.count:
            continue
        entries.append(metric_entry(metric, st, qs, origin))
        folded += metric.folded
    entries.sort(key=lambda e: (order.get(e.kind, 9), e.name))
    end = len(entries) if limit is None or limit <= 0 else offset + limit
    return MetricsDocument(
        schema=SCHEMA,
        total=len(entries),
        offset=offset,
        limit=limit or 0,
        metrics=entries[offset:end],
        names_folded=folded,
    )
