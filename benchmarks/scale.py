"""Scale: what asyncflow costs as live tasks grow, and how soon its endpoint first answers.

For each count N of live tasks (each awaiting one ``asyncio.Event``), pairs of fresh processes,
in alternating order: a *plain* program (no profiler) and a *tracked* one (a profiler serving its
endpoint on port 0, ``instrument_tasks()``). Each prints, as medians over the pairs:

    memory     the Python heap (tracemalloc, exact) and the resident memory (RSS, by pages)
               each live task adds, plain and tracked, and the difference (what a tracked
               live task costs more)
    collector  the profiler thread's CPU while the N tasks wait and nobody asks (ms a second)
    routes     each route's first answer with the N tasks alive (wall time of one GET, nothing
               cached: the document is built for it)
    stall      the program loop's longest stall (a 1 ms ticker's longest lateness) over a few
               seconds while one client polls ``/tasks`` every 0.5 s (``asyncflow top``'s
               interval), beside the same program left alone, and the plain program's; and
               the process's own CPU time during that stall (on a loaded machine most of a
               stall can be other processes' turn), and the full collections meanwhile

Then ``first``: pairs of a bare ``python -c "import aiohttp.web"`` and a program that starts a
profiler (port 0) and prints its URL; a client connects at once, and the time from the URL to
the first answer (``GET /profiler_status``) is set beside the import's, as a ratio, for a program
idle after ``start()`` and one busy computing on its loop (yielding between slices of 0.2 ms);
then the slowest of five more answers, asked one after the other while it is still idle or busy.

On a loaded machine each figure is the median of few pairs (``--pairs``): read the ratios, not
the milliseconds, and the spread the pairs print.

    python benchmarks/scale.py                                # 1k, 10k, 100k; 3 pairs
    python benchmarks/scale.py --tasks 1000,10000 --pairs 2
    python benchmarks/scale.py --only first --pairs 7
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import tracemalloc
from typing import Any

ROUTES = (
    "/profiler_status",
    "/futures",
    "/tasks?limit=20",
    "/graph",
    "/loop",
    "/warnings",
    "/resources",
    "/snapshot",
)
STALL_SECONDS = 4.0
POLL_SECONDS = 0.5


# -- the programs measured (child processes) --------------------------------------------------


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def _parked(gate: asyncio.Event) -> None:
    await gate.wait()


async def _live(n: int, gate: asyncio.Event) -> tuple[list[asyncio.Task[None]], int, int]:
    """N tasks waiting on ``gate``; the Python heap (tracemalloc) and the RSS they added, per
    task (the heap is exact at any N; the RSS moves by whole pages and arenas)."""
    warm = [asyncio.ensure_future(_parked(gate)) for _ in range(100)]  # first-use allocations
    await asyncio.sleep(0)
    gate.set()
    await asyncio.gather(*warm)
    gate.clear()
    del warm
    gc.collect()
    before = _rss()
    tracemalloc.start()
    tasks = [asyncio.ensure_future(_parked(gate)) for _ in range(n)]
    await asyncio.sleep(0)  # each runs to its wait
    await asyncio.sleep(0)
    gc.collect()
    heap = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return tasks, heap // n, (_rss() - before) // n


async def _longest_stall(seconds: float) -> float:
    """The loop's longest lateness over ``seconds``, from a ticker asking for 1 ms sleeps."""
    return (await _stalls(seconds))[0]


async def _stalls(seconds: float) -> tuple[float, float, int]:
    """The loop's longest lateness over ``seconds`` (a ticker asking for 1 ms sleeps), the
    process's CPU time during that stall (what the program and asyncflow did then; the rest
    is the machine's other work), and the full collections run meanwhile."""
    worst = worst_cpu = 0.0
    full = [0]

    def collected(phase: str, info: dict[str, Any]) -> None:
        full[0] += phase == "stop" and info["generation"] == 2

    gc.callbacks.append(collected)
    try:
        end = time.perf_counter() + seconds
        while (now := time.perf_counter()) < end:
            cpu = time.process_time()
            await asyncio.sleep(0.001)
            late = time.perf_counter() - now - 0.001
            if late > worst:
                worst, worst_cpu = late, time.process_time() - cpu
    finally:
        gc.callbacks.remove(collected)
    return worst, worst_cpu, full[0]


def _get(url: str, path: str) -> tuple[int, float]:
    """One request on a fresh connection: status and wall seconds."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    started = time.perf_counter()
    with socket.create_connection((host, int(port)), timeout=120) as sock:
        sock.sendall(
            f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode()
        )
        data = b""
        while chunk := sock.recv(1 << 20):
            data += chunk
    if not data:
        raise ConnectionError(f"{path}: the connection closed without an answer")
    return int(data.split(b" ", 2)[1]), time.perf_counter() - started


def _poller(url: str, stop: threading.Event, seen: list[int]) -> None:
    while not stop.is_set():
        seen.append(_get(url, "/tasks")[0])
        stop.wait(POLL_SECONDS)


async def _plain(n: int) -> dict[str, Any]:
    gate = asyncio.Event()
    tasks, heap, rss = await _live(n, gate)
    stall = await _longest_stall(STALL_SECONDS)
    gate.set()
    await asyncio.gather(*tasks)
    return {"heap": heap, "rss": rss, "stall": stall}


async def _tracked(n: int) -> dict[str, Any]:
    import asyncflow

    loop = asyncio.get_running_loop()
    figures: dict[str, Any] = {}
    with asyncflow.profile("scale", format="none", port=0) as prof:
        asyncflow.instrument_tasks()
        gate = asyncio.Event()
        tasks, figures["heap"], figures["rss"] = await _live(n, gate)
        thread = prof._thread
        assert thread is not None and thread.ident is not None and prof.url is not None
        clock = time.pthread_getcpuclockid(thread.ident)
        await asyncio.sleep(1.0)  # the collector has seen them all
        cpu, wall = time.clock_gettime(clock), time.perf_counter()
        await asyncio.sleep(3.0)
        figures["collector_ms_s"] = (
            1000 * (time.clock_gettime(clock) - cpu) / (time.perf_counter() - wall)
        )
        figures["quiet_stall"] = await _longest_stall(STALL_SECONDS)
        routes: dict[str, float] = {}
        for path in ROUTES:
            status, seconds = await loop.run_in_executor(None, _get, prof.url, path)
            routes[path] = seconds if status == 200 else float("nan")
        figures["routes"] = routes
        stop, seen = threading.Event(), list[int]()
        poller = threading.Thread(target=_poller, args=(prof.url, stop, seen), daemon=True)
        poller.start()
        polled = await _stalls(STALL_SECONDS)
        figures["polled_stall"], figures["polled_cpu"], figures["polled_full_gcs"] = polled
        stop.set()
        await loop.run_in_executor(None, poller.join)
        figures["polls"] = len(seen)
        figures["poll_errors"] = sum(status != 200 for status in seen)
        gate.set()
        await asyncio.gather(*tasks)
    return figures


_FIRST = """
import asyncio, os, sys, threading
import asyncflow
async def main():
    with asyncflow.profile("first", port=0, format="none") as prof:
        print(prof.url, flush=True)
        if sys.argv[1] == "busy":  # a program at work on its loop until its stdin closes
            told = threading.Event()
            threading.Thread(target=lambda: (sys.stdin.read(), told.set()), daemon=True).start()
            while not told.is_set():
                sum(range(20000))
                await asyncio.sleep(0)
        else:
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        link = prof._server.link  # the endpoint process's CPU, all but idle since it answered
        if link is None or link.process.pid is None:
            print(-1, flush=True)  # none serves now (it exited)
            return
        with open(f"/proc/{link.process.pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        print((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), flush=True)
asyncio.run(main())
"""


#: asked after the first answer, one after the other (each built on the profiler's thread)
_THEN = ("/futures", "/loop", "/snapshot", "/tasks", "/profiler_status")


def _first_answer(mode: str) -> tuple[float, float, float]:
    """The wall seconds from the URL to the first answer, the slowest of the answers to
    ``_THEN`` asked after it (the program still idle or busy), and the endpoint process's
    CPU."""
    program = subprocess.Popen(
        [sys.executable, "-c", _FIRST, mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "ASYNCFLOW_ENDPOINT_PROCESS": "1"},
    )
    assert program.stdout is not None and program.stdin is not None
    url = program.stdout.readline().strip()
    started = time.perf_counter()
    try:
        status, seconds = _get(url, "/profiler_status")
        seconds = time.perf_counter() - started
        if status != 200:
            raise ConnectionError(f"/profiler_status answered {status}")
        then = 0.0
        for path in _THEN:
            status, wall = _get(url, path)
            if status != 200:
                raise ConnectionError(f"{path} answered {status}")
            then = max(then, wall)
    finally:
        program.stdin.close()
        said = program.stdout.readline()
        program.wait(30)
    return seconds, then, float(said)


# -- the runs and their figures ----------------------------------------------------------------


def _child(kind: str, n: int) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--child", kind, str(n)],
        capture_output=True,
        text=True,
        timeout=1800,
        env={**os.environ, "ASYNCFLOW_ENDPOINT_PROCESS": "1"},
    )
    if done.returncode:
        raise SystemExit(f"{kind} {n}: {done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _spread(values: list[float], scale: float, unit: str) -> str:
    shown = ", ".join(f"{v * scale:.0f}" for v in values)
    return f"{_median(values) * scale:,.0f} {unit} ({shown})"


def scale(counts: list[int], pairs: int) -> None:
    for n in counts:
        plain: list[dict[str, Any]] = []
        tracked: list[dict[str, Any]] = []
        for i in range(pairs):
            for kind in ("plain", "tracked") if i % 2 == 0 else ("tracked", "plain"):
                (plain if kind == "plain" else tracked).append(_child(kind, n))
        print(f"\n{n:,} live tasks, {pairs} pairs (medians; each pair's figure in brackets)")
        for name, key in (("heap", "heap"), ("RSS", "rss")):
            p_task = [float(f[key]) for f in plain]
            t_task = [float(f[key]) for f in tracked]
            more = [t - p for p, t in zip(p_task, t_task, strict=True)]
            print(f"  a live task's {name:<8} plain {_spread(p_task, 1, 'B')}, tracked "
                  f"{_spread(t_task, 1, 'B')}: {_median(more):+,.0f} B")  # fmt: skip
        collector = [float(f["collector_ms_s"]) for f in tracked]
        print(f"  collector CPU, idle    {_median(collector):.1f} ms a second "
              f"({', '.join(f'{c:.1f}' for c in collector)})")  # fmt: skip
        for path in ROUTES:
            seconds = [float(f["routes"][path]) for f in tracked]
            print(f"  {path:<22} {_spread(seconds, 1000, 'ms')}")
        plain_stall = [float(f["stall"]) for f in plain]
        quiet = [float(f["quiet_stall"]) for f in tracked]
        polled = [float(f["polled_stall"]) for f in tracked]
        polls = sum(int(f["polls"]) for f in tracked)
        errors = sum(int(f["poll_errors"]) for f in tracked)
        print(f"  longest stall, plain   {_spread(plain_stall, 1000, 'ms')}")
        print(f"    tracked, nobody asks {_spread(quiet, 1000, 'ms')}")
        print(f"    /tasks polled 2/s    {_spread(polled, 1000, 'ms')}, "
              f"{_median(polled) / _median(plain_stall):.1f}x plain's "
              f"({polls} polls, {errors} not 200)")  # fmt: skip
        own = [float(f["polled_cpu"]) for f in tracked]
        full = sum(int(f["polled_full_gcs"]) for f in tracked)
        print(f"      the process's CPU in that stall {_spread(own, 1000, 'ms')}, "
              f"{full} full collections while polled")  # fmt: skip
        sys.stdout.flush()


def first(pairs: int) -> None:
    print(f"\nfirst answer after start(), {pairs} pairs (each: bare import, idle, busy)")
    ratios: dict[str, list[float]] = {"idle": [], "busy": []}
    answers: dict[str, list[float]] = {"idle": [], "busy": []}
    thens: dict[str, list[float]] = {"idle": [], "busy": []}
    bares: list[float] = []
    cpus: dict[str, list[float]] = {"import": [], "idle": [], "busy": []}
    failed = {"idle": 0, "busy": 0}
    for _ in range(pairs):
        started, cpu = time.perf_counter(), os.times()
        subprocess.run([sys.executable, "-c", "import aiohttp.web"], check=True)
        bare = time.perf_counter() - started
        after = os.times()
        bare_cpu = after.children_user + after.children_system - cpu.children_user
        bare_cpu -= cpu.children_system
        bares.append(bare)
        cpus["import"].append(bare_cpu)
        shown = [f"import aiohttp.web {bare * 1000:.0f} ms"]
        for mode in ("idle", "busy"):
            try:
                seconds, then, endpoint_cpu = _first_answer(mode)
            except (OSError, ValueError) as exc:  # counted, not figured: the run goes on
                failed[mode] += 1
                shown.append(f"{mode} no answer ({exc})")
                continue
            ratios[mode].append(seconds / bare)
            answers[mode].append(seconds)
            thens[mode].append(then)
            if endpoint_cpu >= 0:
                cpus[mode].append(endpoint_cpu)
            shown.append(f"{mode} {seconds * 1000:.0f} ms ({seconds / bare:.2f}x; then "
                         f"{then * 1000:.0f})")  # fmt: skip
        print("  " + ", ".join(shown), flush=True)
    for mode, values in ratios.items():
        if not values:
            print(f"  {mode}: no answer in {pairs} tries")
            continue
        print(f"  {mode}: median {_median(values):.2f}x the import, worst {max(values):.2f}x, "
              f"best against best {min(answers[mode]) / min(bares):.2f}x, "
              f"{failed[mode]} without an answer; the slowest of {len(_THEN)} answers after "
              f"it: median {_median(thens[mode]) * 1000:.0f} ms, worst "
              f"{max(thens[mode]) * 1000:.0f} ms")  # fmt: skip
    print(f"  CPU: the import {_median(cpus['import']) * 1000:.0f} ms, the endpoint process "
          f"{_median(cpus['idle'] + cpus['busy']) * 1000:.0f} ms to its first answer "
          f"(medians; {_median(cpus['idle'] + cpus['busy']) / _median(cpus['import']):.2f}x), "
          "which the machine's other work does not inflate")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", default="1000,10000,100000", help="live task counts")
    parser.add_argument("--pairs", type=int, default=3, help="pairs of runs (default 3)")
    parser.add_argument("--only", choices=("scale", "first"), help="one part only")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        kind, n = args.child[0], int(args.child[1])
        result = asyncio.run(_plain(n) if kind == "plain" else _tracked(n))
        print(json.dumps(result))
        return 0
    import asyncflow

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        cwd=os.path.dirname(os.path.abspath(__file__)),
    ).stdout.strip()
    print(f"Python {sys.version.split()[0]}, asyncflow {asyncflow.__version__} at {commit or '?'}, "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")  # fmt: skip
    if args.only != "first":
        scale([int(n) for n in args.tasks.split(",")], args.pairs)
    if args.only != "scale":
        first(args.pairs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
