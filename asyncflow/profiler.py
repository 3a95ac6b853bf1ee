"""The profiler's lifecycle: ``profile()``, ``start()``, ``stop()``, its thread and event loop."""

from __future__ import annotations

import asyncio
import atexit
import itertools
import sys
import threading
from concurrent.futures import Future
from types import TracebackType
from typing import Any

from asyncflow import clock, views
from asyncflow.collector import Collector
from asyncflow.config import Options, resolve_options
from asyncflow.errors import AsyncflowError
from asyncflow.instrument import _session, channels, streams
from asyncflow.instrument.futures import reset_for_session
from asyncflow.report import render
from asyncflow.schema import Snapshot
from asyncflow.server import Server, is_loopback

__all__ = ["Profiler", "active_profiler", "profile", "start", "stop"]

_STARTUP_TIMEOUT = 10.0
_lock = threading.Lock()
_active: Profiler | None = None
_epochs = itertools.count(1)


class Profiler:
    """One profiling session. Create it with :func:`profile` or :func:`start`."""

    def __init__(self, options: Options) -> None:
        self.options = options
        #: the endpoint's address while it serves ("http://127.0.0.1:6780"); None otherwise
        self.url: str | None = None
        self._state = "new"  # new -> running -> stopped
        self._state_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._collector: Collector | None = None
        self._server: Server | None = None
        self._final: Snapshot | None = None
        #: set by ``asyncflow run``: profilers the program starts itself join this one
        self.hosting = False
        self._joined: Profiler | None = None

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

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> Profiler:
        """Start recording; see :func:`start`."""
        global _active
        with _lock:
            if _active is not None and _active.hosting and self._state == "new":
                # The program runs under `asyncflow run`: its own profiler joins that one, so
                # it neither fails nor reports twice; snapshots and url are the host's.
                self._joined, self._state, self.url = _active, "joined", _active.url
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
            if options.port is not None and options.token is None and not is_loopback(options.host):
                raise AsyncflowError(
                    f"refusing to serve on {options.host!r} without a token: anyone who can "
                    "reach it could read this program's profile; pass token= (or set "
                    "ASYNCFLOW_TOKEN), or bind to 127.0.0.1"
                )
            reset_for_session()
            channels.reset_for_session()
            streams.reset_for_session()
            session = _session.Session(next(_epochs), clock.now_ns(), options.sampling)
            self._collector = Collector(session, self.options)
            ready = threading.Event()
            failure: list[BaseException] = []
            self._thread = threading.Thread(
                target=self._run,
                args=(ready, failure),
                name=f"asyncflow-profiler[{self.name}]",
                daemon=True,  # a profiler must never keep a finished program alive
            )
            self._thread.start()
            if not ready.wait(_STARTUP_TIMEOUT) or failure:
                self._thread.join(_STARTUP_TIMEOUT)
                self._thread = self._loop = self._collector = self._server = None
                if failure and isinstance(failure[0], AsyncflowError):
                    raise failure[0]
                reason = f": {failure[0]!r}" if failure else " in time"
                raise AsyncflowError(f"the profiler thread could not start{reason}")
            self._state = "running"
            _session.active = session
            _active = self
        atexit.register(self.stop)
        return self

    def _run(self, ready: threading.Event, failure: list[BaseException]) -> None:
        loop = asyncio.new_event_loop()
        tasks: list[asyncio.Task[None]] = []
        try:
            self._loop = loop
            collector = self._collector
            assert collector is not None
            options = self.options
            if options.port is not None:
                self._server = Server(
                    collector, options.host, options.port, options.token, lambda: self.running
                )
                self.url = loop.run_until_complete(self._server.start())
            tasks.append(loop.create_task(collector.run()))
            tasks.append(loop.create_task(collector.monitor.run()))
            if options.duration is not None:
                loop.call_later(options.duration, self._expire)
        except BaseException as exc:
            failure.append(exc)
            self.url = None
            self._shut(loop, tasks)
            ready.set()
            return
        ready.set()
        try:
            loop.run_forever()
        finally:
            self._shut(loop, tasks)

    def _shut(self, loop: asyncio.AbstractEventLoop, tasks: list[asyncio.Task[None]]) -> None:
        async def shut() -> None:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self._server is not None:
                await self._server.stop()

        try:
            loop.run_until_complete(shut())
        finally:
            loop.close()

    def _expire(self) -> None:
        # ``duration`` ran out: stop from another thread, since stop() joins this one.
        threading.Thread(target=self.stop, name="asyncflow-stop", daemon=True).start()

    def stop(self) -> Snapshot | None:
        """Stop recording, write the exit report, and return the final snapshot.

        Idempotent: stopping a stopped profiler does nothing and returns its final snapshot.
        Instrumented coroutines and tasks keep working afterwards; they just stop recording.
        """
        global _active
        with self._state_lock:
            if self._joined is not None:
                if self._state == "joined":
                    self._state = "stopped"
                    self.url = None
                    self._final = self._joined.snapshot()
                return self._final
            if self._state != "running":
                return self._final
            self._state = "stopping"
        with _lock:
            if _active is self:
                _active = None
        try:
            self._final = self._call(self._final_snapshot)
        finally:
            loop, thread = self._loop, self._thread
            if loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(loop.stop)
            if thread is not None and thread is not threading.current_thread():
                thread.join(_STARTUP_TIMEOUT)
            self._state = "stopped"
            self.url = None
            atexit.unregister(self.stop)
        self._report(self._final)
        return self._final

    def _final_snapshot(self) -> Snapshot:
        collector = self._collector
        assert collector is not None
        if _session.active is collector.session:
            _session.active = None  # calls created from now on are not recorded
        collector.monitor.stop()
        collector.drain()
        return views.snapshot(collector, running=False)

    def _report(self, snapshot: Snapshot) -> None:
        options = self.options
        try:
            if options.reporter is not None:
                options.reporter.report(snapshot)
                return
            if options.format == "none":
                return
            text = render(snapshot, options.format, options.percentiles, options.limit)
            if options.output is None:
                sys.stderr.write(text)
                sys.stderr.flush()
            else:
                with open(options.output, "w", encoding="utf-8") as out:
                    out.write(text)
        except Exception as exc:  # a report that cannot be written must not break the program
            _session.internal_error("writing the exit report", exc)

    # -- queries -----------------------------------------------------------------------------

    def _call(self, fn: Any) -> Any:
        """Run ``fn()`` on the profiler's thread (where the collector's state lives)."""
        loop, thread = self._loop, self._thread
        if thread is threading.current_thread() or loop is None or loop.is_closed():
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
            AsyncflowError: the profiler was never started.
        """
        if self._state == "new":
            raise AsyncflowError(f"profiler {self.name!r} has not been started")
        if self._final is not None:
            return self._final
        if self._joined is not None:
            return self._joined.snapshot()
        collector = self._collector
        assert collector is not None

        def take() -> Snapshot:
            collector.drain()
            return views.snapshot(collector, running=self.running)

        result: Snapshot = self._call(take)
        return result

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
        **options: keyword-only options (``percentiles``, ``limit``, ``format``, ``output``,
            ``recent_logs``, ``reporter``, ``duration``, ``host``, ``port``, ``token``,
            ``block_threshold``), each also settable by an ``ASYNCFLOW_*`` environment
            variable; see the README.

    Raises:
        ValueError: an option has a bad value (checked here, before anything starts).
        TypeError: an unknown option was passed.
    """
    return Profiler(resolve_options(name, options))


def start(name: str, **options: Any) -> Profiler:
    """Start a profiler now; :func:`stop` ends it. Same options as :func:`profile`.

    Raises:
        AsyncflowError: a profiler is already running in this process, the port is taken, or
            a non-loopback host was given without a token.
    """
    return profile(name, **options).start()


def stop() -> Snapshot | None:
    """Stop the running profiler, if any, and return its final snapshot (None if none ran).

    Under ``asyncflow run`` the profiler belongs to the command, not to the program: stopping
    it here would end the profile early, so this returns a snapshot and leaves it running.
    """
    profiler = _active
    if profiler is not None and profiler.hosting:
        return profiler.snapshot()
    return profiler.stop() if profiler is not None else None


def active_profiler() -> Profiler | None:
    """The profiler running in this process, if any."""
    return _active
