"""What the rest of the panel costs: filtered-out tasks, CPU time and allocations per poll, and
sampling the threads.

- ``filter``: N tasks created and run to completion (each one ``await asyncio.sleep(0)``), in
  modes measured in alternating runs in one process: plain (no profiler, no task factory);
  ``factory``: asyncflow's task factory installed, no profiler running (what a Python-level
  task factory costs by itself); ``profiler``: a profiler running, no task factory; ``excluded``:
  whole-program mode with the tasks' module excluded (``exclude=``); ``tracked``: whole-program
  mode tracking them. Prints the time per task and the ratio to plain, median over pairs.
- ``cpu``: 1,000 tracked tasks stepping through ``await asyncio.sleep(0)``, profiled with
  ``cpu=True``, with ``allocations=True``, and with neither (the baseline): the ratio of each to
  the baseline, median over pairs, and the time added per poll. ``cpu`` reads
  getrusage(RUSAGE_THREAD) where there is one (user and system apart), ``cpu-total`` forces
  time.thread_time_ns (the total alone); ``alloc-blocks`` is
  ``allocations="blocks"`` (net blocks too, sys.getallocatedblocks), ``allocations`` is not.
  ``--heap N`` keeps N more objects alive (the block count walks the arenas: its cost grows
  with the heap).
- ``threads``: the time one sample of every thread takes (the collector's tick does one every
  0.5 s, off the program's threads), with T idle threads alive.

    python benchmarks/panel.py                    # all three, 9 pairs
    python benchmarks/panel.py --only cpu --pairs 15 --heap 1000000
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
from typing import Any

import asyncflow
from asyncflow.instrumentation import cpu
from asyncflow.model.threads import ThreadSampler

TASKS = 20_000
STEPPERS = 1_000
STEPS = 50


async def _noop() -> None:
    await asyncio.sleep(0)


async def _tasks(n: int) -> None:
    await asyncio.gather(*(asyncio.create_task(_noop()) for _ in range(n)))


def _timed_tasks(mode: str, n: int) -> float:
    """Seconds to create and finish ``n`` tasks in ``mode``."""

    async def main() -> float:
        factory = mode in ("factory", "excluded", "tracked")
        handle = asyncflow.instrument_tasks() if factory else None
        try:
            t0 = time.perf_counter()
            await _tasks(n)
            return time.perf_counter() - t0
        finally:
            if handle is not None:
                handle.undo()

    if mode in ("plain", "factory"):
        return asyncio.run(main())
    options: dict[str, Any] = {"exclude": [__name__]} if mode == "excluded" else {}
    with asyncflow.profile("bench", format="none", port=None, **options):
        return asyncio.run(main())


def filter_figures(pairs: int) -> None:
    modes = ("plain", "factory", "profiler", "excluded", "tracked")
    runs: dict[str, list[float]] = {m: [] for m in modes}
    _timed_tasks("plain", 1000)  # warm up
    for i in range(pairs):
        order = modes if i % 2 == 0 else tuple(reversed(modes))
        for mode in order:
            runs[mode].append(_timed_tasks(mode, TASKS))
    plain = runs["plain"]
    print(f"filter: {TASKS:,} tasks, each one sleep(0); median of {pairs} pairs")
    for mode in modes:
        per = statistics.median(runs[mode]) / TASKS * 1e9
        ratio = statistics.median(r / p for r, p in zip(runs[mode], plain, strict=True))
        print(f"  {mode:9}  {per:8.0f} ns/task  {ratio:5.2f}x plain")


async def _steppers() -> float:
    async def step() -> None:
        for _ in range(STEPS):
            await asyncio.sleep(0)

    handle = asyncflow.instrument_tasks()
    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(asyncio.create_task(step()) for _ in range(STEPPERS)))
        return time.perf_counter() - t0
    finally:
        handle.undo()


def _timed_steps(options: dict[str, Any]) -> float:
    options = dict(options)
    split = options.pop("split", True)
    rusage = cpu.thread_rusage
    if not split:
        cpu.thread_rusage = lambda: None
    try:
        with asyncflow.profile("bench", format="none", port=None, **options):
            return asyncio.run(_steppers())
    finally:
        cpu.thread_rusage = rusage


def cpu_figures(pairs: int, heap: int = 0) -> None:
    modes: dict[str, dict[str, Any]] = {
        "off": {},
        "cpu": {"cpu": True},
        "cpu-total": {"cpu": True, "split": False},
        "allocations": {"allocations": True},
        "alloc-blocks": {"allocations": "blocks"},
        "both": {"cpu": True, "allocations": True},
    }
    alive = [object() for _ in range(heap)]
    runs: dict[str, list[float]] = {m: [] for m in modes}
    _timed_steps({})
    names = list(modes)
    for i in range(pairs):
        for name in names if i % 2 == 0 else reversed(names):
            runs[name].append(_timed_steps(modes[name]))
    polls = STEPPERS * (STEPS + 1)
    base = runs["off"]
    print(
        f"cpu/allocations: {STEPPERS:,} tracked tasks x {STEPS} sleep(0), {len(alive):,} more "
        f"objects alive; median of {pairs} pairs"
    )
    for name in names:
        ratio = statistics.median(r / b for r, b in zip(runs[name], base, strict=True))
        added = statistics.median(
            (r - b) / polls * 1e9 for r, b in zip(runs[name], base, strict=True)
        )
        print(f"  {name:12} {ratio:5.2f}x profiled without it   {added:+7.0f} ns per poll")


def thread_figures(pairs: int) -> None:
    for alive in (0, 10, 100):
        stop = threading.Event()
        extra = [threading.Thread(target=stop.wait, daemon=True) for _ in range(alive)]
        for t in extra:
            t.start()
        try:
            sampler = ThreadSampler()
            times = []
            for _ in range(max(pairs, 5) * 4):
                t0 = time.perf_counter_ns()
                sampler.sample(t0)
                times.append(time.perf_counter_ns() - t0)
            per = statistics.median(times)
            print(f"threads: one sample with {alive + 1:3} threads: {per / 1000:7.1f} µs")
        finally:
            stop.set()
            for t in extra:
                t.join()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=9)
    parser.add_argument("--only", choices=("filter", "cpu", "threads"))
    parser.add_argument("--heap", type=int, default=0, help="objects kept alive (cpu)")
    args = parser.parse_args(argv)
    if args.only in (None, "filter"):
        filter_figures(args.pairs)
    if args.only in (None, "cpu"):
        cpu_figures(args.pairs, args.heap)
    if args.only in (None, "threads"):
        thread_figures(args.pairs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
