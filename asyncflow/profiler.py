"""The profiler's lifecycle: ``profile()``, ``start()``, ``stop()``, its thread and event loop.

Nothing heavy is imported here: the collector, the documents and the reports come in when a
profiler starts, the server (and aiohttp) only when it serves an endpoint, so ``import
asyncflow`` stays cheap for a program that only instruments.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import errno
import importlib
import itertools
import logging
import os
import selectors
import stat
import sys
import threading
import types
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from types import TracebackType
from typing import TYPE_CHECKING, Any

from asyncflow import _forksafe, clock, config
from asyncflow.config import Options, resolve_options
from asyncflow.errors import TRACE_OFF, AsyncflowError, PortInUseError, say
from asyncflow.instrumentation import _handing, _session, futures
from asyncflow.instrumentation.futures import reset_for_session

if TYPE_CHECKING:
    from asyncflow.model.collector import Collector
    from asyncflow.render.record import Recorder
    from asyncflow.render.reporters import Reporters
    from asyncflow.render.trace import TraceRecorder
    from asyncflow.schema import GraphDocument, Snapshot
    from asyncflow.serve.registry import Registration
    from asyncflow.serve.server import Server
    from asyncflow.views.wait_views import TaskReading

__all__ = ["Profiler", "active_profiler", "profile", "start", "stop"]

#: What asyncflow says when ``ASYNCFLOW_DISABLE`` turned it off.
_STARTUP_TIMEOUT = 10.0
#: how long start() waits for the loop monitor's first look (seconds)
_FIRST_LOOK_TIMEOUT = 1.0
_lock = threading.Lock()
_active: Profiler | None = None
#: the profiler started last: ``asyncflow.stop()`` returns its final snapshot once it stopped
_last: Profiler | None = None
#: profilers whose thread may be running: a forked child forsakes them
_alive: set[Profiler] = set()
_epochs = itertools.count(1)
_task_numbers = itertools.count(1)
logger = logging.getLogger("asyncflow")


#: What start() imports the first time, off the main thread (see _import_where_not_interrupted)
_STARTUP_MODULES = ("asyncflow.model.collector", "asyncflow.serve.registry")


def _import_where_not_interrupted() -> None:
    """Import what a profiler needs (orjson among it) on a thread of its own, the first time.

    Python raises KeyboardInterrupt only on the main thread, and orjson's module init crashes
    the process when a nested import is interrupted there. A Ctrl-C still interrupts start()
    at once (its wait below); the imports finish behind it, whole.
    """
    missing = [name for name in _STARTUP_MODULES if name not in sys.modules]
    if not missing:
        return
    failures: list[BaseException] = []

    def load() -> None:
        try:
            for name in missing:
                importlib.import_module(name)
        except BaseException as exc:  # given to start() to raise
            failures.append(exc)

    thread = threading.Thread(target=load, name="asyncflow-import", daemon=True)
    thread.start()
    thread.join()
    from asyncflow.model.threads import own_thread_ended

    own_thread_ended(thread)
    if failures:
        raise failures[0]


#: how often the profiler's loop checks that its descriptors are still its own (seconds)
DESCRIPTORS_CHECK_S = 1.0

#: the loops (with their tasks and servers) of profilers whose file descriptors the program
#: closed: kept, never freed, since freeing one would close a number the program owns now
_LOST: list[tuple[Any, ...]] = []


def _wait_ready(ready: threading.Event, timeout: float) -> bool:
    """Wait for the profiler's thread to be ready (a seam: tests interrupt start() here)."""
    return ready.wait(timeout)


class Profiler:
    """One profiling session. Create it with :func:`profile` or :func:`start`."""

    def __init__(self, options: Options) -> None:
        self.options = options
        #: the endpoint's address while it serves ("http://127.0.0.1:6780"); None otherwise
        self.url: str | None = None
        # new -> running -> stopping -> stopped; or disabled (ASYNCFLOW_DISABLE), joined (into
        # the profiler of `asyncflow run`), forked (this is a child of the process it ran in)
        self._state = "new"
        self._state_lock = _forksafe.lock(self)
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: _ProfilerLoop | None = None
        self._collector: Collector | None = None
        #: the trace recorder (``trace=``) and the live reporters, each ticked by the collector
        #: (they register with it); None when not asked for
        self._trace: TraceRecorder | None = None
        self._live: Reporters | None = None
        #: the recording (``record=``), ticked by the collector too; None when not asked for
        self._record: Recorder | None = None
        self._server: Server | None = None
        self._final: Snapshot | None = None
        self._failure: BaseException | None = None
        #: set when the program closed the profiler's file descriptors (a daemon's
        #: os.closerange): its thread stopped, and nothing touches its loop any more
        self._lost = False
        #: set when start() gives up (interrupted, failed, timed out) while the thread starts
        self._abandoned = False
        #: set by the profiler's thread when it goes to work (under _ready_lock), unless
        #: start() gave up first: only a thread that began serves, and is waited for
        self._began = False
        self._ready_lock = _forksafe.lock(self)
        #: set by ``asyncflow run``: profilers the program starts itself join this one
        self.hosting = False
        #: hosting, take the name of the first profiler that joins (it named itself)
        self.adopts_name = False
        self._joined: Profiler | None = None
        #: this process's file in the registry of running profilers (``asyncflow ps``)
        self._registration: Registration | None = None
        #: a worker process's profile (see asyncflow._children): its parent's pid and its role,
        #: registered for ``asyncflow ps``; its report never goes to standard output
        self.child_of: tuple[int, str] | None = None

    @property
    def name(self) -> str:
        """The profiled program's name, as given."""
        return self.options.name

    @property
    def running(self) -> bool:
        """Whether the profiler is recording now."""
        if self._joined is not None:
            return self._state == "joined" and self._joined.running
        return self._state == "running"

    @property
    def _listening_fds(self) -> list[int]:
        """The descriptors the endpoint listens on (none unless it serves)."""
        loop = self._loop
        return [fd for fd, _, _ in loop.listening] if loop is not None else []

    def _rename(self, name: str) -> None:
        """Take the name a joining profiler gave (under ``_lock``, once): the report, the
        status document and ``asyncflow ps`` show the program's own name."""
        self.adopts_name = False
        if name == self.options.name:
            return
        self.options = dataclasses.replace(self.options, name=name)
        collector = self._collector
        if collector is not None:
            collector.options = self.options
        registration = self._registration
        if registration is not None and self.url is not None:
            from asyncflow.serve import registry

            registration.remove()
            self._registration = registry.register(
                name, self.url, self.options.token is not None, self.child_of
            )

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> Profiler:
        """Start recording; see :func:`start`."""
        global _active, _last
        with _lock:
            if self._state == "new" and config.disabled():
                # Nothing starts: no thread, no endpoint, no report. Said on the logger only,
                # since whoever disabled asyncflow asked for it to keep out of the way.
                self._state = "disabled"
                _last = self
                logger.info("%s: %r is not profiled", config.disabled_because(), self.name)
                return self
            if _active is not None and _active.hosting and self._state == "new":
                # The program runs under `asyncflow run`: its own profiler joins that one, so
                # it neither fails nor reports twice; snapshots and url are the host's.
                self._joined, self._state, self.url = _active, "joined", _active.url
                if _active.adopts_name:  # `asyncflow run` without --name: the program's name
                    _active._rename(self.name)
                return self
            if _active is not None:
                raise AsyncflowError(
                    f"a profiler ({_active.name!r}) is already running in this process; call "
                    "asyncflow.stop() or leave its 'with asyncflow.profile(...)' block first"
                )
            if self._state != "new":
                raise AsyncflowError(
                    f"profiler {self.name!r} has already run; create a new one to profile again"
                )
            options = self.options
            if (
                options.port is not None
                and options.token is None
                and not _is_loopback(options.host)
            ):
                raise AsyncflowError(
                    f"refusing to serve on {options.host!r} without a token: anyone who can "
                    "reach it could read this program's profile; pass token= (or set "
                    "ASYNCFLOW_TOKEN), or bind to 127.0.0.1"
                )
            _import_where_not_interrupted()
            from asyncflow.instrumentation import (
                channels,
                coroutines,
                every_loop,
                executors,
                resources,
                streams,
            )
            from asyncflow.model.collector import Collector

            reset_for_session()
            channels.reset_for_session()
            streams.reset_for_session()
            executors.reset_for_session()
            resources.reset_for_session()
            coroutines.reset_for_session()
            every_loop.reset_for_session()
            session = _session.Session(next(_epochs), clock.now_ns(), options.sampling)
            self._collector = Collector(session, options)
            self._trace = self._live = None
            if options.trace:
                from asyncflow.render.trace import TraceRecorder

                self._trace = TraceRecorder(
                    self._collector, options.trace_events, options.trace_output
                )
            if options.reporters or options.otel:
                self._live = _live_reporters(self._collector, options)
            self._record = None
            if options.record is not None:  # the file is made now: a bad path fails here
                from asyncflow.render.record import Recorder

                self._record = Recorder(self._collector, options.record, options.record_budget)
                self._record.open()
                self._record.attach()
            from asyncflow.views.documents import watch_for_deadlocks

            watch_for_deadlocks(self._collector)
            self._failure, self._abandoned, self._began = None, False, False
            ready = threading.Event()
            self._thread = threading.Thread(
                target=self._run,
                args=(ready,),
                name=f"asyncflow-profiler[{self.name}]",
                daemon=True,  # a profiler must never keep a finished program alive
            )
            # From here on, whatever interrupts start() (a failure, a timeout, Ctrl-C a few
            # milliseconds in) stops the thread and its server before it propagates.
            try:
                _alive.add(self)
                self._thread.start()
                if not _wait_ready(ready, _STARTUP_TIMEOUT) or self._failure is not None:
                    failure = self._failure
                    self._abandon(ready)
                    if isinstance(failure, AsyncflowError):
                        raise failure
                    reason = f": {failure!r}" if failure is not None else " in time"
                    raise AsyncflowError(f"the profiler thread could not start{reason}")
                # A block at the program's very start is measured whole only once the loop
                # monitor looks: return after its first look (on a loaded machine the thread
                # can start ticking 250 ms late), but never wait long for it.
                self._collector.monitor.ticking.wait(_FIRST_LOOK_TIMEOUT)
                self._state = "running"
                self._stopped.clear()
                _session.active = session
                every_loop.watch_trio_here()  # started inside a trio run: watched from now
                self._collector.fold_where()  # until now, calls finished go to the buffer
                if self._trace is not None:
                    self._trace.attach()  # polls are traced from here on
                self._collector.attach_polls()  # after the trace: its probe is shared
                _active = _last = self
                atexit.register(self.stop)
                if self.url is not None:
                    from asyncflow.serve import registry

                    self._registration = registry.register(
                        self.name, self.url, options.token is not None, self.child_of
                    )
            except BaseException:
                self._abandon(ready)
                raise
        return self

    def _abandon(self, ready: threading.Event) -> None:
        """Undo a start() that did not finish: stop the thread (and the server it may serve),
        and leave nothing of this profiler active. Idempotent."""
        global _active
        with self._ready_lock:
            self._abandoned = True
            began = self._began
            loop = self._loop if ready.is_set() else None  # else the thread sees _abandoned
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # closed already: the thread is finishing
                loop.call_soon_threadsafe(loop.stop)
        thread = self._thread
        if thread is None or not began:
            # Not started, or started but not yet at work (Ctrl-C may come after the thread
            # exists, before Thread.start() marks it started: it cannot be joined then). If it
            # runs at all, it sees it was abandoned and does nothing: it binds no port.
            _alive.discard(self)
        elif thread is not threading.current_thread():
            thread.join(_STARTUP_TIMEOUT)  # it began: wait until it has closed what it opened
        if _active is self:
            _active = None
        collector = self._collector
        if collector is not None and _session.active is collector.session:
            _session.active = None
        if collector is not None:
            collector.detach_polls()  # before the trace's detach: it shares the probe
        if collector is not None and self._trace is not None:
            self._trace.detach()
        if self._record is not None:
            self._record.close()
        atexit.unregister(self.stop)
        self._state = "new"
        self.url = None
        self._thread = self._loop = self._collector = self._server = None

    def _run(self, ready: threading.Event) -> None:
        with self._ready_lock:
            # start() may have given up (and even started again) before this thread ran
            if self._abandoned or self._thread is not threading.current_thread():
                return
            self._began = True
        loop = _ProfilerLoop()
        tasks: list[asyncio.Task[None]] = []
        try:
            self._loop = loop
            collector = self._collector
            assert collector is not None
            options = self.options
            if options.port is not None:
                self.url = loop.run_until_complete(self._serve(loop, collector))
            if self._live is not None:
                self._live.open(loop)  # before ready: start() returns with them open
            tasks.append(loop.create_task(collector.run(), name="asyncflow-collector"))
            tasks.append(loop.create_task(collector.monitor.run(), name="asyncflow-monitor"))
            if options.duration is not None:
                loop.call_later(options.duration, self._expire)
        except BaseException as exc:
            self._failure = exc
            self.url = None
            self._finish(loop, tasks)
            ready.set()
            return
        with self._ready_lock:
            abandoned = self._abandoned
            if not abandoned:
                ready.set()
        if abandoned:  # start() gave up while this thread got ready: serve nothing
            self.url = None
            self._finish(loop, tasks)
            return
        try:
            loop.call_later(DESCRIPTORS_CHECK_S, loop.watch_descriptors)
            loop.run_forever()
        except OSError:
            if not loop.descriptors_kept():
                self._lose(loop, tasks)
                return
            self._finish(loop, tasks)
            raise
        except BaseException:
            self._finish(loop, tasks)
            raise
        if loop.lost_descriptors:
            self._lose(loop, tasks)
            return
        self._finish(loop, tasks)

    def _lose(self, loop: _ProfilerLoop, tasks: list[asyncio.Task[None]]) -> None:
        """The program closed this thread's file descriptors (a daemon's ``os.closerange``):
        its loop cannot wait any more. Its numbers may be the program's own files now, so
        nothing of it is closed, written or waited on again: the loop, its tasks and the
        server are kept as they are, for the life of the process (each object would close
        its number when freed). The report is still taken at exit, on the stopping thread."""
        self._lost = True
        _LOST.append((loop, tasks, self._server))
        self._server = None
        say(
            "asyncflow: the program closed the profiler's file descriptors: its endpoint and "
            "loop monitor stopped; the report is still written at exit"
        )

    async def _serve(self, loop: _ProfilerLoop, collector: Collector) -> str:
        """Start the endpoint; returns its URL.

        A taken port that nobody chose (the default) gives way to a free one, and says where:
        a second worker of one service on one host must not crash at start. A chosen one fails.
        """
        from asyncflow.serve.server import (
            Server,  # aiohttp is imported only when an endpoint starts
        )

        options = self.options
        port = options.port
        assert port is not None
        server = Server(collector, options.host, port, options.token, lambda: self.running)
        server.trace = self._trace
        try:
            url = await server.start()
        except AsyncflowError:
            if not loop.address_in_use:
                raise
            loop.address_in_use = False
            if options.port_source is not None:
                raise PortInUseError(options.host, port, options.port_source) from None
            server = Server(collector, options.host, 0, options.token, lambda: self.running)
            server.trace = self._trace
            url = await server.start()
            logger.warning(
                "asyncflow: port %s on %s is in use; serving on %s instead", port, options.host, url
            )
        self._server = server
        return url

    def _finish(self, loop: _ProfilerLoop, tasks: list[asyncio.Task[None]]) -> None:
        """Cancel the profiler's tasks, stop the server, close the loop (on its thread)."""
        server = self._server

        async def shut() -> None:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if server is not None:
                await server.stop()

        try:
            loop.run_until_complete(shut())
        finally:
            loop.close()
            _alive.discard(self)

    def _expire(self) -> None:
        # ``duration`` ran out: stop from another thread, since stop() joins this one.
        threading.Thread(target=self.stop, name="asyncflow-stop", daemon=True).start()

    def stop(self) -> Snapshot | None:
        """Stop recording, write the exit report, and return the final snapshot.

        Idempotent: stopping a stopped profiler does nothing and returns its final snapshot,
        also while another thread is stopping it (it waits for that one). Instrumented
        coroutines and tasks keep working afterwards; they just stop recording. Returns None
        for a profiler that never ran (not started, disabled, or inherited by a forked child).
        """
        global _active
        with self._state_lock:
            if self._joined is not None:
                if self._state == "joined":
                    self._state = "stopped"
                    self.url = None
                    host = self._joined
                    self._final = host.snapshot() if host.running else host._final
                return self._final
            state = self._state
            if state == "running":
                self._state = "stopping"
        if state == "stopping":  # another thread stops it: its final snapshot is this one's
            if threading.current_thread() is not self._thread:
                self._stopped.wait(2 * _STARTUP_TIMEOUT)
            return self._final
        if state != "running":
            return self._final
        with _lock:
            if _active is self:
                _active = None
        try:
            self._final = self._call(self._final_snapshot)
        except Exception as exc:  # stopping must not break the program, whatever happened
            _session.internal_error("taking the final snapshot", exc)
        finally:
            loop, thread = self._loop, self._thread
            if loop is not None and not loop.is_closed() and not self._lost:
                with contextlib.suppress(RuntimeError):  # closed meanwhile
                    loop.call_soon_threadsafe(loop.stop)
            if thread is not None and thread is not threading.current_thread():
                thread.join(_STARTUP_TIMEOUT)
            self._state = "stopped"
            self.url = None
            registration, self._registration = self._registration, None
            if registration is not None:
                registration.remove()
            # The final snapshot holds everything worth keeping; the rest can go.
            self._collector = self._server = None
            self._stopped.set()
            atexit.unregister(self.stop)
        if self._final is not None:
            self._report(self._final)
        return self._final

    def _final_snapshot(self) -> Snapshot:
        from asyncflow.views import documents as views

        collector = self._collector
        assert collector is not None
        if _session.active is collector.session:
            _session.active = None  # calls created from now on are not recorded
        collector.monitor.stop()
        collector.drain()
        collector.detach_polls()  # before the trace's finish: it shares the probe
        if self._trace is not None:
            self._trace.finish()  # stops tracing polls; writes the file trace= named
        final = views.snapshot(collector, running=False)
        if self._record is not None:
            self._record.finish(final)  # the end state, then the file is closed
        if self._live is not None:  # the live reporters' last tick, then their close()
            from asyncflow.render.reporters import figures_of

            self._live.close(figures_of(final))
        return final

    def _report(self, snapshot: Snapshot) -> None:
        options = self.options
        try:
            if options.reporter is not None:
                options.reporter.report(snapshot)
                return
            if options.format == "none":
                return
            from asyncflow.render.report import render

            text = render(snapshot, options.format, options.percentiles, options.limit)
            if options.output in (None, "-"):
                # The table beside the program's diagnostics; a JSON document, or any report
                # asked for with "-", on standard output, where asyncflow writes nothing else.
                json = options.output == "-" or options.format != "table"
                stream = sys.stdout if json else sys.stderr
                if self.child_of is not None:  # a worker's: standard output is its parent's
                    stream = sys.stderr
                    text = f"asyncflow: report of {self.name!r} (pid {os.getpid()}):\n{text}"
                stream.write(text)
                stream.flush()
            else:
                with open(options.output, "w", encoding="utf-8") as out:
                    out.write(text)
        except Exception as exc:  # a report that cannot be written must not break the program
            _session.internal_error("writing the exit report", exc)

    def _forsake(self) -> None:
        """In a forked child: this profiler's thread did not come along, so let it go.

        Its listening sockets are closed here (the parent's port must not stay taken by a
        fork-pool worker), stopping it does nothing, and nothing waits for it at exit.
        """
        collector = self._collector
        if collector is not None:
            collector.detach_polls()
        if collector is not None and self._trace is not None:
            self._trace.detach()  # the parent's trace: this child's polls are not in it
        atexit.unregister(self.stop)
        self._registration = None  # the parent's file: the parent removes it
        if self._state in ("running", "stopping", "new"):
            self._state = "forked"
        self.url = None
        stopped = threading.Event()  # set anew: a thread not here may hold the old one's lock
        stopped.set()
        self._stopped = stopped
        loop = self._loop
        if loop is not None:
            loop.forsake_listening()

    # -- queries -----------------------------------------------------------------------------

    def _call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn()`` on the profiler's thread (where the collector's state lives), or here
        once that thread is gone."""
        loop, thread = self._loop, self._thread
        if thread is threading.current_thread() or loop is None or loop.is_closed() or self._lost:
            return fn()
        done: Future[Any] = Future()

        def call() -> None:
            try:
                done.set_result(fn())
            except BaseException as exc:
                done.set_exception(exc)

        loop.call_soon_threadsafe(call)
        return done.result(timeout=_STARTUP_TIMEOUT)

    def snapshot(self) -> Snapshot:
        """Every document as of now: the same data the endpoint serves and reports contain.

        Raises:
            AsyncflowError: the profiler was never started, asyncflow is disabled
                (``ASYNCFLOW_DISABLE=1``), or this is a forked child of the process it ran in.
        """
        if self._state == "new":
            raise AsyncflowError(f"profiler {self.name!r} has not been started")
        if self._state == "disabled":
            raise AsyncflowError(
                f"{config.disabled_because()}: profiler {self.name!r} records nothing"
            )
        if self._final is not None:
            return self._final
        if self._joined is not None:
            return self._joined.snapshot()
        collector = self._collector
        if self._state == "forked":
            raise AsyncflowError(
                f"profiler {self.name!r} ran in the process this one was forked from; start a "
                "new profiler here to profile this process"
            )
        if collector is None:
            raise AsyncflowError(
                f"profiler {self.name!r} stopped without a final snapshot (an internal error, "
                "reported when it happened)"
            )

        caller = threading.get_ident()  # its loop, if any, waits for this: read it from outside

        def take() -> Snapshot:
            from asyncflow.views import documents as views

            collector.drain()
            return views.snapshot(collector, running=self.running, waiting_thread=caller)

        result: Snapshot = self._call(take)
        return result

    def _waits(self) -> tuple[TaskReading, GraphDocument]:
        """Every live task, read now, and the wait-for graph they make (``asyncflow dump``).

        Raises:
            AsyncflowError: the profiler is not running.
        """
        collector = self._collector
        if self._state != "running" or collector is None:
            raise AsyncflowError(f"profiler {self.name!r} is not running")

        def take() -> tuple[TaskReading, GraphDocument]:
            from asyncflow.views import documents, wait_views

            collector.drain()
            responsive = wait_views.responsive_loops(collector.monitor, clock.now_ns())
            reading = wait_views.read_tasks(responsive)
            return reading, documents.wait_for_graph(collector, reading)

        result: tuple[TaskReading, GraphDocument] = self._call(take)
        return result

    def trace(self) -> dict[str, Any]:
        """The trace recorded so far, as a Chrome trace event document (what ``GET /trace``
        serves; ``json.dump`` it to a file that Perfetto opens).

        Raises:
            AsyncflowError: the profiler is not running, or records no trace (start it with
                ``trace=True`` or ``trace="file.json"``, or ``ASYNCFLOW_TRACE``).
        """
        if self._joined is not None:
            return self._joined.trace()
        collector = self._collector
        if self._state != "running" or collector is None:
            raise AsyncflowError(f"profiler {self.name!r} is not running: it has no trace to give")
        recorder = self._trace
        if recorder is None:
            raise AsyncflowError(TRACE_OFF)
        import orjson

        # Built on the profiler's thread; parsed on the caller's, which asked for the dicts.
        document: dict[str, Any] = orjson.loads(self._call(recorder.data))
        return document

    # -- context managers --------------------------------------------------------------------

    def __enter__(self) -> Profiler:
        return self.start()

    def __exit__(
        self, typ: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    async def __aenter__(self) -> Profiler:
        return self.start()

    async def __aexit__(
        self, typ: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<asyncflow.Profiler {self.name!r} {self._state}>"


def profile(name: str, **options: Any) -> Profiler:
    """A profiler to use as ``with``/``async with``; it starts on entry and reports on exit.

    Args:
        name: names the profiled program in reports and status documents.
        **options: keyword-only options, one for each row of ``asyncflow.config.OPTIONS``
            (``percentiles``, ``limit``, ``format``, ``output``, ``port``, ``trace``...), which
            gives each one's check, its ``ASYNCFLOW_*`` environment variable (if any) and its
            meaning; docs/profiler.md's options table lists them.

    Raises:
        ValueError: an option has a bad value (checked here, before anything starts).
        TypeError: an unknown option was passed.
    """
    return Profiler(resolve_options(name, options))


def start(name: str, **options: Any) -> Profiler:
    """Start a profiler now; :func:`stop` ends it. Same options as :func:`profile`.

    With ``ASYNCFLOW_DISABLE=1`` nothing starts: the profiler serves, records and reports
    nothing, and says so on the ``asyncflow`` logger (at info level).

    Raises:
        AsyncflowError: a profiler is already running in this process, a port that was chosen
            (``port=``, ``ASYNCFLOW_PORT``) is taken (:class:`~asyncflow.errors.PortInUseError`),
            or a non-loopback host was given without a token. A taken default port is not an
            error: the endpoint serves on a free port and says where, on the ``asyncflow``
            logger.
    """
    return profile(name, **options).start()


def stop() -> Snapshot | None:
    """Stop the running profiler, if any, and return its final snapshot.

    Called again, it returns the same final snapshot (that of the profiler started last);
    None if no profiler ever ran. Under ``asyncflow run`` the profiler belongs to the
    command, not to the program: stopping it here would end the profile early, so this
    returns a snapshot and leaves it running.
    """
    profiler = _active
    if profiler is not None and profiler.hosting:
        return profiler.snapshot()
    if profiler is None:
        profiler = _last
    return profiler.stop() if profiler is not None else None


def active_profiler() -> Profiler | None:
    """The profiler running in this process, if any."""
    return _active


def _live_reporters(collector: Collector, options: Options) -> Reporters:
    """The live reporters asked for: ``reporters=[...]``, and the OpenTelemetry export."""
    from asyncflow.render.reporters import Reporters

    reporters = list(options.reporters)
    if options.otel:
        from asyncflow.render.otel import OtelReporter  # refuses clearly when the extra is missing

        reporters.append(OtelReporter(service_name=options.name, ids=options.metric_ids))
    return Reporters(reporters, collector)


def _is_loopback(host: str) -> bool:
    from asyncflow.serve.server import is_loopback

    return is_loopback(host)


# -- the profiler's own event loop ---------------------------------------------------------------


def _task_name() -> str:
    return f"asyncflow-{next(_task_numbers)}"


class _HandingEpoll:
    """The profiler loop's ``select.epoll``, whose ``poll()`` waits in the compiled path
    (``_speedups.wait_events``) and says on waking, before it waits for the GIL, that the
    profiler's thread wants it: a tracked call's next poll on the program's threads hands it
    over. Else a program busy on its loop, yielding every fraction of a millisecond, takes the
    GIL back each time before this thread can, and an endpoint request waited seconds."""

    def __init__(self, epoll: Any, wait: Callable[..., Any], done: Callable[[], None]) -> None:
        #: the loop's ``then`` for a wait of so many seconds (see ``_ProfilerLoop.look_later``)
        self.then: Callable[[float | None], float | None] = lambda timeout: None
        self._epoll = epoll
        self._fd = epoll.fileno()
        self._wait = wait
        self._done = done
        self.register = epoll.register
        self.modify = epoll.modify
        self.unregister = epoll.unregister
        self.fileno = epoll.fileno

    def poll(self, timeout: float | None = None, maxevents: int = -1) -> list[tuple[int, int]]:
        then = self.then(timeout)
        if then is None:
            events: list[tuple[int, int]] = self._wait(self._fd, timeout, maxevents)
        else:
            events = self._wait(self._fd, timeout, maxevents, then)
        return events

    def close(self) -> None:
        self._done()  # nobody hands the GIL over to a thread that no longer waits here
        self._epoll.close()


class _HandingSelector(selectors.DefaultSelector):
    """The profiler loop's selector on the pure-Python path: it says how long each wait for
    events may last and when the thread is back at work, for the program's tracked polls to
    hand it the GIL (``instrumentation/_handing.py``, the pure-Python _HandingEpoll)."""

    def select(self, timeout: float | None = None) -> list[tuple[Any, int]]:
        _handing.waiting(timeout)
        try:
            ready: list[tuple[Any, int]] = super().select(timeout)
        finally:
            if timeout is None or timeout > 0:
                _handing.woke()
        return ready

    def close(self) -> None:
        _handing.forget()  # nobody hands the GIL over to a thread that no longer waits here
        super().close()


def _identity(fd: int) -> tuple[int, int, int]:
    """(descriptor, device, inode): which file a descriptor number stands for now."""
    st = os.fstat(fd)
    return fd, st.st_dev, st.st_ino


def _events_selector() -> selectors.BaseSelector:
    """The profiler loop's selector: epoll waited on through the compiled path where it is
    built (see _HandingEpoll), unless ``ASYNCFLOW_GIL_HAND_OVER=0``; on the pure-Python path,
    one that says when the thread waits (_HandingSelector); else the default."""
    speedups = futures._speedups
    if not config.gil_hand_over():
        return selectors.DefaultSelector()
    if speedups is None:
        return _HandingSelector()
    wait = getattr(speedups, "wait_events", None)
    if wait is None or not hasattr(selectors, "EpollSelector"):
        return selectors.DefaultSelector()
    selector = selectors.EpollSelector()
    selector._selector = _HandingEpoll(  # type: ignore[attr-defined]
        selector._selector,  # type: ignore[attr-defined]
        wait,
        speedups.wait_events_done,
    )
    return selector


class _ProfilerLoop(asyncio.SelectorEventLoop):
    """The profiler's event loop, on its thread.

    Every task on it has a name. asyncio numbers unnamed tasks from one process-wide counter
    ("Task-1", "Task-2"...), so each unnamed task of the profiler's (its own, aiohttp's for
    every connection and request) would shift the program's task names. aiohttp names none,
    and on Python 3.12 and 3.13 builds some with ``asyncio.Task(...)`` itself, past the loop:
    its connection handlers are given a class whose methods see an ``asyncio`` that names them.

    It also keeps the sockets it listens on, so that a forked child can close its copies.
    """

    def __init__(self) -> None:
        selector = _events_selector()
        super().__init__(selector)
        epoll = getattr(selector, "_selector", None)
        if isinstance(epoll, _HandingEpoll):
            epoll.then = self._then
        #: the look planned by ``look_later``: its timer, and the loop's time it may wait to
        self._look: tuple[asyncio.TimerHandle, float] | None = None
        #: (descriptor, device, inode) of each listening socket
        self.listening: list[tuple[int, int, int]] = []
        #: set when a create_server() failed because its address was taken
        self.address_in_use = False
        #: naps not over yet: (the loop's time they may end from, their future)
        self._naps: list[tuple[float, asyncio.Future[None]]] = []
        #: (descriptor, device, inode) of the selector's and the self-pipe's descriptors
        pipe = (self._ssock, self._csock)  # type: ignore[attr-defined]  # (asyncio's own)
        fds = [s.fileno() for s in pipe]
        if hasattr(selector, "fileno"):  # epoll, kqueue, devpoll: a descriptor of its own
            fds.append(selector.fileno())
        self._kept = [_identity(fd) for fd in fds]
        #: set by watch_descriptors: the program closed them (run_forever returned for it)
        self.lost_descriptors = False

    def descriptors_kept(self) -> bool:
        """Whether its descriptors are still its own: a program that closes every descriptor
        it inherited (a daemon's ``os.closerange``) closes these too, and its next files take
        their numbers."""
        for kept in self._kept:  # (a closerange closes these too: they are checked alone)
            try:
                if _identity(kept[0]) != kept:
                    return False
            except OSError:
                return False
        return True

    def watch_descriptors(self) -> None:
        """Check the descriptors about once a second, on this loop. A closed epoll or
        self-pipe makes the next wait fail at once (EBADF, or EINVAL once the number is
        another file); a number the program's own epoll took does not, and is caught here: the
        loop stops, and the thread finds its descriptors lost. (Not before each wait: the
        checks let the GIL go, three times a turn of this loop, and the program's polls waited
        for it.)"""
        if not self.descriptors_kept():
            self.lost_descriptors = True
            self.stop()
            return
        self.call_later(DESCRIPTORS_CHECK_S, self.watch_descriptors)

    def nap(self, earliest: float, latest: float) -> asyncio.Future[None]:
        """A sleep that ends at this loop's first wake ``earliest`` seconds from now or later,
        and ``latest`` seconds from now if nothing wakes the loop before.

        Each wake of this thread takes the GIL from the program (the hand-over), and a wake of
        the collector's alone cost a busy aiohttp service about 1.3% of its CPU (``drain1`` in
        benchmarks/profiler_parts.py). Work that may wait a little rides on the loop monitor's
        wakes instead."""
        future: asyncio.Future[None] = self.create_future()
        now = self.time()
        self._naps.append((now + earliest, future))
        timer = self.call_at(now + latest, _end_nap, future)
        future.add_done_callback(lambda _: timer.cancel())
        return future

    def look_later(self, delay: float, then: float) -> asyncio.Future[None]:
        """A sleep of ``delay`` seconds for the loop monitor's look at its heartbeats in flight,
        which goes on to ``then`` seconds (or this loop's next timer, if earlier) when no
        heartbeat is in flight any more once ``delay`` is over: the thread then does not wake
        for a look with nothing to look at (``_speedups.wait_events``, which reads the count
        without the GIL)."""
        future: asyncio.Future[None] = self.create_future()
        now = self.time()
        timer = self.call_at(now + delay, _end_nap, future)
        future.add_done_callback(lambda _: timer.cancel())
        self._look = (timer, now + then)
        return future

    def _then(self, timeout: float | None) -> float | None:
        """How long a wait of ``timeout`` seconds may go on, if it ends at the look planned
        by ``look_later`` (the earliest timer); None if it does not."""
        look = self._look
        if look is None or timeout is None or timeout <= 0:
            return None
        timer, until = look
        scheduled = self._scheduled  # type: ignore[attr-defined]
        if timer.cancelled() or not scheduled or scheduled[0] is not timer:
            return None
        for later in scheduled[1:3]:  # (a heap: the next earliest is a child of the first)
            until = min(until, later.when())
        then = until - self.time()
        return then if then > timeout else None

    def _process_events(self, event_list: list[Any]) -> None:
        super()._process_events(event_list)  # type: ignore[misc]
        if self._naps:
            now = self.time()
            naps, self._naps = self._naps, []
            for nap in naps:
                if nap[0] <= now or nap[1].done():
                    _end_nap(nap[1])  # (its callbacks run in this turn of the loop)
                else:
                    self._naps.append(nap)

    def create_task(  # type: ignore[override]
        self, coro: Coroutine[Any, Any, Any], *, name: str | None = None, **kwargs: Any
    ) -> asyncio.Task[Any]:
        return super().create_task(coro, name=name or _task_name(), **kwargs)

    async def create_server(
        self, protocol_factory: Callable[[], asyncio.BaseProtocol], *args: Any, **kwargs: Any
    ) -> asyncio.Server:
        if _AIOHTTP_BUILDS_TASKS:
            protocol_factory = _naming_protocols(protocol_factory)
        try:
            server = await super().create_server(protocol_factory, *args, **kwargs)
        except OSError as exc:
            if exc.errno in _ADDRESS_IN_USE:
                self.address_in_use = True
            raise
        for sock in server.sockets:
            fd = sock.fileno()
            os.set_inheritable(fd, False)  # never handed to a program the process executes
            status = os.fstat(fd)
            self.listening.append((fd, status.st_dev, status.st_ino))
        return server

    def forsake_listening(self) -> None:
        """In a forked child: close this child's copies of the listening sockets.

        A descriptor is closed only while it is still the socket it was (a stopped server's
        descriptor number may belong to another file by now). It is pointed at /dev/null rather
        than closed: the socket objects copied into this child still own the number and will
        close it one day, which must not close some other file that took the number meanwhile.
        """
        if not self.listening:
            return
        null = os.open(os.devnull, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
        try:
            for fd, device, inode in self.listening:
                try:
                    status = os.fstat(fd)
                except OSError:
                    continue
                if (status.st_dev, status.st_ino) == (device, inode) and stat.S_ISSOCK(
                    status.st_mode
                ):
                    os.dup2(null, fd, inheritable=False)
        finally:
            os.close(null)
        self.listening.clear()


def _end_nap(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


_ADDRESS_IN_USE = {errno.EADDRINUSE, 10048}  # 10048: WSAEADDRINUSE, on Windows
#: aiohttp builds tasks with ``asyncio.Task(coro, loop=loop, eager_start=True)`` on these
_AIOHTTP_BUILDS_TASKS = (3, 12) <= sys.version_info < (3, 14)


class _NamingAsyncio:
    """``asyncio`` as aiohttp's connection handler sees it on the profiler's loop: the module
    itself, except that the tasks it builds get a name."""

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    @staticmethod
    def Task(coro: Any, *, name: str | None = None, **kwargs: Any) -> asyncio.Task[Any]:
        return asyncio.Task(coro, name=name or _task_name(), **kwargs)


def _naming_protocols(
    factory: Callable[[], asyncio.BaseProtocol],
) -> Callable[[], asyncio.BaseProtocol]:
    def made() -> asyncio.BaseProtocol:
        protocol = factory()
        web_protocol = sys.modules.get("aiohttp.web_protocol")
        handler = getattr(web_protocol, "RequestHandler", None)
        if handler is not None and isinstance(protocol, handler):
            try:
                protocol.__class__ = _naming_class(type(protocol), handler)
            except Exception as exc:  # aiohttp changed: its tasks keep unnamed, nothing breaks
                logger.debug("asyncflow: cannot name the endpoint's tasks: %r", exc)
        return protocol

    return made


def _naming_class(cls: type[Any], handler: type[Any]) -> type[Any]:
    """``cls``, a subclass of aiohttp's ``RequestHandler``, with ``handler``'s methods that
    build tasks re-bound to globals in which ``asyncio`` is :class:`_NamingAsyncio`.

    The copies sit between ``cls`` and ``handler`` in the method order, so that ``cls``'s own
    overrides still call them through ``super()``; they keep ``handler``'s closure, so their
    own ``super()`` still means ``handler``'s base. No attribute is added: instances can change
    their class to this one.
    """
    made = _naming_classes.get(cls)
    if made is not None:
        return made
    module = sys.modules[handler.__module__]
    namespace = {**vars(module), "asyncio": _NamingAsyncio()}
    methods: dict[str, Any] = {"__slots__": (), "__module__": __name__}
    for name in ("connection_made", "start"):
        original = vars(handler)[name]
        copy = types.FunctionType(
            original.__code__, namespace, name, original.__defaults__, original.__closure__
        )
        copy.__kwdefaults__ = original.__kwdefaults__
        copy.__qualname__ = original.__qualname__
        copy.__doc__ = original.__doc__
        methods[name] = copy
    named = type(handler.__name__, (handler,), methods)
    if cls is not handler:
        named = type(cls.__name__, (cls, named), {"__slots__": (), "__module__": cls.__module__})
    _naming_classes[cls] = named
    return named


_naming_classes: dict[type[Any], type[Any]] = {}


# -- fork: a child starts without its parent's profiler ------------------------------------------


def _after_fork_in_child() -> None:
    """Only the forking thread lives on in a child: the profiler's thread, its loop and its
    collector stay behind. Forget them, close the endpoint's listening sockets, and let the
    child start a profiler of its own. (asyncflow's locks were freed before this runs: see
    :mod:`asyncflow._forksafe`.)"""
    global _active, _last
    try:
        _active = _last = None
        _session.active = None
        forsaken = list(_alive)
        _alive.clear()
        for profiler in forsaken:
            profiler._forsake()
    except Exception as exc:  # the child must go on, whatever happens here
        _session.internal_error("resetting asyncflow in a forked child", exc)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
