"""A request Starlette routes is a call of its route's future, labelled by method and template,
whether the task running it was made for it (its call moves there) or not (a call of its own);
requests no route matched are one future, and the program sees its responses as without
asyncflow (issue 26). Real services: tests/services/test_routes.py."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Iterator, MutableMapping
from typing import Any

import httpx
import pytest
from starlette import routing
from starlette.applications import Starlette
from starlette.endpoints import HTTPEndpoint
from starlette.requests import Request
from starlette.responses import PlainTextResponse

import asyncflow
from asyncflow.schema import Snapshot
from tests.support.tracking import every_loop_tracked

PLAIN_HANDLE = routing.Route.handle


async def _order(request: Request) -> PlainTextResponse:
    await asyncio.sleep(0)
    return PlainTextResponse(request.path_params["order_id"])


class _Things(HTTPEndpoint):
    async def get(self, request: Request) -> PlainTextResponse:
        return PlainTextResponse("things")


def _app() -> Starlette:
    return Starlette(
        routes=[
            routing.Route("/orders/{order_id}", _order),  # GET (and HEAD)
            routing.Route("/things", _Things),  # any method: the endpoint says which
        ]
    )


#: (method, path) of each request, and the status it gets, with or without asyncflow
REQUESTS = [
    ("GET", "/orders/1", 200),
    ("GET", "/orders/2", 200),
    ("POST", "/orders/3", 405),  # the route does not take POST: no route's
    ("GET", "/nowhere", 404),
    ("GET", "/things", 200),
    ("PURGE", "/things", 405),  # a method of the client's choosing: OTHER
]
ROUTED = {
    "GET /orders/{order_id}": 2,
    "(unmatched)": 2,
    "GET /things": 1,
    "OTHER /things": 1,
}


@pytest.fixture
def tracked() -> Iterator[asyncflow.Profiler]:
    """A profiler, and every loop made from now on tracked as ``asyncflow run`` does."""
    with every_loop_tracked("routes") as prof:
        yield prof
    assert routing.Route.handle is PLAIN_HANDLE  # (put back)


def _routes(snapshot: Snapshot) -> dict[str, int]:
    return {
        f.label: f.call_count
        for f in snapshot.futures.futures
        if f.tracked_by == "route" and f.call_count
    }


async def _client_requests() -> list[tuple[str, str, int]]:
    transport = httpx.ASGITransport(app=_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
        return [
            (method, path, (await client.request(method, path)).status_code)
            for method, path, _ in REQUESTS
        ]


def test_requests_in_one_task_are_calls_of_their_routes(tracked: asyncflow.Profiler) -> None:
    # every request runs in the one task of asyncio.run(): each route's handling is a call
    assert asyncio.run(_client_requests()) == REQUESTS
    assert _routes(tracked.snapshot()) == ROUTED


def test_without_a_profiler_nothing_is_labelled() -> None:
    assert asyncio.run(_client_requests()) == REQUESTS  # (as the fixture's, untracked)


async def _serve(app: Starlette, method: str, path: str, root_path: str = "") -> int:
    """The request as a server sends it, in a task made for it (uvicorn's way); ``root_path``
    is the server's (``uvicorn --root-path``, behind a proxy), which ``path`` begins with."""
    status: list[int] = []
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": root_path,
        "headers": [],
        "server": ("app", 80),
    }

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])

    await asyncio.get_running_loop().create_task(app(scope, receive, send))
    return status[0]


async def _served_requests() -> list[tuple[str, str, int]]:
    app = _app()
    return [(m, p, await _serve(app, m, p)) for m, p, _ in REQUESTS]


def test_a_task_made_for_its_request_is_a_call_of_its_route(
    tracked: asyncflow.Profiler,
) -> None:
    assert asyncio.run(_served_requests()) == REQUESTS
    snapshot = tracked.snapshot()
    assert _routes(snapshot) == ROUTED
    # the requests' tasks (Starlette.__call__) moved to their routes: none is left there
    tasks = [f for f in snapshot.futures.futures if f.label == "Starlette.__call__"]
    assert [f.call_count for f in tasks] == [0]


def test_the_hooks_pass_for_what_they_wrap(tracked: asyncflow.Profiler) -> None:
    async def main() -> None:
        await _serve(_app(), "GET", "/orders/1")  # (starlette is imported: hooked now)

    asyncio.run(main())
    hooked = routing.Route.handle
    assert hooked is not PLAIN_HANDLE
    assert (hooked.__name__, hooked.__qualname__) == ("handle", "Route.handle")
    assert inspect.signature(hooked) == inspect.signature(PLAIN_HANDLE)


# ---- a blocked loop names the route the request belongs to ------------------------------------

#: the block threshold of these tests, and how long the handler's call blocks the loop
THRESHOLD = 0.05
BLOCK = 0.15


@asyncflow.future
async def checksum(order_id: str) -> str:
    time.sleep(BLOCK)  # blocks the loop: the finding names this call and its route
    return order_id


async def _blocking_order(request: Request) -> PlainTextResponse:
    return PlainTextResponse(await checksum(request.path_params["order_id"]))


def _blocking_app() -> Starlette:
    return Starlette(routes=[routing.Route("/orders/{order_id}", _blocking_order)])


@pytest.fixture
def blocked() -> Iterator[asyncflow.Profiler]:
    """As ``tracked``, with a block threshold that a short sleep reaches."""
    with every_loop_tracked("routes", block_threshold=THRESHOLD) as prof:
        yield prof


#: how the warning of the handler's block begins: the call, and the route it served
BLOCKED = "`checksum` in `GET /orders/{order_id}` blocked the event loop"


def _blocked_by(snapshot: Snapshot) -> list[str]:
    return [w.message for w in snapshot.warnings if w.kind == "loop-blocked"]


@pytest.mark.parametrize("own_task", [True, False], ids=["task-per-request", "one-task"])
def test_a_blocked_loop_names_the_call_and_its_route(
    blocked: asyncflow.Profiler, own_task: bool
) -> None:
    async def main() -> int:
        app = _blocking_app()
        if own_task:  # the request's task is the route's call (moved there)
            return await _serve(app, "GET", "/orders/7")
        transport = httpx.ASGITransport(app=app)  # the route's call inside asyncio.run's task
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
            return (await client.get("/orders/7")).status_code

    assert asyncio.run(main()) == 200
    snapshot = blocked.snapshot()
    assert snapshot.loop is not None
    # (a loaded machine may stall the loop elsewhere too: only the handler's blocks are judged)
    lines = [line for loop in snapshot.loop.loops for line in loop.blocking_lines]
    assert [line.route for line in lines if line.label == "checksum"] == ["GET /orders/{order_id}"]
    episodes = [e for loop in snapshot.loop.loops for e in loop.episodes]
    assert [e.route for e in episodes if e.call and e.call.label == "checksum"] == [
        "GET /orders/{order_id}"
    ]
    named = [m for m in _blocked_by(snapshot) if m.startswith("`checksum`")]
    assert [m[: len(BLOCKED)] for m in named] == [BLOCKED], _blocked_by(snapshot)


# ---- a mounted route is labelled with its mount's prefix ---------------------------------------


async def _item(request: Request) -> PlainTextResponse:
    return PlainTextResponse(request.path_params["id"])


def _mounted_app() -> Starlette:
    from fastapi import APIRouter, FastAPI

    api = APIRouter(prefix="/shop")

    @api.get("/orders/{order_id}")
    async def get_order(order_id: int) -> int:
        return order_id

    fast = FastAPI()
    fast.include_router(api, prefix="/v1")
    sub = FastAPI()
    sub.include_router(api)
    fast.mount("/sub", sub)  # a FastAPI app mounted in one
    items = [routing.Route("/items/{id}", _item)]
    return Starlette(
        routes=[
            routing.Mount("/api", routes=items),
            routing.Mount("/outer", routes=[routing.Mount("/inner", routes=items)]),
            routing.Mount("/fast", app=fast),
            routing.Mount("/users/{uid}", routes=items),  # labelled by its template
        ]
    )


MOUNTED = [
    ("GET", "/api/items/1", 200),
    ("GET", "/outer/inner/items/2", 200),
    ("GET", "/fast/v1/shop/orders/3", 200),
    ("GET", "/fast/sub/shop/orders/4", 200),
    ("GET", "/api/items/5", 200),
    ("GET", "/users/6/items/7", 200),
    ("GET", "/users/8/items/9", 200),
]


def test_a_mounted_route_is_labelled_with_its_full_template(tracked: asyncflow.Profiler) -> None:
    async def main() -> list[tuple[str, str, int]]:
        app = _mounted_app()
        return [(m, p, await _serve(app, m, p)) for m, p, _ in MOUNTED]

    assert asyncio.run(main()) == MOUNTED
    assert _routes(tracked.snapshot()) == {
        "GET /api/items/{id}": 2,
        "GET /outer/inner/items/{id}": 1,
        "GET /fast/v1/shop/orders/{order_id}": 1,
        "GET /fast/sub/shop/orders/{order_id}": 1,
        "GET /users/{uid}/items/{id}": 2,
    }


def test_a_block_after_the_request_is_not_blamed_on_its_route(
    blocked: asyncflow.Profiler,
) -> None:
    # the task served a request (a route's call of its own inside it), then blocks on its own
    async def main() -> int:
        await asyncio.sleep(0)  # polled before: the request's route is a call inside it
        transport = httpx.ASGITransport(app=_blocking_app())
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
            status = (await client.get("/orders/7")).status_code
        await after()
        return status

    @asyncflow.future
    async def after() -> None:
        time.sleep(BLOCK)  # no request is served now

    assert asyncio.run(main()) == 200
    snapshot = blocked.snapshot()
    assert snapshot.loop is not None
    # (episodes: published while the block lasts; a line gets its block once it is seen over)
    episodes = {
        e.call.label.rpartition(".")[2]: e.route
        for loop in snapshot.loop.loops
        for e in loop.episodes
        if e.call is not None
    }
    assert episodes == {"checksum": "GET /orders/{order_id}", "after": None}, episodes


def test_the_servers_root_path_is_no_part_of_a_label(tracked: asyncflow.Profiler) -> None:
    async def main() -> list[int]:
        app = _mounted_app()
        return [
            await _serve(app, "GET", "/proxy/api/items/1", "/proxy"),
            await _serve(_app(), "GET", "/proxy/orders/2", "/proxy"),  # (no mount at all)
        ]

    assert asyncio.run(main()) == [200, 200]
    assert _routes(tracked.snapshot()) == {"GET /api/items/{id}": 1, "GET /orders/{order_id}": 1}


def _moves() -> list[Any]:
    from asyncflow.instrumentation import futures, routes

    moves: list[Any] = [routes._move_py]
    if futures._speedups is not None:
        moves.append(futures._speedups.move_call)
    return moves


@pytest.mark.parametrize("move", _moves(), ids=lambda m: getattr(m, "__name__", "move"))
def test_a_moved_call_leaves_its_tasks_future_for_its_routes(move: Any) -> None:
    # routes._move, in Python and in C (_speedups.move_call, once a request): the request's
    # task's call becomes a call of its route's future, counted there and no longer in the
    # task's; moving it again, or a call of an earlier session, changes nothing.
    from asyncflow.instrumentation import futures

    def future(label: str, by: str) -> futures.FutureRecord:
        return futures.FutureRecord(label, f"m:{label}", __file__, 1, False, by)

    task, route = future("RequestHandler._handle_request", "task"), future("GET /x", "route")
    call = futures.CallRecord(task, task.stats, time.perf_counter_ns())
    task.stats.live[call.call_id] = call
    created = task.stats.created  # (the record counts itself, where it is the C one)
    move(call, route)
    assert (call.future, call.stats, call.hist) == (route, route.stats, route.stats.poll_hist)
    assert dict(route.stats.live) == {call.call_id: call} and route.stats.created == 1
    assert not task.stats.live and task.stats.created == created - 1
    move(call, route)  # moved already
    assert dict(route.stats.live) == {call.call_id: call} and route.stats.created == 1
    other = future("GET /y", "route")
    call.stats = task.stats  # as if of an earlier session: its future's stats are others now
    move(call, other)
    assert call.future is route and not other.stats.live and other.stats.created == 0


async def _lifespan(app: Starlette) -> list[str]:
    """What an ASGI server does as it starts an application and stops it: the lifespan."""
    said: list[str] = []
    messages = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])

    async def receive() -> MutableMapping[str, Any]:
        return next(messages)

    async def send(message: MutableMapping[str, Any]) -> None:
        said.append(message["type"])

    await app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, receive, send)
    return said


def test_an_application_whose_lifespan_a_server_ran_says_the_program_serves(
    tracked: asyncflow.Profiler,
) -> None:
    """Requests through a test client are not a server; a server runs the application's
    lifespan as it starts it (uvicorn, hypercorn): a web service from then on, one request came
    or not. The lifespan goes as without asyncflow."""
    assert asyncio.run(_client_requests()) == REQUESTS
    assert tracked.snapshot().status.serving == []
    said = ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert asyncio.run(_lifespan(_app())) == said
    assert tracked.snapshot().status.serving == ["starlette"]


def test_an_applications_lifespan_goes_alike_without_a_profiler() -> None:
    said = ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert asyncio.run(_lifespan(_app())) == said
