"""Live reporters: what each collector tick hands to exporters and to the user's own reporters.

The collector drains the recorders every 50 ms on the profiler's thread. After each drain, every
live reporter is called with a :class:`Tick`: the calls that finished since the previous tick
(exact: ``tick.calls``, one :class:`FinishedCall` each, or ``tick.totals()``, summed by future and
outcome; both built only when read) and, on demand, the current :class:`Figures` (the JSON
documents, unpaged). The OpenTelemetry export (:mod:`asyncflow.render.otel`), the Prometheus
textfile writer (:mod:`asyncflow.render.prometheus`) and any object with a ``tick`` method plugged
in with ``reporters=[...]`` are live reporters; ``GET /metrics`` renders the same :class:`Figures`.

A live reporter is any object with::

    def tick(self, tick: Tick, /) -> None: ...            # required; on the profiler's thread
    def open(self, source: Callable[[], Figures], /) -> None: ...  # optional, once, at start
    def close(self, final: Figures, /) -> None: ...         # optional, once, at stop

``open`` receives a function that returns the current figures from *any* thread (it asks the
profiler's thread, or returns the final figures once the profiler stopped): what a reporter
whose export runs on a thread of its own needs. A reporter runs on the profiler's thread, so it
must be quick; one that raises is turned off, logged once to the ``asyncflow`` logger and
counted in ``/profiler_status``'s ``internal_errors``: it never reaches the program.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from asyncflow.instrumentation import _session
from asyncflow.model.collector import Collector
from asyncflow.model.read import CallBatch, CallTotals, FinishedCall, finished_call
from asyncflow.schema import (
    ChannelsDocument,
    ExecutorsDocument,
    FunctionsDocument,
    FuturesDocument,
    LoopDocument,
    MetricsDocument,
    ProfilerStatus,
    ResourcesDocument,
    Snapshot,
    StreamsDocument,
    WarningsDocument,
)

__all__ = [
    "MAX_CALLS_PER_TICK",
    "CallTotals",
    "Figures",
    "FinishedCall",
    "LiveReporter",
    "Reporters",
    "Tick",
    "figures",
    "figures_of",
    "finished_call",
]

#: Finished calls handed over in one tick at most; past it they are counted in ``Tick.dropped``
#: (the collector's batch is bounded by the recorders' buffer anyway).
MAX_CALLS_PER_TICK = 65_536
_SOURCE_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class Figures:
    """The current figures: the JSON documents of every route that counts things, unpaged.

    ``GET /metrics`` and the OpenTelemetry export render exactly these, so that their values
    are the documents' values.
    """

    #: when they were taken, in nanoseconds since the profiler's start
    now_ns: int
    status: ProfilerStatus
    futures: FuturesDocument
    channels: ChannelsDocument
    streams: StreamsDocument
    resources: ResourcesDocument
    executors: ExecutorsDocument
    loop: LoopDocument
    warnings: WarningsDocument
    #: measured functions and blocks, and the program's own metrics (H7: see
    #: asyncflow/views/function_views.py; None where a snapshot predates them)
    functions: FunctionsDocument | None = None
    user_metrics: MetricsDocument | None = None


def figures(collector: Collector, running: bool = True) -> Figures:
    """The current figures, built on the profiler's thread (drain the collector first)."""
    from asyncflow import clock
    from asyncflow.views import documents as views
    from asyncflow.views import function_views, resource_views, wait_views

    now = clock.now_ns()
    futures = views.futures_document(collector, now)
    channels = views.channels_document(collector)
    loop = views.loop_document(collector, now)
    executors = wait_views.executors_document(collector.options.percentiles, collector.futures())
    resources = resource_views.resources_document(collector, now)
    warnings = views._warnings(collector, now, futures, channels, loop, executors, resources)
    return Figures(
        now_ns=max(0, now - collector.session.start_ns),
        status=views.status(collector, now, running),
        futures=futures,
        channels=channels,
        streams=views.streams_document(collector),
        resources=resources,
        executors=executors,
        loop=loop,
        warnings=warnings,
        functions=function_views.functions_document(collector, now),
        user_metrics=function_views.metrics_document(collector, now),
    )


def figures_of(snapshot: Snapshot) -> Figures:
    """The figures a snapshot holds (the final snapshot, once the profiler stopped)."""
    from asyncflow.schema import SCHEMA

    empty = (0, 0, 0)
    return Figures(
        now_ns=snapshot.status.uptime_ns,
        status=snapshot.status,
        futures=snapshot.futures,
        channels=snapshot.channels or ChannelsDocument(SCHEMA, *empty, []),
        streams=snapshot.streams or StreamsDocument(SCHEMA, *empty, []),
        resources=snapshot.resources or ResourcesDocument(SCHEMA, *empty, []),
        executors=snapshot.executors or ExecutorsDocument(SCHEMA, []),
        loop=snapshot.loop or LoopDocument(SCHEMA, 0, []),
        warnings=WarningsDocument(SCHEMA, snapshot.status.uptime_ns, list(snapshot.warnings)),
        functions=snapshot.functions,
        user_metrics=snapshot.user_metrics,
    )


class Tick:
    """What one collector tick hands every live reporter (read-only).

    ``calls`` and ``totals()`` are built on first use: a reporter that reads neither costs
    nothing per call.
    """

    __slots__ = (
        "_batch",
        "_build",
        "_figures",
        "dropped",
        "interval_ns",
        "now_ns",
        "number",
    )

    def __init__(
        self,
        number: int,
        now_ns: int,
        interval_ns: int,
        calls: CallBatch,
        dropped: int,
        build: Callable[[], Figures],
    ) -> None:
        #: 1 for the first tick, then 2, 3...
        self.number = number
        #: when the tick happened, in nanoseconds since the profiler's start
        self.now_ns = now_ns
        #: since the previous tick (since the start for the first)
        self.interval_ns = interval_ns
        #: finished calls left out of ``calls`` since the previous tick: those the recorders'
        #: buffer lost, and those past ``MAX_CALLS_PER_TICK``
        self.dropped = dropped
        self._batch = calls
        self._build = build
        self._figures: Figures | None = None

    @property
    def calls(self) -> tuple[FinishedCall, ...]:
        """Every call folded since the previous tick, oldest first (exact)."""
        return self._batch.calls()

    def totals(self) -> list[CallTotals]:
        """The calls folded since the previous tick, summed by future and outcome (the cheap
        way to read them: one entry per future and outcome, not one per call)."""
        return self._batch.totals()

    def figures(self) -> Figures:
        """The current figures (built on first use, then the same object for this tick)."""
        if self._figures is None:
            self._figures = self._build()
        return self._figures

    def __repr__(self) -> str:
        return f"<Tick {self.number} at {self.now_ns} ns: {len(self._batch)} calls>"


@runtime_checkable
class LiveReporter(Protocol):
    """Receives each collector tick on the profiler's thread (see the module's docstring)."""

    def tick(self, tick: Tick, /) -> None: ...


def _name(reporter: object) -> str:
    cls = type(reporter)
    return f"{cls.__module__}.{cls.__qualname__}"


class Reporters:
    """The live reporters of one profiler: fed by the collector, on the profiler's thread."""

    def __init__(self, reporters: Sequence[object], collector: Collector) -> None:
        self._reporters: list[Any] = list(reporters)
        self._collector = collector
        # they register with the collector, which imports no reporter: handed every folded
        # call, and ticked after each drain
        collector.live = self
        collector.on_tick("feeding the live reporters", self.tick)
        #: the calls folded since the last tick, as the collector handed them (the model's
        #: records: only the read model's CallBatch reads them)
        self._pending: list[object] = []
        self._lost = 0
        #: the collector's dropped count at the previous tick
        self._dropped_seen = 0
        self._number = 0
        self._last_ns = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._final: Figures | None = None
        self._closed = False
        #: reporters turned off because they raised
        self.failed = 0

    @property
    def reporters(self) -> list[Any]:
        """The reporters still on."""
        return list(self._reporters)

    def add(self, record: object, /) -> None:
        """Keep a call the collector just folded, for the next tick (no work beyond this)."""
        if len(self._pending) < MAX_CALLS_PER_TICK:
            self._pending.append(record)
        else:
            self._lost += 1

    def open(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Call each reporter's ``open(source)``; on the profiler's thread (whose loop is
        ``loop``), before start() returns: a reporter's instruments exist once the profiler
        runs, and its source answers from any thread."""
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
        self._loop = loop
        self._thread = threading.current_thread()
        self._last_ns = self._collector.session.start_ns
        for reporter in list(self._reporters):
            opener = getattr(reporter, "open", None)
            if callable(opener):
                self._guard(reporter, "open", opener, self.source)

    def tick(self, now: int) -> None:
        """One collector tick: hand every reporter the calls folded since the previous one."""
        if self._closed or not self._reporters:
            self._pending.clear()
            return
        self._number += 1
        origin = self._collector.session.start_ns
        records, self._pending = self._pending, []
        lost, self._lost = self._lost, 0
        dropped = self._collector.dropped
        tick = Tick(
            self._number,
            max(0, now - origin),
            max(0, now - self._last_ns),
            CallBatch(records),
            lost + max(0, dropped - self._dropped_seen),
            self._build,
        )
        self._dropped_seen = dropped
        self._last_ns = now
        for reporter in list(self._reporters):
            self._guard(reporter, "tick", reporter.tick, tick)

    def close(self, final: Figures) -> None:
        """The profiler stops: a last tick with what is left, then each ``close(final)``."""
        if self._closed:
            return
        from asyncflow import clock

        self._final = final
        self.tick(clock.now_ns())
        self._closed = True
        for reporter in list(self._reporters):
            closer = getattr(reporter, "close", None)
            if callable(closer):
                self._guard(reporter, "close", closer, final)

    def _build(self) -> Figures:
        if self._final is not None:
            return self._final
        return figures(self._collector)

    def source(self) -> Figures:
        """The current figures, from any thread: built on the profiler's thread (waiting for it
        at most 10 s), or the final figures once the profiler stopped.

        Raises:
            TimeoutError: the profiler's thread did not answer in time.
        """
        final = self._final
        if final is not None:
            return final
        loop = self._loop
        if threading.current_thread() is self._thread or loop is None or loop.is_closed():
            return self._build()
        done: concurrent.futures.Future[Figures] = concurrent.futures.Future()

        def build() -> None:
            try:
                self._collector.drain()
                done.set_result(self._build())
            except BaseException as exc:
                done.set_exception(exc)

        try:
            loop.call_soon_threadsafe(build)
        except RuntimeError:  # the loop closed meanwhile: the final figures are set by now
            if self._final is not None:
                return self._final
            raise
        return done.result(timeout=_SOURCE_TIMEOUT)

    def _guard(self, reporter: Any, what: str, method: Callable[..., Any], arg: Any) -> None:
        """Call one reporter; one that raises is turned off, logged once and counted."""
        try:
            method(arg)
        except Exception as exc:
            if reporter in self._reporters:
                self._reporters.remove(reporter)
            self.failed += 1
            _session.internal_error(f"live reporter {_name(reporter)}.{what} (turned off)", exc)
