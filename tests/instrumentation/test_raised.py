"""The tasks that raised, as never-retrieved judges them: bounded, each task once, those
retrieved forgotten before any unjudged one is, and the drops counted per profile."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

import asyncflow
from asyncflow.instrumentation import _raised, _session


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no task remembered and no drop counted."""
    monkeypatch.setattr(_raised, "_raised", {})
    monkeypatch.setattr(_raised, "_dropped", [0, None])


async def _fail() -> None:
    raise ValueError("bad row")


async def _raised_tasks(n: int) -> list[asyncio.Task[Any]]:
    tasks = [asyncio.create_task(_fail()) for _ in range(n)]
    await asyncio.wait(tasks)  # done, their exceptions not read
    return tasks


def _note(tasks: list[asyncio.Task[Any]], first: int = 0) -> None:
    for n, task in enumerate(tasks, first):
        _raised.note(task, 1, n, "ValueError", "bad row", n)


async def test_retrieved_tasks_make_room_before_any_is_dropped() -> None:
    """Far more tasks than the bound raise, and each is awaited soon after: none was lost
    unjudged, so none is counted dropped."""
    count = _raised.MAX_RAISED + 500
    for start in range(0, count, 100):
        tasks = await _raised_tasks(100)
        _note(tasks, start)
        await asyncio.gather(*tasks, return_exceptions=True)  # retrieved
    assert _raised.dropped() == 0
    assert _raised.unretrieved() == []


async def test_unretrieved_tasks_past_the_bound_are_dropped_and_counted() -> None:
    tasks = await _raised_tasks(_raised.MAX_RAISED + 200)
    try:
        _note(tasks)
        assert _raised.dropped() == 200
        kept = _raised.unretrieved()
        assert len(kept) == _raised.MAX_RAISED
        assert kept[0].call_id == 200  # the oldest went first
    finally:
        for task in tasks:
            task.exception()  # asyncio would log each as never retrieved


async def test_a_task_is_remembered_once_whatever_its_calls_raised() -> None:
    (task,) = await _raised_tasks(1)
    try:
        for call_id in range(5):  # inner calls raise first, then the outer ones
            _raised.note(task, call_id, call_id, f"E{call_id}", "", call_id)
        (entry,) = _raised.unretrieved()
        assert (entry.future_id, entry.exc_type) == (4, "E4")  # the outermost: the last
    finally:
        task.exception()


async def test_the_drops_are_those_of_this_profile() -> None:
    with asyncflow.profile("first", format="none") as prof:
        tasks = await _raised_tasks(_raised.MAX_RAISED + 3)
        _note(tasks)
        assert prof.snapshot().status.unretrieved_dropped == 3
    for task in tasks:
        task.exception()
    with asyncflow.profile("second", format="none") as prof:
        assert _session.active is not None
        assert prof.snapshot().status.unretrieved_dropped == 0


@asyncflow.future
async def load_row(row: str) -> float:
    await asyncio.sleep(0)
    return float(row)


async def _refresh(row: str) -> None:
    """Not tracked: a plain coroutine, in a task asyncflow does not track, that awaits a
    tracked call."""
    await load_row(row)


async def test_an_untracked_task_is_remembered_by_the_tracked_call_that_raised_in_it() -> None:
    """Under ``@asyncflow.future`` alone, a task asyncflow does not track is remembered when a
    tracked call raises in it: judged as any task, by its own flag, once it is done."""
    with asyncflow.profile("untracked", format="none"):
        failed = asyncio.create_task(_refresh("12,5"))
        caught = asyncio.create_task(_refresh_catching("12,5"))
        await asyncio.wait([failed, caught])
        (entry,) = _raised.unretrieved()
        assert entry.task() is failed and entry.exc_type == "ValueError"
        assert "12,5" in entry.exc_message
        failed.exception()  # retrieved now: settled
        assert _raised.unretrieved() == []


async def _refresh_catching(row: str) -> None:
    with contextlib.suppress(ValueError):  # handled: its task ends well
        await load_row(row)


async def test_whole_program_mode_remembers_any_task_whose_coroutine_raised() -> None:
    with asyncflow.profile("whole", format="none"):
        tracked = asyncflow.instrument_tasks()
        try:
            task = asyncio.create_task(_fail())
        finally:
            tracked.undo()
        await asyncio.wait([task])
        (entry,) = _raised.unretrieved()
        assert entry.task() is task and entry.exc_type == "ValueError"
        task.exception()
