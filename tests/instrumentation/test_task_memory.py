"""What a live tracked task costs in memory beside a plain one (issue 28: at most 400 B), and the
call record's fields that few calls set, kept apart on the compiled path, which behave as the
Python record's slots."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from asyncflow.instrumentation import futures
from asyncflow.instrumentation.futures import call_field
from tests.support.compiled_path import compiled

#: tasks parked per measure (the per-future dict of live calls about as full as on average)
TASKS = 10_000
#: issue 28's budget for the compiled path, which ``asyncflow run`` uses wherever it is built
BUDGET = 400
#: the pure-Python reference's own bound: its figures are Python ints and a slotted object
PURE_PYTHON_BOUND = 600


#: the memory benchmark's measure (``--live-tasks``), run in a fresh process per measure: what
#: one measure leaves (asyncio's tables of tasks grown, free lists filled) would flatter the next
_BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "memory.py"


def _heap_per_task(kind: str) -> float:
    """The Python heap each of TASKS live tasks, parked on an event, adds (tracemalloc: exact)
    in a fresh process, ``plain`` or ``tracked`` (a profiler, ``instrument_tasks()``). Each
    task's name is read in both, as asyncflow reads it at a tracked task's first poll: 3.12
    made a task's default name lazy, and that string is the task's own."""
    done = subprocess.run(
        [sys.executable, str(_BENCHMARK), "--live-child", kind, str(TASKS)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return float(json.loads(done.stdout.splitlines()[-1]))


def test_a_live_tracked_task_costs_at_most_the_budget_more_than_a_plain_one() -> None:
    # (the least of two: what the profiler's thread holds at the moment of a measure, a
    # document being built, is no task's, and now and then it is holding one)
    plain, tracked = _heap_per_task("plain"), min(_heap_per_task("tracked") for _ in range(2))
    bound = BUDGET if futures.accelerated else PURE_PYTHON_BOUND
    assert tracked - plain <= bound, (plain, tracked, tracked - plain)


@compiled
def test_the_fields_few_calls_set_behave_as_slots_on_the_compiled_record() -> None:
    """The compiled record keeps them apart, made at the first one set: unset, each raises
    AttributeError (read with call_field: None), and set, deleted and collected as a slot."""
    future = futures.FutureRecord("memory", "m:memory", "m.py", 1, False, "instrument")
    r: Any = futures.CallRecord(future, future.stats, 0)
    rare = (
        "exc_type",
        "exc_message",
        "result",
        "cancel_requests",
        "cancel_to_end",
        "cancel_outcome",
        "probe_data",
    )
    for name in rare:
        assert call_field(r, name) is None
        with pytest.raises(AttributeError):
            getattr(r, name)
        with pytest.raises(AttributeError):
            delattr(r, name)
    r.exc_type, r.cancel_requests = "ValueError", 2
    assert (r.exc_type, r.cancel_requests, call_field(r, "result")) == ("ValueError", 2, None)
    del r.exc_type
    assert call_field(r, "exc_type") is None and r.cancel_requests == 2
    # a cycle through a rarely set field is found by the cyclic GC
    held: list[Any] = [r]
    r.probe_data = held
    gc.collect()
    assert r.probe_data is held
    del held
    # hist is the stats' poll histogram, as on the Python record, and only that
    assert r.hist is future.stats.poll_hist
    r.hist = future.stats.poll_hist
    with pytest.raises(ValueError):
        r.hist = {}
    future.stats.live.clear()
