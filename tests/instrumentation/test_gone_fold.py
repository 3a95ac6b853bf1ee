"""The one fold of gone records' figures (``_gone.Fold``): every field of every kind is declared,
and every counter of a gone record reaches its aggregate, on the hot path this run uses."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from asyncflow.instrumentation import channels, executors, futures, resources, streams
from asyncflow.instrumentation._gone import Fold, GoneHistory, fields_of
from asyncflow.stats import new_histogram

#: every fold of figures, with the class it is declared for
_FOLDS: list[tuple[type, Fold]] = [
    (futures.FutureStatsPy, futures._FOLD),
    (channels.ChannelStats, channels._FOLD),
    (channels.Edge, channels._EDGE_FOLD),
    (streams.StreamStatsPy, streams._FOLD),
    (executors.ExecutorStats, executors._FOLD),
    (executors.JobFigures, executors._JOBS_FOLD),
    (resources.ResourceStats, resources._FOLD),
    (resources.ResourceEdge, resources._EDGE_FOLD),
]


@pytest.mark.parametrize(("cls", "fold"), _FOLDS, ids=lambda v: getattr(v, "__qualname__", ""))
def test_every_field_is_folded_or_declared_left(cls: type, fold: Fold) -> None:
    fields = fields_of(cls)
    declared = [*fold.summed, *fold.maximum, *fold.histogram, *fold.left]
    assert sorted(declared) == sorted(fields)  # each field once, none missing
    fresh = cls()
    for name in fields:
        value = getattr(fresh, name)
        if isinstance(value, (int, float)) and name not in fold.left:
            assert name in fold.summed or name in fold.maximum, name


def test_the_compiled_figures_have_the_reference_fields() -> None:
    # The folds are declared on the reference classes and applied by name to the compiled ones.
    if futures.FutureStats is not futures.FutureStatsPy:
        compiled = {n for n in dir(futures.FutureStats) if not n.startswith("__")}
        assert set(fields_of(futures.FutureStatsPy)) <= compiled
    if streams.StreamStatsC is not None:
        compiled = {n for n in dir(streams.StreamStatsC) if not n.startswith("__")}
        assert set(fields_of(streams.StreamStatsPy)) <= compiled


def test_a_new_int_counter_is_summed_with_no_other_edit() -> None:
    class Figures:
        __slots__ = ("hist", "longest", "new_counter", "sent")

        def __init__(self) -> None:
            self.sent = 0
            self.new_counter = 0
            self.longest = 0
            self.hist = new_histogram()

    fold = Fold(Figures, maximum=("longest",), histogram=("hist",))
    into, other = Figures(), Figures()
    other.sent, other.new_counter, other.longest = 2, 3, 9
    other.hist[4] += 5
    fold(into, other)
    fold(into, other)
    assert (into.sent, into.new_counter, into.longest, into.hist[4]) == (4, 6, 9, 10)


def test_a_field_that_is_not_a_counter_must_be_declared() -> None:
    class Figures:
        __slots__ = ("log", "sent")

        def __init__(self) -> None:
            self.sent = 0
            self.log: list[int] = []

    with pytest.raises(TypeError, match=r"Figures\.log is not an int counter"):
        Fold(Figures)
    with pytest.raises(TypeError, match="has no field 'lgo'"):
        Fold(Figures, left=("lgo",))
    with pytest.raises(TypeError, match="declared to fold twice"):
        Fold(Figures, left=("log", "log"))
    assert Fold(Figures, left=("log",)).summed == ("sent",)


def _future() -> futures.FutureRecord:
    return futures.FutureRecord("f", "f()", "f.py", 1, False, "decorator")


def _channel() -> channels.ChannelRecord:
    return channels.ChannelRecord("c", "asyncio.Queue", 10, False, None, channels._no_size)


def _stream() -> streams.StreamRecord:
    return streams.StreamRecord("s", "s()", "s.py", 1, False)


def _executor() -> executors.ExecutorRecord:
    return executors.ExecutorRecord("e", "thread")


def _resource() -> resources.ResourceRecord:
    return resources.ResourceRecord("r", "asyncio.Lock", resources.LOCK, "r.py", 1, None)


_KINDS: list[tuple[str, Callable[[], Any], GoneHistory[Any], Fold]] = [
    ("futures", _future, futures._history, futures._FOLD),
    ("channels", _channel, channels._history, channels._FOLD),
    ("streams", _stream, streams._history, streams._FOLD),
    ("executors", _executor, executors._history, executors._FOLD),
    ("resources", _resource, resources._history, resources._FOLD),
]


@pytest.mark.parametrize(
    ("make", "history", "fold"), [k[1:] for k in _KINDS], ids=[k[0] for k in _KINDS]
)
def test_every_counter_of_a_gone_record_reaches_its_aggregate(
    make: Callable[[], Any], history: GoneHistory[Any], fold: Fold
) -> None:
    record = make()
    s = record.stats
    for i, name in enumerate(fold.summed, 1):
        setattr(s, name, i)
    for i, name in enumerate(fold.maximum, 1):
        setattr(s, name, 1000 + i)
    keys = {}
    for name in fold.histogram:
        histogram = getattr(s, name)
        keys[name] = key = next(iter(histogram), 3)  # streams' instances: a fixed set of keys
        histogram[key] += 7
    aggregate = history.aggregate(record, "gone")
    assert type(aggregate.stats) is type(s)  # the same hot path's figures
    try:
        history.merge(aggregate, record)
        history.merge(aggregate, record)
    finally:
        futures._gone_ids.pop(record.id, None)
    a = aggregate.stats
    assert {n: getattr(a, n) for n in fold.summed} == {
        n: 2 * i for i, n in enumerate(fold.summed, 1)
    }
    assert {n: getattr(a, n) for n in fold.maximum} == {
        n: 1000 + i for i, n in enumerate(fold.maximum, 1)
    }
    assert {n: getattr(a, n)[keys[n]] for n in fold.histogram} == dict.fromkeys(fold.histogram, 14)
