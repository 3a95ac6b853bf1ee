"""Every metric asyncflow exports, declared once in :data:`METRICS`.

Prometheus' families (:mod:`asyncflow.render.prometheus`), OpenTelemetry's instruments
(:mod:`asyncflow.render.otel`) and the two tables of docs/exporters.md (checked by
tests/render/test_metrics_table.py) all read this table. A new metric is one row: what it is
about (its :class:`Subject`), its points (values read from one entry of the figures), and its
name, type and help in Prometheus, OpenTelemetry or both. Where the two exports differ (names,
units, summaries in Prometheus against percentile gauges or summed counters in OTel), the row
says so: a Prometheus summary's ``_sum`` and ``_count`` points are not exported to OTel, and a
figure that only one of them shows is a row with only that name. Rows are in the order both
exports write them. Both write a series per creation site (:func:`series`), unless asked for one
per object.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

from asyncflow.render.reporters import Figures
from asyncflow.schema import Location, Outcomes

__all__ = ["METRICS", "Metric", "Pairs", "Point", "Subject", "points_of", "series"]

#: labels (Prometheus) or attributes (OTel), in order
Pairs = tuple[tuple[str, str], ...]
#: one point of an entry: the Prometheus sample's suffix (``""``, ``"_sum"``, ``"_count"``),
#: the labels it adds to its entry's, its value. OTel exports the points without a suffix.
Point = tuple[str, Pairs, float | int]
_Points = Callable[[Any], Iterable[Point]]


@dataclass(frozen=True, slots=True, eq=False)
class Subject:
    """What a metric's series are about: the entries of the figures, and each one's labels."""

    entries: Callable[[Figures], Iterable[Any]]
    labels: Callable[[Any], Pairs]
    #: entries with the same labels (the objects created at one line, live and gone) are one
    #: series, their points merged; with ``ids`` (``metric_ids``), each is a series of its own,
    #: told apart by an ``id`` label on the second and later (entries have an ``id``)
    distinct: bool = True


@dataclass(frozen=True, slots=True)
class Metric:
    """One metric: its subject and points, and its name in Prometheus, OpenTelemetry or both."""

    subject: Subject
    #: the points of one entry; None: fed by the collector's ticks, not read from the figures
    #: (OTel only: :data:`asyncflow.render.otel.CALL_TIME`)
    points: _Points | None
    #: the Prometheus family, its type and HELP (None: not in Prometheus)
    prometheus: str | None = None
    type: Literal["counter", "gauge", "summary"] = "gauge"
    help: str = ""
    #: the OTel instrument (observable), its kind, unit and description (None: not in OTel)
    otel: str | None = None
    kind: Literal["counter", "gauge"] = "gauge"
    unit: str = ""
    description: str = ""
    #: how the points of entries with the same labels make one series: summed (counts, times,
    #: sizes now), or their largest (a maximum, a 0/1 state); percentiles are always the largest
    merge: Literal["sum", "max"] = "sum"


def _where(location: Location | None) -> str:
    return f"{location.file}:{location.line}" if location is not None else ""


def series(subject: Subject, figures: Figures, ids: bool = False) -> list[tuple[Pairs, list[Any]]]:
    """The subject's series: each one's labels and the entries it stands for.

    One series per set of labels: the resources, channels or streams created at one line (a
    connection pool's lock per connection, live and gone alike) are one series per site, so a
    scrape's series do not come and go with short-lived objects. With ``ids``, every entry is a
    series, and one whose labels an earlier entry has gets an ``id`` label.
    """
    groups: dict[Pairs, list[Any]] = {}
    for e in subject.entries(figures):
        pairs = subject.labels(e)
        if ids and subject.distinct and pairs in groups:
            pairs = (*pairs, ("id", str(e.id)))
        groups.setdefault(pairs, []).append(e)
    return list(groups.items())


def points_of(metric: Metric, entries: list[Any]) -> Iterator[Point]:
    """The points of one series: an entry's own, or those of several entries merged point by
    point (by suffix and added labels), in the first entry's order."""
    points = metric.points
    assert points is not None
    if len(entries) == 1:
        yield from points(entries[0])
        return
    merged: dict[tuple[str, Pairs], float | int] = {}
    for e in entries:
        for suffix, extra, value in points(e):
            key = (suffix, extra)
            had = merged.get(key)
            if had is None:
                merged[key] = value
            elif metric.merge == "max" or (not suffix and any(k == "quantile" for k, _ in extra)):
                merged[key] = max(had, value)
            else:
                merged[key] = had + value
    for (suffix, extra), value in merged.items():
        yield suffix, extra, value


def _warnings(f: Figures) -> list[tuple[Pairs, int]]:
    """Active warnings counted by kind, severity, subject and label."""
    counts: dict[Pairs, int] = {}
    for w in f.warnings.warnings:
        if w.active:
            key = (
                ("kind", w.kind),
                ("severity", w.severity),
                ("subject", w.subject.kind),
                ("label", w.subject.label),
            )
            counts[key] = counts.get(key, 0) + 1
    return list(counts.items())


STATUS = Subject(lambda f: (f.status,), lambda s: (), distinct=False)
FUTURES = Subject(
    lambda f: f.futures.futures, lambda e: (("label", e.label), ("location", _where(e.location)))
)
CHANNELS = Subject(lambda f: f.channels.channels, lambda e: (("label", e.label), ("kind", e.kind)))
STREAMS = Subject(
    lambda f: f.streams.streams, lambda e: (("label", e.label), ("location", _where(e.location)))
)
RESOURCES = Subject(
    lambda f: f.resources.resources,
    lambda e: (("label", e.label), ("primitive", e.primitive), ("location", _where(e.location))),
)
EXECUTORS = Subject(
    lambda f: f.executors.executors, lambda e: (("label", e.label), ("kind", e.kind))
)
LOOPS = Subject(lambda f: f.loop.loops, lambda e: (("label", e.label), ("thread", e.thread)))
WARNINGS = Subject(_warnings, lambda w: w[0], distinct=False)
FUNCTIONS = Subject(
    lambda f: f.functions.functions if f.functions is not None else (),
    lambda e: (("label", e.label), ("kind", e.kind), ("location", _where(e.location))),
)
USER_METRICS = Subject(
    lambda f: f.user_metrics.metrics if f.user_metrics is not None else (),
    lambda e: (("name", e.name),),
    distinct=False,
)


def _number(get: Callable[[Any], float | int]) -> _Points:
    """One point: ``get(entry)``."""
    return lambda e: (("", (), get(e)),)


def _seconds(get: Callable[[Any], int]) -> _Points:
    """One point: ``get(entry)`` nanoseconds, in seconds."""
    return lambda e: (("", (), get(e) / 1e9),)


def _measured(points: _Points, measured: Callable[[Any], int]) -> _Points:
    """``points`` of an entry whose ``measured(entry)`` is not 0, none of the others: a figure
    that was not measured (scheduled time under uvloop) has no series rather than a 0."""
    return lambda e: points(e) if measured(e) else ()


def _by(key: str, names: tuple[str, ...], part: Callable[[Any], Any]) -> _Points:
    """One point per name: ``getattr(part(entry), name)``, labelled ``{key: name}``."""

    def points(e: Any) -> Iterator[Point]:
        got = part(e)
        for name in names:
            yield "", ((key, name),), getattr(got, name)

    return points


def _quantile(key: str) -> str:
    """``"p99.9"`` -> ``"0.999"``."""
    return repr(float(key[1:]) / 100)


def _summary(
    percentiles: Callable[[Any], Mapping[str, int]],
    total: Callable[[Any], int] | None = None,
    count: Callable[[Any], int] | None = None,
    scale: float = 1e9,
) -> _Points:
    """A point per percentile (``quantile`` label), then ``_sum`` and ``_count`` if given;
    percentiles and sum divided by ``scale`` (nanoseconds to seconds by default)."""

    def points(e: Any) -> Iterator[Point]:
        for key, v in percentiles(e).items():
            yield "", (("quantile", _quantile(key)),), v / scale if scale != 1 else v
        if total is not None:
            t = total(e)
            yield "_sum", (), t / scale if scale != 1 else t
        if count is not None:
            yield "_count", (), count(e)

    return points


def _errors(ordered: bool) -> _Points:
    """A point per exception type (``type`` label), sorted or in the document's order."""

    def points(e: Any) -> Iterator[Point]:
        errors = sorted(e.errors.items()) if ordered else e.errors.items()
        for error, count in errors:
            yield "", (("type", error),), count

    return points


def _user(kind: str) -> _Points:
    """The program's own metric of one kind: its numeric value (none for a text value)."""

    def points(e: Any) -> Iterator[Point]:
        value = e.value
        if e.kind == kind and isinstance(value, int | float) and not isinstance(value, bool):
            yield "", (), value

    return points


def _user_histogram(part: Callable[[Any], float | int] | None) -> _Points:
    """A histogram's percentiles, sum and count (``part`` None), or one number of it."""
    whole = _summary(lambda e: e.percentiles, lambda e: e.sum, lambda e: e.count, scale=1)

    def points(e: Any) -> Iterable[Point]:
        if e.kind != "histogram":
            return ()
        return whole(e) if part is None else (("", (), part(e)),)

    return points


def _locked(e: Any) -> Iterable[Point]:
    return () if e.locked is None else (("", (), int(e.locked)),)


def _info(s: Any) -> Iterable[Point]:
    return (("", (("name", s.name), ("version", s.version), ("python", s.python)), 1),)


_STATES = ("pending", "running", "suspended")
#: how calls finished, each call under one (``dropped`` is a part of ``closed``: its own metric)
_OUTCOMES = tuple(f.name for f in fields(Outcomes) if f.name != "dropped")
_COUNTER: Literal["counter"] = "counter"
_GAUGE: Literal["gauge"] = "gauge"
_SUMMARY: Literal["summary"] = "summary"
_MAX: Literal["max"] = "max"

#: every metric, in the order Prometheus writes its families and OTel registers its instruments
METRICS: tuple[Metric, ...] = (
    Metric(
        STATUS,
        _info,
        "asyncflow_info",
        _GAUGE,
        "The profiler: its name, asyncflow's and Python's version; 1.",
    ),
    Metric(
        STATUS,
        _seconds(lambda s: s.uptime_ns),
        "asyncflow_uptime_seconds",
        _GAUGE,
        "Time since the profiler started.",
    ),
    Metric(
        STATUS,
        _number(lambda s: s.events_recorded),
        "asyncflow_events_recorded_total",
        _COUNTER,
        "Polls and calls recorded.",
    ),
    Metric(
        STATUS,
        _number(lambda s: s.events_dropped),
        "asyncflow_events_dropped_total",
        _COUNTER,
        "Finished-call records lost because the buffer was full.",
        "asyncflow.events.dropped",
        _COUNTER,
        "{event}",
        "Finished-call records lost because the buffer was full",
    ),
    Metric(
        STATUS,
        _number(lambda s: s.internal_errors),
        "asyncflow_internal_errors_total",
        _COUNTER,
        "Errors inside asyncflow (never raised).",
        "asyncflow.internal_errors",
        _COUNTER,
        "{error}",
        "Errors inside asyncflow (never raised into the program)",
    ),
    Metric(
        FUTURES,
        _number(lambda e: e.call_count),
        "asyncflow_future_calls_total",
        _COUNTER,
        "Calls of the future, created so far.",
        "asyncflow.future.calls",
        _COUNTER,
        "{call}",
        "Calls of the future, created so far",
    ),
    Metric(
        FUTURES,
        _by("state", _STATES, lambda e: e.calls),
        "asyncflow_future_live_calls",
        _GAUGE,
        "Unfinished calls now, by state.",
        "asyncflow.future.live_calls",
        _GAUGE,
        "{call}",
        "Unfinished calls now, by state",
    ),
    Metric(
        FUTURES,
        _by("outcome", _OUTCOMES, lambda e: e.outcomes),
        "asyncflow_future_calls_finished_total",
        _COUNTER,
        "Finished calls, by outcome.",
        "asyncflow.future.calls.finished",
        _COUNTER,
        "{call}",
        "Finished calls, by outcome",
    ),
    Metric(
        FUTURES,
        _number(lambda e: e.outcomes.dropped),
        "asyncflow_future_calls_dropped_total",
        _COUNTER,
        "Calls destroyed while pending, of those closed: nothing referenced their task.",
        "asyncflow.future.calls.dropped",
        _COUNTER,
        "{call}",
        "Calls destroyed while pending, of those closed: nothing referenced their task",
    ),
    Metric(
        FUTURES,
        _number(lambda e: e.total_polls),
        "asyncflow_future_polls_total",
        _COUNTER,
        "Polls (steps) of the future's calls.",
        "asyncflow.future.polls",
        _COUNTER,
        "{poll}",
        "Polls (steps) of the future's calls",
    ),
    Metric(
        FUTURES,
        _seconds(lambda e: e.busy_ns),
        "asyncflow_future_busy_seconds_total",
        _COUNTER,
        "Time inside polls (busy).",
        "asyncflow.future.busy.time",
        _COUNTER,
        "s",
        "Time inside polls",
    ),
    Metric(
        FUTURES,
        _seconds(lambda e: e.idle_ns),
        "asyncflow_future_idle_seconds_total",
        _COUNTER,
        "Time suspended between polls (idle).",
        "asyncflow.future.idle.time",
        _COUNTER,
        "s",
        "Time suspended between polls",
    ),
    Metric(
        FUTURES,
        _measured(_seconds(lambda e: e.scheduled_ns), lambda e: e.scheduled_polls),
        "asyncflow_future_scheduled_seconds_total",
        _COUNTER,
        "Time woken and waiting for the loop to run it (scheduled, part of idle); "
        "no series where not measured (uvloop).",
        "asyncflow.future.scheduled.time",
        _COUNTER,
        "s",
        "Time woken and waiting for the loop to run it (part of idle)",
    ),
    Metric(
        FUTURES,
        _summary(lambda e: e.poll_duration_ns, lambda e: e.busy_ns, lambda e: e.total_polls),
        "asyncflow_future_poll_duration_seconds",
        _SUMMARY,
        "Poll durations; _sum is the busy time, _count the polls.",
        "asyncflow.future.poll.duration.quantile",
        _GAUGE,
        "s",
        "Poll-duration percentiles",
    ),
    Metric(
        FUTURES,
        _seconds(lambda e: e.max_poll_duration_ns),
        "asyncflow_future_max_poll_duration_seconds",
        _GAUGE,
        "The longest poll.",
        "asyncflow.future.poll.duration.max",
        _GAUGE,
        "s",
        "The longest poll",
        merge=_MAX,
    ),
    Metric(
        FUTURES,
        _summary(lambda e: e.call_duration_ns),
        "asyncflow_future_call_duration_seconds",
        _SUMMARY,
        "Durations of finished calls, creation to end (quantiles only).",
        "asyncflow.future.call.duration.quantile",
        _GAUGE,
        "s",
        "Call-duration percentiles (finished calls, creation to end)",
    ),
    Metric(
        FUTURES,
        _number(lambda e: e.cancellations.requested),
        "asyncflow_future_cancellations_total",
        _COUNTER,
        "Cancellations requested of its calls.",
    ),
    Metric(
        CHANNELS,
        _number(lambda e: e.sent_count),
        "asyncflow_channel_sent_total",
        _COUNTER,
        "Messages sent into the channel.",
        "asyncflow.channel.sent",
        _COUNTER,
        "{message}",
        "Messages sent into the channel",
    ),
    Metric(
        CHANNELS,
        _number(lambda e: e.received_count),
        "asyncflow_channel_received_total",
        _COUNTER,
        "Messages received from the channel.",
        "asyncflow.channel.received",
        _COUNTER,
        "{message}",
        "Messages received from the channel",
    ),
    Metric(
        CHANNELS,
        _number(lambda e: e.queue_size),
        "asyncflow_channel_queue_size",
        _GAUGE,
        "Messages in the channel now.",
        "asyncflow.channel.queue_size",
        _GAUGE,
        "{message}",
        "Messages in the channel now",
    ),
    Metric(
        CHANNELS,
        _number(lambda e: e.max_queue_size),
        "asyncflow_channel_max_queue_size",
        _GAUGE,
        "The most messages it held at once.",
        merge=_MAX,
    ),
    Metric(
        CHANNELS,
        _summary(lambda e: e.delay_ns),
        "asyncflow_channel_delay_seconds",
        _SUMMARY,
        "Time in the channel of timed messages, send to receive (quantiles only).",
        "asyncflow.channel.delay.quantile",
        _GAUGE,
        "s",
        "Time-in-channel percentiles of timed messages",
    ),
    Metric(
        CHANNELS,
        _seconds(lambda e: e.max_delay_ns),
        "asyncflow_channel_max_delay_seconds",
        _GAUGE,
        "The longest time a message waited.",
        merge=_MAX,
    ),
    Metric(
        CHANNELS,
        _seconds(lambda e: e.producers_blocked_ns),
        "asyncflow_channel_producers_blocked_seconds_total",
        _COUNTER,
        "Time producers spent blocked on a full channel.",
        "asyncflow.channel.producers_blocked.time",
        _COUNTER,
        "s",
        "Time producers spent blocked on a full channel",
    ),
    Metric(
        CHANNELS,
        _seconds(lambda e: e.consumers_starved_ns),
        "asyncflow_channel_consumers_starved_seconds_total",
        _COUNTER,
        "Time consumers spent waiting on an empty channel.",
        "asyncflow.channel.consumers_starved.time",
        _COUNTER,
        "s",
        "Time consumers spent waiting on an empty channel",
    ),
    Metric(
        STREAMS,
        _number(lambda e: e.items_yielded),
        "asyncflow_stream_items_total",
        _COUNTER,
        "Items the stream yielded.",
        "asyncflow.stream.items",
        _COUNTER,
        "{item}",
        "Items the stream yielded",
    ),
    Metric(
        STREAMS,
        _summary(lambda e: e.wait_ns, lambda e: e.total_wait_ns, lambda e: e.items_yielded),
        "asyncflow_stream_wait_seconds",
        _SUMMARY,
        "How long the consumer waited for each item; _count is the items.",
    ),
    Metric(
        STREAMS,
        _seconds(lambda e: e.total_wait_ns),
        otel="asyncflow.stream.wait.time",
        kind=_COUNTER,
        unit="s",
        description="Time the consumer waited for items",
    ),
    Metric(
        RESOURCES,
        _number(lambda e: e.acquisitions),
        "asyncflow_resource_acquisitions_total",
        _COUNTER,
        "Successful acquisitions.",
        "asyncflow.resource.acquisitions",
        _COUNTER,
        "{acquisition}",
        "Successful acquisitions",
    ),
    Metric(
        RESOURCES,
        _number(lambda e: e.contended_acquisitions),
        "asyncflow_resource_contended_acquisitions_total",
        _COUNTER,
        "Acquisitions that had to wait.",
    ),
    Metric(
        RESOURCES,
        _summary(lambda e: e.wait_ns, lambda e: e.total_wait_ns, lambda e: e.waits),
        "asyncflow_resource_wait_seconds",
        _SUMMARY,
        "Waits that ended, each timed.",
    ),
    Metric(
        RESOURCES,
        _number(lambda e: e.waits),
        otel="asyncflow.resource.waits",
        kind=_COUNTER,
        unit="{wait}",
        description="Waits that ended",
    ),
    Metric(
        RESOURCES,
        _seconds(lambda e: e.total_wait_ns),
        otel="asyncflow.resource.wait.time",
        kind=_COUNTER,
        unit="s",
        description="Time spent waiting",
    ),
    Metric(
        RESOURCES,
        _summary(lambda e: e.hold_ns, lambda e: e.total_hold_ns, lambda e: e.holds),
        "asyncflow_resource_hold_seconds",
        _SUMMARY,
        "Holds that ended (timed holds weighted).",
    ),
    Metric(
        RESOURCES,
        _number(lambda e: e.holds),
        otel="asyncflow.resource.holds",
        kind=_COUNTER,
        unit="{hold}",
        description="Holds that ended",
    ),
    Metric(
        RESOURCES,
        _seconds(lambda e: e.total_hold_ns),
        otel="asyncflow.resource.hold.time",
        kind=_COUNTER,
        unit="s",
        description="Time held",
    ),
    Metric(
        RESOURCES,
        _number(lambda e: e.waiters_now),
        "asyncflow_resource_waiters",
        _GAUGE,
        "Tasks waiting on the resource now.",
        "asyncflow.resource.waiters",
        _GAUGE,
        "{task}",
        "Tasks waiting now",
    ),
    Metric(
        RESOURCES,
        _locked,
        "asyncflow_resource_locked",
        _GAUGE,
        "1 while held (or out of permits), else 0.",
        merge=_MAX,
    ),
    # Prometheus writes the workers first, OTel registers them last: two rows
    Metric(
        EXECUTORS,
        _number(lambda e: e.workers),
        "asyncflow_executor_workers",
        _GAUGE,
        "Worker threads (or processes) now.",
    ),
    Metric(
        EXECUTORS,
        _number(lambda e: e.submitted),
        "asyncflow_executor_jobs_submitted_total",
        _COUNTER,
        "Jobs submitted.",
        "asyncflow.executor.jobs.submitted",
        _COUNTER,
        "{job}",
        "Jobs submitted",
    ),
    Metric(
        EXECUTORS,
        _number(lambda e: e.completed),
        "asyncflow_executor_jobs_completed_total",
        _COUNTER,
        "Jobs that completed.",
        "asyncflow.executor.jobs.completed",
        _COUNTER,
        "{job}",
        "Jobs that completed",
    ),
    Metric(
        EXECUTORS,
        _number(lambda e: e.raised),
        "asyncflow_executor_jobs_raised_total",
        _COUNTER,
        "Jobs that raised.",
        "asyncflow.executor.jobs.raised",
        _COUNTER,
        "{job}",
        "Jobs that raised",
    ),
    Metric(
        EXECUTORS,
        _number(lambda e: e.cancelled),
        "asyncflow_executor_jobs_cancelled_total",
        _COUNTER,
        "Jobs cancelled before they ran.",
    ),
    Metric(
        EXECUTORS,
        _number(lambda e: e.queued),
        "asyncflow_executor_jobs_queued",
        _GAUGE,
        "Jobs waiting for a worker now.",
        "asyncflow.executor.jobs.queued",
        _GAUGE,
        "{job}",
        "Jobs waiting for a worker now",
    ),
    Metric(
        EXECUTORS,
        _number(lambda e: e.running),
        "asyncflow_executor_jobs_running",
        _GAUGE,
        "Jobs running now.",
        "asyncflow.executor.jobs.running",
        _GAUGE,
        "{job}",
        "Jobs running now",
    ),
    Metric(
        EXECUTORS,
        _number(lambda e: e.workers),
        otel="asyncflow.executor.workers",
        kind=_GAUGE,
        unit="{thread}",
        description="Workers now",
    ),
    Metric(
        EXECUTORS,
        _summary(lambda e: e.queued_ns),
        "asyncflow_executor_queued_seconds",
        _SUMMARY,
        "Time jobs waited for a worker (quantiles only).",
    ),
    Metric(
        EXECUTORS,
        _seconds(lambda e: e.total_queued_ns),
        "asyncflow_executor_queue_wait_seconds_total",
        _COUNTER,
        "Time jobs waited, in all.",
    ),
    Metric(
        EXECUTORS,
        _summary(lambda e: e.run_ns),
        "asyncflow_executor_run_seconds",
        _SUMMARY,
        "Time jobs ran (quantiles only).",
    ),
    Metric(
        EXECUTORS,
        _seconds(lambda e: e.total_run_ns),
        "asyncflow_executor_busy_seconds_total",
        _COUNTER,
        "Time jobs ran, in all.",
    ),
    Metric(
        LOOPS,
        _summary(lambda e: e.lag_ns),
        "asyncflow_loop_lag_seconds",
        _SUMMARY,
        "Event-loop lag (quantiles only).",
    ),
    Metric(
        LOOPS,
        _seconds(lambda e: e.lag_now_ns),
        "asyncflow_loop_lag_now_seconds",
        _GAUGE,
        "Event-loop lag now.",
        "asyncflow.loop.lag",
        _GAUGE,
        "s",
        "Event-loop lag now",
        merge=_MAX,
    ),
    Metric(
        LOOPS,
        _seconds(lambda e: e.max_lag_ns),
        "asyncflow_loop_max_lag_seconds",
        _GAUGE,
        "The largest lag seen.",
        "asyncflow.loop.lag.max",
        _GAUGE,
        "s",
        "The largest event-loop lag seen",
        merge=_MAX,
    ),
    Metric(
        LOOPS,
        _number(lambda e: e.tasks_alive),
        "asyncflow_loop_tasks",
        _GAUGE,
        "Tasks alive on the loop.",
        "asyncflow.loop.tasks",
        _GAUGE,
        "{task}",
        "Tasks alive on the loop",
    ),
    Metric(
        LOOPS,
        _number(lambda e: int(e.blocked)),
        "asyncflow_loop_blocked",
        _GAUGE,
        "1 while a poll blocks the loop, else 0.",
        "asyncflow.loop.blocked",
        _GAUGE,
        "1",
        "1 while a poll blocks the loop, else 0",
        merge=_MAX,
    ),
    Metric(
        LOOPS,
        _number(lambda e: e.blocked_count),
        "asyncflow_loop_blocked_episodes_total",
        _COUNTER,
        "Blocked-loop episodes.",
        "asyncflow.loop.blocked_episodes",
        _COUNTER,
        "{episode}",
        "Blocked-loop episodes",
    ),
    Metric(
        WARNINGS,
        _number(lambda w: w[1]),
        "asyncflow_warnings_active",
        _GAUGE,
        "Warnings that hold now, by kind, severity and subject.",
        "asyncflow.warnings.active",
        _GAUGE,
        "{warning}",
        "Warnings that hold now",
    ),
    Metric(
        FUNCTIONS,
        _number(lambda e: e.call_count),
        "asyncflow_function_calls_total",
        _COUNTER,
        "Calls of the measured function or block.",
        "asyncflow.function.calls",
        _COUNTER,
        "{call}",
        "Calls of the measured function or block",
    ),
    # Prometheus sorts the exception types, OTel keeps the document's order: two rows
    Metric(
        FUNCTIONS,
        _errors(ordered=True),
        "asyncflow_function_errors_total",
        _COUNTER,
        "Calls that raised, by exception type.",
    ),
    Metric(
        FUNCTIONS,
        _errors(ordered=False),
        otel="asyncflow.function.errors",
        kind=_COUNTER,
        unit="{call}",
        description="Calls that raised, by exception type",
    ),
    Metric(
        FUNCTIONS,
        _seconds(lambda e: e.total_ns),
        "asyncflow_function_seconds_total",
        _COUNTER,
        "Wall time in the function, in all.",
        "asyncflow.function.time",
        _COUNTER,
        "s",
        "Wall time in the function, in all",
    ),
    Metric(
        FUNCTIONS,
        _seconds(lambda e: e.self_ns),
        "asyncflow_function_self_seconds_total",
        _COUNTER,
        "Wall time in the function outside measured calls nested in it.",
        "asyncflow.function.self_time",
        _COUNTER,
        "s",
        "Wall time in the function outside measured calls nested in it",
    ),
    Metric(
        FUNCTIONS,
        _summary(lambda e: e.duration_ns, lambda e: e.total_ns, lambda e: e.call_count),
        "asyncflow_function_duration_seconds",
        _SUMMARY,
        "Durations of its calls; _sum is the total time, _count the calls.",
        "asyncflow.function.duration.quantile",
        _GAUGE,
        "s",
        "Call-duration percentiles of the measured function",
    ),
    Metric(
        USER_METRICS,
        _user("counter"),
        "asyncflow_user_counter_total",
        _COUNTER,
        "asyncflow.counter(name): its total.",
        "asyncflow.user.counter",
        _COUNTER,
        "1",
        "asyncflow.counter(name): its total",
    ),
    Metric(
        USER_METRICS,
        _user("gauge"),
        "asyncflow_user_gauge",
        _GAUGE,
        "asyncflow.gauge(name): its value now.",
        "asyncflow.user.gauge",
        _GAUGE,
        "1",
        "asyncflow.gauge(name): its value now",
    ),
    Metric(
        USER_METRICS,
        _user_histogram(None),
        "asyncflow_user_histogram",
        _SUMMARY,
        "asyncflow.histogram(name): its samples (integer-resolution quantiles), sum and count.",
    ),
    Metric(
        USER_METRICS,
        _user_histogram(lambda e: e.sum),
        otel="asyncflow.user.histogram.sum",
        kind=_COUNTER,
        unit="1",
        description="asyncflow.histogram(name): the sum of its samples",
    ),
    Metric(
        USER_METRICS,
        _user_histogram(lambda e: e.count),
        otel="asyncflow.user.histogram.count",
        kind=_COUNTER,
        unit="{sample}",
        description="asyncflow.histogram(name): its samples",
    ),
    Metric(
        USER_METRICS,
        _user("value"),
        "asyncflow_user_value",
        _GAUGE,
        "asyncflow.value(name, v): the last number logged.",
        "asyncflow.user.value",
        _GAUGE,
        "1",
        "asyncflow.value(name, v): the last number logged",
    ),
    Metric(
        FUTURES,
        None,
        otel="asyncflow.future.call.time",
        kind=_COUNTER,
        unit="s",
        description="Durations of finished calls (creation to end), summed, by outcome",
    ),
)
