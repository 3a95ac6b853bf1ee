"""A future's exception types counted over the whole run, not only over its log of recent
calls: by name on the raising path (no cost to a call that returns), bounded, and kept when
a gone future is folded into its label's aggregate."""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from typing import Any

import pytest

import asyncflow
from asyncflow.instrumentation import _raised, futures
from asyncflow.instrumentation.futures import FutureRecord
from asyncflow.schema import FutureEntry, Snapshot


def _entry(snapshot: Snapshot, label: str) -> FutureEntry:
    (entry,) = [f for f in snapshot.futures.futures if f.label == label]
    return entry


@asyncflow.future
async def flaky_lookup(i: int) -> int:
    if i % 4 == 0:
        raise TimeoutError("upstream slow")
    if i % 4 == 1:
        raise KeyError(i)
    return i


async def test_every_exception_type_is_counted_past_the_log_of_recent_calls() -> None:
    with asyncflow.profile("types", format="none", recent_logs=10) as prof:
        for i in range(200):
            with contextlib.suppress(TimeoutError, KeyError):
                await flaky_lookup(i)
        snap = prof.snapshot()
    entry = _entry(snap, "flaky_lookup")
    assert entry.outcomes.raised == 100
    assert entry.errors == {"TimeoutError": 50, "KeyError": 50}
    (logs,) = [log for log in snap.future_logs if log.future_id == entry.id]
    assert len(logs.calls) == 10  # the log still keeps the recent calls only


#: exception classes of their own, more than a future keeps names of
_KINDS = [type(f"Failure{n}", (Exception,), {}) for n in range(_raised.ERROR_TYPES_KEPT + 4)]


@asyncflow.future
async def many_failures(n: int) -> None:
    raise _KINDS[n]()


async def test_types_past_the_bound_are_counted_together() -> None:
    with asyncflow.profile("bound", format="none") as prof:
        for n in range(len(_KINDS)):
            for _ in range(2):
                with pytest.raises(_KINDS[n]):
                    await many_failures(n)
        snap = prof.snapshot()
    errors = _entry(snap, "many_failures").errors
    kept = _raised.ERROR_TYPES_KEPT
    assert len(errors) == kept + 1
    assert errors == {**{f"Failure{n}": 2 for n in range(kept)}, _raised.OTHER_TYPES: 8}


def _kinds() -> list[Any]:
    kinds: list[Any] = [futures.FutureStatsPy]
    if futures._speedups is not None:
        kinds.append(futures._speedups.FutureStats)
    return kinds


@pytest.mark.parametrize("agg_kind", _kinds(), ids=lambda k: k.__module__.rsplit(".", 1)[-1])
@pytest.mark.parametrize("kind", _kinds(), ids=lambda k: k.__module__.rsplit(".", 1)[-1])
def test_a_gone_futures_types_are_kept_by_its_aggregate(
    monkeypatch: pytest.MonkeyPatch, agg_kind: Any, kind: Any
) -> None:
    monkeypatch.setattr(futures._history, "aggregates", {})
    monkeypatch.setattr(futures, "_gone_ids", OrderedDict())
    monkeypatch.setattr(futures, "_new_stats", agg_kind)
    gone = []
    for seed, names in ((1, ["OSError", "ValueError"]), (2, ["ValueError", "KeyError"])):
        record = FutureRecord("g", "m:g", "m.py", 3, False, "decorator")
        record.stats = kind()
        for name in names:
            _raised.count_type(record.stats.error_types, name, seed)
        gone.append(record)
    with futures._registry_lock:
        for record in gone:
            futures._history._fold(record)
    (agg,) = futures._history.aggregates.values()
    assert agg.stats.error_types == {"OSError": 1, "ValueError": 3, "KeyError": 2}
