"""Warnings: each planted problem gets exactly its warning, naming the culprit; a healthy
program gets none above ``info``. Time is the fake clock's: shares and durations are exact. Every
test of a running program runs on it, even one that asserts no duration: on real time a loaded
machine can keep the loop off the CPU past the block threshold, and the loop monitor then rightly
adds a loop-blocked warning that the test did not plant."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import gc
import threading
from typing import Any

import pytest

import asyncflow
from asyncflow import schema
from asyncflow.clock import FakeClock
from asyncflow.render.report import render_table
from asyncflow.views import lints, wait_views
from asyncflow.views.lints import Documents, Finding, Thresholds


@pytest.fixture(autouse=True)
def _no_primitives_of_earlier_tests() -> None:
    """Each test's profiler starts with the primitives of earlier tests gone, not merely
    unreferenced: an instrumented primitive is freed by the cyclic GC only (its hooks refer to
    it), and one an earlier test left with its permits taken, say, is a finding here."""
    gc.collect()


def _findings(prof: asyncflow.Profiler, **extra: Any) -> list[Finding]:
    docs = dataclasses.replace(lints.documents_of(prof.snapshot()), **extra)
    return lints.evaluate(docs, Thresholds())


async def _io(ns: int) -> None:
    """Wait ``ns`` of fake time for simulated I/O: the time passes while the caller is suspended,
    outside any tracked poll, as it would while a socket has nothing to read; then its data
    arrives and the caller is woken (its wait for the loop after that, its scheduled time, is
    the loop's, not the I/O's)."""
    clock = asyncflow_clock()
    loop = asyncio.get_running_loop()
    arrived = loop.create_future()

    def arrive() -> None:
        clock.advance(ns)
        if not arrived.done():  # (the caller cancelled meanwhile)
            arrived.set_result(None)

    loop.call_soon(arrive)
    await arrived


def asyncflow_clock() -> FakeClock:
    from asyncflow import clock

    fake = clock.now_ns
    assert isinstance(fake, FakeClock), "these tests run on the fake clock"
    return fake


def _only(findings: list[Finding], severity_at_least: str = "warning") -> list[Finding]:
    rank = lints.SEVERITIES.index(severity_at_least)
    return [f for f in findings if lints.SEVERITIES.index(f.severity) >= rank]


async def test_a_healthy_program_gets_no_warning(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    """A balanced pipeline, short polls, tasks that finish, an uncontended lock."""
    jobs = asyncflow.instrument_queue(asyncio.Queue[int](8), name="jobs")
    lock = asyncio.Lock()

    @asyncflow.future(name="produce")
    async def produce() -> None:
        for i in range(50):
            fake_clock.advance(1_000)
            await jobs.put(i)
        await jobs.put(-1)

    @asyncflow.future(name="consume")
    async def consume() -> int:
        total = 0
        while (item := await jobs.get()) >= 0:
            async with lock:
                fake_clock.advance(1_000)
                total += item
        return total

    _, total = await asyncio.gather(produce(), consume())
    assert total == sum(range(50))
    assert _only(_findings(prof)) == []


async def test_bottleneck_names_the_consuming_stage(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    raw = asyncflow.instrument_queue(asyncio.Queue[int](2), name="raw")

    @asyncflow.future(name="fetch_pages")
    async def fetch_pages() -> None:
        for i in range(20):
            await raw.put(i)
        await raw.put(-1)

    @asyncflow.future(name="enrich")
    async def enrich() -> None:
        while await raw.get() >= 0:
            await _io(10_000_000)  # the slow stage: it waits on a slow backend

    await asyncio.gather(asyncio.create_task(fetch_pages()), asyncio.create_task(enrich()))
    (finding,) = _only(_findings(prof))
    assert (finding.kind, finding.subject.kind, finding.subject.label) == (
        "bottleneck",
        "channel",
        "raw",
    )
    assert finding.message.startswith("`enrich` is the bottleneck")
    assert "`fetch_pages`" in finding.message
    assert finding.evidence["producers_blocked_ns"] >= 0.8 * finding.evidence["in_use_ns"]


async def test_starved_consumers_name_the_producer_as_info_only(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    feed = asyncflow.instrument_queue(asyncio.Queue[int](), name="feed")

    @asyncflow.future(name="slow_source")
    async def slow_source() -> None:
        for i in range(10):
            await _io(20_000_000)  # a slow upstream
            feed.put_nowait(i)
        feed.put_nowait(-1)

    @asyncflow.future(name="sink")
    async def sink() -> None:
        while await feed.get() >= 0:
            pass

    await asyncio.gather(asyncio.create_task(slow_source()), asyncio.create_task(sink()))
    findings = _findings(prof)
    assert _only(findings) == []
    (finding,) = [f for f in findings if f.kind == "starved"]
    assert finding.severity == "info" and finding.subject.label == "feed"
    assert finding.message.startswith("`slow_source` sets the pace")


async def test_a_queue_written_and_never_read(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    outbox = asyncflow.instrument_queue(asyncio.Queue[int](), name="outbox")

    @asyncflow.future(name="notify")
    async def notify() -> None:
        for i in range(25):
            outbox.put_nowait(i)

    await asyncio.create_task(notify())
    (finding,) = _only(_findings(prof))
    assert (finding.kind, finding.subject.label) == ("channel-unread", "outbox")
    assert "`notify`" in finding.message and "25" in finding.message


async def test_lost_messages(fake_clock: FakeClock, prof: asyncflow.Profiler) -> None:
    with asyncflow.instrument_queues():
        doomed: asyncio.Queue[int] | None = asyncio.Queue()
    assert doomed is not None
    for i in range(3):
        doomed.put_nowait(i)
    doomed.get_nowait()
    del doomed
    gc.collect()
    findings = _only(_findings(prof))
    assert [f.kind for f in findings] == ["messages-lost"]
    assert findings[0].severity == "error" and findings[0].evidence["lost"] == 2


async def test_a_cancellation_storm(fake_clock: FakeClock, prof: asyncflow.Profiler) -> None:
    never = asyncio.Event()

    @asyncflow.future(name="lookup")
    async def lookup() -> None:
        await never.wait()

    # Sample the live calls now, before any: the collector's own ticks then take no sample
    # while the fake time stands still. One taken while the calls were alive would make their
    # end look like a shutdown's sweep of long-lived calls (CI's run once saw no storm).
    collector = prof._collector
    assert collector is not None
    prof._call(lambda: collector.sample_live(fake_clock()))
    calls = [asyncio.create_task(lookup()) for _ in range(12)]
    await asyncio.sleep(0)
    for call in calls:
        call.cancel()
    await asyncio.gather(*calls, return_exceptions=True)
    (finding,) = _only(_findings(prof))
    assert (finding.kind, finding.subject.label) == ("cancellation-storm", "lookup")
    assert finding.evidence == {"cancelled": 12, "finished": 12}


async def test_a_long_poll_and_cpu_work_on_the_loop(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    @asyncflow.future(name="render")
    async def render() -> None:
        fake_clock.advance(250_000_000)  # one poll that never yields
        await asyncio.sleep(0)

    @asyncflow.future(name="ping")
    async def ping() -> None:
        fake_clock.advance(1_000)

    await ping()
    await render()
    findings = _only(_findings(prof))
    # one cause, one finding (issue 27): the long poll says its share of the busy time
    assert [(f.kind, f.subject.label) for f in findings] == [("long-poll", "render")]
    assert "holds the loop 100% of all busy time" in findings[0].message


async def test_never_awaited_calls(fake_clock: FakeClock, prof: asyncflow.Profiler) -> None:
    @asyncflow.future(name="send_mail")
    async def send_mail() -> None:
        pass

    with pytest.warns(RuntimeWarning, match="never awaited"):
        send_mail()  # type: ignore[unused-coroutine]  # the planted bug
        gc.collect()
    (finding,) = _only(_findings(prof))
    assert (finding.kind, finding.subject.label) == ("never-awaited", "send_mail")


async def test_a_saturated_executor(fake_clock: FakeClock, prof: asyncflow.Profiler) -> None:
    loop = asyncio.get_running_loop()

    submitted = threading.Event()

    def resize() -> None:
        submitted.wait(5)  # time starts once every job is in: then one worker runs them in turn
        fake_clock.advance(1_000)

    with (
        concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="img") as pool,
        asyncflow.instrument_executors(),
    ):
        jobs = [loop.run_in_executor(pool, resize) for _ in range(6)]
        submitted.set()
        await asyncio.gather(*jobs)
        document = wait_views.executors_document((50.0,), [])
    # this test's pool alone (an earlier test's pool, still alive, is listed too)
    mine = [e for e in document.executors if e.state == "alive" and e.submitted == 6]
    findings = _only(_findings(prof, executors=mine))
    (finding,) = findings
    assert (finding.kind, finding.subject.kind) == ("executor-saturated", "executor")
    assert finding.evidence["queued_ns"] == 15_000 and finding.evidence["run_ns"] == 6_000
    assert "resize" in finding.message
    # the same figures summed over gone executors (each waiting to start its first worker)
    # are no saturation of any one executor
    (entry,) = mine
    folded = dataclasses.replace(entry, state="gone", folded_count=6)
    assert not _only(_findings(prof, executors=[folded]))


def test_a_blocked_loop_names_the_call_and_the_line() -> None:
    here = schema.StackFrame(__file__, 42, "handle_request", "time.sleep(0.3)")
    sleep = schema.StackFrame("<built-in>", 0, "sleep", None)
    episode = schema.BlockedEpisode(
        id=1,
        started_ns=0,
        blocked_ns=300_000_000,
        ongoing=False,
        task="Task-3",
        call=schema.RunningCall(7, "handle_request", 9, 0, 300_000_000),
        stack=[sleep, here],
    )
    loop = schema.LoopEntry(
        id=1,
        label="asyncio.unix_events._UnixSelectorEventLoop",
        thread="MainThread",
        state="running",
        lag_now_ns=0,
        lag_ns={},
        max_lag_ns=300_000_000,
        heartbeats=10,
        tasks_alive=3,
        running=None,
        blocked=False,
        blocked_count=1,
        episodes=[episode],
    )
    (finding,) = lints.evaluate(Documents(0, 1_000_000_000, loops=[loop]), Thresholds())
    assert finding.kind == "loop-blocked" and finding.severity == "warning"
    assert "`handle_request` at test_lints.py:42 (in sleep)" in finding.message


def test_the_book_keeps_one_warning_per_subject_and_remembers() -> None:
    book = lints.WarningBook()
    entry = schema.FutureEntry(
        id=1,
        label="lookup",
        source="app:lookup",
        location=schema.Location("app.py", 3),
        tracked_by="decorator",
        call_count=20,
        calls=schema.CallStates(0, 0, 0, 0, 20),
        outcomes=schema.Outcomes(0, 0, 20, 0, 0),
        total_polls=20,
        busy_ns=1,
        idle_ns=1,
        max_poll_duration_ns=1,
        poll_duration_ns={},
        call_duration_ns={},
    )
    book.update(Documents(100, 100, futures=[entry]))
    book.update(Documents(200, 200, futures=[entry]))
    (held,) = book.document(0).warnings
    assert (held.first_seen_ns, held.last_seen_ns, held.active) == (100, 200, True)
    book.update(Documents(300, 300))
    (held,) = book.document(0).warnings
    assert (held.last_seen_ns, held.active) == (200, False)


async def test_a_swallowed_cancellation(fake_clock: FakeClock, prof: asyncflow.Profiler) -> None:
    never = asyncio.Event()

    @asyncflow.future(name="poll_forever")
    async def poll_forever() -> None:
        with contextlib.suppress(asyncio.CancelledError):  # the planted bug: it cannot stop
            await never.wait()

    task = asyncio.create_task(poll_forever())
    await asyncio.sleep(0)
    task.cancel()
    await task
    found = _only(_findings(prof))
    assert len(found) == 1, [(f.kind, f.message) for f in found]
    (finding,) = found
    assert (finding.kind, finding.subject.label) == ("cancellation-swallowed", "poll_forever")
    assert finding.evidence == {"swallowed": 1, "requested": 1}
    # the snapshot carries the same warning, with when it was seen
    (warning,) = prof.snapshot().warnings
    assert (warning.kind, warning.severity, warning.active) == (
        "cancellation-swallowed",
        "warning",
        True,
    )
    assert warning.subject.label == "poll_forever" and warning.message == finding.message
    # and the exit report shows it first, before the futures
    lines = render_table(prof.snapshot(), (50.0,), 10).splitlines()
    assert lines[2] == "warnings (1)"
    assert lines[3].startswith("  WARNING  `poll_forever` (test_lints.py:")
    futures_header = next(i for i, line in enumerate(lines) if line.startswith("future "))
    block = " ".join(part.strip() for part in lines[3:futures_header])
    assert "swallowed a cancellation once" in block and "→ re-raise CancelledError" in block


async def test_a_task_leak(fake_clock: FakeClock, prof: asyncflow.Profiler) -> None:
    never = asyncio.Event()

    @asyncflow.future(name="subscribe")
    async def subscribe() -> None:
        await never.wait()  # the planted bug: nobody ever sets it, nobody cancels them

    collector = prof._collector
    assert collector is not None
    # Sample now, so that the collector's own ticks take no sample until time moves: the
    # samples are then the ones taken below, between two batches.
    prof._call(lambda: collector.sample_live(fake_clock()))
    leaked = []
    try:
        for _ in range(6):
            leaked += [asyncio.create_task(subscribe()) for _ in range(20)]
            await asyncio.sleep(0)
            fake_clock.advance(2_000_000_000)
            prof._call(lambda: collector.sample_live(fake_clock()))
        # (the fake clock's jumps can look like a blocked loop to the monitor: not this test's)
        (finding,) = [f for f in _only(_findings(prof)) if f.subject.kind == "future"]
        assert (finding.kind, finding.subject.label) == ("task-leak", "subscribe")
        assert finding.evidence == {
            "live_from": 20,
            "live_now": 120,
            "live_peak": 120,
            "created": 100,
            "finished": 0,
        }
    finally:
        for task in leaked:
            task.cancel()
        await asyncio.gather(*leaked, return_exceptions=True)
    after = [f.kind for f in _only(_findings(prof)) if f.subject.kind == "future"]
    # cancelled at last, together, after long lives: still a leak, judged from the live
    # series' peak (a shutdown's sweep must not hide it from the exit report), and not a storm
    assert after == ["task-leak"]


def test_thresholds_are_options(monkeypatch: pytest.MonkeyPatch) -> None:
    options = asyncflow.profile("t", warn="long_poll=0.25, cancel_min=3, min_wait=0.5").options
    thresholds = Thresholds.from_options(options.warn)
    assert (thresholds.long_poll_ns, thresholds.cancel_min) == (250_000_000, 3)
    assert thresholds.min_wait_ns == 500_000_000
    assert thresholds.blocked_share == Thresholds().blocked_share  # the rest keep defaults
    monkeypatch.setenv("ASYNCFLOW_WARN", "starved_share=0.9")
    from_env = Thresholds.from_options(asyncflow.profile("t").options.warn)
    assert from_env.starved_share == 0.9
    mapping = asyncflow.profile("t", warn={"leak_min_live": 10}).options.warn
    assert Thresholds.from_options(mapping).leak_min_live == 10
    for bad, says in [
        ("long_poll", "name=value"),
        ("nonsense=1", "unknown warning threshold 'nonsense'"),
        ("cancel_share=2", r"warn\[cancel_share\]"),
        ("cancel_min=0", r"warn\[cancel_min\]"),
        ("long_poll=nan", r"warn\[long_poll\]"),
        ("min_wait=0", r"warn\[min_wait\]"),
    ]:
        with pytest.raises(ValueError, match=says):
            asyncflow.profile("t", warn=bad)
    with pytest.raises(ValueError, match="ASYNCFLOW_WARN"):
        monkeypatch.setenv("ASYNCFLOW_WARN", "long_poll=-1")
        asyncflow.profile("t")


def test_every_threshold_the_warn_option_takes_sets_its_field() -> None:
    """Each name of the option's table sets the threshold of that name (seconds become the
    ``_ns`` field): a name the option takes and the thresholds do not would break every
    evaluation of the findings (cpu_poll did, once)."""
    from asyncflow.config import WARN_THRESHOLDS

    defaults = Thresholds()
    for name, kind in WARN_THRESHOLDS.items():
        value = 7 if kind == "count" else 0.37
        set_to = Thresholds.from_options([(name, value)])
        field = f"{name}_ns" if kind == "seconds" else name
        expected = 370_000_000 if kind == "seconds" else value
        assert getattr(set_to, field) == expected != getattr(defaults, field), name


async def test_a_lock_that_serialises_its_workers(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    cache = asyncflow.instrument_lock(asyncio.Lock(), name="cache")

    @asyncflow.future(name="refresh")
    async def refresh() -> None:
        async with cache:
            await _io(1_000_000)  # the planted bug: an await while holding the lock

    await asyncio.gather(*(asyncio.create_task(refresh()) for _ in range(20)))
    (finding,) = _only(_findings(prof))
    assert (finding.kind, finding.subject.kind, finding.subject.label) == (
        "lock-contention",
        "resource",
        "cache",
    )
    assert finding.message.startswith("Lock `cache` serialises `refresh`: 19 of 20")
    assert finding.evidence["hold_ns"] == 20_000_000
    assert finding.evidence["wait_ns"] > 5 * finding.evidence["hold_ns"]
    # the exit report's table of resources says the same
    lines = render_table(prof.snapshot(), (50.0,), 10).splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("resource "))
    assert lines[header + 1].split()[:6] == ["cache", "lock", "20", "19", "190", "ms"]


async def test_permits_never_given_back(fake_clock: FakeClock, prof: asyncflow.Profiler) -> None:
    pool = asyncflow.instrument_lock(asyncio.Semaphore(2), name="db_pool")

    @asyncflow.future(name="query")
    async def query() -> None:
        await pool.acquire()
        raise ConnectionResetError("peer went away")  # the planted bug: no release on error

    results = await asyncio.gather(query(), query(), return_exceptions=True)
    assert all(isinstance(r, ConnectionResetError) for r in results)
    (finding,) = _only(_findings(prof))
    assert (finding.kind, finding.severity, finding.subject.label) == (
        "permits-leaked",
        "error",
        "db_pool",
    )
    assert "2 permits never given back: 2 calls of `query` raised without releasing it" in (
        finding.message
    )
    assert "none is left" in finding.message


async def test_an_event_nobody_sets_is_info(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    ready = asyncflow.instrument_lock(asyncio.Event(), name="config_loaded")
    waiting = [asyncio.create_task(ready.wait()) for _ in range(3)]
    await asyncio.sleep(0)
    findings = _findings(prof)
    assert _only(findings) == []
    (finding,) = [f for f in findings if f.kind == "event-never-set"]
    assert finding.severity == "info" and finding.evidence == {"waiters": 3}
    ready.set()
    await asyncio.gather(*waiting)
    assert [f.kind for f in _findings(prof) if f.kind == "event-never-set"] == []


async def test_in_a_chain_of_stages_only_the_slow_one_is_the_bottleneck(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    raw = asyncflow.instrument_queue(asyncio.Queue[int](2), name="raw")
    parsed = asyncflow.instrument_queue(asyncio.Queue[int](2), name="parsed")

    @asyncflow.future(name="fetch")
    async def fetch() -> None:
        for i in range(30):
            await raw.put(i)
        await raw.put(-1)

    @asyncflow.future(name="parse")
    async def parse() -> None:
        while (item := await raw.get()) >= 0:
            await parsed.put(item)  # fast, but held up by store: raw backs up too
        await parsed.put(-1)

    @asyncflow.future(name="store")
    async def store() -> None:
        while await parsed.get() >= 0:
            await _io(10_000_000)  # the slow stage

    await asyncio.gather(*(asyncio.create_task(f()) for f in (fetch, parse, store)))
    (finding,) = _only(_findings(prof))
    assert (finding.kind, finding.subject.label) == ("bottleneck", "parsed")
    assert finding.message.startswith("`store` is the bottleneck")


@pytest.mark.parametrize(
    ("ns", "said"),
    [
        (999, "999 ns"),
        (1_500, "1.5 µs"),
        (999_950, "1 ms"),  # was "1e+03 µs"
        (999_950_000, "1 s"),  # was "1e+03 ms", in a deadlock's "held for"
        (12_340_000, "12.3 ms"),
        (1_500_000_000_000, "1500 s"),  # was "1.5e+03 s"
    ],
)
def test_durations_in_warnings_never_read_as_an_exponent(ns: int, said: str) -> None:
    assert lints._duration(ns) == said


async def test_a_task_nothing_referenced_is_named_when_it_is_destroyed_pending(
    prof: asyncflow.Profiler,
) -> None:
    """A task started and forgotten, waiting on a future only it holds, is garbage-collected
    mid-wait: its call is dropped, and named. A task kept and cancelled, and a coroutine
    closed by hand, are not: they were ended, not lost."""

    @asyncflow.future(name="notify")
    async def notify(ack: asyncio.Future[None]) -> None:
        await ack

    @asyncflow.future(name="kept")
    async def kept(ack: asyncio.Future[None]) -> None:
        await ack

    loop = asyncio.get_running_loop()
    for _ in range(3):
        asyncio.ensure_future(notify(loop.create_future()))  # noqa: RUF006  (the planted bug)
    keep = asyncio.ensure_future(kept(loop.create_future()))
    closed = kept(loop.create_future())
    closed.send(None)
    closed.close()
    await asyncio.sleep(0)
    gc.collect()  # (asyncio logs each: Task was destroyed but it is pending!)
    keep.cancel()
    await asyncio.gather(keep, return_exceptions=True)
    by_label = {f.label: f for f in lints.documents_of(prof.snapshot()).futures}
    assert (by_label["notify"].outcomes.closed, by_label["notify"].outcomes.dropped) == (3, 3)
    assert (by_label["kept"].outcomes.closed, by_label["kept"].outcomes.dropped) == (1, 0)
    assert by_label["kept"].outcomes.cancelled == 1
    found = [f for f in _findings(prof) if f.kind == "task-dropped"]
    assert [(f.severity, f.subject.label, f.evidence) for f in found] == [
        ("error", "notify", {"dropped": 3, "closed": 3})
    ]
    assert found[0].message.startswith("3 calls of `notify` (test_lints.py:")
