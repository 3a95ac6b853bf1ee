"""Warnings a newcomer's read of real services found wrong (the review of c959ce6): each is a
program shaped like the service that misled, with the problem (or its absence) planted, and the
warning it must or must not get. The later ones are from the read of 055a673: a wait on an
event in a task of its own, and a trio pool whose jobs waited for a blocked loop."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sysconfig
import threading
from pathlib import Path

import anyio
import pytest
from anyio.streams.memory import MemoryObjectReceiveStream

import asyncflow
from asyncflow import schema
from asyncflow.clock import FakeClock
from asyncflow.views import lints
from asyncflow.views.lints import Documents, Thresholds
from tests.support.commands import asyncflow_cmd, python_cmd, write

from .test_lints import _findings, _io

# (autouse: this module's tests, too, start without the primitives of earlier tests)
from .test_lints import _no_primitives_of_earlier_tests as _no_primitives_of_earlier_tests
from .test_lints_cause import MS, evaluate, future, loop_with

ITEMS = 600


def _write_line(line: str) -> int:
    return len(line)  # the file's write, on a worker thread


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_writer_awaiting_a_thread_for_each_item_does_not_busy_wait(backend: str) -> None:
    """An export's last stage: ``async for order in stream: await f.write(...)`` on an
    ``anyio.open_file``. Each item is a message received and a job awaited on a worker thread,
    and anyio checkpoints around both (a yield each, as ``sleep(0)`` does): about five short
    polls an item, sub-millisecond apart. It waits on something every time, so it does not
    spin, whatever the backend (on trio the thread's job is not seen: the messages alone
    account for its polls)."""

    @asyncflow.future(name="write_out")
    async def write_out(inp: MemoryObjectReceiveStream[str]) -> int:
        written = 0
        async with inp:
            async for line in inp:
                written += await anyio.to_thread.run_sync(_write_line, line)
        return written

    async def main() -> int:
        if backend == "asyncio":  # (anyio's worker threads, as asyncflow run counts them)
            asyncflow.instrument_executors()
        tx, rx = anyio.create_memory_object_stream[str](50)
        asyncflow.instrument_memory_stream(tx, rx, name="orders")
        result = 0

        async def read() -> None:
            nonlocal result
            result = await write_out(rx)

        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            async with tx:
                for i in range(ITEMS):
                    await tx.send(f"order {i}\n")
        return result

    with asyncflow.profile("export", format="none", port=None, sampling=1) as prof:
        written = anyio.run(main, backend=backend)
        assert written == sum(len(f"order {i}\n") for i in range(ITEMS))
        futures = {f.label: f for f in prof.snapshot().futures.futures}
        assert futures["write_out"].total_polls >= 3 * ITEMS  # (it yields many times an item)
        findings = _findings(prof)
    assert [f.message for f in findings if f.kind == "busy-wait"] == []


def test_a_pool_never_busy_at_once_is_not_saturated() -> None:
    """anyio's default worker threads (40) running a few microseconds' job at a time: a job
    waits longer to be handed to a thread than it runs, and that is all. A pool is saturated
    only once all its workers were busy at once; the same jobs behind a limiter of one are."""

    def tiny() -> int:
        return 1

    async def main(limiter: anyio.CapacityLimiter | None) -> int:
        asyncflow.instrument_executors()
        total = 0
        for _ in range(50):
            total += await anyio.to_thread.run_sync(tiny, limiter=limiter)
        return total

    async def crowded() -> int:
        limiter = anyio.CapacityLimiter(1)
        asyncflow.instrument_executors()
        results: list[int] = []

        async def one() -> None:
            results.append(await anyio.to_thread.run_sync(_slow_job, limiter=limiter))

        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(one)
        return sum(results)

    with asyncflow.profile("pool", format="none", port=None, sampling=1) as prof:
        assert anyio.run(main, None) == 50
        idle = [f for f in _findings(prof) if f.kind == "executor-saturated"]
        assert anyio.run(crowded) == 8
        busy = [f for f in _findings(prof) if f.kind == "executor-saturated"]
    assert idle == []
    assert [f.evidence["max_workers"] for f in busy] == [1]
    # named by its size, not by the limiter's repr (an address)
    assert [f.subject.label for f in busy] == ["anyio worker threads (a limiter of 1)"]


def _slow_job() -> int:
    threading.Event().wait(0.01)  # a synchronous client's call: its thread waits
    return 1


def test_a_client_taking_short_turns_is_not_cpu_bound_and_a_long_poll_beside_it_is() -> None:
    """A FastAPI service's own wrapper around httpx: 28% of the wall time over 657 calls, in
    polls of about 75 us. The loop takes turns between it and everything else: that is where
    the CPU went, not a loop held, and no executor can take an HTTP client's work. Beside it a
    route hashes a password on the loop, 15 ms at each poll, 23% of the wall time: every other
    request waits behind each of those. That one is CPU work on the loop, although the client
    has more busy time."""
    client = dataclasses.replace(
        future(1, "Upstream.get_json", 280 * MS, 1 * MS), call_count=657, total_polls=3_700
    )
    hashing = dataclasses.replace(
        future(2, "check_session", 230 * MS, 25 * MS), call_count=15, total_polls=15
    )
    health = future(3, "health", 1 * MS, 1 * MS)
    assert [f.subject.label for f in evaluate(None, client, health) if f.kind == "cpu-bound"] == []
    findings = [f for f in evaluate(None, client, hashing, health) if f.kind == "cpu-bound"]
    assert [f.subject.label for f in findings] == ["check_session"]
    assert "15.3 ms a poll on average" in findings[0].message


def test_the_hashing_handler_is_named_not_the_route_task_that_polls_it() -> None:
    """The route's request task polls the handler inside its own polls: its busy time and its
    polls are the handler's and a little more. The handler is the one named."""
    route = dataclasses.replace(
        future(1, "GET /session/{user}", 1_130 * MS, 25 * MS), call_count=74, total_polls=74
    )
    handler = dataclasses.replace(
        future(2, "check_session", 1_090 * MS, 23 * MS), call_count=74, total_polls=74
    )
    health = future(3, "health", 1 * MS, 1 * MS)
    docs = Documents(0, 4_390 * MS, futures=(route, handler, health))
    findings = [f for f in lints.evaluate(docs, Thresholds()) if f.kind == "cpu-bound"]
    assert [f.subject.label for f in findings] == ["check_session"]


async def test_two_consumer_tasks_of_one_function_that_died_are_counted_as_two(
    prof: asyncflow.Profiler,
) -> None:
    """A webhook relay's two delivery workers, one function run as two tasks, both die on the
    same bad payload: not "the only consumer died"."""
    deliveries = asyncflow.instrument_queue(asyncio.Queue[dict[str, str]](), name="deliveries")

    @asyncflow.future(name="delivery_worker")
    async def delivery_worker() -> None:
        while True:
            hook = await deliveries.get()
            hook["customer_id"]  # (the planted bug: not every payload has one)

    workers = [asyncio.create_task(delivery_worker()) for _ in range(2)]
    for i in range(30):
        deliveries.put_nowait({"event": f"order {i}"})
    done = await asyncio.gather(*workers, return_exceptions=True)
    assert [type(e) for e in done] == [KeyError, KeyError]
    (finding,) = [f for f in _findings(prof) if f.kind == "dead-consumer"]
    assert finding.message.startswith(
        "All 2 consumers of `deliveries`, 2 calls of `delivery_worker` (test_lints_newcomer.py:"
    )
    assert "died: they raised KeyError: 'customer_id' after 2 messages" in finding.message
    assert finding.evidence["consumers"] == 2


@pytest.mark.parametrize("taker", ["create_order", "price_for"])
async def test_the_callers_waiting_on_a_contended_lock_get_no_tail_warning_of_their_own(
    fake_clock: FakeClock, prof: asyncflow.Profiler, taker: str
) -> None:
    """Most orders are priced from the cache; the few that miss take a lock and hold it across
    the upstream's answer, so they queue behind each other. The lock's finding names that; the
    orders' slow tail is those waits, and a second warning telling to hedge them (more load on
    the same lock) is wrong. The same when ``create_order`` awaits ``price_for``, which takes
    the lock: ``create_order``'s tail is the same waits, one call out (each future says which
    call it was first called in)."""
    prices = asyncflow.instrument_lock(asyncio.Lock(), name="prices")

    @asyncflow.future(name=taker)
    async def priced(cached: bool) -> None:
        if cached:
            await _io(1_000_000)
            return
        async with prices:  # the planted bug: an await while holding the lock
            await _io(50_000_000)

    create_order = priced
    if taker == "price_for":  # (a future of one label only: the one called)

        @asyncflow.future(name="create_order")
        async def create_order(cached: bool) -> None:
            await priced(cached)

    for _ in range(48):  # the cache's orders, one after another: 1 ms each
        await create_order(cached=True)
    await asyncio.gather(*(asyncio.create_task(create_order(cached=False)) for _ in range(12)))
    futures = {f.label: f for f in prof.snapshot().futures.futures}
    orders = futures["create_order"]
    if taker == "price_for":
        assert futures["price_for"].first_caller_id == orders.id
    assert orders.call_duration_ns["p99"] >= 100 * orders.call_duration_ns["p50"]  # a tail
    kinds = sorted({(f.kind, f.subject.label) for f in _findings(prof) if f.severity != "info"})
    assert kinds == [("lock-contention", "prices")]


def _startup_block(ended_ms: int) -> schema.LoopEntry:
    """A loop whose one block at the lifespan's line (loading a TLS store, 300 ms) ended
    ``ended_ms`` into the run."""
    line = schema.BlockedLine(
        "/srv/app.py", 79, "lifespan", "transport = httpx.AsyncHTTPTransport()", 1,
        300 * MS, 300 * MS, ended_ms * MS, 2 * MS, 300 * MS, "blocking", 9, "LifespanOn.main",
    )  # fmt: skip
    return dataclasses.replace(loop_with(line, episodes=0), blocked_count=1)


def test_a_one_off_block_before_the_first_request_is_info() -> None:
    """A FastAPI service loads its TLS store in its lifespan, 300 ms on the loop, before it
    serves: no request waited, and a healthy service gets no warning for it. The same block
    once requests were coming in held them up, and stays a warning."""
    route = dataclasses.replace(
        future(2, "GET /products/{sku}", 50 * MS, 1 * MS),
        tracked_by=schema.ROUTE,
        first_call_ago_ns=600 * MS,  # its first request 400 ms into the 1 s run
    )
    for ended_ms, severity in ((350, "info"), (450, "warning")):
        docs = Documents(0, 1_000 * MS, futures=(route,), loops=[_startup_block(ended_ms)])
        (blocked,) = [f for f in lints.evaluate(docs, Thresholds()) if f.kind == "loop-blocked"]
        assert blocked.severity == severity, blocked.message
        if severity == "info":
            assert blocked.message.endswith(
                "at start-up, before the first request began: no request waited"
            )


def test_a_one_off_block_of_a_web_service_no_request_came_to_is_info() -> None:
    """uvicorn ``--workers 2``: each worker's lifespan loads a TLS store, 300 ms on its loop,
    and the requests all went to the other worker (or the service was started and stopped
    unused). No request waited for that block: info, as in the worker that served. A program
    that serves no requests (no web framework's routing loaded) keeps its warning."""
    for serves, severity in ((True, "info"), (False, "warning")):
        docs = Documents(0, 1_000 * MS, loops=[_startup_block(350)], serves=serves)
        (blocked,) = [f for f in lints.evaluate(docs, Thresholds()) if f.kind == "loop-blocked"]
        assert blocked.severity == severity, blocked.message
        assert blocked.message.endswith(lints.NO_REQUEST_YET) == serves, blocked.message
    # a second block at the same line is not a one-off: a warning, request or none
    twice = dataclasses.replace(
        _startup_block(350),
        blocking_lines=[
            dataclasses.replace(line, count=2, total_ns=2 * line.total_ns)
            for line in _startup_block(350).blocking_lines
        ],
    )
    docs = Documents(0, 1_000 * MS, loops=[twice], serves=True)
    (blocked,) = [f for f in lints.evaluate(docs, Thresholds()) if f.kind == "loop-blocked"]
    assert blocked.severity == "warning", blocked.message


def _lifespan_blocking_now() -> tuple[schema.FutureEntry, schema.LoopEntry]:
    """A uvicorn worker's lifespan, importing for 140 ms so far, and its loop blocked now."""
    lifespan = future(1, "LifespanOn.main", 1 * MS, 1 * MS)  # (its blocked poll not over yet)
    ongoing = schema.BlockedEpisode(
        id=1, started_ns=900 * MS, blocked_ns=140 * MS, ongoing=True, task="Task-2",
        call=schema.RunningCall(1, "LifespanOn.main", 1, 0, 140 * MS),
        stack=[schema.StackFrame("/srv/app.py", 9, "<module>", "from fastapi import FastAPI")],
    )  # fmt: skip
    blocked = dataclasses.replace(
        loop_with(episodes=0), blocked=True, blocked_count=1, episodes=[ongoing]
    )
    return lifespan, blocked


def test_a_block_found_while_a_service_started_is_info_while_no_request_came() -> None:
    """The collector's evaluation during a worker's start finds its loop blocked now, an
    error. Once the block is over and no request came, the earlier finding is info, as the
    block judged at the end is; in a program that serves no requests it stays an error."""
    lifespan, blocked_now = _lifespan_blocking_now()
    calm = loop_with(episodes=0)
    for serves, severity in ((True, "info"), (False, "error")):
        book = lints.WarningBook()
        book.update(
            Documents(
                10_000 * MS, 1_000 * MS, futures=(lifespan,), loops=[blocked_now], serves=serves
            )
        )
        book.update(
            Documents(12_000 * MS, 3_000 * MS, futures=(lifespan,), loops=[calm], serves=serves)
        )
        earlier = [w for w in book.document(0).warnings if not w.active]
        assert [(w.kind, w.severity) for w in earlier] == [("loop-blocked", severity)]


def test_a_block_found_while_the_service_started_is_info_once_its_first_request_is_known() -> None:
    """A uvicorn worker's lifespan imports for 140 ms: the collector's evaluation during it
    finds the loop blocked now, an error, before any request was routed. Once the first
    request is known to have begun after that block, the earlier finding is judged as the same
    block is at the end: info. One found after the first request began stays as it was."""
    book = lints.WarningBook()
    lifespan, blocked_now = _lifespan_blocking_now()
    book.update(Documents(10_000 * MS, 1_000 * MS, futures=(lifespan,), loops=[blocked_now]))
    (found,) = book.document(0).warnings
    assert (found.kind, found.severity, found.active) == ("loop-blocked", "error", True)
    route = dataclasses.replace(
        future(2, "GET /items/{id}", 50 * MS, 1 * MS),
        tracked_by=schema.ROUTE,
        first_call_ago_ns=1_000 * MS,  # its first request 2 s into the 3 s run
    )
    calm = loop_with(episodes=0)
    book.update(Documents(12_000 * MS, 3_000 * MS, futures=(lifespan, route), loops=[calm]))
    earlier = [w for w in book.document(0).warnings if not w.active]
    assert [(w.kind, w.severity) for w in earlier] == [("loop-blocked", "info")]
    assert earlier[0].message.endswith(lints.AT_START_UP)
    # a first request before the block: the earlier finding held requests up, as it said
    book = lints.WarningBook()
    book.update(Documents(10_000 * MS, 1_000 * MS, futures=(lifespan,), loops=[blocked_now]))
    early = dataclasses.replace(route, first_call_ago_ns=2_800 * MS)  # 200 ms into the run
    book.update(Documents(12_000 * MS, 3_000 * MS, futures=(lifespan, early), loops=[calm]))
    assert [w.severity for w in book.document(0).warnings if not w.active] == ["error"]


async def test_a_future_says_when_its_first_call_was_made(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    @asyncflow.future(name="lookup")
    async def lookup() -> None:
        fake_clock.advance(1_000_000)

    def first_call_ago() -> int | None:
        futures = prof.snapshot().futures.futures
        (entry,) = [f for f in futures if f.label == "lookup"]
        return entry.first_call_ago_ns

    assert first_call_ago() is None  # (defined, never called)
    fake_clock.advance(5_000_000)
    await lookup()
    fake_clock.advance(20_000_000)
    await lookup()  # (a later call changes nothing)
    assert first_call_ago() == 22_000_000  # (its own 1 ms, 20 ms, the second call's 1 ms)


@pytest.mark.parametrize(
    ("max_running", "queued_ms", "blocked_ms", "saturated"),
    [
        (2, 2, 0, True),
        (1, 39, 0, True),
        (1, 2, 0, False),
        (1, 39, 1_200, False),
        (2, 2, 1_200, True),
    ],
    ids=["all-busy", "gil-bound", "hand-off", "loop-blocked", "all-busy-loop-blocked"],
)
def test_a_pool_whose_jobs_waited_long_is_saturated_though_never_seen_all_busy(
    max_running: int, queued_ms: int, blocked_ms: int, saturated: bool
) -> None:
    """Two workers rendering invoices in pure Python: each job holds the GIL from its start to
    its end, so the two are rarely seen running at once, yet the jobs queue 39 ms each. Micro-
    jobs that wait 2 ms to be handed to a thread, with a worker never busier than one, are not
    a saturated pool; nor are jobs that waited while the loop was blocked at least half as long
    (a blocked loop holds the GIL, and on trio a job asks for its thread through the loop):
    more workers would not change it, and the blocking line is named. A pool seen all busy at
    once is saturated, whatever the loop did."""
    pool = schema.ExecutorEntry(
        id=1, label="ThreadPoolExecutor pdf", kind="thread", state="alive", max_workers=2,
        workers=2, submitted=60, queued=0, running=0, completed=60, raised=0, cancelled=0,
        queued_ns={}, total_queued_ns=60 * queued_ms * MS, max_queued_ns=queued_ms * MS,
        run_ns={}, total_run_ns=60 * MS, max_run_ns=MS, functions=[], futures=[],
        max_running=max_running,
    )  # fmt: skip
    line = schema.BlockedLine(
        "/srv/etl.py", 35, "load", None, 40, blocked_ms * MS, 30 * MS, 0, None, 0, None, None, None
    )
    loops = [loop_with(line)] if blocked_ms else []
    docs = Documents(0, 1_000 * MS, executors=[pool], loops=loops)
    kinds = [f.kind for f in lints.evaluate(docs, Thresholds())]
    assert ("executor-saturated" in kinds) == saturated


def test_a_long_poll_the_monitor_did_not_see_while_its_own_looks_came_late_is_info() -> None:
    """A health check's poll read 130 ms while the whole process was descheduled: the loop
    monitor, which sees every poll over the block threshold as a late heartbeat, saw no block
    of it, and its own look came late too (a late wake-up). The same poll seen blocking by the
    monitor, or with the monitor's looks on time, stays a warning."""
    health = future(7, "GET /health", 131 * MS, 130 * MS)
    stalled = dataclasses.replace(loop_with(episodes=0), late_wakeups=1)
    line = schema.BlockedLine(
        "/srv/app.py", 21, "health", "return {'ok': True}", 1, 130 * MS, 130 * MS, 0,
        120 * MS, 130 * MS, "cpu", 7, "GET /health",
    )  # fmt: skip
    seen = dataclasses.replace(loop_with(line, episodes=0), late_wakeups=1)
    on_time = loop_with(episodes=0)
    said = []
    for loop in (stalled, seen, on_time):
        docs = Documents(0, 4_000 * MS, futures=(health,), loops=[loop])
        said.append([(f.kind, f.severity) for f in lints.evaluate(docs, Thresholds())])
    assert said == [
        [("long-poll", "info")],
        [("loop-blocked", "warning")],  # (the line's finding says the long poll too)
        [("long-poll", "warning")],
    ]
    # a long poll shorter than the block threshold (long_poll set lower): never seen as a
    # block, so the monitor's silence says nothing of it
    short = future(7, "GET /health", 16 * MS, 15 * MS)
    docs = Documents(0, 4_000 * MS, futures=(short,), loops=[stalled])
    lower = Thresholds(long_poll_ns=10 * MS)
    assert [(f.kind, f.severity) for f in lints.evaluate(docs, lower)] == [("long-poll", "warning")]
    docs = Documents(0, 4_000 * MS, futures=(health,), loops=[stalled])
    (info,) = lints.evaluate(docs, Thresholds())
    assert info.message.endswith(
        "and its own look at the loop came late too (a late wake-up): "
        "the whole process did not run then"
    )


_WAIT_FOR_READY = """\
import asyncio

ready = asyncio.Event()  # nobody ever sets it


async def wait_ready(i):
    try:
        await asyncio.wait_for(ready.wait(), timeout=0.02)
    except asyncio.TimeoutError:
        return False
    return True


async def main():
    for _ in range(4):
        print(await asyncio.gather(*(wait_ready(i) for i in range(5))))


asyncio.run(main())
"""


def test_waits_on_an_event_never_set_name_the_programs_function_never_asyncflows(
    tmp_path: Path,
) -> None:
    """``asyncio.wait_for(ready.wait(), ...)`` runs the wait in a task of its own on 3.11
    (asyncio's ``Event.wait``, through asyncflow's hook of it): the finding names the program's
    function that made it, and nothing, row or finding, is named after asyncflow's hook. On
    3.12 and later the wait is the program's function's own."""
    plain = python_cmd("prog.py", cwd=write(tmp_path / "prog.py", _WAIT_FOR_READY).parent)
    report = tmp_path / "report.json"
    done = asyncflow_cmd(
        "run", "--port", "off", "--format", "json", "--output", str(report), "prog.py",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout == plain.stdout, done.stderr
    document = json.loads(report.read_text())
    labels = [f["label"] for f in document["futures"]["futures"]]
    assert not any("class_event" in label for label in labels), labels
    (never,) = [w for w in document["warnings"] if w["kind"] == "event-never-set"]
    assert never["severity"] == "warning" and "`wait_ready`" in never["message"], never
    assert "prog.py:3" in never["message"] and "class_event" not in never["message"]


_PERIODIC_JOB = """\
import asyncio

stopping = asyncio.Event()  # set at shutdown; this run ends before


async def job():
    done = 0
    for _ in range(20):
        try:
            await asyncio.wait_for(stopping.wait(), timeout=0.005)
            return done
        except asyncio.TimeoutError:
            done += 1  # the periodic work, between two looks at the shutdown signal
    return done


print(asyncio.run(job()))
"""


def test_a_periodic_job_looking_at_a_shutdown_signal_is_no_event_never_set(
    tmp_path: Path,
) -> None:
    """A job that waits on its shutdown event with a timeout, again and again, working between
    two looks: the event is never set in the run, and each wait is given up, but the job did
    not wait its whole life for it. On 3.11 each ``wait_for`` runs the wait in a task of its
    own (asyncio's ``Event.wait``, 20 calls, each cancelled): judged by the call that made
    them, which waited 20 times, as on 3.12 and later, where the job's own call waits."""
    write(tmp_path / "prog.py", _PERIODIC_JOB)
    report = tmp_path / "report.json"
    done = asyncflow_cmd(
        "run", "--port", "off", "--format", "json", "--output", str(report), "prog.py",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout == "20\n", done.stderr
    document = json.loads(report.read_text())
    (event,) = [r for r in document["resources"]["resources"] if r["kind"] == "asyncio.Event"]
    assert (event["waits"], event["failed_waits"]) == (20, 20)  # (seen, and given up)
    found = [(w["kind"], w["severity"]) for w in document["warnings"]]
    assert ("event-never-set", "warning") not in found, document["warnings"]


def test_one_long_poll_of_a_handler_is_one_warning_not_its_routes_too() -> None:
    """A healthy FastAPI app's handler ``get_db`` read one 123 ms poll, and so did the route's
    request task that polls it: the monitor saw no block (no stack says who called whom), but
    the handler was first called in the route's call, so only the handler is named."""
    route = future(1, "GET /db/{item_id}", 140 * MS, 123 * MS)
    handler = dataclasses.replace(future(2, "get_db", 130 * MS, 123 * MS), first_caller_id=1)
    docs = Documents(0, 4_000 * MS, futures=(route, handler))
    found = [(f.kind, f.subject.label) for f in lints.evaluate(docs, Thresholds())]
    assert found == [("long-poll", "get_db")]
    # a library's future is placed with its package's folder: FastAPI has a routing.py too
    site = sysconfig.get_paths()["purelib"]
    starlette = schema.Location(os.path.join(site, "starlette", "routing.py"), 280)
    alone = dataclasses.replace(route, location=starlette)
    (poll,) = lints.evaluate(Documents(0, 4_000 * MS, futures=(alone,)), Thresholds())
    assert "`GET /db/{item_id}` (starlette/routing.py:280) ran 123 ms" in poll.message
    # a route whose own poll outlasts the handler's by the threshold is named too
    slower = dataclasses.replace(route, max_poll_duration_ns=260 * MS, busy_ns=300 * MS)
    docs = Documents(0, 4_000 * MS, futures=(slower, handler))
    found = [(f.kind, f.subject.label) for f in lints.evaluate(docs, Thresholds())]
    assert sorted(found) == [("long-poll", "GET /db/{item_id}"), ("long-poll", "get_db")]


@pytest.mark.parametrize(("seen_ms", "severity"), [(20, "info"), (70, "warning")])
def test_a_long_poll_the_monitor_saw_block_for_a_fraction_of_it_is_info(
    seen_ms: int, severity: str
) -> None:
    """A 123 ms poll of which the monitor saw 20 ms of block: for the rest its own looks did not
    run either (the process was descheduled), so it is info, whether or not a late wake-up was
    counted. Seen blocking for most of it, it is the code's: a warning."""
    handler = future(1, "get_db", 130 * MS, 123 * MS)
    line = schema.BlockedLine(
        "/usr/lib/python3.11/_weakrefset.py", 39, "_remove", None, 1, seen_ms * MS, seen_ms * MS,
        0, None, 0, "blocking", 1, "get_db",
    )  # fmt: skip
    docs = Documents(0, 4_000 * MS, futures=(handler,), loops=[loop_with(line, episodes=0)])
    (poll,) = [f for f in lints.evaluate(docs, Thresholds()) if f.kind == "long-poll"]
    assert poll.severity == severity
    if severity == "info":
        assert "saw it block the loop for 20 ms of it at most" in poll.message
