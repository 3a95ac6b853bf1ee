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

Four more cases are read as their count grows, on one event loop: the growth of RSS and heap
at each quarter of the count, which stays flat once the profiler's bounds are full, and what
it keeps at the end:

    own-calls   1,000,000 calls of three coroutine functions of the program's own code (compiled
                as ``asyncflow run``'s import hook compiles them: each ``async def`` tracked)
    own-defs    10,000 modules of own code, each with one coroutine function of its own name,
                called once and dropped
    blocking    10,000 distinct lines that each block the loop 10 ms (block_threshold=0.02,
                block_min=0.005: each counted on its line); 32 lines are kept per loop
    children    200 short-lived child processes (multiprocessing, fork) that the program run
                by ``asyncflow run`` starts one after another: the parent's memory

    python benchmarks/memory.py                   # every case, N = 10,000 (and the counts above)
    python benchmarks/memory.py --objects 2000    # smaller
    python benchmarks/memory.py --case queues     # one case, one process, figures as JSON
    python benchmarks/memory.py --growth          # only the four growth cases

``--live-tasks 1000,10000,100000`` instead measures what a live task costs (issue 28: a tracked
one at most 400 B more than a plain one): N tasks parked on an event, in fresh processes, plain
and tracked (a profiler, ``instrument_tasks()``), the Python heap each adds (tracemalloc: exact;
the RSS is left out, as tracing inflates it). Each task's name is read in both, as a tracked
task's first poll reads it (3.12 made a task's default name lazy: that string is the task's own,
about 50 B, made for whoever asks); ``unnamed`` is the plain task whose name nobody read. The
profiler looks at no late loop's stack meanwhile (the source lines it would read once are no
task's cost); at 100,000 tasks the collector's own lists of them (``all_tasks()``) add ~9 B.

    python benchmarks/memory.py --live-tasks 1000,10000,100000
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import functools
import gc
import json
import multiprocessing
import os
import subprocess
import sys
import time
import tracemalloc
import types
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

import anyio

import asyncflow
from asyncflow.instrumentation import futures, own_code

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


def _start_reading(trace: bool, settle: Callable[[], object] = lambda: None) -> tuple[int, int]:
    """After a warm-up: what is garbage collected and ``settle()`` done (the collector's drain,
    with ``prof.snapshot``), the heap traced if ``trace``; returns RSS and heap now."""
    gc.collect()
    settle()
    if trace:
        tracemalloc.start()
    return _rss_bytes(), tracemalloc.get_traced_memory()[0]


def _grown(since: tuple[int, int], settle: Callable[[], object] = lambda: None) -> tuple[int, int]:
    """RSS and heap grown since :func:`_start_reading`, what is gone collected and settled."""
    gc.collect()
    settle()
    return _rss_bytes() - since[0], tracemalloc.get_traced_memory()[0] - since[1]


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


#: cases read as the count grows (their figures at each quarter of it): what the profiler
#: keeps must be bounded by what is live, flat however many were made
GROWTH_CASES = ("own-calls", "own-defs", "blocking", "raised", "children")
#: what each growth case makes by default (``--objects`` sets it for all)
GROWTH_COUNTS = {
    "own-calls": 1_000_000,
    "own-defs": 10_000,
    "blocking": 10_000,
    "raised": 10_000,
    "children": 200,
}
#: the growth cases' profiler options: blocks of 2 ms and more are summed on their lines
GROWTH_OPTIONS: dict[str, dict[str, Any]] = {
    # blocks of 10 ms, each counted on its line: the loop monitor, which looks every 2.5 ms at
    # these settings, sees nearly all of them (at 3 ms and finer settings it saw few on a
    # loaded machine)
    "blocking": {"block_threshold": 0.02, "block_min": 0.005}
}
#: the warm-up of each growth case: what is made before the first reading
GROWTH_WARM_UP = {"blocking": 40}
#: the own-code module of ``own-calls``: a few functions, called again and again
_OWN_SOURCE = """
async def fetch(i):
    return i

async def parse(i):
    return await fetch(i) + 1

async def handle(i):
    return await parse(i)
"""


def _own_module(source: str, name: str) -> dict[str, Any]:
    """A module of the program's own code, compiled as ``asyncflow run`` compiles it."""
    namespace: dict[str, Any] = {"__name__": name}
    exec(own_code.compile_source(source, f"{name}.py"), namespace)
    return namespace


@functools.cache
def _own_handle() -> Callable[[int], Awaitable[int]]:
    handle: Callable[[int], Awaitable[int]] = _own_module(_OWN_SOURCE, "own_calls")["handle"]
    return handle


async def _own_calls(n: int, tag: str) -> None:
    handle = _own_handle()
    for i in range(n // 3):  # three calls each: handle, parse, fetch
        await handle(i)


async def _own_defs(n: int, tag: str) -> None:
    for i in range(n):
        namespace = _own_module(f"async def {tag}{i}(x):\n    return x\n", f"own_{tag}{i}")
        await namespace[f"{tag}{i}"](i)
        del namespace


#: the own-code module of ``raised``: a call that raises what it is given, and one that returns
_RAISED_SOURCE = """
async def fail(exc):
    raise exc

async def succeed(i):
    return i
"""


@functools.cache
def _raising() -> tuple[Callable[..., Coroutine[Any, Any, Any]], ...]:
    module = _own_module(_RAISED_SOURCE, "raised")
    return module["fail"], module["succeed"]


async def _raised(n: int, tag: str) -> None:
    # each gather of two tasks: one call raising an exception of a class of its own (a new
    # type name each time: the per-future count of types by name is bounded), one returning;
    # the exception retrieved through return_exceptions (the never-retrieved watch forgets it)
    fail, succeed = _raising()
    for i in range(n):
        error = type(f"{tag}Error{i}", (Exception,), {})
        await asyncio.gather(
            asyncio.create_task(fail(error())),
            asyncio.create_task(succeed(i)),
            return_exceptions=True,
        )


def _block() -> None:
    time.sleep(0.01)  # blocks the loop 10 ms


async def _blocking(n: int, tag: str) -> None:
    for i in range(n):
        # a line of its own: the same code moved to line 1 + i of this file, under a name of
        # its own (a function compiled afresh each time kept some 70 B of Python's for good)
        code = _block.__code__.replace(co_firstlineno=1 + i, co_name=f"{tag}{i}")
        types.FunctionType(code, globals())()
        await asyncio.sleep(0)


async def _child_work() -> int:
    await asyncio.sleep(0)
    return 1


def _child() -> None:
    asyncio.run(_child_work())


def _children_program(count: int, trace: bool) -> None:
    """Under ``asyncflow run``: start ``count`` short-lived children, one after another, and
    print this parent's growth at each quarter, as JSON."""
    context = multiprocessing.get_context("fork")

    def children(k: int) -> None:
        for _ in range(k):
            process = context.Process(target=_child)
            process.start()
            process.join()
            assert process.exitcode == 0, process.exitcode

    children(10)  # warm up
    since = _start_reading(trace)
    points: list[tuple[int, int]] = []
    start = time.perf_counter()
    for _ in range(4):
        children(count // 4)
        points.append(_grown(since))
    made_s = time.perf_counter() - start
    print(json.dumps({"objects": count, "made_s": made_s, "points": points, "kept": None}))


_GROWTH: dict[str, Callable[[int, str], Coroutine[Any, Any, None]]] = {
    "own-calls": _own_calls,
    "own-defs": _own_defs,
    "blocking": _blocking,
    "raised": _raised,
}


def grow(case: str, count: int, trace: bool) -> dict[str, Any]:
    """Run one growth case in this process, on one event loop: the growth of RSS and heap at
    each quarter of ``count``, and what the profiler keeps of them at the end."""
    make = _GROWTH[case]
    points: list[tuple[int, int]] = []

    async def measured(prof: asyncflow.Profiler) -> float:
        # (the loop monitor watches the loops whose tasks are tracked)
        with asyncflow.instrument_tasks():
            await make(GROWTH_WARM_UP.get(case, WARM_UP), "w")
            since = _start_reading(trace, prof.snapshot)
            start = time.perf_counter()
            for quarter in range(4):
                await make(count // 4, f"q{quarter}_")
                # (the collector drains and reaps what is gone)
                points.append(_grown(since, prof.snapshot))
            if trace:
                tracemalloc.stop()
            return time.perf_counter() - start

    tracking = own_code.track_own_code(__file__)
    options = GROWTH_OPTIONS.get(case, {})
    try:
        with asyncflow.profile(f"memory-{case}", format="none", port=0, **options) as prof:
            made_s = asyncio.run(measured(prof))
            final = prof.snapshot()
    finally:
        tracking.undo()
    kept, counted = len(final.futures.futures), None
    if case == "blocking":
        assert final.loop is not None
        (loop,) = [entry for entry in final.loop.loops if entry.blocking_lines]
        kept = len(loop.blocking_lines)
        counted = sum(line.count for line in loop.blocking_lines) + loop.other_blocks
    return {"objects": count, "made_s": made_s, "points": points, "kept": kept, "counted": counted}


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
        since = _start_reading(trace, prof.snapshot)
        start = time.perf_counter()
        asyncio.run(make(objects, "f"))
        made_s = time.perf_counter() - start
        # (the collector drains and reaps what is gone)
        rss_growth, heap_growth = _grown(since, prof.snapshot)
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


def _run(case: str, objects: int, trace: bool) -> dict[str, Any]:
    args = [sys.executable, __file__, "--case", case, "--objects", str(objects)]
    if case == "children":  # the parent is the program `asyncflow run` runs
        args = [sys.executable, "-m", "asyncflow", "run", "--port", "0", "--format", "none"]
        args += [__file__, "--children-program", "--objects", str(objects)]
    out = subprocess.run(
        [*args, "--tracemalloc"] if trace else args, capture_output=True, text=True, check=True
    )
    figures: dict[str, Any] = json.loads(out.stdout.splitlines()[-1])
    return figures


def _table(objects: int) -> None:
    """The short-lived objects' cases: growth per object, and the endpoint afterwards."""
    print(
        f"{objects:,} short-lived objects per case, profiler running "
        f"(python {sys.version.split()[0]}, asyncflow {asyncflow.__version__})"
    )
    header = (
        f"{'case':<10} {'RSS/object':>11} {'heap/object':>12} {'listed':>7} "
        f"{'/snapshot':>10} {'in':>7} {'/futures?limit=10':>18}"
    )
    print(header)
    for case in CASES:
        rss = _run(case, objects, trace=False)
        heap = _run(case, objects, trace=True)
        listed = rss["listed"]
        print(
            f"{case:<10} {rss['rss_per_object'] / 1024:>8.2f} KB {heap['heap_per_object']:>9.0f} B"
            f" {listed:>7.0f} {rss['snapshot_bytes'] / 1024:>7.0f} KB "
            f"{rss['snapshot_s'] * 1000:>4.0f} ms {rss['futures_page_s'] * 1000:>15.1f} ms"
        )


def _growth_table(objects: int | None) -> None:
    """The growth cases: what the profiler holds at each quarter of the count."""
    print(
        "what is live bounds what is kept: growth at each quarter of the count, RSS (heap) "
        f"(python {sys.version.split()[0]}, asyncflow {asyncflow.__version__})"
    )
    print(
        f"{'case':<10} {'count':>10} {'25%':>16} {'50%':>16} {'75%':>16} {'100%':>16} {'kept':>6}"
    )
    for case in GROWTH_CASES:
        count = objects or GROWTH_COUNTS[case]
        rss = _run(case, count, trace=False)
        heap = _run(case, count, trace=True)
        cells = [
            f"{r / 1024:>6.0f} ({h / 1024:>4.0f}) KB"
            for (r, _), (_, h) in zip(rss["points"], heap["points"], strict=True)
        ]
        kept = "-" if rss["kept"] is None else f"{rss['kept']:.0f}"
        print(f"{case:<10} {count:>10,} {' '.join(f'{c:>16}' for c in cells)} {kept:>6}")


async def _parked(gate: asyncio.Event) -> None:
    await gate.wait()


async def _live_tasks(n: int, named: bool) -> float:
    """N tasks parked on an event: the heap (tracemalloc) each adds."""
    gate = asyncio.Event()
    warm = [asyncio.ensure_future(_parked(gate)) for _ in range(100)]  # first-use allocations
    await asyncio.sleep(0)
    gate.set()
    await asyncio.gather(*warm)
    gate.clear()
    del warm
    gc.collect()
    tracemalloc.start()
    tasks = [asyncio.ensure_future(_parked(gate)) for _ in range(n)]
    await asyncio.sleep(0)  # each runs to its wait
    if named:
        for task in tasks:
            task.get_name()
    gc.collect()
    heap = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    gate.set()
    await asyncio.gather(*tasks)
    return heap / n


async def _live_child(kind: str, n: int) -> float:
    if kind != "tracked":
        return await _live_tasks(n, named=kind == "plain")
    with asyncflow.profile(
        "live-tasks", port=None, format="none", block_threshold=3600, block_min=3600
    ):
        handle = asyncflow.instrument_tasks()
        try:
            return await _live_tasks(n, named=True)
        finally:
            handle.undo()


def _live_table(counts: list[int]) -> None:
    path = "compiled" if futures.accelerated else "pure-Python"
    print(
        f"a live task parked on an event: the Python heap it adds, fresh processes "
        f"(python {sys.version.split()[0]}, asyncflow {asyncflow.__version__}, {path} path)"
    )
    print(f"{'tasks':>8} {'plain':>14} {'unnamed':>14} {'tracked':>14} {'tracked - plain':>18}")
    for n in counts:
        got: dict[str, float] = {}
        for kind in ("plain", "unnamed", "tracked"):
            done = subprocess.run(
                [sys.executable, __file__, "--live-child", kind, str(n)],
                capture_output=True,
                text=True,
                check=True,
            )
            got[kind] = json.loads(done.stdout.splitlines()[-1])
        cells = [f"{got[k]:.0f} B" for k in ("plain", "unnamed", "tracked")]
        more = got["tracked"] - got["plain"]
        print(f"{n:>8,} {cells[0]:>14} {cells[1]:>14} {cells[2]:>14} {f'+{more:.0f} B':>18}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="asyncflow memory benchmark")
    parser.add_argument("--objects", type=int, help="objects made per case (default 10,000)")
    parser.add_argument(
        "--case", choices=CASES + GROWTH_CASES, help="run one case in this process (JSON)"
    )
    parser.add_argument("--growth", action="store_true", help="only the growth cases")
    parser.add_argument("--tracemalloc", action="store_true", help="trace the Python heap")
    parser.add_argument("--children-program", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--live-tasks", metavar="COUNTS", help="instead: a live task's memory, e.g. 1000,10000"
    )
    parser.add_argument("--live-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.live_child:
        kind, n = args.live_child
        print(json.dumps(asyncio.run(_live_child(kind, int(n)))))
        return 0
    if args.live_tasks:
        _live_table([int(n) for n in args.live_tasks.split(",")])
        return 0
    if args.children_program:  # (run by the `children` case, under `asyncflow run`)
        _children_program(args.objects or GROWTH_COUNTS["children"], args.tracemalloc)
        return 0
    if args.case in GROWTH_CASES:
        if args.case == "children":
            print(
                json.dumps(
                    _run(args.case, args.objects or GROWTH_COUNTS["children"], args.tracemalloc)
                )
            )
        else:
            print(
                json.dumps(
                    grow(args.case, args.objects or GROWTH_COUNTS[args.case], args.tracemalloc)
                )
            )
        return 0
    if args.case is not None:
        print(json.dumps(one(args.case, args.objects or 10_000, args.tracemalloc)))
        return 0
    if not args.growth:
        _table(args.objects or 10_000)
        print()
    _growth_table(args.objects)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
