"""Memory benchmark: what thousands of short-lived objects leave behind in the profiler.

Eleven cases, each in a fresh process with a profiler running (port 0), each making N objects
that are used once and dropped:

    exec        N functions made with ``exec``, each run once as a task (``instrument_tasks``)
    decorator   one ``@asyncflow.future`` applied N times inside a factory, each result called once
    deco-names  the same, with a name made per call (``name=f"fetch /item/{i}"``)
    queues      N queues made under ``instrument_queues()``, one message through each
    streams     N anyio memory object streams, instrumented, one message through each
    agen-wrap   N async generator functions made with ``exec``, each generator wrapped with
                ``asyncflow.stream()`` and iterated once
    agen-deco   N async generator functions made with ``exec``, each ``@asyncflow.stream``-ed and
                its generator iterated once
    locks       N ``asyncio.Lock`` made under ``instrument_locks()``, each acquired once
    executors   N thread-pool executors under ``instrument_executors()``, one job each
    measured    N functions made with ``exec``, each ``@asyncflow.measure``-d and called once
    metrics     N counters of distinct names, each incremented once

For each case it prints the growth of the process's resident memory (RSS) and of the Python
heap (tracemalloc, in a second process: tracing inflates RSS), per object made, and what the
endpoint then costs: ``GET /snapshot`` (size, time) and ``GET /futures?limit=10`` (time).

    python benchmarks/memory.py                   # every case, N = 10,000
    python benchmarks/memory.py --objects 2000    # smaller
    python benchmarks/memory.py --case queues     # one case, one process, figures as JSON
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import gc
import json
import os
import subprocess
import sys
import time
import tracemalloc
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

import anyio

import asyncflow

CASES = (
    "exec",
    "decorator",
    "deco-names",
    "queues",
    "streams",
    "agen-wrap",
    "agen-deco",
    "locks",
    "executors",
    "measured",
    "metrics",
)
WARM_UP = 200


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def _exec_functions(n: int, tag: str) -> None:
    with asyncflow.instrument_tasks():
        for i in range(n):
            namespace: dict[str, Any] = {}
            exec(f"async def {tag}{i}(x):\n    return x\n", namespace)
            await asyncio.create_task(namespace[f"{tag}{i}"](i))
            del namespace
        await asyncio.sleep(0)


def _factory(name: str = "worker") -> Callable[[int], Awaitable[int]]:
    @asyncflow.future(name=name)
    async def worker(i: int) -> int:
        await asyncio.sleep(0)
        return i

    return worker


async def _decorated(n: int, tag: str) -> None:
    for i in range(n):
        await _factory()(i)


async def _decorated_names(n: int, tag: str) -> None:
    for i in range(n):
        await _factory(f"fetch /item/{tag}{i}")(i)


async def _queues(n: int, tag: str) -> None:
    with asyncflow.instrument_queues():
        for i in range(n):
            q: asyncio.Queue[int] = asyncio.Queue(8)
            await q.put(i)
            await q.get()


async def _streams(n: int, tag: str) -> None:
    for i in range(n):
        send, receive = asyncflow.instrument_memory_stream(
            *anyio.create_memory_object_stream[int](1), name="short-lived"
        )
        with send, receive:
            await send.send(i)
            await receive.receive()


def _async_generator_function(name: str) -> Callable[[int], AsyncIterator[int]]:
    """An async generator function with a code object of its own, as a template engine or an
    RPC layer makes them."""
    namespace: dict[str, Any] = {}
    exec(f"async def {name}(x):\n    yield x\n", namespace)
    fn: Callable[[int], AsyncIterator[int]] = namespace[name]
    return fn


async def _wrapped_generators(n: int, tag: str) -> None:
    for i in range(n):
        async for _ in asyncflow.stream(_async_generator_function(f"{tag}{i}")(i)):
            pass


async def _decorated_generators(n: int, tag: str) -> None:
    for i in range(n):
        async for _ in asyncflow.stream(_async_generator_function(f"{tag}{i}"))(i):
            pass


async def _locks(n: int, tag: str) -> None:
    with asyncflow.instrument_locks():
        for _ in range(n):
            lock = asyncio.Lock()
            async with lock:
                await asyncio.sleep(0)


async def _executors(n: int, tag: str) -> None:
    loop = asyncio.get_running_loop()
    with asyncflow.instrument_executors():
        for i in range(n):
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                await loop.run_in_executor(pool, abs, i)


async def _measured(n: int, tag: str) -> None:
    for i in range(n):
        namespace: dict[str, Any] = {}
        exec(f"def {tag}{i}(x):\n    return x\n", namespace)
        asyncflow.measure(namespace[f"{tag}{i}"])(i)
        del namespace


async def _metrics(n: int, tag: str) -> None:
    for i in range(n):
        asyncflow.counter(f"{tag}.requests.{i}").add()


_MAKE: dict[str, Callable[[int, str], Coroutine[Any, Any, None]]] = {
    "exec": _exec_functions,
    "decorator": _decorated,
    "deco-names": _decorated_names,
    "queues": _queues,
    "streams": _streams,
    "agen-wrap": _wrapped_generators,
    "agen-deco": _decorated_generators,
    "locks": _locks,
    "executors": _executors,
    "measured": _measured,
    "metrics": _metrics,
}


def _get(url: str) -> tuple[float, int]:
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as response:
        body = response.read()
    return time.perf_counter() - start, len(body)


def one(case: str, objects: int, trace: bool) -> dict[str, float]:
    """Run one case in this process; returns its figures."""
    make = _MAKE[case]
    with asyncflow.profile(f"memory-{case}", format="none", port=0) as prof:
        assert prof.url is not None
        asyncio.run(make(WARM_UP, "w"))  # the first objects of a kind allocate shared state
        _get(f"{prof.url}/profiler_status")  # the endpoint process starts at the first request
        gc.collect()
        prof.snapshot()
        if trace:
            tracemalloc.start()
        rss, heap = _rss_bytes(), tracemalloc.get_traced_memory()[0]
        start = time.perf_counter()
        asyncio.run(make(objects, "f"))
        made_s = time.perf_counter() - start
        gc.collect()
        prof.snapshot()  # the collector drains and reaps what is gone
        rss_growth = _rss_bytes() - rss
        heap_growth = tracemalloc.get_traced_memory()[0] - heap
        if trace:
            tracemalloc.stop()
        snapshot_s, snapshot_bytes = _get(f"{prof.url}/snapshot")
        page_s, _ = _get(f"{prof.url}/futures?limit=10")
        final = prof.snapshot()
    assert final.channels is not None and final.streams is not None
    assert final.resources is not None and final.executors is not None
    assert final.functions is not None and final.user_metrics is not None
    listed = {
        "queues": len(final.channels.channels),
        "streams": len(final.channels.channels),
        "agen-wrap": final.streams.total,
        "agen-deco": final.streams.total,
        "locks": final.resources.total,
        "executors": len(final.executors.executors),
        "measured": final.functions.total,
        "metrics": final.user_metrics.total,
    }
    return {
        "objects": objects,
        "made_s": made_s,
        "rss_per_object": rss_growth / objects,
        "heap_per_object": heap_growth / objects,
        "listed": listed.get(case, len(final.futures.futures)),
        "snapshot_bytes": snapshot_bytes,
        "snapshot_s": snapshot_s,
        "futures_page_s": page_s,
    }


def _run(case: str, objects: int, trace: bool) -> dict[str, float]:
    args = [sys.executable, __file__, "--case", case, "--objects", str(objects)]
    out = subprocess.run(
        [*args, "--tracemalloc"] if trace else args, capture_output=True, text=True, check=True
    )
    figures: dict[str, float] = json.loads(out.stdout)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="asyncflow memory benchmark")
    parser.add_argument("--objects", type=int, default=10_000, help="objects made per case")
    parser.add_argument("--case", choices=CASES, help="run one case in this process (JSON)")
    parser.add_argument("--tracemalloc", action="store_true", help="trace the Python heap")
    args = parser.parse_args(argv)
    if args.case is not None:
        print(json.dumps(one(args.case, args.objects, args.tracemalloc)))
        return 0
    print(
        f"{args.objects:,} short-lived objects per case, profiler running "
        f"(python {sys.version.split()[0]}, asyncflow {asyncflow.__version__})"
    )
    header = (
        f"{'case':<10} {'RSS/object':>11} {'heap/object':>12} {'listed':>7} "
        f"{'/snapshot':>10} {'in':>7} {'/futures?limit=10':>18}"
    )
    print(header)
    for case in CASES:
        rss = _run(case, args.objects, trace=False)
        heap = _run(case, args.objects, trace=True)
        listed = rss["listed"]
        print(
            f"{case:<10} {rss['rss_per_object'] / 1024:>8.2f} KB {heap['heap_per_object']:>9.0f} B"
            f" {listed:>7.0f} {rss['snapshot_bytes'] / 1024:>7.0f} KB "
            f"{rss['snapshot_s'] * 1000:>4.0f} ms {rss['futures_page_s'] * 1000:>15.1f} ms"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
