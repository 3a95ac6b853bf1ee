"""The one metrics table: Prometheus' families, OTel's instruments and docs/exporters.md's
tables all come from it, and what the exports write stays byte for byte what it was (golden
files rendered from one recorded snapshot, tests/golden/)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from asyncflow import schema
from asyncflow.render import prometheus
from asyncflow.render.reporters import Figures, figures_of

_GOLDEN = Path(__file__).parent / "golden"
#: ASYNCFLOW_REGOLD=1 rewrites the golden files (only when an output is meant to change)
_REGOLD = os.environ.get("ASYNCFLOW_REGOLD") == "1"


def _figures() -> Figures:
    data = json.loads((_GOLDEN / "metrics_snapshot.json").read_text(encoding="utf-8"))
    return figures_of(schema.load(schema.Snapshot, data))


def _check(path: Path, text: str) -> None:
    if _REGOLD:
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8")


def test_prometheus_text_is_unchanged() -> None:
    _check(_GOLDEN / "metrics.prom", prometheus.render(_figures()))


def _otel_dump(figures: Figures) -> str:
    """Every instrument the reporter registers, in order: name, type, unit, description and
    every data point (attributes and value), as the SDK's in-memory reader collects them."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from asyncflow.render import otel

    reader = InMemoryMetricReader()
    reporter = otel.OtelReporter(meter_provider=MeterProvider(metric_readers=[reader]))
    reporter.open(lambda: figures)
    reporter.close(figures)
    data = reader.get_metrics_data()
    assert data is not None
    out: list[Any] = []
    for resource_metrics in data.resource_metrics:
        for scope in resource_metrics.scope_metrics:
            for metric in scope.metrics:
                points = [
                    [sorted((point.attributes or {}).items()), getattr(point, "value", None)]
                    for point in metric.data.data_points
                ]
                kind = type(metric.data).__name__
                out.append([metric.name, kind, metric.unit, metric.description, points])
    return "".join(json.dumps(line) + "\n" for line in out)


def test_otel_instruments_are_unchanged() -> None:
    pytest.importorskip("opentelemetry.sdk.metrics", reason="the 'otel' extra is not installed")
    _check(_GOLDEN / "metrics_otel.json", _otel_dump(_figures()))
