"""A web handler behind a small database connection pool that slowly stops answering.

Each request takes a connection from a pool of 4 (a semaphore), runs a query and gives the
connection back. The service gets slower and slower, then every request times out. Run it,
and read what asyncflow says before looking at the code:

    python examples/connection_pool.py [--requests N] [--linger SECONDS]

(The endpoint's /tasks and /resources say where the stuck requests wait; --linger keeps the
program stuck, and the endpoint up, for that long so that there is time to curl them.)
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time

import asyncflow


class QueryFailed(Exception):
    """The database refused a query."""


class Pool:
    """At most ``size`` connections at once."""

    def __init__(self, size: int) -> None:
        self.slots = asyncio.Semaphore(size)

    async def query(self, sql: str, rng: random.Random) -> str:
        await self.slots.acquire()
        await asyncio.sleep(0.002)  # the database's answer
        if rng.random() < 0.05:
            raise QueryFailed(f"deadlock detected running {sql!r}")
        self.slots.release()
        return "row"


async def handle(pool: Pool, request: int, rng: random.Random) -> str:
    try:
        async with asyncio.timeout(0.2):
            return await pool.query(f"SELECT * FROM orders WHERE id = {request}", rng)
    except QueryFailed:
        return "500"
    except TimeoutError:
        return "504"


async def serve(requests: int, linger: float) -> dict[str, int]:
    rng = random.Random(3)
    pool = Pool(4)
    answers: dict[str, int] = {}
    for batch in range(0, requests, 20):
        results = await asyncio.gather(
            *(handle(pool, r, rng) for r in range(batch, min(batch + 20, requests)))
        )
        for result in results:
            answers[result] = answers.get(result, 0) + 1
    if linger > 0:  # the service is stuck by now: one more request waits for the endpoint
        stuck = asyncio.create_task(pool.query("SELECT 1", rng), name="health-check")
        await asyncio.sleep(linger)
        stuck.cancel()
    return answers


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="requests (default 200)")
    parser.add_argument("--linger", type=float, default=0.0, help="seconds to stay up at the end")
    args = parser.parse_args(argv)
    # under `asyncflow run`, the command has said where the endpoint is
    hosted = asyncflow.active_profiler() is not None
    with asyncflow.profile("pool") as prof, asyncflow.instrument_locks():
        if not hosted:
            print(f"asyncflow: profiling 'pool'; endpoint: {prof.url or 'not served'}", flush=True)
        if args.linger > 0:
            print(f"stuck for {args.linger:g} s: curl {prof.url}/tasks", flush=True)
        started = time.perf_counter()
        answers = asyncio.run(_tracked(args.requests, args.linger))
        took = time.perf_counter() - started
        print(f"answers {dict(sorted(answers.items()))} in {took:.2f} s", flush=True)
    return 0


async def _tracked(requests: int, linger: float) -> dict[str, int]:
    with asyncflow.instrument_tasks():
        return await serve(requests, linger)


if __name__ == "__main__":
    raise SystemExit(run())
