"""The one metrics table: Prometheus' families, OTel's instruments and docs/exporters.md's
tables (rendered at build time by the ``asyncflow-metrics`` directive, docs/_ext) all come
from it, and what the exports write stays byte for byte what it was (golden
files rendered from one recorded snapshot, tests/render/golden/)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from asyncflow import schema
from asyncflow.render import metrics, prometheus
from asyncflow.render.reporters import Figures, figures_of
from tests.support.markdown import DOCS, directives, extension

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


def test_prometheus_text_per_object_is_unchanged() -> None:
    """With ``ids``, a series per object (the twin definitions told apart by ``id``): the
    text written before series became one per creation site."""
    _check(_GOLDEN / "metrics_ids.prom", prometheus.render(_figures(), ids=True))


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


def test_the_rendered_prometheus_table_is_the_metrics_table() -> None:
    rows = extension("asyncflow_rows")
    assert rows.PROMETHEUS_HEADER == ("metric family", "type", "labels", "what")
    listed = [
        (_code(name), kind, what) for name, kind, _labels, what in rows.metric_rows("prometheus")
    ]
    declared = [(m.prometheus, m.type, m.help) for m in metrics.METRICS if m.prometheus is not None]
    assert listed == declared


def _said(labels: str) -> set[str]:
    return set(re.findall(r"`([^`]+)`", labels))


def test_the_rendered_labels_are_those_the_export_writes() -> None:
    """Each family's labels, read from its row with a stand-in entry, are those the golden
    export writes for it (``id`` aside: only a second entry with the same labels gets one)."""
    rendered = {
        _code(name): labels
        for name, _kind, labels, _what in extension("asyncflow_rows").metric_rows("prometheus")
    }
    written: dict[str, set[str]] = {}
    for line in (_GOLDEN / "metrics.prom").read_text(encoding="utf-8").splitlines():
        sample = re.match(r"(\w+?)(?:_sum|_count)?(?:\{(.*)\})? ", line)
        if line.startswith("#") or sample is None:
            continue
        family = sample.group(1) if sample.group(1) in rendered else line.split("{")[0]
        names = set(re.findall(r'(\w+)="', sample.group(2) or ""))
        written.setdefault(family, set()).update(names - {"id"})
    assert len(written) > 40, "the golden export writes most families"
    for family, names in written.items():
        assert _said(rendered[family]) == names, family
    assert rendered["asyncflow_future_live_calls"] == "`label`, `location`, `state`"
    assert rendered["asyncflow_channel_delay_seconds"] == "`label`, `kind` (+ `quantile`)"
    assert rendered["asyncflow_uptime_seconds"] == ""


def test_the_rendered_otel_table_is_the_metrics_table() -> None:
    rows = extension("asyncflow_rows")
    assert rows.OTEL_HEADER == ("instrument", "kind", "unit", "what")
    listed = [(_code(n), kind, _code(u), what) for n, kind, u, what in rows.metric_rows("otel")]
    declared = [
        (m.otel, f"observable {m.kind}", m.unit, m.description)
        for m in metrics.METRICS
        if m.otel is not None
    ]
    assert listed == declared


def test_exporters_md_renders_both_tables_and_lists_no_metric_by_hand() -> None:
    text = (DOCS / "exporters.md").read_text(encoding="utf-8")
    assert directives(text, "asyncflow-metrics") == [("prometheus", []), ("otel", [])]
    heads = ("| metric family |", "| instrument |")
    assert not any(line.startswith(heads) for line in text.splitlines())
    names = [n for m in metrics.METRICS for n in (m.prometheus, m.otel) if n is not None]
    pasted = [n for n in names if f"| `{n}` |" in text]
    assert pasted == [], "the metrics tables are rendered from METRICS: remove these rows"


def test_every_metric_is_exported_somewhere_under_one_name() -> None:
    prometheus_names = [m.prometheus for m in metrics.METRICS if m.prometheus is not None]
    otel_names = [m.otel for m in metrics.METRICS if m.otel is not None]
    assert all(m.prometheus or m.otel for m in metrics.METRICS)
    assert len(set(prometheus_names)) == len(prometheus_names)
    assert len(set(otel_names)) == len(otel_names)
    assert all(m.prometheus is None or m.points is not None for m in metrics.METRICS)
