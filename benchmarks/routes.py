"""What labelling a request by its route costs: Starlette's ``Route.handle`` called as its router
calls it, with asyncflow's hook and without, under a profiler with every loop tracked (as
``asyncflow run`` runs a service).

Each of N tasks (tracked by the task factory) calls ``Route.handle`` once and closes the
coroutine it gets unrun; only the call is timed (``perf_counter_ns`` around it), so that the
figure is the hook's alone, not the task's. ``first-poll``: the call is made in the task's first
poll, as uvicorn's request task makes it (the task's call moves to the route's future);
``polled-before``: the task was polled once before (the route's handling is a call of its own,
whose polls, not run here, cost what a decorated call's do). Rounds alternate hooked and plain;
the best round of each is printed, since the machine's other work only adds.

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
        for mode in ("first-poll", "polled-before"):
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
