"""Blocks that matter: a short blocking call in every request outranks a one-off start-up block.

A service loads its configuration synchronously as it starts (300 ms, once), then calls a
synchronous client in every request (40 ms each, under the 100 ms block threshold). The exit
report names the request's line first, with what it cost the loop in all, and says that the
thread used little CPU meanwhile (a blocking call, not CPU work):

    python examples/blocking_lines.py [--requests N]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import asyncflow


def load_config() -> None:
    time.sleep(0.3)  # once, at start-up


@asyncflow.future
async def handle(request: int) -> int:
    await asyncio.sleep(0)
    time.sleep(0.04)  # a synchronous client, in every request
    return request


async def main(requests: int) -> int:
    with asyncflow.instrument_tasks():  # watch this loop from its start
        load_config()
        served = 0
        for request in range(requests):
            await handle(request)
            served += 1
            await asyncio.sleep(0.005)
        return served


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=50, help="requests (default 50)")
    args = parser.parse_args(argv)
    # under `asyncflow run`, the command has said where the endpoint is
    hosted = asyncflow.active_profiler() is not None
    with asyncflow.profile("blocking-lines") as prof:
        if not hosted:
            print(f"asyncflow: profiling 'blocking-lines'; endpoint: {prof.url}", flush=True)
        served = asyncio.run(main(args.requests))
        print(f"served {served} requests", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(run())
