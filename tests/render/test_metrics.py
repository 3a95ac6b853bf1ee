"""Live reporters (the seam every export uses) and the Prometheus text exposition."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import threading
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families

import asyncflow
from asyncflow.clock import FakeClock
from asyncflow.instrumentation import _session
from asyncflow.render import prometheus
from asyncflow.render.reporters import CallTotals, Figures, FinishedCall, Tick, figures_of
from asyncflow.schema import FutureEntry, Location, Snapshot

_Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _parse(text: str) -> tuple[dict[str, str], _Series]:
    """Every family's type, and every sample's value; fails on any line the parser refuses."""
    types: dict[str, str] = {}
    series: _Series = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            assert key not in series, f"duplicate series {key}"
            series[key] = sample.value
    return types, series


def _value(series: _Series, metric: str, /, **labels: str) -> float:
    return series[(metric, frozenset(labels.items()))]


class Recorder:
    """A user's live reporter: keeps what each tick hands it."""

    def __init__(self) -> None:
        self.ticks: list[Tick] = []
        self.calls: list[FinishedCall] = []
        self.totals: list[CallTotals] = []
        self.threads: set[str] = set()
        self.figures: list[Figures] = []
        self.opened = 0
        self.closed: list[Figures] = []

    def open(self, source: object) -> None:
        self.opened += 1
        self.threads.add(threading.current_thread().name)

    def tick(self, tick: Tick) -> None:
        self.ticks.append(tick)
        self.calls.extend(tick.calls)
        self.totals.extend(tick.totals())
        self.threads.add(threading.current_thread().name)

    def close(self, final: Figures) -> None:
        self.closed.append(final)


class Capture:
    """Takes the figures of the next tick, when asked."""

    def __init__(self) -> None:
        self.wanted: asyncio.Future[Figures] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def tick(self, tick: Tick) -> None:
        wanted, loop = self.wanted, self.loop
        if wanted is not None and loop is not None:
            self.wanted = None
            figures = tick.figures()
            assert tick.figures() is figures  # built once per tick
            loop.call_soon_threadsafe(wanted.set_result, figures)

    async def next(self) -> Figures:
        # The profiler's thread may take the future (and clear the attribute) at any moment
        # after it is set: await the local, never the attribute read again.
        loop = asyncio.get_running_loop()
        wanted: asyncio.Future[Figures] = loop.create_future()
        self.loop = loop
        self.wanted = wanted
        with anyio.fail_after(5):
            return await wanted


@pytest.fixture(autouse=True)
def _no_primitives_of_earlier_tests() -> None:
    """Each test's profiler starts with earlier tests' locks gone, not merely unreferenced: an
    instrumented primitive is freed by the cyclic GC only (its hooks refer to it), and another
    ``guard`` still alive would be a second series of the same name here."""
    gc.collect()


async def _planted(fake_clock: FakeClock) -> list[object]:
    """10 calls of ``work`` (2 raise), 5 messages through ``jobs``, 3 items of ``numbers``,
    a lock waited on once; every duration set by the fake clock."""

    @asyncflow.future(name="work")
    async def work(i: int) -> int:
        fake_clock.advance(1_000)
        await asyncio.sleep(0)
        fake_clock.advance(500)
        if i >= 8:
            raise ValueError(i)
        return i

    @asyncflow.stream(name="numbers")
    async def numbers() -> AsyncIterator[int]:
        for i in range(3):
            fake_clock.advance(2_000)
            yield i

    q: asyncio.Queue[int] = asyncflow.instrument_queue(asyncio.Queue(), name="jobs")
    for i in range(5):
        await q.put(i)
    fake_clock.advance(3_000)
    for _ in range(5):
        await q.get()
    await asyncio.gather(*(work(i) for i in range(10)), return_exceptions=True)
    assert [n async for n in numbers()] == [0, 1, 2]
    lock = asyncflow.instrument_lock(asyncio.Lock(), name="guard")
    async with lock:
        waiter = asyncio.create_task(lock.acquire())
        await asyncio.sleep(0)
        fake_clock.advance(7_000)
    await waiter
    lock.release()
    return [work, numbers, q, lock]  # kept alive by the caller: nothing is folded meanwhile


def _planted_work(snap: Snapshot) -> FutureEntry:
    """The future of ``_planted``'s ``work`` (other tests' ``work`` may be alive too)."""
    (work,) = [e for e in snap.futures.futures if e.label == "work" and e.location.file == __file__]
    return work


async def test_metrics_parse_and_equal_the_documents(fake_clock: FakeClock) -> None:
    capture = Capture()
    with asyncflow.profile("metrics", format="none", port=None, reporters=[capture]) as prof:
        _kept = await _planted(fake_clock)
        figures = await capture.next()
        snap = prof.snapshot()
    text = prometheus.render(figures)
    types, series = _parse(text)
    # every family documented, with its type (counters lose "_total" in the parser's names)
    assert {
        n.removesuffix("_total") if t == "counter" else n: t
        for n, (t, _) in prometheus.FAMILIES.items()
    } == types
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert len(samples) == len(series)

    work = _planted_work(snap)
    where = f"{work.location.file}:{work.location.line}"
    lb = {"label": "work", "location": where}
    assert _value(series, "asyncflow_future_calls_total", **lb) == 10 == work.call_count
    finished = "asyncflow_future_calls_finished_total"
    assert _value(series, finished, **lb, outcome="returned") == 8
    assert _value(series, finished, **lb, outcome="raised") == 2
    assert _value(series, "asyncflow_future_polls_total", **lb) == 20 == work.total_polls
    assert _value(series, "asyncflow_future_busy_seconds_total", **lb) == 15_000 / 1e9
    assert work.busy_ns == 15_000
    summary = "asyncflow_future_poll_duration_seconds"
    assert _value(series, summary + "_sum", **lb) == work.busy_ns / 1e9
    assert _value(series, summary + "_count", **lb) == 20
    for key, ns in work.poll_duration_ns.items():
        quantile = repr(float(key[1:]) / 100)
        assert _value(series, summary, **lb, quantile=quantile) == ns / 1e9
    assert _value(series, "asyncflow_future_max_poll_duration_seconds", **lb) == 1_000 / 1e9
    assert _value(series, "asyncflow_future_live_calls", **lb, state="suspended") == 0

    assert snap.channels is not None
    jobs = next(c for c in snap.channels.channels if c.label == "jobs")
    cl = {"label": "jobs", "kind": jobs.kind}
    assert _value(series, "asyncflow_channel_sent_total", **cl) == 5 == jobs.sent_count
    assert _value(series, "asyncflow_channel_received_total", **cl) == 5
    assert _value(series, "asyncflow_channel_max_queue_size", **cl) == 5
    assert _value(series, "asyncflow_channel_max_delay_seconds", **cl) == jobs.max_delay_ns / 1e9
    assert jobs.max_delay_ns == 3_000

    assert snap.streams is not None
    stream = next(s for s in snap.streams.streams if s.label == "numbers")
    sl = {"label": "numbers", "location": f"{stream.location.file}:{stream.location.line}"}
    assert _value(series, "asyncflow_stream_items_total", **sl) == 3
    assert _value(series, "asyncflow_stream_wait_seconds_sum", **sl) == stream.total_wait_ns / 1e9
    assert stream.total_wait_ns == 6_000

    assert snap.resources is not None
    guard = next(r for r in snap.resources.resources if r.label == "guard")
    rl = {
        "label": "guard",
        "primitive": "lock",
        "location": f"{guard.location.file}:{guard.location.line}",
    }
    assert _value(series, "asyncflow_resource_acquisitions_total", **rl) == 2
    assert _value(series, "asyncflow_resource_contended_acquisitions_total", **rl) == 1
    assert _value(series, "asyncflow_resource_wait_seconds_count", **rl) == guard.waits == 1
    assert _value(series, "asyncflow_resource_wait_seconds_sum", **rl) == 7_000 / 1e9
    # whether it is locked is read live: None once the lock is freed, which may happen between
    # the tick's figures and the snapshot; compare with the figures the text was rendered from
    (then,) = [r for r in figures.resources.resources if r.label == "guard"]
    locked = series.get(("asyncflow_resource_locked", frozenset(rl.items())))
    assert locked == (None if then.locked is None else int(then.locked))

    status = snap.status
    assert _value(series, "asyncflow_uptime_seconds") == status.uptime_ns / 1e9
    assert _value(series, "asyncflow_events_dropped_total") == 0
    info = {"name": "metrics", "version": status.version, "python": status.python}
    assert _value(series, "asyncflow_info", **info) == 1


async def test_calls_destroyed_while_pending_are_a_counter_beside_the_outcomes(
    prof: asyncflow.Profiler,
) -> None:
    """A task nothing referenced, collected mid-wait: its call finished ``closed``, and is
    counted again as dropped, in a family of its own (the outcomes add up to the calls)."""

    @asyncflow.future(name="notify")
    async def notify(ack: asyncio.Future[None]) -> None:
        await ack

    loop = asyncio.get_running_loop()
    for _ in range(2):
        asyncio.ensure_future(notify(loop.create_future()))  # noqa: RUF006  (dropped on purpose)
    await asyncio.sleep(0)
    gc.collect()  # (asyncio logs each: Task was destroyed but it is pending!)
    _, series = _parse(prometheus.render(figures_of(prof.snapshot())))
    # (an earlier test's futures may live on in this process: this one is at this file's line)
    line = notify.__code__.co_firstlineno
    here = f"{__file__}:{line}"
    (entry,) = [
        key
        for key in series
        if key[0] == "asyncflow_future_calls_dropped_total" and dict(key[1])["location"] == here
    ]
    lb = dict(entry[1])
    assert lb == {"label": "notify", "location": here}
    assert _value(series, "asyncflow_future_calls_dropped_total", **lb) == 2
    finished = "asyncflow_future_calls_finished_total"
    outcomes = {o: _value(series, finished, **lb, outcome=o) for o in ("closed", "cancelled")}
    assert outcomes == {"closed": 2, "cancelled": 0}
    assert (
        "asyncflow_future_calls_finished_total",
        frozenset({**lb, "outcome": "dropped"}.items()),
    ) not in series


_TWIN = "async def twin():\n    await asyncio.sleep(0)\n"


def test_label_values_are_escaped_and_duplicates_merged_or_told_apart() -> None:
    weird = 'say "hi"\\there\nnext line'

    async def main() -> None:
        def make() -> Any:
            # the same source compiled twice: two definitions at one place
            space: dict[str, Any] = {"asyncio": asyncio}
            exec(compile(_TWIN, __file__, "exec"), space)
            return asyncflow.future(name=weird)(space["twin"])

        first, second = make(), make()
        await first()
        await second()

    with asyncflow.profile("escape", format="none", port=None) as prof:
        asyncio.run(main())
        snap = prof.snapshot()
    twins = [e for e in snap.futures.futures if e.label == weird]
    assert len(twins) == 2
    where = f"{twins[0].location.file}:{twins[0].location.line}"
    later = max(e.id for e in twins)
    for ids, expected in ((False, {where: 2}), (True, {where: 1, f"{where}{later}": 1})):
        _types, series = _parse(prometheus.render(figures_of(snap), ids=ids))
        calls = {
            dict(labels)["location"] + dict(labels).get("id", ""): value
            for (name, labels), value in series.items()
            if name == "asyncflow_future_calls_total" and dict(labels)["label"] == weird
        }
        assert calls == expected, ids  # one series for the site; with ids, one per definition


def test_empty_profile_renders_every_family() -> None:
    with asyncflow.profile("empty", format="none", port=None) as prof:
        snap = prof.snapshot()
    text = prometheus.render(figures_of(snap))
    types, _series = _parse(text)
    assert len(types) == len(prometheus.FAMILIES)
    assert text.endswith("\n")
    assert prometheus.CONTENT_TYPE.startswith("text/plain; version=0.0.4")


async def test_reporters_get_every_finished_call_once_on_the_profilers_thread(
    fake_clock: FakeClock,
) -> None:
    recorder = Recorder()
    with asyncflow.profile("live", format="none", port=None, reporters=[recorder]) as prof:
        _kept = await _planted(fake_clock)
        snap = prof.snapshot()
    assert recorder.opened == 1 and len(recorder.closed) == 1
    final = recorder.closed[0]  # the final snapshot's figures (gone futures may be folded)
    assert sum(e.call_count for e in final.futures.futures if e.label == "work") == 10
    work = [c for c in recorder.calls if c.label == "work"]
    assert len(work) == 10  # the last tick, at stop, hands over what was left
    assert sorted(c.outcome for c in work) == ["raised"] * 2 + ["returned"] * 8
    assert {(c.busy_ns, c.polls) for c in work} == {(1_500, 2)}
    planted = _planted_work(snap)
    (logs,) = [log for log in snap.future_logs if log.future_id == planted.id]
    assert sorted(c.duration_ns for c in work) == sorted(
        c.finished_ns - c.created_ns for c in logs.calls if c.finished_ns is not None
    )
    # the same calls summed by future and outcome, tick by tick
    totals = [t for t in recorder.totals if t.label == "work"]
    assert sum(t.calls for t in totals if t.outcome == "raised") == 2
    assert sum(t.calls for t in totals if t.outcome == "returned") == 8
    assert sum(t.duration_ns for t in totals) == sum(c.duration_ns for c in work)
    assert sum(t.busy_ns for t in totals) == 15_000 and sum(t.polls for t in totals) == 20
    assert all(name.startswith("asyncflow-profiler") for name in recorder.threads)
    numbers = [t.number for t in recorder.ticks]
    assert numbers == list(range(1, len(numbers) + 1))
    assert all(t.dropped == 0 for t in recorder.ticks)


def test_reporters_are_open_when_start_returns() -> None:
    # A reporter's instruments must exist as soon as the profiler runs: the OTel SDK's
    # reader, collecting right after start(), found no instruments when open() waited for
    # the collector's first turn on the profiler's thread.
    class SlowToOpen(Recorder):  # as a provider that builds its exporters is
        def open(self, source: object) -> None:
            time.sleep(0.1)  # whatever it takes, start() waits for it: no timing depends on it
            super().open(source)

    recorder = SlowToOpen()
    prof = asyncflow.start("open", format="none", port=None, reporters=[recorder])
    try:
        assert recorder.opened == 1  # no wait, no await: start() itself saw to it
        assert {name.split("[")[0] for name in recorder.threads} == {"asyncflow-profiler"}
    finally:
        prof.stop()
    assert len(recorder.closed) == 1


class Broken:
    def __init__(self) -> None:
        self.calls = 0

    def tick(self, tick: Tick) -> None:
        self.calls += 1
        raise RuntimeError("reporter bug")


async def test_a_reporter_that_raises_is_turned_off_logged_once_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broken, fine = Broken(), Recorder()

    @asyncflow.future
    async def step() -> int:
        await asyncio.sleep(0)
        return 1

    caplog.set_level(logging.ERROR, logger="asyncflow")
    before = _session.errors.count
    with asyncflow.profile("broken", format="none", port=None, reporters=[broken, fine]) as prof:
        for _ in range(3):
            assert await step() == 1
            with anyio.fail_after(5):
                ticks = len(fine.ticks)
                while len(fine.ticks) < ticks + 2:  # two more collector ticks went by
                    await asyncio.sleep(0.01)
        after = prof.snapshot().status.internal_errors
    assert broken.calls == 1  # turned off at its first failure
    assert after - before == 1
    logged = [r for r in caplog.records if "reporter bug" in r.getMessage()]
    assert len(logged) == 1 and "Broken.tick" in logged[0].getMessage()
    assert len([c for c in fine.calls if c.label.endswith("step")]) == 3


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("not a list", "expected a list of live reporters"),
        ([object()], "is not a live reporter"),
    ],
)
def test_bad_reporters_are_refused(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        asyncflow.profile("bad", reporters=value)


def test_textfile_reporter_writes_the_exposition(tmp_path: Path) -> None:
    path = tmp_path / "asyncflow.prom"
    reporter = prometheus.TextfileReporter(path, interval=3600)

    async def main() -> None:
        @asyncflow.future(name="once")
        async def once() -> None:
            await asyncio.sleep(0)

        await once()

    with asyncflow.profile("textfile", format="none", port=None, reporters=[reporter]):
        asyncio.run(main())
    assert reporter.writes == 2  # the first tick, then the close
    _types, series = _parse(path.read_text())
    assert any(
        name == "asyncflow_future_calls_total" and dict(labels)["label"] == "once" and value == 1
        for (name, labels), value in series.items()
    )
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"interval": 0}, "interval=0"),
        ({"interval": True}, "interval=True"),
        ({"path": "/no/such/dir/x.prom"}, "directory does not exist"),
    ],
)
def test_textfile_reporter_refuses_bad_arguments(
    tmp_path: Path, kwargs: dict[str, object], message: str
) -> None:
    kwargs = dict(kwargs)  # the parameter's own dict is shared by every run of the case
    path = kwargs.pop("path", tmp_path / "x.prom")
    with pytest.raises(ValueError, match=message):
        prometheus.TextfileReporter(path, **kwargs)  # type: ignore[arg-type]


def _get(url: str) -> tuple[str, bytes]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.headers["Content-Type"], response.read()


async def test_metrics_route_serves_the_documents_figures(fake_clock: FakeClock) -> None:
    with asyncflow.profile("route", format="none", port=0) as prof:
        _kept = await _planted(fake_clock)
        assert prof.url is not None
        with anyio.fail_after(10):
            media, body = await anyio.to_thread.run_sync(_get, prof.url + "/metrics")
            _, futures = await anyio.to_thread.run_sync(_get, prof.url + "/futures")
            _, channels = await anyio.to_thread.run_sync(_get, prof.url + "/channels")
            _, spec = await anyio.to_thread.run_sync(_get, prof.url + "/openapi.json")
    assert media == "text/plain; version=0.0.4; charset=utf-8"
    _types, series = _parse(body.decode())
    for entry in json.loads(futures)["futures"]:
        location = entry["location"]
        lb = {"label": entry["label"], "location": f"{location['file']}:{location['line']}"}
        assert _value(series, "asyncflow_future_calls_total", **lb) == entry["call_count"]
        assert _value(series, "asyncflow_future_polls_total", **lb) == entry["total_polls"]
        busy = _value(series, "asyncflow_future_busy_seconds_total", **lb)
        assert busy == entry["busy_ns"] / 1e9
    for entry in json.loads(channels)["channels"]:
        cl = {"label": entry["label"], "kind": entry["kind"]}
        assert _value(series, "asyncflow_channel_sent_total", **cl) == entry["sent_count"]
        assert _value(series, "asyncflow_channel_queue_size", **cl) == entry["queue_size"]
    assert "/metrics" in json.loads(spec)["paths"]


async def test_measured_functions_and_the_programs_own_metrics(fake_clock: FakeClock) -> None:
    @asyncflow.measure(name="crunch")
    def crunch(n: int) -> int:
        fake_clock.advance(2_000)
        if n < 0:
            raise KeyError(n)
        return n

    capture = Capture()
    with asyncflow.profile("user", format="none", port=None, reporters=[capture]) as prof:
        crunch(1)
        crunch(2)
        with pytest.raises(KeyError):
            crunch(-1)
        asyncflow.counter("jobs done").add(3)
        asyncflow.gauge('depth "now"').set(5)
        for v in (10, 20, 30):
            asyncflow.histogram("size").record(v)
        asyncflow.value("temperature", 21.5)
        figures = await capture.next()
        snap = prof.snapshot()
    _types, series = _parse(prometheus.render(figures))
    assert snap.functions is not None and snap.user_metrics is not None
    (entry,) = [e for e in snap.functions.functions if e.label == "crunch"]
    fl = {"label": "crunch", "kind": entry.kind, "location": _where(entry.location)}
    assert _value(series, "asyncflow_function_calls_total", **fl) == 3 == entry.call_count
    assert _value(series, "asyncflow_function_errors_total", **fl, type="KeyError") == 1
    assert _value(series, "asyncflow_function_seconds_total", **fl) == 6_000 / 1e9
    assert _value(series, "asyncflow_function_duration_seconds_count", **fl) == 3
    assert _value(series, "asyncflow_user_counter_total", name="jobs done") == 3
    assert _value(series, "asyncflow_user_gauge", name='depth "now"') == 5
    assert _value(series, "asyncflow_user_histogram_sum", name="size") == 60
    assert _value(series, "asyncflow_user_histogram_count", name="size") == 3
    (size,) = [m for m in snap.user_metrics.metrics if m.name == "size"]
    for key, v in size.percentiles.items():
        assert _value(series, "asyncflow_user_histogram", name="size", quantile=_q(key)) == v
    assert _value(series, "asyncflow_user_value", name="temperature") == 21.5


def _where(location: Location) -> str:
    return f"{location.file}:{location.line}"


def _q(key: str) -> str:
    return repr(float(key[1:]) / 100)


def test_scheduled_seconds_are_a_counter_beside_busy_and_idle_where_measured() -> None:
    """A future's scheduled time is exported as busy and idle are; a future with no wake-up
    measured (uvloop's loop) has no series rather than a 0 that reads as "never waited"."""
    from asyncflow.schema import (
        CallStates,
        FuturesDocument,
        Outcomes,
        ProfilerStatus,
    )

    def entry(i: int, label: str, **fields: Any) -> FutureEntry:
        return FutureEntry(
            i, label, f"m:{label}", Location("m.py", i), "decorator", 1,
            CallStates(0, 0, 0, 1, 0), Outcomes(1, 0, 0, 0, 0), 2, 1_000, 9_000_000,
            500, {"p99": 500}, {"p99": 900}, **fields,
        )  # fmt: skip

    woken = entry(1, "woken", scheduled_ns=4_500_000, scheduled_polls=2)
    status = ProfilerStatus(1, "svc", "0", 1, "3.11", 1, False, 0, 0, 0, None, 2, 0, 0, 0)
    futures = FuturesDocument(1, 2, 0, 2, [woken, entry(2, "uvloop")])
    types, series = _parse(prometheus.render(figures_of(Snapshot(1, status, futures))))
    name = "asyncflow_future_scheduled_seconds_total"
    assert types["asyncflow_future_scheduled_seconds"] == "counter"
    values = {dict(labels)["label"]: v for (n, labels), v in series.items() if n == name}
    assert values == {"woken": 0.0045}
