"""The table report's calls: how long a call lived, and what the raised ones raised."""

from __future__ import annotations

import dataclasses

from asyncflow.render.report import render_table
from asyncflow.schema import (
    CallEntry,
    CallStates,
    ExceptionInfo,
    FutureEntry,
    FutureLogs,
    FuturesDocument,
    Location,
    Outcomes,
    ProfilerStatus,
    Snapshot,
)


def _entry(i: int, label: str, returned: int = 12, raised: int = 3) -> FutureEntry:
    return FutureEntry(
        id=i,
        label=label,
        source=f"m:{label}",
        location=Location("m.py", i),
        tracked_by="decorator",
        call_count=returned + raised,
        calls=CallStates(0, 0, 0, returned + raised, 0),
        outcomes=Outcomes(returned, raised, 0, 0, 0),
        total_polls=40,
        busy_ns=5_000_000,
        idle_ns=1_000_000,
        max_poll_duration_ns=500_000,
        poll_duration_ns={"p50": 1_000, "p95": 5_000, "p99": 9_000},
        call_duration_ns={"p50": 4_200_000, "p95": 200_000_000, "p99": 310_000_000},
    )


def _call(call_id: int, future_id: int, raised: tuple[str, str] | None) -> CallEntry:
    return CallEntry(
        call_id=call_id,
        future_id=future_id,
        state="ready",
        poll_count=2,
        total_poll_duration_ns=10,
        max_poll_duration_ns=5,
        last_poll_duration_ns=5,
        busy_ns=10,
        idle_ns=10,
        created_ns=0,
        first_poll_ns=1,
        finished_ns=20,
        current_elapsed_ns=None,
        task=None,
        outcome="raised" if raised else "returned",
        exception=ExceptionInfo(*raised) if raised else None,
        result=None,
    )


def _snapshot(entries: list[FutureEntry], logs: list[FutureLogs]) -> Snapshot:
    status = ProfilerStatus(
        1, "svc", "0", 1, "3.11", 2_000_000_000, False, 5, 3, 0, None, 2, 0, 0, 0
    )
    futures = FuturesDocument(1, len(entries), 0, len(entries), entries)
    return Snapshot(1, status, futures, future_logs=logs)


def test_each_future_shows_its_call_durations_beside_its_polls() -> None:
    text = render_table(_snapshot([_entry(1, "page")], []), (50.0, 95.0, 99.0), limit=0)
    header, row = text.splitlines()[2:4]
    assert header.split("  ")[0] == "future"
    columns = [c.strip() for c in header.split("  ") if c.strip()]
    assert columns[:5] == ["future", "calls", "ok/err/cxl", "p50 call", "p99 call"]
    assert columns[-4:] == ["p50 poll", "p95 poll", "p99 poll", "max poll"]
    # a call's whole life: p50 4.2 ms, p99 310 ms (the slow tail a gather waits for)
    assert row.split()[:7] == ["page", "15", "12/3/0", "4.2", "ms", "310", "ms"]
    # a percentile the report was not asked for is not made up: p50 only, then p50 only
    one = render_table(_snapshot([_entry(1, "page")], []), (50.0,), limit=0).splitlines()[2]
    assert "p50 call" in one and "p99 call" not in one
    # no finished call yet: no duration, a dash
    live = dataclasses.replace(_entry(1, "page"), call_duration_ns={})
    row = render_table(_snapshot([live], []), (50.0, 99.0), 0).splitlines()[3]
    assert row.split()[:5] == ["page", "15", "12/3/0", "-", "-"]


def test_the_exceptions_raised_are_named_under_their_future() -> None:
    raised = [("ValueError", "bad record"), ("KeyError", "'id'"), ("ValueError", "bad page")]
    calls = [_call(i, 1, r) for i, r in enumerate(raised)] + [_call(9, 1, None)]
    logs = [FutureLogs(1, 1, "parse", calls)]
    entries = [_entry(1, "parse"), _entry(2, "fetch", returned=5, raised=0)]
    lines = render_table(_snapshot(entries, logs), (50.0, 99.0), 0).splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("parse "))
    # newest first in the log: the last exception is the first listed
    assert lines[at + 1] == "  └ 3 raised: 2 ValueError, 1 KeyError; last ValueError: bad record"
    assert lines[at + 2].startswith("fetch ")  # nothing raised, no line


def test_exceptions_beyond_the_log_are_counted_not_named() -> None:
    # the log keeps the recent calls only: the types it saw are named as those of its calls
    calls = [_call(i, 1, ("TimeoutError", "")) for i in range(4)]
    entries = [_entry(1, "fetch", returned=100, raised=40)]
    lines = render_table(_snapshot(entries, [FutureLogs(1, 1, "fetch", calls)]), (50.0,), 0)
    assert "  └ 40 raised, 4 among the last 4 calls: 4 TimeoutError\n" in lines  # no message
    # a log with no raised call in it says so, and how many calls it holds
    returned = [_call(i, 1, None) for i in range(50)]
    text = render_table(_snapshot(entries, [FutureLogs(1, 1, "fetch", returned)]), (50.0,), 0)
    assert "  └ 40 raised, none among the last 50 calls logged\n" in text
    # no log at all (a report read back from an older file): the count only, no line
    assert "└" not in render_table(_snapshot(entries, []), (50.0,), 0)


def test_many_exception_types_are_named_most_first_and_the_rest_counted() -> None:
    raised = [("OSError", "not\nfound")] * 3 + [("KeyError", "k")] * 2 + [("ValueError", "v")]
    raised += [("TypeError", "t"), ("IndexError", "i")]
    calls = [_call(i, 1, r) for i, r in enumerate(raised)]
    entries = [_entry(1, "parse", returned=0, raised=len(raised))]
    text = render_table(_snapshot(entries, [FutureLogs(1, 1, "parse", calls)]), (50.0,), 0)
    # the last message is one line, however many the program put in it
    assert (
        "  └ 8 raised: 3 OSError, 2 KeyError, 1 ValueError and 2 other types;"
        " last OSError: not found\n" in text
    )


def test_the_types_are_those_of_the_whole_run_where_the_document_counts_them() -> None:
    """``FutureEntry.errors`` counts every call that raised, not only the log's: the line names
    the run's types, and the log gives the last message only."""
    calls = [_call(i, 1, ("ValueError", "bad row 7")) for i in range(4)]
    counted = dataclasses.replace(
        _entry(1, "fetch", returned=100, raised=25),
        errors={"TimeoutError": 20, "ValueError": 5},
    )
    lines = render_table(_snapshot([counted], [FutureLogs(1, 1, "fetch", calls)]), (50.0,), 0)
    assert "  └ 25 raised: 20 TimeoutError, 5 ValueError; last ValueError: bad row 7\n" in lines
    # no log (a report without logs): the run's types still
    assert "  └ 25 raised: 20 TimeoutError, 5 ValueError\n" in render_table(
        _snapshot([counted], []), (50.0,), 0
    )
    # types past the profiler's bound are counted together, and said so
    many = dataclasses.replace(
        counted, errors={"OSError": 10, "KeyError": 8, "ValueError": 4, "(other)": 3}
    )
    text = render_table(_snapshot([many], []), (50.0,), 0)
    assert "  └ 25 raised: 10 OSError, 8 KeyError, 4 ValueError and 3 of other types\n" in text


def test_the_header_says_how_many_raised_tasks_never_retrieved_could_not_judge() -> None:
    snapshot = _snapshot([_entry(1, "fetch")], [])
    assert "unjudged" not in render_table(snapshot, (50.0,), 0).splitlines()[0]
    status = dataclasses.replace(snapshot.status, unretrieved_dropped=1_200)
    header = render_table(dataclasses.replace(snapshot, status=status), (50.0,), 0)
    assert header.splitlines()[0].endswith(
        " · 1,200 raised tasks unjudged (never-retrieved remembers 1,000 at once)"
    )
