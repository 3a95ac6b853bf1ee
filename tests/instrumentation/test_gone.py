"""The shared history of gone records (asyncflow/instrumentation/_gone.py), on its own."""

from __future__ import annotations

import gc
import threading

import pytest

from asyncflow.instrumentation._gone import GoneHistory


class _Record:
    def __init__(self, rid: int) -> None:
        self.id, self.label, self.folded = rid, f"r{rid}", 0
        self.watch: object = None  # the record keeps its weak reference, as the real ones do
        self.fresh = False

    @property
    def alive(self) -> bool:
        return callable(self.watch) and self.watch() is not None


class _Owner:
    pass


def _history(registry: dict[int, _Record], retire: object = None) -> GoneHistory[_Record]:
    return GoneHistory(
        threading.Lock(),
        registry,
        other="(other)",
        kind=lambda r: "",
        aggregate=lambda r, label: _Record(0),
        merge=lambda agg, r: None,
        retire=retire,  # type: ignore[arg-type]
    )


def _watched(history: GoneHistory[_Record], n: int) -> list[_Owner]:
    owners = [_Owner() for _ in range(n)]
    for i, owner in enumerate(owners, 1):
        record = _Record(i)
        record.watch = history.watch(record, owner)
        history.register(record)
    return owners


def test_a_reap_that_fails_midway_leaves_the_rest_for_the_next() -> None:
    registry: dict[int, _Record] = {}
    retired: list[int] = []

    def retire(record: _Record) -> None:
        retired.append(record.id)
        if len(retired) == 1:
            raise RuntimeError("retire failed once")

    history = _history(registry, retire)
    owners = _watched(history, 3)
    del owners
    gc.collect()
    with pytest.raises(RuntimeError, match="failed once"):
        history.reap(collecting=True)
    assert history.reap(collecting=True) == 2  # the two the failure stopped short of
    assert registry == {} and sorted(r.id for r in history.gone) == [1, 2, 3]


def test_a_drain_that_fails_leaves_every_record_for_the_next_reap() -> None:
    registry: dict[int, _Record] = {}
    history = _history(registry)
    owners = _watched(history, 2)
    del owners
    gc.collect()

    def drain() -> None:
        raise RuntimeError("drain failed")

    with pytest.raises(RuntimeError, match="drain failed"):
        history.reap(collecting=True, drain=drain)
    assert len(registry) == 2 and not history.gone
    assert history.reap(collecting=True) == 2 and registry == {}


def test_forget_drops_the_dead_and_gives_the_living_fresh_figures() -> None:
    registry: dict[int, _Record] = {}
    history = _history(registry)
    owners = _watched(history, 3)
    del owners[1]  # its record is dead but not reaped yet
    gc.collect()
    history.forget(lambda r: setattr(r, "fresh", True))
    assert sorted(registry) == [1, 3]
    assert all(r.fresh for r in registry.values())
    assert not history.dying and not history.gone and not history.aggregates
