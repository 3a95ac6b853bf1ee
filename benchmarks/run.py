"""Overhead of asyncflow's instrumentation, as ratios measured side by side in one run.

Each workload runs uninstrumented and instrumented in alternating pairs (so machine noise hits
both alike); the figure is the median over pairs of instrumented time / uninstrumented time.
asyncflow's modes run with a profiler started and its collector draining, on each hot path side
by side: the compiled one (asyncflow/instrumentation/_speedups.c, when built) and the pure-Python
reference, swapped in the same process pair by pair. Other profilers (cProfile always; yappi,
pyinstrument when installed) run on the same workload for scale. The aiohttp workload serves
a load from a child process (whose CPU time is not counted), with everything ``asyncflow run``
turns on (mode ``run``).

    python benchmarks/run.py [--pairs N] [--quick] [--no-others] [--only NAME]
    python benchmarks/run.py --leaks CALLS    (resident memory over CALLS tracked calls)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import os
import statistics
import sys
import time
import timeit
import warnings
from collections import deque
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import asyncflow
from asyncflow.instrumentation import channels, futures, queues, resources, streams

Workload = Callable[[], Coroutine[Any, Any, object]]
Deco = Callable[[Any], Any]


def _identity(fn: Any) -> Any:
    return fn


# -- workloads -------------------------------------------------------------------------------


def make_steps(deco: Deco, tasks: int, steps: int) -> tuple[Workload, int]:
    """Many tasks, each stepping through ``await asyncio.sleep(0)``: the per-poll cost."""

    @deco
    async def stepper() -> None:
        for _ in range(steps):
            await asyncio.sleep(0)

    async def main() -> object:
        return await asyncio.gather(*(asyncio.create_task(stepper()) for _ in range(tasks)))

    return main, tasks * (steps + 1)


def make_fanout(deco: Deco, roots: int) -> tuple[Workload, int]:
    """Fan-out of 3-deep nested coroutine calls, each leaf suspending once: the per-call cost."""

    @deco
    async def leaf(i: int) -> int:
        await asyncio.sleep(0)
        return i

    @deco
    async def middle(i: int) -> int:
        return sum([await leaf(i + k) for k in range(3)])

    @deco
    async def top(i: int) -> int:
        return sum([await middle(i + k) for k in range(3)])

    async def main() -> object:
        return await asyncio.gather(*(asyncio.create_task(top(i)) for i in range(roots)))

    return main, roots * 13  # calls: one top, three middles, nine leaves per root


def make_pipeline(deco: Deco, items: int) -> tuple[Workload, int]:
    """producer -> bounded queue -> 4 workers -> queue -> sink; queues instrumented when
    ``deco`` is ``asyncflow.future`` (tasks come from the mode): the per-message cost."""
    instrumented = deco is not _identity

    async def main() -> object:
        jobs: asyncio.Queue[int] = asyncio.Queue(64)
        results: asyncio.Queue[int] = asyncio.Queue()
        if instrumented:
            asyncflow.instrument_queue(jobs, name="jobs")
            asyncflow.instrument_queue(results, name="results")

        async def producer() -> None:
            for i in range(items):
                await jobs.put(i)

        async def worker() -> None:
            while True:
                item = await jobs.get()
                await results.put(item * 2)
                jobs.task_done()

        async def sink() -> int:
            total = 0
            for _ in range(items):
                total += await results.get()
            return total

        workers = [asyncio.create_task(worker()) for _ in range(4)]
        total = await asyncio.gather(asyncio.create_task(producer()), asyncio.create_task(sink()))
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        return total

    return main, items * 2  # put/get pairs: two queues


#: the load for the aiohttp workload, run in a child process so that only the service's own work
#: is timed (a run is timed by this process's CPU time): ``clients`` keep-alive connections, each
#: sending its share of ``requests`` GETs one after another
_LOOPBACK_CLIENT = """
import asyncio, sys

async def client(port, count):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for i in range(count):
        writer.write(b"GET /items/%d HTTP/1.1\\r\\nHost: 127.0.0.1\\r\\n\\r\\n" % i)
        length = 0
        while (line := await reader.readline()) != b"\\r\\n":
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        await reader.readexactly(length)
    writer.close()

async def main(port, requests, clients):
    await asyncio.gather(*(client(port, requests // clients) for _ in range(clients)))

asyncio.run(main(*map(int, sys.argv[1:4])))
"""


def make_aiohttp(deco: Deco, requests: int, clients: int = 8) -> tuple[Workload, int]:
    """An aiohttp service on loopback answering ``requests`` small JSON GETs from ``clients``
    keep-alive connections of a child process: the cost on a real service, where each request
    is a few polls of aiohttp's tasks among much library work."""
    from aiohttp import web

    async def item(request: web.Request) -> web.Response:
        await asyncio.sleep(0)  # a handler that awaits something once
        return web.json_response({"id": int(request.match_info["n"]), "ok": True})

    async def main() -> object:
        app = web.Application()
        app.router.add_get("/items/{n}", item)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            load = await asyncio.create_subprocess_exec(
                sys.executable, "-c", _LOOPBACK_CLIENT, str(port), str(requests), str(clients)
            )
            return await load.wait()
        finally:
            await runner.cleanup()

    return main, requests // clients * clients


def _wrapped(fn: Any) -> Any:
    """Marks the chain whose iterables are wrapped with ``asyncflow.stream(it)``."""
    return fn


def make_agen_chain(deco: Deco, items: int) -> tuple[Workload, int]:
    """Three chained async generators passing tiny items: the per-item cost. With ``deco``
    ``_wrapped``, each generator's iterator is wrapped with ``asyncflow.stream(it)`` instead
    of decorated."""
    track: Deco = _identity if deco in (_identity, _wrapped) else asyncflow.stream
    wrap: Callable[[Any], Any] = asyncflow.stream if deco is _wrapped else _identity

    @track
    async def source() -> Any:
        for i in range(items):
            yield i

    @track
    async def double(upstream: Any) -> Any:
        async for i in upstream:
            yield i * 2

    @track
    async def keep_even(upstream: Any) -> Any:
        async for i in upstream:
            if i % 4 == 0:
                yield i

    async def main() -> object:
        return sum([i async for i in wrap(keep_even(wrap(double(wrap(source())))))])

    return main, items * 2 + items // 2  # items through source, double and keep_even


# -- running ---------------------------------------------------------------------------------


def _time(main: Workload, tasks: bool, everything: bool = False) -> float:
    """One run's time; ``tasks``: in whole-program mode, ``everything``: with all that
    ``asyncflow run`` turns on (tasks, executors, queues, primitives, never-awaited)."""

    async def runner() -> None:
        if everything:
            with (
                asyncflow.instrument_tasks(),
                asyncflow.instrument_executors(),
                asyncflow.instrument_queues(),
                asyncflow.instrument_locks(),
                asyncflow.track_never_awaited(),
            ):
                await main()
        elif tasks:
            with asyncflow.instrument_tasks():
                await main()
        else:
            await main()

    gc.collect()
    start = _timer()
    asyncio.run(runner())
    return _timer() - start


#: what a run's time is: the process's CPU time (all its threads, the profiler's included) by
#: default, which a machine shared with other work disturbs far less than the wall clock does;
#: ``--wall`` for elapsed time
_timer: Callable[[], float] = time.process_time


def _with_profiler(kind: str, main: Workload) -> float:
    if kind == "cProfile":
        prof = cProfile.Profile()
        prof.enable()
        try:
            return _time(main, False)
        finally:
            prof.disable()
    if kind == "yappi":
        import yappi  # type: ignore[import-untyped, import-not-found, unused-ignore]

        yappi.clear_stats()
        yappi.start()
        try:
            return _time(main, False)
        finally:
            yappi.stop()
    if kind == "pyinstrument":
        import pyinstrument  # type: ignore[import-untyped, import-not-found, unused-ignore]

        sampler = pyinstrument.Profiler(async_mode="disabled")
        sampler.start()
        try:
            return _time(main, False)
        finally:
            sampler.stop()
    raise ValueError(kind)


def _available(kind: str) -> bool:
    try:
        __import__(kind)
    except ImportError:
        return False
    return True


#: the hot paths to compare: the compiled one where it is built, then the pure-Python one
PATHS = ["compiled", "python"] if futures._speedups is not None else ["python"]
#: modes that run asyncflow (the others are other profilers)
ASYNCFLOW_MODES = (
    "decorator",
    "tasks",
    "tasks+queues",
    "run",
    "streams",
    "wrapped",
)


@contextlib.contextmanager
def hot_path(path: str) -> Iterator[None]:
    """Run asyncflow on ``path`` for a while: the classes chosen at import are swapped for the
    other implementation wherever a module of the package bound them."""
    speedups = futures._speedups
    if path == "compiled" or speedups is None:
        yield
        return
    other = {
        speedups.InstrumentedCoroutine: futures.InstrumentedCoroutinePy,
        speedups.CallRecord: futures.CallRecordPy,
    }
    swapped: list[tuple[Any, str, Any]] = []
    for module in list(sys.modules.values()):
        if not getattr(module, "__name__", "").startswith("asyncflow"):
            continue
        for name in ("InstrumentedCoroutine", "CallRecord"):
            current = vars(module).get(name)
            if current in other:
                swapped.append((module, name, current))
                setattr(module, name, other[current])
    if streams.InstrumentedAsyncIteratorC is not None:
        swapped.append((streams, "InstrumentedAsyncIterator", streams.InstrumentedAsyncIterator))
        streams.InstrumentedAsyncIterator = streams.InstrumentedAsyncIteratorPy  # type: ignore[misc]
        for record in streams.stream_registry():  # counted in Python ints, as the reference does
            swapped.append((record, "stats", record.stats))
            record.stats = streams.StreamStatsPy()
    if queues._FifoHook is not None:  # the compiled _put/_get of FIFO queues
        swapped.append((queues, "_FifoHook", queues._FifoHook))
        queues._FifoHook = None
    # the Python polls' slots, read by the monitor, sampled messages and waits
    swapped.append((futures, "running_on_thread", futures.running_on_thread))
    futures.running_on_thread = futures._running_calls_py
    swapped.append((channels, "_running_call_here", channels._running_call_here))
    swapped.append((resources, "_running_call_here", resources._running_call_here))
    channels._running_call_here = resources._running_call_here = futures._running_call_py
    fold, futures.fold_finished = futures.fold_finished, None  # the collector's, in Python
    speedups.calls_without_method(futures.FutureFunction, False)  # (3.11 would keep it)
    futures.FutureFunction.__call__ = futures._py_future_call  # type: ignore[method-assign]
    factory_call = vars(futures._TaskFactory)["__call__"]
    futures._TaskFactory.__call__ = futures._py_task_factory_call  # type: ignore[method-assign]
    try:
        yield
    finally:
        futures._TaskFactory.__call__ = factory_call  # type: ignore[method-assign]
        del futures.FutureFunction.__call__  # called through its compiled base again
        speedups.calls_without_method(futures.FutureFunction)
        futures.fold_finished = fold
        for module, name, current in swapped:
            setattr(module, name, current)


def measure(
    name: str,
    build: Callable[[Deco], tuple[Workload, int]],
    modes: list[str],
    pairs: int,
    unit: str,
) -> dict[str, float]:
    """Median ratio to the plain run, per mode (and hot path: ``mode/path``), over ``pairs``
    alternating pairs; also printed: the ratio of the fastest runs of each (``best``), which
    is what a machine shared with other work still measures well."""
    plain, events = build(_identity)
    workloads = {"tasks": plain, "run": plain}
    if "tasks+queues" in modes:
        workloads["tasks+queues"] = build(asyncflow.future)[0]
    for mode, deco in (
        ("decorator", asyncflow.future),
        ("streams", asyncflow.future),
        ("wrapped", _wrapped),
    ):
        if mode in modes:
            workloads[mode] = build(deco)[0]
    runs = [(mode, path) for mode in modes for path in (PATHS if mode in ASYNCFLOW_MODES else [""])]
    ratios: dict[tuple[str, str], list[float]] = {run: [] for run in runs}
    bases: dict[tuple[str, str], list[float]] = {run: [] for run in runs}
    spents: dict[tuple[str, str], list[float]] = {run: [] for run in runs}
    _time(plain, False)  # warm up
    for _ in range(pairs):
        for mode, path in runs:
            base = _time(plain, False)
            if mode in ASYNCFLOW_MODES:
                with hot_path(path), asyncflow.profile("bench", format="none", port=0):
                    spent = _time(workloads[mode], mode in ("tasks", "tasks+queues"), mode == "run")
            else:
                spent = _with_profiler(mode, plain)
            ratios[(mode, path)].append(spent / base)
            bases[(mode, path)].append(base)
            spents[(mode, path)].append(spent)
    medians = {run: statistics.median(r) for run, r in ratios.items()}
    best = {run: min(spents[run]) / min(bases[run]) for run in runs}
    base = min(min(b) for b in bases.values())
    print(f"\n{name}  (uninstrumented: {base * 1e3:.1f} ms, {events:,} {unit}s; {pairs} pairs)")

    def cell(run: tuple[str, str]) -> str:
        ratio = medians[run]
        extra = (best[run] - 1) * base / events * 1e9
        return f"{ratio:5.2f}x best {best[run]:4.2f}x +{extra:,.0f} ns"

    paths = [p for p in PATHS]
    print(f"  {'':<13} " + "".join(f"{p:<30}" for p in paths))
    for mode in modes:
        if mode in ASYNCFLOW_MODES:
            print(f"  {mode:<13} " + "".join(f"{cell((mode, p)):<30}" for p in paths))
        else:
            print(f"  {mode:<13} {cell((mode, ''))}")
    return {f"{m}/{p}" if p else m: r for (m, p), r in medians.items()}


def floor_ns() -> tuple[float, float]:
    """Two clock reads plus one append to a bounded deque, and one clock read, in ns."""
    names = {"clock": time.perf_counter_ns, "append": deque(maxlen=4096).append}
    n = 200_000
    floor = timeit.repeat(
        "t0 = clock(); append((t0, clock()))",
        globals=names,
        number=n,
        repeat=7,
        timer=time.process_time,
    )
    read = timeit.repeat("clock()", globals=names, number=n, repeat=7, timer=time.process_time)
    return min(floor) / n * 1e9, min(read) / n * 1e9


def c_floor_ns() -> float | None:
    """Two clock reads in C (what the compiled path pays per poll at the least), in ns."""
    speedups = futures._speedups
    if speedups is None:
        return None
    return float(min(2 * speedups.clock_read_cost(1_000_000) for _ in range(7)))


def _rss_mib() -> float:
    """The process's resident memory now (Linux), else its peak, in MiB."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def leaks(calls: int, checkpoints: int = 10) -> None:
    """Drive ``calls`` tracked calls through every path (return, raise, cancel, close, throw,
    never awaited; every task made through whole-program mode's factory) and as many stream
    items through wrapped iterables (exhausted, failed, cancelled midway, abandoned) on the
    chosen hot paths, printing the resident memory as it goes: it must stay flat, the records
    of finished calls being folded and dropped as they go."""

    @asyncflow.future
    async def returns(i: int) -> int:
        await asyncio.sleep(0)
        return i

    @asyncflow.future
    async def raises(i: int) -> None:
        await asyncio.sleep(0)
        raise KeyError(i)

    @asyncflow.future
    async def hangs() -> None:
        await asyncio.Event().wait()

    async def items(n: int) -> Any:
        for i in range(n):
            yield i

    async def fails(n: int) -> Any:
        for i in range(n):
            yield i
        raise KeyError(n)

    async def stalls() -> Any:
        yield 0
        await asyncio.Event().wait()
        yield 1

    async def stream_paths(n: int) -> int:
        """About ``n`` items through wrapped iterables, on every path an iteration can end."""
        seen = 0
        for _ in range(max(1, n // 20)):
            seen += sum([i async for i in asyncflow.stream(items(10), name="items")])
            with contextlib.suppress(KeyError):
                async for _i in asyncflow.stream(fails(5), name="fails"):
                    seen += 1
            it: Any = asyncflow.stream(stalls(), name="stalls")
            await it.__anext__()
            task = asyncio.ensure_future(it.__anext__())
            await asyncio.sleep(0)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await it.aclose()
            abandoned: Any = asyncflow.stream(items(10), name="abandoned")
            await abandoned.__anext__()
            await abandoned.aclose()
            del abandoned
        return seen

    async def chunk(n: int) -> None:
        with asyncflow.instrument_tasks():  # every task through the task factory too
            await tracked_paths(n)

    async def tracked_paths(n: int) -> None:
        await stream_paths(n)
        for i in range(n // 6):
            await returns(i)
            with contextlib.suppress(KeyError):
                await raises(i)
            task = asyncio.create_task(hangs())
            await asyncio.sleep(0)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            w = hangs()
            w.send(None)
            w.close()
            w = hangs()
            w.send(None)
            with contextlib.suppress(KeyError):
                w.throw(KeyError(i))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                forgotten = hangs()
                del forgotten

    for path in PATHS:
        with hot_path(path), asyncflow.profile("leaks", format="none", port=0) as prof:
            step = calls // checkpoints
            seen = []
            for k in range(checkpoints):
                asyncio.run(chunk(step))
                prof.snapshot()  # the collector folds what finished
                gc.collect()
                seen.append(_rss_mib())
                print(
                    f"  {path:<9} {(k + 1) * step:>10,} calls: RSS {seen[-1]:.1f} MiB", flush=True
                )
            print(
                f"  {path}: RSS grew {seen[-1] - seen[0]:+.1f} MiB after the first checkpoint "
                f"({calls:,} calls and about as many stream items)"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="asyncflow overhead benchmarks")
    parser.add_argument("--pairs", type=int, default=7, help="paired runs per mode (default 7)")
    parser.add_argument("--quick", action="store_true", help="smaller workloads, 3 pairs")
    parser.add_argument(
        "--wall",
        action="store_true",
        help="time runs by the wall clock (default: the process's CPU time, all threads)",
    )
    parser.add_argument(
        "--no-others", action="store_true", help="skip cProfile, yappi and pyinstrument"
    )
    parser.add_argument(
        "--only",
        choices=["steps", "fan-out", "pipeline", "chain", "aiohttp"],
        action="append",
        help="run only these workloads (repeatable)",
    )
    parser.add_argument(
        "--leaks",
        type=int,
        metavar="CALLS",
        help="instead of timing: drive CALLS tracked calls through every path (return, raise, "
        "cancel, close, throw, never awaited) and print the resident memory as it goes",
    )
    args = parser.parse_args(argv)
    global _timer
    _timer = time.perf_counter if args.wall else time.process_time
    if args.leaks:
        leaks(args.leaks)
        return 0
    only = set(args.only or ["steps", "fan-out", "pipeline", "chain", "aiohttp"])
    pairs = 3 if args.quick else args.pairs
    scale = 4 if args.quick else 1
    others = [] if args.no_others else ["cProfile", "yappi", "pyinstrument"]
    others = [o for o in others if o == "cProfile" or _available(o)]

    floor, read = floor_ns()
    print(
        f"Python {sys.version.split()[0]}; hot paths: {', '.join(PATHS)}; "
        f"timed by {'the wall clock' if args.wall else 'CPU time (process)'}\n"
        f"floor, Python: two clock reads + one bounded-deque append = {floor:.0f} ns "
        f"(one clock read {read:.0f} ns)"
    )
    c_floor = c_floor_ns()
    if c_floor is not None:
        print(f"floor, C: two clock reads = {c_floor:.0f} ns")
    if "steps" in only:
        measure(
            "steps: 1000 tasks x 50 x await asyncio.sleep(0)",
            lambda deco: make_steps(deco, 1000 // scale, 50),
            ["decorator", "tasks", *others],
            pairs,
            "poll",
        )
    if "fan-out" in only:
        measure(
            "fan-out: 300 root tasks, 3-deep nested calls (3x3 leaves)",
            lambda deco: make_fanout(deco, 300 // scale),
            ["tasks", "decorator", *others],
            pairs,
            "call",
        )
    if "pipeline" in only:
        measure(
            "pipeline: producer -> queue(64) -> 4 workers -> queue -> sink, 20000 items",
            lambda deco: make_pipeline(deco, 20_000 // scale),
            ["tasks+queues", *others],
            pairs,
            "put/get pair",
        )
    if "chain" in only:
        measure(
            "chained async generators: 3 stages, 50000 tiny items (streams: @asyncflow.stream; "
            "wrapped: asyncflow.stream(it))",
            lambda deco: make_agen_chain(deco, 50_000 // scale),
            ["streams", "wrapped", *others],
            pairs,
            "item",
        )
    if "aiohttp" in only:
        measure(
            "aiohttp on loopback: 8 keep-alive clients (a child process) x small JSON GETs "
            "(run: all that asyncflow run turns on)",
            lambda deco: make_aiohttp(deco, 4000 // scale),
            ["run", *others],
            pairs,
            "request",
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
