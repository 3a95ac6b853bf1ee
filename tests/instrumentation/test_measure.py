"""``@asyncflow.measure`` and ``asyncflow.measure_block``: exact figures on the fake clock,
nesting, recursion, errors, threads, bounded labels, transparency, the recording interface."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import threading
from collections.abc import Iterator
from typing import Any, ClassVar

import anyio
import pytest

import asyncflow
from asyncflow import stats
from asyncflow.clock import FakeClock
from asyncflow.instrumentation import _session, recording, timing
from asyncflow.instrumentation import values as _values
from asyncflow.render.reporters import FinishedCall
from asyncflow.schema import FunctionEntry, Snapshot


@pytest.fixture(autouse=True)
def _fresh_labels() -> Iterator[None]:
    timing.reset_for_tests()
    _values.reset_for_tests()
    yield
    timing.reset_for_tests()
    _values.reset_for_tests()
    for user in recording.recorders():
        recording.remove_recorder(user)


def _functions(snapshot: Snapshot) -> dict[str, FunctionEntry]:
    assert snapshot.functions is not None
    return {f.label: f for f in snapshot.functions.functions}


def _p(ns: int, most: int | None = None) -> int:
    """What a histogram reports for a duration: its bucket's value (never past ``most``, the
    largest one measured)."""
    value = stats.bucket_value(stats.bucket_of(ns))
    return value if most is None else min(value, most)


def test_sync_function_exact_figures(fake_clock: FakeClock) -> None:
    @asyncflow.measure
    def work(ns: int) -> int:
        fake_clock.advance(ns)
        return ns * 2

    with asyncflow.profile("t", format="none") as prof:
        fake_clock.advance(1_000)
        results = [work(ns) for ns in (100, 300, 5_000)]
        fake_clock.advance(4_600)
        snap = prof.snapshot()
    assert results == [200, 600, 10_000]
    f = _functions(snap)["test_sync_function_exact_figures.<locals>.work"]
    assert f.kind == "function" and not f.is_async
    assert (f.call_count, f.total_ns, f.self_ns, f.mean_ns, f.max_ns) == (
        3,
        5_400,
        5_400,
        1_800,
        5_000,
    )
    assert f.duration_ns == {"p50": _p(300), "p95": _p(5_000, 5_000), "p99": _p(5_000, 5_000)}
    assert snap.functions is not None and snap.functions.elapsed_ns == 11_000
    assert f.share == round(5_400 / 11_000, 6)
    assert f.error_count == 0 and f.errors == {}
    assert f.source.endswith(":test_sync_function_exact_figures.<locals>.work")
    assert f.location.file == __file__


async def test_async_function_is_timed_from_call_to_completion(fake_clock: FakeClock) -> None:
    @asyncflow.measure
    async def fetch(x: int) -> int:
        fake_clock.advance(10)
        await asyncio.sleep(0)
        fake_clock.advance(20)  # another poll: the wait between polls counts too
        return x + 1

    with asyncflow.profile("t", format="none") as prof:
        assert await fetch(1) == 2
        task = asyncio.get_running_loop().create_task(fetch(2))
        fake_clock.advance(1_000)  # before its first step: part of its time
        assert await task == 3
        snap = prof.snapshot()
    f = _functions(snap)["test_async_function_is_timed_from_call_to_completion.<locals>.fetch"]
    assert f.is_async
    assert (f.call_count, f.total_ns, f.max_ns) == (2, 30 + 1_030, 1_030)


async def test_async_time_includes_awaits_of_other_tasks(fake_clock: FakeClock) -> None:
    @asyncflow.measure
    async def waits(event: asyncio.Event) -> None:
        await event.wait()

    async def other(event: asyncio.Event) -> None:
        fake_clock.advance(700)
        event.set()

    with asyncflow.profile("t", format="none") as prof:
        event = asyncio.Event()
        async with asyncio.TaskGroup() as tg:
            tg.create_task(waits(event))
            tg.create_task(other(event))
        snap = prof.snapshot()
    f = _functions(snap)["test_async_time_includes_awaits_of_other_tasks.<locals>.waits"]
    assert (f.call_count, f.total_ns, f.self_ns) == (1, 700, 700)


def test_nesting_self_and_total(fake_clock: FakeClock) -> None:
    @asyncflow.measure(name="inner")
    def inner() -> None:
        fake_clock.advance(5)

    @asyncflow.measure(name="outer")
    def outer() -> None:
        fake_clock.advance(10)
        inner()
        with asyncflow.measure_block("block"):
            fake_clock.advance(3)
            inner()
        fake_clock.advance(1)

    with asyncflow.profile("t", format="none") as prof:
        outer()
        inner()  # on its own: counted, attributed to nothing
        snap = prof.snapshot()
    f = _functions(snap)
    assert (f["outer"].total_ns, f["outer"].self_ns) == (24, 11)
    assert (f["block"].kind, f["block"].total_ns, f["block"].self_ns) == ("block", 8, 3)
    assert (f["inner"].call_count, f["inner"].total_ns, f["inner"].self_ns) == (3, 15, 15)
    assert f["block"].location.file == __file__
    assert f["block"].source.endswith(":test_nesting_self_and_total.<locals>.outer")


def test_recursion_counts_the_outermost_call_once(fake_clock: FakeClock) -> None:
    @asyncflow.measure(name="fact")
    def fact(n: int) -> int:
        fake_clock.advance(1)
        return 1 if n <= 1 else n * fact(n - 1)

    @asyncflow.measure(name="ping")
    def ping(n: int) -> int:
        fake_clock.advance(2)
        return pong(n - 1) if n else 0

    @asyncflow.measure(name="pong")
    def pong(n: int) -> int:
        fake_clock.advance(3)
        return ping(n - 1) if n else 0

    with asyncflow.profile("t", format="none") as prof:
        assert fact(10) == 3_628_800
        assert fact(3) == 6
        ping(4)  # ping pong ping pong ping: the inner ones belong to the first of each
        snap = prof.snapshot()
    f = _functions(snap)
    assert (f["fact"].call_count, f["fact"].total_ns, f["fact"].max_ns) == (2, 13, 10)
    assert (f["ping"].call_count, f["ping"].total_ns) == (1, 12)
    assert (f["pong"].call_count, f["pong"].total_ns) == (1, 10)
    assert f["ping"].self_ns == 2  # the rest is inside pong's outermost call


def test_errors_by_type_and_exceptions_untouched(fake_clock: FakeClock) -> None:
    raised: list[BaseException] = []

    @asyncflow.measure(name="flaky")
    def flaky(kind: type[BaseException] | None) -> str:
        fake_clock.advance(7)
        if kind is not None:
            exc = kind("boom")
            raised.append(exc)
            raise exc
        return "ok"

    caught: list[BaseException] = []
    with asyncflow.profile("t", format="none") as prof:
        for kind in (ValueError, None, KeyError, ValueError, None):
            try:
                flaky(kind)
            except Exception as exc:
                caught.append(exc)
        try:
            with asyncflow.measure_block("failing block"):
                raise asyncio.CancelledError
        except asyncio.CancelledError:
            pass
        snap = prof.snapshot()
    assert caught == raised and all(a is b for a, b in zip(caught, raised, strict=True))
    assert caught[0].__traceback__ is not None
    f = _functions(snap)
    assert (f["flaky"].call_count, f["flaky"].error_count, f["flaky"].total_ns) == (5, 3, 35)
    assert f["flaky"].errors == {"ValueError": 2, "KeyError": 1}
    assert f["failing block"].errors == {"asyncio.exceptions.CancelledError": 1}


def test_error_types_are_bounded(fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recording, "ERROR_TYPES_KEPT", 2)
    kinds = [type(f"E{i}", (Exception,), {}) for i in range(4)]

    @asyncflow.measure(name="many")
    def many(kind: type[Exception]) -> None:
        raise kind

    with asyncflow.profile("t", format="none") as prof:
        for kind in kinds:
            with pytest.raises(kind):
                many(kind)
        snap = prof.snapshot()
    errors = _functions(snap)["many"].errors
    assert sum(errors.values()) == 4 and errors["(other)"] == 2 and len(errors) == 3


def test_exact_counts_across_threads(fake_clock: FakeClock) -> None:
    @asyncflow.measure(name="shared")
    def shared() -> None:
        fake_clock.advance(1)

    threads, calls = 8, 2_000
    barrier = threading.Barrier(threads)

    def run() -> None:
        barrier.wait()
        for _ in range(calls):
            shared()
            with asyncflow.measure_block("shared block"):
                pass

    with asyncflow.profile("t", format="none") as prof:
        workers = [threading.Thread(target=run) for _ in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(30)
        snap = prof.snapshot()
    f = _functions(snap)
    assert f["shared"].call_count == threads * calls
    assert f["shared block"].call_count == threads * calls
    assert not timing._open  # every thread's open calls were closed and forgotten


async def test_work_in_other_tasks_and_threads_is_not_subtracted(fake_clock: FakeClock) -> None:
    @asyncflow.measure(name="blocking")
    def blocking() -> None:
        fake_clock.advance(50)

    @asyncflow.measure(name="child")
    async def child() -> None:
        fake_clock.advance(20)

    @asyncflow.measure(name="parent")
    async def parent() -> None:
        await asyncio.to_thread(blocking)  # runs beside the parent, in a worker thread
        await asyncio.get_running_loop().create_task(child())  # in a task of its own
        await child()  # nested in the parent's own task: subtracted

    with asyncflow.profile("t", format="none") as prof:
        with anyio.fail_after(10):
            await parent()
        snap = prof.snapshot()
    f = _functions(snap)
    assert f["parent"].total_ns == 90
    assert f["parent"].self_ns == 70
    assert (f["blocking"].call_count, f["child"].call_count) == (1, 2)


def test_labels_are_bounded(fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timing, "MAX_NAMES", 3)
    with asyncflow.profile("t", format="none") as prof:
        for i in range(10):
            for _ in range(2):
                with asyncflow.measure_block(f"request {i}"):
                    fake_clock.advance(1)
        snap = prof.snapshot()
    assert snap.functions is not None
    f = _functions(snap)
    assert sorted(f) == [timing.OTHER_NAMES, "request 0", "request 1", "request 2"]
    assert f[timing.OTHER_NAMES].call_count == 14
    assert f[timing.OTHER_NAMES].kind == "other"
    assert len(timing.sites()) == 4


def test_transparency_of_signatures_and_methods() -> None:
    def plain(a: int, b: str = "x", *, c: float = 1.0) -> str:
        """Plain's doc."""
        return f"{a}{b}{c}"

    async def coro(a: int, /, b: int = 2) -> int:
        return a + b

    for original in (plain, coro):
        measured: Any = asyncflow.measure(original)
        assert measured.__wrapped__ is original
        assert measured.__name__ == original.__name__
        assert measured.__qualname__ == original.__qualname__
        assert measured.__doc__ == original.__doc__
        assert inspect.signature(measured) == inspect.signature(original)
        assert inspect.iscoroutinefunction(measured) == inspect.iscoroutinefunction(original)
        assert asyncio.iscoroutinefunction(measured) == asyncio.iscoroutinefunction(original)
        assert asyncflow.measure(measured) is measured  # measuring twice counts once

    class Thing:
        def __init__(self) -> None:
            self.n = 5

        @asyncflow.measure
        def method(self, k: int) -> int:
            return self.n * k

        @asyncflow.measure
        @staticmethod
        def static(k: int) -> int:
            return k + 1

        @asyncflow.measure
        @classmethod
        def klass(cls, k: int) -> tuple[type, int]:
            return cls, k

        @staticmethod
        @asyncflow.measure
        async def astatic() -> str:
            return "a"

    thing = Thing()
    with asyncflow.profile("t", format="none") as prof:
        assert thing.method(2) == 10
        assert Thing.static(1) == 2 and thing.static(1) == 2
        assert Thing.klass(3) == (Thing, 3)
        assert asyncio.run(thing.astatic()) == "a"
        assert inspect.iscoroutinefunction(Thing.astatic)
        snap = prof.snapshot()
    calls = {label.rsplit(".", 1)[-1]: f.call_count for label, f in _functions(snap).items()}
    assert calls == {"method": 1, "static": 2, "klass": 1, "astatic": 1}


def test_bad_arguments() -> None:
    with pytest.raises(TypeError, match="needs a function"):
        asyncflow.measure(42)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="name"):
        asyncflow.measure(name=3)  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="empty"):
        asyncflow.measure(name=" ")
    with pytest.raises(TypeError, match="needs a string"):
        asyncflow.measure_block(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="empty"):
        asyncflow.measure_block("")
    with pytest.raises(ValueError, match="empty"):
        asyncflow.measure_block(" \t")  # as measure(name=" ") and counter(" ") refuse it
    # A label is printed in the exit report and in top: a newline would break its table, an
    # escape sequence would reach the user's terminal.
    for odd in ("two\nlines", "red\x1b[31m", "tab\there", "flip\u202e"):
        with pytest.raises(ValueError, match="printable"):
            asyncflow.measure(name=odd)
        with pytest.raises(ValueError, match="printable"):
            asyncflow.measure_block(odd)
    assert asyncflow.measure_block("café: parse (v2)") is not None  # spaces, accents are fine

    def gen() -> Iterator[int]:
        yield 1

    with pytest.raises(TypeError, match="measure_block"):
        asyncflow.measure(gen)

    class Thing:  # measured, it was a function: isinstance(x, Thing) raised TypeError
        pass

    with pytest.raises(TypeError, match="a class"):
        asyncflow.measure(Thing)
    with pytest.raises(TypeError, match="a class"):
        asyncflow.measure(name="thing")(Thing)


def test_no_profiler_records_nothing_and_picks_up_when_one_starts(fake_clock: FakeClock) -> None:
    @asyncflow.measure(name="early")
    def early() -> int:
        fake_clock.advance(3)
        return 1

    assert early() == 1  # nobody listens
    with asyncflow.measure_block("early block"):
        pass
    site = early.measure_site  # type: ignore[attr-defined]
    assert not any(site in shard.functions for shard in recording._shards)
    assert not timing._open
    with asyncflow.profile("t", format="none") as prof:
        early()
        snap = prof.snapshot()
    f = _functions(snap)
    assert f["early"].call_count == 1 and "early block" not in f
    with asyncflow.profile("t2", format="none") as prof:  # a new profile starts from zero
        snap = prof.snapshot()
    assert _functions(snap) == {}


def test_disabled_returns_the_function(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCFLOW_DISABLE", "1")

    def f() -> None:
        pass

    assert asyncflow.measure(f) is f


async def test_with_future_each_counts_once(fake_clock: FakeClock) -> None:
    @asyncflow.measure
    @asyncflow.future
    async def measured_future() -> int:
        fake_clock.advance(4)
        return 1

    @asyncflow.future
    @asyncflow.measure
    async def future_measured() -> int:
        fake_clock.advance(6)
        return 2

    assert inspect.iscoroutinefunction(measured_future)
    with asyncflow.profile("t", format="none") as prof:
        with asyncflow.instrument_tasks():
            loop = asyncio.get_running_loop()
            assert await loop.create_task(measured_future()) == 1
            assert await loop.create_task(future_measured()) == 2
            assert await measured_future() == 1
        snap = prof.snapshot()
    futures = [f for f in snap.futures.futures if f.call_count]
    by_label = {f.label.rsplit(".", 1)[-1]: (f.call_count, f.tracked_by) for f in futures}
    assert by_label["measured_future"] == (2, "decorator")
    assert by_label["future_measured"] == (1, "decorator")
    functions = {k.rsplit(".", 1)[-1]: v for k, v in _functions(snap).items()}
    assert (functions["measured_future"].call_count, functions["measured_future"].total_ns) == (
        2,
        8,
    )
    assert functions["future_measured"].call_count == 1
    # no future counts the same calls again as tasks of the measuring wrapper
    assert len(futures) == 2


async def test_measured_coroutines_are_separate_futures_as_tasks(fake_clock: FakeClock) -> None:
    @asyncflow.measure
    async def one() -> None:
        pass

    @asyncflow.measure
    async def two() -> None:
        pass

    with asyncflow.profile("t", format="none") as prof:
        with asyncflow.instrument_tasks():
            loop = asyncio.get_running_loop()
            await loop.create_task(one())
            await loop.create_task(two())
        snap = prof.snapshot()
    labels = {f.label for f in snap.futures.futures if f.tracked_by == "task" and f.call_count}
    assert {label.rsplit(".", 1)[-1] for label in labels} >= {"one", "two"}


async def test_async_with_block_and_reentry(fake_clock: FakeClock) -> None:
    with asyncflow.profile("t", format="none") as prof:
        async with asyncflow.measure_block("io"):
            fake_clock.advance(9)
            await asyncio.sleep(0)
        block = asyncflow.measure_block("reused")
        with block:
            fake_clock.advance(2)
            with block:  # entered again while open: only the outer use counts
                fake_clock.advance(3)
        with block:
            fake_clock.advance(1)
        snap = prof.snapshot()
    f = _functions(snap)
    assert (f["io"].call_count, f["io"].total_ns, f["io"].is_async) == (1, 9, False)
    assert (f["reused"].call_count, f["reused"].total_ns) == (2, 6)
    assert f["io"].location.file == __file__


class _Spans(recording.Recorder):
    def __init__(self) -> None:
        self.spans: list[tuple[str, int, int, int, type[BaseException] | None]] = []
        self.metrics: list[tuple[str, str, float | str]] = []

    def span(
        self,
        site: timing.Site,
        start_ns: int,
        end_ns: int,
        child_ns: int,
        error: type[BaseException] | None,
    ) -> None:
        self.spans.append((site.name, start_ns, end_ns, child_ns, error))

    def metric(self, metric: _values.Metric, op: str, value: float | str, at_ns: int) -> None:
        self.metrics.append((metric.name, op, value))


def test_a_recorder_receives_spans_without_a_profiler(fake_clock: FakeClock) -> None:
    spans = recording.add_recorder(_Spans())
    assert recording.recorders() == (spans,)

    @asyncflow.measure(name="a")
    def a() -> None:
        fake_clock.advance(2)
        with asyncflow.measure_block("b"):
            fake_clock.advance(5)

    t0 = fake_clock()
    a()
    with pytest.raises(ZeroDivisionError), asyncflow.measure_block("c"):
        1 / 0  # noqa: B018
    asyncflow.counter("n").add(2)
    asyncflow.gauge("g").dec()
    assert isinstance(spans, _Spans)
    assert spans.spans == [
        ("b", t0 + 2, t0 + 7, 0, None),
        ("a", t0, t0 + 7, 5, None),
        ("c", t0 + 7, t0 + 7, 0, ZeroDivisionError),
    ]
    assert spans.metrics == [("n", "add", 2), ("g", "add", -1)]
    site = timing.sites()[0]  # the collector's share records nothing: no profiler
    assert not any(site in shard.functions for shard in recording._shards)
    recording.remove_recorder(spans)
    a()
    assert len(spans.spans) == 3 and recording.recorders() == ()


def test_a_failing_recorder_is_removed_and_counted(fake_clock: FakeClock) -> None:
    class Broken(recording.Recorder):
        def span(self, *args: Any) -> None:
            raise RuntimeError("recorder bug")

    recording.add_recorder(Broken())
    before = _session.errors.count

    @asyncflow.measure(name="fine")
    def fine() -> int:
        return 7

    with asyncflow.profile("t", format="none") as prof:
        assert fine() == 7  # the program never sees the recorder's error
        assert fine() == 7
        snap = prof.snapshot()
    assert recording.recorders() == ()
    assert _session.errors.count == before + 1
    assert _functions(snap)["fine"].call_count == 2
    with pytest.raises(TypeError, match="Recorder"):
        recording.add_recorder(object())  # type: ignore[arg-type]


def test_a_recorder_receives_each_tracked_call(fake_clock: FakeClock) -> None:
    """The calls of tracked futures reach a user's recorder too (``Recorder.call``), from the
    collector's drain: exact start, end, outcome, error, busy time and polls."""
    calls: list[FinishedCall] = []

    class Calls(recording.Recorder):
        def call(self, call: FinishedCall) -> None:
            calls.append(call)

    @asyncflow.future(name="fetch")
    async def fetch(ms: int) -> int:
        fake_clock.advance(ms)
        await asyncio.sleep(0)
        fake_clock.advance(1)
        if ms == 3:
            raise KeyError(ms)
        return ms

    async def main() -> Any:
        return await asyncio.gather(fetch(5), fetch(3), return_exceptions=True)

    recording.add_recorder(Calls())
    with asyncflow.profile("t", format="none") as prof:
        t0 = fake_clock()
        results = asyncio.run(main())
        prof.snapshot()  # drains: the calls are handed over by now
    assert results[0] == 5 and isinstance(results[1], KeyError)
    assert [(c.label, c.outcome, c.error, c.polls) for c in calls] == [
        ("fetch", "returned", None, 2),
        ("fetch", "raised", "KeyError", 2),
    ]
    first, second = calls
    assert (first.start_ns, first.end_ns, first.busy_ns) == (t0, t0 + 9, 6)
    assert first.duration_ns == first.end_ns - first.start_ns
    assert (second.start_ns, second.end_ns, second.busy_ns) == (t0, t0 + 10, 4)


def test_a_recorder_failing_on_a_call_is_removed(fake_clock: FakeClock) -> None:
    class Broken(recording.Recorder):
        def call(self, call: FinishedCall) -> None:
            raise RuntimeError("recorder bug")

    @asyncflow.future
    async def job() -> int:
        return 1

    recording.add_recorder(Broken())
    before = _session.errors.count
    with asyncflow.profile("t", format="none") as prof:
        assert asyncio.run(job()) == 1
        assert asyncio.run(job()) == 1
        snap = prof.snapshot()
    assert recording.recorders() == ()
    assert _session.errors.count == before + 1
    assert sum(f.call_count for f in snap.futures.futures if f.label.endswith("job")) == 2


def test_final_snapshot_and_json_report(fake_clock: FakeClock, tmp_path: Any) -> None:
    @asyncflow.measure(name="reported")
    def reported() -> None:
        fake_clock.advance(11)

    out = tmp_path / "report.json"
    with asyncflow.profile("t", format="json", output=str(out)):
        reported()
    final = asyncflow.stop()
    assert final is not None
    assert _functions(final)["reported"].total_ns == 11
    assert '"reported"' in out.read_text()


def test_wraps_keeps_partial_and_callables() -> None:
    def add(a: int, b: int) -> int:
        return a + b

    measured: Any = asyncflow.measure(name="add one")(functools.partial(add, 1))
    with asyncflow.profile("t", format="none") as prof:
        assert measured(2) == 3
        snap = prof.snapshot()
    assert _functions(snap)["add one"].call_count == 1


def test_served_routes(fake_clock: FakeClock) -> None:
    import json
    import urllib.request

    @asyncflow.measure(name="served")
    def served() -> None:
        fake_clock.advance(12)

    with asyncflow.profile("t", format="none") as prof:
        served()
        asyncflow.counter("served.count").add(3)
        url = prof.url
        assert url is not None

        def get(path: str) -> Any:
            with urllib.request.urlopen(url + path, timeout=10) as response:
                return json.loads(response.read())

        functions = get("/functions?limit=5")
        metrics = get("/user_metrics")
        paths = get("/openapi.json")["paths"]
    assert functions["functions"][0]["label"] == "served"
    assert functions["functions"][0]["total_ns"] == 12
    assert functions["limit"] == 5 and functions["total"] == 1
    assert metrics["metrics"] == [
        {
            "id": metrics["metrics"][0]["id"],
            "name": "served.count",
            "kind": "counter",
            "count": 1,
            "value": 3,
            "min": None,
            "max": None,
            "sum": 0,
            "percentiles": {},
            "recent": [],
        }
    ]
    assert "/functions" in paths and "/user_metrics" in paths


def test_served_documents_with_every_field_filled_match_the_openapi_document(
    fake_clock: FakeClock,
) -> None:
    # test_server validates every route, but there nothing is measured: the entries' schemas
    # (errors by type, a call running now, each metric kind, a value log of numbers and
    # strings) are checked here, on documents that fill them.
    import json
    import urllib.request

    import jsonschema

    @asyncflow.measure(name="served")
    def served(fail: bool) -> None:
        fake_clock.advance(12)
        if fail:
            raise KeyError("x")

    with asyncflow.profile("t", format="none", port=0) as prof:
        url = prof.url
        assert url is not None
        for fail in (False, True):
            with pytest.raises(KeyError) if fail else contextlib.nullcontext():
                served(fail)
        asyncflow.counter("c").add(2.5)
        asyncflow.gauge("g").set(-1.5)
        asyncflow.histogram("h").record(40)
        asyncflow.value("v", "text")
        asyncflow.value("v", 2.5)

        def get(path: str) -> Any:
            with urllib.request.urlopen(url + path, timeout=10) as response:
                return json.loads(response.read())

        with asyncflow.measure_block("open now"):
            bodies = {path: get(path) for path in ("/functions", "/user_metrics")}
        spec = get("/openapi.json")
    assert {f["label"]: f["running_count"] for f in bodies["/functions"]["functions"]} == {
        "served": 0,
        "open now": 1,
    }
    assert [m["kind"] for m in bodies["/user_metrics"]["metrics"]] == [
        "counter",
        "gauge",
        "histogram",
        "value",
    ]
    for path, body in bodies.items():
        (media,) = spec["paths"][path]["get"]["responses"]["200"]["content"].values()
        jsonschema.Draft202012Validator(
            {**media["schema"], "components": spec["components"]}
        ).validate(body)


def test_exit_report_has_a_functions_table(fake_clock: FakeClock) -> None:
    from asyncflow.render.report import render_table

    @asyncflow.measure(name="reported work")
    def reported() -> None:
        fake_clock.advance(2_000)

    with asyncflow.profile("t", format="none") as prof:
        for _ in range(3):
            reported()
        with pytest.raises(KeyError), asyncflow.measure_block("lookup"):
            raise KeyError("x")
        asyncflow.counter("hits").add(5)
        fake_clock.advance(4_000)
        snap = prof.snapshot()
    lines = render_table(snap, (50.0,), 0).splitlines()
    header = next(line for line in lines if line.startswith("function "))
    assert " ".join(header.split()) == "function calls errors total self mean p50 max of wall"
    work = next(line for line in lines if line.startswith("reported work "))
    assert " ".join(work.split()) == "reported work 3 0 6 µs 6 µs 2 µs 2 µs 2 µs 60.0%"
    assert next(line for line in lines if line.startswith("lookup [block]")).split()[2:4] == [
        "1",
        "1",
    ]
    assert next(line for line in lines if line.startswith("hits ")).split() == [
        "hits",
        "counter",
        "1",
        "5",
        "-",
        "-",
        "-",
        "-",
        "-",
    ]


def test_shop_example_reports_functions_and_metrics() -> None:
    import orjson

    from tests.support.commands import run_example

    done = run_example("shop_timing.py", "--json")
    functions_line, metrics_line = done.stdout.strip().splitlines()[-2:]
    functions = {f["label"]: f for f in orjson.loads(functions_line)["functions"]}
    assert {k: f["call_count"] for k, f in functions.items()} == {
        "handle": 200,
        "fetch": 200,
        "validate": 192,
        "parse": 192,
    }
    assert functions["fetch"]["errors"] == {"TimeoutError": 8}
    assert functions["validate"]["kind"] == "block"
    assert functions["handle"]["self_ns"] < functions["handle"]["total_ns"]
    metrics = {m["name"]: m for m in orjson.loads(metrics_line)["metrics"]}
    assert metrics["requests"]["value"] == 200
    assert (metrics["in_flight"]["value"], metrics["in_flight"]["max"]) == (0, 20)
    assert (metrics["response_bytes"]["count"], metrics["response_bytes"]["sum"]) == (192, 21_579)
    assert metrics["last_id"]["count"] == 200 and len(metrics["last_id"]["recent"]) == 100


async def test_cancelling_a_measured_coroutine_is_transparent(fake_clock: FakeClock) -> None:
    started = asyncio.Event()

    @asyncflow.measure(name="sleeper")
    async def sleeper() -> None:
        started.set()
        await asyncio.sleep(3600)

    with asyncflow.profile("t", format="none") as prof:
        task = asyncio.get_running_loop().create_task(sleeper())
        with anyio.fail_after(10):
            await started.wait()
        fake_clock.advance(40)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled() and task.cancelling() == 1
        snap = prof.snapshot()
    f = _functions(snap)["sleeper"]
    assert (f.call_count, f.total_ns) == (1, 40)
    assert f.errors == {"asyncio.exceptions.CancelledError": 1}
    assert not timing._open


def test_a_call_open_when_the_profiler_stops_is_dropped(fake_clock: FakeClock) -> None:
    prof = asyncflow.start("t", format="none")

    @asyncflow.measure(name="outlives")
    def outlives() -> int:
        asyncflow.stop()
        return 5

    assert outlives() == 5  # ends after the profiler stopped: not counted, nothing raised
    assert not timing._open
    assert "outlives" not in _functions(prof.snapshot())


async def test_running_now_shows_calls_that_have_not_returned(fake_clock: FakeClock) -> None:
    started = asyncio.Event()
    inside: list[Snapshot] = []

    @asyncflow.measure(name="stuck")
    async def stuck() -> None:
        started.set()
        await asyncio.sleep(3600)

    @asyncflow.measure(name="looks")
    def looks(prof: Any) -> None:
        fake_clock.advance(5)
        inside.append(prof.snapshot())  # taken while this very call runs

    with asyncflow.profile("t", format="none") as prof:
        tasks = [asyncio.get_running_loop().create_task(stuck()) for _ in range(2)]
        with anyio.fail_after(10):
            await started.wait()
        fake_clock.advance(30)
        looks(prof)
        running = _functions(inside[0])
        assert (running["stuck"].running_count, running["stuck"].call_count) == (2, 0)
        assert running["stuck"].current_elapsed_ns == 35
        assert (running["looks"].running_count, running["looks"].current_elapsed_ns) == (1, 5)
        for task in tasks:
            task.cancel()
        with anyio.fail_after(10):
            await asyncio.gather(*tasks, return_exceptions=True)
        after = _functions(prof.snapshot())
    assert (after["stuck"].running_count, after["stuck"].call_count) == (0, 2)
    assert (after["looks"].running_count, after["looks"].current_elapsed_ns) == (0, 0)


def test_the_running_task_is_found_where_asyncio_keeps_it() -> None:
    """3.11-3.13: asyncio.tasks._current_tasks is _asyncio's own dict, read directly. 3.14's C
    tasks keep the running task on the thread's state and never write that dict (then empty):
    asyncio.current_task must be asked instead."""

    class Accelerator:  # _asyncio as 3.11-3.13 has it
        _current_tasks: ClassVar[dict[Any, Any]] = {}

    shared = Accelerator._current_tasks
    assert timing._task_lookup(shared, Accelerator()) == shared.get
    assert timing._task_lookup({}, object()) is asyncio.current_task  # 3.14: no such dict
    assert timing._task_lookup({}, Accelerator()) is asyncio.current_task  # not _asyncio's
    assert timing._task_lookup(None, None) is asyncio.current_task
    pure: dict[Any, Any] = {}
    assert timing._task_lookup(pure, None) == pure.get  # pure-Python asyncio writes its own


def test_concurrent_calls_are_not_taken_for_recursion_where_asyncio_keeps_no_dict(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With 3.14's layout (the dict left empty by C tasks), concurrent calls of one measured
    function in ten tasks are ten calls, not one outermost call and nine recursions."""
    monkeypatch.setattr(timing, "_current_task", timing._task_lookup({}, object()))

    @asyncflow.measure
    async def work() -> None:
        await asyncio.sleep(0)

    async def main() -> None:
        await asyncio.gather(*(work() for _ in range(10)))

    with asyncflow.profile("t", format="none") as prof:
        asyncio.run(main())
        snap = prof.snapshot()
    f = _functions(snap)[
        "test_concurrent_calls_are_not_taken_for_recursion_where_asyncio_keeps_no_dict.<locals>.work"
    ]
    assert f.call_count == 10
