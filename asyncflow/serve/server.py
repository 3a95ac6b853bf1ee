"""The endpoint: its route table, the documents it builds, and the program's side of serving.

Two halves, usually in two processes. The *documents* are built in the profiled program, on the
profiler's own thread, from the collector's state (:class:`Server`): the application's loop never
runs a line of it, so the endpoint answers while that loop is blocked. The *HTTP side* (parsing,
``Host``/``Origin`` and token checks, deadlines, the connection cap, the response cache) runs in a
helper process started with the endpoint (``python asyncflow/serve/_endpoint.py``, ready by the time
a client that connects at once would have imported aiohttp itself), which asks the program over a
socket pair only for documents its cache does not hold. The program's thread thus
wakes at most once per distinct request per cache window, with one read and one write, instead of
several GIL hand-offs per request: the program keeps its speed while clients poll. Where no helper
process can run (no ``fork``/``exec`` with descriptor passing, no ``sys.executable``, or it keeps
failing to start), the same HTTP side runs on the profiler's thread instead. The HTTP side is
:mod:`asyncflow.serve._http`, the only module of the endpoint that imports aiohttp: a program
served by the helper process never loads it.

The endpoint lives beside the observed program, so it must never be turned against it: it
answers only requests whose ``Host`` names the address it serves and refuses cross-origin
browser requests (DNS rebinding), times out idle and half-sent connections and caps how many it
holds (file descriptors), parses its parameters canonically and within bounds, keeps a bounded
cache keyed by the parsed request, and answers every error, the HTTP parser's own included, as
``{"error": {"status": ..., "message": ...}}``. Its own troubles go to the ``asyncflow`` logger
at debug level, never as tracebacks on the program's standard error.

Adding a route: a :class:`~asyncflow.serve.openapi.Route` line in ``ROUTES`` (with ``media_type=``
when it is not JSON) and a builder method on :class:`Server` decorated with ``@_builds(path)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any, TypeVar, cast

import orjson

from asyncflow import clock, config, schema
from asyncflow.errors import TRACE_OFF, AsyncflowError
from asyncflow.instrumentation import _session
from asyncflow.model import read
from asyncflow.model.collector import Collector
from asyncflow.model.threads import threads_document
from asyncflow.serve._protocol import (
    _JSON,
    _LENGTH,
    DEFAULT_LOGS,
    DEFAULT_PAGE,
    MAX_ID,
    MAX_OFFSET,
    MAX_PAGE,
    ROUTES,
    Limits,
    _Answer,
    _error_body,
    _FrontConfig,
    _message,
    _Query,
    _Refused,
    _safe,
    _shown,
    logger,
)
from asyncflow.views import documents as views
from asyncflow.views import function_views, resource_views, wait_views

if TYPE_CHECKING:
    from asyncflow.render.trace import TraceRecorder
    from asyncflow.serve import _http

__all__ = [
    "DEFAULT_LOGS",
    "DEFAULT_PAGE",
    "LIMITS",
    "MAX_ID",
    "MAX_OFFSET",
    "MAX_PAGE",
    "ROUTES",
    "Limits",
    "Server",
    "is_loopback",
]


#: the limits every new server takes (tests replace it with small values)
LIMITS = Limits()
#: entries each log of ``/snapshot`` holds at most, the newest (a future's: its oldest live
#: calls first; ``/futures/{id}/logs`` pages them all): 100,000 live calls of one future made
#: a 56 MB snapshot, built in 16 s, and 10,000 entries still took 0.2-0.3 s of its second
SNAPSHOT_LOGS = 1_000

#: path -> name of the :class:`Server` method that builds its document (see ``_builds``)
_BUILDERS: dict[str, str] = {}
_F = TypeVar("_F", bound=Callable[..., Any])


def _builds(path: str) -> Callable[[_F], _F]:
    """Mark a :class:`Server` method as the builder of ``path``'s document."""

    def mark(method: _F) -> _F:
        _BUILDERS[path] = method.__name__
        return method

    return mark


def is_loopback(host: str) -> bool:
    """Whether binding to ``host`` serves this machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:  # an IPv4 address in a short form the system takes (127.1 is 127.0.0.1)
        return ipaddress.ip_address(socket.inet_aton(host)).is_loopback
    except OSError:
        return False


class _RemoteError(Exception):
    """An internal error of the endpoint process, counted in the program."""


#: The intermediate: run as ``python -I -S -c _DETACH COMMAND...``, it forks the endpoint process,
#: writes its pid on its standard output and exits at once; the endpoint process leaves the
#: program's session and runs COMMAND. Its parent is then init (or a subreaper), never the program.
_DETACH = (
    "import os, sys\n"
    "pid = os.fork()\n"
    "if pid:\n"
    "    os.write(1, str(pid).encode())\n"
    "    os._exit(0)\n"
    "os.setsid()\n"
    "null = os.open(os.devnull, os.O_WRONLY)\n"
    "os.dup2(null, 1)\n"
    "os.close(null)\n"
    "os.execv(sys.argv[1], sys.argv[1:])\n"
)


#: The same in a shell, where the system has one and setsid(1): run as ``sh -c _DETACH_SH
#: asyncflow-endpoint SETSID COMMAND...``, it starts the endpoint process in the background (in
#: the intermediate's process group, which it does not lead, so setsid(1) does not fork again)
#: and writes its pid. A shell starts in a millisecond or two where a Python took 10-140 ms,
#: all of it before the endpoint process could begin to start.
_DETACH_SH = '"$@" >/dev/null & printf %s "$!"'
_SHELL = "/bin/sh" if os.path.exists("/bin/sh") else None
_SETSID = shutil.which("setsid") if _SHELL is not None else None


def _intermediate(command: list[str]) -> list[str]:
    """The command that starts ``command`` as the endpoint process, detached (see above)."""
    if _SHELL is not None and _SETSID is not None:
        return [_SHELL, "-c", _DETACH_SH, "asyncflow-endpoint", _SETSID, *command]
    return [sys.executable, "-I", "-S", "-c", _DETACH, *command]


class _Detached:
    """An endpoint process, which is not the program's child: the program's ``os.wait()``,
    ``waitpid(-1, ...)``, SIGCHLD handlers and reapers never meet it. Known by its pid (None when
    it never started) and a pidfd where the system has them; its exit status is not ours to read.
    """

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self._fd: int | None = None
        if pid is not None and hasattr(os, "pidfd_open"):
            try:
                self._fd = os.pidfd_open(pid)  # at once: from now on the pid cannot be reused
            except ProcessLookupError:
                self.pid = None  # already gone

    def end(self, seconds: float) -> bool:
        """Kill it (it has closed its end, or must) and wait up to ``seconds`` for it to go;
        whether it has gone (True where there is no pidfd to wait on)."""
        fd, self._fd = self._fd, None
        if fd is None:
            if self.pid is not None and not hasattr(os, "pidfd_open"):
                with contextlib.suppress(OSError):
                    os.kill(self.pid, signal.SIGKILL)
            return True
        try:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            return bool(select.select([fd], [], [], seconds)[0])
        finally:
            os.close(fd)

    def forsake(self) -> None:
        """In a forked child of the program: never killed or waited for from here."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


class _ChildLink(asyncio.Protocol):
    """The program's end of the socket pair to one endpoint process: answers its requests on
    the profiler's thread, all those of one read in one write."""

    def __init__(
        self,
        server: Server,
        sock: socket.socket,
        process: _Detached,
        errors: IO[bytes],
    ) -> None:
        self.server = server
        self.sock = sock
        self.process = process
        self.errors = errors
        self.ready = False
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        config = self.server.front_config
        assert config is not None
        wire = config.wire()
        transport.write(_LENGTH.pack(len(wire)) + wire)  # the process's first message

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        replies: list[bytes] = []
        try:
            while len(buffer) >= 4:
                (size,) = _LENGTH.unpack_from(buffer)
                if len(buffer) < 4 + size:
                    break
                message = orjson.loads(bytes(buffer[4 : 4 + size]))
                del buffer[: 4 + size]
                kind = message[0]
                if kind == "ask":
                    number, path, ident, params = message[1:]
                    query = _Query(path, ident, tuple((str(k), int(v)) for k, v in params))
                    answer = self.server.answer(query)
                    head = [number, answer.status, answer.media_type, answer.fresh_ns]
                    replies += [_message([*head, len(answer.body)]), answer.body]
                elif kind == "ready":
                    self.ready = True
                    self.server.failures = 0
                elif kind == "error":
                    where, text = message[1:]
                    _session.internal_error(f"the endpoint process: {where}", _RemoteError(text))
        except Exception as exc:  # a bug in asyncflow: count it; the process starts afresh
            _session.internal_error("talking to the endpoint process", exc)
            if self.transport is not None:
                self.transport.abort()
            return
        if replies and self.transport is not None:
            self.transport.writelines(replies)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.server.child_gone(self)


# -- the program's side -------------------------------------------------------------------------

#: after this many endpoint processes in a row die before serving, serve on the profiler's thread
_START_FAILURES = 3
#: whether HTTP is served from a helper process (tests set it False for the in-process mode)
PROCESS = os.name == "posix" and bool(sys.executable)
#: the endpoint process's script
_ENDPOINT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_endpoint.py")
_servers: weakref.WeakSet[Server] = weakref.WeakSet()


class Server:
    """Builds the collector's documents and serves them; start and stop it on the profiler's
    loop. HTTP is served by an endpoint process, started with it (and again at the next
    connection after one exits)."""

    def __init__(
        self, collector: Collector, host: str, port: int, token: str | None, running: Any
    ) -> None:
        self.collector = collector
        #: the trace recorder that ``/trace`` serves (the profiler sets it); None: no trace
        self.trace: TraceRecorder | None = None
        self.host = host
        self.port = port
        self.token = token
        self.limits = LIMITS
        self._running: Callable[[], bool] = running
        self._listener: asyncio.Server | None = None
        #: the address served, once started
        self.url: str | None = None
        #: what the HTTP side is told, once started
        self.front_config: _FrontConfig | None = None
        #: the HTTP side, when it runs on the profiler's thread
        self.front: _http._Front | None = None
        #: the link to the endpoint process, while one runs
        self.link: _ChildLink | None = None
        #: documents built (each answer to the HTTP side is one), and the profiler thread's CPU
        #: time they took, in nanoseconds (the GIL is held meanwhile: the program's cost)
        self.builds = 0
        self.build_ns = 0
        #: endpoint processes started, and how many in a row died before serving
        self.started = 0
        self.failures = 0
        self._armed: list[int] = []
        #: the program's end of the socket pair to an endpoint process being started
        self._spawning: socket.socket | None = None
        self._stopping = False
        self._window_ns = int(self.limits.cache_seconds * 1e9)
        #: the live tasks as read lately, and until when (this clock) they serve /tasks (any
        #: page), /graph and /snapshot: one reading for all of them
        self._tasks_read: tuple[int, wait_views.TaskReading] | None = None
        #: readings of the tasks made (each walks them on their loops, in slices)
        self.readings = 0
        #: until when the document just built may be served (a reading's time), 0: its own
        self._held_until = 0
        _servers.add(self)

    # -- answers ----------------------------------------------------------------------------

    def answer(self, query: _Query) -> _Answer:
        """Build the document ``query`` asks for (on the profiler's thread)."""
        route = _ROUTE_BY_PATH.get(query.path)
        name = _BUILDERS.get(query.path)
        window = self._window_ns
        self.builds += 1
        if route is None or name is None:
            return _Answer(
                404, _JSON, _error_body(404, f"no route {_shown(query.path, 80)}"), window
            )
        started = time.thread_time_ns()
        self._held_until = 0
        try:
            self.collector.drain()  # before building any document (work the next tick spares)
            started = time.thread_time_ns()
            built = getattr(self, name)(query)
            if isinstance(built, str):  # its text is fit for UTF-8 already (fit_text)
                body = built.encode("utf-8", "backslashreplace")
            elif isinstance(built, bytes | bytearray | memoryview):
                body = bytes(built)
            else:
                body = schema.dumps(built)
            fresh = max(self._fresh(started), self._held_until - clock.now_ns())
            return _Answer(200, route.media_type, body, fresh)
        except _Refused as refused:
            return _Answer(
                refused.status, _JSON, _error_body(refused.status, refused.message), window
            )
        except Exception as exc:  # a bug in asyncflow: say so, count it, keep serving
            _session.internal_error(f"serving {_shown(query.path, 80)}", exc)
            message = f"internal error in asyncflow: {type(exc).__name__}: {_safe(exc)}"
            return _Answer(500, _JSON, _error_body(500, message))
        finally:
            self.build_ns += time.thread_time_ns() - started

    def _fresh(self, started: int) -> int:
        """How long a document built since ``started`` (this thread's CPU clock) is served: the
        GIL is held while it is built, so the program waits; a costly document is rebuilt less
        often, for at most ``cache_cost_share`` of the program's time."""
        return self._kept(time.thread_time_ns() - started)

    def _reading(self) -> wait_views.TaskReading:
        """The live tasks as read lately, or read now: a reading serves every document built
        while it is fresh, which is as long as a document that took what it took (the loops'
        time in its slices and this thread's) is served (see :meth:`_fresh`)."""
        now = clock.now_ns()
        held = self._tasks_read
        if held is None or now >= held[0]:
            responsive = wait_views.responsive_loops(self.collector.monitor, now)
            reading = wait_views.read_tasks(responsive)
            self.readings += 1
            held = self._tasks_read = (clock.now_ns() + self._kept(reading.spent_ns), reading)
        self._held_until = max(self._held_until, held[0])
        return held[1]

    def _kept(self, cost_ns: int) -> int:
        limits = self.limits
        if limits.cache_cost_share <= 0:
            return self._window_ns
        stretched = min(
            int(cost_ns / limits.cache_cost_share), int(limits.cache_most_seconds * 1e9)
        )
        return max(self._window_ns, stretched)

    async def _answer_here(self, query: _Query) -> _Answer:
        return self.answer(query)

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> str:
        """Bind and listen; returns the URL. Connections wait in the backlog until the endpoint
        process, started as soon as this returns, accepts them.

        Raises:
            AsyncflowError: the port is taken or the address cannot be bound, or
                ``allowed_hosts`` has "*" and there is no token; nothing is left serving.
        """
        allowed = getattr(self.collector.options, "allowed_hosts", ())
        if "*" in allowed and self.token is None:
            # Any Host answered and no token: a web page that rebinds its own name to this
            # address (DNS rebinding) could read the profile; the token is then the defence.
            raise AsyncflowError(
                "refusing allowed_hosts='*' without a token: any web page that points its name "
                "at this machine could read this program's profile; pass token= (or set "
                "ASYNCFLOW_TOKEN), or name the hosts allowed_hosts= accepts"
            )
        loop = asyncio.get_running_loop()
        if loop.get_exception_handler() is None:
            loop.set_exception_handler(_loop_error)
        try:
            listener = await loop.create_server(
                self._accept, self.host, self.port, backlog=128, start_serving=False
            )
        except OSError as exc:
            if exc.errno in (98, 48, 10048):  # EADDRINUSE on Linux, macOS, Windows
                raise AsyncflowError(
                    f"port {self.port} on {self.host} is already in use; pass port= another "
                    "port (or port=0 for any free one), or set ASYNCFLOW_PORT"
                ) from None
            raise AsyncflowError(
                f"cannot serve on {self.host}:{self.port}: {exc.strerror or exc}; pass another "
                "host= or port= (or set ASYNCFLOW_HOST / ASYNCFLOW_PORT)"
            ) from None
        self._listener = listener
        for sock in listener.sockets:  # from now on connections wait in the backlog
            _listen(sock.fileno())
        host, port = listener.sockets[0].getsockname()[:2]
        self.url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        names = {"localhost", *(name.lower().strip("[]") for name in allowed)}
        bound = self.host.lower().strip("[]")
        if bound not in ("0.0.0.0", "::", ""):  # a wildcard is no name a client uses
            names.add(bound)
        self.front_config = _FrontConfig(
            self.url, port, tuple(sorted(names)), "*" in allowed, self.token, self.limits
        )
        if PROCESS and config.endpoint_process():
            # Started now, not at the first connection: a client that connects at once (a short
            # program's, `asyncflow top`) is answered once the process has imported aiohttp,
            # instead of after the process start on top. And before the profiler's start()
            # returns, while the program waits for it: a program that computes on its loop and
            # yields every fraction of a millisecond drops and takes the GIL back so often that
            # this thread, waiting for it after each of the start's system calls, rarely wins
            # (started a moment after start() returned, it took 7 s and no client was answered).
            self._start_process()
        else:
            await self._serve_here()
        return self.url

    def _accept(self) -> asyncio.Protocol:
        assert self.front is not None
        return self.front.accept()

    async def _serve_here(self) -> None:
        """Serve HTTP on the profiler's thread (where no endpoint process can run)."""
        assert self.front_config is not None and self._listener is not None
        from asyncflow.serve import (
            _http,  # aiohttp: loaded only where the program serves HTTP itself
        )

        front = _http._Front(self.front_config, self._answer_here, _session.internal_error)
        await front.setup()
        self.front = front
        await self._listener.start_serving()

    def _arm(self) -> None:
        """Start an endpoint process when the next connection arrives."""
        if self._stopping or self._listener is None:
            return
        loop = asyncio.get_running_loop()
        for sock in self._listener.sockets:
            fd = sock.fileno()
            loop.add_reader(fd, self._connection_waits)
            self._armed.append(fd)

    def _disarm(self) -> None:
        loop = asyncio.get_running_loop()
        for fd in self._armed:
            loop.remove_reader(fd)
        self._armed.clear()

    def _start_process(self) -> None:
        if not self._stopping and self._listener is not None and self.link is None:
            self._connection_waits()

    def _connection_waits(self) -> None:
        self._disarm()
        try:
            self._spawn()
        except Exception as exc:
            self.failures += 1
            _session.internal_error("starting the endpoint process", exc)
            self._fall_back(f"it could not start: {type(exc).__name__}: {_safe(exc)}")

    def _spawn(self) -> None:
        assert self._listener is not None and self.front_config is not None
        loop = asyncio.get_running_loop()
        fds = [sock.fileno() for sock in self._listener.sockets]
        ours, theirs = socket.socketpair()
        self._spawning = ours  # a fork meanwhile (a pre-fork server's workers): see forsake
        errors = tempfile.TemporaryFile()  # noqa: SIM115 (its stderr, kept open while it runs)
        try:
            with contextlib.suppress(OSError):  # fewer wakes for a large document
                ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
            # the folder that holds the asyncflow package (this module is in asyncflow/serve/)
            root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
            # Its script, not `-m asyncflow.serve._endpoint`: the package's front door (the
            # profiler, the options, the hot path) is not loaded there (see _endpoint.py).
            command = [sys.executable, "-P", _ENDPOINT]
            command += [str(theirs.fileno()), *map(str, fds)]
            # Through an intermediate that exits at once, reaped here at once: the endpoint
            # process is no child of the program, whose generic reaping must never meet it.
            intermediate = subprocess.Popen(
                _intermediate(command),
                pass_fds=(theirs.fileno(), *fds),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=errors,
                env=env,
                process_group=0,  # the terminal's Ctrl-C and Ctrl-Z are the program's, not its
            )
            try:
                # A program that reaps its children may reap it first: Popen takes that (ECHILD)
                # as an exit with code 0, and its output is read all the same.
                said, _ = intermediate.communicate(timeout=10.0)
            except subprocess.TimeoutExpired:
                intermediate.kill()
                intermediate.wait()
                raise
            text = said.decode("ascii", "replace").strip()
            # No pid: it failed, said why on its stderr; the socket pair's end tells the rest.
            process = _Detached(int(text) if text.isdigit() else None)
        except BaseException:
            self._spawning = None
            ours.close()
            errors.close()
            raise
        finally:
            theirs.close()
        self.started += 1
        logger.debug("endpoint: process %s serves %s", process.pid, self.url)
        link = _ChildLink(self, ours, process, errors)
        self.link = link
        self._spawning = None  # (after: a fork between the two finds it in one or the other)
        connecting = loop.create_task(loop.connect_accepted_socket(lambda: link, ours))
        connecting.add_done_callback(self._connected)

    def _connected(self, task: asyncio.Future[Any]) -> None:
        if not self._stopping:
            _log_failure(task)
        elif not task.cancelled():
            task.exception()  # stopped before it was connected: its socket is closed, as meant

    def child_gone(self, link: _ChildLink) -> None:
        """The endpoint process closed its end: it exited, or was stopped."""
        if self.link is link:
            self.link = None
        process = link.process
        process.end(2.0)  # it has closed its end: it is exiting, or must
        tail = _tail(link.errors)
        link.errors.close()
        if self._stopping:
            return
        if link.ready:
            self.failures = 0
            logger.warning(
                "asyncflow: the endpoint's process (pid %s) exited; another starts at the "
                "next connection to %s%s", process.pid, self.url, tail,
            )  # fmt: skip
            self._arm()
            return
        self.failures += 1
        if self.failures >= _START_FAILURES:
            self._fall_back(f"it exited before serving, {self.failures} times{tail}")
        else:
            logger.debug("endpoint: process %s exited before serving%s", process.pid, tail)
            self._arm()

    def _fall_back(self, why: str) -> None:
        if self._stopping or self.front is not None:
            return
        logger.error(
            "asyncflow: the endpoint's process cannot serve %s (%s); serving it from the "
            "profiler's thread instead, where it slows the program while clients poll",
            self.url, why,
        )  # fmt: skip
        task = asyncio.get_running_loop().create_task(self._serve_here())
        task.add_done_callback(_log_failure)

    async def stop(self) -> None:
        """Stop the endpoint process, close every connection and stop listening."""
        self._stopping = True
        self._disarm()
        link = self.link
        if link is not None:
            # The process reads the end of its input and exits; it is killed besides, since
            # nothing it holds is worth waiting for.
            if link.transport is not None:
                link.transport.abort()
            else:
                link.sock.close()
            self.child_gone(link)
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        front, self.front = self.front, None
        if front is not None:
            await front.stop()
        if listener is not None:
            try:
                await asyncio.wait_for(listener.wait_closed(), 1.0)
            except TimeoutError:
                logger.debug("endpoint: connections still closing at stop")

    def forsake(self) -> None:
        """In a forked child of the program: the endpoint process is not this process's."""
        link, self.link = self.link, None
        self._stopping = True
        if link is not None:
            link.process.forsake()  # never killed or waited for here
        for sock in (link.sock if link is not None else None, self._spawning):
            fd = sock.fileno() if sock is not None else -1
            if fd >= 0:
                # Its end of the socket pair must not keep the process alive once the program
                # has gone: point the descriptor elsewhere (the socket object closes it one day).
                null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
                try:
                    os.dup2(null, fd, inheritable=False)
                finally:
                    os.close(null)

    # -- builders: each returns a document of asyncflow.schema ----------------------------------

    @_builds("/profiler_status")
    def _status(self, query: _Query) -> Any:
        return views.status(self.collector, clock.now_ns(), self._running())

    @_builds("/futures")
    def _futures(self, query: _Query) -> Any:
        return views.futures_document(self.collector, clock.now_ns(), query.offset, query.limit)

    @_builds("/futures/{id}/logs")
    def _future_logs(self, query: _Query) -> Any:
        record = _record(query, "future", read.future(query.id))
        origin = self.collector.session.start_ns
        return views.future_logs(record, clock.now_ns(), origin, query.limit)

    @_builds("/channels")
    def _channels(self, query: _Query) -> Any:
        return views.channels_document(self.collector, query.offset, query.limit)

    @_builds("/channels/{id}/logs")
    def _channel_logs(self, query: _Query) -> Any:
        record = _record(query, "channel", read.channel(query.id))
        return views.channel_logs(record, self.collector.session.start_ns, query.limit)

    @_builds("/streams")
    def _streams(self, query: _Query) -> Any:
        return views.streams_document(self.collector, query.offset, query.limit)

    @_builds("/streams/{id}/logs")
    def _stream_logs(self, query: _Query) -> Any:
        record = _record(query, "stream", read.stream(query.id))
        return views.stream_logs(record, self.collector.session.start_ns, query.limit)

    @_builds("/flow")
    def _flow(self, query: _Query) -> Any:
        return views.flow(self.collector)

    @_builds("/loop")
    def _loop(self, query: _Query) -> Any:
        return views.loop_document(self.collector, clock.now_ns())

    @_builds("/warnings")
    def _warnings(self, query: _Query) -> Any:
        return views.warnings_document(self.collector)

    @_builds("/tasks")
    def _tasks(self, query: _Query) -> Any:
        return self._reading().tasks_json(query.offset, query.limit)  # JSON as it is

    @_builds("/graph")
    def _graph(self, query: _Query) -> Any:
        return views.wait_for_graph(self.collector, self._reading())

    @_builds("/resources")
    def _resources(self, query: _Query) -> Any:
        now = clock.now_ns()
        return resource_views.resources_document(self.collector, now, query.offset, query.limit)

    @_builds("/resources/{id}/logs")
    def _resource_logs(self, query: _Query) -> Any:
        record = resource_views.find_resource(query.id or 0)
        if record is None:
            raise _Refused(404, f"no resource with id {query.id}; GET /resources lists them")
        origin = self.collector.session.start_ns
        return resource_views.resource_logs(record, origin, query.limit)

    @_builds("/executors")
    def _executors(self, query: _Query) -> Any:
        percentiles = self.collector.options.percentiles
        return wait_views.executors_document(percentiles, self.collector.futures())

    @_builds("/threads")
    def _threads(self, query: _Query) -> Any:
        collector = self.collector
        return threads_document(collector.threads, clock.now_ns(), collector.session.start_ns)

    @_builds("/functions")
    def _functions(self, query: _Query) -> Any:
        now = clock.now_ns()
        return function_views.functions_document(self.collector, now, query.offset, query.limit)

    @_builds("/user_metrics")
    def _user_metrics(self, query: _Query) -> Any:
        now = clock.now_ns()
        return function_views.metrics_document(self.collector, now, query.offset, query.limit)

    @_builds("/snapshot")
    def _snapshot(self, query: _Query) -> Any:
        running = self._running()
        return views.snapshot(self.collector, running, None, SNAPSHOT_LOGS, self._reading())

    @_builds("/trace")
    def _trace(self, query: _Query) -> Any:
        recorder = self.trace
        if recorder is None:
            raise _Refused(404, TRACE_OFF)
        return recorder.data()  # bytes: sent as they are

    @_builds("/metrics")
    def _metrics(self, query: _Query) -> Any:
        from asyncflow.render import prometheus, reporters

        figures = reporters.figures(self.collector, self._running())
        return prometheus.render(figures, ids=self.collector.options.metric_ids)


def _listen(fd: int) -> None:
    sock = socket.socket(fileno=fd)
    try:
        sock.listen(128)
    finally:
        sock.detach()


def _tail(errors: IO[bytes]) -> str:
    """The end of what an endpoint process wrote on its standard error, to quote in a log."""
    try:
        size = errors.seek(0, os.SEEK_END)
        errors.seek(max(0, size - 2000))
        text = errors.read().decode("utf-8", "replace").strip()
    except (OSError, ValueError):
        return ""
    return f"; it said: {text}" if text else ""


def _log_failure(task: asyncio.Future[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        _session.internal_error("the endpoint", cast(BaseException, task.exception()))


def _after_fork_in_child() -> None:
    for server in list(_servers):
        try:
            server.forsake()
        except Exception as exc:  # the child must go on, whatever happens here
            _session.internal_error("forsaking the endpoint in a forked child", exc)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _loop_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The profiler loop's exception handler: to the ``asyncflow`` logger, not to stderr."""
    exc = context.get("exception")
    if isinstance(exc, OSError | asyncio.CancelledError) or exc is None:
        logger.debug("endpoint: %s", context.get("message"), exc_info=exc)
    else:
        _session.internal_error(str(context.get("message", "the profiler's loop")), exc)


_R = TypeVar("_R")


def _record(query: _Query, kind: str, record: _R | None) -> _R:
    """The record a ``/{kind}s/{id}/logs`` request names, as the read model found it."""
    if record is None:
        raise _Refused(404, f"no {kind} with id {query.id}; GET /{kind}s lists them")
    return record


_ROUTE_BY_PATH = {route.path: route for route in ROUTES}
