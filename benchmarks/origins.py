"""Cost of recording where never-awaited coroutines were created: creating and awaiting a
coroutine with CPython's coroutine origin tracking off and on (what track_never_awaited's
origin=True turns on), in alternating pairs in one run. Prints the median ratio."""

from __future__ import annotations

import asyncio
import statistics
import sys
import time

N = 200_000
PAIRS = 7


async def leaf() -> int:
    return 1


async def driver() -> float:
    started = time.perf_counter()
    for _ in range(N):
        await leaf()
    return time.perf_counter() - started


def timed(depth: int) -> float:
    sys.set_coroutine_origin_tracking_depth(depth)
    try:
        return asyncio.run(driver())
    finally:
        sys.set_coroutine_origin_tracking_depth(0)


def main() -> None:
    off: list[float] = []
    on: list[float] = []
    for _ in range(PAIRS):
        off.append(timed(0))
        on.append(timed(1))
    ratios = [b / a for a, b in zip(off, on, strict=True)]
    per = (statistics.median(on) - statistics.median(off)) / N * 1e9
    print(
        f"create + await a coroutine, {PAIRS} pairs of {N:,}: origin tracking on costs "
        f"{statistics.median(ratios):.2f}x ({per:+.0f} ns per coroutine created)"
    )


if __name__ == "__main__":
    main()
