"""What counting gathers costs: ``asyncio.gather`` of tracked calls, with asyncflow's stand-in
(which reads each child's call record and credits the one that ended last, one done-callback
per gather) and with asyncio's own, under a running profiler.

Each round runs N gathers one after another, on one loop, each of K tracked calls
(``@asyncflow.future``) that step once (``await asyncio.sleep(0)``) and return: the gather, its
tasks and their calls are timed whole, so the figure is the stand-in's cost against a real
gather's. Rounds alternate the stand-in and the plain gather; the best round of each is
printed, since the machine's other work only adds.

    python benchmarks/gathers.py
    python benchmarks/gathers.py --gathers 1000 --children 2 10 50 --rounds 31
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

import asyncflow
from asyncflow.instrumentation import gathers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gathers", type=int, default=200, help="gathers a round (200)")
    parser.add_argument(
        "--children", type=int, nargs="+", default=[2, 10, 50], help="calls per gather"
    )
    parser.add_argument("--rounds", type=int, default=61, help="rounds of each (default 61)")
    args = parser.parse_args(argv)

    @asyncflow.future(name="child")
    async def child() -> None:
        await asyncio.sleep(0)

    async def round_(gather: Any, n: int, k: int) -> float:
        t0 = time.perf_counter_ns()
        for _ in range(n):
            await gather(*(child() for _ in range(k)))
        spent = time.perf_counter_ns() - t0
        await asyncio.sleep(0)  # the last gather's credit runs outside the timing
        return spent / n

    async def compare(counting: Any, plain: Any) -> None:
        for k in args.children:
            best = {"plain": float("inf"), "counted": float("inf")}
            for i in range(args.rounds):
                for name in ("plain", "counted") if i % 2 else ("counted", "plain"):
                    gather = plain if name == "plain" else counting
                    best[name] = min(best[name], await round_(gather, args.gathers, k))
            extra = best["counted"] - best["plain"]
            print(
                f"  {k:>3} calls a gather: plain {best['plain'] / 1000:,.1f} us, counted "
                f"{best['counted'] / 1000:,.1f} us a gather: {extra / 1000:+,.2f} us "
                f"({extra / best['plain']:+.1%}, {extra / k:,.0f} ns a call)"
            )

    with asyncflow.profile("gathers", port="off", format="none"):
        assert asyncio.gather is gathers._gather, "the profiler did not stand in for gather"
        print(
            f"Python {sys.version.split()[0]}, {args.gathers:,} gathers a round, best of "
            f"{args.rounds}"
        )
        asyncio.run(compare(gathers._gather, gathers._wrapped))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
