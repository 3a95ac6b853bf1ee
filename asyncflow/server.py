"""The JSON endpoint: an aiohttp application on the profiler's own thread and event loop.

Every document is built here, on the profiler's thread, from the collector's state; the
application's loop never runs a line of it, so the endpoint answers while that loop is blocked.

The endpoint lives inside the observed program, so it must never be turned against it: it
answers only requests whose ``Host`` names the address it serves and refuses cross-origin
browser requests (DNS rebinding), times out idle and half-sent connections and caps how many it
holds (file descriptors), parses its parameters canonically and within bounds, keeps a bounded
cache keyed by the parsed request, and answers every error, the HTTP parser's own included, as
``{"error": {"status": ..., "message": ...}}``. Its own troubles go to the ``asyncflow`` logger
at debug level, never as tracebacks on the program's standard error.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import re
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, TypeVar, cast

from aiohttp import web

from asyncflow import clock, openapi, resource_views, schema, views, wait_views
from asyncflow.collector import Collector
from asyncflow.errors import AsyncflowError
from asyncflow.instrument import _session
from asyncflow.instrument.channels import ChannelRecord, channel_registry
from asyncflow.instrument.futures import FutureRecord, registry
from asyncflow.instrument.streams import StreamRecord, stream_registry
from asyncflow.openapi import Param, Route
from asyncflow.threads import threads_document

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

#: Entries a list returns without ``?limit=``, and the most any ``?limit=`` may ask for.
DEFAULT_PAGE = 1000
#: Log entries returned without ``?limit=``.
DEFAULT_LOGS = 100
MAX_PAGE = 10_000
#: The largest ``?offset=`` and id accepted: far beyond any list, and never near an overflow.
MAX_OFFSET = 1_000_000_000
MAX_ID = 1_000_000_000
_CACHE_NS = 100_000_000

logger = logging.getLogger("asyncflow")


@dataclass(frozen=True, slots=True)
class Limits:
    """What the endpoint allows one connection, and all of them together."""

    #: seconds a connection has to send a whole request's headers, from its opening or from
    #: the previous response: idle keep-alive connections and half-sent requests close then
    header_timeout: float = 5.0
    #: seconds to build and write one response before the connection is closed
    response_timeout: float = 30.0
    #: connections held at once; more are answered 503 and closed at once
    max_connections: int = 64
    #: cached documents, and their total size in bytes
    cache_entries: int = 64
    cache_bytes: int = 32 * 1024 * 1024


#: the limits every new server takes (tests replace it with small values)
LIMITS = Limits()

_LIMIT = Param("limit", "query", "Most entries to return.", MAX_PAGE, DEFAULT_PAGE)
_LOG_LIMIT = Param("limit", "query", "Most log entries to return.", MAX_PAGE, DEFAULT_LOGS)
_OFFSET = Param("offset", "query", "Entries to skip, in the list's order.", MAX_OFFSET, 0)
_PAGED = (_LIMIT, _OFFSET)


def _id(kind: str) -> Param:
    return Param("id", "path", f"The {kind}'s id, as its list gives it.", MAX_ID)


ROUTES: tuple[Route, ...] = (
    Route("/profiler_status", "The profiler's own health and counts.", schema.ProfilerStatus),
    Route("/futures", "Every future, most busy first.", schema.FuturesDocument, _PAGED),
    Route(
        "/futures/{id}/logs",
        "A future's unfinished calls, then its recent finished calls, newest first.",
        schema.FutureLogs,
        (_id("future"), _LOG_LIMIT),
    ),
    Route("/channels", "Every channel, most messages first.", schema.ChannelsDocument, _PAGED),
    Route(
        "/channels/{id}/logs",
        "A channel's recent sends and receives, newest first.",
        schema.ChannelLogs,
        (_id("channel"), _LOG_LIMIT),
    ),
    Route("/streams", "Every stream, most items first.", schema.StreamsDocument, _PAGED),
    Route(
        "/streams/{id}/logs",
        "A stream's recent items, newest first.",
        schema.StreamLogs,
        (_id("stream"), _LOG_LIMIT),
    ),
    Route("/flow", "The data-flow graph.", schema.FlowDocument),
    Route("/loop", "Every instrumented event loop's health.", schema.LoopDocument),
    Route(
        "/warnings",
        "The diagnoses, those that hold now and most severe first.",
        schema.WarningsDocument,
    ),
    Route(
        "/tasks",
        "Every live task, tracked calls oldest first: its await chain and what it waits on, "
        "and the waiting tasks counted by future, line and target.",
        schema.TasksDocument,
        _PAGED,
    ),
    Route(
        "/resources",
        "Every lock, semaphore, condition, event, barrier and limiter, most waited on first.",
        schema.ResourcesDocument,
        _PAGED,
    ),
    Route(
        "/resources/{id}/logs",
        "A resource's recent waits, timed holds and signals, newest first.",
        schema.ResourceLogs,
        (_id("resource"), _LOG_LIMIT),
    ),
    Route(
        "/executors",
        "Every executor jobs were submitted to, busiest first.",
        schema.ExecutorsDocument,
    ),
    Route(
        "/threads",
        "Every thread of the process: state, CPU time and CPU share, the busiest first.",
        schema.ThreadsDocument,
    ),
    Route("/snapshot", "Every document at once.", schema.Snapshot),
    Route("/openapi.json", "This description of the endpoint.", dict[str, Any]),
)


class _Refused(Exception):
    """A request answered with an error status; the message says why and what to do."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def is_loopback(host: str) -> bool:
    """Whether binding to ``host`` serves this machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _shown(text: str, at_most: int = 40) -> str:
    """``text`` fit to quote in a message: as is when short and plain, else a cut ``repr``."""
    if len(text) <= at_most and all(33 <= ord(c) < 127 and c not in "\"'\\" for c in text):
        return text
    cut = text[:at_most]
    return repr(cut) + ("..." if len(text) > at_most else "")


def _safe(exc: BaseException) -> str:
    """An exception's message, fit for JSON (no lone surrogates) and at most 200 characters."""
    return str(exc).encode("utf-8", "backslashreplace").decode("utf-8")[:200]


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return f"HTTP {status}"


# -- requests: Host, Origin, parameters ----------------------------------------------------------

_DIGITS = re.compile(r"[0-9]+")  # ASCII digits only: no signs, spaces, "_" or other scripts
_PORT = re.compile(r"[0-9]{1,5}")


def _authority(value: str) -> tuple[str, int] | None:
    """The lower-cased host name and port a ``Host`` value names (80 when it names none)."""
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[1:end], value[end + 1 :]
        try:
            ipaddress.IPv6Address(name)
        except ValueError:
            return None
    else:
        name, colon, port = value.partition(":")
        rest = colon + port
    if not name or any(not (33 <= ord(c) < 127) or c in "/?#@[]\\" for c in name):
        return None
    if not rest:
        return name.lower(), 80
    if rest[0] != ":" or _PORT.fullmatch(rest[1:]) is None:
        return None
    return name.lower(), int(rest[1:])


def _whole(what: str, raw: str, maximum: int) -> int:
    """A parameter's value: ASCII digits (leading zeros allowed), at most ``maximum``."""
    if _DIGITS.fullmatch(raw) is None:
        if raw[:1] == "-" and _DIGITS.fullmatch(raw[1:]) is not None:
            raise _Refused(400, f"{what}={_shown(raw)}: must be 0 or more")
        raise _Refused(400, f"{what}={_shown(raw)}: expected a whole number in ASCII digits")
    digits = raw.lstrip("0") or "0"
    if len(digits) > len(str(maximum)) or int(digits) > maximum:
        raise _Refused(400, f"{what}={_shown(raw)}: at most {maximum}")
    return int(digits)


@dataclass(frozen=True, slots=True)
class _Query:
    """A request, canonical: the route and its parsed parameters (what the cache is keyed by)."""

    path: str
    id: int | None
    offset: int
    limit: int


def _query(route: Route, request: web.Request) -> _Query:
    """Parse a request's parameters for ``route``, or refuse them with a 400 or 404."""
    accepted = {p.name: p for p in route.params if p.where == "query"}
    query = request.query
    unknown = sorted({name for name in query if name not in accepted})
    if unknown:
        takes = f"it takes {', '.join(sorted(accepted))}" if accepted else "it takes none"
        names = ", ".join(_shown(name) for name in unknown[:5])
        raise _Refused(400, f"unknown parameter {names} for {route.path}; {takes}")
    values: dict[str, int] = {}
    for name, param in accepted.items():
        given = query.getall(name, [])
        if len(given) > 1:
            raise _Refused(400, f"?{name} is given {len(given)} times; give it once")
        assert param.maximum is not None and param.default is not None
        values[name] = _whole(f"?{name}", given[0], param.maximum) if given else param.default
    ident = None
    if "{id}" in route.path:
        kind = route.path.split("/")[1][:-1]
        ident = _whole(f"{kind} id", request.match_info["id"], MAX_ID)
        if ident < 1:
            raise _Refused(404, f"no {kind} with id {ident}; ids start at 1")
    return _Query(route.path, ident, values.get("offset", 0), values.get("limit", 0))


# -- responses ----------------------------------------------------------------------------------


def _error(status: int, message: str, headers: Mapping[str, str] | None = None) -> web.Response:
    body = schema.dumps(schema.ErrorDocument(schema.ErrorInfo(status, message)))
    response = web.Response(body=body, status=status, content_type="application/json")
    if status == 401:
        response.headers["WWW-Authenticate"] = "Bearer"
    if headers:
        response.headers.update(headers)
    return response


def _canned(status: int, message: str) -> bytes:
    """A whole HTTP response that closes its connection, for answers given outside aiohttp."""
    body = schema.dumps(schema.ErrorDocument(schema.ErrorInfo(status, message)))
    head = (
        f"HTTP/1.1 {status} {_phrase(status)}\r\n"
        "Content-Type: application/json; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\nRetry-After: 1\r\n\r\n"
    )
    return head.encode("ascii") + body


class _Cache:
    """Documents built in the last ``_CACHE_NS``, by canonical request, bounded in entries and
    bytes: however many clients ask, each document is built at most every 0.1 s (the GIL is
    shared with the program), and spelling a request differently neither grows it nor
    rebuilds."""

    def __init__(self, entries: int, size: int) -> None:
        self.max_entries = entries
        self.max_bytes = size
        self.bytes = 0
        self._entries: OrderedDict[Hashable, tuple[int, bytes]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable, now: int) -> bytes | None:
        hit = self._entries.get(key)
        if hit is None:
            return None
        if now >= hit[0]:
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        return hit[1]

    def put(self, key: Hashable, now: int, body: bytes) -> None:
        self._drop(key)
        if len(body) > self.max_bytes or self.max_entries <= 0:
            return
        for stale in [k for k, (until, _) in self._entries.items() if now >= until]:
            self._drop(stale)
        while self._entries and (
            len(self._entries) >= self.max_entries or self.bytes + len(body) > self.max_bytes
        ):
            self._drop(next(iter(self._entries)))  # the least recently used
        self._entries[key] = (now + _CACHE_NS, body)
        self.bytes += len(body)

    def _drop(self, key: Hashable) -> None:
        gone = self._entries.pop(key, None)
        if gone is not None:
            self.bytes -= len(gone[1])


# -- connections: deadlines, the cap, the parser's errors ---------------------------------------


class _Quiet(logging.LoggerAdapter):  # type: ignore[type-arg]
    """aiohttp's server logger: everything to the ``asyncflow`` logger at debug level, so a
    malformed request never prints a traceback on the program's standard error."""

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        if self.logger.isEnabledFor(logging.DEBUG):
            kwargs.setdefault("stacklevel", 2)
            self.logger.log(logging.DEBUG, f"endpoint: {msg}", *args, **kwargs)


_AIOHTTP_LOG = cast(logging.Logger, _Quiet(logger, {}))


class _Connection(web.RequestHandler):
    """aiohttp's connection handler with deadlines and JSON errors of its own.

    A connection has ``header_timeout`` from its opening, and from each response, to deliver a
    whole request's headers (so an idle keep-alive connection or a half-sent request closes
    then), and ``response_timeout`` for the response to be built and written.
    """

    def __init__(self, endpoint: Server, manager: web.Server, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._af_endpoint = endpoint
        self._af_loop: asyncio.AbstractEventLoop = kwargs["loop"]
        self._af_timer: asyncio.TimerHandle | None = None

    def af_arm(self, seconds: float) -> None:
        """Close the connection in ``seconds`` unless re-armed before."""
        if self._af_timer is not None:
            self._af_timer.cancel()
        self._af_timer = self._af_loop.call_later(seconds, self._af_expire)

    def _af_expire(self) -> None:
        self._af_timer = None
        logger.debug("endpoint: closing a connection that missed its deadline")
        self.force_close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.af_arm(self._af_endpoint.limits.header_timeout)
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._af_timer is not None:
            self._af_timer.cancel()
            self._af_timer = None
        self._af_endpoint.connections.discard(self)
        super().connection_lost(exc)

    def log_access(self, request: Any, response: Any, time: float | None) -> None:
        # Called once each response has been written (or its client went away): the next
        # request's headers are due within header_timeout. Nothing is logged.
        self.af_arm(self._af_endpoint.limits.header_timeout)

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        # The HTTP parser's refusals (and anything that escaped the middleware) answer JSON,
        # never aiohttp's text page echoing the request, and log only at debug level.
        logger.debug("endpoint: answering %s: %r", status, exc)
        if request.writer.output_size > 0:
            raise ConnectionError("the response was already being sent")
        if status == 500:
            if exc is not None:
                _session.internal_error("the endpoint", exc)
            text = "internal error in asyncflow's endpoint; see /profiler_status"
        elif status == 400:
            kind = type(exc).__name__ if exc is not None else "request"
            text = f"malformed HTTP request ({kind}); send GET with a Host header"
        else:
            text = _phrase(status)
        response = _error(status, text)
        response.force_close()
        return response


class _Overloaded(asyncio.Protocol):
    """A connection beyond the cap: told 503 in JSON and closed at once, holding nothing."""

    def __init__(self, answer: bytes) -> None:
        self._answer = answer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(self._answer)
        transport.close()


# -- the server ---------------------------------------------------------------------------------


class Server:
    """Serves the collector's documents; start and stop it on the profiler's loop."""

    def __init__(
        self, collector: Collector, host: str, port: int, token: str | None, running: Any
    ) -> None:
        self.collector = collector
        self.host = host
        self.port = port
        self.token = token
        self.limits = LIMITS
        self._running: Callable[[], bool] = running
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.AbstractServer | None = None
        self._openapi = schema.dumps(openapi.document(ROUTES, token is not None))
        #: the address served, once started
        self.url: str | None = None
        self.connections: weakref.WeakSet[_Connection] = weakref.WeakSet()
        self._cache = _Cache(self.limits.cache_entries, self.limits.cache_bytes)
        allowed = getattr(collector.options, "allowed_hosts", ())
        self._any_host = "*" in allowed
        bound = host.lower().strip("[]")
        self._names = {"localhost", *(name.lower().strip("[]") for name in allowed)}
        if bound not in ("0.0.0.0", "::", ""):  # a wildcard is no name a client uses
            self._names.add(bound)
        self._served_port = port

    def app(self) -> web.Application:
        """The aiohttp application (also what tests drive with aiohttp's test client)."""
        app = web.Application(middlewares=[self._guard], logger=_AIOHTTP_LOG)
        builders: dict[str, Callable[[_Query], Any]] = {
            "/profiler_status": self._status,
            "/futures": self._futures,
            "/futures/{id}/logs": self._future_logs,
            "/channels": self._channels,
            "/channels/{id}/logs": self._channel_logs,
            "/streams": self._streams,
            "/streams/{id}/logs": self._stream_logs,
            "/flow": self._flow,
            "/loop": self._loop,
            "/warnings": self._warnings,
            "/tasks": self._tasks,
            "/executors": self._executors,
            "/resources": self._resources,
            "/resources/{id}/logs": self._resource_logs,
            "/threads": self._threads,
            "/snapshot": self._snapshot,
        }
        for route in ROUTES:
            app.router.add_get(route.path, self._endpoint(route, builders.get(route.path)))
        return app

    def _endpoint(
        self, route: Route, build: Callable[[_Query], Any] | None
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def endpoint(request: web.Request) -> web.Response:
            query = _query(route, request)
            if build is None:  # the OpenAPI document, made once
                return web.Response(body=self._openapi, content_type="application/json")
            now = clock.now_ns()
            body = self._cache.get(query, now)
            if body is None:
                self.collector.drain()  # before building any document
                body = schema.dumps(build(query))
                self._cache.put(query, now, body)
            return web.Response(body=body, content_type="application/json")

        return endpoint

    async def start(self) -> str:
        """Bind and serve; returns the URL.

        Raises:
            AsyncflowError: the port is taken or the address cannot be bound; nothing is left
                serving.
        """
        loop = asyncio.get_running_loop()
        if loop.get_exception_handler() is None:
            loop.set_exception_handler(_loop_error)
        runner = web.AppRunner(
            self.app(), access_log=None, handle_signals=False, shutdown_timeout=0.5
        )
        await runner.setup()
        manager = runner.server
        assert manager is not None
        limits = self.limits
        options: dict[str, Any] = {
            "loop": loop,
            "keepalive_timeout": limits.header_timeout,
            "logger": _AIOHTTP_LOG,
            "access_log": None,
            "lingering_time": 1.0,
        }
        overloaded = _canned(
            503,
            f"the endpoint holds {limits.max_connections} connections already; close one "
            "(or retry in a second)",
        )

        def accept() -> asyncio.Protocol:
            if len(self.connections) >= limits.max_connections:
                logger.debug("endpoint: refusing a connection beyond the cap")
                return _Overloaded(overloaded)
            connection = _Connection(self, manager, **options)
            self.connections.add(connection)
            return connection

        try:
            listener = await loop.create_server(accept, self.host, self.port, backlog=128)
        except OSError as exc:
            await runner.cleanup()
            if exc.errno in (98, 48, 10048):  # EADDRINUSE on Linux, macOS, Windows
                raise AsyncflowError(
                    f"port {self.port} on {self.host} is already in use; pass port= another "
                    "port (or port=0 for any free one), or set ASYNCFLOW_PORT"
                ) from None
            raise AsyncflowError(
                f"cannot serve on {self.host}:{self.port}: {exc.strerror or exc}; pass another "
                "host= or port= (or set ASYNCFLOW_HOST / ASYNCFLOW_PORT)"
            ) from None
        self._runner, self._listener = runner, listener
        address = listener.sockets[0].getsockname()
        host, port = address[0], address[1]
        self._served_port = port
        self.url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        return self.url

    async def stop(self) -> None:
        """Close every connection and stop listening."""
        listener, self._listener = self._listener, None
        runner, self._runner = self._runner, None
        if listener is not None:
            listener.close()
        if runner is not None:
            await runner.cleanup()
        for connection in list(self.connections):
            connection.force_close()
        if listener is not None:
            try:
                await asyncio.wait_for(listener.wait_closed(), 1.0)
            except TimeoutError:
                logger.debug("endpoint: connections still closing at stop")

    # -- middleware: Host and Origin, authentication, errors as JSON ----------------------------

    def _check_host(self, request: web.Request) -> None:
        """Refuse a request that is not addressed to this endpoint (DNS rebinding), or that a
        web page of another origin sent (a browser says so in ``Origin``/``Sec-Fetch-Site``)."""
        hosts = request.headers.getall("Host", [])
        if len(hosts) != 1:
            raise _Refused(400, f"a request needs exactly one Host header, not {len(hosts)}")
        host = _authority(hosts[0])
        if host is None:
            raise _Refused(400, f"malformed Host header {_shown(hosts[0])}")
        if not self._any_host and not (host[1] == self._served_port and self._names_us(host[0])):
            raise _Refused(
                421,
                f"Host {_shown(hosts[0])} does not name this endpoint: ask {self.url} (or "
                f"localhost:{self._served_port}); to accept another name, start the profiler "
                "with allowed_hosts= (or ASYNCFLOW_ALLOWED_HOSTS)",
            )
        for origin in request.headers.getall("Origin", []):
            scheme, sep, rest = origin.partition("://")
            if scheme.lower() != "http" or not sep or _authority(rest) != host:
                raise _Refused(
                    403, f"cross-origin request from {_shown(origin)} refused; ask from a shell"
                )
        site = request.headers.get("Sec-Fetch-Site")
        if site is not None and site.lower() not in ("same-origin", "none"):
            raise _Refused(403, f"request from a {_shown(site)} web page refused")

    def _names_us(self, name: str) -> bool:
        if name in self._names:
            return True
        try:
            return ipaddress.ip_address(name.strip("[]")).is_loopback
        except ValueError:
            return False

    def _check_token(self, request: web.Request) -> None:
        assert self.token is not None
        given = request.headers.get("Authorization", "")
        scheme, _, credential = given.partition(" ")
        # aiohttp decodes header bytes that are not UTF-8 as surrogates: compare the bytes
        sent = credential.strip().encode("utf-8", "surrogateescape")
        if scheme.lower() != "bearer" or not hmac.compare_digest(sent, self.token.encode()):
            why = "missing" if not given else "wrong"
            raise _Refused(401, f"the bearer token is {why}; send 'Authorization: Bearer <token>'")

    @web.middleware
    async def _guard(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        connection = request.protocol
        if isinstance(connection, _Connection):
            connection.af_arm(self.limits.response_timeout)
        try:
            self._check_host(request)
            if self.token is not None:
                self._check_token(request)
            return await handler(request)
        except _Refused as refused:
            return _error(refused.status, refused.message)
        except web.HTTPException as exc:
            headers: dict[str, str] = {}
            if exc.status == 404:
                message = f"no route {_shown(request.path, 80)}; GET /openapi.json lists them"
            elif isinstance(exc, web.HTTPMethodNotAllowed):
                allowed = ", ".join(sorted(exc.allowed_methods))
                message = f"{_shown(request.method)} is not allowed on {request.path}; use GET"
                headers["Allow"] = allowed
            else:
                message = exc.reason
            return _error(exc.status, message, headers)
        except Exception as exc:  # a bug in asyncflow: say so, count it, keep serving
            _session.internal_error(f"serving {_shown(request.path, 80)}", exc)
            return _error(500, f"internal error in asyncflow: {type(exc).__name__}: {_safe(exc)}")

    # -- builders: each returns a document of asyncflow.schema ----------------------------------

    def _status(self, query: _Query) -> Any:
        return views.status(self.collector, clock.now_ns(), self._running())

    def _futures(self, query: _Query) -> Any:
        return views.futures_document(self.collector, clock.now_ns(), query.offset, query.limit)

    def _future_logs(self, query: _Query) -> Any:
        record = _record(query, "future", registry())
        origin = self.collector.session.start_ns
        return views.future_logs(record, clock.now_ns(), origin, query.limit)

    def _channels(self, query: _Query) -> Any:
        return views.channels_document(self.collector, query.offset, query.limit)

    def _channel_logs(self, query: _Query) -> Any:
        record = _record(query, "channel", channel_registry())
        return views.channel_logs(record, self.collector.session.start_ns, query.limit)

    def _streams(self, query: _Query) -> Any:
        return views.streams_document(self.collector, query.offset, query.limit)

    def _stream_logs(self, query: _Query) -> Any:
        record = _record(query, "stream", stream_registry())
        return views.stream_logs(record, self.collector.session.start_ns, query.limit)

    def _flow(self, query: _Query) -> Any:
        return views.flow(self.collector)

    def _loop(self, query: _Query) -> Any:
        return views.loop_document(self.collector, clock.now_ns())

    def _warnings(self, query: _Query) -> Any:
        return views.warnings_document(self.collector)

    def _tasks(self, query: _Query) -> Any:
        responsive = wait_views.responsive_loops(self.collector.monitor, clock.now_ns())
        return wait_views.tasks_document(query.offset, query.limit, responsive)

    def _resources(self, query: _Query) -> Any:
        now = clock.now_ns()
        return resource_views.resources_document(self.collector, now, query.offset, query.limit)

    def _resource_logs(self, query: _Query) -> Any:
        record = resource_views.find_resource(query.id or 0)
        if record is None:
            raise _Refused(404, f"no resource with id {query.id}; GET /resources lists them")
        origin = self.collector.session.start_ns
        return resource_views.resource_logs(record, origin, query.limit)

    def _executors(self, query: _Query) -> Any:
        percentiles = self.collector.options.percentiles
        return wait_views.executors_document(percentiles, self.collector.futures())

    def _threads(self, query: _Query) -> Any:
        collector = self.collector
        return threads_document(collector.threads, clock.now_ns(), collector.session.start_ns)

    def _snapshot(self, query: _Query) -> Any:
        return views.snapshot(self.collector, self._running())


def _loop_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The profiler loop's exception handler: to the ``asyncflow`` logger, not to stderr."""
    exc = context.get("exception")
    if isinstance(exc, OSError | asyncio.CancelledError) or exc is None:
        logger.debug("endpoint: %s", context.get("message"), exc_info=exc)
    else:
        _session.internal_error(str(context.get("message", "the profiler's loop")), exc)


_R = TypeVar("_R", FutureRecord, ChannelRecord, StreamRecord)


def _record(query: _Query, kind: str, records: Sequence[_R]) -> _R:
    """The record a ``/{kind}s/{id}/logs`` request names."""
    for record in records:
        if record.id == query.id:
            return record
    raise _Refused(404, f"no {kind} with id {query.id}; GET /{kind}s lists them")
