"""What a reading of the live tasks costs the program: the objects it leaves for the garbage
collector to count while it walks them on their loop (issue 28)."""

from __future__ import annotations

import gc
from typing import Any

import pytest

from asyncflow.model import waits
from asyncflow.views import wait_views
from tests.support.parked import parked_loop

TASKS = 3_000


def test_what_the_slices_keep_of_each_walk_is_nothing_the_collector_tracks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What the walk's slices keep of each task, on the program's loop, counts towards the next
    # collection there while the reading lasts: two tuples a task made one every 350 tasks,
    # tens in a reading of 10,000, enough to set off the full collection of the program's heap
    # it was due (64-72 ms of its loop with 20,000 live tasks).
    held: list[Any] = []  # what each slice holds of each walk until the reading ends
    real = waits.read_on_loop

    def counted(*args: Any, **kwargs: Any) -> Any:
        keep = kwargs.pop("keep")

        def kept(walk: Any) -> Any:
            held.append(keep(walk))
            return held[-1]

        kwargs["keep"] = kept
        return real(*args, **kwargs)

    monkeypatch.setattr(wait_views, "read_on_loop", counted)
    with parked_loop(TASKS) as record:
        gc.disable()  # nothing is untracked by a collection meanwhile
        try:
            reading = wait_views.read_tasks(lambda _: True, [record])
            tracked = sum(map(gc.is_tracked, held))
        finally:
            gc.enable()
    assert len(held) >= TASKS and reading.consistent  # walked on its own loop, in slices
    assert len(reading.entries) == len(held)
    assert tracked == 0, f"{tracked} objects tracked for {len(held)} tasks walked"


def test_a_reading_walks_no_longer_than_its_time_allows(monkeypatch: pytest.MonkeyPatch) -> None:
    # The first /tasks of 100,000 live tasks took 0.65-1.13 s: ordering them and walking the
    # first 10,000 in slices. Past its time a reading stops walking and says how many it read.
    monkeypatch.setattr(wait_views, "READ_MOST_NS", 0, raising=False)
    # (the loop's own answer is what is read: on a loaded machine the parked loop may take more
    # than the default quarter second to answer, and the reading is then made from outside)
    monkeypatch.setattr(wait_views, "TASK_WALK_TIMEOUT", 10.0)
    with parked_loop(TASKS) as record:
        reading = wait_views.read_tasks(lambda _: True, [record])
    assert reading.total >= TASKS and reading.consistent
    assert 1 <= len(reading.entries) < TASKS // 10, len(reading.entries)
    names = [e.name for e in reading.task_entries()]
    assert names == sorted(names)  # the first in the list's order
