"""The table report: human units, ordering by busy time, the limit."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import re
from pathlib import Path
from typing import Any

import anyio
import pytest

import asyncflow
from asyncflow.clock import FakeClock
from asyncflow.render import report
from asyncflow.render.report import format_duration, render, render_table
from asyncflow.schema import (
    OWN_CODE,
    CallStates,
    FutureEntry,
    FuturesDocument,
    Location,
    Outcomes,
    ProfilerStatus,
    Snapshot,
    WarningEntry,
    WarningSubject,
)


@pytest.mark.parametrize(
    ("ns", "text"),
    [
        (None, "-"),
        (0, "0 ns"),
        (850, "850 ns"),
        (12_300, "12.3 µs"),
        (4_560_000, "4.56 ms"),
        (1_230_000_000, "1.23 s"),
        (7_200_000_000_000, "7,200 s"),
    ],
)
def test_human_units(ns: int | None, text: str) -> None:
    assert format_duration(ns) == text


def _entry(i: int, label: str, busy: int) -> FutureEntry:
    return FutureEntry(
        id=i,
        label=label,
        source=f"m:{label}",
        location=Location("m.py", i),
        tracked_by="decorator",
        call_count=10 * i,
        calls=CallStates(0, 0, 1, 8, 1),
        outcomes=Outcomes(7, 1, 1, 0, 0),
        total_polls=40 * i,
        busy_ns=busy,
        idle_ns=2 * busy,
        max_poll_duration_ns=busy // 10,
        poll_duration_ns={"p50": 1_000, "p99": 9_000},
        call_duration_ns={"p50": 50_000, "p99": 90_000},
    )


def _snapshot(entries: list[FutureEntry]) -> Snapshot:
    status = ProfilerStatus(
        1, "svc", "0", 1, "3.11", 2_000_000_000, False, 5, 3, 0, None, 2, 0, 0, 0
    )
    return Snapshot(1, status, FuturesDocument(1, len(entries), 0, len(entries), entries))


def test_table_header_columns_rows_and_limit() -> None:
    snap = _snapshot([_entry(1, "fetch", 5_000_000), _entry(2, "parse", 1_000)])
    text = render_table(snap, (50.0, 99.0), limit=1)
    lines = text.splitlines()
    assert lines[0] == "asyncflow · svc · elapsed 2 s · 2 futures · 30 calls · 3 events dropped"
    assert lines[2].split() == [
        "future",
        "calls",
        "ok/err/cxl",
        "p50",
        "call",
        "p99",
        "call",
        "polls",
        "busy",
        "idle",
        "p50",
        "poll",
        "p99",
        "poll",
        "max",
        "poll",
    ]
    assert lines[3].split() == [
        "fetch",
        "10",
        "7/1/1",
        "50",
        "µs",
        "90",
        "µs",
        "40",
        "5",
        "ms",
        "10",
        "ms",
        "1",
        "µs",
        "9",
        "µs",
        "500",
        "µs",
    ]
    assert lines[4] == "… 1 more future (limit=1; limit=0 shows all)"
    assert "parse" in render_table(snap, (50.0,), limit=0)


def test_futures_never_called_are_named_not_listed_as_rows() -> None:
    # A program that ended before calling anything (a usage error, say) showed a table of
    # zeros: the futures it defined are named on one line instead.
    idle = [dataclasses.replace(_entry(i, f"never{i}", 0), call_count=0) for i in range(1, 11)]
    text = render_table(_snapshot([_entry(1, "fetch", 5_000_000), *idle]), (50.0,), limit=0)
    lines = text.splitlines()
    assert lines[0].startswith("asyncflow · svc · elapsed 2 s · 11 futures · 10 calls")
    assert [line.split()[0] for line in lines[3:4]] == ["fetch"]
    assert lines[4] == "never called: " + ", ".join(f"never{i}" for i in range(1, 9)) + (
        " and 2 more"
    )
    assert not any(line.startswith("never1 ") for line in lines)
    only_idle = render_table(_snapshot(idle[:2]), (50.0,), limit=0).splitlines()
    assert only_idle[2:] == ["never called: never1, never2"]


def test_empty_table_says_how_to_track_something() -> None:
    assert "@asyncflow.future" in render(_snapshot([]), "table", (50.0,), 15)


def test_unknown_format() -> None:
    with pytest.raises(ValueError, match="format"):
        render(_snapshot([]), "xml", (50.0,), 15)


def test_source_files_are_shown_relative_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `python examples/x.py` gives the script's code an absolute path, `asyncflow run` a
    # relative one: the report says examples/x.py for both.
    monkeypatch.chdir(tmp_path)
    inside = tmp_path / "examples" / "every_problem.py"
    assert report._path(str(inside)) == os.path.join("examples", "every_problem.py")
    assert report._path("examples/every_problem.py") == "examples/every_problem.py"
    elsewhere = str(tmp_path.parent / "lib" / "site.py")
    assert report._path(elsewhere) == elsewhere


def test_names_the_program_chose_cannot_drive_the_terminal(tmp_path: Path) -> None:
    """A thread's name and a value logged are the program's strings: the table report shows
    their control characters escaped, never raw (an ESC would recolour or clear the screen)."""
    import threading

    import asyncflow

    out = tmp_path / "report.txt"
    gate = threading.Event()
    worker = threading.Thread(target=gate.wait, args=(10,), name="pool\x1b[2J-1", daemon=True)
    worker.start()
    try:
        with asyncflow.profile("escapes", format="table", output=str(out)):
            asyncflow.value("state", "\x1b[31mred\x07")
    finally:  # the thread lives until the report is written
        gate.set()
        worker.join()
    text = out.read_text()
    assert "pool\\x1b[2J-1" in text  # the thread is listed, its name escaped
    assert "\x1b" not in text and "\x07" not in text
    assert report.printable("a\tb\nc") == "a\\tb\nc"  # line breaks stay, tabs are shown


def test_gone_objects_and_their_aggregates_say_so_in_their_names() -> None:
    """Pools made per job leave an aggregate of the gone ones and the last few as they were:
    neither may read as one living executor."""
    import asyncio
    import concurrent.futures
    import gc

    import asyncflow
    from asyncflow.instrumentation import executors

    made = executors.GONE_KEPT + 40

    async def main() -> None:
        loop = asyncio.get_running_loop()
        with asyncflow.instrument_executors():
            for _ in range(made):
                with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="thumbs") as ex:
                    assert await loop.run_in_executor(ex, sum, [1, 2]) == 3
            gc.collect()

    gc.collect()  # earlier tests' loops go now, not in main() with their default executors
    with asyncflow.profile("pools", format="none", port=None) as prof:
        asyncio.run(main())
        snap = prof.snapshot()
    text = render_table(snap, (50.0,), limit=0)
    rows = [line for line in text.splitlines() if line.startswith("ThreadPoolExecutor thumbs")]
    summed = [r for r in rows if "gone, summed)" in r]
    assert len(summed) == 1 and f"({made - executors.GONE_KEPT:,} gone, summed)" in summed[0]
    assert sum("thumbs (gone)" in r for r in rows) == executors.GONE_KEPT
    assert len(rows) == executors.GONE_KEPT + 1  # nothing else: no living pool is listed
    # a living future keeps its bare name; at the program's end (the exit report, where most
    # objects may be gone) only aggregates are named as such
    live = dataclasses.replace(_entry(1, "fetch", 5_000_000))
    gone = dataclasses.replace(_entry(2, "parse", 4_000_000), alive=False)
    folded = dataclasses.replace(_entry(3, "parse", 3_000_000), alive=False, folded_count=1_200)
    dropped = dataclasses.replace(gone, call_count=0)

    def names(running: bool) -> list[str]:
        snap = _snapshot([live, gone, folded, dropped])
        snap = dataclasses.replace(snap, status=dataclasses.replace(snap.status, running=running))
        lines = render_table(snap, (50.0,), 0).splitlines()
        return [line.split("  ")[0] for line in lines[3:6]] + [lines[6]]

    assert names(True) == [
        "fetch", "parse (gone)", "parse (1,200 gone, summed)", "never called: parse (gone)",
    ]  # fmt: skip
    assert names(False) == ["fetch", "parse", "parse (1,200 gone, summed)", "never called: parse"]
    assert report._poll_row(gone, True)[0] == "parse (gone)"  # the CPU and allocations table


def test_a_gone_queue_is_named_gone_beside_a_living_one() -> None:
    import asyncio
    import gc

    import asyncflow

    async def main() -> asyncio.Queue[int]:
        with asyncflow.instrument_queues():
            queues = [asyncio.Queue[int]() for _ in range(3)]
        for q in queues:
            q.put_nowait(1)
            q.get_nowait()
        return queues[0]

    gc.collect()
    with asyncflow.profile("queues", format="none", port=None) as prof:
        kept = asyncio.run(main())
        gc.collect()
        snap = prof.snapshot()
    assert snap.channels is not None
    mine = [c for c in snap.channels.channels if c.sent_count and c.kind == "asyncio.Queue"]
    assert sorted(c.alive for c in mine) == [False, False, True]
    names = [report._channel_row(c, True)[0] for c in mine]
    assert sorted(names) == sorted([f"{mine[0].label} (gone)"] * 2 + [mine[0].label])
    assert kept.qsize() == 0


def test_the_header_counts_in_the_singular_where_there_is_one() -> None:
    one = dataclasses.replace(_entry(1, "fetch", 5_000_000), call_count=1)
    snap = _snapshot([one])
    snap = dataclasses.replace(
        snap, status=dataclasses.replace(snap.status, events_dropped=1, internal_errors=1)
    )
    header = render_table(snap, (50.0,), limit=0).splitlines()[0]
    assert header.endswith("· 1 future · 1 call · 1 event dropped · 1 internal error"), header
    many = _snapshot([_entry(1, "fetch", 5_000_000), _entry(2, "parse", 1_000)])
    assert "· 2 futures · 30 calls · 3 events dropped" in render_table(many, (50.0,), 0)


def test_the_scheduled_delay_is_a_column_only_where_a_wake_up_was_measured() -> None:
    """The loop kept a woken call waiting 4 ms at p99: the table says so beside idle; a
    future with no wake-up measured (uvloop, a call awaited inside another) shows ``-``, not
    a misleading 0; and with none measured anywhere the table stays as narrow as before."""
    woken = dataclasses.replace(
        _entry(1, "woken", 5_000_000),
        scheduled_ns=9_000_000,
        scheduled_polls=3,
        max_scheduled_ns=4_100_000,
        scheduled_delay_ns={"p50": 2_000_000, "p99": 4_000_000},
    )
    unmeasured = _entry(2, "inner", 1_000)
    lines = render_table(_snapshot([woken, unmeasured]), (50.0, 99.0), limit=0).splitlines()
    head = lines[2]
    assert head.split()[head.split().index("idle") + 1 : head.split().index("idle") + 3] == [
        "sched",
        "p99",
    ]
    at = slice(head.index("sched p99") - 2, head.index("sched p99") + len("sched p99"))
    assert lines[3][at].strip() == "4 ms"
    assert lines[4][at].strip() == "-"
    plain = render_table(_snapshot([unmeasured]), (50.0, 99.0), limit=0).splitlines()
    assert "sched" not in plain[2]


async def test_the_resource_table_counts_the_holds_open_now_as_held_so_far(
    fake_clock: FakeClock,
) -> None:
    """A lock held when the report is written (a deadlock's at SIGTERM, a permit never given
    back) reads as held for as long as it has been so far, not 0 ns: its hold total and max
    hold count it beside the holds that ended."""
    with asyncflow.profile("open", format="none", port=None, sampling=1) as prof:
        gate = asyncflow.instrument_lock(asyncio.Lock(), name="gate")
        async with gate:
            fake_clock.advance(2_000_000)  # a hold that ended: 2 ms
        await gate.acquire()
        fake_clock.advance(3_000_000_000)  # open for 3 s when the report is written
        try:
            snapshot = prof.snapshot()
        finally:
            gate.release()
    (entry,) = [r for r in snapshot.resources.resources if r.label == "gate"]  # type: ignore[union-attr]
    assert (entry.total_hold_ns, entry.max_hold_ns) == (2_000_000, 2_000_000)  # (ended holds)
    lines = render_table(snapshot, (50.0, 99.0), limit=0).splitlines()
    header = next(line for line in lines if line.startswith("resource "))
    row = next(line for line in lines if line.startswith("gate "))
    cells = dict(zip(re.split(r"  +", header.strip()), re.split(r"  +", row.strip()), strict=True))
    assert (cells["hold total"], cells["max hold"]) == ("3 s", "3 s")


async def test_a_queue_whose_messages_were_never_received_has_no_time_in_queue_yet() -> None:
    """No message was received, so none has a time in queue: both columns say so ("-"), not
    "0 ns" beside messages that have sat there all along."""
    with asyncflow.profile("queues", format="none", port=None, sampling=1) as prof:
        outbox = asyncflow.instrument_queue(asyncio.Queue[int](), name="outbox")
        for i in range(3):
            outbox.put_nowait(i)
        snapshot = prof.snapshot()
    assert snapshot.channels is not None
    (entry,) = [c for c in snapshot.channels.channels if c.label == "outbox"]
    assert (entry.sent_count, entry.received_count, entry.queue_size) == (3, 0, 3)
    cells = dict(zip(report._CHANNEL_COLUMNS, report._channel_row(entry, True), strict=True))
    assert (cells["p50 in queue"], cells["max in queue"]) == ("-", "-")


def test_the_programs_own_functions_never_called_are_not_named() -> None:
    """``asyncflow run`` tracks the program's own coroutine functions unasked: one never called
    here (a parent whose workers ran it, a route nobody asked for) is no news; a decorated
    one is."""
    decorated = dataclasses.replace(_entry(2, "asked", 0), call_count=0)
    own = dataclasses.replace(_entry(3, "handler", 0), call_count=0, tracked_by=OWN_CODE)
    lines = render_table(_snapshot([_entry(1, "fetch", 5_000), decorated, own]), (50.0,), 0)
    assert "never called: asked" in lines.splitlines()


@pytest.mark.parametrize(
    ("first", "last", "said"),
    [
        (600_000_000, 1_100_000_000, " (found from 600 ms to 1.1 s into the run)"),
        (2_000_000_000, 2_000_000_000, " (found at 2 s into the run)"),
    ],
)
def test_a_warning_that_no_longer_holds_says_when_it_was_found(
    first: int, last: int, said: str
) -> None:
    """Beside a deadlock's "taken at deadlock.py:28 for 984 ms", a window read "held from
    603 ms to 1.12 s": the lock's hold, it seemed, contradicting the figure before it. The
    window is when the evaluations found the warning, and says so."""
    subject = WarningSubject("resource", 1, "gate", None)
    earlier = WarningEntry("deadlock", "error", subject, "Deadlock", "fix", {}, first, last, False)
    assert report._held(earlier) == said
    assert report._held(dataclasses.replace(earlier, active=True)) == ""


async def _wait_on_lock(make: Any) -> tuple[Any, Any]:
    """A lock held here, and a task waiting for it."""
    lock = make()
    await lock.acquire()
    return lock, asyncio.get_running_loop().create_task(lock.acquire())


async def _wait_on_event(make: Any) -> tuple[Any, Any]:
    """An event never set, and a task waiting for it."""
    event = make()
    return event, asyncio.get_running_loop().create_task(event.wait())


async def _wait_on_condition(make: Any) -> tuple[Any, Any]:
    """A condition never notified, and a task waiting for it."""
    condition = make()

    async def wait() -> None:
        async with condition:
            await condition.wait()

    return condition, asyncio.get_running_loop().create_task(wait())


@pytest.mark.parametrize(
    ("make", "begin"),
    [
        (asyncio.Lock, _wait_on_lock),
        (anyio.Lock, _wait_on_lock),
        (asyncio.Event, _wait_on_event),
        (asyncio.Condition, _wait_on_condition),
    ],
    ids=["asyncio.Lock", "anyio.Lock", "asyncio.Event", "asyncio.Condition"],
)
async def test_the_resource_table_counts_the_waits_going_on_now_as_waited_so_far(
    make: Any, begin: Any, fake_clock: FakeClock, request: pytest.FixtureRequest
) -> None:
    """A task still waiting when the report is written (a deadlock's at SIGTERM, an event
    never set) reads as waiting for as long as it has been so far: wait total and max wait
    count it beside the waits that ended, not 0 ns beside "waiting now 1"."""
    with asyncflow.profile("open", format="none", port=None, sampling=1) as prof:
        name = "gate-" + request.node.callspec.id  # (one of its own: a failed run's lives on)
        primitive = asyncflow.instrument_lock(make(), name=name)
        primitive, waiter = await begin(lambda: primitive)
        for _ in range(3):  # the waiter runs into its wait
            await asyncio.sleep(0)
        fake_clock.advance(3_000_000_000)  # waiting for 3 s when the report is written
        try:
            snapshot = prof.snapshot()
        finally:
            waiter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiter
    (entry,) = [r for r in snapshot.resources.resources if r.label == name]  # type: ignore[union-attr]
    assert (entry.waits, entry.waiters_now) == (0, 1)
    assert (entry.open_wait_ns, entry.longest_open_wait_ns) == (3_000_000_000, 3_000_000_000)
    lines = render_table(snapshot, (50.0, 99.0), limit=0).splitlines()
    header = next(line for line in lines if line.startswith("resource "))
    row = next(line for line in lines if line.startswith(name + " "))
    cells = dict(zip(re.split(r"  +", header.strip()), re.split(r"  +", row.strip()), strict=True))
    assert (cells["wait total"], cells["max wait"]) == ("3 s", "3 s")
    assert cells["waiting now/max"] == "1/1"


async def test_the_programs_own_resources_come_before_the_libraries() -> None:
    """A server's per-request events (a library's, each with a row once waited on) are listed
    after the program's own lock, whatever their order in the document: the default limit
    must not hide the program's one lock behind them."""
    with asyncflow.profile("order", format="none", port=None) as prof:
        locks = [asyncflow.instrument_lock(asyncio.Lock(), name=f"lib-{i}") for i in range(3)]
        mine = asyncflow.instrument_lock(asyncio.Lock(), name="mine")
        for lock in (*locks, mine):
            async with lock:
                pass
        snapshot = prof.snapshot()
    assert snapshot.resources is not None
    library = os.path.join(os.path.dirname(asyncio.__file__), "streams.py")  # the stdlib's
    entries = [
        r
        if r.label == "mine"
        else dataclasses.replace(r, location=dataclasses.replace(r.location, file=library))
        for r in snapshot.resources.resources
        if r.label == "mine" or r.label.startswith("lib-")
    ]
    assert [r.label for r in entries][-1] == "mine"  # made last, listed last in the document
    shown = dataclasses.replace(
        snapshot, resources=dataclasses.replace(snapshot.resources, resources=entries)
    )
    lines = render_table(shown, (50.0, 99.0), limit=2).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("resource "))
    assert lines[start + 1].startswith("mine ")
