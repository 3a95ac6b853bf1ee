"""What the trace recorder costs: time per poll and per message, memory, and export.

Time: the stepping and pipeline workloads of ``benchmarks/run.py`` (tasks, and queues, tracked
whole-program), on each hot path (compiled where built, pure Python), each run in three modes
in alternating order, ``pairs`` times, in one process: plain (no profiler), profiler without a
trace ("off"), profiler with ``trace=True`` ("on").
The figures are medians over the pairs of on/off and of each to plain.

Memory: a profiler with ``trace_events=N`` runs the stepping workload until the ring has been
filled several times over; prints the Python heap the full ring holds (tracemalloc), per event,
and that it stays there however many more polls come. Export: the time the profiler's thread
takes to build the file of a full ring (what ``GET /trace`` serves and ``trace=`` writes), as CPU
time of that thread (what the program shares the GIL with) and wall time, median of
``--repeats`` builds, and the size of the file.

    python benchmarks/trace.py                       # 15 pairs, a ring of 100,000 events
    python benchmarks/trace.py --pairs 5 --events 20000
    python benchmarks/trace.py --export-only --repeats 5
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import statistics
import time
import tracemalloc
from typing import Any

from run import PATHS, Workload, hot_path, make_pipeline, make_steps  # benchmarks/run.py

import asyncflow
from asyncflow import config
from asyncflow.render import trace


def _identity(fn: Any) -> Any:
    return fn


def _time(main: Workload) -> float:
    async def runner() -> None:
        with asyncflow.instrument_tasks():
            await main()

    gc.collect()
    start = time.perf_counter()
    asyncio.run(runner())
    return time.perf_counter() - start


def _run(mode: str, main: Workload, plain: Workload) -> float:
    if mode == "plain":

        async def bare() -> None:
            await plain()

        gc.collect()
        start = time.perf_counter()
        asyncio.run(bare())
        return time.perf_counter() - start
    with asyncflow.profile("bench", format="none", port=None, trace=mode == "on"):
        return _time(main)


def time_cost(
    name: str, main: Workload, plain: Workload, events: int, unit: str, pairs: int, path: str
) -> None:
    modes = ("plain", "off", "on")
    runs: dict[str, list[float]] = {m: [] for m in modes}
    _run("on", main, plain)  # warm up
    for i in range(pairs):
        order = modes if i % 2 == 0 else modes[::-1]
        for mode in order:
            with hot_path(path):
                runs[mode].append(_run(mode, main, plain))
    on_off = statistics.median(on / off for on, off in zip(runs["on"], runs["off"], strict=True))
    off_plain = statistics.median(o / p for o, p in zip(runs["off"], runs["plain"], strict=True))
    on_plain = statistics.median(o / p for o, p in zip(runs["on"], runs["plain"], strict=True))
    base = statistics.median(runs["off"])
    extra = (on_off - 1) * base / events * 1e9
    print(
        f"{name:<9} {path:<8} {events:>6,} {unit}s"
        f"  plain {statistics.median(runs['plain']) * 1e3:6.1f} ms"
        f"  profiler off-trace {off_plain:4.2f}x  with trace {on_plain:4.2f}x"
        f"  |  trace on/off {on_off:4.2f}x (+{extra:,.0f} ns per {unit})  [{pairs} pairs]"
    )


def _build(recorder: trace.TraceRecorder) -> tuple[float, float, bytes]:
    """Build the file once, on the profiler's thread: (CPU seconds, wall seconds, the file)."""
    cpu, wall = time.thread_time(), time.perf_counter()
    data = recorder.data()
    return time.thread_time() - cpu, time.perf_counter() - wall, data


def memory_cost(capacity: int, repeats: int) -> None:
    main, polls = make_steps(_identity, 100, 100)
    rounds = max(2, 3 * capacity // polls + 1)
    with asyncflow.profile(
        "bench", format="none", port=None, trace=True, trace_events=capacity
    ) as prof:
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        held = []
        for i in range(rounds):
            _time(main)
            gc.collect()
            held.append(tracemalloc.get_traced_memory()[0] - before)
            if i == rounds // 2:
                half = held[-1]
        tracemalloc.stop()
        recorder = prof._trace
        assert recorder is not None
        builds = [prof._call(functools.partial(_build, recorder)) for _ in range(repeats)]
        data = builds[-1][2]
        start = time.perf_counter()
        document = prof.trace()  # the same, parsed
        parsed = time.perf_counter() - start
    meta = document["metadata"]["asyncflow"]
    cpu = statistics.median(b[0] for b in builds)
    wall = statistics.median(b[1] for b in builds)
    full = held[-1]
    print(
        f"\nmemory: a ring of {capacity:,} events, {meta['recorded']:,} recorded, "
        f"{meta['dropped']:,} dropped: {full / 2**20:.1f} MiB held "
        f"({full / capacity:.0f} bytes per event); halfway {half / 2**20:.1f} MiB: flat"
    )
    print(
        f"export: file built in {cpu * 1e3:.0f} ms of the profiler thread's CPU "
        f"({wall * 1e3:.0f} ms wall), median of {repeats}; {len(data) / 2**20:.1f} MiB of JSON "
        f"({len(document['traceEvents']):,} events); prof.trace() (parsed) {parsed * 1e3:.0f} ms"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=15)
    parser.add_argument("--events", type=int, default=config.DEFAULT_TRACE_EVENTS)
    parser.add_argument("--repeats", type=int, default=5, help="builds of the file timed")
    parser.add_argument("--export-only", action="store_true", help="memory and export only")
    args = parser.parse_args(argv)
    if args.export_only:
        memory_cost(args.events, args.repeats)
        return 0
    print("time (the trace keeps its default ring; medians of paired runs)")
    steps, polls = make_steps(_identity, 1000, 20)
    pipeline, messages = make_pipeline(asyncflow.future, 5000)  # its queues instrumented
    bare, _ = make_pipeline(_identity, 5000)
    for path in PATHS:  # the compiled hot path where it is built, then the pure-Python one
        time_cost("stepping", steps, steps, polls, "poll", args.pairs, path)
        time_cost("pipeline", pipeline, bare, messages, "message", args.pairs, path)
    memory_cost(args.events, args.repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
