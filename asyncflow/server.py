"""The JSON endpoint: an aiohttp application on the profiler's own thread and event loop.

Every document is built here, on the profiler's thread, from the collector's state; the
application's loop never runs a line of it, so the endpoint answers while that loop is blocked.
Errors of every kind answer ``{"error": {"status": ..., "message": ...}}``, never a page.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from aiohttp import web

from asyncflow import clock, openapi, schema, views
from asyncflow.collector import Collector
from asyncflow.errors import AsyncflowError
from asyncflow.instrument import _session
from asyncflow.instrument.channels import ChannelRecord, channel_registry
from asyncflow.instrument.futures import FutureRecord, registry
from asyncflow.instrument.streams import StreamRecord, stream_registry
from asyncflow.openapi import Param, Route

__all__ = ["DEFAULT_LOGS", "DEFAULT_PAGE", "MAX_PAGE", "ROUTES", "Server", "is_loopback"]

#: Entries a list returns without ``?limit=``, and the most any ``?limit=`` may ask for.
DEFAULT_PAGE = 1000
#: Log entries returned without ``?limit=``.
DEFAULT_LOGS = 100
MAX_PAGE = 10_000
_CACHE_NS = 100_000_000
_CACHE_ENTRIES = 256

_LIMIT = Param("limit", "query", "Most entries to return.", MAX_PAGE, DEFAULT_PAGE)
_LOG_LIMIT = Param("limit", "query", "Most log entries to return.", MAX_PAGE, DEFAULT_LOGS)
_OFFSET = Param("offset", "query", "Entries to skip, in the list's order.", None, 0)
_PAGED = (_LIMIT, _OFFSET)


def _id(kind: str) -> Param:
    return Param("id", "path", f"The {kind}'s id, as its list gives it.")


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
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _json(document: Any, status: int = 200) -> web.Response:
    return web.Response(body=schema.dumps(document), status=status, content_type="application/json")


def _error(status: int, message: str) -> web.Response:
    response = _json(schema.ErrorDocument(schema.ErrorInfo(status, message)), status)
    if status == 401:
        response.headers["WWW-Authenticate"] = "Bearer"
    return response


def _query_int(request: web.Request, param: Param) -> int:
    raw = request.query.get(param.name)
    if raw is None:
        return param.default or 0
    try:
        value = int(raw)
    except ValueError:
        raise _Refused(400, f"?{param.name}={raw!r}: expected a whole number") from None
    if value < 0:
        raise _Refused(400, f"?{param.name}={value}: must be 0 or more")
    if param.maximum is not None and value > param.maximum:
        raise _Refused(400, f"?{param.name}={value}: at most {param.maximum}")
    return value


def _check_query(request: web.Request, params: Sequence[Param]) -> None:
    accepted = {p.name for p in params if p.where == "query"}
    unknown = sorted(set(request.query) - accepted)
    if unknown:
        takes = f"it takes {', '.join(sorted(accepted))}" if accepted else "it takes none"
        raise _Refused(400, f"unknown parameter {', '.join(unknown)} for {request.path}; {takes}")


class Server:
    """Serves the collector's documents; start and stop it on the profiler's loop."""

    def __init__(
        self, collector: Collector, host: str, port: int, token: str | None, running: Any
    ) -> None:
        self.collector = collector
        self.host = host
        self.port = port
        self.token = token
        self._running: Callable[[], bool] = running
        self._runner: web.AppRunner | None = None
        self._openapi = schema.dumps(openapi.document(ROUTES, token is not None))
        #: the address served, once started
        self.url: str | None = None
        #: documents built in the last ``_CACHE_NS``, by path and query: however many clients
        #: ask, each document is built at most every 0.1 s (the GIL is shared with the program)
        self._cache: dict[str, tuple[int, bytes]] = {}

    def app(self) -> web.Application:
        """The aiohttp application (also what tests drive with aiohttp's test client)."""
        app = web.Application(middlewares=[self._guard])
        handlers: dict[str, Callable[[web.Request], Any]] = {
            "/profiler_status": self._status,
            "/futures": self._futures,
            "/futures/{id}/logs": self._future_logs,
            "/channels": self._channels,
            "/channels/{id}/logs": self._channel_logs,
            "/streams": self._streams,
            "/streams/{id}/logs": self._stream_logs,
            "/flow": self._flow,
            "/loop": self._loop,
            "/snapshot": self._snapshot,
            "/openapi.json": self._spec,
        }
        for route in ROUTES:
            app.router.add_get(route.path, self._endpoint(route, handlers[route.path]))
        return app

    def _endpoint(
        self, route: Route, handler: Callable[[web.Request], Any]
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def endpoint(request: web.Request) -> web.Response:
            _check_query(request, route.params)
            if route.path == "/openapi.json":
                return self._spec(request)
            now = clock.now_ns()
            key = request.path_qs
            cached = self._cache.get(key)
            if cached is not None and now < cached[0]:
                return web.Response(body=cached[1], content_type="application/json")
            self.collector.drain()  # before building any document
            body = schema.dumps(handler(request))
            if len(self._cache) >= _CACHE_ENTRIES:
                self._cache.clear()
            self._cache[key] = (now + _CACHE_NS, body)
            return web.Response(body=body, content_type="application/json")

        return endpoint

    async def start(self) -> str:
        """Bind and serve; returns the URL.

        Raises:
            AsyncflowError: the port is taken or the address cannot be bound; nothing is left
                serving.
        """
        runner = web.AppRunner(
            self.app(), access_log=None, handle_signals=False, shutdown_timeout=0.5
        )
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.host, self.port)
            await site.start()
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
        self._runner = runner
        address = runner.addresses[0]
        host, port = address[0], address[1]
        self.url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        return self.url

    async def stop(self) -> None:
        """Close every connection and stop listening."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    # -- middleware: authentication and errors as JSON ------------------------------------------

    @web.middleware
    async def _guard(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        try:
            if self.token is not None:
                given = request.headers.get("Authorization", "")
                scheme, _, credential = given.partition(" ")
                if scheme.lower() != "bearer" or not hmac.compare_digest(
                    credential.strip().encode(), self.token.encode()
                ):
                    why = "missing" if not given else "wrong"
                    raise _Refused(
                        401, f"the bearer token is {why}; send 'Authorization: Bearer <token>'"
                    )
            return await handler(request)
        except _Refused as refused:
            return _error(refused.status, refused.message)
        except web.HTTPException as exc:
            if exc.status == 404:
                message = f"no route {request.path}; GET /openapi.json lists them"
            elif exc.status == 405:
                message = f"{request.method} is not allowed on {request.path}; use GET"
            else:
                message = exc.reason
            return _error(exc.status, message)
        except Exception as exc:  # a bug in asyncflow: say so, count it, keep serving
            _session.internal_error(f"serving {request.path}", exc)
            return _error(500, f"internal error in asyncflow: {type(exc).__name__}: {exc}")

    # -- handlers: each returns a document of asyncflow.schema ----------------------------------

    def _paging(self, request: web.Request) -> tuple[int, int]:
        return _query_int(request, _OFFSET), _query_int(request, _LIMIT)

    def _status(self, request: web.Request) -> Any:
        return views.status(self.collector, clock.now_ns(), self._running())

    def _futures(self, request: web.Request) -> Any:
        offset, limit = self._paging(request)
        return views.futures_document(self.collector, clock.now_ns(), offset, limit)

    def _future_logs(self, request: web.Request) -> Any:
        record, limit = _logs_of(request, "future", registry())
        origin = self.collector.session.start_ns
        return views.future_logs(record, clock.now_ns(), origin, limit)

    def _channels(self, request: web.Request) -> Any:
        offset, limit = self._paging(request)
        return views.channels_document(self.collector, offset, limit)

    def _channel_logs(self, request: web.Request) -> Any:
        record, limit = _logs_of(request, "channel", channel_registry())
        return views.channel_logs(record, self.collector.session.start_ns, limit)

    def _streams(self, request: web.Request) -> Any:
        offset, limit = self._paging(request)
        return views.streams_document(self.collector, offset, limit)

    def _stream_logs(self, request: web.Request) -> Any:
        record, limit = _logs_of(request, "stream", stream_registry())
        return views.stream_logs(record, self.collector.session.start_ns, limit)

    def _flow(self, request: web.Request) -> Any:
        return views.flow(self.collector)

    def _loop(self, request: web.Request) -> Any:
        return views.loop_document(self.collector, clock.now_ns())

    def _snapshot(self, request: web.Request) -> Any:
        return views.snapshot(self.collector, self._running())

    def _spec(self, request: web.Request) -> web.Response:
        return web.Response(body=self._openapi, content_type="application/json")


_R = TypeVar("_R", FutureRecord, ChannelRecord, StreamRecord)


def _logs_of(request: web.Request, kind: str, records: list[_R]) -> tuple[_R, int]:
    """The record a ``/{kind}s/{id}/logs`` request names, and the log ``?limit=``."""
    raw = request.match_info["id"]
    try:
        wanted = int(raw)
    except ValueError:
        raise _Refused(400, f"{kind} id {raw!r}: expected a whole number") from None
    if wanted < 1:
        raise _Refused(404, f"no {kind} with id {wanted}; ids start at 1")
    limit = _query_int(request, _LOG_LIMIT)
    for record in records:
        if record.id == wanted:
            return record, limit
    raise _Refused(404, f"no {kind} with id {wanted}; GET /{kind}s lists them")
