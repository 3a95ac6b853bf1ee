"""The endpoint serves the lineage inside ``/flow`` (the documents' schema, over real HTTP), and
``/warnings`` names the planted slow stage's hop."""

from __future__ import annotations

import asyncio

import jsonschema
import pytest

import asyncflow
from tests.support.http import get
from tests.views.test_lineage import MESSAGES, SLOW_S, _pipeline


@pytest.fixture(autouse=True)
def _from_the_endpoint_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCFLOW_ENDPOINT_PROCESS", "1")


def test_flow_serves_each_paths_percentiles_and_slowest_hops() -> None:
    with asyncflow.profile("lineage", format="none", port=0, warn="tail_lag_factor=1") as prof:
        assert asyncio.run(_pipeline(SLOW_S)) == list(range(MESSAGES))
        assert prof.url is not None
        status, flow, _ = get(prof.url, "/flow")
        _, spec, _ = get(prof.url, "/openapi.json")
        _, warnings, _ = get(prof.url, "/warnings")
    assert status == 200
    jsonschema.Draft202012Validator(
        {"$ref": "#/components/schemas/FlowDocument", "components": spec["components"]}
    ).validate(flow)
    (path,) = [p for p in flow["lineage"] if p["label"] == "src → parse → enrich → sink"]
    assert path["channels"] == ["raw", "parsed", "enriched"]
    assert path["messages"] >= MESSAGES - 1
    assert set(path["end_to_end_ns"]) >= {"p50", "p99"}
    assert path["end_to_end_ns"]["p99"] >= SLOW_S * 1e9
    hops = path["slowest"][0]["hops"]
    assert [h["kind"] for h in hops] == ["channel", "stage", "channel", "stage", "channel"]
    assert sum(h["duration_ns"] for h in hops) == path["slowest"][0]["end_to_end_ns"]
    assert [h["name"] for h in path["mean_hops"]] == [
        "raw",
        "parse",
        "parsed",
        "enrich",
        "enriched",
    ]
    assert flow["lineage_dropped"] == 0
    kinds = [w["kind"] for w in warnings["warnings"]]
    if "slow-path" in kinds:  # (a loaded machine's loop lag may explain the tail away)
        (w,) = [w for w in warnings["warnings"] if w["kind"] == "slow-path"]
        assert w["subject"] == {
            "kind": "path",
            "id": None,
            "label": path["label"],
            "location": None,
        }
        assert "enrich" in w["message"]
