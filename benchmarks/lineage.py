"""Message lineage's memory over many messages: a three-stage pipeline under the profiler, its
resident memory and the lineage's tables at each quarter of the run.

    python benchmarks/lineage.py [--messages N] [--sampling N]

``--sampling 1`` times (and so follows) every message; the default is asyncflow's own adaptive
sampling (about a thousand timed messages a second per channel). What must hold: the resident
memory and every table stay flat from the first quarter on, whatever N.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import time

import asyncflow
from asyncflow.instrumentation import lineage


def _rss_kb() -> int:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


async def _pipeline(messages: int, report: list[str], started: float) -> None:
    raw = asyncflow.instrument_queue(asyncio.Queue[int](1000), name="raw")
    parsed = asyncflow.instrument_queue(asyncio.Queue[int](1000), name="parsed")
    enriched = asyncflow.instrument_queue(asyncio.Queue[int](1000), name="enriched")
    quarter = max(1, messages // 4)

    @asyncflow.future
    async def src() -> None:
        for i in range(messages):
            await raw.put(i)
        await raw.put(-1)

    @asyncflow.future
    async def parse() -> None:
        while (i := await raw.get()) >= 0:
            await parsed.put(i)
        await parsed.put(-1)

    @asyncflow.future
    async def enrich() -> None:
        while (i := await parsed.get()) >= 0:
            await enriched.put(i)
        await enriched.put(-1)

    @asyncflow.future
    async def sink() -> None:
        n = 0
        while await enriched.get() >= 0:
            n += 1
            if n % quarter == 0:
                gc.collect()
                sizes = lineage.sizes()
                tables = sum(v for k, v in sizes.items() if k != "paths")
                report.append(
                    f"{n:>12,} messages  {time.perf_counter() - started:7.1f} s  "
                    f"rss {_rss_kb():>8,} KB  lineage tables {tables:>5,} entries, "
                    f"{sizes['paths']} paths, {lineage.dropped():,} dropped"
                )

    await asyncio.gather(src(), parse(), enrich(), sink())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10_000_000)
    parser.add_argument("--sampling", type=int, default=0, help="0: adaptive (the default)")
    args = parser.parse_args(argv)
    report: list[str] = []
    options = {"sampling": args.sampling} if args.sampling else {}
    started = time.perf_counter()
    with asyncflow.profile("lineage-memory", format="none", port=None, **options) as prof:
        asyncio.run(_pipeline(args.messages, report, started))
        snap = prof.snapshot()
    assert snap.flow is not None
    print(
        f"Python {sys.version.split()[0]}; {args.messages:,} messages through 3 queues; "
        f"sampling {args.sampling or 'adaptive'}"
    )
    print("\n".join(report))
    for p in snap.flow.lineage:
        print(f"path {p.label}: {p.messages:,} sampled messages, p99 {p.end_to_end_ns.get('p99')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
