"""The lag a stage causes itself does not excuse its own tail (the reviewer's `svc.py`): a
pricing stage blocks the loop with CPU work for one message in ten, so the loop's p99 lag is
its blocks; the tail-latency and slow-path lints take a late loop's lag as the cause of a
tail (every call woken late at each await), which dropped the very stage that made it late.
Lag from other code's blocks still explains a tail, as before."""

from __future__ import annotations

import dataclasses

from asyncflow import schema
from asyncflow.views import lints
from asyncflow.views.lints import Documents, Finding, Thresholds
from tests.views.test_lints_cause import blocking_line, future, loop_with
from tests.views.test_lints_tail import tail

MS = 1_000_000


def _path() -> schema.LineagePath:
    """ingest → price → store: most messages take 2 ms, one in ten 62 ms, in `price`."""
    hops = [
        schema.LineageHop("channel", "raw", 1 * MS),
        schema.LineageHop("stage", "price", 60 * MS, 60 * MS),
        schema.LineageHop("channel", "priced", 1 * MS),
    ]
    return schema.LineagePath(
        label="ingest → price → store",
        stages=["ingest", "price", "store"],
        channels=["raw", "priced"],
        messages=400,
        end_to_end_ns={"p50": 2 * MS, "p99": 62 * MS},
        max_end_to_end_ns=62 * MS,
        mean_hops=hops,
        slowest=[schema.LineageMessage(62 * MS, 0, hops)],
    )


def _loop(blocker: str, fid: int) -> schema.LoopEntry:
    """A loop late by 40 ms at p99 (four awaits of it: 160 ms, more than either tail's
    excess), blocked 40 times for 60 ms, computing, by ``blocker``."""
    line = dataclasses.replace(
        blocking_line("cpu", 2400 * MS, total_ns=2400 * MS),
        count=40,
        max_ns=60 * MS,
        future_id=fid,
        label=blocker,
    )
    return dataclasses.replace(loop_with(line), lag_ns={"p50": 1 * MS, "p99": 40 * MS})


def _slow(loop: schema.LoopEntry, future: schema.FutureEntry) -> list[Finding]:
    docs = Documents(0, 15_000 * MS, futures=[future], loops=[loop], paths=[_path()])
    found = list(lints.slow_path(docs, Thresholds()))
    return found + list(lints.tail_latency(docs, Thresholds()))


def test_a_stage_that_blocks_the_loop_keeps_its_own_tail() -> None:
    fetch = dataclasses.replace(tail(), call_duration_ns={"p50": 5 * MS, "p99": 150 * MS})
    # the path's `price` stage made the loop late: its tail is its own
    (path,) = _slow(_loop("price", 7), fetch)
    assert path.kind == "slow-path" and "in `price`" in path.message
    # `fetch_price` (id 1) blocks the loop itself: its tail is its own too
    assert [f.kind for f in _slow(_loop("fetch_price", 1), fetch)] == ["tail-latency"]


def test_lag_from_other_code_still_explains_a_tail() -> None:
    fetch = dataclasses.replace(tail(), call_duration_ns={"p50": 5 * MS, "p99": 150 * MS})
    assert _slow(_loop("housekeeping", 9), fetch) == []


def test_the_blocking_warning_says_which_count_is_which() -> None:
    # the monitor saw 12 of the worker's 30 ms blocks (361 ms), its polls held the loop 1.21 s
    line = dataclasses.replace(
        blocking_line("cpu", 361 * MS, total_ns=361 * MS), count=12, max_ns=30 * MS
    )
    worker = dataclasses.replace(future(1, "handler", 1210 * MS, 31 * MS), idle_ns=4000 * MS)
    parse = future(2, "parse", 16 * MS, 1 * MS)
    docs = Documents(0, 5300 * MS, futures=[worker, parse], loops=[loop_with(line)])
    (finding,) = [f for f in lints.evaluate(docs, Thresholds()) if f.kind == "loop-blocked"]
    assert finding.message.endswith(
        "; those are the blocks the loop's monitor saw: all of `handler`'s polls, every one "
        "counted, held the loop 1.21 s"
    )
