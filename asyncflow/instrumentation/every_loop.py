"""Whole-program mode's loops: every event loop the program makes or runs tracks its tasks.

A loop is caught where it is born: asyncio's in ``BaseEventLoop.__init__`` (``asyncio.run``,
``Runner``, ``new_event_loop``, any policy), uvloop's in ``uvloop.Loop.__init__``
(``uvloop.run``, ``uvloop.new_event_loop``, a ``loop_factory``, uvloop's policy), hooked once
the program imports uvloop: asyncflow never imports it itself. A loop of any other class is
caught when it starts running, in ``asyncio.events._set_running_loop``, which asyncio's loops
call and uvloop too (uvloop reads it when it is imported, so it calls this hook when the
program imports uvloop after the hooks are in place, as under ``asyncflow run``). Tasks made
on such a loop before it ran cannot be tracked afterwards: a task's coroutine is fixed. Starting
to run is also where a loop whose task factory the program replaced since gets asyncflow's
again, chained to the program's.

A loop that cannot be instrumented (its ``set_task_factory`` refuses) runs on untouched but
for the loop monitor's heartbeat, and is named, with the reason, in :func:`not_profiled`. On
trio (``trio.run``, ``start_guest_run``, anyio's trio backend), each task is tracked through
trio's public Instrument API (``task_spawned``), and each ``trio.run`` is watched as an event
loop (a :class:`TrioRun`, from the run's ``before_run`` to its ``after_run``). A guest run
runs on its host loop's thread, and is watched through that loop when it is asyncio's or
uvloop's; on another host it is named in :func:`not_profiled`.
"""

from __future__ import annotations

import asyncio
import functools
import os
import sys
import threading
import time
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from asyncflow.instrumentation import _imports, _session, futures, loops, routes
from asyncflow.instrumentation.executors import (
    anyio_trio_patches,
    instrument_executors,
    trio_patches,
)
from asyncflow.instrumentation.futures import instrument_tasks

__all__ = [
    "LoopTracking",
    "NotProfiled",
    "TrioRun",
    "adopt_running_loop",
    "not_profiled",
    "track_every_loop",
    "watch_trio_here",
]

#: the most blind spots kept; past it, only the ones already named are counted
MAX_NOT_PROFILED = 32


@dataclass(slots=True)
class NotProfiled:
    """Something the program runs that asyncflow cannot profile: one per kind, name and reason."""

    #: ``loop`` (an event loop whose tasks are not tracked) or ``trio`` (a trio guest run
    #: whose host loop is not watched)
    kind: str
    #: the loop's class (``module.qualname``), or the trio entry point (``trio.start_guest_run``)
    name: str
    reason: str
    #: how many times it was met (loops of that class, calls of the trio entry point)
    count: int = 1


_lock = threading.Lock()
_blind: dict[tuple[str, str, str], NotProfiled] = {}
#: (instrumenter, what failing to apply it means)... while every loop is tracked; () when not
_instrumenters: tuple[tuple[Callable[..., Any], str], ...] = ()
#: the handles of what was instrumented per loop, undone with the tracking (weak: a loop the
#: program let go is not kept alive by asyncflow; the handles hold their loop weakly)
_handles: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()
#: loops that refused once: not asked again at each start
_refused: weakref.WeakSet[Any] = weakref.WeakSet()


def not_profiled() -> list[NotProfiled]:
    """What the program ran that asyncflow could not profile, first met first (copies)."""
    with _lock:
        return [NotProfiled(b.kind, b.name, b.reason, b.count) for b in _blind.values()]


def note_not_profiled(kind: str, name: str, reason: str) -> None:
    """Name something asyncflow cannot profile (bounded: see :data:`MAX_NOT_PROFILED`)."""
    key = (kind, name, reason)
    with _lock:
        known = _blind.get(key)
        if known is not None:
            known.count += 1
        elif len(_blind) < MAX_NOT_PROFILED:
            _blind[key] = NotProfiled(kind, name, reason)


def reset_for_session() -> None:
    """A new profiler starts with nothing named, and no web application started."""
    with _lock:
        _blind.clear()
    routes.forget_serving()


def _label(obj: object) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _instrument(loop: Any) -> None:
    """Give ``loop`` what whole-program mode tracks (idempotent; never raises)."""
    instrumenters = _instrumenters
    if not instrumenters:
        return
    try:
        if not isinstance(loop, asyncio.AbstractEventLoop):
            note_not_profiled("loop", _label(loop), "it is not an asyncio event loop")
            return
        running = loop is asyncio._get_running_loop()
        if loop in _refused:
            if running:  # its thread is known now: the monitor watches it from here
                loops.see(loop)
            return
        for instrument, what in instrumenters:
            try:
                handle = instrument(loop=loop)
            except Exception as exc:  # the loop refuses: it runs on as it would
                _refused.add(loop)
                reason = f"{what}: {type(exc).__name__}: {exc}"
                note_not_profiled("loop", _label(loop), reason)
                # its health and blocks are still watched: the heartbeat needs nothing else
                loops.see(loop, on_its_thread=running)
                return
            if handle.active:
                with _lock:
                    _handles.setdefault(loop, []).append(handle)
        if running:  # watched from its start, whether or not a task of it is tracked
            loops.see(loop)
    except Exception as exc:  # observing never breaks the program
        _session.internal_error("tracking an event loop", exc)


def adopt_running_loop(loop: Any) -> None:
    """Track ``loop``, running already, as if whole-program mode had seen it start: its new
    tasks and executor jobs from now on (``asyncflow attach``). Call it on the loop's own
    thread (``loop.call_soon_threadsafe``); idempotent, and a no-op while every loop is not
    tracked. Never raises."""
    _instrument(loop)


def _hooked_init(original: Callable[..., None]) -> Callable[..., None]:
    """``original`` (a loop class's ``__init__``), then the new loop instrumented."""

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        _instrument(self)

    return __init__


_real_set_running_loop: Callable[[Any], None] = asyncio.events._set_running_loop


def _set_running_loop(loop: Any) -> None:
    """asyncio's ``_set_running_loop``, then a loop that starts running is instrumented.

    uvloop keeps a reference to the function it found when it was imported: this one stays
    cheap and correct after the tracking ends (it only passes the call on).
    """
    _real_set_running_loop(loop)
    if not _instrumenters:
        return
    if not isinstance(loop, asyncio.BaseEventLoop):  # None (it stops), or a compiled loop
        # The Python frame under uvloop's run_forever: while it is the thread's innermost,
        # the loop waits in compiled code (the loop monitor reads it).
        loops.entered_compiled_loop(
            threading.get_ident(), None if loop is None else sys._getframe(1)
        )
    if loop is not None:
        _instrument(loop)


class LoopTracking:
    """Handle returned by :func:`track_every_loop`; ``undo()`` takes every hook back."""

    __slots__ = ("_undo",)

    def __init__(self, undo: list[Callable[[], None]]) -> None:
        self._undo = undo

    @property
    def active(self) -> bool:
        """Whether new loops are tracked through this handle."""
        return bool(self._undo)

    def undo(self) -> None:
        """Leave new loops alone, and put back the task factory and ``run_in_executor`` of
        the loops instrumented; tasks tracked already stay tracked. Idempotent."""
        global _instrumenters
        steps, self._undo = self._undo, []
        if not steps:
            return
        _instrumenters = ()
        for step in reversed(steps):
            try:
                step()
            except Exception as exc:  # observing never breaks the program
                _session.internal_error("untracking event loops", exc)
        with _lock:
            handles = [h for hs in _handles.values() for h in hs]
            _handles.clear()
        for handle in handles:
            try:
                handle.undo()
            except Exception as exc:
                _session.internal_error("untracking an event loop", exc)


def track_every_loop(*, executors: bool = True, by_route: bool = True) -> LoopTracking:
    """Track the tasks (and, with ``executors``, the executor jobs) of every event loop the
    program makes or runs from now on: ``asyncflow run``'s whole-program mode.

    Args:
        executors: also time the jobs each loop hands to its executors.
        by_route: a request routed by Starlette, FastAPI or aiohttp is a call of its route's
            future (:mod:`asyncflow.instrumentation.routes`).

    Returns:
        A handle whose ``undo()`` restores every hook.

    Raises:
        RuntimeError: every loop is tracked already (through a handle not undone).
    """
    global _instrumenters
    if _instrumenters:
        raise RuntimeError("asyncflow tracks every event loop already")
    chosen: list[tuple[Callable[..., Any], str]] = [
        (instrument_tasks, "its task factory cannot be set")
    ]
    if executors:
        chosen.append((instrument_executors, "its run_in_executor cannot be wrapped"))
    _instrumenters = tuple(chosen)
    routes.forget_serving()
    steps = [
        _undo_late,
        _patch(asyncio.BaseEventLoop, "__init__", _hooked_init(asyncio.BaseEventLoop.__init__)),
        _patch_set_running_loop(),
        _imports.after_import("uvloop", _hook_uvloop),
        _imports.after_import("trio", _hook_trio),
    ]
    if executors:  # trio's worker threads, and anyio's on trio: no loop to hook them on
        steps.append(_imports.after_import("trio", _patching(trio_patches)))
        steps.append(_imports.after_import("anyio._backends._trio", _patching(anyio_trio_patches)))
    if by_route:
        steps.append(
            _imports.after_import("starlette.routing", _patching(routes.starlette_patches))
        )
        steps.append(_imports.after_import("fastapi.routing", _patching(routes.fastapi_patches)))
        steps.append(_imports.after_import("aiohttp.web_app", _patching(routes.aiohttp_patches)))
    return LoopTracking(steps)


def _patch(owner: Any, name: str, value: Any) -> Callable[[], None]:
    """Set ``owner.name`` to ``value``; returns what puts back the attribute it had there
    (or removes it, where it was inherited), unless something else replaced ours since."""
    had = name in vars(owner)
    before = vars(owner).get(name)
    setattr(owner, name, value)

    def restore() -> None:
        if vars(owner).get(name) is not value:
            return
        if had:
            setattr(owner, name, before)
        else:
            delattr(owner, name)

    return restore


def _patch_set_running_loop() -> Callable[[], None]:
    events = asyncio.events
    if events._set_running_loop is not _real_set_running_loop:
        # Something else wrapped it since asyncflow was imported: wrap nothing (loops are
        # still caught where they are born).
        return _nothing
    undo = [_patch(module, "_set_running_loop", _set_running_loop) for module in (events, asyncio)]

    def restore() -> None:
        for step in undo:
            step()

    return restore


def _nothing() -> None:
    pass


def _hook_uvloop(module: ModuleType) -> None:
    """uvloop is imported: its ``Loop`` (a Python subclass of the compiled loop, which every
    uvloop entry point makes) instruments each loop it makes."""
    if not _instrumenters:
        return
    cls = module.Loop
    undo = _patch(cls, "__init__", _hooked_init(cls.__init__))
    _late_undo.append(undo)


def _patching(patches: Callable[[ModuleType], list[routes.Patch]]) -> Callable[[ModuleType], None]:
    """The hook that makes ``patches(module)`` once the module is imported, undone with the
    tracking."""

    def hook(module: ModuleType) -> None:
        if _instrumenters:
            for owner, name, value in patches(module):
                _late_undo.append(_patch(owner, name, value))

    return hook


def _hook_trio(module: ModuleType) -> None:
    """trio is imported: each run tracks its tasks through trio's Instrument API, and each
    ``trio.run`` is watched as an event loop is (see :class:`TrioRun`)."""
    if not _instrumenters:
        return
    lowlevel = getattr(module, "lowlevel", None)
    instrument = _trio_instrument(module)
    for owner, name in ((module, "run"), (lowlevel, "start_guest_run")):
        original = getattr(owner, name, None)
        if original is None:
            continue
        wrapped = _tracking_trio(original, f"trio.{name}", instrument)
        _late_undo.append(_patch(owner, name, wrapped))


_TRIO_GUEST_REASON = (
    "trio runs as a guest of a loop asyncflow does not watch (not asyncio's or uvloop's): its "
    "tasks are tracked, but there is no loop health and no blocked-loop detection on it"
)


def _tracking_trio(original: Callable[..., Any], name: str, instrument: Any) -> Callable[..., Any]:
    """``trio.run`` (or ``start_guest_run``), with an instrument of asyncflow's added to the
    run's. A ``trio.run`` is watched as an event loop (its own :class:`TrioRun`); a guest run
    runs on its host's thread, whose loop is watched when it is asyncio's or uvloop's."""

    @functools.wraps(original)
    def run(*args: Any, **kwargs: Any) -> Any:
        if not _instrumenters or instrument is None:
            return original(*args, **kwargs)
        guest = name != "trio.run"
        if guest and asyncio._get_running_loop() is None:
            note_not_profiled("trio", name, _TRIO_GUEST_REASON)
        watched = None if guest else TrioRun(name)
        kwargs["instruments"] = (*kwargs.get("instruments", ()), instrument(watched))
        try:
            return original(*args, **kwargs)
        finally:
            if watched is not None:
                watched.finished()

    return run


def _guarded(callback: Callable[..., object], args: tuple[Any, ...]) -> None:
    """Run asyncflow's ``callback`` on trio's loop: trio crashes its run on a callback that
    raises, so an error of asyncflow's stays asyncflow's."""
    try:
        callback(*args)
    except Exception as exc:  # observing never breaks the program
        _session.internal_error("a callback of asyncflow's on trio's loop", exc)


class TrioRun:
    """One ``trio.run``, as the loop monitor sees an event loop: running from trio's
    ``before_run`` to its ``after_run``, on the thread that called ``trio.run``; callbacks
    (the monitor's heartbeat) reach it through the run's ``TrioToken.run_sync_soon``, which is
    thread-safe as ``call_soon_threadsafe`` is. Registered with :func:`loops.see` as a loop;
    the instrument of its run holds it, so that it is gone (closed) once the run is."""

    __slots__ = (
        "__weakref__",
        "_asyncflow_label",
        "_closed",
        "_running",
        "_tasks",
        "_thread_id",
        "_token",
        "wait_codes",
    )

    def __init__(self, label: str) -> None:
        #: the loop's label in ``/loop`` (a loop record reads it instead of the class's name)
        self._asyncflow_label = label
        self._running = self._closed = False
        #: the thread running it, while it runs (as ``BaseEventLoop._thread_id``)
        self._thread_id: int | None = None
        self._token: Any = None
        #: the run's task set (trio's own system tasks among them), read for its size only
        self._tasks: Any = ()
        #: the code of trio's wait for I/O: innermost on the thread, the loop is idle
        self.wait_codes: frozenset[types.CodeType] = frozenset()

    def started(self, trio: ModuleType) -> None:
        """The run begins (trio's ``before_run``, on the run's thread)."""
        self._token = trio.lowlevel.current_trio_token()
        self._thread_id = threading.get_ident()
        try:  # trio's private run state: its tasks, and its I/O manager's wait
            runner = sys.modules["trio._core._run"].GLOBAL_RUN_CONTEXT.runner
            self._tasks = runner.tasks
            self.wait_codes = frozenset({type(runner.io_manager).get_events.__code__})
        except Exception:  # another trio: no tasks counted, and its idle wait not told
            pass
        self._running = True
        _trio_runs.add(self)
        loops.see(self)  # type: ignore[arg-type]  # watched from its very start

    def finished(self) -> None:
        """The run is over (trio's ``after_run``, or ``trio.run`` returned or raised)."""
        self._running, self._closed = False, True
        self._thread_id = self._token = None
        self._tasks = ()

    def is_running(self) -> bool:
        return self._running

    def is_closed(self) -> bool:
        return self._closed

    def call_soon_threadsafe(self, callback: Callable[..., object], *args: Any) -> None:
        """Run ``callback(*args)`` soon on trio's loop; its errors are asyncflow's own.

        Raises:
            RuntimeError: the run is over (trio's ``RunFinishedError`` is one).
        """
        token = self._token
        if token is None:
            raise RuntimeError("the trio run is over")
        try:
            token.run_sync_soon(_guarded, callback, args)
        except RuntimeError:  # RunFinishedError: it ended between the check and the call
            self._running = False
            raise

    def time(self) -> float:
        return time.monotonic()

    def tasks_alive(self) -> int:
        """Its tasks now, trio's own system tasks among them (read from any thread)."""
        return len(self._tasks)

    def task_name(self, top: types.FrameType | None) -> str | None:
        """The name of the trio task whose step runs in the stack from ``top`` out (the run's
        thread's, read from another thread while the run is blocked): the task whose coroutine
        has a frame there. trio keeps its current task where only its own thread can read it,
        so the tasks are searched, once per blocked-loop episode; None when none is found."""
        frames = set()
        frame = top
        while frame is not None:
            frames.add(id(frame))
            frame = frame.f_back
        if not frames:
            return None
        try:
            for task in list(self._tasks):  # (a copy: the run may change it meanwhile)
                coro = task.coro
                if id(getattr(coro, "cr_frame", None)) in frames:
                    return str(task.name)
        except Exception:  # another trio's tasks: unnamed
            return None
        return None


def _trio_instrument(trio: ModuleType) -> Callable[[TrioRun | None], Any] | None:
    """What makes, per run, a trio Instrument that tracks each task spawned as a task on an
    asyncio loop is (its coroutine is wrapped before its first step, under its coroutine
    function's future; trio's own tasks, its system tasks and the wrappers of its compiled
    coroutines, are left alone), and that starts and ends the run's watch, if it has one."""
    try:
        base = trio.abc.Instrument
        trio_dir = os.path.dirname(str(trio.__file__)) + os.sep
    except Exception as exc:  # an unknown trio: only named as not profiled
        _session.internal_error("adapting trio", exc)
        return None

    class _TrioTasks(base):  # type: ignore[misc, valid-type]
        def task_spawned(self, task: Any) -> None:
            if _session.active is None or not _instrumenters:
                return
            try:
                coro = task.coro
                if type(coro) is not types.CoroutineType:
                    return  # tracked already (a decorated function), or not a coroutine
                if coro.cr_code.co_filename.startswith(trio_dir):
                    return
                record = futures._task_record(coro)
                if record is not None:
                    task.coro = futures.InstrumentedCoroutine(coro, record)
            except Exception as exc:  # observing never breaks the program
                _session.internal_error("tracking a trio task", exc)

    class _TrioWatch(_TrioTasks):
        """... and the run watched (trio calls only the hooks an instrument defines)."""

        def __init__(self, watched: TrioRun) -> None:
            self.watched = watched

        def before_run(self) -> None:
            if _session.active is None or not _instrumenters:
                return
            try:
                self.watched.started(trio)
            except Exception as exc:  # observing never breaks the program
                _session.internal_error("watching trio's loop", exc)

        def after_run(self) -> None:
            self.watched.finished()

    def instrument(watched: TrioRun | None) -> Any:
        return _TrioTasks() if watched is None else _TrioWatch(watched)

    return instrument


#: the trio runs watched (while their instruments hold them): the one a profiler starts in
_trio_runs: weakref.WeakSet[TrioRun] = weakref.WeakSet()


def watch_trio_here() -> None:
    """A profiler starts: when it starts inside a ``trio.run`` (on the run's thread, in one of
    its tasks), that run is watched from now on as one ``asyncflow run`` wraps is from its
    ``before_run``. Its instrument is added to the run (``trio.lowlevel.add_instrument``, which
    only the run's own thread may call): a run under way on another thread cannot be reached,
    and is named in :func:`not_profiled`. A guest run is left to its host loop's watch, or
    named, as one begun under ``asyncflow run`` is. Never raises."""
    trio = sys.modules.get("trio")
    if trio is None:
        return  # the program never imported trio: no run of it is running
    _name_trio_runs_elsewhere()
    try:
        token = trio.lowlevel.current_trio_token()
    except Exception:  # RuntimeError: not inside a trio run
        return
    try:
        for run in list(_trio_runs):
            if run._token is token and run.is_running():
                loops.see(run)  # type: ignore[arg-type]  # watched already (asyncflow run's)
                return
        runner = getattr(sys.modules.get("trio._core._run"), "GLOBAL_RUN_CONTEXT", None)
        if getattr(getattr(runner, "runner", None), "is_guest", False):
            if asyncio._get_running_loop() is None:
                note_not_profiled("trio", "trio.lowlevel.start_guest_run", _TRIO_GUEST_REASON)
            return
        make = _trio_instrument(trio)
        if make is None:
            return
        watched = TrioRun("trio.run")
        instrument = make(watched)
        watched.started(trio)
        trio.lowlevel.add_instrument(instrument)  # its after_run closes the watch
    except Exception as exc:  # observing never breaks the program
        _session.internal_error("watching a trio run begun before the profiler", exc)


_TRIO_ELSEWHERE_REASON = (
    "a trio run began before the profiler, on another thread: trio lets only the run's own "
    "thread add an instrument, so its loop is not watched (no loop health and no blocked-loop "
    "detection on it); start the profiler inside the run, or under asyncflow run"
)


def _name_trio_runs_elsewhere() -> None:
    """Name each trio run under way on another thread that no watch of asyncflow's covers:
    a thread whose stack holds ``trio.run`` (its run loop, ``unrolled_run``, is on the stack
    only while a task steps: ``run`` itself waits for I/O)."""
    try:
        module = sys.modules["trio._core._run"]
        codes = {module.run.__code__, module.unrolled_run.__code__}
        watched = {run._thread_id for run in list(_trio_runs) if run.is_running()}
        here = threading.get_ident()
        for thread, top in sys._current_frames().items():
            frame: types.FrameType | None = top
            while frame is not None and frame.f_code not in codes:
                frame = frame.f_back
            if frame is not None and thread != here and thread not in watched:
                note_not_profiled("trio", "trio.run", _TRIO_ELSEWHERE_REASON)
            del top, frame  # hold no other thread's frame
    except Exception as exc:  # another trio: nothing said
        _session.internal_error("looking for trio runs on other threads", exc)


#: undoes of the hooks made after an import, taken back with the tracking
_late_undo: list[Callable[[], None]] = []


def _undo_late() -> None:
    while _late_undo:
        _late_undo.pop()()
