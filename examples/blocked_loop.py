"""A service whose handler sometimes blocks the event loop, and asyncflow catching it in the act.

Requests are handled concurrently; one lookup path calls a synchronous client (``time.sleep``
stands in for it), which freezes every other request while it runs. asyncflow's ``/loop``
endpoint names the blocking call and shows its stack *while* the loop is blocked, and the exit
report lists each episode with the line that blocked:

    python examples/blocked_loop.py [--requests N] [--linger SECONDS]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import asyncflow


def legacy_lookup(key: int) -> str:
    """A synchronous client call: fine in a thread, a disaster on the event loop."""
    time.sleep(0.15)
    return f"value-{key}"


@asyncflow.future
async def lookup(key: int) -> str:
    if key % 10 == 7:  # the rare path nobody tested under load
        return legacy_lookup(key)
    await asyncio.sleep(0.005)  # the usual, asynchronous path
    return f"value-{key}"


@asyncflow.future
async def handle(key: int) -> int:
    await asyncio.sleep(key * 0.01)  # requests arrive over time
    value = await lookup(key)
    await asyncio.sleep(0.001)
    return len(value)


async def serve(requests: int) -> int:
    with asyncflow.instrument_tasks():
        results = await asyncio.gather(*(handle(k) for k in range(requests)))
    return sum(results)


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20, help="requests (default 20)")
    parser.add_argument(
        "--linger", type=float, default=0.0, help="seconds to keep the endpoint up afterwards"
    )
    args = parser.parse_args(argv)
    # under `asyncflow run`, the command has said where the endpoint is
    hosted = asyncflow.active_profiler() is not None
    with asyncflow.profile("blocked-loop") as prof:
        if not hosted:
            print(f"asyncflow: profiling 'blocked-loop'; endpoint: {prof.url}", flush=True)
        total = asyncio.run(serve(args.requests))
        print(f"served {args.requests} requests ({total} bytes)", flush=True)
        if args.linger > 0:
            print(f"endpoint stays up for {args.linger:g} s: curl {prof.url}/loop", flush=True)
            time.sleep(args.linger)
    return 0


if __name__ == "__main__":
    raise SystemExit(run())
