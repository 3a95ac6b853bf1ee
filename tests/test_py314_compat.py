"""Python 3.14's asyncio, exercised on 3.11 to 3.13: the paths the task walk takes where 3.14
differs (it is not installed here). 3.14 keeps each thread's running task on the thread's
state: ``_asyncio`` has no ``_current_tasks``, and ``asyncio.tasks._current_tasks`` is a dict
that only pure-Python tasks write. The walk must then ask ``asyncio.current_task(loop)``."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from asyncflow.instrumentation import loops
from asyncflow.model import waits

BOUND = 5.0  # seconds any wait in these tests may take at most


def _as_on_3_14(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make asyncio look, to the walk, as 3.14 ships it."""
    accelerator = sys.modules.get("_asyncio")
    if accelerator is not None:  # (the C tasks keep their own reference: they still run)
        monkeypatch.delattr(accelerator, "_current_tasks", raising=False)
    if sys.version_info >= (3, 12):
        # 3.12+'s asyncio.current_task is C and reads its own state, not this name: a dict
        # nobody writes, as 3.14's. (3.11's current_task is Python and reads this very name.)
        monkeypatch.setattr(asyncio.tasks, "_current_tasks", {})


def test_where_asyncio_notes_the_running_task(monkeypatch: pytest.MonkeyPatch) -> None:
    live = asyncio.tasks._current_tasks  # type: ignore[attr-defined]
    if "_asyncio" in sys.modules and sys.version_info < (3, 14):
        assert waits.tasks_by_loop() is live  # the C tasks' own dict (3.11 to 3.13)
    elif "_asyncio" in sys.modules:
        assert waits.tasks_by_loop() is None  # per-thread state: ask asyncio.current_task
    _as_on_3_14(monkeypatch)
    assert waits.tasks_by_loop() is None
    # without the accelerator, asyncio's pure-Python tasks write the module's dict themselves
    monkeypatch.delitem(sys.modules, "_asyncio", raising=False)
    monkeypatch.setattr(asyncio.tasks, "_current_tasks", live)
    assert waits.tasks_by_loop() is live


class _BlockedLoop:
    """A loop on a thread of its own whose task ``blocker`` blocks it (a synchronous wait),
    beside a task ``idle`` that waits on an event."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.started = threading.Event()
        self.release = threading.Event()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="blocked-loop", daemon=True
        )
        self.tasks: list[asyncio.Task[Any]] = []
        self.gate: asyncio.Event | None = None

    def __enter__(self) -> _BlockedLoop:
        self.thread.start()
        # (not .result(): the blocker runs before the loop could hand that result over)
        asyncio.run_coroutine_threadsafe(self._start(), self.loop)
        assert self.started.wait(BOUND), "the blocking task never ran"
        return self

    async def _start(self) -> None:
        gate = self.gate = asyncio.Event()

        async def blocker() -> None:
            self.started.set()
            self.release.wait(BOUND)  # blocks the loop's thread until the test is done

        async def idle() -> None:
            await gate.wait()

        self.tasks = [
            asyncio.create_task(idle(), name="idle"),
            asyncio.create_task(blocker(), name="blocker"),
        ]

    async def _finish(self) -> None:
        assert self.gate is not None
        self.gate.set()
        await asyncio.gather(*self.tasks)

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        try:
            asyncio.run_coroutine_threadsafe(self._finish(), self.loop).result(BOUND)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(BOUND)
            self.loop.close()


@pytest.fixture
def blocked() -> Iterator[_BlockedLoop]:
    with _BlockedLoop() as it:
        yield it


@pytest.mark.parametrize("shape", ["installed", "as on 3.14"])
def test_a_blocked_loop_read_from_another_thread_names_its_running_task(
    blocked: _BlockedLoop, shape: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if shape != "installed":
        _as_on_3_14(monkeypatch)
    record = loops.see(blocked.loop, on_its_thread=False)
    walks, consistent = waits.walk_on_loop(record, BOUND, False)
    assert not consistent  # read from outside, and said so
    found = {w.entry.name: w.entry for w in walks}
    # every live task of the loop is listed though the loop's thread is stuck in one of them
    assert set(found) == {"idle", "blocker"}
    # 3.14's shape: the old walk read an empty dict and called the blocker merely "scheduled"
    assert found["blocker"].state == "running"
    assert found["blocker"].waits_on is None
    assert found["idle"].state == "waiting"
    assert found["idle"].waits_on is not None and found["idle"].waits_on.kind == "event"
