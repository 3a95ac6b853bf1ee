"""What a recording costs (``asyncflow run --record``): time beside plain profiling, and size.

Time: a busy program (40 coroutine functions stepped in a gather, a queue between a producer
and a consumer) does a fixed amount of work under ``asyncflow run``, with and without
``--record``, in alternating pairs, each pair in fresh processes; the program measures its own
work in the process's CPU time (the program's and the profiler thread's: what the recording
adds, whatever else the machine runs) and in wall time. Prints each pair's ratios and the
medians.

Size: the same program runs for ``--seconds`` (60 by default) with ``--record`` and a budget
too large to thin anything, then with the default budget; prints the file's size, per minute.

    python benchmarks/record.py                 # 7 pairs, then a minute's recording
    python benchmarks/record.py --pairs 3 --seconds 20
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PROGRAM = """\
import asyncio, sys, time

async def step(n):
    await asyncio.sleep(0)
    return n

STEPS = [step]
for i in range(39):
    exec(f"async def step{i}(n):\\n    await asyncio.sleep(0)\\n    return n")
    STEPS.append(globals()[f"step{i}"])

async def produce(q, rounds):
    for i in range(rounds):
        await q.put(i)
    await q.put(None)

async def consume(q):
    while await q.get() is not None:
        pass

async def main():
    rounds, seconds = int(sys.argv[1]), float(sys.argv[2])
    q = asyncio.Queue(maxsize=100)
    start, cpu = time.perf_counter(), time.process_time()
    n = 0
    while n < rounds or time.perf_counter() - start < seconds:
        await asyncio.gather(*(s(n) for s in STEPS))
        n += 1
    await asyncio.gather(produce(q, rounds * 10), consume(q))
    # the process's CPU time: the program's and the profiler thread's, whatever else runs
    print(f"{time.perf_counter() - start:.4f} {time.process_time() - cpu:.4f}")

asyncio.run(main())
"""


def _run(directory: Path, *flags: str, rounds: int, seconds: float) -> tuple[float, float]:
    """The program's wall time and the process's CPU time for its work."""
    done = subprocess.run(
        [sys.executable, "-m", "asyncflow", "run", "--port", "0", "--format", "none", *flags,
         str(directory / "busy.py"), str(rounds), str(seconds)],
        capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    wall, cpu = done.stdout.split()[-2:]
    return float(wall), float(cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=4000)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        directory = Path(name)
        (directory / "busy.py").write_text(PROGRAM)
        rec = directory / "busy.afrec"
        ratios: list[float] = []
        walls: list[float] = []
        for pair in range(args.pairs):
            order = ("off", "on") if pair % 2 == 0 else ("on", "off")
            took = {}
            for mode in order:
                flags = ("--record", str(rec)) if mode == "on" else ()
                took[mode] = _run(directory, *flags, rounds=args.rounds, seconds=0)
            ratios.append(took["on"][1] / took["off"][1])
            walls.append(took["on"][0] / took["off"][0])
            print(f"pair {pair + 1}: CPU off {took['off'][1]:.3f} s, on {took['on'][1]:.3f} s, "
                  f"on/off {ratios[-1]:.3f} (wall {walls[-1]:.3f})")  # fmt: skip
        print(f"median on/off over {args.pairs} pairs: CPU {statistics.median(ratios):.3f}, "
              f"wall {statistics.median(walls):.3f}")  # fmt: skip
        print(f"a recording of {args.rounds} rounds: {os.path.getsize(rec) / 1e3:.0f} kB")
        for budget in ("100000", "5"):
            _run(directory, "--record", str(rec), "--record-budget", budget, rounds=0,
                 seconds=args.seconds)  # fmt: skip
            size = os.path.getsize(rec)
            per_minute = size / 1e6 * 60 / args.seconds
            print(f"budget {budget} MB, {args.seconds:g} s busy: {size / 1e6:.2f} MB "
                  f"({per_minute:.2f} MB a minute)")  # fmt: skip


if __name__ == "__main__":
    main()
