"""The endpoint's HTTP side: the aiohttp application that checks, parses and caches requests.

It runs in the endpoint process (``python -m asyncflow.serve._endpoint``), and asks the program over
a socket pair (:class:`_ParentLink`) for the documents its cache does not hold; where no such
process can run, :class:`asyncflow.serve.server.Server` runs it on the profiler's thread instead.
aiohttp is imported here only: a program whose endpoint is served by the endpoint process
never loads it.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import itertools
import logging
import os
import socket
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, cast

import orjson
from aiohttp import web

from asyncflow import clock
from asyncflow.serve import openapi
from asyncflow.serve._protocol import (
    _JSON,
    _LENGTH,
    MAX_ID,
    ROUTES,
    _Answer,
    _authority,
    _Cache,
    _canned,
    _error_body,
    _FrontConfig,
    _message,
    _Pages,
    _phrase,
    _Query,
    _Refused,
    _safe,
    _shown,
    _whole,
    _window,
    logger,
)
from asyncflow.serve.openapi import Route

__all__ = ["serve_in_child"]


# -- parsing a request ---------------------------------------------------------------------------


def _query(route: Route, request: web.Request) -> _Query:
    """Parse a request's parameters for ``route``, or refuse them with a 400 or 404."""
    accepted = {p.name: p for p in route.params if p.where == "query"}
    query = request.query
    # Errors name the route and its own parameters, never what the request said (no echo).
    unknown = len({name for name in query if name not in accepted})
    if unknown:
        takes = f"it takes {', '.join(sorted(accepted))}" if accepted else "it takes none"
        some = "an unknown parameter" if unknown == 1 else f"{unknown} unknown parameters"
        raise _Refused(400, f"{some} for {route.path}; {takes}")
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
    return _Query(route.path, ident, tuple(sorted(values.items())))


# -- errors -------------------------------------------------------------------------------------


def _error(status: int, message: str, headers: Mapping[str, str] | None = None) -> web.Response:
    response = web.Response(body=_error_body(status, message), status=status)
    response.headers["Content-Type"] = _JSON
    response.headers["X-Content-Type-Options"] = "nosniff"
    if status == 401:
        response.headers["WWW-Authenticate"] = "Bearer"
    if headers:
        response.headers.update(headers)
    return response


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

    def __init__(self, endpoint: _Front, manager: web.Server, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._af_endpoint = endpoint
        self._af_loop: asyncio.AbstractEventLoop = kwargs["loop"]
        self._af_timer: asyncio.TimerHandle | None = None
        self._af_evicted = False

    def af_evict(self) -> None:
        """Close now, to make room for a newer connection (even before it is made)."""
        self._af_evicted = True
        transport = self.transport
        if transport is not None:
            self.force_close()
            transport.abort()  # now, even with a response unsent: its descriptor is freed

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
        if self._af_evicted:  # made room for a newer one before its transport was made
            self.af_evict()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._af_timer is not None:
            self._af_timer.cancel()
            self._af_timer = None
        self._af_endpoint.forget(self)
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
                self._af_endpoint.report("the endpoint", exc)
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


# -- the HTTP side --------------------------------------------------------------------------------


Fetch = Callable[["_Query"], Awaitable[_Answer]]


class _Front:
    """The HTTP side: an aiohttp application that checks, parses and caches requests, and asks
    ``fetch`` for the documents its cache does not hold. The same in the endpoint process and,
    where none can run, on the profiler's thread."""

    def __init__(
        self,
        config: _FrontConfig,
        fetch: Fetch,
        report: Callable[[str, BaseException], None],
    ) -> None:
        self.config = config
        self.limits = config.limits
        self.report = report
        self._fetch = fetch
        self._names = set(config.names)
        #: /openapi.json's body, made at its first request (not before the first answer)
        self._openapi: bytes | None = None
        self._cache = _Cache(
            self.limits.cache_entries,
            self.limits.cache_bytes,
            int(self.limits.cache_stale_seconds * 1e9),
        )
        #: answers served out of date because their successor took longer than answer_within
        self.stale_served = 0
        #: a paged route's page is cut from its window's document (see ``_window``)
        self._pages = _Pages()
        #: requests being answered now: a second client asking the same waits for the first
        self._pending: dict[_Query, asyncio.Future[_Answer]] = {}
        self._runner: web.AppRunner | None = None
        self._manager: web.Server | None = None
        self._options: dict[str, Any] = {}
        self._overloaded = _canned(
            503,
            f"the endpoint holds {self.limits.max_connections} connections already; close one "
            "(or retry in a second)",
        )
        self.connections: weakref.WeakSet[_Connection] = weakref.WeakSet()
        #: the connections held that no request has yet shown to be a client's (none passed
        #: the Host check, and the token's when there is one), oldest first: the ones that
        #: make room when the cap is reached, so that idle or half-sent sockets never keep a
        #: client with the token out
        self._unproven: dict[_Connection, None] = {}
        #: connections closed to make room for a newer one
        self.evicted = 0

    def app(self) -> web.Application:
        """The aiohttp application (also what tests drive with aiohttp's test client)."""
        app = web.Application(middlewares=[self._guard], logger=_AIOHTTP_LOG)
        for route in ROUTES:
            app.router.add_get(route.path, self._endpoint(route))
        return app

    def _endpoint(self, route: Route) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def endpoint(request: web.Request) -> web.Response:
            query = _query(route, request)
            if route.path == "/":  # static, and nothing of the program's: answered here
                from asyncflow.render import web as web_page  # (not before the first answer)

                return web.Response(body=web_page.page(), headers=web_page.headers())
            age: int | None = None
            if route.path == "/openapi.json":  # made once, here
                if self._openapi is None:
                    token = self.config.token is not None
                    from asyncflow import schema  # (at first need: see openapi.Route)

                    self._openapi = schema.dumps(openapi.document(ROUTES, token))
                answer = _Answer(200, route.media_type, self._openapi)
            else:
                answer, age = await self._answer(query)
            response = web.Response(body=answer.body, status=answer.status)
            response.headers["Content-Type"] = answer.media_type
            # The program's text (labels, messages) is in it: never to be sniffed as a page.
            response.headers["X-Content-Type-Options"] = "nosniff"
            if age is not None:
                response.headers["Age"] = str(age)
            return response

        return endpoint

    async def _answer(self, query: _Query) -> tuple[_Answer, int | None]:
        """The answer, and its age in whole seconds if it was held (the HTTP ``Age``)."""
        window = _window(query)
        if window is not None:  # one build per window, whatever the page
            answer, age = await self._answer(window)
            return self._pages.page(query, window, answer), age
        now = clock.now_ns()
        held = self._cache.get(query, now)
        if held is not None and now < held.until:
            return held.answer, (now - held.asked) // 1_000_000_000
        pending = self._pending.get(query)
        if pending is None:
            pending = asyncio.ensure_future(self._ask(query))
            # A client served the previous answer does not wait for this one: what it raises
            # (the program gone) is read here, never reported as unretrieved.
            pending.add_done_callback(_retrieve)
            self._pending[query] = pending
        # A client that goes away cancels its wait, never the answer others wait for.
        if held is None:
            return await asyncio.shield(pending), None
        # An answer out of date is at hand: the new one, if the program builds it soon;
        # else the old one, and the new one serves the requests after this.
        try:
            return await asyncio.wait_for(asyncio.shield(pending), self.limits.answer_within), None
        except TimeoutError:
            self.stale_served += 1
            return held.answer, (clock.now_ns() - held.asked) // 1_000_000_000

    async def _ask(self, query: _Query) -> _Answer:
        asked = clock.now_ns()
        try:
            answer = await self._fetch(query)
        finally:
            del self._pending[query]
        self._cache.put(query, asked, answer)
        return answer

    # -- serving --------------------------------------------------------------------------------

    async def setup(self) -> None:
        """Make the application ready; then serve with :meth:`accept` as protocol factory."""
        loop = asyncio.get_running_loop()
        runner = web.AppRunner(
            self.app(), access_log=None, handle_signals=False, shutdown_timeout=0.5
        )
        await runner.setup()
        assert runner.server is not None
        self._runner, self._manager = runner, runner.server
        self._options = {
            "loop": loop,
            "keepalive_timeout": self.limits.header_timeout,
            "logger": _AIOHTTP_LOG,
            "access_log": None,
            "lingering_time": 1.0,
        }

    def accept(self) -> asyncio.Protocol:
        """A protocol for a new connection: aiohttp's, or a 503 beyond the cap.

        At the cap, the oldest connection no request has proven yet is closed to make room
        (as its header deadline would close it, only sooner); only when every connection held
        is proven is the new one answered 503. So sockets that never show the token (or,
        without a token, never send a request this endpoint answers) cannot keep out a client
        that does: they take turns in the places its connection leaves.
        """
        if len(self.connections) >= self.limits.max_connections and not self._evict():
            logger.debug("endpoint: refusing a connection beyond the cap")
            return _Overloaded(self._overloaded)
        assert self._manager is not None, "accept() before setup()"
        connection = _Connection(self, self._manager, **self._options)
        self.connections.add(connection)
        self._unproven[connection] = None
        return connection

    def _evict(self) -> bool:
        """Close the oldest unproven connection; False when every connection is proven."""
        oldest = next(iter(self._unproven), None)
        if oldest is None:
            return False
        self.forget(oldest)
        self.evicted += 1
        logger.debug("endpoint: closing the oldest unproven connection to make room")
        oldest.af_evict()
        return True

    def forget(self, connection: _Connection) -> None:
        """``connection`` is closed: it holds no place any more."""
        self.connections.discard(connection)
        self._unproven.pop(connection, None)

    async def stop(self) -> None:
        """Close every connection."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        for connection in list(self.connections):
            connection.force_close()

    def loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """The serving loop's exception handler: to the ``asyncflow`` logger, not to stderr."""
        exc = context.get("exception")
        if isinstance(exc, OSError | asyncio.CancelledError) or exc is None:
            logger.debug("endpoint: %s", context.get("message"), exc_info=exc)
        else:
            self.report(str(context.get("message", "the endpoint's loop")), exc)

    # -- middleware: Host and Origin, authentication, errors as JSON ----------------------------

    def _check_host(self, request: web.Request) -> None:
        """Refuse a request that is not addressed to this endpoint (DNS rebinding), or that a
        web page of another origin sent (a browser says so in ``Origin``/``Sec-Fetch-Site``)."""
        hosts = request.headers.getall("Host", [])
        if len(hosts) != 1:
            raise _Refused(400, f"a request needs exactly one Host header, not {len(hosts)}")
        host = _authority(hosts[0])
        if host is None:
            raise _Refused(400, "malformed Host header: expected a name or address and a port")
        port = self.config.port
        if not self.config.any_host and not (host[1] == port and self._names_us(host[0])):
            raise _Refused(
                421,
                f"the Host header does not name this endpoint: ask {self.config.url} (or "
                f"localhost:{port}); to accept another name, start the profiler "
                "with allowed_hosts= (or ASYNCFLOW_ALLOWED_HOSTS)",
            )
        for origin in request.headers.getall("Origin", []):
            scheme, sep, rest = origin.partition("://")
            if scheme.lower() != "http" or not sep or _authority(rest) != host:
                raise _Refused(
                    403,
                    "cross-origin request refused (its Origin is not this endpoint); ask from "
                    "a shell",
                )
        site = request.headers.get("Sec-Fetch-Site")
        if site is not None and site.lower() not in ("same-origin", "none"):
            raise _Refused(403, "request from another site's web page refused; ask from a shell")

    def _names_us(self, name: str) -> bool:
        if name in self._names:
            return True
        try:
            return ipaddress.ip_address(name.strip("[]")).is_loopback
        except ValueError:
            return False

    def _check_token(self, request: web.Request) -> None:
        token = self.config.token
        assert token is not None
        sent_all = request.headers.getall("Authorization", [])
        if len(sent_all) > 1:  # (which one a proxy before us checked is not known)
            raise _Refused(400, f"a request needs one Authorization header, not {len(sent_all)}")
        given = sent_all[0] if sent_all else ""
        scheme, _, credential = given.partition(" ")
        # aiohttp decodes header bytes that are not UTF-8 as surrogates: compare the bytes
        sent = credential.strip().encode("utf-8", "surrogateescape")
        if scheme.lower() != "bearer" or not hmac.compare_digest(sent, token.encode()):
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
            if request.method not in ("GET", "HEAD"):  # (CONNECT's target is no route's path)
                raise web.HTTPMethodNotAllowed(request.method, ("GET", "HEAD"))
            self._check_host(request)
            proven = self.config.token is None
            if not proven and request.path != "/":  # the page asks for the token itself
                self._check_token(request)
                proven = True
            if proven and isinstance(connection, _Connection):
                self._unproven.pop(connection, None)  # a client's: never closed to make room
            return await handler(request)
        except _Refused as refused:
            return _error(refused.status, refused.message)
        except web.HTTPException as exc:
            headers: dict[str, str] = {}
            if exc.status == 404:
                message = "no such route; GET /openapi.json lists them"
            elif isinstance(exc, web.HTTPMethodNotAllowed):
                allowed = ", ".join(sorted(exc.allowed_methods))
                message = f"only {' and '.join(sorted(exc.allowed_methods))} are answered; use GET"
                headers["Allow"] = allowed
            else:
                message = exc.reason
            return _error(exc.status, message, headers)
        except Exception as exc:  # a bug in asyncflow: say so, count it, keep serving
            self.report(f"serving {_shown(request.path, 80)}", exc)
            return _error(500, f"internal error in asyncflow: {type(exc).__name__}: {_safe(exc)}")


def _retrieve(done: asyncio.Future[Any]) -> None:
    if not done.cancelled():
        done.exception()


# -- the endpoint process's end of the socket pair -----------------------------------------------


class _ParentLink:
    """The endpoint process's end of the socket pair: asks the program for documents."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._numbers = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[_Answer]] = {}

    async def ask(self, query: _Query) -> _Answer:
        number = next(self._numbers)
        waiter: asyncio.Future[_Answer] = asyncio.get_running_loop().create_future()
        self._waiting[number] = waiter
        self.send(["ask", number, query.path, query.id, query.params])
        try:
            return await waiter
        finally:
            self._waiting.pop(number, None)

    def send(self, value: Any) -> None:
        self._writer.write(_message(value))

    def report(self, where: str, exc: BaseException) -> None:
        logger.debug("endpoint: internal error in %s", where, exc_info=exc)
        self.send(["error", where, f"{type(exc).__name__}: {_safe(exc)}"])

    async def read_answers(self, reader: asyncio.StreamReader) -> None:
        """Hand each answer to whoever asked, until the program closes its end."""
        try:
            while True:
                (size,) = _LENGTH.unpack(await reader.readexactly(4))
                number, status, media_type, fresh_ns, length = orjson.loads(
                    await reader.readexactly(size)
                )
                body = await reader.readexactly(length)
                waiter = self._waiting.pop(number, None)
                if waiter is not None and not waiter.done():
                    waiter.set_result(_Answer(status, media_type, body, fresh_ns))
        except (asyncio.IncompleteReadError, ConnectionError):
            return  # the program has gone (or stopped its profiler)


async def serve_in_child(control: socket.socket, listening: Sequence[socket.socket]) -> None:
    """The endpoint process's work: serve ``listening`` until the program closes ``control``.

    The program sends the configuration first; connections that arrived before this process
    was ready waited in the listening sockets' backlog.
    """
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_connection(sock=control)
    (size,) = _LENGTH.unpack(await reader.readexactly(4))
    config = _FrontConfig.from_wire(await reader.readexactly(size))
    link = _ParentLink(writer)
    front = _Front(config, link.ask, link.report)
    loop.set_exception_handler(front.loop_error)
    await front.setup()
    for sock in listening:
        await loop.create_server(front.accept, sock=sock, backlog=128)
    link.send(["ready", os.getpid()])
    await link.read_answers(reader)
