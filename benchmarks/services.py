"""The cost on a real service: CPU per request of uvicorn/FastAPI and aiohttp, plain and profiled.

Each service is started as a user starts it, twice side by side: plainly, and under
``python -m asyncflow run`` (everything it turns on by default, the endpoint on a free port):

    fastapi-uvloop    uvicorn fastapi_app:app --uds SOCK --loop uvloop --no-access-log
    fastapi-asyncio   the same with --loop asyncio
    aiohttp           python aiohttp_app.py --path SOCK (web.run_app, no access log)

The apps are in ``benchmarks/services_apps/``: the FastAPI one takes a permit of a semaphore,
calls an upstream through httpx and queries SQLite through aiosqlite; the aiohttp one calls the
upstream through its ClientSession. The upstream is a process of its own, never profiled.

This process is the load generator: ``--clients`` httpx clients over the service's unix socket,
each with one keep-alive connection kept for the server's life, send a fixed rotation of GETs
until ``--requests`` are answered (any answer but 200 stops the benchmark;
``--new-connections``: each slice's clients open new connections, as before 2026-11-29, which
made accepting connections a quarter of the aiohttp server's work a request). Each of
``--pairs`` pairs starts a plain and a profiled server and warms both up; then the same load
goes to each in slices of 100 requests, in turn (ABBA), so that what the machine's other work
does over the pair hits both alike. New servers for each pair, because a process's own luck
(its hash seed, where its memory lies) moves its CPU per request by a few percent for its whole
life: two plain servers kept for five pairs read 0.967x, 0.980x and 1.034x in three runs; new
ones, 1.002x, 0.993x and 1.004x (``--same-processes`` keeps them). Each pair's servers are
warmed up for 3 seconds at least, past what a profiler does once in its first second. A
server's CPU time over its slices (user + system, every thread, read from the process's
CPU-time clock) divided by the requests is its CPU per request.

Printed per service: the median over pairs of profiled / plain CPU per request, its spread (the
lowest and the highest pair), the median of the slices' ratios, the CPU per request of each, and
each server's resident memory at the end and at its peak. asyncflow's endpoint process starts
when a client first connects to the endpoint; none does here. Access logs are off in both: they
are work the service does alike either way, and leaving them out makes the ratio the worse one.
``--aa`` runs the second server plainly too, so that the ratios show the machine's noise alone;
``--run-options`` passes options to ``asyncflow run`` (``--no-locks``...) to see what a part
costs; ``--base-options`` runs the first server under ``asyncflow run`` too, with its own
options (then "plain" in the output is that server), so that one part's cost is paired
directly: ``--base-options=--no-locks`` against the default run is what the primitives cost.
``--base-checkout DIR`` has the first server import the ``asyncflow`` of another checkout (a
``git worktree`` of an earlier commit, its extension built with ``setup.py build_ext
--inplace``): with ``--base-options=`` both run under ``asyncflow run``, and the ratio is the
change's. ``--base-env NAME=VALUE`` sets a variable in the first server's environment
(``--run-env`` in the second's): with ``--base-options=``, the ratio is what the variable
changes, e.g. the GIL hand-over (``ASYNCFLOW_GIL_HAND_OVER=0``) or the pure-Python path
(``ASYNCFLOW_NO_EXTENSIONS=1``) against the compiled one.

    python benchmarks/services.py                         # every service, 7 pairs
    python benchmarks/services.py --only aiohttp --pairs 9 --requests 4000
    python benchmarks/services.py --reports /tmp/reports  # keep asyncflow's exit reports
    python benchmarks/services.py --only aiohttp --base-options= --base-checkout /tmp/before
    python benchmarks/services.py --primitives            # what a per-request primitive costs

``--primitives`` times instead, in this process, what such a service pays per primitive it makes
per request (uvicorn's Event, httpcore's anyio Event) or takes per request (httpcore's pool
Lock): each made, used once and dropped (or one used again), and a Condition's notify_all()
herd (issue 28: each item wakes every waiter; timed per wake-up), plainly and under
``instrument_locks()`` with a profiler running, in alternating pairs (CPU time of the process:
the profiler's thread, which reaps and folds the gone ones, included).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
from primitives import herd

APPS = Path(__file__).resolve().parent / "services_apps"
#: requests of a slice: a pair's load goes to the two servers in turn, a slice at a time
SLICE = 100
#: also split each server's CPU by thread (``--threads``)
THREADS = False
#: keep the two servers for every pair (``--same-processes``), not two new ones for each
SAME_PROCESSES = False
#: seconds of load that warm up each pair's servers, at the least
WARM_SECONDS = 3.0
#: how long a server may take to answer its first request (asyncflow's start included)
START_TIMEOUT = 60.0
#: each slice's clients open new connections (``--new-connections``), as before 2026-11-29,
#: instead of keeping one each for the server's life
NEW_CONNECTIONS = False


@dataclass(frozen=True)
class Service:
    """How to start one service, and the GETs its load rotates through."""

    name: str
    #: the command after the interpreter, ``{sock}`` standing for the service's socket
    command: tuple[str, ...]
    #: the load's rotation of paths, ``{n}`` standing for the request's number
    paths: tuple[str, ...]
    #: requests per run by default
    requests: int


def _uvicorn(loop: str) -> tuple[str, ...]:
    return (
        "-m",
        "uvicorn",
        "fastapi_app:app",
        "--app-dir",
        str(APPS),
        "--uds",
        "{sock}",
        "--loop",
        loop,
        "--no-access-log",
    )


_FASTAPI_PATHS = ("/items/{n}", "/items/{n}", "/users/{n}", "/health")
SERVICES = {
    s.name: s
    for s in (
        Service("fastapi-uvloop", _uvicorn("uvloop"), _FASTAPI_PATHS, 2000),
        Service("fastapi-asyncio", _uvicorn("asyncio"), _FASTAPI_PATHS, 2000),
        Service(
            "aiohttp",
            (str(APPS / "aiohttp_app.py"), "--path", "{sock}"),
            ("/items/{n}", "/items/{n}", "/items/{n}", "/health"),
            3000,
        ),
    )
}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (all its threads, live and gone), in seconds,
    read from its CPU-time clock (nanoseconds; ``/proc/PID/stat`` counts in 10 ms ticks)."""
    return time.clock_gettime(((~pid) << 3) | 2)  # CPUCLOCK_SCHED of the whole process


def main_thread_seconds(pid: int) -> float:
    """CPU seconds of ``pid``'s main thread (``/proc/PID/task/PID/schedstat``, in nanoseconds;
    Linux). The other threads' are the process's less these: a thread that ended meanwhile is
    counted there too."""
    with open(f"/proc/{pid}/task/{pid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


def memory_mib(pid: int) -> tuple[float, float]:
    """Resident memory of ``pid`` now and at its peak (``VmRSS``, ``VmHWM``), in MiB."""
    figures = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                figures[key] = int(value.split()[0]) / 1024
    return figures["VmRSS"], figures["VmHWM"]


def client(sock: str) -> httpx.AsyncClient:
    """An httpx client of the service at ``sock``: one keep-alive connection, used in turn."""
    transport = httpx.AsyncHTTPTransport(uds=sock)
    return httpx.AsyncClient(transport=transport, base_url="http://service")


async def drive(
    sock: str,
    paths: tuple[str, ...],
    requests: int,
    clients: int,
    kept: list[httpx.AsyncClient] | None = None,
) -> None:
    """Send ``requests`` GETs over ``clients`` keep-alive connections to the service at
    ``sock``, rotating through ``paths``; raises if one is not answered 200. The clients are
    ``kept``'s (their connections stay open for the next call) if given, else new ones."""
    numbers = iter(range(requests))

    async def send(http: httpx.AsyncClient) -> None:
        for n in numbers:
            path = paths[n % len(paths)].format(n=n)
            response = await http.get(path)
            if response.status_code != 200:
                raise RuntimeError(f"GET {path}: {response.status_code} {response.text!r}")

    async def new() -> None:
        async with client(sock) as http:
            await send(http)

    if kept is not None:
        await asyncio.gather(*(send(http) for http in kept[:clients]))
    else:
        await asyncio.gather(*(new() for _ in range(clients)))


@dataclass
class Server:
    """One running service, plain or under ``asyncflow run``."""

    service: Service
    profiled: bool
    workdir: Path
    reports: Path | None
    #: options of ``asyncflow run`` (before the program); None: run plainly
    options: tuple[str, ...] | None = None
    #: a checkout whose ``asyncflow`` this server imports (put first on its PYTHONPATH)
    checkout: Path | None = None
    #: variables set in this server's environment, over this process's (``--base-env``)
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] = field(init=False)
    sock: str = field(init=False)
    #: CPU seconds over the measured loads by thread, "main" and "other" (``--threads``)
    by_thread: dict[str, float] = field(default_factory=dict)
    #: the load's clients, each with its connection open from one load to the next (unless
    #: ``NEW_CONNECTIONS``): a client keeps its connection, as a real one's pool does
    clients: list[httpx.AsyncClient] = field(default_factory=list)

    def start(self, upstream: str) -> None:
        kind = "profiled" if self.profiled else "plain"
        self.sock = str(self.workdir / f"{self.service.name}-{kind}.sock")
        Path(self.sock).unlink(missing_ok=True)  # (the socket of this pair's server before)
        command = [a.format(sock=self.sock) for a in self.service.command]
        if self.options is not None:
            report = (
                self.reports / f"{self.service.name}-{kind}.txt"
                if self.reports
                else self.workdir / f"report-{kind}.txt"
            )
            run = ["-m", "asyncflow", "run", "--port", "0", "--output", str(report), *self.options]
            command = [*run, *command]
        env = dict(
            os.environ,
            SERVICES_UPSTREAM=upstream,
            SERVICES_DB=str(self.workdir / f"{self.service.name}-{kind}.db"),
        )
        env.update(self.env)
        if self.checkout is not None:
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(self.checkout), env.get("PYTHONPATH")) if p
            )
        self.log = open(self.workdir / f"{self.service.name}-{kind}.log", "wb")  # noqa: SIM115
        # In its work directory: ``python -m`` puts the working directory first on the path,
        # and started from a checkout's root it would import that checkout's asyncflow ahead
        # of the PYTHONPATH that names another.
        self.process = subprocess.Popen(
            [sys.executable, *command],
            env=env,
            cwd=self.workdir,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def runs_checkout(self) -> None:
        """Stop with a clear error unless this server runs its checkout's compiled asyncflow
        (Linux: its extension among the process's mappings; elsewhere nothing is checked)."""
        if self.checkout is None or not os.path.exists(f"/proc/{self.process.pid}/maps"):
            return
        with open(f"/proc/{self.process.pid}/maps") as f:
            found = {
                line.split(maxsplit=5)[-1].strip()
                for line in f
                if "/asyncflow/instrumentation/_speedups" in line
            }
        root = str(self.checkout.resolve()) + os.sep
        if not any(path.startswith(root) for path in found):
            runs = ", ".join(sorted(found)) or "no compiled extension"
            raise RuntimeError(
                f"--base-checkout {self.checkout}: its server runs {runs}, not that checkout's "
                "extension; build it there (python setup.py build_ext --inplace)"
            )

    async def ready(self) -> None:
        """Wait until the service answers ``/health`` (bounded)."""
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self.process.poll() is not None:
                self.log.flush()
                said = Path(self.log.name).read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{self.service.name} exited, saying:\n{said}")
            try:
                await drive(self.sock, ("/health",), 1, 1)
                return
            except (httpx.TransportError, FileNotFoundError):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.service.name} did not answer in time") from None
                await asyncio.sleep(0.1)

    async def load(self, requests: int, clients: int) -> float:
        """Run the load; returns this server's CPU seconds over it (and, with ``--threads``,
        adds each thread's to ``by_thread``)."""
        kept = None
        if not NEW_CONNECTIONS:
            while len(self.clients) < clients:
                self.clients.append(client(self.sock))
            kept = self.clients
        main = main_thread_seconds(self.process.pid) if THREADS else 0.0
        before = cpu_seconds(self.process.pid)
        await drive(self.sock, self.service.paths, requests, clients, kept)
        spent = cpu_seconds(self.process.pid) - before
        if THREADS:
            main = main_thread_seconds(self.process.pid) - main
            self.by_thread["main"] = self.by_thread.get("main", 0.0) + main
            self.by_thread["other"] = self.by_thread.get("other", 0.0) + spent - main
        return spent

    async def close_clients(self) -> None:
        for http in self.clients:
            await http.aclose()
        self.clients.clear()

    def stop(self) -> None:
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


@dataclass
class Figures:
    ratios: list[float] = field(default_factory=list)
    slice_ratios: list[float] = field(default_factory=list)
    plain_us: list[float] = field(default_factory=list)
    profiled_us: list[float] = field(default_factory=list)
    memory: dict[str, tuple[float, float]] = field(default_factory=dict)
    #: µs a request over every pair, by server and by thread ("main", "other"): ``--threads``
    threads: dict[str, dict[str, float]] = field(default_factory=dict)


async def measure(
    service: Service,
    upstream: str,
    workdir: Path,
    pairs: int,
    requests: int,
    clients: int,
    reports: Path | None,
    options: tuple[str, ...] | None = (),
    base: tuple[str, ...] | None = None,
    base_checkout: Path | None = None,
    base_env: dict[str, str] | None = None,
    run_env: dict[str, str] | None = None,
) -> Figures:
    """``pairs`` paired loads on a plain and a profiled server of ``service`` (the first under
    ``asyncflow run`` too, with ``base``, unless None, and with the ``asyncflow`` of
    ``base_checkout``, if given; ``base_env`` and ``run_env`` set in each one's environment).

    Each pair runs on two servers started for it (unless ``SAME_PROCESSES``): a process's own
    luck (its hash seed, where its memory lies) moves its CPU per request by a few percent for
    its whole life, so two servers kept for every pair read the same bias in every pair. Two
    plain servers kept for 5 pairs read 0.967x, 0.980x and 1.034x in three runs."""
    figures = Figures()
    threads: dict[bool, dict[str, float]] = {False: {}, True: {}}
    servers: tuple[Server, Server] | None = None
    try:
        for k in range(pairs):
            if servers is None or not SAME_PROCESSES:
                if servers is not None:
                    await _stop(servers)
                servers = (
                    Server(service, False, workdir, reports, base, base_checkout, base_env or {}),
                    Server(service, True, workdir, reports, options, env=run_env or {}),
                )
                await _started(servers, upstream, max(200, requests // 5), clients)
            plain, profiled = servers
            # A pair's load goes in slices, to each server in turn (ABBA...), so that what the
            # machine's other work does over the pair hits both servers alike.
            spent = {False: 0.0, True: 0.0}
            slices = max(1, requests // SLICE)
            for i in range(slices):
                size = requests // slices + (i < requests % slices)
                order = (plain, profiled) if (k + i) % 2 == 0 else (profiled, plain)
                both = {s.profiled: await s.load(size, clients) for s in order}
                for profiled_, cpu in both.items():
                    spent[profiled_] += cpu
                figures.slice_ratios.append(both[True] / both[False])
            figures.plain_us.append(spent[False] / requests * 1e6)
            figures.profiled_us.append(spent[True] / requests * 1e6)
            figures.ratios.append(spent[True] / spent[False])
            print(
                f"  pair {k + 1}: plain {figures.plain_us[-1]:.0f} µs, asyncflow "
                f"{figures.profiled_us[-1]:.0f} µs a request: {figures.ratios[-1]:.3f}x",
                flush=True,
            )
            for server in servers:
                for which, seconds in server.by_thread.items():
                    mine = threads[server.profiled]
                    mine[which] = mine.get(which, 0.0) + seconds
                server.by_thread.clear()
        assert servers is not None
        for server in servers:
            figures.memory["asyncflow" if server.profiled else "plain"] = memory_mib(
                server.process.pid
            )
        if THREADS:
            for profiled_, parts in threads.items():
                figures.threads["asyncflow" if profiled_ else "plain"] = {
                    which: seconds / (requests * pairs) * 1e6 for which, seconds in parts.items()
                }
    finally:
        if servers is not None:
            await _stop(servers)
    return figures


async def _started(servers: tuple[Server, Server], upstream: str, warm: int, clients: int) -> None:
    """Start both servers, and warm each up (imports, caches, pools): ``warm`` requests at a
    time for ``WARM_SECONDS`` at least, past what a profiler does once in its first second
    (the first findings' evaluation, the first reading of the tasks), which would otherwise
    land in every pair's first slices."""
    for server in servers:
        server.start(upstream)
    for server in servers:
        await server.ready()
        server.runs_checkout()
    began = time.monotonic()
    while True:
        for server in servers:
            await server.load(warm, clients)
        if time.monotonic() - began >= WARM_SECONDS:
            break
    for server in servers:
        server.by_thread.clear()


async def _stop(servers: tuple[Server, Server]) -> None:
    for server in servers:
        await server.close_clients()
        if hasattr(server, "process"):
            server.stop()


def report(service: Service, figures: Figures, pairs: int, requests: int, clients: int) -> None:
    ratios = sorted(figures.ratios)
    plain_rss, plain_peak = figures.memory["plain"]
    rss, peak = figures.memory["asyncflow"]
    print(
        f"{service.name}: {requests:,} requests a run, {clients} clients, {pairs} pairs\n"
        f"  CPU per request: plain {statistics.median(figures.plain_us):.0f} µs, "
        f"asyncflow {statistics.median(figures.profiled_us):.0f} µs\n"
        f"  ratio: median {statistics.median(ratios):.3f}x, "
        f"spread {ratios[0]:.3f}x .. {ratios[-1]:.3f}x; "
        f"median of the {len(figures.slice_ratios)} slices' ratios "
        f"{statistics.median(figures.slice_ratios):.3f}x\n"
        f"  resident memory at the end (peak): plain {plain_rss:.1f} MiB ({plain_peak:.1f}), "
        f"asyncflow {rss:.1f} MiB ({peak:.1f})",
        flush=True,
    )
    for name, split in figures.threads.items():
        print(
            f"  {name}, µs a request over every pair: main thread {split.get('main', 0):.1f}, "
            f"other threads {split.get('other', 0):.1f}",
            flush=True,
        )


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="asyncflow-services-") as tmp:
        workdir = Path(tmp)
        upstream_sock = str(workdir / "upstream.sock")
        upstream = subprocess.Popen([sys.executable, str(APPS / "upstream.py"), upstream_sock])
        try:
            deadline = time.monotonic() + START_TIMEOUT
            while not os.path.exists(upstream_sock):
                if upstream.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the upstream did not start")
                await asyncio.sleep(0.05)
            for name in args.only or list(SERVICES):
                service = SERVICES[name]
                requests = args.requests or service.requests
                print(f"\n{name}", flush=True)
                figures = await measure(
                    service,
                    upstream_sock,
                    workdir,
                    args.pairs,
                    requests,
                    args.clients,
                    args.reports,
                    None if args.aa else tuple(args.run_options.split()),
                    None if args.base_options is None else tuple(args.base_options.split()),
                    args.base_checkout,
                    dict(args.base_env),
                    dict(args.run_env),
                )
                report(service, figures, args.pairs, requests, args.clients)
        finally:
            upstream.terminate()
            upstream.wait()


#: the per-request primitives ``--primitives`` times, each run ``PRIMITIVE_USES`` times
PRIMITIVE_USES = 20_000


async def _event_made() -> None:
    for _ in range(PRIMITIVE_USES):
        event = asyncio.Event()
        event.set()
        await event.wait()


async def _anyio_event_made() -> None:
    for _ in range(PRIMITIVE_USES):
        event = anyio.Event()
        event.set()
        await event.wait()


async def _lock_made() -> None:
    for _ in range(PRIMITIVE_USES):
        async with asyncio.Lock():
            pass


async def _anyio_lock_made() -> None:
    for _ in range(PRIMITIVE_USES):
        async with anyio.Lock():
            pass


async def _anyio_lock_reused() -> None:
    lock = anyio.Lock()
    for _ in range(PRIMITIVE_USES):
        async with lock:
            pass


async def _semaphore_made() -> None:
    for _ in range(PRIMITIVE_USES):
        async with asyncio.Semaphore(4):
            pass


async def _condition_made() -> None:
    for _ in range(PRIMITIVE_USES):
        condition = asyncio.Condition()
        async with condition:
            condition.notify_all()


#: waiters of the herd: each notify_all() wakes them all, one finds the item (issue 28)
HERD = 100


async def _condition_herd() -> None:
    """PRIMITIVE_USES wake-ups of a notify_all() herd of HERD (benchmarks/primitives.py's)."""
    await herd(HERD, PRIMITIVE_USES // HERD - 1)


PRIMITIVES = {
    "asyncio.Event made, set, awaited": _event_made,
    "anyio.Event made, set, awaited": _anyio_event_made,
    "asyncio.Lock made, taken once": _lock_made,
    "anyio.Lock made, taken once": _anyio_lock_made,
    "anyio.Lock taken again": _anyio_lock_reused,
    "asyncio.Semaphore made, taken once": _semaphore_made,
    "asyncio.Condition made, notified": _condition_made,
    f"Condition herd ({HERD}), a wake-up": _condition_herd,
}


def primitives(pairs: int) -> None:
    """Print, per case, plain and instrumented CPU time per use, medians over ``pairs``."""
    import asyncflow

    def per_use(case: Callable[[], Coroutine[Any, Any, None]], on: bool) -> float:
        start = time.process_time()
        if on:
            with asyncflow.instrument_locks():
                asyncio.run(case())
        else:
            asyncio.run(case())
        return (time.process_time() - start) / PRIMITIVE_USES * 1e9

    print(f"{'':36} {'plain':>9} {'asyncflow':>10} {'added':>9} {'ratio':>6}  ({pairs} pairs)")
    with asyncflow.profile("primitives", format="none", port=None):
        for name, case in PRIMITIVES.items():
            per_use(case, False)  # warm up both
            per_use(case, True)
            plain, on = [], []
            for _ in range(pairs):
                plain.append(per_use(case, False))
                on.append(per_use(case, True))
            a, b = statistics.median(plain), statistics.median(on)
            print(
                f"{name:36} {a:7,.0f} ns {b:8,.0f} ns {b - a:+7,.0f} ns {b / a:5.2f}x", flush=True
            )


def _variable(text: str) -> tuple[str, str]:
    """``NAME=VALUE`` (the value may be empty, or hold ``=``) as (name, value)."""
    name, equals, value = text.partition("=")
    if not equals or not name or "\0" in text:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=VALUE")
    return name, value


def main(argv: list[str] | None = None) -> int:
    global SAME_PROCESSES, SLICE, THREADS, NEW_CONNECTIONS  # (set once, from the command line)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=7, help="paired runs (default 7)")
    parser.add_argument(
        "--requests", type=int, help="requests a run (default 2000 for FastAPI, 3000 aiohttp)"
    )
    parser.add_argument("--clients", type=int, default=4, help="concurrent clients (default 4)")
    parser.add_argument("--only", choices=list(SERVICES), action="append", help="repeatable")
    parser.add_argument("--reports", type=Path, help="write asyncflow's exit reports there")
    parser.add_argument(
        "--run-options",
        default="",
        metavar="'OPTIONS'",
        help="more options of asyncflow run, e.g. '--no-locks' (to see what a part costs)",
    )
    parser.add_argument(
        "--base-options",
        metavar="'OPTIONS'",
        help="run the first server under asyncflow run too, with these options: the ratios "
        "then pair what --run-options adds, e.g. --base-options=--no-locks",
    )
    parser.add_argument(
        "--base-checkout",
        type=Path,
        metavar="DIR",
        help="the first server imports the asyncflow of this checkout (a git worktree of an "
        "earlier commit, its extension built in place): with --base-options, the ratios pair "
        "a change against the code before it",
    )
    parser.add_argument(
        "--base-env",
        type=_variable,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set a variable in the first server's environment (repeatable): with "
        "--base-options=, the ratios pair what the variable changes, e.g. "
        "--base-env ASYNCFLOW_GIL_HAND_OVER=0",
    )
    parser.add_argument(
        "--run-env",
        type=_variable,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set a variable in the second (profiled) server's environment (repeatable)",
    )
    parser.add_argument(
        "--primitives",
        action="store_true",
        help="instead: what a primitive made (or taken) per request costs, in this process",
    )
    parser.add_argument(
        "--slice",
        type=int,
        default=SLICE,
        metavar="N",
        help=f"requests given to each server in turn (default {SLICE}): a larger slice is a "
        "steadier load, and pays less for each server's waking up to it",
    )
    parser.add_argument(
        "--threads",
        action="store_true",
        help="also split each server's CPU by thread: the main thread (the loop's), the others "
        "(asyncflow's; Linux)",
    )
    parser.add_argument(
        "--same-processes",
        action="store_true",
        help="keep the two servers for every pair, rather than start two for each: quicker, "
        "but each process's own bias (a few percent) is then in every pair",
    )
    parser.add_argument(
        "--new-connections",
        action="store_true",
        help="have each slice's clients open new connections (as before 2026-11-29), rather "
        "than keep one each for the server's life: more work a request in both servers, and "
        "fewer requests a second, so the profiler's work a second weighs more on each",
    )
    parser.add_argument(
        "--aa",
        action="store_true",
        help="run the second server plainly too: the ratios then show the noise alone",
    )
    args = parser.parse_args(argv)
    if args.base_checkout is not None and not (args.base_checkout / "asyncflow").is_dir():
        # else the first server would import the installed asyncflow, and the pairing would
        # compare the code with itself under a label that says otherwise
        parser.error(f"--base-checkout {args.base_checkout}: no asyncflow package there")
    if args.slice < 1:
        parser.error("--slice must be at least 1")
    if args.threads and not os.path.isdir("/proc/self/task"):
        parser.error("--threads reads /proc/PID/task: Linux only")
    SAME_PROCESSES, SLICE, THREADS = args.same_processes, args.slice, args.threads
    NEW_CONNECTIONS = args.new_connections
    if args.primitives:
        primitives(args.pairs)
        return 0
    if args.reports:
        args.reports.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(
        ["git", "-C", str(APPS), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    print(f"Python {sys.version.split()[0]}, asyncflow at {commit or '?'}")
    asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
