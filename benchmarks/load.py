"""The endpoint while the program is CPU-bound: latency for 1 and 8 polling clients, and slowdown.

The program runs the overhead benchmark's pipeline (tasks and queues instrumented, CPU-bound in
the main thread) under a running profiler. Each round runs, in rotating order: the plain pipeline
(uninstrumented), the instrumented pipeline with nobody asking the endpoint ("quiet"), and the
instrumented pipeline while a second process polls ``/futures``, ``/loop`` and ``/snapshot``
from each client count and interval (each client one keep-alive connection, asking again as
soon as it has its answer, or the interval later). Reports each case's latency percentiles,
requests served and errors (there must be none), and the program's slowdown as the median over
rounds of loaded / quiet time, measured side by side in one run.

Where the time goes, per case (medians over rounds, milliseconds of CPU per second of the
run): the program's main thread, the profiler's thread (it holds the GIL while it builds, so
the main thread waits), the endpoint process and the clients' process (which compete with the
program for cores, not for its GIL), the documents built in the program per second, and the
main thread's wall time not spent on its CPU ("off-CPU": waiting for the GIL or for a core).
On a shared machine the wall-time ratio mostly measures the other processes; the CPU-time
slowdown (main thread + profiler thread CPU, loaded / quiet) is what the run would take with a
core free for the program.

    python benchmarks/load.py [--pairs N] [--items N] [--clients 1,8] [--intervals 0,0.1]
                              [--parked N] [--in-process]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import aiohttp
import orjson
from run import make_pipeline  # benchmarks/run.py: the same pipeline as the overhead figures

import asyncflow
from asyncflow.serve import server

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
        started, cpu = time.perf_counter(), time.process_time()
        await loop.run_in_executor(None, sys.stdin.read)  # until the parent closes stdin
        stop.set()
        await asyncio.gather(*workers)
        seconds = time.perf_counter() - started
        cpu = time.process_time() - cpu
    finally:
        for session in sessions:
            await session.close()
    return {"latencies": latencies, "errors": errors, "seconds": seconds, "cpu": cpu}


# -- the program under observation ----------------------------------------------------------


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


class Clocks:
    """CPU seconds so far of the main thread, the profiler's thread and the endpoint process,
    and documents built in the program."""

    def __init__(self, prof: asyncflow.Profiler) -> None:
        self.prof = prof
        thread = prof._thread
        assert thread is not None and thread.ident is not None
        self._profiler_clock = time.pthread_getcpuclockid(thread.ident)

    def read(self) -> dict[str, float]:
        endpoint = self.prof._server
        process = 0.0
        link = endpoint.link if endpoint is not None else None
        if link is not None and link.process.pid is not None:
            process = _process_cpu(link.process.pid)
        return {
            "wall": time.perf_counter(),
            "main": time.thread_time(),
            "profiler": time.clock_gettime(self._profiler_clock),
            "endpoint": process,
            "builds": float(endpoint.builds if endpoint is not None else 0),
            "building": endpoint.build_ns / 1e9 if endpoint is not None else 0.0,
        }


def _process_cpu(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measured(clocks: Clocks, items: int, instrumented: bool = True) -> dict[str, float]:
    """One pipeline run: its seconds, and each clock's advance over it."""
    before = clocks.read()
    seconds = await pipeline(items, instrumented)
    after = clocks.read()
    spent = {name: after[name] - before[name] for name in after}
    spent["seconds"] = seconds
    return spent


async def loaded(
    clocks: Clocks, url: str, items: int, clients: int, interval: float
) -> tuple[dict[str, float], dict[str, Any]]:
    """One instrumented run while ``clients`` poll the endpoint from a second process."""
    command = [sys.executable, __file__, "--poll", url, "--clients", str(clients)]
    poller = subprocess.Popen(
        [*command, "--intervals", str(interval)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert poller.stdout is not None and poller.stdin is not None
    ready = await asyncio.to_thread(poller.stdout.readline)
    assert ready.strip() == b"ready", ready
    spent = await measured(clocks, items)
    poller.stdin.close()
    out = await asyncio.to_thread(poller.stdout.read)
    poller.wait()
    result = orjson.loads(out)
    spent["clients"] = result["cpu"] * spent["seconds"] / result["seconds"]
    return spent, result


Case = tuple[int, float]


async def observed(args: argparse.Namespace, prof: asyncflow.Profiler) -> dict[str, Any]:
    assert prof.url is not None
    clocks = Clocks(prof)
    handle = asyncflow.instrument_tasks()
    gate = asyncio.Event()
    idle = [asyncio.create_task(parked(gate)) for _ in range(args.parked)]
    await asyncio.sleep(0)
    await pipeline(args.items // 10)  # warm-up, and every document has entries
    cases: list[Case] = [(n, i) for i in args.intervals for n in args.clients]
    runs: dict[str | Case, list[dict[str, float]]] = {"plain": [], "quiet": []}
    polled: dict[Case, list[dict[str, Any]]] = {case: [] for case in cases}
    kinds: list[str | Case] = ["plain", "quiet", *cases]
    try:
        for pair in range(args.pairs):
            shift = pair % len(kinds)  # rotate the order, so that order biases no kind
            for kind in kinds[shift:] + kinds[:shift]:
                if kind == "plain":
                    runs["plain"].append(await measured(clocks, args.items, instrumented=False))
                elif kind == "quiet":
                    runs["quiet"].append(await measured(clocks, args.items))
                else:
                    assert isinstance(kind, tuple)
                    spent, result = await loaded(clocks, prof.url, args.items, *kind)
                    runs.setdefault(kind, []).append(spent)
                    polled[kind].append(result)
    finally:
        gate.set()
        await asyncio.gather(*idle)
        handle.undo()
    return {"runs": runs, "polled": polled}


def _busy(spent: dict[str, float]) -> float:
    """What the run would take on a machine with a core free for it: the main thread's CPU
    time, plus the profiler thread's (the main thread waits for the GIL meanwhile)."""
    return spent["main"] + spent["profiler"]


def _where(spent: list[dict[str, float]]) -> str:
    """Medians of CPU ms per second of run, per party; builds per second."""

    def rate(name: str, scale: float = 1e3) -> float:
        return statistics.median(s.get(name, 0.0) / s["seconds"] * scale for s in spent)

    off = statistics.median((s["wall"] - s["main"]) / s["seconds"] * 1e3 for s in spent)
    return (
        f"main {rate('main'):.0f}, profiler thread {rate('profiler'):.1f}, endpoint process "
        f"{rate('endpoint'):.0f}, clients {rate('clients'):.0f} ms/s; main off-CPU {off:.0f} "
        f"ms/s; {rate('builds', 1):.1f} builds/s taking {rate('building'):.1f} ms/s of the "
        "profiler thread"
    )


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
        "--intervals",
        type=lambda s: [float(n) for n in s.split(",")],
        default=[0.0, 0.1],
        help="seconds each client waits between answer and next request, comma-separated "
        "(default 0,0.1: none, and a tenth of a second)",
    )
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="serve HTTP on the profiler's thread, not from the endpoint process",
    )
    parser.add_argument("--poll", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.poll:
        result = asyncio.run(poll(args.poll, args.clients[0], args.intervals[0]))
        sys.stdout.buffer.write(orjson.dumps(result))
        return 0
    if args.in_process:
        server.PROCESS = False
    with asyncflow.profile("load", port=0, format="none") as prof:
        assert prof.url is not None
        run = asyncio.run(observed(args, prof))
    runs = run["runs"]
    quiet = [r["seconds"] for r in runs["quiet"]]
    plain = [r["seconds"] for r in runs["plain"]]
    mode = "on the profiler's thread" if args.in_process else "from the endpoint process"
    print(
        f"asyncflow {asyncflow.__version__}, python {sys.version.split()[0]}, "
        f"{os.cpu_count()} cores, HTTP served {mode}"
    )
    print(
        f"pipeline: {args.items:,} items, {args.parked:,} parked calls, {args.pairs} rounds; "
        f"plain median {statistics.median(plain) * 1e3:.0f} ms, instrumented (quiet) "
        f"{statistics.median(quiet) * 1e3:.0f} ms, ratio "
        f"{statistics.median(q / p for q, p in zip(quiet, plain, strict=True)):.2f}x"
    )
    print(f"  quiet: {_where(runs['quiet'])}")
    failed = 0
    for (clients, interval), results in run["polled"].items():
        latencies = [x for r in results for x in r["latencies"]]
        errors = [e for r in results for e in r["errors"]]
        failed += len(errors)
        seconds = sum(r["seconds"] for r in results)
        spent = runs[(clients, interval)]
        ratios = [s["seconds"] / q for s, q in zip(spent, quiet, strict=True)]
        cpu = [_busy(s) / _busy(q) for s, q in zip(spent, runs["quiet"], strict=True)]
        print(
            f"{clients} client(s) polling {', '.join(ROUTES)}"
            + (f" every {interval:g} s" if interval else " at once")
            + f": {len(latencies):,} requests in "
            f"{seconds:.1f} s ({len(latencies) / seconds:,.0f}/s), {len(errors)} errors; "
            + ", ".join(f"p{q:g} {_quantile(latencies, q / 100) * 1e3:.0f} ms" for q in (50, 99))
            + f", max {max(latencies) * 1e3:.0f} ms; program slowdown median "
            f"{statistics.median(ratios):.3f}x (rounds: {', '.join(f'{r:.2f}' for r in ratios)})"
        )
        print(
            f"  CPU-time slowdown median {statistics.median(cpu):.3f}x "
            f"(rounds: {', '.join(f'{r:.3f}' for r in cpu)})"
        )
        print(f"  {_where(spent)}")
        for error in errors[:5]:
            print(f"  error: {error}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
