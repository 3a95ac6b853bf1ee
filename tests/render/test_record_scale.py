"""A recording of a program of many live tasks: its moments reuse the tasks and the wait-for
graph read lately, marked as older, and read them again within a budget (issue 28)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import asyncflow
from asyncflow.render.record import read_recording
from asyncflow.views import wait_views
from tests.support.recording import moments, profiled

TASKS = 3_000
MOMENTS = 10


@pytest.mark.slow  # 3,000 tasks read at each of eleven moments: seconds
def test_moments_of_many_tasks_reuse_the_tasks_read_lately(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each moment read every live task again and built their entries and the graph: with
    # 20,000 tasks 270-500 ms of the profiler's thread a moment, the GIL held meanwhile.
    readings = [0]
    real = wait_views.read_tasks

    def counted(*args: Any, **kwargs: Any) -> Any:
        readings[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(wait_views, "read_tasks", counted)
    during: list[int] = []

    async def program() -> None:
        go = asyncio.Event()
        with asyncflow.instrument_tasks():  # (whole-program mode: the loop is watched)
            crew = [asyncio.create_task(go.wait()) for _ in range(TASKS)]
        await moments(1)  # the first moment reads them
        before = readings[0]
        await moments(MOMENTS)
        during.append(readings[0] - before)
        go.set()
        await asyncio.gather(*crew)

    path = tmp_path / "many.rec"
    profiled(path, program, queues=False)
    (read,) = during
    assert read <= MOMENTS // 2, f"{read} readings of the tasks for {MOMENTS} moments"
    recording = read_recording(str(path))
    older = [f for f in recording.frames if "tasks" in f.stale]
    assert older, "no moment says its tasks are older than it"
    times = {f.t: f for f in recording.frames}
    for frame in older:  # each says when its tasks were read: a moment before, which has them
        read_at = frame.stale["tasks"]
        assert read_at < frame.t and frame.stale["graph"] == read_at
        assert frame.sections["tasks"] == times[read_at].sections["tasks"]
        assert frame.sections["graph"] == times[read_at].sections["graph"]
    assert max(f.sections["tasks"]["total"] for f in recording.frames) >= TASKS
