"""What labelling a request by its route costs: Starlette's ``Route.handle`` called as its router
calls it, with asyncflow's hook and without, under a profiler with every loop tracked (as
``asyncflow run`` runs a service).

Each of N tasks (tracked by the task factory) calls ``Route.handle`` once and closes the
coroutine it gets unrun; only the call is timed (``perf_counter_ns`` around it), so that the
figure is the hook's alone, not the task's. ``first-poll``: the call is made in the task's first
poll, as uvicorn's request task makes it (the task's call moves to the route's future);
``polled-before``: the task was polled once before (the route's handling is a call of its own,
whose polls, not run here, cost what a decorated call's do). ``aiohttp``: the application's
``_handle`` called and a match info frozen, as aiohttp does for each request, in the task's
first poll. Rounds alternate hooked and plain; the best round of each is printed, since the
machine's other work only adds.

    python benchmarks/routes.py
    python benchmarks/routes.py --tasks 20000 --rounds 21
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

import asyncflow
from asyncflow.instrumentation.every_loop import track_every_loop


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=5000, help="tasks a round (default 5000)")
    parser.add_argument("--rounds", type=int, default=15, help="rounds of each (default 15)")
    args = parser.parse_args(argv)
    profiler = asyncflow.profile("routes", port="off", format="none")
    profiler.start()
    tracking = track_every_loop(executors=False)
    try:
        from starlette import routing  # (imported once tracked: hooked now)
        from starlette.responses import PlainTextResponse

        async def endpoint(request: Any) -> PlainTextResponse:
            return PlainTextResponse("x")

        route = routing.Route("/orders/{order_id}", endpoint, methods=["GET"])
        scope = {"type": "http", "method": "GET", "path": "/orders/1"}
        hooked = routing.Route.handle
        plain = hooked.__wrapped__  # type: ignore[attr-defined]
        print(
            f"Python {sys.version.split()[0]}, {args.tasks:,} tasks a round, best of {args.rounds}"
        )
        for mode in ("first-poll", "polled-before", "aiohttp"):
            if mode == "aiohttp":
                _aiohttp(args.tasks, args.rounds)
                continue
            best = {"plain": float("inf"), "hooked": float("inf")}
            for i in range(args.rounds):
                for name in ("plain", "hooked") if i % 2 else ("hooked", "plain"):
                    routing.Route.handle = plain if name == "plain" else hooked  # type: ignore[method-assign]
                    spent = asyncio.run(_round(route, scope, args.tasks, mode == "first-poll"))
                    best[name] = min(best[name], spent / args.tasks)
            routing.Route.handle = hooked  # type: ignore[method-assign]
            extra = best["hooked"] - best["plain"]
            print(
                f"  {mode:>13}: plain {best['plain']:,.0f} ns, labelled {best['hooked']:,.0f} ns"
                f" a call: +{extra:,.0f} ns a request"
            )
    finally:
        tracking.undo()
        profiler.stop()
    return 0


def _aiohttp(tasks: int, rounds: int) -> None:
    from aiohttp import web, web_app, web_urldispatcher  # (hooked when imported)

    async def endpoint(request: Any) -> web.Response:
        return web.Response(text="x")

    app = web.Application()
    app.router.add_get("/items/{n}", endpoint)
    route = next(iter(app.router.routes()))
    hooks = (web_urldispatcher.UrlMappingMatchInfo.freeze, web_app.Application._handle)
    plain = tuple(hook.__wrapped__ for hook in hooks)  # type: ignore[union-attr]
    clock = time.perf_counter_ns

    async def one_round() -> int:
        spent = 0

        async def request() -> None:
            nonlocal spent
            match = web_urldispatcher.UrlMappingMatchInfo({"n": "1"}, route)
            t0 = clock()
            coro = app._handle(None)  # type: ignore[arg-type]
            match.freeze()
            spent += clock() - t0
            coro.close()

        loop = asyncio.get_running_loop()
        for _ in range(tasks):
            await loop.create_task(request())
        return spent

    best = {"plain": float("inf"), "hooked": float("inf")}
    for i in range(rounds):
        for name in ("plain", "hooked") if i % 2 else ("hooked", "plain"):
            freeze, handle = plain if name == "plain" else hooks
            web_urldispatcher.UrlMappingMatchInfo.freeze = freeze  # type: ignore[method-assign]
            web_app.Application._handle = handle  # type: ignore[method-assign]
            best[name] = min(best[name], asyncio.run(one_round()) / tasks)
    web_urldispatcher.UrlMappingMatchInfo.freeze = hooks[0]  # type: ignore[method-assign]
    web_app.Application._handle = hooks[1]  # type: ignore[method-assign]
    extra = best["hooked"] - best["plain"]
    print(
        f"  {'aiohttp':>13}: plain {best['plain']:,.0f} ns, labelled {best['hooked']:,.0f} ns"
        f" a call: +{extra:,.0f} ns a request"
    )


async def _round(route: Any, scope: dict[str, Any], tasks: int, first_poll: bool) -> int:
    clock = time.perf_counter_ns
    spent = 0

    async def request() -> None:
        nonlocal spent
        if not first_poll:
            await asyncio.sleep(0)
        t0 = clock()
        coro = route.handle(scope, None, None)
        spent += clock() - t0
        coro.close()

    loop = asyncio.get_running_loop()
    for _ in range(tasks):
        await loop.create_task(request())
    return spent


if __name__ == "__main__":
    raise SystemExit(main())
