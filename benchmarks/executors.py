"""Cost of instrumenting executors: run_in_executor round trips, plain against instrumented,
in alternating pairs in one run, with a profiler running. Prints the median ratio."""

from __future__ import annotations

import asyncio
import statistics
import time

import asyncflow

JOBS = 3000
PAIRS = 7


def job() -> int:
    return 1


async def work(n: int, instrumented: bool) -> float:
    handle = asyncflow.instrument_executors() if instrumented else None
    loop = asyncio.get_running_loop()
    started = time.perf_counter()
    for _ in range(n):
        await loop.run_in_executor(None, job)
    elapsed = time.perf_counter() - started
    if handle is not None:
        handle.undo()
    return elapsed


async def main() -> None:
    plain: list[float] = []
    instrumented: list[float] = []
    for _ in range(PAIRS):
        plain.append(await work(JOBS, False))
        instrumented.append(await work(JOBS, True))
    ratios = [b / a for a, b in zip(plain, instrumented, strict=True)]
    print(
        f"run_in_executor round trip, {PAIRS} pairs of {JOBS:,} jobs: median ratio "
        f"{statistics.median(ratios):.2f}x; per job {statistics.median(plain) / JOBS * 1e6:.1f} "
        f"us plain, {statistics.median(instrumented) / JOBS * 1e6:.1f} us instrumented"
    )


if __name__ == "__main__":
    with asyncflow.profile("executors-benchmark", format="none", port=None):
        asyncio.run(main())
