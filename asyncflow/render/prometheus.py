"""The figures in the Prometheus text exposition format (version 0.0.4): ``GET /metrics``.

A renderer of :class:`asyncflow.render.reporters.Figures`: the values are the JSON documents'
values, durations in seconds, percentiles as summaries (``quantile`` label). Every series is
labelled by what it is about: ``label`` and ``location`` (``file:line``) for futures, streams and
resources; ``label`` and ``kind`` for channels and executors; ``label`` and ``thread`` for loops.
Measured functions (``@asyncflow.measure``) carry ``label``, ``kind`` and ``location``; the
program's own counters, gauges, histograms and value logs one ``name`` label each, in four fixed
families (``asyncflow_user_*``), so that no name of the program's can make the text invalid.
Cardinality is that of the documents, which are bounded already (what is gone is folded into
per-label aggregates). Two entries that would share every label (two definitions of one function on
one line) are told apart by an ``id`` label on the second.

:class:`TextfileReporter` writes the same text to a file every few seconds, for
node_exporter's textfile collector: a live reporter, for programs that serve no endpoint.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping

from asyncflow.render.reporters import Figures, Tick
from asyncflow.schema import Location, fit_text

__all__ = ["CONTENT_TYPE", "FAMILIES", "TextfileReporter", "render"]

#: what ``GET /metrics`` answers with
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_Pairs = tuple[tuple[str, str], ...]
#: a label set, rendered once (``label="work",location="app.py:3"``) and reused by every sample
_Labels = str
_Sample = tuple[str, _Labels, float | int]

#: every metric family: name -> (type, help). docs/exporters.md's table lists the same.
FAMILIES: dict[str, tuple[str, str]] = {
    "asyncflow_info": ("gauge", "The profiler: its name, asyncflow's and Python's version; 1."),
    "asyncflow_uptime_seconds": ("gauge", "Time since the profiler started."),
    "asyncflow_events_recorded_total": ("counter", "Polls and calls recorded."),
    "asyncflow_events_dropped_total": (
        "counter",
        "Finished-call records lost because the buffer was full.",
    ),
    "asyncflow_internal_errors_total": ("counter", "Errors inside asyncflow (never raised)."),
    "asyncflow_future_calls_total": ("counter", "Calls of the future, created so far."),
    "asyncflow_future_live_calls": ("gauge", "Unfinished calls now, by state."),
    "asyncflow_future_calls_finished_total": ("counter", "Finished calls, by outcome."),
    "asyncflow_future_polls_total": ("counter", "Polls (steps) of the future's calls."),
    "asyncflow_future_busy_seconds_total": ("counter", "Time inside polls (busy)."),
    "asyncflow_future_idle_seconds_total": ("counter", "Time suspended between polls (idle)."),
    "asyncflow_future_poll_duration_seconds": (
        "summary",
        "Poll durations; _sum is the busy time, _count the polls.",
    ),
    "asyncflow_future_max_poll_duration_seconds": ("gauge", "The longest poll."),
    "asyncflow_future_call_duration_seconds": (
        "summary",
        "Durations of finished calls, creation to end (quantiles only).",
    ),
    "asyncflow_future_cancellations_total": ("counter", "Cancellations requested of its calls."),
    "asyncflow_channel_sent_total": ("counter", "Messages sent into the channel."),
    "asyncflow_channel_received_total": ("counter", "Messages received from the channel."),
    "asyncflow_channel_queue_size": ("gauge", "Messages in the channel now."),
    "asyncflow_channel_max_queue_size": ("gauge", "The most messages it held at once."),
    "asyncflow_channel_delay_seconds": (
        "summary",
        "Time in the channel of timed messages, send to receive (quantiles only).",
    ),
    "asyncflow_channel_max_delay_seconds": ("gauge", "The longest time a message waited."),
    "asyncflow_channel_producers_blocked_seconds_total": (
        "counter",
        "Time producers spent blocked on a full channel.",
    ),
    "asyncflow_channel_consumers_starved_seconds_total": (
        "counter",
        "Time consumers spent waiting on an empty channel.",
    ),
    "asyncflow_stream_items_total": ("counter", "Items the stream yielded."),
    "asyncflow_stream_wait_seconds": (
        "summary",
        "How long the consumer waited for each item; _count is the items.",
    ),
    "asyncflow_resource_acquisitions_total": ("counter", "Successful acquisitions."),
    "asyncflow_resource_contended_acquisitions_total": (
        "counter",
        "Acquisitions that had to wait.",
    ),
    "asyncflow_resource_wait_seconds": ("summary", "Waits that ended, each timed."),
    "asyncflow_resource_hold_seconds": ("summary", "Holds that ended (timed holds weighted)."),
    "asyncflow_resource_waiters": ("gauge", "Tasks waiting on the resource now."),
    "asyncflow_resource_locked": ("gauge", "1 while held (or out of permits), else 0."),
    "asyncflow_executor_workers": ("gauge", "Worker threads (or processes) now."),
    "asyncflow_executor_jobs_submitted_total": ("counter", "Jobs submitted."),
    "asyncflow_executor_jobs_completed_total": ("counter", "Jobs that completed."),
    "asyncflow_executor_jobs_raised_total": ("counter", "Jobs that raised."),
    "asyncflow_executor_jobs_cancelled_total": ("counter", "Jobs cancelled before they ran."),
    "asyncflow_executor_jobs_queued": ("gauge", "Jobs waiting for a worker now."),
    "asyncflow_executor_jobs_running": ("gauge", "Jobs running now."),
    "asyncflow_executor_queued_seconds": (
        "summary",
        "Time jobs waited for a worker (quantiles only).",
    ),
    "asyncflow_executor_queue_wait_seconds_total": ("counter", "Time jobs waited, in all."),
    "asyncflow_executor_run_seconds": ("summary", "Time jobs ran (quantiles only)."),
    "asyncflow_executor_busy_seconds_total": ("counter", "Time jobs ran, in all."),
    "asyncflow_loop_lag_seconds": ("summary", "Event-loop lag (quantiles only)."),
    "asyncflow_loop_lag_now_seconds": ("gauge", "Event-loop lag now."),
    "asyncflow_loop_max_lag_seconds": ("gauge", "The largest lag seen."),
    "asyncflow_loop_tasks": ("gauge", "Tasks alive on the loop."),
    "asyncflow_loop_blocked": ("gauge", "1 while a poll blocks the loop, else 0."),
    "asyncflow_loop_blocked_episodes_total": ("counter", "Blocked-loop episodes."),
    "asyncflow_warnings_active": (
        "gauge",
        "Warnings that hold now, by kind, severity and subject.",
    ),
    "asyncflow_function_calls_total": ("counter", "Calls of the measured function or block."),
    "asyncflow_function_errors_total": ("counter", "Calls that raised, by exception type."),
    "asyncflow_function_seconds_total": ("counter", "Wall time in the function, in all."),
    "asyncflow_function_self_seconds_total": (
        "counter",
        "Wall time in the function outside measured calls nested in it.",
    ),
    "asyncflow_function_duration_seconds": (
        "summary",
        "Durations of its calls; _sum is the total time, _count the calls.",
    ),
    "asyncflow_user_counter_total": ("counter", "asyncflow.counter(name): its total."),
    "asyncflow_user_gauge": ("gauge", "asyncflow.gauge(name): its value now."),
    "asyncflow_user_histogram": (
        "summary",
        "asyncflow.histogram(name): its samples (integer-resolution quantiles), sum and count.",
    ),
    "asyncflow_user_value": ("gauge", "asyncflow.value(name, v): the last number logged."),
}


def render(figures: Figures) -> str:
    """The figures as Prometheus text (every family, even empty, with its HELP and TYPE)."""
    out: dict[str, list[_Sample]] = {name: [] for name in FAMILIES}
    _status(figures, out)
    _futures(figures, out)
    _channels(figures, out)
    _streams(figures, out)
    _resources(figures, out)
    _executors(figures, out)
    _loops(figures, out)
    _warnings(figures, out)
    _functions(figures, out)
    _user_metrics(figures, out)
    lines: list[str] = []
    for name, (kind, text) in FAMILIES.items():
        lines.append(f"# HELP {name} {_help(text)}")
        lines.append(f"# TYPE {name} {kind}")
        for sample, labels, value in out[name]:
            if labels:
                lines.append(f"{sample}{{{labels}}} {_value(value)}")
            else:
                lines.append(f"{sample} {_value(value)}")
    lines.append("")
    return "\n".join(lines)


def _help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape(value: str) -> str:
    # Every label value is written here: a lone surrogate (a file name that is not UTF-8)
    # becomes its escape first, whose backslash is then escaped as any other.
    value = fit_text(value)
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(pairs: _Pairs) -> _Labels:
    return ",".join(f'{key}="{_escape(value)}"' for key, value in pairs)


def _with(labels: _Labels, key: str, value: str) -> _Labels:
    """``labels`` and one more label (whose value needs no escaping)."""
    return f'{labels},{key}="{value}"' if labels else f'{key}="{value}"'


def _value(value: float | int) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def _seconds(ns: int) -> float:
    return ns / 1e9


def _where(location: Location | None) -> str:
    return f"{location.file}:{location.line}" if location is not None else ""


def _distinct(entries: Iterable[tuple[int, _Pairs]]) -> dict[int, _Labels]:
    """Each entry's labels, with ``id`` added to any that another entry already has."""
    seen: set[_Pairs] = set()
    out: dict[int, _Labels] = {}
    for ident, pairs in entries:
        if pairs in seen:
            pairs = (*pairs, ("id", str(ident)))
        seen.add(pairs)
        out[ident] = _labels(pairs)
    return out


def _add(
    out: dict[str, list[_Sample]],
    name: str,
    labels: _Labels,
    value: float | int,
    suffix: str = "",
) -> None:
    out[name].append((name + suffix, labels, value))


def _quantile(key: str) -> str:
    """``"p99.9"`` -> ``"0.999"``."""
    return repr(float(key[1:]) / 100)


def _summary(
    out: dict[str, list[_Sample]],
    name: str,
    labels: _Labels,
    percentiles: Mapping[str, int],
    total_ns: int | None = None,
    count: int | None = None,
) -> None:
    for key, ns in percentiles.items():
        _add(out, name, _with(labels, "quantile", _quantile(key)), _seconds(ns))
    if total_ns is not None:
        _add(out, name, labels, _seconds(total_ns), "_sum")
    if count is not None:
        _add(out, name, labels, count, "_count")


def _status(f: Figures, out: dict[str, list[_Sample]]) -> None:
    s = f.status
    info = (("name", s.name), ("version", s.version), ("python", s.python))
    _add(out, "asyncflow_info", _labels(info), 1)
    _add(out, "asyncflow_uptime_seconds", "", _seconds(s.uptime_ns))
    _add(out, "asyncflow_events_recorded_total", "", s.events_recorded)
    _add(out, "asyncflow_events_dropped_total", "", s.events_dropped)
    _add(out, "asyncflow_internal_errors_total", "", s.internal_errors)


def _futures(f: Figures, out: dict[str, list[_Sample]]) -> None:
    entries = f.futures.futures
    labelled = _distinct(
        (e.id, (("label", e.label), ("location", _where(e.location)))) for e in entries
    )
    for e in entries:
        lb = labelled[e.id]
        _add(out, "asyncflow_future_calls_total", lb, e.call_count)
        for state in ("pending", "running", "suspended"):
            value = getattr(e.calls, state)
            _add(out, "asyncflow_future_live_calls", _with(lb, "state", state), value)
        o = e.outcomes
        for outcome in ("returned", "raised", "cancelled", "closed", "never_awaited"):
            value = getattr(o, outcome)
            _add(out, "asyncflow_future_calls_finished_total", _with(lb, "outcome", outcome), value)
        _add(out, "asyncflow_future_polls_total", lb, e.total_polls)
        _add(out, "asyncflow_future_busy_seconds_total", lb, _seconds(e.busy_ns))
        _add(out, "asyncflow_future_idle_seconds_total", lb, _seconds(e.idle_ns))
        _summary(
            out,
            "asyncflow_future_poll_duration_seconds",
            lb,
            e.poll_duration_ns,
            e.busy_ns,
            e.total_polls,
        )
        _add(
            out, "asyncflow_future_max_poll_duration_seconds", lb, _seconds(e.max_poll_duration_ns)
        )
        _summary(out, "asyncflow_future_call_duration_seconds", lb, e.call_duration_ns)
        _add(out, "asyncflow_future_cancellations_total", lb, e.cancellations.requested)


def _channels(f: Figures, out: dict[str, list[_Sample]]) -> None:
    entries = f.channels.channels
    labelled = _distinct((e.id, (("label", e.label), ("kind", e.kind))) for e in entries)
    for e in entries:
        lb = labelled[e.id]
        _add(out, "asyncflow_channel_sent_total", lb, e.sent_count)
        _add(out, "asyncflow_channel_received_total", lb, e.received_count)
        _add(out, "asyncflow_channel_queue_size", lb, e.queue_size)
        _add(out, "asyncflow_channel_max_queue_size", lb, e.max_queue_size)
        _summary(out, "asyncflow_channel_delay_seconds", lb, e.delay_ns)
        _add(out, "asyncflow_channel_max_delay_seconds", lb, _seconds(e.max_delay_ns))
        _add(
            out,
            "asyncflow_channel_producers_blocked_seconds_total",
            lb,
            _seconds(e.producers_blocked_ns),
        )
        _add(
            out,
            "asyncflow_channel_consumers_starved_seconds_total",
            lb,
            _seconds(e.consumers_starved_ns),
        )


def _streams(f: Figures, out: dict[str, list[_Sample]]) -> None:
    entries = f.streams.streams
    labelled = _distinct(
        (e.id, (("label", e.label), ("location", _where(e.location)))) for e in entries
    )
    for e in entries:
        lb = labelled[e.id]
        _add(out, "asyncflow_stream_items_total", lb, e.items_yielded)
        _summary(
            out, "asyncflow_stream_wait_seconds", lb, e.wait_ns, e.total_wait_ns, e.items_yielded
        )


def _resources(f: Figures, out: dict[str, list[_Sample]]) -> None:
    entries = f.resources.resources
    labelled = _distinct(
        (e.id, (("label", e.label), ("primitive", e.primitive), ("location", _where(e.location))))
        for e in entries
    )
    for e in entries:
        lb = labelled[e.id]
        _add(out, "asyncflow_resource_acquisitions_total", lb, e.acquisitions)
        _add(out, "asyncflow_resource_contended_acquisitions_total", lb, e.contended_acquisitions)
        _summary(out, "asyncflow_resource_wait_seconds", lb, e.wait_ns, e.total_wait_ns, e.waits)
        _summary(out, "asyncflow_resource_hold_seconds", lb, e.hold_ns, e.total_hold_ns, e.holds)
        _add(out, "asyncflow_resource_waiters", lb, e.waiters_now)
        if e.locked is not None:
            _add(out, "asyncflow_resource_locked", lb, int(e.locked))


def _executors(f: Figures, out: dict[str, list[_Sample]]) -> None:
    entries = f.executors.executors
    labelled = _distinct((e.id, (("label", e.label), ("kind", e.kind))) for e in entries)
    for e in entries:
        lb = labelled[e.id]
        _add(out, "asyncflow_executor_workers", lb, e.workers)
        _add(out, "asyncflow_executor_jobs_submitted_total", lb, e.submitted)
        _add(out, "asyncflow_executor_jobs_completed_total", lb, e.completed)
        _add(out, "asyncflow_executor_jobs_raised_total", lb, e.raised)
        _add(out, "asyncflow_executor_jobs_cancelled_total", lb, e.cancelled)
        _add(out, "asyncflow_executor_jobs_queued", lb, e.queued)
        _add(out, "asyncflow_executor_jobs_running", lb, e.running)
        _summary(out, "asyncflow_executor_queued_seconds", lb, e.queued_ns)
        _add(out, "asyncflow_executor_queue_wait_seconds_total", lb, _seconds(e.total_queued_ns))
        _summary(out, "asyncflow_executor_run_seconds", lb, e.run_ns)
        _add(out, "asyncflow_executor_busy_seconds_total", lb, _seconds(e.total_run_ns))


def _loops(f: Figures, out: dict[str, list[_Sample]]) -> None:
    entries = f.loop.loops
    labelled = _distinct((e.id, (("label", e.label), ("thread", e.thread))) for e in entries)
    for e in entries:
        lb = labelled[e.id]
        _summary(out, "asyncflow_loop_lag_seconds", lb, e.lag_ns)
        _add(out, "asyncflow_loop_lag_now_seconds", lb, _seconds(e.lag_now_ns))
        _add(out, "asyncflow_loop_max_lag_seconds", lb, _seconds(e.max_lag_ns))
        _add(out, "asyncflow_loop_tasks", lb, e.tasks_alive)
        _add(out, "asyncflow_loop_blocked", lb, int(e.blocked))
        _add(out, "asyncflow_loop_blocked_episodes_total", lb, e.blocked_count)


def _warnings(f: Figures, out: dict[str, list[_Sample]]) -> None:
    counts: dict[_Pairs, int] = {}
    for w in f.warnings.warnings:
        if not w.active:
            continue
        key = (
            ("kind", w.kind),
            ("severity", w.severity),
            ("subject", w.subject.kind),
            ("label", w.subject.label),
        )
        counts[key] = counts.get(key, 0) + 1
    for pairs, count in counts.items():
        _add(out, "asyncflow_warnings_active", _labels(pairs), count)


def _functions(f: Figures, out: dict[str, list[_Sample]]) -> None:
    if f.functions is None:
        return
    entries = f.functions.functions
    labelled = _distinct(
        (e.id, (("label", e.label), ("kind", e.kind), ("location", _where(e.location))))
        for e in entries
    )
    for e in entries:
        lb = labelled[e.id]
        _add(out, "asyncflow_function_calls_total", lb, e.call_count)
        for error, count in sorted(e.errors.items()):
            _add(out, "asyncflow_function_errors_total", lb + f',type="{_escape(error)}"', count)
        _add(out, "asyncflow_function_seconds_total", lb, _seconds(e.total_ns))
        _add(out, "asyncflow_function_self_seconds_total", lb, _seconds(e.self_ns))
        _summary(
            out, "asyncflow_function_duration_seconds", lb, e.duration_ns, e.total_ns, e.call_count
        )


def _user_metrics(f: Figures, out: dict[str, list[_Sample]]) -> None:
    if f.user_metrics is None:
        return
    for e in f.user_metrics.metrics:
        lb = _labels((("name", e.name),))
        value = e.value
        number = value if isinstance(value, int | float) and not isinstance(value, bool) else None
        if e.kind == "counter" and number is not None:
            _add(out, "asyncflow_user_counter_total", lb, number)
        elif e.kind == "gauge" and number is not None:
            _add(out, "asyncflow_user_gauge", lb, number)
        elif e.kind == "histogram":
            name = "asyncflow_user_histogram"
            for key, v in e.percentiles.items():
                _add(out, name, _with(lb, "quantile", _quantile(key)), v)
            _add(out, name, lb, e.sum, "_sum")
            _add(out, name, lb, e.count, "_count")
        elif e.kind == "value" and number is not None:
            _add(out, "asyncflow_user_value", lb, number)


class TextfileReporter:
    """A live reporter that writes the Prometheus text to ``path`` every ``interval`` seconds
    (and once more when the profiler stops), atomically: for node_exporter's textfile collector
    (``--collector.textfile.directory``; the file name must end in ``.prom``).

    Args:
        path: the file to write; its directory must exist.
        interval: seconds between writes, at least the collector's tick (0.05).

    Raises:
        ValueError: a bad ``path`` or ``interval``.
    """

    def __init__(self, path: str | os.PathLike[str], *, interval: float = 15.0) -> None:
        text = os.fspath(path)
        if not isinstance(text, str) or not text:
            raise ValueError(f"path={path!r}: expected a file path")
        if not os.path.isdir(os.path.dirname(os.path.abspath(text))):
            raise ValueError(f"path={text!r}: its directory does not exist")
        if (
            isinstance(interval, bool)
            or not isinstance(interval, int | float)
            or not 0.05 <= interval <= 86_400
        ):
            raise ValueError(f"interval={interval!r}: expected seconds from 0.05 to 86400")
        self.path = text
        self.interval_ns = round(interval * 1e9)
        self._next_ns = 0
        #: files written so far
        self.writes = 0

    def tick(self, tick: Tick, /) -> None:
        if tick.now_ns < self._next_ns:
            return
        self._next_ns = tick.now_ns + self.interval_ns
        self._write(tick.figures())

    def close(self, final: Figures, /) -> None:
        self._write(final)

    def _write(self, figures: Figures) -> None:
        partial = f"{self.path}.{os.getpid()}.tmp"
        with open(partial, "w", encoding="utf-8") as out:
            out.write(render(figures))
        os.replace(partial, self.path)  # never a half-written file for the collector to read
        self.writes += 1
