"""What instrumenting a synchronisation primitive costs: time per operation, and memory.

Time: an uncontended ``async with lock: pass`` (and the same for a semaphore, and an
``Event.wait()`` on a set event), per operation, in three modes measured in alternating runs in
one process: plain, instrumented with no profiler running, instrumented with a profiler running
(its collector draining). The figure is the median over pairs of instrumented / plain.

Memory: N short-lived primitives made under ``instrument_locks()``, each acquired (with one
contender, so that it has a wait, a hold and a log) and dropped, with a profiler running; prints
the growth of the resident memory and of the Python heap (tracemalloc) per primitive, and how
many records the registry keeps.

    python benchmarks/resources.py                 # both, 15 pairs, 10,000 primitives
    python benchmarks/resources.py --pairs 5 --objects 2000
    python benchmarks/resources.py --only time     # or --only memory
    python benchmarks/resources.py --instructions  # instructions per operation (callgrind)

Instructions: each case and mode runs in its own process under ``valgrind --tool=callgrind``,
which counts only inside ``sys.call_tracing`` (the operations, driven to completion without
the loop: none of them suspends), so the figures repeat on a noisy machine where times do not.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import re
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import asyncflow
from asyncflow.instrumentation import resources
from asyncflow.instrumentation.resources import instrument_lock, instrument_locks

OPS = 20_000


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def _with_lock(lock: Any, n: int) -> None:
    for _ in range(n):
        async with lock:
            pass


async def _event_wait(event: Any, n: int) -> None:
    for _ in range(n):
        await event.wait()


def _set_event() -> asyncio.Event:
    event = asyncio.Event()
    event.set()
    return event


CASES: dict[str, tuple[Callable[[], Any], Callable[[Any, int], Any]]] = {
    "async with Lock": (asyncio.Lock, _with_lock),
    "async with Semaphore(10)": (lambda: asyncio.Semaphore(10), _with_lock),
    "Event.wait() when set": (_set_event, _event_wait),
}


async def _per_op(make: Callable[[], Any], use: Callable[[Any, int], Any], wrap: bool) -> float:
    primitive = make()
    if wrap:
        instrument_lock(primitive)
    await use(primitive, 200)  # warm up
    start = time.thread_time_ns()
    await use(primitive, OPS)
    return (time.thread_time_ns() - start) / OPS


async def _pairs(pairs: int, profiler: bool) -> dict[str, tuple[float, float, list[float]]]:
    out: dict[str, tuple[float, float, list[float]]] = {}
    for case, (make, use) in CASES.items():
        plain: list[float] = []
        instrumented: list[float] = []
        for _ in range(pairs):
            gc.collect()
            plain.append(await _per_op(make, use, False))
            gc.collect()
            instrumented.append(await _per_op(make, use, True))
        ratios = [i / p for p, i in zip(plain, instrumented, strict=True)]
        out[case] = (statistics.median(plain), statistics.median(instrumented), ratios)
    return out


def creation_figures(pairs: int) -> None:
    """Print what making a primitive costs under ``instrument_locks()`` (frame walk, record)."""
    n = 2_000
    plain: list[float] = []
    instrumented: list[float] = []
    for _ in range(pairs):
        for out, whole in ((plain, False), (instrumented, True)):
            gc.collect()
            with contextlib.ExitStack() as stack:
                if whole:
                    stack.enter_context(instrument_locks())
                start = time.thread_time_ns()
                kept = [asyncio.Lock() for _ in range(n)]
                out.append((time.thread_time_ns() - start) / n)
                del kept
    print(
        f"{'asyncio.Lock()':<28} {'instrument_locks()':<22} {statistics.median(plain):>9.0f} "
        f"{statistics.median(instrumented):>10.0f} (creation, ns each)"
    )


def time_figures(pairs: int) -> None:
    """Print ns per operation and the median ratio, without and with a profiler running."""
    print(
        f"uncontended operations, {OPS} per run, median of {pairs} alternating pairs "
        "(CPU time of the loop's thread)"
    )
    print(f"{'case':<28} {'mode':<22} {'plain ns':>9} {'instr. ns':>10} {'ratio':>6}")
    for mode in ("no profiler", "profiler running"):
        if mode == "profiler running":
            with asyncflow.profile("bench", format="none"):
                figures = asyncio.run(_pairs(pairs, True))
        else:
            figures = asyncio.run(_pairs(pairs, False))
        for case, (plain, inst, ratios) in figures.items():
            print(
                f"{case:<28} {mode:<22} {plain:>9.0f} {inst:>10.0f} "
                f"{statistics.median(ratios):>5.2f}x"
            )


async def _short_lived(n: int) -> None:
    """n primitives, each made, contended once (a wait, two holds), and dropped."""
    for i in range(n):
        lock = asyncio.Lock()
        async with lock:
            waiter = asyncio.create_task(_with_lock(lock, 1))
            await asyncio.sleep(0)
        await waiter
        del lock, waiter
        if i % 500 == 0:
            # the collector's reaping, as it runs every 50 ms while a profiler runs
            resources.reap(collecting=True)
    await asyncio.sleep(0)


def memory_figures(n: int) -> None:
    """Print what n short-lived instrumented locks leave behind."""
    with asyncflow.profile("bench", format="none"), instrument_locks():
        asyncio.run(_short_lived(200))  # warm up: import, first records, the history's fill
        gc.collect()
        resources.reap(collecting=True)
        rss = _rss_bytes()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        asyncio.run(_short_lived(n))
        gc.collect()
        resources.reap(collecting=True)
        heap = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        grown = _rss_bytes() - rss
        kept = len(resources.resource_registry())
    print(f"{n} short-lived locks under instrument_locks(), profiler running:")
    print(f"  Python heap growth  {heap / 1024:9.1f} KiB  ({heap / n:.1f} B per lock)")
    print(f"  RSS growth          {grown / 1024:9.1f} KiB  (tracemalloc's own tables included)")
    print(f"  records kept        {kept} (the last {resources.GONE_KEPT} gone, plus aggregates)")


_MODES = ("plain", "instrumented", "profiler", "instrumented+profiler")


def _drive(coro: Any) -> None:
    try:
        coro.send(None)
    except StopIteration:
        return
    raise RuntimeError("an uncontended operation suspended")  # pragma: no cover


def one_run(case: str, mode: str, n: int) -> None:
    """n operations of one case in one mode, inside sys.call_tracing (what callgrind counts)."""
    make, use = CASES[case]

    async def run() -> None:
        primitive = make()
        if mode.startswith("instrumented"):
            instrument_lock(primitive)
        await use(primitive, 200)  # warm up
        sys.call_tracing(_drive, (use(primitive, n),))

    with contextlib.ExitStack() as stack:
        if mode.endswith("profiler"):
            stack.enter_context(asyncflow.profile("bench", format="none"))
        asyncio.run(run())


def instruction_figures(n: int) -> None:
    """Print instructions per operation for each case in each mode, counted by callgrind."""
    print(f"instructions per operation (callgrind, {n} operations inside sys.call_tracing)")
    print(f"{'case':<28} " + " ".join(f"{m:>22}" for m in _MODES) + "  ratio (profiler)")
    for case in CASES:
        counts = []
        for mode in _MODES:
            done = subprocess.run(
                [
                    "valgrind",
                    "--tool=callgrind",
                    "--callgrind-out-file=/dev/null",
                    "--collect-atstart=no",
                    "--toggle-collect=sys_call_tracing",
                    sys.executable,
                    __file__,
                    "--one",
                    case,
                    mode,
                    str(n),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            found = re.search(r"Collected : (\d+)", done.stderr)
            assert found is not None, done.stderr
            counts.append(int(found.group(1)) / n)
        print(
            f"{case:<28} "
            + " ".join(f"{c:>22.0f}" for c in counts)
            + f"  {counts[3] / counts[2]:.2f}x"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=15, help="alternating pairs (default 15)")
    parser.add_argument("--objects", type=int, default=10_000, help="primitives for memory")
    parser.add_argument("--only", choices=("time", "memory"), help="one of the two figures")
    parser.add_argument(
        "--instructions", action="store_true", help="instructions per operation (callgrind)"
    )
    parser.add_argument("--one", nargs=3, help=argparse.SUPPRESS)  # case mode n: one run
    args = parser.parse_args(argv)
    if args.one:
        one_run(args.one[0], args.one[1], int(args.one[2]))
        return 0
    if args.instructions:
        instruction_figures(5_000)
        return 0
    if args.only != "memory":
        time_figures(args.pairs)
        creation_figures(args.pairs)
    if args.only != "time":
        memory_figures(args.objects)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
