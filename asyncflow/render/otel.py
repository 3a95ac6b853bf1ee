"""asyncflow's figures as OpenTelemetry metrics, through the OTel SDK (the ``otel`` extra).

:class:`OtelReporter` is a live reporter (:mod:`asyncflow.render.reporters`). Counters and gauges
are observable instruments: the SDK's reader calls them on its own thread, and they answer with the
current figures, built on the profiler's thread (the same values as the JSON documents, taken at
most ``_FRESH_NS`` apart within one collection). The durations of finished calls are summed on the
profiler's thread as the collector's ticks hand the calls over, into the observable counter
``asyncflow.future.call.time`` (exact: a mean call duration is its rate over the rate of
``asyncflow.future.calls.finished``). Not an OTel histogram: the SDK's ``record()`` costs tens of
microseconds a call, which a program making many short calls would feel; the call-duration
percentiles are exported as gauges instead, as for polls.

Configuration is the OpenTelemetry standard's: with ``otel=True`` (``ASYNCFLOW_OTEL=1``,
``asyncflow run --otel``) asyncflow uses the program's global SDK meter provider if it set one,
and otherwise builds its own, whose exporters come from ``OTEL_METRICS_EXPORTER`` (``otlp`` by
default: install ``opentelemetry-exporter-otlp``; ``console``; ``none``), whose resource comes
from ``OTEL_SERVICE_NAME``/``OTEL_RESOURCE_ATTRIBUTES`` (the profiler's name is the service
name when neither gives one), and whose export interval is ``OTEL_METRIC_EXPORT_INTERVAL``
(60 s by default); ``OTEL_EXPORTER_OTLP_*`` reach the OTLP exporter itself. Pass
``OtelReporter(meter_provider=...)`` in ``reporters=[...]`` to use a provider of your own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from asyncflow import _forksafe, config
from asyncflow._version import __version__
from asyncflow.errors import AsyncflowError
from asyncflow.instrumentation import _session
from asyncflow.render.reporters import Figures, Tick
from asyncflow.schema import Location, fit_text

try:
    from opentelemetry.metrics import CallbackOptions, Meter, Observation
    from opentelemetry.sdk.metrics import MeterProvider
except ImportError:  # the extra is not installed: OtelReporter() says so
    _INSTALLED = False
else:
    _INSTALLED = True

__all__ = ["CALL_TIME", "INSTRUMENTS", "OtelReporter"]

#: figures built for one collection serve every instrument's callback for this long
_FRESH_NS = 500_000_000
#: seconds stopping the profiler waits for the last export of a provider built here
_SHUTDOWN_WAIT = 5.0
#: the distribution is on no package index under its name: the extra of a checkout, or the SDK
_EXTRA = "pip install '.[otel]' in asyncflow's checkout, or pip install opentelemetry-sdk"

_Attrs = dict[str, str]
_Points = Iterator[tuple[float | int, _Attrs]]


def _where(location: Location | None) -> str:
    return f"{location.file}:{location.line}" if location is not None else ""


def _s(ns: int) -> float:
    return ns / 1e9


def _futures(f: Figures) -> Iterator[tuple[Any, _Attrs]]:
    for e in f.futures.futures:
        yield e, {"label": e.label, "location": _where(e.location)}


def _channels(f: Figures) -> Iterator[tuple[Any, _Attrs]]:
    for e in f.channels.channels:
        yield e, {"label": e.label, "kind": e.kind}


def _streams(f: Figures) -> Iterator[tuple[Any, _Attrs]]:
    for e in f.streams.streams:
        yield e, {"label": e.label, "location": _where(e.location)}


def _resources(f: Figures) -> Iterator[tuple[Any, _Attrs]]:
    for e in f.resources.resources:
        yield e, {"label": e.label, "primitive": e.primitive, "location": _where(e.location)}


def _executors(f: Figures) -> Iterator[tuple[Any, _Attrs]]:
    for e in f.executors.executors:
        yield e, {"label": e.label, "kind": e.kind}


def _loops(f: Figures) -> Iterator[tuple[Any, _Attrs]]:
    for e in f.loop.loops:
        yield e, {"label": e.label, "thread": e.thread}


def _functions(f: Figures) -> Iterator[tuple[Any, _Attrs]]:
    if f.functions is not None:
        for e in f.functions.functions:
            yield e, {"label": e.label, "kind": e.kind, "location": _where(e.location)}


def _function_errors(f: Figures) -> _Points:
    for e, attrs in _functions(f):
        for error, count in e.errors.items():
            yield count, {**attrs, "type": error}


def _user(kind: str) -> Callable[[Figures], _Points]:
    """The program's own metrics of one kind: their numeric ``value``, by ``name``."""

    def points(f: Figures) -> _Points:
        if f.user_metrics is None:
            return
        for e in f.user_metrics.metrics:
            value = e.value
            if e.kind == kind and isinstance(value, int | float) and not isinstance(value, bool):
                yield value, {"name": e.name}

    return points


def _user_histograms(part: str) -> Callable[[Figures], _Points]:
    def points(f: Figures) -> _Points:
        if f.user_metrics is None:
            return
        for e in f.user_metrics.metrics:
            if e.kind == "histogram":
                yield (e.sum if part == "sum" else e.count), {"name": e.name}

    return points


def _each(
    entries: Callable[[Figures], Iterator[tuple[Any, _Attrs]]], value: Callable[[Any], float | int]
) -> Callable[[Figures], _Points]:
    def points(f: Figures) -> _Points:
        for e, attrs in entries(f):
            yield value(e), attrs

    return points


def _by(
    entries: Callable[[Figures], Iterator[tuple[Any, _Attrs]]],
    key: str,
    names: tuple[str, ...],
    part: Callable[[Any], Any],
) -> Callable[[Figures], _Points]:
    """One point per entry and name: ``getattr(part(entry), name)`` with ``{key: name}``."""

    def points(f: Figures) -> _Points:
        for e, attrs in entries(f):
            got = part(e)
            for name in names:
                yield getattr(got, name), {**attrs, key: name}

    return points


def _quantiles(
    entries: Callable[[Figures], Iterator[tuple[Any, _Attrs]]],
    percentiles: Callable[[Any], Mapping[str, int]],
) -> Callable[[Figures], _Points]:
    def points(f: Figures) -> _Points:
        for e, attrs in entries(f):
            for key, ns in percentiles(e).items():
                yield _s(ns), {**attrs, "quantile": repr(float(key[1:]) / 100)}

    return points


def _status(value: Callable[[Any], float | int]) -> Callable[[Figures], _Points]:
    def points(f: Figures) -> _Points:
        yield value(f.status), {}

    return points


def _warnings(f: Figures) -> _Points:
    counts: dict[tuple[str, str, str, str], int] = {}
    for w in f.warnings.warnings:
        if w.active:
            key = (w.kind, w.severity, w.subject.kind, w.subject.label)
            counts[key] = counts.get(key, 0) + 1
    for (kind, severity, subject, label), n in counts.items():
        yield n, {"kind": kind, "severity": severity, "subject": subject, "label": label}


_STATES = ("pending", "running", "suspended")
_OUTCOMES = ("returned", "raised", "cancelled", "closed", "never_awaited")

#: every observable instrument: name -> (kind, unit, description, points). ``counter`` is an
#: observable (monotonic, cumulative) counter, ``gauge`` an observable gauge. ``CALL_TIME`` is
#: fed by the ticks instead. docs/exporters.md lists them all.
INSTRUMENTS: dict[str, tuple[str, str, str, Callable[[Figures], _Points]]] = {
    "asyncflow.events.dropped": (
        "counter",
        "{event}",
        "Finished-call records lost because the buffer was full",
        _status(lambda s: s.events_dropped),
    ),
    "asyncflow.internal_errors": (
        "counter",
        "{error}",
        "Errors inside asyncflow (never raised into the program)",
        _status(lambda s: s.internal_errors),
    ),
    "asyncflow.future.calls": (
        "counter",
        "{call}",
        "Calls of the future, created so far",
        _each(_futures, lambda e: e.call_count),
    ),
    "asyncflow.future.live_calls": (
        "gauge",
        "{call}",
        "Unfinished calls now, by state",
        _by(_futures, "state", _STATES, lambda e: e.calls),
    ),
    "asyncflow.future.calls.finished": (
        "counter",
        "{call}",
        "Finished calls, by outcome",
        _by(_futures, "outcome", _OUTCOMES, lambda e: e.outcomes),
    ),
    "asyncflow.future.polls": (
        "counter",
        "{poll}",
        "Polls (steps) of the future's calls",
        _each(_futures, lambda e: e.total_polls),
    ),
    "asyncflow.future.busy.time": (
        "counter",
        "s",
        "Time inside polls",
        _each(_futures, lambda e: _s(e.busy_ns)),
    ),
    "asyncflow.future.idle.time": (
        "counter",
        "s",
        "Time suspended between polls",
        _each(_futures, lambda e: _s(e.idle_ns)),
    ),
    "asyncflow.future.poll.duration.quantile": (
        "gauge",
        "s",
        "Poll-duration percentiles",
        _quantiles(_futures, lambda e: e.poll_duration_ns),
    ),
    "asyncflow.future.poll.duration.max": (
        "gauge",
        "s",
        "The longest poll",
        _each(_futures, lambda e: _s(e.max_poll_duration_ns)),
    ),
    "asyncflow.future.call.duration.quantile": (
        "gauge",
        "s",
        "Call-duration percentiles (finished calls, creation to end)",
        _quantiles(_futures, lambda e: e.call_duration_ns),
    ),
    "asyncflow.channel.sent": (
        "counter",
        "{message}",
        "Messages sent into the channel",
        _each(_channels, lambda e: e.sent_count),
    ),
    "asyncflow.channel.received": (
        "counter",
        "{message}",
        "Messages received from the channel",
        _each(_channels, lambda e: e.received_count),
    ),
    "asyncflow.channel.queue_size": (
        "gauge",
        "{message}",
        "Messages in the channel now",
        _each(_channels, lambda e: e.queue_size),
    ),
    "asyncflow.channel.delay.quantile": (
        "gauge",
        "s",
        "Time-in-channel percentiles of timed messages",
        _quantiles(_channels, lambda e: e.delay_ns),
    ),
    "asyncflow.channel.producers_blocked.time": (
        "counter",
        "s",
        "Time producers spent blocked on a full channel",
        _each(_channels, lambda e: _s(e.producers_blocked_ns)),
    ),
    "asyncflow.channel.consumers_starved.time": (
        "counter",
        "s",
        "Time consumers spent waiting on an empty channel",
        _each(_channels, lambda e: _s(e.consumers_starved_ns)),
    ),
    "asyncflow.stream.items": (
        "counter",
        "{item}",
        "Items the stream yielded",
        _each(_streams, lambda e: e.items_yielded),
    ),
    "asyncflow.stream.wait.time": (
        "counter",
        "s",
        "Time the consumer waited for items",
        _each(_streams, lambda e: _s(e.total_wait_ns)),
    ),
    "asyncflow.resource.acquisitions": (
        "counter",
        "{acquisition}",
        "Successful acquisitions",
        _each(_resources, lambda e: e.acquisitions),
    ),
    "asyncflow.resource.waits": (
        "counter",
        "{wait}",
        "Waits that ended",
        _each(_resources, lambda e: e.waits),
    ),
    "asyncflow.resource.wait.time": (
        "counter",
        "s",
        "Time spent waiting",
        _each(_resources, lambda e: _s(e.total_wait_ns)),
    ),
    "asyncflow.resource.holds": (
        "counter",
        "{hold}",
        "Holds that ended",
        _each(_resources, lambda e: e.holds),
    ),
    "asyncflow.resource.hold.time": (
        "counter",
        "s",
        "Time held",
        _each(_resources, lambda e: _s(e.total_hold_ns)),
    ),
    "asyncflow.resource.waiters": (
        "gauge",
        "{task}",
        "Tasks waiting now",
        _each(_resources, lambda e: e.waiters_now),
    ),
    "asyncflow.executor.jobs.submitted": (
        "counter",
        "{job}",
        "Jobs submitted",
        _each(_executors, lambda e: e.submitted),
    ),
    "asyncflow.executor.jobs.completed": (
        "counter",
        "{job}",
        "Jobs that completed",
        _each(_executors, lambda e: e.completed),
    ),
    "asyncflow.executor.jobs.raised": (
        "counter",
        "{job}",
        "Jobs that raised",
        _each(_executors, lambda e: e.raised),
    ),
    "asyncflow.executor.jobs.queued": (
        "gauge",
        "{job}",
        "Jobs waiting for a worker now",
        _each(_executors, lambda e: e.queued),
    ),
    "asyncflow.executor.jobs.running": (
        "gauge",
        "{job}",
        "Jobs running now",
        _each(_executors, lambda e: e.running),
    ),
    "asyncflow.executor.workers": (
        "gauge",
        "{thread}",
        "Workers now",
        _each(_executors, lambda e: e.workers),
    ),
    "asyncflow.loop.lag": (
        "gauge",
        "s",
        "Event-loop lag now",
        _each(_loops, lambda e: _s(e.lag_now_ns)),
    ),
    "asyncflow.loop.lag.max": (
        "gauge",
        "s",
        "The largest event-loop lag seen",
        _each(_loops, lambda e: _s(e.max_lag_ns)),
    ),
    "asyncflow.loop.tasks": (
        "gauge",
        "{task}",
        "Tasks alive on the loop",
        _each(_loops, lambda e: e.tasks_alive),
    ),
    "asyncflow.loop.blocked": (
        "gauge",
        "1",
        "1 while a poll blocks the loop, else 0",
        _each(_loops, lambda e: int(e.blocked)),
    ),
    "asyncflow.loop.blocked_episodes": (
        "counter",
        "{episode}",
        "Blocked-loop episodes",
        _each(_loops, lambda e: e.blocked_count),
    ),
    "asyncflow.warnings.active": (
        "gauge",
        "{warning}",
        "Warnings that hold now",
        _warnings,
    ),
    "asyncflow.function.calls": (
        "counter",
        "{call}",
        "Calls of the measured function or block",
        _each(_functions, lambda e: e.call_count),
    ),
    "asyncflow.function.errors": (
        "counter",
        "{call}",
        "Calls that raised, by exception type",
        _function_errors,
    ),
    "asyncflow.function.time": (
        "counter",
        "s",
        "Wall time in the function, in all",
        _each(_functions, lambda e: _s(e.total_ns)),
    ),
    "asyncflow.function.self_time": (
        "counter",
        "s",
        "Wall time in the function outside measured calls nested in it",
        _each(_functions, lambda e: _s(e.self_ns)),
    ),
    "asyncflow.function.duration.quantile": (
        "gauge",
        "s",
        "Call-duration percentiles of the measured function",
        _quantiles(_functions, lambda e: e.duration_ns),
    ),
    "asyncflow.user.counter": (
        "counter",
        "1",
        "asyncflow.counter(name): its total",
        _user("counter"),
    ),
    "asyncflow.user.gauge": ("gauge", "1", "asyncflow.gauge(name): its value now", _user("gauge")),
    "asyncflow.user.histogram.sum": (
        "counter",
        "1",
        "asyncflow.histogram(name): the sum of its samples",
        _user_histograms("sum"),
    ),
    "asyncflow.user.histogram.count": (
        "counter",
        "{sample}",
        "asyncflow.histogram(name): its samples",
        _user_histograms("count"),
    ),
    "asyncflow.user.value": (
        "gauge",
        "1",
        "asyncflow.value(name, v): the last number logged",
        _user("value"),
    ),
}

#: the counter the ticks feed: finished calls' durations (creation to end), summed by outcome
CALL_TIME = "asyncflow.future.call.time"


def _exporters(names: Iterable[str]) -> list[Any]:
    """The exporter classes ``OTEL_METRICS_EXPORTER`` names, found as the SDK finds them (its
    ``opentelemetry_metrics_exporter`` entry points).

    Raises:
        AsyncflowError: one is not installed; the message says which package brings it.
    """
    from importlib.metadata import entry_points

    found = []
    for name in names:
        points = list(entry_points(group="opentelemetry_metrics_exporter", name=name))
        if not points:
            hint = (
                "pip install opentelemetry-exporter-otlp"
                if name.startswith("otlp")
                else "install the package that provides it"
            )
            raise AsyncflowError(
                f"OTEL_METRICS_EXPORTER names {name!r}, but no OpenTelemetry metric exporter of "
                f"that name is installed ({hint}; or set OTEL_METRICS_EXPORTER=console or none)"
            )
        found.append(points[0].load())
    return found


class OtelReporter:
    """Exports asyncflow's figures as OpenTelemetry metrics (a live reporter).

    Args:
        meter_provider: the SDK ``MeterProvider`` to export through; by default the program's
            global one if it is an SDK provider, else one built from the ``OTEL_*`` variables
            (and shut down, with a last export, when the profiler stops).
        service_name: ``service.name`` of the provider built here, when ``OTEL_SERVICE_NAME``
            and ``OTEL_RESOURCE_ATTRIBUTES`` give none.

    Raises:
        AsyncflowError: the ``otel`` extra is not installed, or an exporter that
            ``OTEL_METRICS_EXPORTER`` names is not.
    """

    def __init__(self, *, meter_provider: Any = None, service_name: str | None = None) -> None:
        if not _INSTALLED:
            raise AsyncflowError(f"the OpenTelemetry export needs the OpenTelemetry SDK: {_EXTRA}")
        self._provider: Any = meter_provider
        self._own = False
        self._service_name = service_name
        self._exporter_classes: list[Any] = []
        if meter_provider is None and not _global_sdk_provider():
            self._exporter_classes = _exporters(config.otel_exporters())
        self._source: Callable[[], Figures] | None = None
        self._final: Figures | None = None
        self._lock = _forksafe.lock(self)
        self._cached: Figures | None = None
        self._cached_at = 0
        #: (label, location, outcome) -> durations of the finished calls, summed (ns)
        self._call_time: dict[tuple[str, str, str], int] = {}
        #: calls whose duration was summed
        self.recorded = 0

    @property
    def meter_provider(self) -> Any:
        """The provider exported through (None until the profiler opened the reporter)."""
        return self._provider

    def open(self, source: Callable[[], Figures], /) -> None:
        """Create the instruments (on the profiler's thread, when the profiler starts)."""
        self._source = source
        provider = self._provider
        if provider is None:
            provider = _global_sdk_provider()
        if provider is None:
            provider = self._build()
            self._own = True
        self._provider = provider
        meter: Meter = provider.get_meter("asyncflow", __version__)
        for name, (kind, unit, description, points) in INSTRUMENTS.items():
            callback = self._callback(points)
            if kind == "counter":
                meter.create_observable_counter(name, [callback], unit, description)
            else:
                meter.create_observable_gauge(name, [callback], unit, description)
        meter.create_observable_counter(
            CALL_TIME,
            [self._call_time_callback],
            "s",
            "Durations of finished calls (creation to end), summed, by outcome",
        )

    def tick(self, tick: Tick, /) -> None:
        """Sum the durations of the calls that finished since the previous tick."""
        totals = tick.totals()  # one entry per future and outcome, however many calls
        if not totals:
            return
        with self._lock:  # the reader's thread copies the sums under it
            sums = self._call_time
            for t in totals:
                key = (t.label, _where(t.location), t.outcome)
                sums[key] = sums.get(key, 0) + t.duration_ns
                self.recorded += t.calls

    def _call_time_callback(self, options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            sums = list(self._call_time.items())
        return [
            Observation(ns / 1e9, _fit({"label": label, "location": where, "outcome": outcome}))
            for (label, where, outcome), ns in sums
        ]

    def close(self, final: Figures, /) -> None:
        """The profiler stopped: the callbacks answer ``final`` from now on; a provider built
        here exports once more and shuts down."""
        with self._lock:
            self._final = final
        provider = self._provider
        if self._own and provider is not None:
            # The last export may wait on a collector that does not answer: it runs on a
            # thread of its own, waited for a few seconds at most, so that stopping the
            # profiler (and writing its report) never hangs on the network.
            done = threading.Thread(
                target=provider.shutdown, name="asyncflow-otel-shutdown", daemon=True
            )
            done.start()
            done.join(_SHUTDOWN_WAIT)

    def _build(self) -> Any:
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource

        resource = Resource.create()
        named = str(resource.attributes.get(SERVICE_NAME, ""))
        if self._service_name and (not named or named.startswith("unknown_service")):
            resource = resource.merge(Resource({SERVICE_NAME: self._service_name}))
        readers = [PeriodicExportingMetricReader(cls()) for cls in self._exporter_classes]
        # shutdown_on_exit: the SDK's own atexit hook exports the last figures if the profiler
        # is never stopped; close() shuts it down first when it is.
        return MeterProvider(metric_readers=readers, resource=resource)

    def _figures(self) -> Figures | None:
        with self._lock:
            if self._final is not None:
                return self._final
            now = time.monotonic_ns()
            if self._cached is not None and now - self._cached_at < _FRESH_NS:
                return self._cached
        source = self._source
        if source is None:
            return None
        built = source()
        with self._lock:
            self._cached, self._cached_at = built, time.monotonic_ns()
        return built

    def _callback(
        self, points: Callable[[Figures], _Points]
    ) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            try:
                figures = self._figures()
                if figures is None:
                    return []
                return [Observation(value, _fit(attrs)) for value, attrs in points(figures)]
            except Exception as exc:  # the SDK would log it on every export: say it once
                _session.internal_error("the OpenTelemetry export's callback", exc)
                return []

        return callback


def _fit(attrs: _Attrs) -> _Attrs:
    """``attrs`` fit for an exporter's UTF-8: a lone surrogate in a label or file name (one that
    is not UTF-8) becomes its escape; the same dict when none has one (nearly always)."""
    if all(value.isascii() for value in attrs.values()):
        return attrs
    return {key: fit_text(value) for key, value in attrs.items()}


def _global_sdk_provider() -> Any:
    """The program's global meter provider, if it set an SDK one (not the API's no-op proxy)."""
    from opentelemetry import metrics

    provider = metrics.get_meter_provider()
    return provider if isinstance(provider, MeterProvider) else None
