"""Armed mode: a process that ``asyncflow attach PID`` can profile later, and that costs
nothing until then.

Arming (``asyncflow run --armed``, :func:`arm`) installs what must be there from the start and
records nothing: the control channel's listener (a thread blocked on a Unix socket only this
user can reach, :mod:`asyncflow.serve.control`), a note of each event loop the program makes
(a wrapper of the loop classes' ``__init__``: once per loop, never per task), and a registry
file, so that ``asyncflow ps`` lists the process as armed.

``attach`` starts a profiler from the control thread and installs whole-program mode as
``asyncflow run`` does (every new task, queue, memory stream, primitive and executor job), then
asks each running loop to adopt itself on its own thread (``loop.call_soon_threadsafe``): its
task factory is chained from then on, and the loop is watched. Tasks that existed before the
attach are listed by ``/tasks`` with their await chain and what they wait on (read from the
tasks themselves), but their coroutines cannot be wrapped any more: they are no calls of a
future, and their polls are not counted. ``detach`` takes it all back, stops the profiler and
answers with its report; the process is armed again. ``dump`` reads every task and the
wait-for graph they make, attached or not. A program that ends attached writes its report as
``asyncflow run`` would.

The processes an armed process starts are armed too, named ``<name>/<role>`` as
:mod:`asyncflow._children` names ``asyncflow run``'s: a multiprocessing child (its
``BaseProcess.start`` wrapped once multiprocessing is imported) runs a :class:`_Child` that arms
a fresh interpreter at once, and a forked one (a multiprocessing fork, gunicorn's workers) is
armed when it makes its first event loop.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import dataclasses
import functools
import itertools
import logging
import os
import pickle
import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from asyncflow import _children, config, schema
from asyncflow.errors import AsyncflowError
from asyncflow.instrumentation import _imports, _session, loops
from asyncflow.profiler import Profiler, _ProfilerLoop, active_profiler, profile
from asyncflow.serve import control, registry

if TYPE_CHECKING:
    from asyncflow.render.dump import DumpDocument, HeldBy
    from asyncflow.serve.registry import Registration

__all__ = ["Parts", "arm", "armed", "disarm"]

logger = logging.getLogger("asyncflow")

#: how long attach waits for the running loops to adopt themselves (a blocked loop does later)
ADOPT_TIMEOUT = 1.0


@dataclass(frozen=True, slots=True)
class Parts:
    """What an attach installs besides tracking every loop's tasks (``asyncflow run``'s
    ``--no-*`` flags turn them off)."""

    executors: bool = True
    queues: bool = True
    memory_streams: bool = True
    locks: bool = True
    never_awaited: bool = True
    #: the program (its script, or None; the ``-m`` module, or None), whose own code imported
    #: after an attach is tracked (unless the ``no_own_code`` option); None: ``__main__``'s
    program: tuple[str | None, str | None] | None = None


class _Capture:
    """The attached profiler's reporter: it keeps the final snapshot for ``detach`` to
    answer with, and writes nothing into the program's output."""

    def __init__(self) -> None:
        self.snapshot: schema.Snapshot | None = None

    def report(self, snapshot: Any, /) -> None:
        self.snapshot = snapshot


class _Armed:
    """This process's armed state: its name, the options an attach starts the profiler with,
    the loops it knows, its listener, and the profiler while attached."""

    def __init__(
        self,
        name: str,
        options: dict[str, Any],
        parts: Parts,
        child_of: tuple[int, str] | None = None,
    ) -> None:
        self.name = name
        self.options = options
        self.parts = parts
        self.pid = os.getpid()
        #: a child of an armed process: its parent's pid and its role (``process-1``, ``fork-2``)
        self.child_of = child_of
        #: numbers the roles of the processes it starts
        self.numbers = itertools.count(1)
        #: the event loops the program made (weakly: a loop let go is gone from here)
        self.loops: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()
        self.listener = control.Listener(
            {
                "status": self.status,
                "attach": self.attach,
                "detach": self.detach,
                "dump": self.dump,
            }
        )
        self.registration: Registration | None = None
        #: one command at a time (the listener answers one by one; arm's caller may disarm)
        self.lock = threading.Lock()
        self.profiler: Profiler | None = None
        self.capture = _Capture()
        self._undo_parts: list[Callable[[], None]] = []
        self._undo_hooks: list[Callable[[], None]] = []

    # -- arming -------------------------------------------------------------------------------

    def start(self, hooks: list[Callable[[], None]] | None = None) -> None:
        """Hook the loops (or take ``hooks``, a forked parent's, in place already), listen
        and register."""
        self._undo_hooks = _hook_loops() if hooks is None else hooks
        running = asyncio._get_running_loop()
        if running is not None:  # arm() inside the program's loop: that one is known now
            self.loops.add(running)
        try:
            self.listener.start()
        except BaseException:
            self._unhook()
            raise
        self._register()

    def _register(self) -> None:
        self.registration = registry.register(self.name, "", False, self.child_of, armed=True)

    def _unhook(self) -> None:
        while self._undo_hooks:
            self._undo_hooks.pop()()

    def stop(self) -> None:
        """Disarm: stop listening, detach if attached, take the hooks back."""
        # First the listener (outside the lock, which a request under way may wait for: it is
        # answered, then the thread ends), so that no request comes in while it all goes.
        self.listener.stop()
        with self.lock:
            if self.profiler is not None:
                self._detach(ending=True)
            registration, self.registration = self.registration, None
            if registration is not None:
                registration.remove()
            self._unhook()

    def child(self, role: str) -> _Child:
        """The child process with ``role``: armed as this one is, under its own name, its
        files (report, recording, trace) beside this one's, never on this one's port."""
        # (a reporter object does not cross into another process)
        options = {key: value for key, value in self.options.items() if _plain(value)}
        resolved = config.resolve_options(self.name, options)
        if resolved.output not in (None, "-"):
            options["output"] = _children._beside(resolved.output, role)
        if resolved.record is not None:
            options["record"] = _children._beside(resolved.record, role)
        if resolved.trace:
            trace = resolved.trace_output
            options["trace"] = True if trace is None else _children._beside(trace, role)
        options["port"] = "off" if resolved.port is None else 0
        return _Child(f"{self.name}/{role}", role, self.pid, options, self.parts)

    def forsake(self) -> None:
        """In a forked child: the parent's socket and registry file stay the parent's."""
        self.listener.forsake()
        self.registration = None

    # -- attach and detach --------------------------------------------------------------------

    def _live_loops(self) -> list[asyncio.AbstractEventLoop]:
        found = {id(loop): loop for loop in list(self.loops)}
        for record in loops.loop_registry():
            loop = record.loop()
            if loop is not None:
                found.setdefault(id(loop), loop)
        # (a profiler's own loop is asyncflow's, never the program's)
        return [
            loop
            for loop in found.values()
            if not loop.is_closed() and not isinstance(loop, _ProfilerLoop)
        ]

    def status(self, request: dict[str, Any]) -> dict[str, Any]:
        prof = self.profiler
        attached = prof is not None and prof.running
        return {
            "name": self.name,
            "state": "attached" if attached else "armed",
            "url": prof.url if attached and prof is not None else None,
        }

    def attach(self, request: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            prof = self.profiler
            if prof is not None and prof.running:
                return {"name": prof.name, "url": prof.url, "already": True, "tasks": 0}
            if prof is not None:  # it stopped on its own (duration=): take its hooks back
                self._detach()
            own = active_profiler()
            if own is not None:
                raise AsyncflowError(
                    f"it runs a profiler of its own ({own.name!r}, endpoint "
                    f"{own.url or 'not served'}): read that one"
                )
            options = dict(self.options)
            port = request.get("port")
            if port is not None:
                options["port"] = port
            self.capture = _Capture()
            try:
                prof = profile(self.name, **{**options, "reporter": self.capture})
            except (ValueError, TypeError) as exc:
                raise AsyncflowError(str(exc)) from None
            from asyncflow.serve.server import is_loopback

            if not is_loopback(prof.options.host):  # (ASYNCFLOW_HOST changed since arm())
                raise AsyncflowError(
                    f"host {prof.options.host!r}: an attach serves its endpoint on this "
                    "machine only (127.0.0.1)"
                )
            prof.hosting = True  # the program's own asyncflow.start() joins it
            prof.child_of = self.child_of  # a child's: listed under its parent, reports aside
            prof.start()
            self.profiler = prof
            try:
                self._install()
                adopted, blocked, tasks = self._adopt()
                collector = prof._collector
                if collector is not None:  # the report says its figures start at the attach
                    collector.session.adopted = tasks
            except BaseException:
                self._detach()
                raise
            return {
                "name": prof.name,
                "url": prof.url,
                "already": False,
                "loops": adopted,
                "blocked": blocked,
                "tasks": tasks,
            }

    def _install(self) -> None:
        """Whole-program mode, as ``asyncflow run`` installs it. Own-code tracking is compiled
        into the modules as they are imported: it covers those imported from now on (a module
        imported already keeps its code). Never-awaited counting takes the place of Python's
        warning, whenever the coroutine was made."""
        from asyncflow.instrumentation import coroutines
        from asyncflow.instrumentation.every_loop import track_every_loop
        from asyncflow.instrumentation.memory import instrument_memory_streams
        from asyncflow.instrumentation.own_code import track_own_code
        from asyncflow.instrumentation.queues import instrument_queues
        from asyncflow.instrumentation.resources import instrument_locks

        parts = self.parts
        prof = self.profiler
        assert prof is not None
        tracking = track_every_loop(executors=parts.executors, by_route=not prof.options.no_routes)
        self._undo_parts = [tracking.undo]
        if parts.queues:
            self._undo_parts.append(instrument_queues().undo)
        if parts.memory_streams:
            self._undo_parts.append(instrument_memory_streams().undo)
        if parts.locks:
            self._undo_parts.append(instrument_locks().undo)
        if parts.never_awaited:
            coroutines.reset_for_session()  # counted from the attach on
            self._undo_parts.append(coroutines.track_never_awaited().undo)
        if not prof.options.no_own_code:
            script, module = parts.program or _main_program()
            self._undo_parts.append(track_own_code(script, module).undo)

    def _adopt(self) -> tuple[int, int, int]:
        """Each running loop adopts itself on its own thread; a loop that does not answer in
        :data:`ADOPT_TIMEOUT` (blocked) is listed from outside, and adopts itself when it next
        runs a callback. Returns (loops adopted, loops blocked, their tasks)."""
        from asyncflow.instrumentation.every_loop import adopt_running_loop

        waiting: list[tuple[asyncio.AbstractEventLoop, threading.Event]] = []
        for loop in self._live_loops():
            if not loop.is_running():
                adopt_running_loop(loop)  # its task factory now; watched when it runs
                continue
            done = threading.Event()
            try:
                loop.call_soon_threadsafe(_adopt_on_loop, loop, done)
            except RuntimeError:  # closed meanwhile
                continue
            waiting.append((loop, done))
        deadline = _now() + ADOPT_TIMEOUT
        adopted = blocked = tasks = 0
        for loop, done in waiting:
            if done.wait(max(0.0, deadline - _now())):
                adopted += 1
            else:
                blocked += 1
                loops.see(loop, on_its_thread=False)  # its tasks listed from outside
            tasks += len(_all_tasks(loop))
        return adopted, blocked, tasks

    def detach(self, request: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            if self.profiler is None:
                raise AsyncflowError("it is armed, not attached: there is nothing to detach")
            return {"report": self._detach()}

    def _detach(self, ending: bool = False) -> str:
        """Undo the attach; the report (in the options' format), or "" if none. ``ending``:
        the program ends attached, and the report is written where the options say, as
        ``asyncflow run`` writes it (a file, or standard error for the table), not returned."""
        prof, self.profiler = self.profiler, None
        while self._undo_parts:
            try:
                self._undo_parts.pop()()
            except Exception as exc:  # the program goes on, whatever happens here
                _session.internal_error("detaching", exc)
        if prof is None:
            return ""
        prof.stop()  # (at the interpreter's exit its own atexit hook may have stopped it)
        final = self.capture.snapshot
        if ending:
            if final is not None:
                # the program's own reporter if arm() was given one, else the file or stream
                reporter = self.options.get("reporter")
                prof.options = dataclasses.replace(prof.options, reporter=reporter)
                prof._report(final)
            return ""
        self._register()  # the profiler's file is gone with it: listed as armed again
        options = prof.options
        if final is None or options.format == "none":
            return ""
        from asyncflow.render.report import render

        return render(final, options.format, options.percentiles, options.limit)

    # -- dump ---------------------------------------------------------------------------------

    def dump(self, request: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            return {"dump": self._dump()}

    def _dump(self) -> DumpDocument:
        from asyncflow.render.dump import DumpDocument
        from asyncflow.views import wait_views
        from asyncflow.views.graph import graph_document

        prof = self.profiler
        if prof is not None and prof.running:
            reading, graph = prof._waits()
            state, url = "attached", prof.url
        else:
            records = [loops.see(loop, on_its_thread=False) for loop in self._live_loops()]
            reading = wait_views.read_tasks(_always, records)
            graph = graph_document(reading.task_entries(), [], [], reading.consistent)
            state, url = "armed", None
        entries = _where_running(reading.task_entries(), self._live_loops())
        tasks = schema.TasksDocument(
            schema=schema.SCHEMA,
            total=reading.total,
            consistent=reading.consistent,
            tasks=entries,
            waits=reading.waits,
            walked=len(entries),
        )
        held_by = self._held_by()
        return DumpDocument(schema.SCHEMA, self.pid, self.name, state, url, tasks, graph, held_by)

    def _held_by(self) -> list[HeldBy]:
        """Who holds the plain locks, semaphores and conditions, loop by loop (on each loop's
        thread when it answers in time; from outside when it is blocked)."""
        from asyncflow.model.waits import holders
        from asyncflow.render.dump import HeldBy

        found: list[HeldBy] = []
        for loop in self._live_loops():
            tasks = list(_all_tasks(loop))
            held = _on_loop(loop, functools.partial(holders, tasks))
            for target, by in held.items():
                found += [HeldBy(target, name, where) for name, where in by]
        return found


def _where_running(
    entries: list[schema.TaskEntry], live: list[asyncio.AbstractEventLoop]
) -> list[schema.TaskEntry]:
    """``entries`` with each loop's running task at the line its thread runs now: a loop
    blocked in a plain function a coroutine called (``time.sleep``) has the task's await chain
    end at the line that called it, a frame or more above the one that blocks."""
    from asyncflow.model.waits import _frame_entry, _is_library

    now: dict[tuple[int, str], schema.AwaitFrame] = {}
    stacks = list(sys._current_frames().values())
    for loop in live:
        task = asyncio.current_task(loop)
        coro: Any = task.get_coro() if task is not None else None
        coro = getattr(coro, "_coro", coro)  # an instrumented coroutine: the program's own
        outer: Any = getattr(coro, "cr_frame", None)
        if task is None or outer is None:
            continue
        for innermost in stacks:
            # the thread whose stack holds the task's coroutine (the loop may have moved on)
            frame: Any = innermost
            mine: Any = outer
            while frame is not None and frame is not outer:
                if mine is outer and not _is_library(frame.f_code):
                    mine = frame
                frame = frame.f_back
            if frame is outer:
                record = loops.see(loop, on_its_thread=False)
                now[record.id, task.get_name()] = _frame_entry(mine)
                break
    if not now:
        return entries
    return [
        dataclasses.replace(e, where=now.get((e.loop_id, e.name), e.where))
        if e.state == "running"
        else e
        for e in entries
    ]


def _plain(value: object) -> bool:
    """Whether an option's value is plain data (a spawned child gets it pickled)."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return True
    return isinstance(value, (tuple, list)) and all(_plain(each) for each in value)


def _main_program() -> tuple[str | None, str | None]:
    """The program ``arm()`` was called in: ``__main__``'s script, or its ``-m`` module."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    module = getattr(spec, "name", None)
    script = getattr(main, "__file__", None)
    return (
        script if isinstance(script, str) else None,
        module if isinstance(module, str) and module != "__main__" else None,
    )


def _always(record: Any) -> bool:
    return True


def _now() -> float:
    import time

    return time.monotonic()


def _all_tasks(loop: asyncio.AbstractEventLoop) -> set[asyncio.Task[Any]]:
    for _ in range(100):
        try:
            return asyncio.all_tasks(loop)
        except RuntimeError:  # the task set changed size under another thread
            continue
    return set()


#: how long a dump waits for a loop to read who holds what on its own thread
HELD_TIMEOUT = 0.25
_T = TypeVar("_T")


def _on_loop(loop: asyncio.AbstractEventLoop, read: Callable[[], _T]) -> _T:
    """``read()`` on the loop's thread when it runs and answers within :data:`HELD_TIMEOUT`;
    else here (a blocked or stopped loop changes nothing meanwhile, or little)."""
    if not loop.is_running():
        return read()
    done: concurrent.futures.Future[_T] = concurrent.futures.Future()

    def run() -> None:
        if done.set_running_or_notify_cancel():
            try:
                done.set_result(read())
            except BaseException as exc:
                done.set_exception(exc)

    try:
        loop.call_soon_threadsafe(run)
        return done.result(HELD_TIMEOUT)
    except (concurrent.futures.TimeoutError, RuntimeError):
        if done.cancel():  # it did not start: read it from here
            return read()
        return done.result(HELD_TIMEOUT)


def _adopt_on_loop(loop: asyncio.AbstractEventLoop, done: threading.Event) -> None:
    from asyncflow.instrumentation.every_loop import adopt_running_loop

    try:
        adopt_running_loop(loop)
    finally:
        done.set()


# -- the loops' hooks ---------------------------------------------------------------------------


def _note(loop: Any) -> None:
    armed = _armed
    if armed is None:
        if _forked is not None and not isinstance(loop, _ProfilerLoop):
            _arm_forked_child(loop)
        return
    if armed.pid == os.getpid() and not isinstance(loop, _ProfilerLoop):
        try:
            armed.loops.add(loop)
        except Exception as exc:  # observing never breaks the program
            _session.internal_error("noting an event loop", exc)


def _noting(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        _note(self)

    return __init__


def _patch_init(cls: type[Any]) -> Callable[[], None]:
    """Wrap ``cls.__init__`` to note each loop made; returns the undo (which leaves alone an
    ``__init__`` replaced since: whole-program mode wraps this one while attached)."""
    # (whole-program mode's own patching, which puts back only what is still its own)
    from asyncflow.instrumentation.every_loop import _patch

    return _patch(cls, "__init__", _noting(cls.__init__))


def _hook_loops() -> list[Callable[[], None]]:
    """Note every event loop made from now on: asyncio's, and uvloop's once imported; and
    arm the processes multiprocessing starts, once it is imported."""
    undo = [_patch_init(asyncio.BaseEventLoop)]
    late: list[Callable[[], None]] = []

    # (imported first in a forked child, before its first loop arms it: _forked is set then)
    def hook_uvloop(module: Any) -> None:
        if _armed is not None or _forked is not None:
            late.append(_patch_init(module.Loop))

    def hook_multiprocessing(module: Any) -> None:
        if _armed is not None or _forked is not None:
            late.append(_patch_start(module))

    undo.append(_imports.after_import("uvloop", hook_uvloop))
    undo.append(_imports.after_import("multiprocessing.process", hook_multiprocessing))

    def undo_late() -> None:
        while late:
            late.pop()()

    undo.append(undo_late)
    return undo


# -- the processes it starts -------------------------------------------------------------------

#: in the thread that starts a multiprocessing child: its role, which a fork of it is named by
_local = threading.local()
#: whether this process is a fork of an armed one (a spawned child starts afresh)
_inherited = False


@dataclass(frozen=True, slots=True)
class _Child:
    """A multiprocessing child's ``run``, for the length of its armed parent's ``start()``
    (pickled into a spawned child): its process is armed as the parent is, then runs the
    process's own ``run()`` (its target, or a subclass's)."""

    #: its name: the parent's, a slash and the role (``app/process-1``)
    name: str
    #: ``process-N`` (``pool-worker-N``, or the name the program gave it, numbered)
    role: str
    #: the parent's pid
    parent_pid: int
    #: arm()'s options in it (see :meth:`_Armed.child`)
    options: dict[str, Any]
    parts: Parts

    def __call__(self) -> None:
        import multiprocessing

        process = multiprocessing.current_process()
        run = functools.partial(type(process).run, process)
        if not _inherited:  # a fresh interpreter (spawn, forkserver): armed now
            try:
                _arm(self.name, self.options, self.parts, (self.parent_pid, self.role))
                # a SIGTERM (uvicorn's, re-raised once its server shut down) disarms it first
                _children._report_forked_on_sigterm(disarm)
            except Exception as exc:  # the work runs on, unarmed
                print(f"asyncflow: {self.name!r} runs unarmed: {exc}", file=sys.stderr, flush=True)
        # (a forked one is armed when it makes its first event loop, named by its role)
        try:
            run()
        finally:
            # multiprocessing ends the process with os._exit: no atexit hook runs. A SIGTERM
            # (a pool's terminate()) waits while an attached child writes its report.
            deferral = _children._SigtermDeferral()
            deferral.begin()
            try:
                disarm()
            finally:
                deferral.end()


def _patch_start(module: Any) -> Callable[[], None]:
    """Wrap multiprocessing's ``BaseProcess.start`` so that each process an armed process
    starts is armed too; returns what puts it back (unless replaced since)."""
    original: Callable[[Any], None] = module.BaseProcess.start

    @functools.wraps(original)
    def start(self: Any) -> None:
        armed = _armed
        if armed is None or armed.pid != os.getpid() or "run" in vars(self):
            return original(self)  # (a run of the program's own, per instance: left alone)
        try:
            child = armed.child(f"{_children._role_base(self)}-{next(armed.numbers)}")
            pickle.dumps(child)  # (a spawned child gets it pickled: never a start that fails)
            vars(self)["run"] = child
        except Exception as exc:  # the child runs unarmed; its start() is not ours to break
            _session.internal_error("arming a child process", exc)
            return original(self)
        _local.role = child.role  # forked (the fork method): named by it
        try:
            original(self)
        finally:
            _local.role = None
            # pickled or forked by now: the program's object is as it was
            if vars(self).get("run") is child:
                del vars(self)["run"]

    module.BaseProcess.start = start

    def restore() -> None:
        if module.BaseProcess.start is start:
            module.BaseProcess.start = original

    return restore


def _before_fork() -> None:
    """Name the child about to be forked by an armed process: ``fork-N``, or the role of the
    multiprocessing child being started."""
    _local.forking = None
    armed = _armed
    if armed is None or armed.pid != os.getpid():
        return
    try:
        _local.forking = getattr(_local, "role", None) or f"fork-{next(armed.numbers)}"
    except Exception as exc:  # the fork goes on
        _session.internal_error("naming a forked process", exc)


# -- the front door -----------------------------------------------------------------------------

_lock = threading.Lock()
_armed: _Armed | None = None


def _default_name() -> str:
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None) or (sys.argv[0] if sys.argv else "")
    return Path(path).stem or "python"


def arm(name: str | None = None, *, _parts: Parts | None = None, **options: Any) -> None:
    """Arm this process: ``asyncflow attach PID`` can then profile it, and ``asyncflow dump
    PID`` list its tasks, without a restart. Until then nothing is recorded: a thread waits
    on a Unix socket that only this user can reach, and each event loop made is noted.

    Arming again does nothing (the first arm's name and options stay), and so does arming a
    process a profiler runs in already (``asyncflow run``, the program's own ``profile()``).
    With ``ASYNCFLOW_DISABLE=1`` nothing is armed (said on the ``asyncflow`` logger).

    Args:
        name: the profile's name [the script's name].
        **options: :func:`asyncflow.profile`'s options, for the profiler an attach starts;
            checked now. The endpoint serves on this machine only.

    Raises:
        ValueError: an option has a bad value, or ``host`` is not a loopback address.
        TypeError: an unknown option was passed.
        AsyncflowError: the control socket cannot be made (the runtime directory is not this
            user's alone, or its path is too long).
    """
    _arm(name, options, _parts or Parts(), None)


def _arm(
    name: str | None, options: dict[str, Any], parts: Parts, child_of: tuple[int, str] | None
) -> None:
    """:func:`arm`; ``child_of``: a child of an armed process, its parent's pid and its role."""
    global _armed
    with _lock:
        if _armed is not None and _armed.pid == os.getpid():
            return
        if config.disabled():
            logger.info("asyncflow is disabled (ASYNCFLOW_DISABLE=1): not armed")
            return
        running = active_profiler()
        if running is not None and running.running:
            # profiled already (asyncflow run, or its own profiler): its endpoint says more
            # than an attach could, and its registry file must stay its own
            logger.info("asyncflow: %r is profiled already: not armed", running.name)
            return
        name = name if name is not None else _default_name()
        resolved = config.resolve_options(name, options)  # refuses a bad option now
        from asyncflow.serve.server import is_loopback

        if not is_loopback(resolved.host):
            raise ValueError(
                f"host={resolved.host!r}: an armed process serves its endpoint on this machine "
                "only (127.0.0.1)"
            )
        armed = _Armed(name, dict(options), parts, child_of)
        _armed = armed
        try:
            armed.start()
        except BaseException:
            _armed = None
            raise
        atexit.register(disarm)


def armed() -> bool:
    """Whether this process is armed."""
    return _armed is not None and _armed.pid == os.getpid()


def disarm() -> None:
    """Stop listening (detaching first if attached) and take the hooks back; idempotent."""
    global _armed
    with _lock:
        armed, _armed = _armed, None
    if armed is None or armed.pid != os.getpid():
        return
    atexit.unregister(disarm)
    armed.stop()


#: in a forked child of an armed process, until its first event loop: the parent's arming,
#: whose hooks the child inherited (see :func:`_after_fork_in_child`), and its role there
_forked: _Armed | None = None
_forked_role: str | None = None


def _after_fork_in_child() -> None:
    """A forked child leaves its parent's socket and registry file alone, and is armed anew,
    under its own pid, when it makes its first event loop (gunicorn's workers): a child that
    only runs another program (``fork()`` then ``exec()``) costs nothing, and leaves nothing.
    One forked while its parent was attached is not armed (whole-program mode's hooks, which
    it inherited, record nothing there, and an attach could not install them again)."""
    global _armed, _forked, _forked_role, _inherited
    armed, _armed = _armed, None
    _forked = None
    _forked_role, _local.forking = getattr(_local, "forking", None), None
    if armed is not None:
        _inherited = True
        try:
            armed.forsake()
            if armed.profiler is None:  # forked while attached: its hooks are the profiler's
                _forked = armed
        except Exception as exc:  # the child must go on, whatever happens here
            _session.internal_error("disarming a forked child", exc)


def _arm_forked_child(loop: Any) -> None:
    """A forked child makes its first event loop: it is armed as its parent was."""
    global _armed, _forked
    with _lock:
        parent, _forked = _forked, None
        if parent is None or _armed is not None:
            return
        role = _forked_role or "fork"
        named = parent.child(role)
        child = _Armed(named.name, named.options, parent.parts, (parent.pid, role))
        child.loops.add(loop)
        _armed = child
        try:
            child.start(hooks=parent._undo_hooks)
        except Exception as exc:  # the child runs on, not armed
            _armed = None
            _session.internal_error("arming a forked child", exc)
            return
    atexit.register(disarm)
    _children._report_forked_on_sigterm(disarm)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
