"""Bounded label cardinality (issue 26): Prometheus and OpenTelemetry write one series per
creation site, not one per object, so that a connection pool's short-lived locks (one per
connection, made at one line) do not make series that come and go with every scrape; with
``ids`` (``metric_ids``) each object is a series of its own, as before."""

from __future__ import annotations

import asyncio
import gc
from collections import Counter
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import asyncflow
from asyncflow.render import prometheus
from asyncflow.render.reporters import Figures, figures_of

LOCKS = 30


def _series(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _pool(count: int) -> list[asyncio.Lock]:
    """``count`` locks made at one line, as a connection pool makes one per connection."""
    return [asyncflow.instrument_lock(asyncio.Lock(), name="pool.py:68") for _ in range(count)]


async def _figures() -> Figures:
    """LOCKS locks at one site, each acquired twice; a third of them gone since."""
    gc.collect()
    with asyncflow.profile("sites", format="none", port=None) as prof:
        locks = _pool(LOCKS)
        for lock in locks:
            for _ in range(2):
                async with lock:
                    pass
        del locks[: LOCKS // 3]
        gc.collect()
        snapshot = prof.snapshot()
    return figures_of(snapshot)


def _of_the_pool(series: dict[tuple[str, frozenset[tuple[str, str]]], float]) -> Counter[str]:
    """How many series each family (each quantile of a summary) has for the pool's locks."""
    return Counter(
        name + "".join(v for k, v in labels if k == "quantile")
        for name, labels in series
        if ("label", "pool.py:68") in labels
    )


async def test_a_series_per_creation_site_not_per_lock() -> None:
    figures = await _figures()
    assert figures.resources is not None
    entries = [r for r in figures.resources.resources if r.label == "pool.py:68"]
    assert len(entries) > 1  # the live locks, and the aggregate of the gone ones

    series = _series(prometheus.render(figures))
    per_family = _of_the_pool(series)
    assert per_family["asyncflow_resource_acquisitions_total"] == 1, per_family
    assert set(per_family.values()) == {1}, per_family
    (acquired,) = [
        v
        for (name, labels), v in series.items()
        if name == "asyncflow_resource_acquisitions_total" and ("label", "pool.py:68") in labels
    ]
    assert acquired == 2 * LOCKS  # every lock's, live and gone, summed

    # asked for, a series per object: told apart by an id label
    per_object = _of_the_pool(_series(prometheus.render(figures, ids=True)))
    assert per_object["asyncflow_resource_acquisitions_total"] == len(entries)


async def test_opentelemetry_observes_a_point_per_creation_site() -> None:
    pytest.importorskip("opentelemetry.sdk.metrics")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from asyncflow.render import otel

    figures = await _figures()

    def points(ids: bool) -> list[Any]:
        reader = InMemoryMetricReader()
        reporter = otel.OtelReporter(meter_provider=MeterProvider(metric_readers=[reader]), ids=ids)
        reporter.open(lambda: figures)
        reporter.close(figures)
        data = reader.get_metrics_data()
        assert data is not None
        return [
            point
            for resource in data.resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
            if metric.name == "asyncflow.resource.acquisitions"
            for point in metric.data.data_points
            if (point.attributes or {}).get("label") == "pool.py:68"
        ]

    (site,) = points(ids=False)
    assert site.value == 2 * LOCKS
    assert len(points(ids=True)) > 1
