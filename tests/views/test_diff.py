"""The comparison of two runs: entries matched by label, changes beyond noise only, regressions
first, entries and findings in one run only, and the failing figures named."""

from __future__ import annotations

from typing import Any

import pytest

from asyncflow import schema
from asyncflow.schema import Snapshot
from asyncflow.views.diff import DiffOptions, FigureChange, diff

MS = 1_000_000


def _future(
    label: str,
    *,
    fid: int = 1,
    calls: int = 40,
    call_p50: int = 3 * MS,
    busy: int = 2 * MS,
    raised: int = 0,
    max_poll: int = 50_000,
) -> dict[str, Any]:
    return {
        "id": fid,
        "label": label,
        "source": f"app:{label}",
        "location": {"file": "/src/app.py", "line": 10 + fid},
        "tracked_by": "own_code",
        "call_count": calls,
        "calls": {"pending": 0, "running": 0, "suspended": 0, "ready": calls, "cancelled": 0},
        "outcomes": {
            "returned": calls - raised,
            "raised": raised,
            "cancelled": 0,
            "closed": 0,
            "never_awaited": 0,
        },
        "total_polls": calls * 2,
        "busy_ns": busy,
        "idle_ns": calls * call_p50,
        "max_poll_duration_ns": max_poll,
        "poll_duration_ns": {"p50": 20_000, "p95": 40_000, "p99": 50_000},
        "call_duration_ns": {"p50": call_p50, "p95": call_p50 * 2, "p99": call_p50 * 3},
    }


def _channel(label: str, *, cid: int = 1, sent: int = 40, p50: int = 10 * MS) -> dict[str, Any]:
    return {
        "id": cid,
        "label": label,
        "kind": "asyncio.Queue",
        "channel_type": "bounded[2]",
        "state": "closed",
        "sent_count": sent,
        "received_count": sent,
        "unpaired_count": 0,
        "queue_size": 0,
        "max_queue_size": 2,
        "send_rate": 100.0,
        "receive_rate": 100.0,
        "delay_ns": {"p50": p50, "p95": p50, "p99": p50},
        "max_delay_ns": p50,
        "producers_blocked_ns": 0,
        "consumers_starved_ns": 0,
        "senders": [],
        "receivers": [],
        "timed_count": sent,
    }


def _warning(kind: str, label: str) -> dict[str, Any]:
    return {
        "kind": kind,
        "severity": "warning",
        "subject": {"kind": "channel", "id": 1, "label": label, "location": None},
        "message": f"{kind} at {label}",
        "hint": "",
        "evidence": {},
        "first_seen_ns": 0,
        "last_seen_ns": 0,
        "active": True,
    }


def _snapshot(
    futures: list[dict[str, Any]],
    channels: list[dict[str, Any]] | None = None,
    warnings: list[dict[str, Any]] | None = None,
    uptime_ns: int = 400 * MS,
    lag_p95: int | None = None,
) -> Snapshot:
    page = {"schema": 1, "total": 0, "offset": 0, "limit": 0}
    return schema.load(
        Snapshot,
        {
            "schema": 1,
            "status": {
                "schema": 1,
                "name": "app",
                "version": "0.1.0",
                "pid": 1,
                "python": "3.11.7",
                "uptime_ns": uptime_ns,
                "running": False,
                "events_recorded": 0,
                "events_dropped": 0,
                "internal_errors": 0,
                "last_internal_error": None,
                "futures": len(futures),
                "calls_live": 0,
                "channels": 0,
                "streams": 0,
            },
            "futures": {**page, "futures": futures},
            "channels": {**page, "channels": channels or []},
            "warnings": warnings or [],
            "loop": {
                "schema": 1,
                "block_threshold_ns": 100 * MS,
                "loops": [] if lag_p95 is None else [_loop(lag_p95)],
            },
        },
    )


def _loop(lag_p95: int) -> dict[str, Any]:
    return {
        "id": 1,
        "label": "main",
        "thread": "MainThread",
        "state": "running",
        "lag_now_ns": 0,
        "lag_ns": {"p50": lag_p95 // 10, "p95": lag_p95},
        "max_lag_ns": lag_p95,
        "heartbeats": 20,
        "tasks_alive": 1,
        "running": None,
        "blocked": False,
        "blocked_count": 0,
        "episodes": [],
    }


def _named(changes: list[FigureChange]) -> list[tuple[str, str, str]]:
    return [(c.name, c.figure, c.verdict) for c in changes]


def test_the_same_run_has_no_change() -> None:
    run = _snapshot([_future("check"), _future("price", fid=2)], [_channel("app.py:39")])
    result = diff(run, run)
    assert result.changes == [] and result.appeared == [] and result.vanished == []
    assert result.compared == 3
    assert not result.failed and result.failures == []


def test_a_coroutine_four_times_slower_fails_and_is_named_first() -> None:
    base = _snapshot([_future("check"), _future("price", fid=2)])
    new = _snapshot([_future("check"), _future("price", fid=2, call_p50=12 * MS)])
    result = diff(base, new)
    first = result.changes[0]
    assert (first.name, first.figure, first.verdict) == ("price", "call p50", "worse")
    assert first.ratio == 4.0 and first.failed
    assert result.failed and result.failures == ["future `price`: call p50 4.00x"]
    assert all(c.name == "price" for c in result.changes)  # check did not move
    # p95 and p99 over 40 calls have too few samples above them to be compared
    assert result.percentiles_skipped > 0
    assert {c.figure for c in result.changes} == {"call p50"}


def test_fail_over_is_a_strict_bound_and_inf_never_fails() -> None:
    base = _snapshot([_future("price")])
    new = _snapshot([_future("price", call_p50=6 * MS)])  # 2x
    assert not diff(base, new, DiffOptions(fail_over=2.0)).failed
    assert diff(base, new, DiffOptions(fail_over=1.5)).failed
    assert not diff(base, new, DiffOptions(fail_over=float("inf"))).failed


def test_noise_is_a_ratio_and_a_floor() -> None:
    base = _snapshot([_future("small", call_p50=100_000), _future("big", fid=2, call_p50=50 * MS)])
    new = _snapshot(
        [
            _future("small", call_p50=400_000),  # 4x, but 0.3 ms: under the 1 ms floor
            _future("big", fid=2, call_p50=60 * MS),  # 10 ms, but 1.2x: under the ratio
        ]
    )
    assert diff(base, new).changes == []
    loose = diff(base, new, DiffOptions(threshold=1.1, min_time_ns=100_000))
    assert _named(loose.changes) == [
        ("small", "call p50", "worse"),
        ("big", "call p50", "worse"),
    ]


def test_a_total_of_time_must_move_by_a_floor_and_a_share_of_the_run() -> None:
    base = _snapshot([_future("price", busy=1 * MS)], uptime_ns=400 * MS)
    new = _snapshot([_future("price", busy=6 * MS)], uptime_ns=400 * MS)
    assert diff(base, new).changes == []  # 6x, but 5 ms: one switch interval, under 10 ms
    moved = diff(base, new, DiffOptions(min_total_ns=MS)).changes
    assert _named(moved) == [("price", "busy (trimmed)", "worse")]
    base = _snapshot([_future("price", busy=20 * MS)], uptime_ns=10_000 * MS)
    new = _snapshot([_future("price", busy=80 * MS)], uptime_ns=10_000 * MS)
    assert diff(base, new).changes == []  # 60 ms of a 10 s run: under 1% of it
    moved = diff(base, new, DiffOptions(min_share=0.001)).changes
    assert _named(moved) == [("price", "busy (trimmed)", "worse")]


def test_one_long_poll_does_not_make_a_busy_time_worse() -> None:
    base = _snapshot([_future("main", calls=1, busy=MS)])
    # one poll 12 ms longer: the interpreter ran the profiler's thread in the middle of it
    new = _snapshot([_future("main", calls=1, busy=13 * MS, max_poll=12 * MS + 50_000)])
    assert diff(base, new).changes == []
    twice = _snapshot([_future("main", calls=1, busy=25 * MS, max_poll=12 * MS + 50_000)])
    assert _named(diff(base, twice).changes) == [("main", "busy (trimmed)", "worse")]


def test_a_late_loop_raises_a_percentiles_floor_and_is_said() -> None:
    base = _snapshot([_future("check", call_p50=10 * MS)], lag_p95=100_000)
    # a machine too busy: every wake-up of the new run came up to 6 ms late
    new = _snapshot([_future("check", call_p50=15 * MS)], lag_p95=6 * MS)
    result = diff(base, new)
    assert result.changes == [] and result.new.loop_lag_p95_ns == 6 * MS
    assert result.cautions == [
        "the new run's event loop was late by 6 ms at p95 (a machine too busy?): its "
        "durations are longer by as much, and a percentile must move by more to count"
    ]
    slower = _snapshot([_future("check", call_p50=40 * MS)], lag_p95=6 * MS)
    assert _named(diff(base, slower).changes) == [("check", "call p50", "worse")]
    calm = _snapshot([_future("check", call_p50=10 * MS)], lag_p95=100_000)
    assert diff(base, calm).cautions == []


def test_percentiles_of_too_few_calls_are_not_compared() -> None:
    base = _snapshot([_future("rare", calls=10)])
    new = _snapshot([_future("rare", calls=10, call_p50=30 * MS)])
    result = diff(base, new)
    assert result.changes == [] and result.percentiles_skipped == 5  # polls' p50 is compared
    assert _named(diff(base, new, DiffOptions(min_samples=5)).changes)[0] == (
        "rare",
        "call p50",
        "worse",
    )


def test_counts_change_without_failing_and_errors_fail_from_zero() -> None:
    base = _snapshot([_future("fetch", calls=40)])
    new = _snapshot([_future("fetch", calls=80, raised=6)])
    result = diff(base, new)
    by_figure = {c.figure: c for c in result.changes}
    assert by_figure["calls"].verdict == "changed" and not by_figure["calls"].failed
    raised = by_figure["raised"]
    assert (raised.base, raised.new, raised.ratio, raised.verdict) == (0, 6, None, "worse")
    assert result.failures == ["future `fetch`: raised from 0"]
    assert result.changes[0] is raised  # from 0: the largest regression


def test_improvements_come_after_regressions() -> None:
    base = _snapshot([_future("a", call_p50=10 * MS), _future("b", fid=2, call_p50=10 * MS)])
    new = _snapshot([_future("a", call_p50=2 * MS), _future("b", fid=2, call_p50=15 * MS)])
    assert _named(diff(base, new).changes) == [
        ("b", "call p50", "worse"),
        ("a", "call p50", "better"),
    ]


def test_entries_and_findings_in_one_run_only() -> None:
    base = _snapshot(
        [_future("check"), _future("old", fid=2)],
        warnings=[_warning("bottleneck", "orders"), _warning("slow-tail", "x")],
    )
    new = _snapshot(
        [_future("check"), _future("new", fid=3, calls=7)],
        warnings=[_warning("bottleneck", "orders"), _warning("lock-contention", "y")],
    )
    result = diff(base, new)
    assert [(e.kind, e.name, e.count) for e in result.appeared] == [("future", "new", 7)]
    assert [(e.kind, e.name) for e in result.vanished] == [("future", "old")]
    assert [(f.kind, f.subject) for f in result.findings_appeared] == [("lock-contention", "y")]
    assert [(f.kind, f.subject) for f in result.findings_vanished] == [("slow-tail", "x")]
    assert result.compared == 1 and not result.failed


def test_ids_do_not_match_entries_labels_do() -> None:
    base = _snapshot([_future("check", fid=1), _future("price", fid=2)])
    new = _snapshot([_future("price", fid=1), _future("check", fid=2)])
    result = diff(base, new)
    assert result.changes == [] and result.appeared == [] and result.compared == 2


def test_a_creation_site_that_moved_is_the_same_channel() -> None:
    base = _snapshot([], [_channel("app.py:39", p50=10 * MS)])
    new = _snapshot([], [_channel("app.py:41", p50=40 * MS)])
    result = diff(base, new)
    assert result.appeared == [] and result.vanished == []
    assert _named(result.changes) == [("app.py:41", "time in queue p50", "worse")]


def test_entries_sharing_a_label_are_summed_without_their_percentiles() -> None:
    base = _snapshot([], [_channel("app.py:9", sent=40), _channel("app.py:9", cid=2, sent=40)])
    new = _snapshot([], [_channel("app.py:9", sent=100, p50=90 * MS)])
    result = diff(base, new)
    # 80 messages sent before (two queues summed), 100 now; the delay's p50 of two queues
    # together is not known, so it is not compared
    assert _named(result.changes) == [
        ("app.py:9", "sent", "changed"),
        ("app.py:9", "received", "changed"),
    ]
    assert result.changes[0].base == 80


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ({"threshold": 1.0}, "threshold=1.0: expected a ratio above 1"),
        ({"fail_over": 0.5}, "fail_over=0.5: expected a ratio >= 1"),
        ({"fail_over": float("nan")}, "fail_over=nan"),
        ({"min_time_ns": -1}, "min_time_ns=-1"),
        ({"min_total_ns": -1}, "min_total_ns=-1"),
        ({"min_count": 0}, "min_count=0"),
        ({"min_share": 1.5}, "min_share=1.5"),
        ({"min_samples": 0}, "min_samples=0"),
    ],
)
def test_bad_options_are_named(given: dict[str, Any], said: str) -> None:
    with pytest.raises(ValueError, match=said.replace(".", r"\.").replace("=", "=")):
        DiffOptions(**given)
