"""Whole-program mode's routes: each request a web framework routes is a call of its route's
future (``GET /orders/{order_id}``), with no code change.

A server runs each request in a task of its own (uvicorn's ``RequestResponseCycle.run_asgi``,
aiohttp's ``RequestHandler._handle_request``): tracked as a task, every request of every route is
a call of that one future. Where the framework has matched the request's route, the call is
moved to the route's future instead, when the task was made for this request (its first poll
is running: a task that served a request before, or a connection's task, is never taken);
otherwise the route's handling is a call of its own, inside whatever runs it. The label is the
route's template and method, never the request's path: the futures are as many as the routes.
Requests no route matched (a 404, a 405) are one future, :data:`UNMATCHED`.

- Starlette (and FastAPI): ``Route.handle`` and ``WebSocketRoute.handle``, and
  ``Router.not_found`` for the unmatched;
- aiohttp: ``UrlMappingMatchInfo.freeze`` (called once a request is routed), and
  ``Application._handle`` where the request's task is not tracked (aiohttp makes it with
  ``asyncio.Task(..., eager_start=True)`` on 3.12+, past the loop's task factory).

The hooks are patched on the classes by :mod:`asyncflow.instrumentation.every_loop` once the
program imports the framework; each costs a request a dict lookup and a few stores, and nothing
while no profiler runs. On the compiled path aiohttp's decide their common case in C
(``_speedups.route_hook``: a task made for the request, a route seen before) and call their
Python rest for anything else.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import sys
import threading
import types
import weakref
from collections.abc import Callable, Coroutine
from typing import Any

from asyncflow.instrumentation import _session, futures
from asyncflow.schema import ROUTE

__all__ = [
    "ROUTE",
    "UNMATCHED",
    "aiohttp_patches",
    "fastapi_patches",
    "route_of",
    "starlette_patches",
]

#: the label of the requests no route matched
UNMATCHED = "(unmatched)"
#: the methods a label may name; any other is ``OTHER`` (a client chooses the method)
METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT"}
)
#: routes' futures kept in the cache; past it, those of gone routes are forgotten
CACHED = 4096

Patch = tuple[Any, str, Any]

#: (id of the route, method, its mounts' prefix) -> (a weak reference to the route, its future
#: for that method there): checked against the route (an id is reused); never keyed by a
#: method the client made up
_cache: dict[tuple[int, str, str], tuple[Any, futures.FutureRecord]] = {}
#: aiohttp's routes: id of the route -> (a weak reference to it, its future), checked against
#: the route (an id is reused); bounded as the cache is (the compiled hook reads it too)
_aiohttp_routes: dict[int, tuple[Any, futures.FutureRecord]] = {}
#: a request's ``root_path`` under a mount whose path has a parameter -> the mounts' template
#: (``/users/{uid}``, not ``/users/42``); bounded as the cache is
_prefixes: dict[str, str] = {}
#: the call of a task that was not made for its request (its first poll was over) -> the id and
#: future of the route's own call running inside it: the request the task serves now. No call
#: record is held (the future's live calls find it while it lives); call ids are never reused;
#: bounded as the cache is (a request served in a task of its own is not noted here)
_within: dict[int, tuple[int, futures.FutureRecord]] = {}
_get_ident = threading.get_ident
_get_running_loop = asyncio.events._get_running_loop


def _future(
    route: object, method: str, path: str, code: types.CodeType, module: str
) -> futures.FutureRecord:
    """The future of ``route`` for ``method`` (made, or found in the registry)."""
    label = f"{method} {path}" if method else path
    return futures._future_for(
        route,
        label,
        ROUTE,
        lambda: futures.FutureRecord(
            label,
            f"{module}:{code.co_qualname}",
            code.co_filename,
            code.co_firstlineno,
            False,
            ROUTE,
        ),
    )


def _remember(route: object, method: str, record: futures.FutureRecord, prefix: str = "") -> None:
    """Find ``record`` for ``route`` and ``method`` with a dict lookup from now on."""
    _keep(_cache, (id(route), method, prefix), route, record)


def _keep(
    cache: dict[Any, tuple[Any, futures.FutureRecord]],
    key: object,
    route: object,
    record: futures.FutureRecord,
) -> None:
    """``cache[key]``: ``route`` (weakly, checked when found: an id is reused) and its future;
    past ``CACHED`` entries, those of gone routes go first, then all."""
    owner = record.owner
    ref = owner if owner is not None and owner() is route else weakref.ref(route)
    if len(cache) >= CACHED:
        for known_key, (known, _) in list(cache.items()):
            if known() is None:
                del cache[known_key]
        if len(cache) >= CACHED:
            cache.clear()
    cache[key] = (ref, record)


def _fresh_task_call() -> Any:
    """The call of the task running now, if the task was made for what runs now: tracked by the
    task factory and in its first poll. None otherwise (and when no tracked call runs)."""
    _, outer = futures.running_on_thread(_get_ident())
    if outer is None or outer.polls or outer.future.tracked_by != "task":
        return None
    return outer


def _move_py(call: Any, record: futures.FutureRecord) -> None:
    """Make the running ``call`` a call of ``record`` from now on (its first poll runs: all its
    figures but that poll's start go there)."""
    old, new = call.stats, record.stats
    if old is not call.future.stats or old is new:
        return  # a call of an earlier session, or moved already
    new.live[call.call_id] = call
    new.created += 1
    if not new.first_call:  # a route's first request
        new.first_call = call.created
    call.future, call.stats, call.hist = record, new, new.poll_hist
    old.created -= 1
    old.live.pop(call.call_id, None)


#: the same in C where it is built (``_speedups.move_call``): once a request, with no frame
_move: Callable[[Any, futures.FutureRecord], None] = getattr(
    futures._speedups, "move_call", _move_py
)


def _route(record: futures.FutureRecord, coro: Any) -> Any:
    """``coro``, the handling of a request routed to ``record``: the request's task's call moves
    there, or ``coro`` is a call of its own, where the task was not made for the request."""
    _, call = futures.running_on_thread(_get_ident())  # (_fresh_task_call, inline)
    if call is not None and not call.polls and call.future.tracked_by == "task":
        _move(call, record)
        return coro
    if not _tracked_loop():
        return coro  # asyncflow's own endpoint, or a loop whose tasks are not tracked
    return _nested(call, futures.InstrumentedCoroutine(coro, record))


def _nested(outer: Any, wrapped: Any) -> Any:
    """``wrapped``, a request's call of its own inside ``outer`` (the task's call, or None),
    noted as the request ``outer`` serves now: its blocks name the route."""
    if outer is not None:
        _note(outer, wrapped._r)
    return wrapped


def _note(outer: Any, call: Any) -> None:
    """Note ``call`` (a route's) as the request the task whose call is ``outer`` serves now."""
    if len(_within) >= CACHED:
        _within.clear()
    _within[outer.call_id] = (call.call_id, call.future)


def route_of(outer: Any) -> str | None:
    """The route of the request that the outermost call running on a thread (``outer``, a task's
    step) serves now: its own future's label when it is a route's call, else that of the
    route's call running inside it; None when it serves no routed request (read from any
    thread: the loop monitor names the route of what blocks a loop)."""
    if outer is None:
        return None
    future = outer.future
    if getattr(future, "tracked_by", None) == ROUTE:
        return str(future.label)
    noted = _within.get(outer.call_id)
    if noted is None:
        return None
    call_id, route = noted
    call = route.stats.live.get(call_id)
    if call is None or not call.start:  # (over, or not polled: the task serves no route now)
        return None
    return str(route.label)


def _tracked_loop() -> bool:
    """Whether the loop running here tracks its tasks (whole-program mode's task factory)."""
    loop = _get_running_loop()
    return loop is not None and isinstance(loop.get_task_factory(), futures._TaskFactory)


#: the web frameworks whose application a server started on a tracked loop since the profiler
#: (or the tracking) began, in that order (kept once the tracking ends: the exit's report is
#: written after)
_serving: list[str] = []


def serving() -> list[str]:
    """The web frameworks whose application a server started on a tracked loop (its lifespan
    or startup ran there): the program serves requests, whether or not one came yet."""
    return list(_serving)


def forget_serving() -> None:
    """A new profiler or tracking begins: no application started under it yet."""
    _serving.clear()


def _starts(original: Callable[..., Any], framework: str) -> Callable[..., Any]:
    """``original`` (an application's start: Starlette's router's ``lifespan``, aiohttp's
    ``Application.startup``), noting that a server started ``framework``'s application on a
    tracked loop (not asyncflow's own endpoint, whose loop is not tracked)."""

    @functools.wraps(original)
    def started(*args: Any, **kwargs: Any) -> Any:
        try:
            if framework not in _serving and _tracked_loop():
                _serving.append(framework)
        except Exception as err:  # observing never breaks the program
            _session.internal_error("noting a web application's start", err)
        return original(*args, **kwargs)

    return _coroutine_function(started)


def _coroutine_function(wrapper: Callable[..., Any]) -> Callable[..., Any]:
    """``inspect.iscoroutinefunction`` still says yes, where Python can be told (3.12+)."""
    mark = getattr(inspect, "markcoroutinefunction", None)
    return mark(wrapper) if mark is not None else wrapper


# ---- Starlette (and FastAPI) ------------------------------------------------------------------


def starlette_patches(routing: types.ModuleType) -> list[Patch]:
    """What to patch in ``starlette.routing``: each route's ``handle`` and the router's
    ``not_found``."""
    patches: list[Patch] = []
    not_found = vars(routing.Router).get("not_found")
    unmatched = _Unmatched(_StarletteUnmatched, routing.__name__)
    if not_found is not None:
        unmatched.code = not_found.__code__
        patches.append((routing.Router, "not_found", _starlette_not_found(not_found, unmatched)))
    for cls, websocket in ((routing.Route, False), (routing.WebSocketRoute, True)):
        original = vars(cls).get("handle")
        if original is not None:
            patches.append((cls, "handle", _starlette_handle(original, websocket, unmatched)))
    mount = getattr(routing, "Mount", None)
    original = vars(mount).get("handle") if mount is not None else None
    if original is not None:
        patches.append((mount, "handle", _mount_handle(original)))
    lifespan = vars(routing.Router).get("lifespan")
    if lifespan is not None:
        patches.append((routing.Router, "lifespan", _starts(lifespan, "starlette")))
    return patches


def fastapi_patches(routing: types.ModuleType) -> list[Patch]:
    """What to patch in ``fastapi.routing``: ``APIRoute.handle``, which runs a route included
    from a router (``include_router(prefix=...)``) without Starlette's ``Route.handle``."""
    route = getattr(routing, "APIRoute", None)
    original = vars(route).get("handle") if route is not None else None
    context_of = getattr(routing, "_get_scope_effective_route_context", None)
    if original is None or context_of is None:
        return []  # a FastAPI unlike those known: Starlette's Route.handle labels its requests
    module = sys.modules.get("starlette.routing")
    unmatched = _Unmatched(_StarletteUnmatched, getattr(module, "__name__", routing.__name__))

    def path_of(route: Any, scope: Any) -> tuple[Any, str] | None:
        context = context_of(scope)
        if context is not None and getattr(context, "original_route", None) is route:
            path = getattr(context, "path", None)
            if isinstance(path, str) and path:  # the route where its router was included
                return context, path
        return None  # it runs Route.handle, which labels it

    return [(route, "handle", _starlette_handle(original, False, unmatched, path_of))]


def _prefix(scope: Any) -> str:
    """The template of the mounts a Starlette request went through (``/api``), from its
    ``root_path``, less the server's own (``app_root_path``, which a mount sets)."""
    root = scope.get("root_path", "")
    if not root:
        return ""
    known = _prefixes.get(root)
    if known is not None:
        return known
    top = scope.get("app_root_path")
    return root[len(top) :] if isinstance(top, str) and root.startswith(top) else ""


def _mount_handle(original: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., Any]:
    """``Mount.handle``: a mount whose path has a parameter notes its template for the routes
    under it (their ``root_path`` holds the value); other mounts' paths are their templates."""

    @functools.wraps(original)
    def handle(self: Any, scope: Any, receive: Any, send: Any) -> Any:
        coro = original(self, scope, receive, send)
        if _session.active is None:
            return coro
        try:
            path = self.path
            if "{" in path:
                root = scope["root_path"]
                # what this mount matched has as many segments as its path
                before = root.rsplit("/", path.count("/"))[0]
                if len(_prefixes) >= CACHED:
                    _prefixes.clear()
                _prefixes[root] = _prefix({**scope, "root_path": before}) + path
        except Exception as err:  # observing never breaks the program
            _session.internal_error("labelling a Starlette mount's routes", err)
        return coro

    return _coroutine_function(handle)


class _StarletteUnmatched:
    """What Starlette's requests no route matched are labelled after (see _Unmatched)."""


class _AiohttpUnmatched:
    """What aiohttp's requests no route matched are labelled after (see _Unmatched)."""


class _Unmatched:
    """The one future of a framework's requests that no route matched, made where it is first
    needed (labelled with the framework's own function that answers them)."""

    __slots__ = ("code", "module", "owner", "record")

    def __init__(self, owner: type, module: str, code: types.CodeType | None = None) -> None:
        self.owner = owner
        self.module = module
        self.code = code
        #: the future, once made (its owner is a class of this module's: it never goes)
        self.record: futures.FutureRecord | None = None

    def future(self, code: types.CodeType) -> futures.FutureRecord:
        record = self.record
        if record is None:
            record = _future(self.owner, "", UNMATCHED, self.code or code, self.module)
            self.record = record
        return record


def _starlette_handle(
    original: Callable[..., Coroutine[Any, Any, None]],
    websocket: bool,
    unmatched: _Unmatched,
    path_of: Callable[[Any, Any], tuple[Any, str] | None] | None = None,
) -> Callable[..., Any]:
    """The hook of a route's ``handle``; ``path_of(route, scope)`` says where the route is (what
    owns its future, and its path), or None to leave the request to another hook; None: the
    route itself, at its own path."""
    code = original.__code__

    @functools.wraps(original)
    def handle(self: Any, scope: Any, receive: Any, send: Any) -> Any:
        coro = original(self, scope, receive, send)
        if _session.active is None:
            return coro
        try:
            method = "WEBSOCKET" if websocket else scope["method"]
            if path_of is None:
                owner, path = self, self.path
            else:
                where = path_of(self, scope)
                if where is None:
                    return coro
                owner, path = where
            prefix = _prefix(scope) if scope.get("root_path") else ""
            known = _cache.get((id(owner), method, prefix))
            if known is not None and known[0]() is owner:
                return _route(known[1], coro)
            record = _starlette_future(
                self, owner, method, prefix + path, websocket, code, unmatched, prefix
            )
            return _route(record, coro)
        except Exception as err:  # observing never breaks the program: it runs as it would
            _session.internal_error("labelling a Starlette request by its route", err)
            return coro

    return _coroutine_function(handle)


def _starlette_future(
    route: Any,
    owner: Any,
    method: str,
    path: str,
    websocket: bool,
    code: types.CodeType,
    unmatched: _Unmatched,
    prefix: str,
) -> futures.FutureRecord:
    """The future of a Starlette request for ``route`` (at ``path``, where ``owner`` put it) by
    ``method``, found once."""
    if not websocket and route.methods and method not in route.methods:
        record = unmatched.future(code)  # a 405
    elif websocket or method in METHODS:
        record = _future(owner, method, path, code, unmatched.module)
    else:  # a method of the client's own: never a key of the cache
        return _future(owner, "OTHER", path, code, unmatched.module)
    if websocket or method in METHODS:
        _remember(owner, method, record, prefix)
    return record


def _starlette_not_found(
    original: Callable[..., Coroutine[Any, Any, None]], unmatched: _Unmatched
) -> Callable[..., Any]:
    code = original.__code__

    @functools.wraps(original)
    def not_found(self: Any, scope: Any, receive: Any, send: Any) -> Any:
        coro = original(self, scope, receive, send)
        if _session.active is None:
            return coro
        try:
            return _route(unmatched.future(code), coro)
        except Exception as err:  # observing never breaks the program
            _session.internal_error("labelling a Starlette request no route matched", err)
            return coro

    return _coroutine_function(not_found)


# ---- aiohttp ------------------------------------------------------------------------------


def aiohttp_patches(web_app: types.ModuleType) -> list[Patch]:
    """What to patch in aiohttp (given ``aiohttp.web_app``): the match info's ``freeze``, where
    a request's route is known, and the application's ``_handle``."""
    dispatcher = sys.modules.get("aiohttp.web_urldispatcher")
    application = getattr(web_app, "Application", None)
    match_info = getattr(dispatcher, "UrlMappingMatchInfo", None)
    handle = vars(application).get("_handle") if application is not None else None
    freeze = vars(match_info).get("freeze") if match_info is not None else None
    if handle is None or freeze is None or dispatcher is None:
        return []  # an aiohttp unlike those known: its requests stay its tasks' calls
    system = getattr(dispatcher, "SystemRoute", None)
    holder = _Unmatched(_AiohttpUnmatched, web_app.__name__, handle.__code__)
    patches: list[Patch] = [
        (application, "_handle", _aiohttp_handle(handle, holder)),
        (
            match_info,
            "freeze",
            _aiohttp_freeze(freeze, holder, system, _route_attribute(match_info)),
        ),
    ]
    startup = vars(application).get("startup")
    if startup is not None:
        patches.append((application, "startup", _starts(startup, "aiohttp")))
    return patches


def _aiohttp_handle(
    original: Callable[..., Coroutine[Any, Any, Any]], holder: _Unmatched
) -> Callable[..., Any]:
    code = original.__code__

    def rest(self: Any, request: Any, coro: Any) -> Any:
        """What ``_handle`` does with the framework's coroutine ``coro`` (the compiled hook
        decides the common case itself: a task made for the request)."""
        if _session.active is None:
            return coro
        try:
            _, call = futures.running_on_thread(_get_ident())  # (_fresh_task_call, inline)
            if (
                call is not None and not call.polls and call.future.tracked_by == "task"
            ) or not _tracked_loop():
                return coro  # freeze() moves the task's call; or asyncflow's own endpoint
            # a call of its own, the unmatched one's until freeze() finds its route
            return futures.InstrumentedCoroutine(coro, holder.future(code))
        except Exception as err:  # observing never breaks the program
            _session.internal_error("labelling an aiohttp request by its route", err)
            return coro

    compiled = getattr(futures._speedups, "route_hook", None)
    if compiled is not None:
        return _coroutine_function(
            functools.update_wrapper(compiled("handle", original, rest), original)
        )

    @functools.wraps(original)
    def _handle(self: Any, request: Any) -> Any:
        return rest(self, request, original(self, request))

    return _coroutine_function(_handle)


def _aiohttp_freeze(
    original: Callable[[Any], None], holder: _Unmatched, system: Any, route_attr: str
) -> Callable[[Any], None]:
    code = original.__code__

    def rest(self: Any, result: object) -> object:
        """What ``freeze`` does once the framework's has run (the compiled hook decides the
        common case itself: a known route, and a task made for the request)."""
        if _session.active is None:
            return result
        try:
            route = getattr(self, route_attr)
            known = _aiohttp_routes.get(id(route))
            if known is not None and known[0]() is route:
                record = known[1]
            else:
                record = _aiohttp_future(route, system, holder, code)
            # Once a request, so no helper is called where a look-up does (_fresh_task_call
            # and the holder's future, inline): the innermost call and the outermost here.
            here, outer = futures.running_on_thread(_get_ident())
            unmatched = holder.record or holder.future(code)
            if here is not None and here.polls == 0 and here.future is unmatched:
                _move(here, record)  # the call _handle() made for the request
                if outer is not None and outer is not here:
                    _note(outer, here)  # inside a task that served requests before
                return result
            if outer is not None and not outer.polls and outer.future.tracked_by == "task":
                _move(outer, record)  # the request's task's own call
        except Exception as err:  # observing never breaks the program
            _session.internal_error("labelling an aiohttp request by its route", err)
        return result

    compiled = getattr(futures._speedups, "route_hook", None)
    if compiled is not None:
        hook = compiled("freeze", original, rest, _aiohttp_routes, holder, route_attr)
        return functools.update_wrapper(hook, original)

    @functools.wraps(original)
    def freeze(self: Any) -> None:
        original(self)
        rest(self, None)

    return freeze


def _route_attribute(match_info: Any) -> str:
    """The attribute of aiohttp's match info that its hook reads the route from: the slot
    ``_route`` where the ``route`` property only returns it (no Python call a request), else
    ``route``."""
    prop = vars(match_info).get("route")
    getter = getattr(prop, "fget", None)
    names = getattr(getattr(getter, "__code__", None), "co_names", None)
    if (
        isinstance(prop, property)
        and names == ("_route",)
        and "_route" in getattr(match_info, "__slots__", ())
    ):
        return "_route"
    return "route"


def _aiohttp_future(
    route: Any, system: Any, holder: _Unmatched, code: types.CodeType
) -> futures.FutureRecord:
    """The future of an aiohttp route, found once (a route has one method: ``*`` for any)."""
    resource = getattr(route, "resource", None)
    path = getattr(resource, "canonical", None)
    if (system is not None and isinstance(route, system)) or not isinstance(path, str):
        return holder.future(code)  # (a system route is made for each unmatched request)
    method = route.method
    method = method if method in METHODS or method == "*" else "OTHER"
    record = _future(route, method, path, holder.code or code, holder.module)
    _keep(_aiohttp_routes, id(route), route, record)
    return record
