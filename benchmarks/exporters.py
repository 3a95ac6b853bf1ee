"""Cost of the exporters: rendering ``/metrics`` for N futures and N channels, one OpenTelemetry
collection of the same, and the program's slowdown with a no-op live reporter and with the
OpenTelemetry reporter at its default export interval (60 s), in alternating runs.

    .venv/bin/python benchmarks/exporters.py [--sizes 100,1000] [--pairs 7] [--calls 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable, Coroutine
from typing import Any

import asyncflow
from asyncflow.render import prometheus, reporters

try:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import (
        InMemoryMetricReader,
        MetricExporter,
        MetricExportResult,
        MetricsData,
        PeriodicExportingMetricReader,
    )

    from asyncflow.render.otel import OtelReporter
except ImportError:  # the otel extra is not installed: its figures are skipped
    OtelReporter = None  # type: ignore[assignment,misc]


def _timed(fn: Callable[[], Any], repeat: int = 5) -> float:
    """The median time of ``fn()``, in seconds."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _plant(n: int) -> Callable[[], Coroutine[Any, Any, None]]:
    """A program with ``n`` futures (each called once) and ``n`` queues (one message each)."""
    keep: list[Any] = []

    async def main() -> None:
        for i in range(n):

            async def body() -> None:
                await asyncio.sleep(0)

            await asyncflow.future(name=f"future-{i}")(body)()
            q: asyncio.Queue[int] = asyncflow.instrument_queue(asyncio.Queue(), name=f"q-{i}")
            await q.put(i)
            await q.get()
            keep.append(q)

    return main


def render_costs(n: int) -> None:
    reader = InMemoryMetricReader() if OtelReporter is not None else None
    extra: list[Any] = []
    if reader is not None:
        extra.append(OtelReporter(meter_provider=MeterProvider(metric_readers=[reader])))
    with asyncflow.profile("exporters", format="none", port=None, reporters=extra) as prof:
        asyncio.run(_plant(n)())
        collector = prof._collector
        assert collector is not None

        def build() -> Any:
            return reporters.figures(collector)

        figures = prof._call(build)
        built = prof._call(lambda: _timed(build))
        rendered = _timed(lambda: prometheus.render(figures))
        text = prometheus.render(figures)
        line = (
            f"{n:>6} futures + {n} channels: figures built in {built * 1e3:7.2f} ms, "
            f"/metrics rendered in {rendered * 1e3:7.2f} ms ({len(text) / 1024:,.0f} KiB, "
            f"{text.count(chr(10)):,} lines)"
        )
        if reader is not None:
            collected = _timed(reader.get_metrics_data)  # figures built + every callback
            line += f"; one OTel collection {collected * 1e3:7.2f} ms"
    print(line)


class _Nowhere(MetricExporter if OtelReporter is not None else object):  # type: ignore[misc]
    """An exporter that sends nothing: the export's own cost, without a network."""

    def __init__(self) -> None:
        super().__init__()

    def export(self, metrics_data: MetricsData, timeout_millis: float = 0, **kw: Any) -> Any:
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 0) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 0, **kw: Any) -> None:
        pass


class _Nothing:
    """A live reporter that does nothing: the cost of the interface itself."""

    def tick(self, tick: reporters.Tick) -> None:
        pass


@asyncflow.future(name="step")
async def step() -> None:
    await asyncio.sleep(0)


async def _calls(n: int) -> float:
    started = time.perf_counter()
    for _ in range(n // 100):
        await asyncio.gather(*(step() for _ in range(100)))
    return time.perf_counter() - started


def slowdown(pairs: int, calls: int) -> None:
    plain: list[float] = []
    nothing: list[float] = []
    exported: list[float] = []
    for _ in range(pairs):
        with asyncflow.profile("plain", format="none", port=None):
            plain.append(asyncio.run(_calls(calls)))
        with asyncflow.profile("nothing", format="none", port=None, reporters=[_Nothing()]):
            nothing.append(asyncio.run(_calls(calls)))
        if OtelReporter is None:
            continue
        reader = PeriodicExportingMetricReader(_Nowhere())  # OTEL_METRIC_EXPORT_INTERVAL: 60 s
        reporter = OtelReporter(meter_provider=MeterProvider(metric_readers=[reader]))
        with asyncflow.profile("otel", format="none", port=None, reporters=[reporter]):
            exported.append(asyncio.run(_calls(calls)))
        reporter.meter_provider.shutdown()
    arms = [("a no-op live reporter", nothing)]
    if exported:
        arms.append(("the OTel reporter", exported))
    for name, times in arms:
        ratios = [b / a for a, b in zip(plain, times, strict=True)]
        print(
            f"{calls:,} decorated calls (gather of 100, one sleep(0) each), profiler running, "
            f"{pairs} pairs: {name} on / off, median ratio {statistics.median(ratios):.3f}x "
            f"(min {min(ratios):.3f}, max {max(ratios):.3f}); per call "
            f"{statistics.median(plain) / calls * 1e6:.2f} us off, "
            f"{statistics.median(times) / calls * 1e6:.2f} us on"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="100,1000", help="futures and channels per run")
    parser.add_argument("--pairs", type=int, default=7, help="off/on pairs for the slowdown")
    parser.add_argument("--calls", type=int, default=20_000, help="calls per run of the slowdown")
    args = parser.parse_args(argv)
    for n in (int(s) for s in args.sizes.split(",")):
        render_costs(n)
    if OtelReporter is None:
        print("the otel extra is not installed: no OpenTelemetry figures")
    slowdown(args.pairs, args.calls)


if __name__ == "__main__":
    main()
