"""What a profiler costs a program that does nothing: CPU a second, by thread, and wakes.

An idle service still pays for being watched: the loop monitor's heartbeats run on its loop,
and each wake of the profiler's thread (to post a heartbeat, to look at one, to drain) costs
CPU, on a virtual machine far more than the work it does. Each run is a process of its own
(``--run``) that starts a profiler, watches its loop (``instrument_tasks()``) unless told not
to, waits ``--warm`` seconds, then reads every thread's CPU time (``/proc/self/task/*/
schedstat``: Linux only) and the profiler's thread's wakes (``_speedups.wakes()``, the compiled
path) around ``--seconds`` of ``asyncio.sleep``. The variants alternate, ``--runs`` times each:

    watched    a profiler, the program's loop watched (what ``asyncflow run`` does)
    unwatched  a profiler, no loop watched
    plain      no profiler (the loop's own cost of sleeping)

    python benchmarks/idle.py
    python benchmarks/idle.py --runs 5 --seconds 5 watched unwatched

Printed per variant: the median over runs of the loop's thread's and the other threads' (the
profiler's) CPU in ms a second, and the profiler's thread's wakes a second.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

VARIANTS = ("watched", "unwatched", "plain")


def _cpu_ns() -> dict[int, int]:
    """Each live thread's CPU time so far (its kernel id -> ns)."""
    out = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            out[int(task.name)] = int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # (a thread that ended meanwhile)
    return out


def measure(variant: str, warm: float, seconds: float) -> dict[str, float]:
    """One run, in this process: ms of CPU a second by thread, and wakes a second."""
    import asyncflow
    from asyncflow.instrumentation import futures

    wakes = getattr(futures._speedups, "wakes", lambda: 0)
    figures: dict[str, float] = {}

    async def main() -> None:
        if variant == "watched":
            asyncflow.instrument_tasks()
        await asyncio.sleep(warm)
        me = threading.get_native_id()
        before, woke, began = _cpu_ns(), wakes(), time.monotonic()
        await asyncio.sleep(seconds)
        after, woke, spent = _cpu_ns(), wakes() - woke, time.monotonic() - began
        others = sum(ns - before.get(tid, 0) for tid, ns in after.items() if tid != me)
        figures["loop"] = (after[me] - before[me]) / 1e6 / spent
        figures["others"] = others / 1e6 / spent
        figures["wakes"] = woke / spent

    if variant == "plain":
        asyncio.run(main())
    else:
        with asyncflow.profile("idle", format="none"):
            asyncio.run(main())
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variants", nargs="*", choices=[*VARIANTS, []], help="all by default")
    parser.add_argument("--runs", type=int, default=3, help="runs of each variant (alternating)")
    parser.add_argument("--seconds", type=float, default=4.0, help="seconds measured a run")
    parser.add_argument("--warm", type=float, default=1.5, help="seconds before measuring")
    parser.add_argument("--run", choices=VARIANTS, help=argparse.SUPPRESS)  # (one run, in a child)
    args = parser.parse_args(argv)
    if not os.path.isdir("/proc/self/task"):
        parser.error("reads /proc/self/task: Linux only")
    if args.runs < 1:
        parser.error(f"--runs {args.runs}: expected at least 1")
    if not args.seconds > 0:
        parser.error(f"--seconds {args.seconds}: expected a number of seconds > 0")
    if not args.warm >= 0:
        parser.error(f"--warm {args.warm}: expected a number of seconds >= 0")
    if args.run:
        print(json.dumps(measure(args.run, args.warm, args.seconds)))
        return 0
    variants: list[str] = args.variants or list(VARIANTS)
    results: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    for _ in range(args.runs):
        for variant in variants:
            child = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--run",
                    variant,
                    "--warm",
                    str(args.warm),
                    "--seconds",
                    str(args.seconds),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            results[variant].append(json.loads(child.stdout.strip().splitlines()[-1]))
    print(f"Python {sys.version.split()[0]}, {args.runs} runs of {args.seconds:g} s each")
    for variant, runs in results.items():
        loop, others, wakes = (
            statistics.median(r[k] for r in runs) for k in ("loop", "others", "wakes")
        )
        print(
            f"  {variant:10} the loop's thread {loop:5.2f} ms/s, the profiler's {others:5.2f} "
            f"ms/s, its wakes {wakes:5.1f}/s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
