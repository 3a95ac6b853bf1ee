"""What the endpoint's two sides share: the route table, parameters, answers, the cache and the
messages between the program and the endpoint process.

The program's side (:mod:`asyncflow.serve.server`) builds documents; the HTTP side
(:mod:`asyncflow.serve._http`, in the endpoint process or on the profiler's thread) parses requests,
checks them and caches answers. Both import this module and neither imports the other's internals.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import re
import struct
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import orjson

from asyncflow.serve.openapi import Param, Route

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
    #: seconds a document is served again before it is built anew
    cache_seconds: float = _CACHE_NS / 1e9
    #: a document that takes long to build is served longer, so that building it while clients
    #: poll costs the program at most this share of its time (0: never longer than
    #: ``cache_seconds``), and never longer than ``cache_most_seconds``
    cache_cost_share: float = 0.01
    cache_most_seconds: float = 2.0
    #: a request for a document being rebuilt waits this long for it; then, while the program
    #: is too busy to build it sooner, the previous one is served (with an ``Age`` header),
    #: if it went out of date at most ``cache_stale_seconds`` ago
    answer_within: float = 0.15
    cache_stale_seconds: float = 10.0


_LIMIT = Param("limit", "query", "Most entries to return.", MAX_PAGE, DEFAULT_PAGE)
_LOG_LIMIT = Param("limit", "query", "Most log entries to return.", MAX_PAGE, DEFAULT_LOGS)
_OFFSET = Param("offset", "query", "Entries to skip, in the list's order.", MAX_OFFSET, 0)
_PAGED = (_LIMIT, _OFFSET)


def _id(kind: str) -> Param:
    return Param("id", "path", f"The {kind}'s id, as its list gives it.", MAX_ID)


ROUTES: tuple[Route, ...] = (
    Route("/profiler_status", "The profiler's own health and counts.", "ProfilerStatus"),
    Route("/futures", "Every future, most busy first.", "FuturesDocument", _PAGED),
    Route(
        "/futures/{id}/logs",
        "A future's unfinished calls, then its recent finished calls, newest first.",
        "FutureLogs",
        (_id("future"), _LOG_LIMIT),
    ),
    Route("/channels", "Every channel, most messages first.", "ChannelsDocument", _PAGED),
    Route(
        "/channels/{id}/logs",
        "A channel's recent sends and receives, newest first.",
        "ChannelLogs",
        (_id("channel"), _LOG_LIMIT),
    ),
    Route("/streams", "Every stream, most items first.", "StreamsDocument", _PAGED),
    Route(
        "/streams/{id}/logs",
        "A stream's recent items, newest first.",
        "StreamLogs",
        (_id("stream"), _LOG_LIMIT),
    ),
    Route("/flow", "The data-flow graph.", "FlowDocument"),
    Route("/loop", "Every instrumented event loop's health.", "LoopDocument"),
    Route(
        "/warnings",
        "The diagnoses, those that hold now and most severe first.",
        "WarningsDocument",
    ),
    Route(
        "/tasks",
        "Every live task, tracked calls oldest first: its await chain and what it waits on, "
        "and the waiting tasks counted by future, line and target.",
        "TasksDocument",
        _PAGED,
    ),
    Route(
        "/graph",
        "The wait-for graph: every waiting task, what it waits on and the tasks that can "
        "release it (holders, producers, awaited tasks), and the deadlocks (cycles) in it.",
        "GraphDocument",
    ),
    Route(
        "/resources",
        "Every lock, semaphore, condition, event, barrier and limiter, most waited on first.",
        "ResourcesDocument",
        _PAGED,
    ),
    Route(
        "/resources/{id}/logs",
        "A resource's recent waits, timed holds and signals, newest first.",
        "ResourceLogs",
        (_id("resource"), _LOG_LIMIT),
    ),
    Route(
        "/executors",
        "Every executor jobs were submitted to, busiest first.",
        "ExecutorsDocument",
    ),
    Route(
        "/threads",
        "Every thread of the process: state, CPU time and CPU share, the busiest first.",
        "ThreadsDocument",
    ),
    Route(
        "/functions",
        "Every measured function and block (@asyncflow.measure, measure_block), most total "
        "time first.",
        "FunctionsDocument",
        _PAGED,
    ),
    Route(
        "/user_metrics",
        "The program's own counters, gauges, histograms and value logs, by kind then name.",
        "MetricsDocument",
        _PAGED,
    ),
    Route("/snapshot", "Every document at once.", "Snapshot"),
    Route(
        "/metrics",
        "The figures in the Prometheus text exposition format (version 0.0.4).",
        str,
        media_type="text/plain; version=0.0.4; charset=utf-8",
    ),
    Route(
        "/trace",
        "The trace recorder's ring (polls, blocked loops, queue depths, loop lag, message flows) "
        "as Chrome trace event JSON, for ui.perfetto.dev; 404 when no trace is recorded.",
        dict[str, Any],
    ),
    Route("/openapi.json", "This description of the endpoint.", dict[str, Any]),
    Route(
        "/",
        "A web page over these routes: warnings, the flow graph, futures, channels, resources "
        "and loops, refreshed live (served without the token, which the page asks for).",
        str,
        media_type="text/html; charset=utf-8",
    ),
)


class _Refused(Exception):
    """A request answered with an error status; the message says why and what to do."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


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
    """A parameter's value: ASCII digits (leading zeros allowed), at most ``maximum``. The
    refusals name ``what`` and never quote ``raw`` (an error never echoes the request)."""
    if _DIGITS.fullmatch(raw) is None:
        if raw[:1] == "-" and _DIGITS.fullmatch(raw[1:]) is not None:
            raise _Refused(400, f"{what}: must be 0 or more")
        raise _Refused(400, f"{what}: expected a whole number in ASCII digits")
    digits = raw.lstrip("0") or "0"
    if len(digits) > len(str(maximum)) or int(digits) > maximum:
        raise _Refused(400, f"{what}: at most {maximum}")
    return int(digits)


@dataclass(frozen=True, slots=True)
class _Query:
    """A request, canonical: the route and its parsed parameters (what the cache is keyed by)."""

    #: the route's path as the route table spells it ("/futures/{id}/logs")
    path: str
    #: the ``{id}`` in the path, when the route has one
    id: int | None = None
    #: every query parameter the route takes, by name, defaults filled in
    params: tuple[tuple[str, int], ...] = ()

    def get(self, name: str, default: int = 0) -> int:
        """The value of parameter ``name``."""
        for key, value in self.params:
            if key == name:
                return value
        return default

    @property
    def offset(self) -> int:
        return self.get("offset")

    @property
    def limit(self) -> int:
        return self.get("limit")


# -- one document per window, paged per request ------------------------------------------------
#
# A paged route's document is built for a window of its list (``_WINDOW`` entries from a multiple
# of ``MAX_PAGE``), and each request's page is cut from it on the HTTP side: however the
# clients vary ``?offset=`` and ``?limit=``, the program builds each window at most once per
# cache window (the cache's rule), not once per distinct request.

#: the list each paged route's document pages, by route
_PAGED_LISTS = {
    "/futures": "futures",
    "/channels": "channels",
    "/streams": "streams",
    "/tasks": "tasks",
    "/resources": "resources",
    "/functions": "functions",
    "/user_metrics": "metrics",
}
#: entries of a window: any page (at most ``MAX_PAGE`` from any offset) is in one window
_WINDOW = 2 * MAX_PAGE


def _window(query: _Query) -> _Query | None:
    """The request the program builds for ``query``'s page: its route's window that holds the
    page (None: the route is not paged, or ``query`` is that request already)."""
    if query.path not in _PAGED_LISTS:
        return None
    params = dict(query.params)
    start = params.get("offset", 0) // MAX_PAGE * MAX_PAGE
    if params == {"offset": start, "limit": _WINDOW}:
        return None
    window = tuple((name, start if name == "offset" else _WINDOW) for name, _ in query.params)
    return _Query(query.path, query.id, window)


class _Pages:
    """The windows parsed lately (a few, the newest kept), to cut pages from."""

    def __init__(self, most: int = 4) -> None:
        self.most = most
        self._parsed: OrderedDict[_Query, tuple[bytes, dict[str, Any]]] = OrderedDict()

    def page(self, query: _Query, window: _Query, answer: _Answer) -> _Answer:
        """``query``'s page of the ``window`` document ``answer`` holds."""
        if answer.status != 200:
            return answer
        held = self._parsed.get(window)
        if held is None or held[0] is not answer.body:
            held = (answer.body, orjson.loads(answer.body))
            self._parsed[window] = held
            while len(self._parsed) > self.most:
                self._parsed.popitem(last=False)
        self._parsed.move_to_end(window)
        document = dict(held[1])
        name = _PAGED_LISTS[query.path]
        start = query.offset - window.offset
        document[name] = document[name][start : start + query.limit]
        if "offset" in document:
            document["offset"], document["limit"] = query.offset, query.limit
        return dataclasses.replace(answer, body=orjson.dumps(document))


# -- responses ----------------------------------------------------------------------------------

_JSON = "application/json; charset=utf-8"


@dataclass(frozen=True, slots=True)
class _Answer:
    """What the program answers for one canonical request."""

    status: int
    media_type: str
    body: bytes
    #: nanoseconds it may be served again from the cache (0: not at all)
    fresh_ns: int = 0


def _error_body(status: int, message: str) -> bytes:
    from asyncflow import schema  # (when first needed: see openapi.Route.returns)

    return schema.dumps(schema.ErrorDocument(schema.ErrorInfo(status, message)))


def _canned(status: int, message: str) -> bytes:
    """A whole HTTP response that closes its connection, for answers given outside aiohttp."""
    body = _error_body(status, message)
    head = (
        f"HTTP/1.1 {status} {_phrase(status)}\r\n"
        f"Content-Type: {_JSON}\r\nX-Content-Type-Options: nosniff\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\nRetry-After: 1\r\n\r\n"
    )
    return head.encode("ascii") + body


@dataclass(frozen=True, slots=True)
class _Held:
    """An answer the cache holds: until when it is fresh, and when it was asked for."""

    answer: _Answer
    until: int
    asked: int


class _Cache:
    """Answers given lately, by canonical request, each fresh for its ``fresh_ns`` and kept
    ``stale_ns`` longer (to be served while its successor is built), bounded in entries and
    bytes: however many clients ask, each document is built at most once per window (the GIL
    is shared with the program), and spelling a request differently neither grows it nor
    rebuilds."""

    def __init__(self, entries: int, size: int, stale_ns: int = 0) -> None:
        self.max_entries = entries
        self.max_bytes = size
        self.stale_ns = stale_ns
        self.bytes = 0
        self._entries: OrderedDict[Hashable, _Held] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable, now: int) -> _Held | None:
        """What is held for ``key``, fresh or not (``now < until``); None past the stale time."""
        held = self._entries.get(key)
        if held is None:
            return None
        if now >= held.until + self.stale_ns:
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        return held

    def put(self, key: Hashable, now: int, answer: _Answer) -> None:
        self._drop(key)
        size = len(answer.body)
        if size > self.max_bytes or self.max_entries <= 0 or answer.fresh_ns <= 0:
            return
        for old in [k for k, h in self._entries.items() if now >= h.until + self.stale_ns]:
            self._drop(old)
        while self._entries and (
            len(self._entries) >= self.max_entries or self.bytes + size > self.max_bytes
        ):
            self._drop(next(iter(self._entries)))  # the least recently used
        self._entries[key] = _Held(answer, now + answer.fresh_ns, now)
        self.bytes += size

    def _drop(self, key: Hashable) -> None:
        gone = self._entries.pop(key, None)
        if gone is not None:
            self.bytes -= len(gone.answer.body)


# -- the HTTP side --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _FrontConfig:
    """What the HTTP side needs to know, sent to the endpoint process as its first message."""

    url: str
    #: the port served: the only one a ``Host`` header may name
    port: int
    #: host names (lower case) a ``Host`` header may name, besides loopback addresses
    names: tuple[str, ...]
    #: ``allowed_hosts`` has "*": any ``Host`` is answered
    any_host: bool
    token: str | None
    limits: Limits

    def wire(self) -> bytes:
        from asyncflow import schema  # (the program's side: loaded there already)

        return schema.dumps(dataclasses.asdict(self))  # allowed_hosts may hold anything

    @classmethod
    def from_wire(cls, data: bytes) -> _FrontConfig:
        fields = orjson.loads(data)
        fields["names"] = tuple(fields["names"])
        fields["limits"] = Limits(**fields["limits"])
        return cls(**fields)


# -- between the two processes ----------------------------------------------------------------
#
# Every message is a 4-byte big-endian length and that many bytes of JSON. The endpoint process
# sends ["ask", number, path, id, params], ["ready", pid] and ["error", where, text]; the program
# sends the front's configuration first, then for each "ask" [number, status, media type,
# fresh_ns, body length] followed by the body's bytes, as they are.

_LENGTH = struct.Struct("!I")


def _message(value: Any) -> bytes:
    data = orjson.dumps(value)
    return _LENGTH.pack(len(data)) + data
