"""A future's figures on both hot paths: ``FutureStats`` keeps Python ints on the pure-Python path
and C integers on the compiled one (``_speedups.FutureStats``); both read, write and fold alike."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import pytest

from asyncflow import stats
from asyncflow.instrumentation import futures
from asyncflow.instrumentation.futures import FutureRecord
from tests.support.compiled_path import STATS_COUNTERS as COUNTERS
from tests.support.compiled_path import compiled


def _kinds() -> list[Any]:
    kinds: list[Any] = [futures.FutureStatsPy]
    if futures._speedups is not None:
        kinds.append(futures._speedups.FutureStats)
    return kinds


def _figures(st: Any) -> dict[str, Any]:
    seen = {name: getattr(st, name) for name in COUNTERS}
    seen["poll_hist"] = dict(st.poll_hist.items())
    seen["call_hist"] = dict(st.call_hist)
    seen["sched_hist"] = dict(st.sched_hist)
    seen["live"] = dict(st.live)
    seen["recent"] = None if st.recent is None else list(st.recent)
    return seen


def test_every_slot_of_the_reference_is_a_field_of_either() -> None:
    names = set(futures.FutureStatsPy.__slots__)
    assert names == {
        *COUNTERS,
        "live",
        "poll_hist",
        "call_hist",
        "sched_hist",
        "recent",
        "series",
        "error_types",
    }
    for kind in _kinds():
        st = kind()
        assert all(getattr(st, name) == 0 and type(getattr(st, name)) is int for name in COUNTERS)
        assert st.live == {} == st.error_types and st.recent is None and st.series is None
        assert len(st.poll_hist) == len(st.call_hist) == len(st.sched_hist) == 0
        assert type(st.call_hist) is type(st.poll_hist) is type(futures._new_poll_histogram())
        assert type(st.sched_hist) is type(st.poll_hist)
        for i, name in enumerate(COUNTERS):  # read back as set, and added to as an int
            setattr(st, name, (1 << 62) + i)
            setattr(st, name, getattr(st, name) + 1)
        assert [getattr(st, name) for name in COUNTERS] == [
            (1 << 62) + i + 1 for i in range(len(COUNTERS))
        ]


@compiled
def test_the_compiled_counters_refuse_what_they_cannot_hold() -> None:
    st = futures._speedups.FutureStats()
    with pytest.raises(OverflowError):
        st.busy_done = 1 << 63
    with pytest.raises(TypeError):
        st.created = "1"
    with pytest.raises(TypeError):
        del st.returned
    with pytest.raises(TypeError):
        futures._speedups.FutureStats(1)
    assert st.busy_done == 0 and st.created == 0 and st.returned == 0  # unchanged


def test_new_stats_follow_the_record_class_in_use(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled records count into C integers; the Python ones (no extension, or the
    benchmark's pure-Python column, which swaps CallRecord) into Python ints."""
    made = futures._new_stats()
    if futures.accelerated:
        assert type(made) is futures._speedups.FutureStats
        monkeypatch.setattr(futures, "CallRecord", futures.CallRecordPy)
        assert type(futures._new_stats()) is futures.FutureStatsPy
    else:
        assert type(made) is futures.FutureStatsPy
    assert type(FutureRecord("x", "m:x", "m.py", 1, False, "decorator").stats) is type(
        futures._new_stats()
    )


def _gone(kind: Any, label: str, seed: int) -> FutureRecord:
    record = FutureRecord(label, f"m:{label}", "m.py", 3, False, "decorator")
    st = record.stats = kind()
    for i, name in enumerate(COUNTERS):
        setattr(st, name, seed * 100 + i)
    st.poll_hist[stats.bucket_of(1_000)] += seed
    st.call_hist[stats.bucket_of(50_000)] += 2 * seed
    st.sched_hist[stats.bucket_of(7_000)] += 3 * seed
    return record


@pytest.mark.parametrize(
    "agg_kind,kinds",
    [(a, (b, c)) for a in _kinds() for b in _kinds() for c in _kinds()],
    ids=lambda k: getattr(k, "__module__", "-").rsplit(".", 1)[-1] if isinstance(k, type) else "",
)
def test_gone_futures_fold_alike_whatever_their_stats(
    monkeypatch: pytest.MonkeyPatch, agg_kind: Any, kinds: tuple[Any, Any]
) -> None:
    monkeypatch.setattr(futures._history, "aggregates", {})
    monkeypatch.setattr(futures, "_gone_ids", OrderedDict())
    monkeypatch.setattr(futures, "_new_stats", agg_kind)
    first, second = _gone(kinds[0], "g", 1), _gone(kinds[1], "g", 2)
    with futures._registry_lock:
        futures._history._fold(first)
        futures._history._fold(second)
    (agg,) = futures._history.aggregates.values()
    assert type(agg.stats) is agg_kind and agg.folded == 2
    folded = _figures(agg.stats)
    for i, name in enumerate(COUNTERS):
        if name in ("first_call", "first_caller"):  # (left out of an aggregate: a gone one's)
            assert folded[name] == 0
            continue
        expected = 200 + i if name.startswith("max_") else 300 + 2 * i
        assert folded[name] == expected, name
    assert folded["poll_hist"] == {stats.bucket_of(1_000): 3}
    assert folded["call_hist"] == {stats.bucket_of(50_000): 6}
    assert folded["sched_hist"] == {stats.bucket_of(7_000): 9}


def test_an_extension_out_of_step_is_left_for_the_pure_python_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An extension built from older sources (a stale in-place build) lacks types this code
    needs: asyncflow then runs in pure Python rather than failing to import."""
    import types

    from asyncflow.instrumentation import futures

    set_up: list[object] = []
    stale = types.SimpleNamespace(
        setup=lambda *args: set_up.append(args),
        InstrumentedCoroutine=object,
        CallRecord=object,  # no FutureStats, no PollHistogram...
    )
    import importlib

    from asyncflow import config

    monkeypatch.setattr(config, "no_extensions", lambda: False)
    monkeypatch.setattr(importlib, "import_module", lambda name: stale)
    assert futures._load_speedups() is None
    assert set_up == []  # not set up half-way either


@pytest.mark.parametrize("record_kind", ["python", "compiled"])
def test_a_first_log_made_while_another_call_is_folded_keeps_both(
    monkeypatch: pytest.MonkeyPatch, record_kind: str
) -> None:
    """Making a future's first log of recent calls may let another thread (or a finalizer)
    fold a call of the same future first: both calls stay in the log."""
    if record_kind == "compiled" and futures._speedups is None:
        pytest.skip("no compiled path")
    make = futures.CallRecordPy if record_kind == "python" else futures._speedups.CallRecord
    future = FutureRecord("f", "m:f", "m.py", 1, False, "decorator")
    first, second = make(future, future.stats, 10), make(future, future.stats, 11)
    first.finished = second.finished = 20
    real = futures.deque  # type: ignore[attr-defined]
    made: list[int] = []

    def deque_that_lets_another_fold_first(*args: Any, **kwargs: Any) -> Any:
        made.append(1)
        if len(made) == 1:
            assert futures.fold_call(second, 5)
        return real(*args, **kwargs)

    monkeypatch.setattr(futures, "deque", deque_that_lets_another_fold_first)
    assert futures.fold_call(first, 5)
    assert list(future.stats.recent) == [second, first] and len(made) == 2
