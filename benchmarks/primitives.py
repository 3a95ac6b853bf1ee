"""What a program busy with synchronisation primitives costs under ``asyncflow run`` (issue 28).

The workload is the issue's: tasks woken by ``notify_all()`` per item (a herd: every waiter wakes,
one finds the item), a lock contended by many tasks, a pool semaphore, and events passed back and
forth, all on one loop. It runs as a program of its own, plainly (``python primitives.py
--workload``) and as a user profiles it (``python -m asyncflow run --port off --format none
primitives.py --workload``: everything ``run`` turns on by default, tasks tracked included), in
alternating pairs; the figure is the median over pairs of the profiled run's CPU time over the
plain one's. Each run times its workload itself (the process's CPU time, every thread: the
profiler's included), leaving out the interpreter's start and, under asyncflow, the import and
the start and stop of the profiler, which a longer program pays once. The budget is 1.5x.

    python benchmarks/primitives.py                  # 5 pairs
    python benchmarks/primitives.py --pairs 9 --run-options='--no-locks'
    python benchmarks/primitives.py --only herd      # one part of the workload alone
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time

#: tasks in the herd, and the items each notify_all() is for
HERD, ITEMS = 200, 500
#: tasks contending for the lock, and how many times each takes it
CONTENDERS, TAKES = 50, 1000
#: tasks sharing the semaphore's permits, the permits, and how many times each takes one
POOL_USERS, PERMITS, POOL_TAKES = 50, 4, 1000
#: events passed back and forth between two tasks
PINGS = 100_000

PARTS = ("herd", "lock", "semaphore", "events")


def _waiting(condition: asyncio.Condition) -> int:
    """Tasks inside ``condition.wait()``, not notified yet."""
    return sum(not w.done() for w in condition._waiters)


async def herd(waiters: int = HERD, items_put: int = ITEMS) -> None:
    """``waiters`` tasks wait on one condition; each of ``items_put`` items is put under its lock
    with notify_all(), the next one only once every task waits again (items x waiters wake-ups,
    then the waiters leave)."""
    condition = asyncio.Condition()
    items: list[int] = []

    async def consume() -> None:
        while True:
            async with condition:
                await condition.wait_for(lambda: bool(items))
                if items.pop() < 0:
                    return

    tasks = [asyncio.create_task(consume()) for _ in range(waiters)]
    for item in [*range(items_put), *[-1] * waiters]:
        while items or _waiting(condition) < sum(not t.done() for t in tasks):
            await asyncio.sleep(0)
        async with condition:
            items.append(item)
            condition.notify_all()
    await asyncio.gather(*tasks)


async def lock() -> None:
    """CONTENDERS tasks take one lock TAKES times each, yielding while they hold it."""
    shared = asyncio.Lock()

    async def take() -> None:
        for _ in range(TAKES):
            async with shared:
                await asyncio.sleep(0)

    await asyncio.gather(*(take() for _ in range(CONTENDERS)))


async def semaphore() -> None:
    """POOL_USERS tasks take one of PERMITS permits POOL_TAKES times each, yielding meanwhile."""
    pool = asyncio.Semaphore(PERMITS)

    async def use() -> None:
        for _ in range(POOL_TAKES):
            async with pool:
                await asyncio.sleep(0)

    await asyncio.gather(*(use() for _ in range(POOL_USERS)))


async def events() -> None:
    """Two tasks hand the turn to each other PINGS times through two events."""
    ping, pong = asyncio.Event(), asyncio.Event()

    async def player(mine: asyncio.Event, theirs: asyncio.Event, first: bool) -> None:
        for _ in range(PINGS // 2):
            if not first:
                await mine.wait()
                mine.clear()
            theirs.set()
            if first:
                await mine.wait()
                mine.clear()

    await asyncio.gather(player(ping, pong, True), player(pong, ping, False))


async def workload(parts: list[str]) -> None:
    for part in parts:
        await globals()[part]()


def run_once(parts: list[str], options: list[str] | None) -> float:
    """CPU seconds of the workload in one run of it: plain (``options`` None) or under asyncflow
    run (the run prints them)."""
    me = [os.path.abspath(__file__), "--workload", *(f"--only={p}" for p in parts)]
    if options is None:
        command = [sys.executable, *me]
    else:
        run = ["-m", "asyncflow", "run", "--port", "off", "--format", "none", *options]
        command = [sys.executable, *run, *me]
    done = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True)
    return float(done.stdout.split()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=5, help="paired runs (default 5)")
    parser.add_argument("--only", choices=PARTS, action="append", help="repeatable")
    parser.add_argument(
        "--run-options",
        default="",
        metavar="'OPTIONS'",
        help="more options of asyncflow run, e.g. '--no-locks' (to see what a part costs)",
    )
    parser.add_argument("--workload", action="store_true", help="run the workload itself, once")
    args = parser.parse_args(argv)
    parts = args.only or list(PARTS)
    if args.workload:
        start = time.process_time()
        asyncio.run(workload(parts))
        print(f"{time.process_time() - start:.6f}")
        return 0
    options = args.run_options.split()
    run_once(parts, None)  # warm up both (the file system's caches, the .pyc files)
    run_once(parts, options)
    plain: list[float] = []
    profiled: list[float] = []
    for k in range(args.pairs):
        # alternate which goes first, so that a trend in the machine's load hits both alike
        first, second = (None, options) if k % 2 == 0 else (options, None)
        a, b = run_once(parts, first), run_once(parts, second)
        p, o = (a, b) if first is None else (b, a)
        plain.append(p)
        profiled.append(o)
        print(f"  pair {k + 1}: plain {p:.2f} s, asyncflow {o:.2f} s: {o / p:.3f}x", flush=True)
    ratios = sorted(o / p for p, o in zip(plain, profiled, strict=True))
    print(
        f"{'+'.join(parts)}: plain {statistics.median(plain):.2f} s, asyncflow "
        f"{statistics.median(profiled):.2f} s CPU; ratio median {statistics.median(ratios):.3f}x "
        f"(lowest {ratios[0]:.3f}x, highest {ratios[-1]:.3f}x) over {args.pairs} pairs",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
