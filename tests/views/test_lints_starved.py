"""A tail a machine short of CPU explains is no finding: the time the loop's thread waited for a
core inside its blocks (kind ``cpu``, off the CPU) counts as the loop's lateness, beside its
heartbeats' p99 lag. Seen on the healthy FastAPI service under uvloop on a loaded machine
(tests/services/test_healthy.py): its handler's p99 call took 965 ms, its median 9 ms, while its
loop lagged 76 ms at p99 but waited 1.06 s for a core in blocks the monitor saw."""

from __future__ import annotations

import dataclasses

from asyncflow import schema
from asyncflow.views import lints
from asyncflow.views.lints import Documents, Finding, Thresholds
from tests.views.test_lints_cause import blocking_line, loop_with
from tests.views.test_lints_tail import tail

MS = 1_000_000


def _handler() -> schema.FutureEntry:
    """The healthy service's handler as the loaded run measured it: p50 9 ms, p99 965 ms."""
    return dataclasses.replace(
        tail(),
        call_count=400,
        outcomes=schema.Outcomes(400, 0, 0, 0, 0),
        call_duration_ns={"p50": 9 * MS, "p95": 713 * MS, "p99": 965 * MS},
    )


def _loop(*lines: schema.BlockedLine) -> schema.LoopEntry:
    return dataclasses.replace(loop_with(*lines), lag_ns={"p50": 1 * MS, "p99": 76 * MS})


def _kinds(loop: schema.LoopEntry, lineage: list[schema.LineagePath] | None = None) -> list[str]:
    docs = Documents(0, 15_000 * MS, futures=[_handler()], loops=[loop], paths=lineage or [])
    found: list[Finding] = list(lints.tail_latency(docs, Thresholds()))
    found += lints.slow_path(docs, Thresholds())
    return [f.kind for f in found]


def test_a_tail_the_loops_wait_for_a_core_explains_is_no_finding() -> None:
    # 1.2 s in blocks, 10% of it on the CPU: its thread was runnable, waiting for a core
    starved = blocking_line("cpu", 120 * MS, total_ns=1200 * MS)
    assert _kinds(_loop(starved)) == []


def test_a_tail_beside_real_cpu_work_or_a_blocking_call_is_still_one() -> None:
    # the same blocks on the CPU all along (computing: the program's own) or sleeping in a
    # blocking call: no core was missing, the tail is the program's
    assert _kinds(_loop(blocking_line("cpu", 1200 * MS, total_ns=1200 * MS))) == ["tail-latency"]
    assert _kinds(_loop(blocking_line("blocking", 120 * MS, 1200 * MS))) == ["tail-latency"]
    # a loop that waited for a core much less than the tail's excess
    starved = blocking_line("cpu", 30 * MS, total_ns=300 * MS)
    assert _kinds(_loop(starved)) == ["tail-latency"]


def test_the_slow_path_finding_judges_the_loop_alike() -> None:
    hops = [
        schema.LineageHop("channel", "raw", 1 * MS),
        schema.LineageHop("stage", "enrich", 963 * MS, 1 * MS),
        schema.LineageHop("channel", "out", 1 * MS),
    ]
    path = schema.LineagePath(
        label="src → enrich → sink",
        stages=["src", "enrich", "sink"],
        channels=["raw", "out"],
        messages=400,
        end_to_end_ns={"p50": 9 * MS, "p99": 965 * MS},
        max_end_to_end_ns=965 * MS,
        mean_hops=hops,
        slowest=[schema.LineageMessage(965 * MS, 0, hops)],
    )
    real = blocking_line("cpu", 1200 * MS, total_ns=1200 * MS)
    assert _kinds(_loop(real), [path]) == ["tail-latency", "slow-path"]
    starved = blocking_line("cpu", 120 * MS, total_ns=1200 * MS)
    assert _kinds(_loop(starved), [path]) == []


def test_late_wake_ups_count_as_waiting_for_a_core() -> None:
    # no code blocked the loop, but its heartbeat was late by more than the block threshold
    # (100 ms) ten times while the loop waited in its selector: its thread waited for a core
    # at least a second in all
    loop = dataclasses.replace(_loop(), late_wakeups=10)
    assert _kinds(loop) == []
    assert _kinds(dataclasses.replace(loop, late_wakeups=2)) == ["tail-latency"]
