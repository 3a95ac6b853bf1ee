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
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from asyncflow import _forksafe, config
from asyncflow._version import __version__
from asyncflow.errors import AsyncflowError
from asyncflow.instrumentation import _session
from asyncflow.render.metrics import METRICS, Metric, points_of, series
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


def _observed(metric: Metric) -> Callable[[Figures, bool], _Points]:
    """The instrument's observations: each series' points without a Prometheus suffix (not a
    summary's ``_sum`` or ``_count``), its labels as attributes; a series per creation site, or
    per object (an ``id`` attribute) with ``ids``, as in Prometheus."""
    subject = metric.subject
    assert metric.points is not None

    def observed(f: Figures, ids: bool = False) -> _Points:
        for pairs, members in series(subject, f, ids):
            attrs = dict(pairs)
            for suffix, extra, value in points_of(metric, members):
                if not suffix:
                    yield value, ({**attrs, **dict(extra)} if extra else attrs)

    return observed


#: every observable instrument fed by the figures, derived from
#: :data:`asyncflow.render.metrics.METRICS`: name -> (kind, unit, description, points).
#: ``counter`` is an observable (monotonic, cumulative) counter, ``gauge`` an observable gauge.
INSTRUMENTS: dict[str, tuple[str, str, str, Callable[[Figures, bool], _Points]]] = {
    m.otel: (m.kind, m.unit, m.description, _observed(m))
    for m in METRICS
    if m.otel is not None and m.points is not None
}

#: the counter the ticks feed: finished calls' durations (creation to end), summed by outcome
(CALL_TIME,) = [m.otel for m in METRICS if m.otel is not None and m.points is None]


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
        ids: a series per object (an ``id`` attribute) instead of per creation site.

    Raises:
        AsyncflowError: the ``otel`` extra is not installed, or an exporter that
            ``OTEL_METRICS_EXPORTER`` names is not.
    """

    def __init__(
        self, *, meter_provider: Any = None, service_name: str | None = None, ids: bool = False
    ) -> None:
        if not _INSTALLED:
            raise AsyncflowError(f"the OpenTelemetry export needs the OpenTelemetry SDK: {_EXTRA}")
        self._provider: Any = meter_provider
        self._own = False
        self._service_name = service_name
        self._ids = ids
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
        for metric in METRICS:
            name = metric.otel
            if name is None:
                continue
            callback: Callable[[CallbackOptions], Iterable[Observation]]
            if metric.points is None:  # the one the ticks feed
                callback = self._call_time_callback
            else:
                callback = self._callback(INSTRUMENTS[name][3])
            if metric.kind == "counter":
                meter.create_observable_counter(name, [callback], metric.unit, metric.description)
            else:
                meter.create_observable_gauge(name, [callback], metric.unit, metric.description)

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
        self, points: Callable[[Figures, bool], _Points]
    ) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            try:
                figures = self._figures()
                if figures is None:
                    return []
                observed = points(figures, self._ids)
                return [Observation(value, _fit(attrs)) for value, attrs in observed]
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
