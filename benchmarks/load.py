"""The endpoint under load while an instrumented pipeline runs, with 10,000 live calls tracked.

A client in a second process hammers every route over many concurrent connections on
127.0.0.1 while the pipeline runs; the same pipeline runs without the load in alternating pairs,
so the slowdown is a ratio measured side by side in one run. Reports requests served, errors
(there must be none), the endpoint's latency percentiles and the pipeline's slowdown.

    python benchmarks/load.py [--pairs N] [--items N] [--connections N] [--parked N]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from typing import Any

import aiohttp
import orjson
from run import make_pipeline  # benchmarks/run.py: the same pipeline as the overhead figures

import asyncflow


async def pipeline(items: int) -> float:
    """The overhead benchmark's pipeline, tasks and queues instrumented; returns seconds taken."""
    main, _ = make_pipeline(asyncflow.future, items)
    start = time.perf_counter()
    await main()
    return time.perf_counter() - start


async def parked(gate: asyncio.Event) -> None:
    await gate.wait()


# -- the client (second process) ------------------------------------------------------------


async def hammer(url: str, connections: int) -> dict[str, Any]:
    """Request every route from ``connections`` workers until standard input closes."""
    async with aiohttp.ClientSession() as session:
        paths = [
            "/profiler_status",
            "/futures",
            "/channels",
            "/streams",
            "/flow",
            "/loop",
            "/openapi.json",
            "/futures?limit=5&offset=1",
        ]
        async with session.get(f"{url}/profiler_status") as response:
            calls_live = (await response.json())["calls_live"]
        for kind in ("futures", "channels", "streams"):
            async with session.get(f"{url}/{kind}") as response:
                entries = (await response.json())[kind]
            paths += [f"/{kind}/{entry['id']}/logs" for entry in entries[:3]]
        latencies: list[float] = []
        errors: list[str] = []
        stop = asyncio.Event()

        async def one(worker: int) -> None:
            i = worker
            while not stop.is_set():
                path = paths[i % len(paths)]
                i += 1
                t0 = time.perf_counter()
                try:
                    async with session.get(url + path) as response:
                        await response.read()
                        if response.status != 200:
                            errors.append(f"{path}: {response.status}")
                except aiohttp.ClientError as exc:
                    errors.append(f"{path}: {exc!r}")
                latencies.append(time.perf_counter() - t0)

        print("ready", flush=True)
        loop = asyncio.get_running_loop()
        workers = [asyncio.create_task(one(w)) for w in range(connections)]
        started = time.perf_counter()
        await loop.run_in_executor(None, sys.stdin.read)  # until the parent closes stdin
        stop.set()
        await asyncio.gather(*workers)
        return {
            "requests": len(latencies),
            "seconds": time.perf_counter() - started,
            "errors": errors[:10],
            "error_count": len(errors),
            "latencies": sorted(latencies),
            "routes": len(paths),
            "calls_live": calls_live,
        }


# -- the program under observation ----------------------------------------------------------


def _quantile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


async def observed(args: argparse.Namespace, url: str) -> dict[str, Any]:
    handle = asyncflow.instrument_tasks()
    gate = asyncio.Event()
    idle = [asyncio.create_task(parked(gate)) for _ in range(args.parked)]
    await asyncio.sleep(0)
    await pipeline(args.items // 10)  # warm-up, and every document has entries
    quiet: list[float] = []
    loaded: list[float] = []
    clients: list[dict[str, Any]] = []
    try:
        for pair in range(args.pairs):
            if pair % 2 == 0:  # alternate which run goes first, so order biases neither
                quiet.append(await pipeline(args.items))
            client = subprocess.Popen(
                [sys.executable, __file__, "--client", url, "--connections", str(args.connections)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
            assert client.stdout is not None and client.stdin is not None
            ready = await asyncio.to_thread(client.stdout.readline)
            assert ready.strip() == b"ready", ready
            loaded.append(await pipeline(args.items))
            client.stdin.close()
            out = await asyncio.to_thread(client.stdout.read)
            client.wait()
            clients.append(orjson.loads(out))
            if pair % 2 == 1:
                quiet.append(await pipeline(args.items))
    finally:
        gate.set()
        await asyncio.gather(*idle)
        handle.undo()
    return {"quiet": quiet, "loaded": loaded, "clients": clients}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5, help="loaded/quiet pairs (default 5)")
    parser.add_argument("--items", type=int, default=20_000, help="items per pipeline run")
    parser.add_argument("--connections", type=int, default=32, help="concurrent connections")
    parser.add_argument("--parked", type=int, default=10_000, help="live calls kept waiting")
    parser.add_argument("--client", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.client:
        result = asyncio.run(hammer(args.client, args.connections))
        sys.stdout.buffer.write(orjson.dumps(result))
        return 0
    with asyncflow.profile("load", port=0, format="none") as prof:
        assert prof.url is not None
        run = asyncio.run(observed(args, prof.url))
    ratios = [loaded / quiet for loaded, quiet in zip(run["loaded"], run["quiet"], strict=True)]
    latencies = sorted(x for c in run["clients"] for x in c["latencies"])
    requests = sum(c["requests"] for c in run["clients"])
    seconds = sum(c["seconds"] for c in run["clients"])
    errors = sum(c["error_count"] for c in run["clients"])
    print(f"asyncflow {asyncflow.__version__}, python {sys.version.split()[0]}")
    print(
        f"pipeline: {args.items:,} items, {args.parked:,} parked calls tracked "
        f"({min(c['calls_live'] for c in run['clients']):,}+ live calls seen by the endpoint), "
        f"{args.pairs} pairs"
    )
    print(
        f"load: {args.connections} connections over {run['clients'][0]['routes']} routes: "
        f"{requests:,} requests in {seconds:.1f} s ({requests / seconds:,.0f}/s), "
        f"{errors} errors"
    )
    for client in run["clients"]:
        for error in client["errors"]:
            print(f"  error: {error}")
    print(
        "latency: "
        + ", ".join(f"p{q:g} {_quantile(latencies, q / 100) * 1e3:.1f} ms" for q in (50, 95, 99))
        + f", max {latencies[-1] * 1e3:.1f} ms"
    )
    print(
        f"pipeline slowdown under load: median {statistics.median(ratios):.2f}x "
        f"(pairs: {', '.join(f'{r:.2f}' for r in ratios)}; quiet median "
        f"{statistics.median(run['quiet']) * 1e3:.0f} ms)"
    )
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
