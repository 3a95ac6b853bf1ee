"""Overhead of asyncflow's instrumentation, as ratios measured side by side in one run.

Each workload runs uninstrumented and instrumented in alternating pairs (so machine noise hits
both alike); the figure is the median over pairs of instrumented time / uninstrumented time.
asyncflow's modes run with a profiler started and its collector draining; other profilers
(cProfile always; yappi, pyinstrument when installed) run on the same workload for scale.

    python benchmarks/run.py [--pairs N] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import statistics
import time
import timeit
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

import asyncflow

Workload = Callable[[], Coroutine[Any, Any, object]]
Deco = Callable[[Any], Any]


def _identity(fn: Any) -> Any:
    return fn


# -- workloads -------------------------------------------------------------------------------


def make_steps(deco: Deco, tasks: int, steps: int) -> tuple[Workload, int]:
    """Many tasks, each stepping through ``await asyncio.sleep(0)``: the per-poll cost."""

    @deco
    async def stepper() -> None:
        for _ in range(steps):
            await asyncio.sleep(0)

    async def main() -> object:
        return await asyncio.gather(*(asyncio.create_task(stepper()) for _ in range(tasks)))

    return main, tasks * (steps + 1)


def make_fanout(deco: Deco, roots: int) -> tuple[Workload, int]:
    """Fan-out of 3-deep nested coroutine calls, each leaf suspending once: the per-call cost."""

    @deco
    async def leaf(i: int) -> int:
        await asyncio.sleep(0)
        return i

    @deco
    async def middle(i: int) -> int:
        return sum([await leaf(i + k) for k in range(3)])

    @deco
    async def top(i: int) -> int:
        return sum([await middle(i + k) for k in range(3)])

    async def main() -> object:
        return await asyncio.gather(*(asyncio.create_task(top(i)) for i in range(roots)))

    return main, roots * 13  # calls: one top, three middles, nine leaves per root


def make_pipeline(deco: Deco, items: int) -> tuple[Workload, int]:
    """producer -> bounded queue -> 4 workers -> queue -> sink; queues instrumented when
    ``deco`` is ``asyncflow.future`` (tasks come from the mode): the per-message cost."""
    instrumented = deco is not _identity

    async def main() -> object:
        jobs: asyncio.Queue[int] = asyncio.Queue(64)
        results: asyncio.Queue[int] = asyncio.Queue()
        if instrumented:
            asyncflow.instrument_queue(jobs, name="jobs")
            asyncflow.instrument_queue(results, name="results")

        async def producer() -> None:
            for i in range(items):
                await jobs.put(i)

        async def worker() -> None:
            while True:
                item = await jobs.get()
                await results.put(item * 2)
                jobs.task_done()

        async def sink() -> int:
            total = 0
            for _ in range(items):
                total += await results.get()
            return total

        workers = [asyncio.create_task(worker()) for _ in range(4)]
        total = await asyncio.gather(asyncio.create_task(producer()), asyncio.create_task(sink()))
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        return total

    return main, items * 2  # put/get pairs: two queues


def make_agen_chain(deco: Deco, items: int) -> tuple[Workload, int]:
    """Three chained async generators passing tiny items: the per-item cost."""
    track: Deco = asyncflow.stream if deco is not _identity else _identity

    @track
    async def source() -> Any:
        for i in range(items):
            yield i

    @track
    async def double(upstream: Any) -> Any:
        async for i in upstream:
            yield i * 2

    @track
    async def keep_even(upstream: Any) -> Any:
        async for i in upstream:
            if i % 4 == 0:
                yield i

    async def main() -> object:
        return sum([i async for i in keep_even(double(source()))])

    return main, items * 2 + items // 2  # items through source, double and keep_even


# -- running ---------------------------------------------------------------------------------


def _time(main: Workload, tasks: bool) -> float:
    async def runner() -> None:
        if tasks:
            with asyncflow.instrument_tasks():
                await main()
        else:
            await main()

    gc.collect()
    start = time.perf_counter()
    asyncio.run(runner())
    return time.perf_counter() - start


def _with_profiler(kind: str, main: Workload) -> float:
    if kind == "cProfile":
        prof = cProfile.Profile()
        prof.enable()
        try:
            return _time(main, False)
        finally:
            prof.disable()
    if kind == "yappi":
        import yappi  # type: ignore[import-untyped, import-not-found, unused-ignore]

        yappi.clear_stats()
        yappi.start()
        try:
            return _time(main, False)
        finally:
            yappi.stop()
    if kind == "pyinstrument":
        import pyinstrument  # type: ignore[import-untyped, import-not-found, unused-ignore]

        sampler = pyinstrument.Profiler(async_mode="disabled")
        sampler.start()
        try:
            return _time(main, False)
        finally:
            sampler.stop()
    raise ValueError(kind)


def _available(kind: str) -> bool:
    try:
        __import__(kind)
    except ImportError:
        return False
    return True


def measure(
    name: str,
    build: Callable[[Deco], tuple[Workload, int]],
    modes: list[str],
    pairs: int,
    unit: str,
) -> dict[str, float]:
    """Median ratio to the plain run, per mode, over ``pairs`` alternating pairs."""
    plain, events = build(_identity)
    decorated, _ = build(asyncflow.future)
    ratios: dict[str, list[float]] = {m: [] for m in modes}
    _time(plain, False)  # warm up
    for _ in range(pairs):
        for mode in modes:
            base = _time(plain, False)
            if mode in ("decorator", "tasks", "tasks+queues", "streams"):
                workload = plain if mode == "tasks" else decorated
                with asyncflow.profile("bench", format="none"):
                    spent = _time(workload, mode in ("tasks", "tasks+queues"))
            else:
                spent = _with_profiler(mode, plain)
            ratios[mode].append(spent / base)
    medians = {m: statistics.median(r) for m, r in ratios.items()}
    base = statistics.median(_time(plain, False) for _ in range(3))
    print(f"\n{name}  (uninstrumented: {base * 1e3:.1f} ms, {events:,} {unit}s)")
    for mode, ratio in medians.items():
        extra = (ratio - 1) * base / events * 1e9
        print(f"  {mode:<13} {ratio:5.2f}x   (+{extra:,.0f} ns per {unit})")
    return medians


def floor_ns() -> tuple[float, float]:
    """Two clock reads plus one append to a bounded deque, and one clock read, in ns."""
    names = {"clock": time.perf_counter_ns, "append": deque(maxlen=4096).append}
    n = 200_000
    floor = timeit.repeat("t0 = clock(); append((t0, clock()))", globals=names, number=n, repeat=7)
    read = timeit.repeat("clock()", globals=names, number=n, repeat=7)
    return min(floor) / n * 1e9, min(read) / n * 1e9


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="asyncflow overhead benchmarks")
    parser.add_argument("--pairs", type=int, default=7, help="paired runs per mode (default 7)")
    parser.add_argument("--quick", action="store_true", help="smaller workloads, 3 pairs")
    parser.add_argument(
        "--no-others", action="store_true", help="skip cProfile, yappi and pyinstrument"
    )
    args = parser.parse_args(argv)
    pairs = 3 if args.quick else args.pairs
    scale = 4 if args.quick else 1
    others = [] if args.no_others else ["cProfile", "yappi", "pyinstrument"]
    others = [o for o in others if o == "cProfile" or _available(o)]

    floor, read = floor_ns()
    print(
        f"floor: two clock reads + one bounded-deque append = {floor:.0f} ns "
        f"(one clock read {read:.0f} ns)"
    )
    measure(
        "steps: 1000 tasks x 50 x await asyncio.sleep(0)",
        lambda deco: make_steps(deco, 1000 // scale, 50),
        ["decorator", "tasks", *others],
        pairs,
        "poll",
    )
    measure(
        "fan-out: 300 root tasks, 3-deep nested calls (3x3 leaves)",
        lambda deco: make_fanout(deco, 300 // scale),
        ["tasks", "decorator", *others],
        pairs,
        "call",
    )
    measure(
        "pipeline: producer -> queue(64) -> 4 workers -> queue -> sink, 20000 items",
        lambda deco: make_pipeline(deco, 20_000 // scale),
        ["tasks+queues", *others],
        pairs,
        "put/get pair",
    )
    measure(
        "chained async generators: 3 stages, 50000 tiny items",
        lambda deco: make_agen_chain(deco, 50_000 // scale),
        ["streams", *others],
        pairs,
        "item",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
