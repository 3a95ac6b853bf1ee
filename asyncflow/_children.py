"""Worker processes: under ``asyncflow run``, each process the program starts is profiled too.

How a child is found depends on how it starts:

- **multiprocessing** (spawn, fork, forkserver; uvicorn's ``--workers`` and ``--reload``):
  ``BaseProcess.start`` is wrapped. While ``start()`` runs, the process object's ``run`` is an
  instance attribute (:class:`_InChild`, picklable: it carries the child's names and the
  parent's ``asyncflow run`` arguments), so that what the child runs, the target or a
  subclass's ``run()``, runs profiled. It is gone again when ``start()`` returns; the target
  and its arguments are pickled as they are. In a fresh interpreter (spawn, forkserver) the
  child sets up what ``asyncflow run`` sets up; a forked one has those hooks already, and only
  starts a profiler of its own.
- **a bare fork** (gunicorn's workers, ``os.fork()``): the child is profiled from the first event
  loop it makes or runs, so that a child that only ``exec``\\ s another program costs nothing.
  Its report is written when it leaves through the interpreter's exit (``sys.exit``, the end of
  the program), not through ``os._exit``.

Each child's profile is named ``<parent's name>/<role>`` (``process-1``, ``fork-2``: numbered per
parent; a multiprocessing child the program named is called by its name), serves its own
endpoint on a free port where the parent serves one, is listed by ``asyncflow ps`` with its
parent's pid, and writes its report where the parent's options say: beside the parent's file
(``report.process-1.json`` beside ``report.json``), or on standard error under a line that names
it (standard output stays the parent's). Reports are not merged: a report keeps percentiles, not
histograms, and percentiles of several processes cannot be added up; the parent says where its
children's reports went when it stops.
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import functools
import itertools
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from asyncflow import config
from asyncflow.errors import say
from asyncflow.instrumentation import _session

if TYPE_CHECKING:
    from asyncflow.profiler import Profiler

__all__ = ["Child", "Following", "follow", "report_on_sigterm", "say"]

#: the most children a parent lists when it stops (the others are counted)
MAX_LISTED = 100

#: ``asyncflow run``'s body (``cli._profiled``): (arguments, name, target, run, argv) -> code
Setup = Callable[[argparse.Namespace, str, str, Callable[[], object], list[str] | None], int]

#: multiprocessing's own names for a process it numbered (``SpawnProcess-3``, ``Process-1:2``,
#: a pool's ``ForkPoolWorker-2``)
_NUMBERED = re.compile(r"(?:Spawn|Fork|ForkServer)?(Process|PoolWorker)-\d+(?::\d+)*")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True, slots=True)
class Child:
    """A process the profiled program started, as its profile is set up there (pickled into a
    spawned child)."""

    #: its profile's name: the parent's, a slash and the role (``app/process-1``)
    name: str
    #: ``process-N`` for a multiprocessing child (``pool-worker-N`` for a pool's, or the name
    #: the program gave it, numbered), ``fork-N`` for a bare fork: N counts the parent's children
    role: str
    #: the parent's pid
    parent_pid: int
    #: its report's file, beside the parent's; None: on standard error, under a heading
    output: str | None
    #: its trace's file, beside the parent's; None: no file
    trace_output: str | None
    #: the parent's ``asyncflow run`` arguments, with this child's name, output, port and trace
    args: dict[str, Any]
    #: what the parent runs (a script's path, a module's name), for a fresh interpreter's setup
    target: str
    #: ``asyncflow run``'s setup, by reference (pickled as its module and name)
    setup: Setup


def _beside(path: str, role: str) -> str:
    """``report.json`` -> ``report.<role>.json``, in the same directory."""
    where = Path(path)
    return str(where.with_name(f"{where.stem}.{role}{where.suffix}"))


def _role_base(process: Any) -> str:
    name = str(getattr(process, "name", "") or "")
    numbered = _NUMBERED.fullmatch(name)
    if numbered is not None:
        return "pool-worker" if numbered[1] == "PoolWorker" else "process"
    if not name:
        return "process"
    return _UNSAFE.sub("-", name).strip("-.")[:40] or "process"


class Following:
    """The children of one profiled process: numbered, named and listed at its end.

    :meth:`undo` (after the parent's report) stops following and says where the reports went.
    """

    def __init__(
        self, profiler: Profiler, args: argparse.Namespace, target: str, setup: Setup
    ) -> None:
        self.profiler = profiler
        self.pid = os.getpid()
        #: when it began, in seconds since the epoch: a fork's report file older than that is
        #: an earlier run's
        self.since = time.time()
        self.args = dict(vars(args))
        self.target = target
        self.setup = setup
        self.active = False
        #: whether a child's setup pickles (known at the first start)
        self.picklable: bool | None = None
        self._numbers = itertools.count(1)
        #: (child, pid) of the multiprocessing children started, at most MAX_LISTED
        self.started: list[tuple[Child, int | None]] = []
        #: the bare forks (pid unknown to the parent), at most MAX_LISTED
        self.forked: list[Child] = []
        #: children not listed (past MAX_LISTED)
        self.more = 0
        self._installed: Callable[[], None] | None = None

    def child(self, base: str) -> Child:
        """The next child's names and options (its role numbered ``base-N``)."""
        role = f"{base}-{next(self._numbers)}"
        options = self.profiler.options
        output = options.output if options.output not in (None, "-") else None
        output = None if output is None else _beside(output, role)
        trace_output = None if options.trace_output is None else _beside(options.trace_output, role)
        name = f"{self.profiler.name}/{role}"
        args = dict(self.args)
        args.update(
            name=name,
            output=output,
            port="off" if options.port is None else "0",  # never the parent's port
            child_of=(self.pid, role),
            # its own recording beside the parent's, which it must not overwrite
            record=None if options.record is None else _beside(options.record, role),
        )
        if options.trace:
            args["trace"] = trace_output or "on"
        return Child(name, role, self.pid, output, trace_output, args, self.target, self.setup)

    def _note(self, listed: list[Any], item: Any) -> None:
        if len(self.started) + len(self.forked) < MAX_LISTED:
            listed.append(item)
        else:
            self.more += 1

    def activate(self) -> None:
        global _following
        _following = self
        self.active = True
        self._installed = _patch_start()

    def undo(self) -> None:
        """Stop following (in the process that followed: a forked child unwinding through its
        parent's ``asyncflow run`` does nothing here), then say where the reports went."""
        global _following
        if not self.active or os.getpid() != self.pid:
            return
        self.active = False
        if _following is self:
            _following = None
        installed, self._installed = self._installed, None
        if installed is not None:
            installed()
        text = self.summary()
        if not text:
            return
        try:
            sys.stderr.write(text)
            sys.stderr.flush()
            options = self.profiler.options
            if options.format == "table" and options.output not in (None, "-"):
                with open(options.output, "a", encoding="utf-8") as out:
                    out.write("\n" + text)
        except Exception as exc:  # a list that cannot be written must not break the program
            _session.internal_error("listing the children's reports", exc)

    def summary(self) -> str:
        """Where the children's reports went, one line each; empty when there were none."""
        if self.profiler.options.format == "none":
            return ""  # no report, theirs neither
        lines: list[str] = []
        for child, pid in self.started:
            lines.append(f"  {child.name}  pid {pid}  {child.output or 'standard error'}")
        forks = 0
        for child in self.forked:
            if child.output is None:
                forks += 1
            elif _written_since(child.output, self.since):
                lines.append(f"  {child.name}  forked  {child.output}")
        if forks and not lines:
            # a fork is profiled from its first event loop: the parent cannot know which did
            lines.append("  forked processes: on standard error, each under its name")
        elif forks:
            lines.append(f"  {forks} forked processes: on standard error, each under its name")
        if self.more:
            lines.append(f"  and {self.more} more, not listed")
        if not lines:
            return ""
        return "asyncflow: the processes the program started were profiled on their own:\n" + (
            "\n".join(lines) + "\n"
        )


def _written_since(path: str, since: float) -> bool:
    try:
        return os.stat(path).st_mtime >= since - 1.0  # (file systems' clocks are coarse)
    except OSError:
        return False


def follow(
    profiler: Profiler,
    args: argparse.Namespace,
    target: str,
    setup: Setup,
) -> Following:
    """Profile the processes the program of ``asyncflow run`` starts from now on, unless the
    profiler is off (``ASYNCFLOW_DISABLE``) or asked not to (``no_children``).

    Args:
        profiler: the run's profiler, started.
        args: ``asyncflow run``'s arguments, given again to a spawned child's own setup.
        target: the program (a script's path, a module's name).
        setup: ``asyncflow run``'s body, which a spawned child runs its work in.

    Returns:
        The handle whose ``undo()``, after the parent's report, lists the children's reports.
    """
    following = Following(profiler, args, target, setup)
    if config.disabled() or profiler.options.no_children or not profiler.running:
        return following
    following.activate()
    return following


#: how long a SIGTERM waits for the exit report before the program dies anyway
SIGNAL_REPORT_TIMEOUT = 5.0
#: how long the interrupted main thread waits in the handler before it is let go on
SIGNAL_HOLD = 1.0


def report_on_sigterm(
    stop: Callable[[], object], watched: signal.Signals = signal.SIGTERM, *, note: bool = False
) -> Callable[[], None]:
    """On SIGTERM (docker stop, systemd), write the report, then die by SIGTERM as before.

    With ``note``, one line after the report says that it shows the moment the signal ended
    the program (its calls in progress have no outcome yet).

    (Or on ``watched``: a forked worker whose SIGINT a server set to its default action, as
    gunicorn's uvicorn workers do, reports on SIGINT as well; see
    :func:`_report_forked_on_sigterm`.)

    Installed only where SIGTERM would kill the program outright (its handler is SIG_DFL), so
    a program that handles SIGTERM itself, or ignores it, keeps doing so; one that installs a
    handler later replaces this one. The program is not unwound (no ``finally`` runs, no
    ``atexit``), exactly as under the default action. A second SIGTERM ends it at once.
    Returns the undo.

    The report is written by another thread while the main thread waits in the handler. The
    main thread may have been interrupted holding a lock the report needs (inside a write to
    a full stderr pipe, say): after :data:`SIGNAL_HOLD` the handler returns and lets it go on,
    and SIGTERM is raised again once the report is written, or at the deadline.
    """
    try:
        if signal.getsignal(watched) is not signal.SIG_DFL:
            return lambda: None
    except ValueError:  # not the main thread: signals cannot be handled here
        return lambda: None
    pid = os.getpid()
    reported = threading.Event()
    started = False

    def die(signum: int) -> None:
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)  # returns only where SIGTERM is ignored (pid 1 in a container)

    def report(signum: int) -> None:
        try:
            # a profiler running now whose report goes somewhere writes it in this stop; only
            # the program's own process says what moment it shows (a worker a pool terminates
            # writes nothing more than its report)
            owner: Any = getattr(stop, "__self__", None) if note else None
            reports = owner is not None and owner.running and owner.options.format != "none"
            if stop() is not None and reports:
                say(
                    f"asyncflow: {signal.Signals(signum).name} ended the program: the report "
                    "is its state then (its loop still running, a call not returned yet "
                    "counted with no outcome)"
                )
        finally:
            reported.set()

    def wake(signum: int) -> None:
        reported.wait(SIGNAL_REPORT_TIMEOUT - SIGNAL_HOLD)
        os.kill(pid, signum)  # the handler, started already, dies

    def handler(signum: int, frame: FrameType | None) -> None:
        nonlocal started
        if os.getpid() != pid or started:  # a forked child (no profiler thread), or again
            die(signum)
            return
        started = True
        threading.Thread(
            target=report, args=(signum,), name="asyncflow-sigterm", daemon=True
        ).start()
        if not reported.wait(SIGNAL_HOLD):
            threading.Thread(
                target=wake, args=(signum,), name="asyncflow-sigterm-wake", daemon=True
            ).start()
            return
        die(signum)

    handler.__asyncflow_sigterm__ = True  # type: ignore[attr-defined]  # a fork replaces it
    signal.signal(watched, handler)

    def undo() -> None:
        if signal.getsignal(watched) is handler:
            signal.signal(watched, signal.SIG_DFL)

    return undo


# -- in the parent: multiprocessing's start, and forks -------------------------------------------

#: the following of this process (inherited by a forked child until it follows its own)
_following: Following | None = None
#: set in the forking thread while multiprocessing starts a process: its fork is no bare fork
_local = threading.local()


def _patch_start() -> Callable[[], None]:
    """Wrap ``BaseProcess.start``; returns what puts it back."""
    from multiprocessing import process

    original = process.BaseProcess.start
    if getattr(original, "__asyncflow_start__", False):
        return lambda: None  # wrapped already (inherited through a fork)

    @functools.wraps(original)
    def start(self: Any) -> None:
        following = _following
        if (
            following is None
            or not following.active
            or following.pid != os.getpid()
            or "run" in vars(self)  # the program's own, per instance: left alone
        ):
            return original(self)
        try:
            child = following.child(_role_base(self))
            if following.picklable is None:  # once: a spawned child gets it pickled
                from multiprocessing.reduction import ForkingPickler

                ForkingPickler.dumps(_InChild(child))
                following.picklable = True
            vars(self)["run"] = _InChild(child)
        except Exception as exc:  # the child runs unprofiled; its start() is not ours to break
            following.picklable = False
            following.active = False
            _session.internal_error("following a child process", exc)
            return original(self)
        _local.starting = True
        try:
            original(self)
        finally:
            _local.starting = False
            # pickled or forked by now: the program's object is as it was
            if isinstance(vars(self).get("run"), _InChild):
                del vars(self)["run"]
        following._note(following.started, (child, self.pid))  # started (else it raised)

    start.__asyncflow_start__ = True  # type: ignore[attr-defined]
    process.BaseProcess.start = start  # type: ignore[method-assign]

    def restore() -> None:
        if process.BaseProcess.start is start:
            process.BaseProcess.start = original  # type: ignore[method-assign]

    return restore


def _before_fork() -> None:
    _local.fork = None
    following = _following
    if (
        following is None
        or not following.active
        or following.pid != os.getpid()
        or getattr(_local, "starting", False)  # multiprocessing's: its run() is profiled
    ):
        return
    try:
        _local.fork = following.child("fork")
    except Exception as exc:
        _session.internal_error("following a forked process", exc)


def _after_fork_in_parent() -> None:
    child, _local.fork = getattr(_local, "fork", None), None
    following = _following
    if child is not None and following is not None:
        following._note(following.forked, child)


def _after_fork_in_child() -> None:
    global _pending
    child, _local.fork = getattr(_local, "fork", None), None
    _pending = None
    if child is None:
        return
    try:
        from asyncflow.instrumentation import every_loop

        current = every_loop._instrumenters
        if current:  # profiled from the first loop it makes or runs
            _pending = child
            every_loop._instrumenters = ((_first_loop, "its process is not profiled"), *current)
    except Exception as exc:  # the child must go on, whatever happens here
        _session.internal_error("following a forked process", exc)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_in_child,
    )


# -- in the child -------------------------------------------------------------------------------

#: a bare fork's profile, started by the first event loop it makes or runs
_pending: Child | None = None


class _Nothing:
    """What :func:`_first_loop` gives the loop tracking back: nothing to undo."""

    active = False

    def undo(self) -> None:
        pass


def _first_loop(loop: Any = None) -> _Nothing:
    """A forked child makes or runs its first event loop: its profile starts, before that
    loop's tasks are tracked (never raises: the loop runs on whatever happens here)."""
    global _pending
    child, _pending = _pending, None
    try:
        from asyncflow.instrumentation import every_loop

        every_loop._instrumenters = tuple(
            pair for pair in every_loop._instrumenters if pair[0] is not _first_loop
        )
        parent = _following
        if child is not None and parent is not None and parent.pid != os.getpid():
            started = _start_forked(child, parent)
            if started is not None:
                # leaving through the interpreter's exit: the report, then its own children's
                atexit.register(_finish, *started)
    except Exception as exc:
        _session.internal_error("profiling a forked process", exc)
    return _Nothing()


def _finish(profiler: Profiler, following: Following) -> None:
    profiler.stop()
    following.undo()


def _start_forked(child: Child, parent: Following) -> tuple[Profiler, Following] | None:
    """In a forked child, where ``asyncflow run``'s hooks came along: a profiler of its own
    (the parent's was left behind at the fork), and its own children followed. None when it
    cannot start (said on standard error: the child runs on unprofiled)."""
    global _following
    from asyncflow.profiler import Profiler

    options = parent.profiler.options
    try:
        profiler = Profiler(
            dataclasses.replace(
                options,
                name=child.name,
                output=child.output,
                port=None if options.port is None else 0,
                port_source=None,
                trace_output=child.trace_output,
                record=None if options.record is None else _beside(options.record, child.role),
            )
        )
        profiler.hosting = True  # the program's own asyncflow.profile() joins it
        profiler.child_of = (child.parent_pid, child.role)
        _start_untracked(profiler)
    except Exception as exc:
        say(f"asyncflow: {child.name!r} runs unprofiled: {exc}")
        return None
    say(
        f"asyncflow: profiling {child.name!r} (pid {os.getpid()}); endpoint: "
        f"{profiler.url or 'not served'}"
    )
    following = Following(profiler, argparse.Namespace(**child.args), parent.target, parent.setup)
    following.active = True  # its parent followed it: it follows its own
    _following = following  # the start wrapper came along: it reads this
    _report_forked_on_sigterm(profiler.stop)
    return profiler, following


def _report_forked_on_sigterm(stop: Callable[[], object]) -> None:
    """A forked child's SIGTERM writes its report first, as the parent's does, where SIGTERM
    would end it outright: its default action, or the parent's handler of that kind, which
    came along and would end it without a report (uvicorn's server, gunicorn's workers restore
    the handler they found and raise SIGTERM again once they shut down). The same for SIGINT
    where the child set it to its default action (gunicorn's uvicorn workers do: Ctrl-C at
    the terminal reaches them too). (An armed child's ``stop`` is its disarming, which
    writes the report of a child attached.)"""
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        for signum in (signal.SIGTERM, signal.SIGINT):
            handler = signal.getsignal(signum)
            if getattr(handler, "__asyncflow_sigterm__", False):
                signal.signal(signum, signal.SIG_DFL)
            report_on_sigterm(stop, signum)  # where the signal would end it outright
    except Exception as exc:  # the child runs on, its report written at its exit
        _session.internal_error("reporting on SIGTERM in a child process", exc)


def _start_untracked(profiler: Profiler) -> None:
    """Start ``profiler`` where every loop is tracked already (a fork of a process under
    ``asyncflow run``), leaving its own event loop out: the tracking is paused while the loop
    is made and first run, and the loop is then one it never asks again."""
    from asyncflow.instrumentation import every_loop

    paused, every_loop._instrumenters = every_loop._instrumenters, ()
    try:
        profiler.start()
    finally:
        loop = profiler._loop
        if loop is not None:
            every_loop._refused.add(loop)
        every_loop._instrumenters = paused


class _InChild:
    """A multiprocessing child's ``run``, for the length of its parent's ``start()``: runs the
    process's own ``run()`` (its target, or a subclass's) profiled."""

    __slots__ = ("child",)

    def __init__(self, child: Child) -> None:
        self.child = child

    def __reduce__(self) -> tuple[Any, ...]:
        return (_InChild, (self.child,))

    def __call__(self) -> None:
        global _pending
        import multiprocessing

        _local.starting = False  # inherited from the parent's start() by a forked child
        _pending = None
        process = multiprocessing.current_process()
        run = functools.partial(type(process).run, process)
        parent = _following
        if parent is not None and parent.pid != os.getpid():  # forked: the hooks came along
            started = _start_forked(self.child, parent)
            deferral = _SigtermDeferral()
            try:
                run()
            finally:
                deferral.begin()
                try:
                    if started is not None:
                        _finish(*started)
                finally:
                    deferral.end()
            return
        failure = _fresh(self.child, run)
        if failure is not None:
            raise failure  # the work's own exception, raised on once its report is written


def _fresh(child: Child, run: Callable[[], None]) -> BaseException | None:
    """In a fresh interpreter (spawn, forkserver): ``run()`` as ``asyncflow run`` runs a program.

    Returns what it raised, for the caller to raise on to multiprocessing as it would be
    unprofiled, with no frame of asyncflow's between the caller and the work's own.
    """
    outcome: list[BaseException] = []
    ran = False
    deferral = _SigtermDeferral()

    def program() -> None:
        nonlocal ran
        ran = True
        try:
            run()
        except BaseException as exc:
            tb = exc.__traceback__
            exc.__traceback__ = tb.tb_next if tb is not None else None  # from run() on
            outcome.append(exc)
        finally:
            deferral.begin()  # the work is done: its report comes next

    args = argparse.Namespace(**child.args)
    try:
        child.setup(args, child.name, child.target, program, None)
    except Exception as exc:  # e.g. the endpoint cannot start: the work runs unprofiled
        say(f"asyncflow: {child.name!r} runs unprofiled: {exc}")
    finally:
        deferral.end()
    if not ran:
        run()
    return outcome[0] if outcome else None


class _SigtermDeferral:
    """From the end of a child's work until its report is written, a SIGTERM waits.

    A pool's workers, for one, are told there is no more work and are then terminated: a
    worker that would have been gone is still writing its report, and must not die half-way
    through it. When the report is written, a SIGTERM that came meanwhile is raised again, to
    the handler that was there before (asyncflow's, the program's own, or the default action).
    Only the main thread can set handlers; elsewhere this does nothing.
    """

    def __init__(self) -> None:
        self._previous: Any = None
        self._begun = False
        self._received: list[int] = []

    def begin(self) -> None:
        if self._begun or threading.current_thread() is not threading.main_thread():
            return
        try:
            self._previous = signal.signal(
                signal.SIGTERM, lambda signum, frame: self._received.append(signum)
            )
        except (ValueError, OSError):  # no SIGTERM here
            return
        self._begun = True

    def end(self) -> None:
        if not self._begun:
            return
        self._begun = False
        previous = self._previous if self._previous is not None else signal.SIG_DFL
        signal.signal(signal.SIGTERM, previous)
        if self._received:
            signal.raise_signal(signal.SIGTERM)
