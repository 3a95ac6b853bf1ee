"""The endpoint while the program is CPU-bound: latency for 1 and 8 polling clients, and slowdown.

The program runs the overhead benchmark's pipeline (tasks and queues instrumented, CPU-bound in
the main thread) under a running profiler. Each pair runs, in rotating order: the plain pipeline
(uninstrumented), the instrumented pipeline with nobody asking the endpoint ("quiet"), and the
instrumented pipeline while a second process polls ``/futures``, ``/loop`` and ``/snapshot``
from 1 client, then from 8 clients at once (each client one keep-alive connection, asking again
as soon as it has its answer, or ``--interval`` seconds later). Reports each client count's latency
percentiles, requests served and errors (there must be none), and the program's slowdown as the
median over pairs of loaded / quiet time, measured side by side in one run.

    python benchmarks/load.py [--pairs N] [--items N] [--clients 1,8] [--interval S] [--parked N]
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

ROUTES = ("/futures", "/loop", "/snapshot")


def _plain(fn: Any) -> Any:
    return fn


async def pipeline(items: int, instrumented: bool = True) -> float:
    """The overhead benchmark's pipeline; returns seconds taken."""
    main, _ = make_pipeline(asyncflow.future if instrumented else _plain, items)
    start = time.perf_counter()
    await main()
    return time.perf_counter() - start


async def parked(gate: asyncio.Event) -> None:
    await gate.wait()


# -- the clients (second process) -----------------------------------------------------------


async def poll(url: str, clients: int, interval: float) -> dict[str, Any]:
    """``clients`` pollers of ``ROUTES`` until standard input closes, each asking again
    ``interval`` seconds after its last answer (0: at once)."""
    latencies: list[float] = []
    errors: list[str] = []
    stop = asyncio.Event()

    async def client(session: aiohttp.ClientSession, first: int) -> None:
        i = first
        while not stop.is_set():
            path = ROUTES[i % len(ROUTES)]
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
            if interval:
                await asyncio.sleep(interval)

    sessions = [
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) for _ in range(clients)
    ]
    try:
        for session in sessions:  # one answered request each: every connection is open
            async with session.get(url + "/profiler_status") as response:
                await response.read()
        print("ready", flush=True)
        loop = asyncio.get_running_loop()
        workers = [asyncio.create_task(client(s, n)) for n, s in enumerate(sessions)]
        started = time.perf_counter()
        await loop.run_in_executor(None, sys.stdin.read)  # until the parent closes stdin
        stop.set()
        await asyncio.gather(*workers)
        seconds = time.perf_counter() - started
    finally:
        for session in sessions:
            await session.close()
    return {"latencies": latencies, "errors": errors, "seconds": seconds}


# -- the program under observation ----------------------------------------------------------


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def loaded(
    url: str, items: int, clients: int, interval: float
) -> tuple[float, dict[str, Any]]:
    """One instrumented run while ``clients`` poll the endpoint from a second process."""
    command = [sys.executable, __file__, "--poll", url, "--clients", str(clients)]
    poller = subprocess.Popen(
        [*command, "--interval", str(interval)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert poller.stdout is not None and poller.stdin is not None
    ready = await asyncio.to_thread(poller.stdout.readline)
    assert ready.strip() == b"ready", ready
    seconds = await pipeline(items)
    poller.stdin.close()
    out = await asyncio.to_thread(poller.stdout.read)
    poller.wait()
    return seconds, orjson.loads(out)


async def observed(args: argparse.Namespace, url: str) -> dict[str, Any]:
    handle = asyncflow.instrument_tasks()
    gate = asyncio.Event()
    idle = [asyncio.create_task(parked(gate)) for _ in range(args.parked)]
    await asyncio.sleep(0)
    await pipeline(args.items // 10)  # warm-up, and every document has entries
    runs: dict[str, list[float]] = {"plain": [], "quiet": []}
    polled: dict[int, list[dict[str, Any]]] = {n: [] for n in args.clients}
    kinds: list[str | int] = ["plain", "quiet", *args.clients]
    try:
        for pair in range(args.pairs):
            shift = pair % len(kinds)  # rotate the order, so that order biases no kind
            for kind in kinds[shift:] + kinds[:shift]:
                if kind == "plain":
                    runs["plain"].append(await pipeline(args.items, instrumented=False))
                elif kind == "quiet":
                    runs["quiet"].append(await pipeline(args.items))
                else:
                    assert isinstance(kind, int)
                    seconds, result = await loaded(url, args.items, kind, args.interval)
                    runs.setdefault(f"{kind}", []).append(seconds)
                    polled[kind].append(result)
    finally:
        gate.set()
        await asyncio.gather(*idle)
        handle.undo()
    return {"runs": runs, "polled": polled}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5, help="rounds of runs (default 5)")
    parser.add_argument("--items", type=int, default=300_000, help="items per pipeline run")
    parser.add_argument(
        "--clients",
        type=lambda s: [int(n) for n in s.split(",")],
        default=[1, 8],
        help="client counts to measure, comma-separated (default 1,8)",
    )
    parser.add_argument("--parked", type=int, default=0, help="extra live calls kept waiting")
    parser.add_argument(
        "--interval",
        type=float,
        default=0.0,
        help="seconds each client waits between answer and next request (default 0: none)",
    )
    parser.add_argument("--poll", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.poll:
        result = asyncio.run(poll(args.poll, args.clients[0], args.interval))
        sys.stdout.buffer.write(orjson.dumps(result))
        return 0
    with asyncflow.profile("load", port=0, format="none") as prof:
        assert prof.url is not None
        run = asyncio.run(observed(args, prof.url))
    runs = run["runs"]
    quiet = runs["quiet"]
    plain = runs["plain"]
    print(f"asyncflow {asyncflow.__version__}, python {sys.version.split()[0]}")
    print(
        f"pipeline: {args.items:,} items, {args.parked:,} parked calls, {args.pairs} rounds; "
        f"plain median {statistics.median(plain) * 1e3:.0f} ms, instrumented (quiet) "
        f"{statistics.median(quiet) * 1e3:.0f} ms, ratio "
        f"{statistics.median(q / p for q, p in zip(quiet, plain, strict=True)):.2f}x"
    )
    failed = 0
    for clients, results in run["polled"].items():
        latencies = [x for r in results for x in r["latencies"]]
        errors = [e for r in results for e in r["errors"]]
        failed += len(errors)
        seconds = sum(r["seconds"] for r in results)
        ratios = [loaded / q for loaded, q in zip(runs[f"{clients}"], quiet, strict=True)]
        print(
            f"{clients} client(s) polling {', '.join(ROUTES)}"
            + (f" every {args.interval:g} s" if args.interval else "")
            + f": {len(latencies):,} requests in "
            f"{seconds:.1f} s ({len(latencies) / seconds:,.0f}/s), {len(errors)} errors; "
            + ", ".join(f"p{q:g} {_quantile(latencies, q / 100) * 1e3:.0f} ms" for q in (50, 99))
            + f", max {max(latencies) * 1e3:.0f} ms; program slowdown median "
            f"{statistics.median(ratios):.3f}x (rounds: {', '.join(f'{r:.2f}' for r in ratios)})"
        )
        for error in errors[:5]:
            print(f"  error: {error}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
