"""``asyncflow.counter``/``gauge``/``histogram``/``value``: exact figures, threads, bad input,
bounded names, the ``user_metrics`` document."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator

import orjson
import pytest

import asyncflow
from asyncflow import schema, stats
from asyncflow.clock import FakeClock
from asyncflow.instrumentation import _session, recording
from asyncflow.instrumentation import values as _values
from asyncflow.schema import MetricEntry, Snapshot, ValueSample


@pytest.fixture(autouse=True)
def _fresh_metrics() -> Iterator[None]:
    _values.reset_for_tests()
    yield
    _values.reset_for_tests()


def _metrics(snapshot: Snapshot) -> dict[str, MetricEntry]:
    assert snapshot.user_metrics is not None
    return {m.name: m for m in snapshot.user_metrics.metrics}


def test_each_kind_exact(fake_clock: FakeClock) -> None:
    with asyncflow.profile("t", format="none") as prof:
        hits = asyncflow.counter("hits")
        assert asyncflow.counter("hits") is hits
        hits.add()
        hits.add(4)
        hits.add(0.5)
        conns = asyncflow.gauge("connections")
        conns.set(10)
        conns.inc()
        conns.dec(4)
        conns.inc(2)
        sizes = asyncflow.histogram("batch")
        for v in (1, 2, 3, 100, 1_000):
            sizes.record(v)
        fake_clock.advance(50)
        asyncflow.value("temperature", 21.5)
        fake_clock.advance(25)
        asyncflow.value("temperature", "n/a")
        asyncflow.value("temperature", 19)
        snap = prof.snapshot()
    m = _metrics(snap)
    assert [e.name for e in snap.user_metrics.metrics] == [  # type: ignore[union-attr]
        "hits",
        "connections",
        "batch",
        "temperature",
    ]
    assert (m["hits"].kind, m["hits"].count, m["hits"].value) == ("counter", 3, 5.5)
    assert (m["hits"].min, m["hits"].max) == (None, None)
    g = m["connections"]
    assert (g.kind, g.count, g.value, g.min, g.max) == ("gauge", 4, 9, 7, 11)
    h = m["batch"]
    assert (h.kind, h.count, h.sum, h.min, h.max, h.value) == (
        "histogram",
        5,
        1_106,
        1,
        1_000,
        None,
    )
    assert h.percentiles == {
        "p50": 3,
        "p95": stats.bucket_value(stats.bucket_of(1_000)),
        "p99": stats.bucket_value(stats.bucket_of(1_000)),
    }
    t = m["temperature"]
    assert (t.kind, t.count, t.value, t.min, t.max) == ("value", 3, 19, 19, 21.5)
    assert t.recent == [ValueSample(50, 21.5), ValueSample(75, "n/a"), ValueSample(75, 19)]


def test_percentiles_stay_between_the_smallest_and_largest_value() -> None:
    # A bucket's midpoint can lie past the samples in it: 208 falls in a bucket whose value
    # is 210, and a histogram of response sizes showed p99 210 beside max 208.
    with asyncflow.profile("t", format="none") as prof:
        sizes = asyncflow.histogram("response_bytes")
        for v in (23, 109, 208, 208):
            sizes.record(v)
        snap = prof.snapshot()
    h = _metrics(snap)["response_bytes"]
    assert stats.bucket_value(stats.bucket_of(208)) > 208  # the case: the bucket's value is past
    assert (h.min, h.max) == (23, 208)
    assert h.percentiles["p99"] == 208 and h.percentiles["p50"] == 109
    assert all(23 <= v <= 208 for v in h.percentiles.values())


def test_exact_from_many_threads() -> None:
    threads, updates = 8, 5_000
    barrier = threading.Barrier(threads)

    def run() -> None:
        c, g, h = asyncflow.counter("c"), asyncflow.gauge("g"), asyncflow.histogram("h")
        barrier.wait()
        for i in range(updates):
            c.add()
            g.inc()
            g.dec(2)
            h.record(i % 10)

    with asyncflow.profile("t", format="none") as prof:
        workers = [threading.Thread(target=run) for _ in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(30)
        snap = prof.snapshot()
    m = _metrics(snap)
    assert m["c"].value == threads * updates
    assert (m["g"].value, m["g"].count) == (-threads * updates, 2 * threads * updates)
    assert (m["h"].count, m["h"].sum) == (threads * updates, threads * updates // 10 * 45)


def test_value_log_is_a_bounded_ring(
    fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(recording, "VALUE_LOG_SIZE", 3)
    with asyncflow.profile("t", format="none") as prof:
        for i in range(10):
            fake_clock.advance(1)
            asyncflow.value("v", i)
        asyncflow.value("long", "x" * 1_000)
        snap = prof.snapshot()
    v = _metrics(snap)["v"]
    assert v.count == 10 and (v.min, v.max) == (0, 9)
    assert v.recent == [ValueSample(8, 7), ValueSample(9, 8), ValueSample(10, 9)]
    assert _metrics(snap)["long"].value == "x" * _values.MAX_VALUE_CHARS


def test_bad_input_is_refused_and_records_nothing() -> None:
    with asyncflow.profile("t", format="none") as prof:
        c = asyncflow.counter("c")
        with pytest.raises(ValueError, match="only goes up"):
            c.add(-1)
        with pytest.raises(TypeError, match="needs a number"):
            c.add("1")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="needs a number"):
            c.add(True)
        with pytest.raises(ValueError, match="finite"):
            asyncflow.gauge("g").set(math.nan)
        with pytest.raises(ValueError, match="v >= 0"):
            asyncflow.histogram("h").record(-0.5)
        with pytest.raises(TypeError, match="number"):
            asyncflow.value("v", object())  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="already a counter"):
            asyncflow.gauge("c")
        with pytest.raises(TypeError, match="needs a string"):
            asyncflow.counter(3)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="empty"):
            asyncflow.histogram(" ")
        for odd in ("two\nlines", "red\x1b[31m"):  # printed in the report and top as they are
            with pytest.raises(ValueError, match="printable"):
                asyncflow.counter(odd)
            with pytest.raises(ValueError, match="printable"):
                asyncflow.value(odd, 1)
        assert asyncflow.gauge("café: queue (v2)").kind == "gauge"  # spaces, accents are fine
        snap = prof.snapshot()
    assert _metrics(snap) == {}


def test_bad_input_is_refused_the_same_with_no_profiler_running() -> None:
    # A program must not start raising because a profiler was turned on: a bad update is an
    # error whether anybody listens or not (it was silently taken while nobody did).
    assert _session.active is None and not recording.recorders()
    c, g, h = asyncflow.counter("c"), asyncflow.gauge("g"), asyncflow.histogram("h")
    cases: list[tuple[Callable[[], None], type[Exception], str]] = [
        (lambda: c.add(-1), ValueError, "only goes up"),
        (lambda: c.add("1"), TypeError, "needs a number"),  # type: ignore[arg-type]
        (lambda: c.add(math.inf), ValueError, "finite"),
        (lambda: g.set(math.nan), ValueError, "finite"),
        (lambda: g.inc(None), TypeError, "needs a number"),  # type: ignore[arg-type]
        (lambda: g.dec(True), TypeError, "needs a number"),
        (lambda: h.record(-0.5), ValueError, "v >= 0"),
        (lambda: h.record("3"), TypeError, "needs a number"),  # type: ignore[arg-type]
        (lambda: asyncflow.value("v", object()), TypeError, "number"),  # type: ignore[arg-type]
        (lambda: asyncflow.value("v", math.nan), ValueError, "finite"),
    ]
    for bad, error, said in cases:
        with pytest.raises(error, match=said):
            bad()
    assert not any(m in shard.metrics for shard in recording._shards for m in (c, g, h))


def test_no_profiler_records_nothing() -> None:
    c = asyncflow.counter("early")
    c.add(5)
    asyncflow.value("early value", 1)
    assert not any(c in shard.metrics for shard in recording._shards)  # not even a shard's
    with asyncflow.profile("t", format="none") as prof:
        c.add(2)
        snap = prof.snapshot()
    assert _metrics(snap)["early"].value == 2
    with asyncflow.profile("t2", format="none") as prof:  # a new profile starts from zero
        assert _metrics(prof.snapshot()) == {}


def test_names_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_values, "MAX_METRICS", 2)
    with asyncflow.profile("t", format="none") as prof:
        for i in range(6):
            asyncflow.counter(f"requests.{i}").add()
        asyncflow.value("late", 1.0)
        snap = prof.snapshot()
    assert snap.user_metrics is not None
    names = [(e.kind, e.name, e.count) for e in snap.user_metrics.metrics]
    assert names == [
        ("counter", _values.OTHER_METRICS, 4),
        ("counter", "requests.0", 1),
        ("counter", "requests.1", 1),
        ("value", _values.OTHER_METRICS, 1),
    ]
    others = [e for e in snap.user_metrics.metrics if e.name == _values.OTHER_METRICS]
    assert sorted((e.kind, e.count) for e in others) == [("counter", 4), ("value", 1)]
    assert snap.user_metrics.names_folded == 5
    assert len(_values.metrics()) == 4


def test_snapshot_json_round_trip() -> None:
    with asyncflow.profile("t", format="none") as prof:
        asyncflow.counter("c").add(2)
        asyncflow.histogram("h").record(7)
        asyncflow.value("v", "text")
        snap = prof.snapshot()
    back = schema.load(Snapshot, orjson.loads(schema.dumps(snap)))
    assert back.user_metrics == snap.user_metrics


def test_threads_shards_merge_in_time_order_and_survive_their_threads(
    fake_clock: FakeClock,
) -> None:
    # Each thread records into a shard of its own; the document sums them, puts the value
    # logs of all threads in time order, and keeps the figures of threads that have ended.
    def log(values: list[int]) -> None:
        for v in values:
            asyncflow.value("v", v)
            asyncflow.counter("n").add(v)
            asyncflow.histogram("h").record(v)

    with asyncflow.profile("t", format="none") as prof:
        fake_clock.advance(10)
        first = threading.Thread(target=log, args=([1, 2],))
        first.start()
        first.join(30)
        fake_clock.advance(10)
        log([30])  # this thread, later
        fake_clock.advance(10)
        second = threading.Thread(target=log, args=([4],))
        second.start()
        second.join(30)
        snap = prof.snapshot()
        again = prof.snapshot()  # the ended threads' shards, folded once, stay counted
        threads = [shard.thread() for shard in recording._shards if shard.thread is not None]
        assert first not in threads and second not in threads  # folded into the retired one
        assert threading.current_thread() in threads
    for m in (_metrics(snap), _metrics(again)):
        assert m["v"].recent == [
            ValueSample(10, 1),
            ValueSample(10, 2),
            ValueSample(20, 30),
            ValueSample(30, 4),
        ]
        assert (m["v"].count, m["v"].value, m["v"].min, m["v"].max) == (4, 4, 1, 30)
        assert (m["n"].count, m["n"].value) == (4, 37)
        assert (m["h"].count, m["h"].sum, m["h"].min, m["h"].max) == (4, 37, 1, 30)


class _BadRepr:
    def __repr__(self) -> str:
        raise ValueError("no repr")


class _LongRepr:
    def __repr__(self) -> str:
        return "x" * 1_000_000


def test_a_refused_argument_is_named_by_its_type_whatever_its_repr_does() -> None:
    # The message quotes the program's object: a repr() that fails must not replace the
    # TypeError, and one of a megabyte must not become the message.
    with pytest.raises(TypeError, match=r"needs a number, got _BadRepr: <repr\(\) failed"):
        asyncflow.counter("bad repr").add(_BadRepr())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"needs a string, got _BadRepr") as refused:
        asyncflow.gauge(_BadRepr())  # type: ignore[arg-type]
    with pytest.raises(TypeError) as refused:
        asyncflow.histogram("long repr").record(_LongRepr())  # type: ignore[arg-type]
    assert len(str(refused.value)) < 300
