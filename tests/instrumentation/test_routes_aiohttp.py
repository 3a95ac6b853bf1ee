"""A request aiohttp routes is a call of its route's future (routes.py's hooks of
``Application._handle`` and ``UrlMappingMatchInfo.freeze``; on the compiled path
``_speedups.route_hook`` decides their common case in C), driven in this process with aiohttp's
mocked requests: a task made for each request (its call moves to the route), one task serving
several (each request a call of its own), routes seen for the first time and again, and the
requests no route matched. The program gets the same responses as without asyncflow. A real
aiohttp service under ``asyncflow run``: tests/services/test_routes.py."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web, web_urldispatcher
from aiohttp.test_utils import make_mocked_request

import asyncflow
from asyncflow.instrumentation import futures, routes
from asyncflow.instrumentation.every_loop import track_every_loop
from asyncflow.schema import Snapshot
from tests.support.compiled_path import compiled
from tests.support.tracking import every_loop_tracked

PLAIN_HANDLE = web.Application._handle
PLAIN_FREEZE = web_urldispatcher.UrlMappingMatchInfo.freeze
PLAIN_STARTUP = web.Application.startup


async def _order(request: web.Request) -> web.Response:
    await asyncio.sleep(0)  # the request's task suspends in its route's handler
    return web.Response(text=request.match_info["order_id"])


async def _health(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def _app() -> web.Application:
    app = web.Application()
    app.router.add_get("/orders/{order_id}", _order)
    app.router.add_get("/health", _health)
    return app


#: each request's path and the status it gets, with or without asyncflow
REQUESTS = [
    ("/orders/1", 200),
    ("/health", 200),
    ("/orders/2", 200),
    ("/nowhere", 404),
    ("/orders/3", 200),
]
#: the calls of each route's future those requests make (HEAD comes with aiohttp's GET)
ROUTED = {"GET /orders/{order_id}": 3, "GET /health": 1, "(unmatched)": 1}


@pytest.fixture
def tracked() -> Iterator[asyncflow.Profiler]:
    """A profiler, and every loop made from now on tracked as ``asyncflow run`` does."""
    with every_loop_tracked("routes") as prof:
        yield prof
    assert web.Application._handle is PLAIN_HANDLE  # (put back)
    assert web_urldispatcher.UrlMappingMatchInfo.freeze is PLAIN_FREEZE


def _routes(snapshot: Snapshot) -> dict[str, int]:
    return {
        f.label: f.call_count
        for f in snapshot.futures.futures
        if f.tracked_by == "route" and f.call_count
    }


async def _serve(app: web.Application, path: str) -> int:
    """What aiohttp's request handler does with a request: the application handles it (an HTTP
    error raised is its response)."""
    try:
        response = await app._handle(make_mocked_request("GET", path, app=app))
    except web.HTTPException as error:
        return error.status
    return response.status


async def _each_in_a_task() -> list[tuple[str, int]]:
    app = _app()
    return [(path, await asyncio.create_task(_serve(app, path))) for path, _ in REQUESTS]


async def _all_in_one_task() -> list[tuple[str, int]]:
    await asyncio.sleep(0)  # (the task's first poll is over: it was not made for a request)
    app = _app()
    return [(path, await _serve(app, path)) for path, _ in REQUESTS]


def test_the_requests_are_served_alike_without_a_profiler() -> None:
    assert asyncio.run(_each_in_a_task()) == REQUESTS
    assert asyncio.run(_all_in_one_task()) == REQUESTS


def test_a_task_made_for_its_request_is_a_call_of_its_route(tracked: asyncflow.Profiler) -> None:
    assert asyncio.run(_each_in_a_task()) == REQUESTS
    snapshot = tracked.snapshot()
    assert _routes(snapshot) == ROUTED
    # the tasks' calls moved to their routes: none is left in the task's own future
    served = [f.call_count for f in snapshot.futures.futures if f.label == "_serve"]
    assert served == [0]


def test_requests_in_one_task_are_calls_of_their_routes(tracked: asyncflow.Profiler) -> None:
    assert asyncio.run(_all_in_one_task()) == REQUESTS
    snapshot = tracked.snapshot()
    assert _routes(snapshot) == ROUTED
    main = [f.call_count for f in snapshot.futures.futures if f.label == "_all_in_one_task"]
    assert main == [1]  # the task's own call stays its own


def test_without_a_profiler_nothing_is_labelled() -> None:
    with asyncflow.profile("routes", format="none") as prof:
        pass
    tracking = track_every_loop(executors=False)
    try:
        assert asyncio.run(_each_in_a_task()) == REQUESTS
    finally:
        tracking.undo()
    assert _routes(prof.snapshot()) == {}


def test_the_hooks_pass_for_what_they_wrap(tracked: asyncflow.Profiler) -> None:
    asyncio.run(_each_in_a_task())
    handle: Any = web.Application._handle
    freeze: Any = web_urldispatcher.UrlMappingMatchInfo.freeze
    assert handle is not PLAIN_HANDLE and freeze is not PLAIN_FREEZE
    assert (handle.__name__, handle.__qualname__) == ("_handle", "Application._handle")
    assert (freeze.__name__, freeze.__qualname__) == ("freeze", "UrlMappingMatchInfo.freeze")
    assert handle.__wrapped__ is PLAIN_HANDLE and freeze.__wrapped__ is PLAIN_FREEZE
    assert inspect.signature(handle) == inspect.signature(PLAIN_HANDLE)
    assert inspect.signature(freeze) == inspect.signature(PLAIN_FREEZE)
    assert inspect.iscoroutinefunction(handle) == (
        hasattr(inspect, "markcoroutinefunction")  # (3.12+: said so; 3.11 cannot be told)
    )


def test_an_application_started_on_the_programs_loop_says_the_program_serves(
    tmp_path: Any,
) -> None:
    """An aiohttp application a runner starts on the program's loop is a web service's (its
    one-off start-up blocks held no request up, one came or not); asyncflow's own endpoint,
    an aiohttp application on the profiler's loop, is not the program's."""

    async def serve() -> None:
        runner = web.AppRunner(_app())
        await runner.setup()  # (its startup signals run here)
        try:
            await web.UnixSite(runner, str(tmp_path / "app.sock")).start()
        finally:
            await runner.cleanup()

    with every_loop_tracked("serving", port=0) as prof:
        assert prof.snapshot().status.serving == []  # its endpoint is served, started
        asyncio.run(_each_in_a_task())  # requests handled, no server started
        assert prof.snapshot().status.serving == []
        asyncio.run(serve())
        assert prof.snapshot().status.serving == ["aiohttp"]
    assert web.Application.startup is PLAIN_STARTUP  # (put back)
    with every_loop_tracked("again") as prof:
        assert prof.snapshot().status.serving == []  # (a tracking of its own)


def test_the_route_is_read_from_its_slot_where_the_property_only_returns_it() -> None:
    assert routes._route_attribute(web_urldispatcher.UrlMappingMatchInfo) == "_route"

    class Computed(web_urldispatcher.UrlMappingMatchInfo):
        @property
        def route(self) -> Any:  # another route than the slot's: read through the property
            return None

    assert routes._route_attribute(Computed) == "route"


# ---- the compiled hook ------------------------------------------------------------------------


class _Framework:
    """A framework's class whose method is hooked."""

    def handle(self, request: int) -> list[Any]:
        return [self, request]


@compiled
def test_the_compiled_hook_binds_and_returns_as_the_method_it_hooks() -> None:
    speedups = futures._speedups
    seen: list[tuple[Any, ...]] = []

    def rest(self: Any, request: Any, result: Any) -> Any:
        seen.append((self, request, result))
        return ("rest", result)

    hook = speedups.route_hook("handle", _Framework.handle, rest)
    obj: Any = _Framework()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_Framework, "handle", hook)
        assert obj.handle(1) == [obj, 1]  # no profiler: the framework's own, nothing else
        assert seen == []
        with asyncflow.profile("routes", format="none"):
            # a profiler, but no tracked call runs here: the Python rest decides
            assert obj.handle(2) == ("rest", [obj, 2])
            assert seen == [(obj, 2, [obj, 2])]
            bound = obj.handle  # (as aiohttp keeps ``app._handle``)
            assert bound(3) == ("rest", [obj, 3])
            assert getattr(_Framework, "handle")(obj, 4) == ("rest", [obj, 4])  # noqa: B009


@compiled
def test_the_compiled_hook_lets_the_frameworks_error_through() -> None:
    def failing(self: Any, request: Any) -> None:
        raise LookupError(request)

    def rest(*args: Any) -> None:
        raise AssertionError("not called: the framework raised")

    hook = futures._speedups.route_hook("handle", failing, rest)
    with asyncflow.profile("routes", format="none"), pytest.raises(LookupError, match="7"):
        hook(object(), 7)


@compiled
@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("handle", _Framework.handle), TypeError),  # no rest
        (("handle", 1, print), TypeError),  # not callable
        (("route", _Framework.handle, print), ValueError),  # no such kind
        (("freeze", _Framework.handle, print), TypeError),  # freeze needs its cache and holder
        (("freeze", _Framework.handle, print, [], None, "_route"), TypeError),  # not a dict
    ],
)
def test_a_compiled_hook_made_wrong_says_so(args: tuple[Any, ...], error: type) -> None:
    with pytest.raises(error):
        futures._speedups.route_hook(*args)
