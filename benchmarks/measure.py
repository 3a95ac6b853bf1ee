"""What ``@asyncflow.measure``, ``measure_block`` and the metric handles cost per call.

Each case runs a tight loop of calls in alternating pairs in one process: the plain code, then
the same code measured (and so on, ``--pairs`` times). Printed per case: the median over pairs
of the added time per call (measured minus plain, in ns) and of the ratio measured / plain.
The coroutine figures beside them are the same workload through ``@asyncflow.future`` (a
tracked call), so a measured call can be compared with what a tracked coroutine call costs.
Each thread records into a shard of its own (no lock): the 4-thread cases show that threads
add nothing but the GIL's hand-offs.

Modes: ``off`` (decorated, no profiler running: one check per call) and ``on`` (a profiler
running, its collector draining every 50 ms). The loops do almost nothing, so the ratios are
the worst case; a function that does real work pays the same added nanoseconds.

    python benchmarks/measure.py                  # 15 pairs, 20,000 calls a run
    python benchmarks/measure.py --pairs 5 --calls 5000
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import asyncflow

CALLS = 20_000


def _plain(x: int) -> int:
    return x + 1


_measured = asyncflow.measure(name="bench.sync")(_plain)


@asyncflow.measure(name="bench.inner")
def _inner(x: int) -> int:
    return x + 1


def _outer_plain(x: int) -> int:
    return _plain(_plain(x))


@asyncflow.measure(name="bench.outer")
def _outer_measured(x: int) -> int:
    return _inner(_inner(x))


async def _coro(x: int) -> int:
    return x + 1


_coro_measured = asyncflow.measure(name="bench.async")(_coro)
_coro_future = asyncflow.future(name="bench.future")(_coro)


def _sync_loop(fn: Callable[[int], int]) -> Callable[[int], None]:
    def run(n: int) -> None:
        for i in range(n):
            fn(i)

    return run


def _block_plain(n: int) -> None:
    for _ in range(n):
        pass


def _block_measured(n: int) -> None:
    for _ in range(n):
        with asyncflow.measure_block("bench.block"):
            pass


def _async_loop(fn: Callable[[int], Any]) -> Callable[[int], None]:
    async def drive(n: int) -> None:
        for i in range(n):
            await fn(i)

    def run(n: int) -> None:
        asyncio.run(drive(n))

    return run


class _Nop:
    def add(self, n: int = 1) -> None:
        pass

    def set(self, v: float) -> None:
        pass

    def record(self, v: float) -> None:
        pass


def _metric_loop(handle: Any, method: str) -> Callable[[int], None]:
    def run(n: int) -> None:
        call = getattr(handle, method)
        for i in range(n):
            call(i & 1023)

    return run


def _value_plain(n: int) -> None:
    nop = _Nop()
    for i in range(n):
        nop.set(i)


def _value_logged(n: int) -> None:
    value = asyncflow.value
    for i in range(n):
        value("bench.value", i)


def _threads(fn: Callable[[int], int], threads: int = 4) -> Callable[[int], None]:
    def run(n: int) -> None:
        each = n // threads
        workers = [threading.Thread(target=_sync_loop(fn), args=(each,)) for _ in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()

    return run


def _threads_of(loop: Callable[[int], None], threads: int = 4) -> Callable[[int], None]:
    def run(n: int) -> None:
        workers = [threading.Thread(target=loop, args=(n // threads,)) for _ in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()

    return run


#: name -> (plain, measured), each running n calls
CASES: dict[str, tuple[Callable[[int], None], Callable[[int], None]]] = {
    "sync function": (_sync_loop(_plain), _sync_loop(_measured)),
    "nested: outer(inner(inner))": (_sync_loop(_outer_plain), _sync_loop(_outer_measured)),
    "sync function, 4 threads": (_threads(_plain), _threads(_measured)),
    "measure_block": (_block_plain, _block_measured),
    "async function (await)": (_async_loop(_coro), _async_loop(_coro_measured)),
    "  beside it: @asyncflow.future": (_async_loop(_coro), _async_loop(_coro_future)),
    "counter.add": (_metric_loop(_Nop(), "add"), _metric_loop(asyncflow.counter("c"), "add")),
    "gauge.set": (_metric_loop(_Nop(), "set"), _metric_loop(asyncflow.gauge("g"), "set")),
    "histogram.record": (
        _metric_loop(_Nop(), "record"),
        _metric_loop(asyncflow.histogram("h"), "record"),
    ),
    "value(name, v)": (_value_plain, _value_logged),
    "counter.add, 4 threads": (
        _threads_of(_metric_loop(_Nop(), "add")),
        _threads_of(_metric_loop(asyncflow.counter("c"), "add")),
    ),
}


def _per_call(run: Callable[[int], None], n: int) -> float:
    t0 = time.perf_counter_ns()
    run(n)
    return (time.perf_counter_ns() - t0) / n


def figures(pairs: int, calls: int, mode: str) -> None:
    """Print, per case, the median added ns per call and the median ratio over ``pairs``."""
    print(f"\nmode {mode}: {calls:,} calls a run, median of {pairs} alternating pairs")
    print(f"{'case':34} {'plain ns':>9} {'added ns':>9} {'ratio':>7}")
    for name, (plain, measured) in CASES.items():
        plain(calls // 10)  # warm up both
        measured(calls // 10)
        added, ratios, base = [], [], []
        for _ in range(pairs):
            a = _per_call(plain, calls)
            b = _per_call(measured, calls)
            base.append(a)
            added.append(b - a)
            ratios.append(b / a)
        print(
            f"{name:34} {statistics.median(base):9.0f} {statistics.median(added):9.0f} "
            f"{statistics.median(ratios):6.2f}x"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=15, help="alternating pairs (default 15)")
    parser.add_argument("--calls", type=int, default=CALLS, help="calls per run (default 20000)")
    parser.add_argument("--only", choices=("off", "on"), help="one mode only")
    args = parser.parse_args(argv)
    if args.only in (None, "off"):
        figures(args.pairs, args.calls, "off (no profiler running)")
    if args.only in (None, "on"):
        with asyncflow.profile("bench", format="none", port=None):
            figures(args.pairs, args.calls, "on (profiler running)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
