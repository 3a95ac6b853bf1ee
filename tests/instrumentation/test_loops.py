"""Whole-program mode finds every event loop: asyncio's, uvloop's, those made by runners and
policies, and, as a safety net, any loop when it starts running; a loop it cannot instrument
is named with the reason (issue 26)."""

from __future__ import annotations

import asyncio
import gc
import warnings
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import uvloop

import asyncflow
from asyncflow.instrumentation.every_loop import track_every_loop
from asyncflow.render.report import render_table
from asyncflow.schema import Snapshot
from tests.support.http import get

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # uvloop's policy, 3.12+


async def _child(i: int) -> int:
    await asyncio.sleep(0)
    return i * 2


async def _main() -> list[int]:
    return list(await asyncio.gather(*(_child(i) for i in range(3))))


@pytest.fixture
def tracked() -> Iterator[asyncflow.Profiler]:
    """A profiler, and every loop made or run from now on tracked as ``asyncflow run`` does."""
    with asyncflow.profile("loops", format="none") as prof:
        tracking = track_every_loop()
        try:
            yield prof
        finally:
            tracking.undo()


def _calls(snapshot: Snapshot) -> dict[str, int]:
    """Calls by function, of the futures called (those of earlier tests stay known)."""
    return {
        f.label.rsplit(".", 1)[-1]: f.call_count for f in snapshot.futures.futures if f.call_count
    }


def _loop_labels(snapshot: Snapshot) -> list[str]:
    assert snapshot.loop is not None
    return [entry.label for entry in snapshot.loop.loops]


def test_uvloop_run_tracks_its_tasks(tracked: asyncflow.Profiler) -> None:
    assert uvloop.run(_main()) == [0, 2, 4]
    snapshot = tracked.snapshot()
    # uvloop.run's main task runs its wrapper(), which awaits _main()
    assert _calls(snapshot) == {"wrapper": 1, "_child": 3}
    assert "uvloop.Loop" in _loop_labels(snapshot)


def test_uvloop_new_event_loop_tracks_its_tasks(tracked: asyncflow.Profiler) -> None:
    loop = uvloop.new_event_loop()
    try:
        assert loop.run_until_complete(_main()) == [0, 2, 4]
    finally:
        loop.close()
    assert _calls(tracked.snapshot()) == {"_main": 1, "_child": 3}


def test_runner_with_a_uvloop_factory(tracked: asyncflow.Profiler) -> None:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert runner.run(_main()) == [0, 2, 4]
        assert type(runner.get_loop()) is uvloop.Loop
    assert _calls(tracked.snapshot()) == {"_main": 1, "_child": 3}


def test_a_policy_that_makes_uvloop_loops(tracked: asyncflow.Profiler) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        previous = asyncio.get_event_loop_policy()
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    try:
        assert asyncio.run(_main()) == [0, 2, 4]
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            asyncio.set_event_loop_policy(previous)
    assert _calls(tracked.snapshot()) == {"_main": 1, "_child": 3}


def test_a_subclass_of_uvloop_loop(tracked: asyncflow.Profiler) -> None:
    class MyLoop(uvloop.Loop):
        pass

    loop = MyLoop()
    try:
        assert loop.run_until_complete(_main()) == [0, 2, 4]
    finally:
        loop.close()
    assert _calls(tracked.snapshot()) == {"_main": 1, "_child": 3}


def test_a_loop_made_before_is_tracked_once_it_runs() -> None:
    """The safety net: a loop asyncflow did not see made is instrumented when it starts
    running; the task made before that (run_until_complete's) cannot be, those it makes are."""
    loop = asyncio.new_event_loop()
    try:
        with asyncflow.profile("loops", format="none") as prof:
            tracking = track_every_loop(executors=False)
            try:
                assert loop.run_until_complete(_main()) == [0, 2, 4]
            finally:
                tracking.undo()
            snapshot = prof.snapshot()
    finally:
        loop.close()
    assert _calls(snapshot) == {"_child": 3}
    assert loop.get_task_factory() is None  # undone with the profiler


class _Refusing(asyncio.SelectorEventLoop):
    """A loop that takes no task factory (as some embedded or foreign loops do)."""

    def set_task_factory(self, factory: Any) -> None:
        raise NotImplementedError("this loop makes its own tasks")


def test_a_loop_that_cannot_be_instrumented_is_named(tracked: asyncflow.Profiler) -> None:
    loop = _Refusing()
    try:
        assert loop.run_until_complete(_main()) == [0, 2, 4]  # the program runs as it would
    finally:
        loop.close()
    snapshot = tracked.snapshot()
    assert _calls(snapshot) == {}
    assert f"{__name__}._Refusing" in _loop_labels(snapshot)  # its health is still watched
    (entry,) = snapshot.status.not_profiled
    assert entry.kind == "loop"
    assert entry.name == f"{__name__}._Refusing"
    assert entry.reason == (
        "its task factory cannot be set: NotImplementedError: this loop makes its own tasks"
    )
    assert tracked.url is not None
    status, body, _ = get(tracked.url, "/profiler_status")
    assert status == 200
    assert body["not_profiled"] == [
        {"kind": "loop", "name": entry.name, "reason": entry.reason, "count": 1}
    ]
    table = render_table(snapshot, (0.5,), 15)
    assert (
        f"not profiled: event loop {__name__}._Refusing: its task factory cannot be set: "
        "NotImplementedError: this loop makes its own tasks" in table
    )
    assert "no task under" not in table


def test_undo_leaves_new_loops_alone() -> None:
    with asyncflow.profile("loops", format="none") as prof:
        tracking = track_every_loop()
        tracking.undo()
        tracking.undo()  # idempotent
        assert uvloop.run(_main()) == [0, 2, 4]
        assert asyncio.run(_main()) == [0, 2, 4]
        assert _calls(prof.snapshot()) == {}
    assert "__init__" not in vars(uvloop.Loop)
    assert asyncio.events._set_running_loop.__module__ in ("_asyncio", "asyncio.events")


def test_a_task_factory_set_after_the_loop_is_made_is_chained_when_it_runs(
    tracked: asyncflow.Profiler,
) -> None:
    """The program's own factory replaces asyncflow's; once the loop runs, asyncflow's is put
    back in front of it: the task made before (run_until_complete's) is not tracked, the
    tasks made while it runs are, and the program's factory still makes every task."""
    made: list[str] = []

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        made.append(getattr(coro, "__qualname__", type(coro).__name__))
        return asyncio.Task(coro, loop=loop, **kwargs)

    loop = asyncio.new_event_loop()
    try:
        loop.set_task_factory(factory)
        assert loop.run_until_complete(_main()) == [0, 2, 4]
    finally:
        loop.close()
    assert made == ["_main", "_child", "_child", "_child"]
    assert _calls(tracked.snapshot()) == {"_child": 3}


def test_a_loop_with_no_task_tracked_is_watched_and_the_report_says_so() -> None:
    """A loop whose tasks are all left out (--include) is still watched from its start, and
    a report with no futures names the loops asyncflow watched."""
    gc.collect()  # closed loops of earlier tests stay listed until they are collected
    with asyncflow.profile("loops", format="none", include="no_such_module") as prof:
        tracking = track_every_loop()
        try:
            assert asyncio.run(_main()) == [0, 2, 4]
        finally:
            tracking.undo()
        snapshot = prof.snapshot()
    assert _calls(snapshot) == {}
    assert _loop_labels(snapshot) == ["asyncio.unix_events._UnixSelectorEventLoop"]
    # (futures known from earlier tests, never called here, are left out of the table)
    alone = replace(snapshot, futures=replace(snapshot.futures, futures=[]))
    table = render_table(alone, (0.5,), 15)
    assert (
        "(no futures were tracked: asyncflow watched 1 event loop "
        "(asyncio.unix_events._UnixSelectorEventLoop), but no task it tracks ran there: no "
        "@asyncflow.future call, and no task of the program's own that --include/--exclude "
        "kept)" in table
    ), table
