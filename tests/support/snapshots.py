"""Finding a future's entry and its calls' log in a snapshot, as the hot path's tests read them."""

from __future__ import annotations

from asyncflow.schema import CallEntry, FutureEntry, Snapshot


def future_entry(snap: Snapshot, label: str) -> FutureEntry:
    """The one future labelled ``label`` that has calls.

    Futures are process-wide: a decorated function of an earlier test that is still alive (not
    yet garbage collected) is listed too, with fresh stats. The test's own future has calls."""
    matches = [f for f in snap.futures.futures if f.label == label and f.call_count]
    assert len(matches) == 1, [f.label for f in snap.futures.futures]
    return matches[0]


def future_calls(snap: Snapshot, label: str) -> list[CallEntry]:
    """The calls' log of the future labelled ``label`` (see :func:`future_entry`)."""
    fid = future_entry(snap, label).id
    return next(log.calls for log in snap.future_logs if log.future_id == fid)
