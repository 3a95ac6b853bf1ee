"""How asyncflow splits a blocked loop into episodes, each naming the call and line that blocked.

A service warms a cache synchronously as it starts (before the loop has run anything), then two
requests call a synchronous parser back to back, then a few short stalls follow. The exit report
lists the longest episodes, however early they came, and says how many it leaves out:

    python examples/loop_episodes.py [--stalls N]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import asyncflow


def warm_cache() -> None:
    """A synchronous warm-up: the loop is blocked before it has run a single callback."""
    time.sleep(0.5)


def parse(payload: bytes) -> int:
    """A synchronous parser standing in for CPU-heavy work done on the loop."""
    time.sleep(0.2)
    return len(payload)


@asyncflow.future
async def handle_request(payload: bytes) -> int:
    await asyncio.sleep(0)  # both requests get here before either parses
    return parse(payload)


@asyncflow.future
async def stall() -> None:
    time.sleep(0.12)  # a short stall, just over the block threshold


@asyncflow.future
async def main(stalls: int) -> int:
    warm_cache()
    # Both requests parse in the same turn of the loop: 400 ms without a break, two episodes.
    sizes = await asyncio.gather(handle_request(b"first"), handle_request(b"second"))
    for _ in range(stalls):
        await asyncio.sleep(0.01)
        await stall()
    return sum(sizes)


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stalls", type=int, default=3, help="short stalls (default 3)")
    args = parser.parse_args(argv)
    # under `asyncflow run`, the command has said where the endpoint is
    hosted = asyncflow.active_profiler() is not None
    with asyncflow.profile("loop-episodes") as prof:
        if not hosted:
            print(f"asyncflow: profiling 'loop-episodes'; endpoint: {prof.url}", flush=True)
        total = asyncio.run(main(args.stalls))
        print(f"parsed {total} bytes", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(run())
