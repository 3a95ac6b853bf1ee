"""The web page's lineage (headless Chromium): under the flow graph, each path's end-to-end
percentiles, the hop that dominates its tail and its slowest message hop by hop; on the graph,
that hop's node marked; live, and over a recording (``asyncflow replay FILE --web``)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import asyncflow
from asyncflow.schema import FlowDocument, LineagePath, WarningEntry
from tests.render.test_web_page import (
    TOKEN,
    Element,
    _table_rows,
    by_id,
    needs_chromium,
    render,
)
from tests.render.test_web_recording import replay_web
from tests.support.recording import profiled
from tests.views.test_lineage import MESSAGES, SLOW_S, _pipeline

LABEL = "src → parse → enrich → sink"
DURATION = r"[0-9.]+ (ns|µs|ms|s)"


async def _planted() -> None:
    assert await _pipeline(SLOW_S) == list(range(MESSAGES))


def _nodes(elements: list[Element]) -> dict[str, Element]:
    return {e.attrs["data-id"]: e for e in elements if e.tag == "g" and "node" in e.classes}


def _assert_shows(
    elements: list[Element], flow: FlowDocument, warnings: list[WarningEntry]
) -> None:
    """The page shows the planted path as ``flow`` has it, its tail's hop (enrich) marked."""
    (path,) = [p for p in flow.lineage if p.label == LABEL]
    assert isinstance(path, LineagePath) and path.tail is not None
    rows = _table_rows(elements, "lineage")
    assert set(rows) == {f"path:{p.label}" for p in flow.lineage if len(p.channels) > 1}
    row, cells = rows[f"path:{LABEL}"]
    assert cells[:2] == [LABEL, f"{path.messages:,}"]
    for cell in cells[2:5]:  # p50, p99, max end to end
        assert re.fullmatch(DURATION, cell), cells
    # the tail's hop in the finding's words, with its share (the slow stage, but on a loaded
    # machine whose loop stalled longer: tests/views/test_lineage.py judges which hop it is)
    said = path.tail.said.replace("`", "")
    assert cells[5].startswith(f"{path.tail.share_percent}% {said} (mean "), cells
    # the slowest message: its end-to-end time, then each hop (channel, stage, ...)
    names = [h.name for h in path.slowest[0].hops]
    assert names == ["raw", "parse", "parsed", "enrich", "enriched"]
    hops = rf"{DURATION} = " + r" · ".join(
        rf"{n} {DURATION}" + (rf" \(busy {DURATION}\)" if n in ("parse", "enrich") else "")
        for n in names
    )
    assert re.fullmatch(hops, cells[6]), cells[6]

    # on the graph: the nodes along the path are the flow's, and the tail's hop's node (the
    # enrich future), only it, is marked with its share
    labels = {n.id: (n.kind, n.label) for n in flow.nodes}
    assert [labels[i][1] for i in path.node_ids] == [
        "src",
        "raw",
        "parse",
        "parsed",
        "enrich",
        "enriched",
        "sink",
    ]
    nodes = _nodes(elements)
    tail = path.node_ids[path.tail.hop + 1]
    marked = [i for i, n in nodes.items() if "tail" in n.classes]
    assert marked == [tail], marked
    assert nodes[tail].attrs["data-tail"] == str(path.tail.share_percent)
    kind = labels[tail][0]
    assert f"{kind} · p99 tail {path.tail.share_percent}%" in nodes[tail].content
    # when the finding holds (a loaded machine's loop lag may explain the tail away), the node
    # and the row are outlined as every warned subject is
    slow = [w for w in warnings if w.kind == "slow-path" and w.subject.label == LABEL]
    assert "warned" in nodes[tail].classes or not slow
    assert ("bad" in row.classes) == bool(slow)


@needs_chromium
def test_the_page_shows_each_paths_lineage_and_marks_its_tails_hop(tmp_path: Path) -> None:
    warn = "tail_lag_factor=1"
    with asyncflow.profile("lineage-page", format="none", port=0, token=TOKEN, warn=warn) as prof:
        asyncio.run(_planted())
        before = prof.snapshot()
        assert prof.url is not None
        (elements,) = render(f"{prof.url}/#token={TOKEN}", tmp_path=tmp_path)
        after = prof.snapshot()
    (body,) = [e for e in elements if e.tag == "body"]
    assert body.attrs["data-state"] == "ready", body.content[:500]
    assert before.flow is not None and after.flow == before.flow  # what the page read
    _assert_shows(elements, before.flow, before.warnings)
    assert by_id(elements, "lineage-count").content == "(1)"


@needs_chromium
def test_replay_web_shows_the_recorded_lineage(tmp_path: Path) -> None:
    path = tmp_path / "lineage.afrec"
    final = profiled(path, _planted, name="lineage-run", queues=False, warn="tail_lag_factor=1")
    assert final.flow is not None
    with replay_web(path) as url:
        (elements,) = render(f"{url}&at=1e9", tmp_path=tmp_path)
    (body,) = [e for e in elements if e.tag == "body"]
    assert body.attrs["data-state"] == "recording", body.content[:500]
    assert "the end state" in by_id(elements, "replay-at").content
    _assert_shows(elements, final.flow, final.warnings)
