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
from asyncflow.render import metrics, prometheus
from asyncflow.render.reporters import Figures, figures_of
from tests.markdown import table

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


def _code(cell: str) -> str:
    assert cell.startswith("`") and cell.endswith("`"), cell
    return cell[1:-1]


_DOCS = Path(__file__).parent.parent / "docs" / "exporters.md"


def test_the_docs_list_exactly_the_prometheus_families() -> None:
    rows = table(_DOCS.read_text(encoding="utf-8"), "metric family")
    listed = [(_code(name), kind, what) for name, kind, _labels, what in rows]
    declared = [(m.prometheus, m.type, m.help) for m in metrics.METRICS if m.prometheus is not None]
    assert listed == declared


def test_the_docs_list_exactly_the_otel_instruments() -> None:
    rows = table(_DOCS.read_text(encoding="utf-8"), "instrument")
    listed = [(_code(name), kind, _code(unit), what) for name, kind, unit, what in rows]
    declared = [
        (m.otel, f"observable {m.kind}", m.unit, m.description)
        for m in metrics.METRICS
        if m.otel is not None
    ]
    rows_wanted = "\n".join(f"| `{n}` | {k} | `{u}` | {d} |" for n, k, u, d in declared)
    assert listed == declared, f"docs/exporters.md's instruments should be:\n{rows_wanted}"


def test_every_metric_is_exported_somewhere_under_one_name() -> None:
    prometheus_names = [m.prometheus for m in metrics.METRICS if m.prometheus is not None]
    otel_names = [m.otel for m in metrics.METRICS if m.otel is not None]
    assert all(m.prometheus or m.otel for m in metrics.METRICS)
    assert len(set(prometheus_names)) == len(prometheus_names)
    assert len(set(otel_names)) == len(otel_names)
    assert all(m.prometheus is None or m.points is not None for m in metrics.METRICS)
