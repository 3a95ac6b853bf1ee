"""Warnings that misled a reviewer running the examples: each is a program shaped like the
service that misled, with the problem (or the absence of one) planted, and the warning it must or
must not get. Time is the fake clock's, except where the loop monitor must catch a real block."""

from __future__ import annotations

import asyncio
import time

import pytest

import asyncflow
from asyncflow.clock import FakeClock
from asyncflow.views import lints
from asyncflow.views.lints import Finding, Thresholds

from .test_lints import _findings, _io, _only

# (autouse: this module's tests, too, start without the primitives of earlier tests)
from .test_lints import _no_primitives_of_earlier_tests as _no_primitives_of_earlier_tests


def _kinds(findings: list[Finding]) -> list[tuple[str, str]]:
    return sorted((f.kind, f.subject.label) for f in findings)


async def test_a_work_queue_its_workers_feed_gets_no_pace_warning(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    """A crawler: eight workers take URLs from a frontier and put the links they find back.
    They wait on the frontier for each other's output, which is how a crawl ends: no stage
    outside them sets the pace, and eight waiting workers are not 800% of the time."""
    frontier = asyncflow.instrument_queue(asyncio.Queue[int](), name="frontier")
    seen = {0}

    @asyncflow.future(name="worker")
    async def worker() -> None:
        while True:
            page = await frontier.get()
            try:
                await _io(20_000_000)  # the download
                for link in (2 * page + 1, 2 * page + 2):
                    if link < 60 and link not in seen:
                        seen.add(link)
                        frontier.put_nowait(link)
            finally:
                frontier.task_done()

    @asyncflow.future(name="crawl")
    async def crawl() -> None:
        frontier.put_nowait(0)
        crew = [asyncio.create_task(worker()) for _ in range(8)]
        await frontier.join()
        for task in crew:
            task.cancel()
        await asyncio.gather(*crew, return_exceptions=True)

    await crawl()
    assert len(seen) == 60
    findings = _findings(prof)
    assert [f for f in findings if f.kind in ("starved", "bottleneck")] == []


async def test_starvation_is_a_share_per_consumer_and_names_every_producer(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    """Two feeds into one queue read by three workers: the share is each worker's, and two
    producers "set" the pace."""
    events = asyncflow.instrument_queue(asyncio.Queue[int](), name="events")

    @asyncflow.future(name="read_sensors")
    async def read_sensors() -> None:
        for i in range(20):
            await _io(10_000_000)  # a slow device
            events.put_nowait(i)

    @asyncflow.future(name="read_logs")
    async def read_logs() -> None:
        for i in range(10):
            await _io(10_000_000)
            events.put_nowait(i)

    @asyncflow.future(name="store")
    async def store() -> None:
        while True:
            await events.get()

    workers = [asyncio.create_task(store()) for _ in range(3)]
    await asyncio.gather(read_sensors(), read_logs())
    while events.qsize():
        await asyncio.sleep(0)
    for task in workers:
        task.cancel()
    await asyncio.gather(*workers, return_exceptions=True)
    (finding,) = [f for f in _findings(prof) if f.kind == "starved"]
    assert finding.message.startswith("`read_sensors`, `read_logs` set the pace of `events`: ")
    assert "its 3 consumers `store` waited for messages" in finding.message
    assert finding.evidence["consumers"] == 3
    assert 50 <= finding.evidence["starved_percent"] <= 100


async def test_starved_consumers_below_the_share_each_get_no_warning(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    """Four workers busy most of the time on a feed that comes in batches: their waits add up
    to more than the wall time, but each waited about a third of it."""
    jobs = asyncflow.instrument_queue(asyncio.Queue[int](), name="jobs")

    @asyncflow.future(name="accept")
    async def accept() -> None:
        for _ in range(10):
            await _io(10_000_000)  # the batch's header, read while the workers work
            for _ in range(4):
                await asyncio.sleep(0)
            await _io(10_000_000)  # its body, read while they wait
            for i in range(4):
                jobs.put_nowait(i)

    @asyncflow.future(name="handle")
    async def handle() -> None:
        while True:
            await jobs.get()
            await _io(5_000_000)  # the work itself

    workers = [asyncio.create_task(handle()) for _ in range(4)]
    await accept()
    while jobs.qsize():
        await asyncio.sleep(0)
    for task in workers:
        task.cancel()
    await asyncio.gather(*workers, return_exceptions=True)
    snapshot = prof.snapshot()
    assert snapshot.channels is not None
    channel = next(c for c in snapshot.channels.channels if c.label == "jobs")
    in_use = lints._active_ns(channel, 1 << 62)
    assert channel.consumers_starved_ns > in_use  # summed over four, it exceeds the wall time
    assert channel.consumers_starved_ns < 4 * in_use * Thresholds().starved_share
    assert [f for f in _findings(prof) if f.kind == "starved"] == []


async def test_the_bottleneck_says_each_producer_was_blocked_a_share_of_the_time(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    """The pipeline example's shape: four parsers feed one slow writer. The blocked time is
    four parsers' sum; set against the wall time it read as a bug ("1.93 s over 500 ms")."""
    records = asyncflow.instrument_queue(asyncio.Queue[int](4), name="records")

    @asyncflow.future(name="parse")
    async def parse(start: int) -> None:
        for i in range(start, 40, 4):
            await records.put(i)

    @asyncflow.future(name="store")
    async def store() -> None:
        for _ in range(40):
            await records.get()
            await _io(10_000_000)  # the slow database write

    await asyncio.gather(store(), *(parse(i) for i in range(4)))
    (finding,) = _only(_findings(prof))
    assert finding.kind == "bottleneck" and finding.subject.label == "records"
    assert finding.message.startswith("`store` is the bottleneck: its input `records`")
    assert "its 4 producers `parse` were blocked" in finding.message
    assert finding.evidence["producers"] == 4
    assert 50 <= finding.evidence["blocked_percent"] <= 100
    blocked = finding.evidence["producers_blocked_ns"]
    assert blocked > finding.evidence["in_use_ns"]  # the sum over four: never shown as a share
    assert f"({lints._duration(blocked)} in all)" in finding.message


async def test_a_short_run_does_not_make_a_bottleneck_of_milliseconds(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    """A 40 ms run whose producer waited 20 ms: half the time, but 20 ms is noise, and the
    warning came and went from one run of the memory-stream example to the next."""
    readings = asyncflow.instrument_queue(asyncio.Queue[int](4), name="readings")

    @asyncflow.future(name="produce")
    async def produce() -> None:
        for i in range(20):
            await readings.put(i)

    @asyncflow.future(name="consume")
    async def consume() -> None:
        for _ in range(20):
            await readings.get()
            await _io(2_000_000)

    await asyncio.gather(produce(), consume())
    snapshot = prof.snapshot()
    assert snapshot.channels is not None
    channel = next(c for c in snapshot.channels.channels if c.label == "readings")
    assert 0 < channel.producers_blocked_ns < Thresholds().min_wait_ns
    assert _only(_findings(prof)) == []
    # a longer run of the same program is a bottleneck again: the minimum is an option
    low = lints.evaluate(
        lints.documents_of(prof.snapshot()), Thresholds.from_options([("min_wait", 0.001)])
    )
    assert [f.kind for f in _only(low)] == ["bottleneck"]


async def test_a_pool_whose_permits_leaked_is_not_called_contended(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    """The connection-pool example's shape: requests share a pool of 2 connections; a failing
    query never gives its connection back; then every request waits for a connection until
    its client gives up. The waits are long because no permit is left, not because anyone
    holds one too long: "hold it for less" was the wrong advice."""
    pool = asyncflow.instrument_lock(asyncio.Semaphore(2), name="db_pool")

    @asyncflow.future(name="handle")
    async def handle(fail: bool) -> None:
        await pool.acquire()
        await _io(1_000_000)  # the query
        if fail:
            raise ConnectionResetError("peer went away")  # the planted bug: no release
        pool.release()

    await asyncio.gather(*(handle(False) for _ in range(12)))  # 10 of 12 wait their turn
    await asyncio.gather(handle(True), handle(True), return_exceptions=True)
    stuck = [asyncio.create_task(handle(False)) for _ in range(12)]
    await asyncio.sleep(0)
    fake_clock.advance(200_000_000)  # their clients time out
    for task in stuck:
        task.cancel()
    await asyncio.gather(*stuck, return_exceptions=True)
    findings = _only(_findings(prof))
    (finding,) = findings
    assert (finding.kind, finding.severity, finding.subject.label) == (
        "permits-leaked",
        "error",
        "db_pool",
    )
    assert "2 permits never given back: 2 calls of `handle` raised without releasing it" in (
        finding.message
    )
    assert "12 waits were given up (timed out or cancelled)" in finding.message
    assert finding.evidence["failed_waits"] == 12


async def test_waits_mostly_given_up_are_not_blamed_on_hold_time_alone(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    """A lock held across a slow call while callers time out waiting for it: the warning says
    that most waits were given up, not that 10 of 11 acquisitions waited."""
    cache = asyncflow.instrument_lock(asyncio.Lock(), name="cache")

    @asyncflow.future(name="refresh")
    async def refresh() -> None:
        async with cache:
            await _io(1_000_000)

    await asyncio.gather(*(refresh() for _ in range(11)))
    async with cache:  # a slow refresh holds it while 15 callers wait and give up
        waiting = [asyncio.create_task(refresh()) for _ in range(15)]
        await asyncio.sleep(0)
        fake_clock.advance(100_000_000)
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
    # (the cancelled callers are a cancellation storm too: not what this test is about)
    (finding,) = [f for f in _only(_findings(prof)) if f.subject.label == "cache"]
    assert (finding.kind, finding.subject.label) == ("lock-contention", "cache")
    assert finding.message.startswith("Lock `cache` is held longer than `refresh` will wait: ")
    assert "15 waits were given up (timed out or cancelled) against 10 that waited" in (
        finding.message
    )
    assert "hold it for less" not in finding.hint


async def test_long_lived_tasks_cancelled_at_shutdown_are_not_a_storm(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    """Subscribers live for the whole run and are cancelled together when it ends: that is a
    shutdown, not work thrown away by timeouts. Short calls cancelled over the run still are
    a storm, and the sweep at the end is not added to them."""
    never = asyncio.Event()

    @asyncflow.future(name="subscribe")
    async def subscribe() -> None:
        await never.wait()

    @asyncflow.future(name="lookup")
    async def lookup() -> None:
        await never.wait()

    collector = prof._collector
    assert collector is not None
    prof._call(lambda: collector.sample_live(fake_clock()))
    subscribers: list[asyncio.Task[None]] = []
    for _ in range(4):
        subscribers += [asyncio.create_task(subscribe()) for _ in range(5)]
        calls = [asyncio.create_task(lookup()) for _ in range(5)]  # each times out in turn
        await asyncio.sleep(0)
        for call in calls:
            call.cancel()
        await asyncio.gather(*calls, return_exceptions=True)
        fake_clock.advance(2_000_000_000)
        prof._call(lambda: collector.sample_live(fake_clock()))
    for task in subscribers:  # the shutdown
        task.cancel()
    await asyncio.gather(*subscribers, return_exceptions=True)
    storms = [f for f in _only(_findings(prof)) if f.kind == "cancellation-storm"]
    assert _kinds(storms) == [("cancellation-storm", "lookup")]
    assert storms[0].evidence == {"cancelled": 20, "finished": 20}


async def test_a_server_closing_its_connections_in_a_short_run_is_not_a_storm(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    """A server's connection handlers live from the first requests to the shutdown, which
    cancels them in one loop turn; the run is shorter than a sample of live calls, so only the
    recent calls' log can tell. (aiohttp's ``RequestHandler.start`` under asyncflow run.)
    Requests cancelled by a timeout before the shutdown still are a storm."""
    closing = asyncio.Event()

    @asyncflow.future(name="serve_connection")
    async def serve_connection() -> None:
        await closing.wait()  # kept alive between requests

    @asyncflow.future(name="query")
    async def query() -> None:
        await closing.wait()

    fake_clock.advance(200_000_000)  # the program's imports, before it serves
    connections = [asyncio.create_task(serve_connection()) for _ in range(20)]
    await asyncio.sleep(0)
    for _ in range(12):  # requests that time out, one after another
        call = asyncio.create_task(query())
        await asyncio.sleep(0)
        fake_clock.advance(10_000_000)
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
    fake_clock.advance(30_000_000)
    for task in connections:  # the shutdown
        task.cancel()
    await asyncio.gather(*connections, return_exceptions=True)
    storms = [f for f in _only(_findings(prof)) if f.kind == "cancellation-storm"]
    assert _kinds(storms) == [("cancellation-storm", "query")]
    assert storms[0].evidence == {"cancelled": 12, "finished": 12}


def test_a_sweep_is_the_last_thing_that_happened() -> None:
    """Calls cancelled together and followed by new calls of the same future are not the end
    of anything: a mass timeout in a running service stays a storm."""
    from asyncflow import schema

    def future(series: list[tuple[int, int]], created: int, live: int) -> schema.FutureEntry:
        return schema.FutureEntry(
            id=1,
            label="fetch",
            source="app:fetch",
            location=schema.Location("app.py", 3),
            tracked_by="decorator",
            call_count=created,
            calls=schema.CallStates(0, 0, live, 0, 0),
            outcomes=schema.Outcomes(0, 0, created - live, 0, 0),
            total_polls=created,
            busy_ns=1,
            idle_ns=1,
            max_poll_duration_ns=1,
            poll_duration_ns={},
            call_duration_ns={},
            live_series=[schema.LiveSample(0, lv, cr) for cr, lv in series],
        )

    at_the_end = future([(30, 30), (30, 30)], 30, 0)
    then_more = future([(30, 30), (30, 0)], 40, 10)
    docs = [lints.Documents(0, 10, futures=[f]) for f in (at_the_end, then_more)]
    assert [[f.kind for f in lints.evaluate(d, Thresholds())] for d in docs] == [
        [],
        ["cancellation-storm"],
    ]


def test_a_callers_poll_that_contains_its_callees_is_not_blamed(
    prof: asyncflow.Profiler,
) -> None:
    """The blocked-loop example's shape: a handler awaits a lookup, whose rare path calls a
    synchronous client. The handler's poll contains the lookup's, so it is as long; only the
    lookup is the culprit. (Real time: the loop monitor must catch the block's stack.)"""

    def legacy_lookup(key: int) -> str:
        time.sleep(0.15)  # the planted bug: a synchronous client on the loop
        return str(key)

    @asyncflow.future(name="lookup")
    async def lookup(key: int) -> str:
        if key == 7:
            return legacy_lookup(key)
        await asyncio.sleep(0)
        return str(key)

    @asyncflow.future(name="handle")
    async def handle(key: int) -> int:
        await asyncio.sleep(0)
        return len(await lookup(key))

    async def serve() -> int:
        return sum(await asyncio.gather(*(handle(k) for k in range(10))))

    assert asyncio.run(serve()) == 10
    findings = _findings(prof)
    blocked = [f for f in findings if f.kind == "loop-blocked"]
    if not blocked or "`lookup`" not in blocked[0].message:
        pytest.skip("the loop monitor did not catch the block's stack on this machine")
    # lookup's long poll is the blocking line's finding (one cause, one finding), and the
    # handler's poll only contained it: no long-poll of its own
    assert not [f for f in findings if f.kind == "long-poll"]
    assert blocked[0].evidence["max_poll_ns"] >= 150_000_000
