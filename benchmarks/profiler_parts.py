"""What each part of a running profiler costs an aiohttp service: two variants side by side.

``services.py`` runs the aiohttp service plainly and under ``asyncflow run``; its
``--run-options`` turn parts of whole-program mode off, but not the profiler itself. Here the
service (``services_apps/aiohttp_app.py``'s application, ``web.run_app`` on a loop made first)
is started in one process per variant, which keeps what its name says and nothing more:

    import     asyncflow imported, nothing started
    start      ``asyncflow.start()`` (port 0): the profiler's thread, no loop watched
    tasks      ``start`` and ``instrument_tasks()`` on the service's loop (watched by the monitor)

and, added to a variant's name with ``-``: ``noport`` (``port=None``), ``monitor20`` (the loop
monitor at 20 Hz: ``block_threshold`` and ``block_min`` of an hour), ``drain1`` (the collector
draining every second, not every 50 ms), ``fixedtick`` (the monitor ticking every 10 ms
whatever it has to do, as before 54cf563), ``nowakes`` (tasks' wake-ups not stamped: asyncio's
own ``call_soon``), ``nomonitor`` (the loop monitor never ticks: no heartbeat, no look). The
load is ``services.py``'s: httpx clients over the unix socket, a pair's requests in slices of
100 given to each server in turn (ABBA), and a server's CPU time over its slices (every thread)
per request.

    python benchmarks/profiler_parts.py import start --pairs 5
    python benchmarks/profiler_parts.py start start-monitor20
    python benchmarks/profiler_parts.py tasks-fixedtick tasks
    python benchmarks/profiler_parts.py tasks tasks-nowakes-nomonitor
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import services

VARIANTS = ("import", "start", "tasks")
OPTIONS = ("noport", "monitor20", "drain1", "fixedtick", "nowakes", "nomonitor")


def serve(variant: str, path: str) -> None:
    """Run the aiohttp service at ``path`` as ``variant`` says (in the server's process)."""
    sys.path.insert(0, str(services.APPS))
    import aiohttp_app  # (services_apps, on the path now; mypy reads that folder too)
    from aiohttp import web

    import asyncflow
    from asyncflow.model import collector, monitor

    base, *options = variant.split("-")
    options_kw: dict[str, object] = {"format": "none", "port": None if "noport" in options else 0}
    if "monitor20" in options:
        options_kw.update(block_threshold=3600, block_min=3600)
    if "drain1" in options:
        collector.DRAIN_INTERVAL = 1.0
    if "fixedtick" in options:
        monitor.LoopMonitor.pause = lambda self: self.interval  # type: ignore[method-assign]
    if "nowakes" in options:
        from asyncflow.instrumentation import futures

        futures.hook_wakes = lambda: None
    if "nomonitor" in options:
        monitor.LoopMonitor.tick = lambda self: None  # type: ignore[method-assign]
    loop = asyncio.new_event_loop()
    if base != "import":
        asyncflow.start("parts", **options_kw)
    if base == "tasks":
        asyncflow.instrument_tasks(loop)
    try:
        web.run_app(aiohttp_app.make_app(), path=path, access_log=None, print=None, loop=loop)
    finally:
        if base != "import":
            asyncflow.stop()


def _check(variant: str) -> str:
    base, *options = variant.split("-")
    if base not in VARIANTS or any(o not in OPTIONS for o in options):
        raise argparse.ArgumentTypeError(
            f"{variant!r}: expected one of {', '.join(VARIANTS)}, with any of "
            f"{', '.join('-' + o for o in OPTIONS)}"
        )
    return variant


async def compare(first: str, second: str, pairs: int, requests: int, clients: int) -> None:
    with tempfile.TemporaryDirectory(prefix="asyncflow-parts-") as tmp:
        workdir = Path(tmp)
        upstream_sock = str(workdir / "upstream.sock")
        upstream = subprocess.Popen(
            [sys.executable, str(services.APPS / "upstream.py"), upstream_sock]
        )
        servers: list[services.Server] = []
        try:
            deadline = time.monotonic() + services.START_TIMEOUT
            while not os.path.exists(upstream_sock):
                if upstream.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the upstream did not start")
                await asyncio.sleep(0.05)
            for i, variant in enumerate((first, second)):
                command = (__file__, "--serve", variant, "--path", "{sock}")
                paths = services.SERVICES["aiohttp"].paths
                service = services.Service(f"{i}-{variant}", command, paths, requests)
                server = services.Server(service, False, workdir, None, None)
                server.start(upstream_sock)
                servers.append(server)
            for server in servers:
                await server.ready()
                await server.load(max(200, requests // 5), clients)
            ratios = []
            for k in range(pairs):
                spent = [0.0, 0.0]
                for i in range(max(1, requests // services.SLICE)):
                    for j in (0, 1) if (k + i) % 2 == 0 else (1, 0):
                        spent[j] += await servers[j].load(services.SLICE, clients)
                ratios.append(spent[1] / spent[0])
                print(
                    f"  pair {k + 1}: {first} {spent[0] / requests * 1e6:.0f} µs, {second} "
                    f"{spent[1] / requests * 1e6:.0f} µs a request: {ratios[-1]:.3f}x",
                    flush=True,
                )
            ratios.sort()
            print(
                f"{second} / {first}: median {statistics.median(ratios):.3f}x "
                f"({ratios[0]:.3f}x .. {ratios[-1]:.3f}x), {pairs} pairs of {requests:,} requests, "
                f"load average {os.getloadavg()[0]:.1f}"
            )
        finally:
            for server in servers:
                await server.close_clients()
                server.stop()
            upstream.terminate()
            upstream.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("first", type=_check, nargs="?", help="the variant the ratio divides by")
    parser.add_argument("second", type=_check, nargs="?", help="the variant compared with it")
    parser.add_argument("--pairs", type=int, default=5, help="paired runs (default 5)")
    parser.add_argument("--requests", type=int, default=3000, help="requests a run (3000)")
    parser.add_argument("--clients", type=int, default=4, help="concurrent clients (4)")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve, args.path)
        return 0
    if args.first is None or args.second is None:
        parser.error("name two variants")
    if args.pairs < 1 or args.requests < services.SLICE:
        parser.error(f"--pairs must be at least 1 and --requests at least {services.SLICE}")
    asyncio.run(compare(args.first, args.second, args.pairs, args.requests, args.clients))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
