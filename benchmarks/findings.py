"""What the collector's own evaluation of every finding costs, with many live tasks.

The collector evaluates every lint about once a second on its own thread (issue 27: findings
that held during the run reach the exit report with nobody asking), and spaces the next
evaluation to at most 1% of one CPU. This times one evaluation (``warnings_document``, what
the collector's watch runs) in CPU time of the thread that runs it, with ``--tasks`` live
tasks parked on an event (whole-program mode) and ``--locks`` locks each held by one task with
another waiting on it, on whichever hot path this interpreter has (``ASYNCFLOW_NO_EXTENSIONS=1``
for the pure-Python one). Prints the median and the spread of ``--rounds`` evaluations, and the
spacing the watch would choose: ``max(1 s, 100 x the median)``.

    python benchmarks/findings.py                  # 10,000 tasks, 100 locks, 10 rounds
    python benchmarks/findings.py --tasks 100000 --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time

import asyncflow
from asyncflow.instrumentation import futures
from asyncflow.views.documents import FINDINGS_SHARE, warnings_document


async def _park(tasks: int, locks: int, rounds: int) -> list[int]:
    with (
        asyncflow.profile("findings", port=None, format="none") as prof,
        asyncflow.instrument_tasks(),
        asyncflow.instrument_locks(),
    ):
        gate = asyncio.Event()
        parked = [asyncio.create_task(gate.wait()) for _ in range(tasks)]
        held = [asyncio.Lock() for _ in range(locks)]
        for lock in held:
            await lock.acquire()  # held by this task; another waits on each
        waiters = [asyncio.create_task(lock.acquire()) for lock in held]
        await asyncio.sleep(0.2)  # every task made has run its first step and waits
        collector = prof._collector
        assert collector is not None
        spent: list[int] = []
        for _ in range(rounds):
            began = time.thread_time_ns()
            warnings_document(collector)
            spent.append(time.thread_time_ns() - began)
        gate.set()
        for lock in held:
            lock.release()
        await asyncio.gather(*parked, *waiters)
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=10_000, help="live tasks [10000]")
    parser.add_argument("--locks", type=int, default=100, help="contended locks [100]")
    parser.add_argument("--rounds", type=int, default=10, help="evaluations timed [10]")
    args = parser.parse_args()
    spent = asyncio.run(_park(args.tasks, args.locks, args.rounds))
    median = statistics.median(spent)
    path = "compiled" if futures.accelerated else "pure-Python"
    print(f"Python {sys.version.split()[0]}, {path} hot path")
    print(
        f"{args.tasks:,} live tasks, {args.locks} contended locks: one evaluation takes "
        f"{median / 1e6:.1f} ms of CPU (median of {len(spent)}; "
        f"{min(spent) / 1e6:.1f} .. {max(spent) / 1e6:.1f} ms)"
    )
    every = max(1.0, median / FINDINGS_SHARE / 1e9)
    share = median / every / 1e7
    print(f"the collector's watch evaluates every {every:.2f} s: {share:.2f}% of a CPU")


if __name__ == "__main__":
    main()
