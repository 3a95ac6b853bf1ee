"""Memory soak: the profiler's memory stays flat however many messages flow.

Sends N messages through an instrumented bounded queue (producer -> consumer, both tracked
tasks) with a profiler running, in a fresh process per size, and reports each process's peak
RSS. The 10,000,000-message run must use no more memory than the 100,000-message one.

    python benchmarks/soak.py                 # both sizes, side by side
    python benchmarks/soak.py --messages N    # one run, prints its peak RSS in KiB
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import subprocess
import sys
import time

import asyncflow


async def _flow(messages: int) -> None:
    with asyncflow.instrument_tasks():
        q: asyncio.Queue[int] = asyncflow.instrument_queue(asyncio.Queue(256), name="soak")

        async def producer() -> None:
            for i in range(messages):
                await q.put(i)

        async def consumer() -> None:
            for _ in range(messages):
                await q.get()

        await asyncio.gather(asyncio.create_task(producer()), asyncio.create_task(consumer()))


def one(messages: int) -> int:
    """Run one soak; returns this process's peak RSS in KiB."""
    with asyncflow.profile("soak", format="none") as prof:
        asyncio.run(_flow(messages))
        channel = prof.snapshot().channels
    assert channel is not None and channel.channels[0].received_count == messages
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="asyncflow memory soak")
    parser.add_argument("--messages", type=int, help="run one soak of this many messages")
    args = parser.parse_args(argv)
    if args.messages is not None:
        print(one(args.messages))
        return 0
    peaks = {}
    for messages in (100_000, 10_000_000):
        start = time.perf_counter()
        out = subprocess.run(
            [sys.executable, __file__, "--messages", str(messages)],
            capture_output=True,
            text=True,
            check=True,
        )
        peaks[messages] = int(out.stdout.strip())
        print(
            f"{messages:>12,} messages: peak RSS {peaks[messages] / 1024:.1f} MiB "
            f"({time.perf_counter() - start:.0f} s)"
        )
    print(f"ratio 10M / 100k: {peaks[10_000_000] / peaks[100_000]:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
