"""The OpenTelemetry export: exact figures through the SDK's in-memory reader, OTEL_* config."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

if not os.environ.get("CI"):  # in CI the extra is part of the test setup: a skip would hide it
    pytest.importorskip("opentelemetry.sdk.metrics", reason="the 'otel' extra is not installed")

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import asyncflow
from asyncflow.clock import FakeClock
from asyncflow.errors import AsyncflowError
from asyncflow.render import otel

_Points = dict[tuple[str, frozenset[tuple[str, Any]]], Any]


def _points(reader: InMemoryMetricReader) -> tuple[_Points, dict[str, str]]:
    """Every data point the reader collects now, by (instrument, attributes); and units."""
    points: _Points = {}
    units: dict[str, str] = {}
    data = reader.get_metrics_data()
    assert data is not None
    for resource_metrics in data.resource_metrics:
        for scope in resource_metrics.scope_metrics:
            assert scope.scope.name == "asyncflow"
            for metric in scope.metrics:
                units[metric.name] = metric.unit or ""
                for point in metric.data.data_points:
                    key = (metric.name, frozenset((point.attributes or {}).items()))
                    points[key] = point
    return points, units


def _value(points: _Points, name: str, /, **attrs: str) -> Any:
    return points[(name, frozenset(attrs.items()))]


async def test_exact_figures_through_the_in_memory_reader(fake_clock: FakeClock) -> None:
    reader = InMemoryMetricReader()
    reporter = otel.OtelReporter(meter_provider=MeterProvider(metric_readers=[reader]))

    @asyncflow.future(name="work")
    async def work(i: int) -> int:
        fake_clock.advance(1_000)
        await asyncio.sleep(0)
        fake_clock.advance(500)
        if i >= 8:
            raise ValueError(i)
        return i

    with asyncflow.profile("otel", format="none", port=None, reporters=[reporter]) as prof:
        q: asyncio.Queue[int] = asyncflow.instrument_queue(asyncio.Queue(), name="jobs")
        for i in range(5):
            await q.put(i)
        await q.get()
        await asyncio.gather(*(work(i) for i in range(10)), return_exceptions=True)
        live, units = _points(reader)  # while it runs: the callbacks ask the profiler's thread
        snap = prof.snapshot()
    final, final_units = _points(reader)  # once it stopped: the final figures

    (entry,) = [
        e for e in snap.futures.futures if e.label == "work" and e.location.file == __file__
    ]
    lb = {"label": "work", "location": f"{entry.location.file}:{entry.location.line}"}
    for points in (live, final):
        assert _value(points, "asyncflow.future.calls", **lb).value == 10
        finished = "asyncflow.future.calls.finished"
        assert _value(points, finished, **lb, outcome="returned").value == 8
        assert _value(points, finished, **lb, outcome="raised").value == 2
        assert _value(points, "asyncflow.future.polls", **lb).value == 20
        assert _value(points, "asyncflow.future.busy.time", **lb).value == 15_000 / 1e9
        assert _value(points, "asyncflow.future.poll.duration.max", **lb).value == 1_000 / 1e9
        (jobs,) = [c for c in snap.channels.channels if c.label == "jobs"] if snap.channels else []
        cl = {"label": "jobs", "kind": jobs.kind}
        assert _value(points, "asyncflow.channel.sent", **cl).value == 5
        assert _value(points, "asyncflow.channel.received", **cl).value == 1
        assert _value(points, "asyncflow.channel.queue_size", **cl).value == 4
    # every finished call's duration, summed once as the ticks handed it over: exact
    (logs,) = [log for log in snap.future_logs if log.future_id == entry.id]
    by_outcome: dict[str, int] = {}
    for c in logs.calls:
        assert c.finished_ns is not None and c.outcome is not None
        by_outcome[c.outcome] = by_outcome.get(c.outcome, 0) + c.finished_ns - c.created_ns
    for outcome, ns in by_outcome.items():
        assert _value(final, otel.CALL_TIME, **lb, outcome=outcome).value == ns / 1e9
    assert reporter.recorded == 10
    assert units["asyncflow.future.busy.time"] == "s"
    assert final_units[otel.CALL_TIME] == "s"
    assert units["asyncflow.future.calls"] == "{call}"
    assert set(otel.INSTRUMENTS) | {otel.CALL_TIME} >= set(units) | set(final_units)


def test_otel_option_builds_a_provider_from_the_otel_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test")
    with asyncflow.profile("svc", format="none", port=None, otel=True) as prof:
        assert prof.options.otel
        live = prof._live
        assert live is not None
        (reporter,) = live.reporters
        assert isinstance(reporter, otel.OtelReporter)
    provider = reporter.meter_provider
    assert isinstance(provider, MeterProvider)
    attributes = provider._sdk_config.resource.attributes
    assert attributes["service.name"] == "svc"  # the profiler's name, as none was given
    assert attributes["deployment.environment"] == "test"


def test_otel_service_name_comes_from_the_environment_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "checkout")
    monkeypatch.setenv("ASYNCFLOW_OTEL", "1")
    with asyncflow.profile("svc", format="none", port=None) as prof:
        assert prof.options.otel
        live = prof._live
        assert live is not None
        (reporter,) = live.reporters
    attributes = reporter.meter_provider._sdk_config.resource.attributes
    assert attributes["service.name"] == "checkout"


def test_an_exporter_that_is_not_installed_is_refused_at_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "nosuch")
    with pytest.raises(AsyncflowError, match=r"'nosuch'.*OTEL_METRICS_EXPORTER=console or none"):
        asyncflow.start("svc", format="none", port=None, otel=True)
    assert asyncflow.active_profiler() is None


def test_without_the_extra_the_error_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(otel, "_INSTALLED", False)
    with pytest.raises(AsyncflowError, match=r"pip install '\.\[otel\]' in asyncflow's checkout"):
        otel.OtelReporter()


def test_run_otel_exports_through_the_console_exporter(tmp_path: Path) -> None:
    """``asyncflow run --otel`` with ``OTEL_METRICS_EXPORTER=console``: the last export, at
    exit, carries the program's figures."""
    script = tmp_path / "prog.py"
    script.write_text(
        "import asyncio\n"
        "async def step():\n"
        "    await asyncio.sleep(0)\n"
        "async def main():\n"
        "    await asyncio.gather(*(step() for _ in range(3)))\n"
        "asyncio.run(main())\n"
    )
    env = {
        **_clean_env(),
        "OTEL_METRICS_EXPORTER": "console",
        "ASYNCFLOW_PORT": "off",
        "ASYNCFLOW_FORMAT": "none",
    }
    done = subprocess.run(
        [sys.executable, "-m", "asyncflow", "run", "--otel", str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert '"name": "asyncflow.future.calls"' in done.stdout
    assert '"service.name": "prog"' in done.stdout


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "ASYNCFLOW_"))}


def test_measured_functions_and_the_programs_own_metrics() -> None:
    reader = InMemoryMetricReader()
    reporter = otel.OtelReporter(meter_provider=MeterProvider(metric_readers=[reader]))

    @asyncflow.measure(name="crunch")
    def crunch() -> None:
        pass

    with asyncflow.profile("user", format="none", port=None, reporters=[reporter]) as prof:
        for _ in range(4):
            crunch()
        asyncflow.counter("jobs").add(2)
        asyncflow.gauge("depth").set(7)
        asyncflow.histogram("size").record(5)
        asyncflow.histogram("size").record(3)
        snap = prof.snapshot()
    points, _ = _points(reader)
    assert snap.functions is not None
    (entry,) = [e for e in snap.functions.functions if e.label == "crunch"]
    fl = {
        "label": "crunch",
        "kind": entry.kind,
        "location": f"{entry.location.file}:{entry.location.line}",
    }
    assert _value(points, "asyncflow.function.calls", **fl).value == 4
    assert _value(points, "asyncflow.function.time", **fl).value == entry.total_ns / 1e9
    assert _value(points, "asyncflow.user.counter", name="jobs").value == 2
    assert _value(points, "asyncflow.user.gauge", name="depth").value == 7
    assert _value(points, "asyncflow.user.histogram.sum", name="size").value == 8
    assert _value(points, "asyncflow.user.histogram.count", name="size").value == 2


def test_stopping_never_waits_long_for_a_collector_that_hangs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from opentelemetry.sdk.metrics.export import (
        MetricExporter,
        MetricExportResult,
        MetricsData,
        PeriodicExportingMetricReader,
    )

    release = threading.Event()

    class Stuck(MetricExporter):
        def export(self, metrics_data: MetricsData, timeout_millis: float = 0, **kw: Any) -> Any:
            release.wait(30)  # a collector that never answers
            return MetricExportResult.SUCCESS

        def force_flush(self, timeout_millis: float = 0) -> bool:
            return True

        def shutdown(self, timeout_millis: float = 0, **kw: Any) -> None:
            pass

    monkeypatch.setattr(otel, "_SHUTDOWN_WAIT", 0.2)
    reader = PeriodicExportingMetricReader(Stuck(), export_interval_millis=3_600_000)
    reporter = otel.OtelReporter(meter_provider=MeterProvider(metric_readers=[reader]))
    reporter._own = True  # as if built from OTEL_*: the profiler shuts it down at stop
    try:
        prof = asyncflow.start("stuck", format="none", port=None, reporters=[reporter])
        final = prof.stop()
        assert final is not None  # the final snapshot was taken: the stop did not time out
    finally:
        release.set()
