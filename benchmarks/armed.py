"""What armed mode costs: benchmarks/run.py's workloads, plain and armed, in alternating pairs.

Armed (``asyncflow.arm()``, ``asyncflow run --armed``) records nothing: a thread waits in
``accept()`` on the control socket, and each event loop made is noted once. Each pair runs a
workload plain and with the process armed (armed before ``asyncio.run``, so that the new
loop passes through the armed hook as a program's would; disarmed after), every other pair
armed first; the figure is the
median over pairs of armed / plain time, in process CPU time (all threads), as run.py measures;
``best`` is the fastest armed run over the fastest plain one, which a machine shared with other
work still measures well.

    python benchmarks/armed.py [--pairs N] [--null] [--only WORD]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable

from run import (  # benchmarks/run.py: the same workloads as the overhead figures
    Deco,
    Workload,
    _identity,
    _time,
    make_agen_chain,
    make_fanout,
    make_pipeline,
    make_steps,
)

from asyncflow import _armed

WORKLOADS: dict[str, Callable[[Deco], tuple[Workload, int]]] = {
    "steps (1,000 tasks x 50 polls)": lambda deco: make_steps(deco, 1000, 50),
    "fanout (3,000 roots, nested calls)": lambda deco: make_fanout(deco, 3000),
    "pipeline (20,000 messages)": lambda deco: make_pipeline(deco, 20_000),
    "async generators (50,000 items)": lambda deco: make_agen_chain(deco, 50_000),
}


def armed_time(main: Workload) -> float:
    _armed.arm("bench")
    try:
        return _time(main, False)
    finally:
        _armed.disarm()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=15, help="alternating pairs per workload")
    parser.add_argument(
        "--null",
        action="store_true",
        help="also plain / plain: what the machine's noise alone makes of a ratio",
    )
    parser.add_argument("--only", default="", help="the workloads whose name has this word")
    args = parser.parse_args(argv)
    print(
        f"armed (or plain) / plain, median of {args.pairs} pairs (process CPU time); Python "
        f"{sys.version_info.major}.{sys.version_info.minor}"
    )
    for name, build in WORKLOADS.items():
        if args.only not in name:
            continue
        plain, _ = build(_identity)
        _time(plain, False)  # warm up
        runs: list[tuple[str, Callable[[Workload], float]]] = [("armed", armed_time)]
        if args.null:
            runs.append(("plain", lambda main: _time(main, False)))
        for label, other in runs:
            ratios: list[float] = []
            bases: list[float] = []
            for i in range(args.pairs):
                if i % 2:  # every other pair this side first: neither always runs second
                    spent = other(plain)
                    base = _time(plain, False)
                else:
                    base = _time(plain, False)
                    spent = other(plain)
                ratios.append(spent / base)
                bases.append(base)
            spents = [r * b for r, b in zip(ratios, bases, strict=True)]
            print(
                f"  {name:<36} {label} {statistics.median(ratios):5.3f}x  best "
                f"{min(spents) / min(bases):5.3f}x  (plain {min(bases) * 1e3:.0f} ms; pairs "
                f"{min(ratios):.3f}-{max(ratios):.3f})"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
