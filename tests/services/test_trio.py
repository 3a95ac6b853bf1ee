"""anyio and trio under ``asyncflow run``: memory object streams are instrumented like queues
on either backend, trio's tasks are tracked, and each trio run is watched as an event loop is:
lag, blocked-loop episodes and blocking lines (issue 26)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.commands import EXAMPLES, asyncflow_cmd, write

_ETL = """\
import sys
import anyio

async def produce(send):
    async with send:
        for i in range(20):
            await send.send(i)

async def consume(receive, out):
    async with receive:
        async for item in receive:
            out.append(item)

async def main():
    send, receive = anyio.create_memory_object_stream[int](4)  # the stream
    out = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(produce, send)
        tg.start_soon(consume, receive, out)
    print(sum(out))

anyio.run(main, backend=sys.argv[1])
"""

_TRIO = """\
import trio

async def child():
    await trio.sleep(0)

async def main():
    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(child)
    print("done")

trio.run(main)
trio.run(main)
"""


def _run(
    tmp_path: Path, script: str, *args: str, env: dict[str, str] | None = None
) -> tuple[str, dict[str, Any]]:
    """The program's standard output, and its JSON report."""
    path = write(tmp_path / "prog.py", script)
    report = tmp_path / "report.json"
    done = asyncflow_cmd(
        "run", "--format", "json", "--output", str(report), str(path), *args, cwd=tmp_path,
        env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    data: dict[str, Any] = json.loads(report.read_text())
    return done.stdout, data


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_memory_streams_are_channels_under_run_on_either_backend(
    tmp_path: Path, backend: str
) -> None:
    out, report = _run(tmp_path, _ETL, backend)
    assert out == "190\n"  # the program's own output, as without asyncflow
    channels = report["channels"]["channels"]
    (stream,) = [c for c in channels if c["kind"] == "anyio.MemoryObjectStream"]
    assert stream["label"] == "prog.py:15"
    assert (stream["sent_count"], stream["received_count"]) == (20, 20)
    assert stream["channel_type"] == "bounded[4]"
    not_profiled = report["status"]["not_profiled"]
    assert not_profiled == []  # trio's loop is watched too


def test_no_memory_streams_leaves_them_alone(tmp_path: Path) -> None:
    write(tmp_path / "prog.py", _ETL)
    report = tmp_path / "report.json"
    done = asyncflow_cmd(
        "run", "--no-memory-streams", "--format", "json", "--output", str(report), "prog.py",
        "asyncio", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(report.read_text())["channels"]["channels"] == []


def test_each_trio_run_is_a_loop_of_its_own(tmp_path: Path) -> None:
    """Two ``trio.run`` calls are two loops, each watched while it runs and closed after;
    nothing is named as not profiled."""
    path = write(tmp_path / "prog.py", _TRIO)
    done = asyncflow_cmd("run", str(path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "done\ndone\n"
    assert "not profiled" not in done.stderr, done.stderr
    assert "loop 1 (closed)" in done.stderr and "loop 2 (closed)" in done.stderr, done.stderr
    _, report = _run(tmp_path, _TRIO)
    loops = report["loop"]["loops"]
    assert [(entry["label"], entry["state"]) for entry in loops] == [("trio.run", "closed")] * 2
    assert all(entry["heartbeats"] > 0 for entry in loops), loops
    assert report["status"]["not_profiled"] == []


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_anyio_example_runs_under_run(backend: str) -> None:
    done = asyncflow_cmd("run", str(EXAMPLES / "anyio_etl.py"), backend)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "loaded 200 rows\n"
    assert "anyio_etl.py:40  bounded[10]   200       200" in done.stderr, done.stderr
    assert "not profiled" not in done.stderr, done.stderr


def test_trio_tasks_are_tracked_as_asyncio_tasks_are(tmp_path: Path) -> None:
    """Through trio's Instrument API: each task spawned on trio (trio.run, anyio's trio
    backend) is a call of its coroutine function's future, tracked by ``task`` (the program's
    own coroutine functions, tracked as such, are left out here)."""
    alone = {"ASYNCFLOW_NO_OWN_CODE": "1"}
    out, report = _run(tmp_path, _TRIO, env=alone)
    assert out == "done\ndone\n"
    futures = report["futures"]["futures"]
    tasks = {f["label"]: f for f in futures if f["tracked_by"] == "task"}
    assert tasks["child"]["call_count"] == 6, tasks
    assert tasks["child"]["outcomes"]["returned"] == 6
    assert tasks["child"]["total_polls"] >= 12  # a start, a sleep(0), an end: two steps each
    assert tasks["main"]["call_count"] == 2
    assert not any(label.startswith("trio.") for label in tasks), tasks  # not trio's own
    _, etl = _run(tmp_path, _ETL, "trio", env=alone)
    labels = {f["label"] for f in etl["futures"]["futures"] if f["tracked_by"] == "task"}
    assert {"produce", "consume"} <= labels, labels


_TRIO_BEHAVIOUR = """\
import traceback

import trio


async def fails():
    await trio.sleep(0)
    raise ValueError("boom")


async def sleeps_forever(task_status=trio.TASK_STATUS_IGNORED):
    task_status.started("started")
    await trio.sleep_forever()


async def frames():
    return [f.f_code.co_name for f, _ in trio.lowlevel.current_task().iter_await_frames()]


async def main():
    print(await frames())
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fails)
    except* ValueError as group:
        print("caught", [str(e) for e in group.exceptions])
    with trio.move_on_after(0.01) as scope:
        async with trio.open_nursery() as nursery:
            print(await nursery.start(sleeps_forever))
    print("cancelled", scope.cancelled_caught)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fails)
    except* ValueError as group:
        tb = traceback.extract_tb(group.exceptions[0].__traceback__)
        print("raised in", [frame.name for frame in tb][-1])


trio.run(main)
"""


def test_trio_programs_behave_as_without_asyncflow(tmp_path: Path) -> None:
    """Values, exceptions, cancellation, task_status, await frames and tracebacks of trio
    tasks are those of the program run plainly."""
    path = write(tmp_path / "prog.py", _TRIO_BEHAVIOUR)
    plain = subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert plain.returncode == 0, plain.stderr
    profiled, _ = _run(tmp_path, _TRIO_BEHAVIOUR, env={"ASYNCFLOW_NO_OWN_CODE": "1"})
    assert profiled == plain.stdout
    assert "caught ['boom']" in plain.stdout and "raised in fails" in plain.stdout


_TRIO_BLOCKS = """\
import time

import trio


async def child(i):
    await trio.sleep(0.01)
    return i


async def blocker():
    await trio.sleep(0.05)
    time.sleep(0.3)  # planted


async def main():
    async with trio.open_nursery() as nursery:
        for i in range(5):
            nursery.start_soon(child, i)
        nursery.start_soon(blocker)
    print("done")


trio.run(main)
"""

_ANYIO_TRIO_BLOCKS = """\
import time

import anyio


async def blocker():
    await anyio.sleep(0.05)
    time.sleep(0.3)  # planted


async def main():
    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(anyio.sleep, 0.01)
        tg.start_soon(blocker)
    print("done")


anyio.run(main, backend="trio")
"""

_TRIO_HEALTHY = """\
import trio


async def child(i):
    for _ in range(20):
        await trio.sleep(0.005)
    return i


async def main():
    async with trio.open_nursery() as nursery:
        for i in range(10):
            nursery.start_soon(child, i)
    print("done")


trio.run(main)
"""


def _planted(source: str) -> int:
    """The line of the planted ``time.sleep`` in a program's source."""
    (line,) = [n for n, text in enumerate(source.splitlines(), 1) if "# planted" in text]
    return line


def _trio_loop(report: dict[str, Any]) -> dict[str, Any]:
    """The one loop a trio program ran: watched, with heartbeats, named as trio's."""
    (entry,) = report["loop"]["loops"]
    assert isinstance(entry, dict) and entry["label"] == "trio.run", entry
    assert entry["heartbeats"] > 0, entry
    assert entry["state"] == "closed", entry  # the run is over
    return entry


@pytest.mark.parametrize("script", [_TRIO_BLOCKS, _ANYIO_TRIO_BLOCKS], ids=["trio", "anyio"])
def test_a_blocked_trio_loop_is_found_and_its_line_named(tmp_path: Path, script: str) -> None:
    """trio's loop is watched as an asyncio loop is: heartbeats through its token, lag, and a
    planted ``time.sleep`` in a trio task is a loop-blocked finding naming its line, with the
    stack of trio's thread."""
    out, report = _run(tmp_path, script)
    assert out == "done\n"
    line = _planted(script)
    entry = _trio_loop(report)
    assert entry["blocked_count"] >= 1, entry
    (episode,) = [e for e in entry["episodes"] if e["blocked_ns"] >= 200_000_000]
    frames = [(Path(f["file"]).name, f["line"]) for f in episode["stack"]]
    assert ("prog.py", line) in frames, frames
    assert episode["call"]["label"] == "blocker", episode
    # the trio task that ran it is named, as an asyncio task is (trio names it after its
    # function: __main__.blocker)
    assert episode["task"] is not None and episode["task"].endswith("blocker"), episode
    lines = [(Path(b["file"]).name, b["line"]) for b in entry["blocking_lines"]]
    assert lines[0] == ("prog.py", line), entry["blocking_lines"]
    # (a finding the collector saw while the block lasted, "blocked now", is kept as earlier)
    blocked = [w for w in report["warnings"] if w["kind"] == "loop-blocked"]
    assert blocked and all(f"prog.py:{line}" in w["message"] for w in blocked), blocked
    where = blocked[0]["subject"]["location"]
    assert (Path(where["file"]).name, where["line"]) == ("prog.py", line), blocked
    # the advice is trio's, not asyncio's
    assert all("trio.to_thread.run_sync" in w["hint"] for w in blocked), blocked
    assert not any("asyncio" in w["hint"] for w in blocked), blocked
    assert report["status"]["not_profiled"] == []


def test_a_healthy_trio_program_gets_no_loop_finding(tmp_path: Path) -> None:
    out, report = _run(tmp_path, _TRIO_HEALTHY)
    assert out == "done\n"
    entry = _trio_loop(report)
    assert entry["blocked_count"] == 0 and entry["blocking_lines"] == [], entry
    kinds = [w["kind"] for w in report["warnings"] if w["severity"] != "info"]
    assert kinds == [], report["warnings"]
    assert report["status"]["not_profiled"] == []


_TRIO_CALLBACKS = """\
import trio

from asyncflow.instrumentation.loops import loop_registry


async def main():
    (record,) = [r for r in loop_registry() if r.label == "trio.run"]
    run = record.loop()
    run.call_soon_threadsafe(lambda: 1 / 0)  # an error of asyncflow's, on trio's loop
    arrived = trio.Event()
    run.call_soon_threadsafe(arrived.set)
    with trio.fail_after(10):
        await arrived.wait()
    print("running", run.is_running(), "tasks", run.tasks_alive() > 0)
    return run


run = trio.run(main)
print("closed", run.is_closed())
try:
    run.call_soon_threadsafe(print, "late")
except RuntimeError as exc:
    print("refused:", exc)
"""


def test_callbacks_on_trios_loop_never_reach_the_program(tmp_path: Path) -> None:
    """A callback of asyncflow's that raises on trio's loop is counted as asyncflow's internal
    error (trio would crash the run on it), and a run that is over refuses callbacks as a
    closed asyncio loop does."""
    out, report = _run(tmp_path, _TRIO_CALLBACKS)
    assert out == "running True tasks True\nclosed True\nrefused: the trio run is over\n"
    assert report["status"]["internal_errors"] == 1, report["status"]


def test_a_finished_trio_run_refuses_callbacks_with_runtime_error() -> None:
    """trio's ``RunFinishedError`` (a RuntimeError, which the loop monitor catches as it does a
    closed loop's) when the run ended before asyncflow heard of it."""
    import trio

    from asyncflow.instrumentation.every_loop import TrioRun

    run = TrioRun("trio.run")

    async def main() -> None:
        run.started(trio)
        assert run.is_running()

    trio.run(main)
    with pytest.raises(trio.RunFinishedError):
        run.call_soon_threadsafe(print, "late")
    assert not run.is_running()


_GUEST = """\
import asyncio
import time

import trio


async def blocker():
    await trio.sleep(0.05)
    time.sleep(0.3)  # planted


async def trio_main():
    async with trio.open_nursery() as nursery:
        nursery.start_soon(blocker)


async def main():
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    trio.lowlevel.start_guest_run(
        trio_main,
        run_sync_soon_threadsafe=loop.call_soon_threadsafe,
        done_callback=done.set_result,
    )
    outcome = await done
    print(type(outcome).__name__)


asyncio.run(main())
"""


def test_a_guest_run_on_asyncio_is_watched_through_its_host(tmp_path: Path) -> None:
    """trio as a guest runs its tasks on the host's thread, between the host loop's callbacks:
    the asyncio loop's watch sees its blocks, and nothing is named as not profiled."""
    out, report = _run(tmp_path, _GUEST)
    assert out == "Value\n"
    (entry,) = report["loop"]["loops"]
    assert not entry["label"].startswith("trio"), entry
    lines = [(Path(b["file"]).name, b["line"]) for b in entry["blocking_lines"]]
    assert ("prog.py", _planted(_GUEST)) in lines, entry
    assert report["status"]["not_profiled"] == []


_FOREIGN_HOST = """\
import queue

import trio


async def trio_main():
    await trio.sleep(0)
    return "ok"


jobs = queue.Queue()
outcome = []
trio.lowlevel.start_guest_run(
    trio_main, run_sync_soon_threadsafe=jobs.put, done_callback=outcome.append
)
while not outcome:
    jobs.get(timeout=10)()
print(outcome[0].unwrap())
"""


def test_a_guest_run_on_a_host_not_watched_is_named(tmp_path: Path) -> None:
    out, report = _run(tmp_path, _FOREIGN_HOST)
    assert out == "ok\n"
    (entry,) = report["status"]["not_profiled"]
    assert (entry["kind"], entry["name"], entry["count"]) == ("trio", "trio.start_guest_run", 1)
    assert "a guest of a loop asyncflow does not watch" in entry["reason"], entry


def test_the_trio_example_names_its_blocking_line(tmp_path: Path) -> None:
    done = asyncflow_cmd("run", str(EXAMPLES / "trio_service.py"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "served 21 requests\n"
    assert "`handle` blocked the event loop once at trio_service.py:15" in done.stderr
    assert "loop 1 lost" in done.stderr and "trio_service.py:15 (legacy_lookup)" in done.stderr


def test_a_trio_run_begun_before_the_profiler_is_watched_from_its_start() -> None:
    """``asyncflow.profile()`` entered inside ``trio.run`` (the run began before any profiler,
    so no ``before_run`` of asyncflow's ran): the run is watched from the profiler's start, its
    block found and its task named, and it is closed once the run is over."""
    import trio

    import asyncflow

    async def blocker() -> None:
        time.sleep(0.15)  # planted

    async def main() -> asyncflow.Snapshot:
        with asyncflow.profile("late", format="none", block_threshold=0.05) as prof:
            await trio.sleep(0.01)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(blocker)
            await trio.sleep(0.01)
            return prof.snapshot()

    snapshot = trio.run(main)
    assert snapshot.loop is not None
    # the run's loop (a closed loop an earlier test left for the cyclic GC is listed too)
    (entry,) = [e for e in snapshot.loop.loops if e.label == "trio.run"]
    assert entry.state == "running", entry
    assert entry.heartbeats > 0 and entry.blocked_count >= 1, entry
    episode = max(entry.episodes, key=lambda e: e.blocked_ns)  # the planted 150 ms
    assert episode.blocked_ns >= 100_000_000, episode  # (seen from a heartbeat: a bit less)
    assert episode.task is not None and episode.task.endswith("blocker"), episode
    assert snapshot.status.not_profiled == []


def test_a_trio_run_on_another_thread_begun_before_the_profiler_is_named() -> None:
    """A profiler started on one thread cannot reach a trio run already under way on another
    (trio adds an instrument only from the run's own thread): the run is named, once, in
    ``not_profiled``, rather than silently not watched."""
    import threading

    import trio

    import asyncflow

    running, done = threading.Event(), threading.Event()

    async def main() -> None:
        running.set()
        while not done.is_set():
            await trio.sleep(0.005)

    thread = threading.Thread(target=trio.run, args=(main,))
    thread.start()
    try:
        assert running.wait(10)
        with asyncflow.profile("elsewhere", format="none") as prof:
            status = prof.snapshot().status
    finally:
        done.set()
        thread.join(10)
    (entry,) = status.not_profiled
    assert (entry.kind, entry.name, entry.count) == ("trio", "trio.run", 1), entry
    assert "another thread" in entry.reason, entry


_THREADS = """\
import anyio
import trio

CRM = anyio.CapacityLimiter(2)


def lookup(i):
    return i * 2


def checksum(values):
    return sum(values)


async def enrich(i, out):
    out.append(await anyio.to_thread.run_sync(lookup, i, limiter=CRM))


async def main():
    out = []
    async with anyio.create_task_group() as tg:
        for i in range(6):
            tg.start_soon(enrich, i, out)
    print(await trio.to_thread.run_sync(checksum, out))


anyio.run(main, backend="trio")
"""


def test_thread_jobs_and_their_limiter_are_seen_on_trio(tmp_path: Path) -> None:
    """anyio's ``to_thread.run_sync`` on the trio backend and trio's own
    ``trio.to_thread.run_sync`` are executors, as anyio's jobs are on asyncio: each job is
    counted once, by the function the program gave, behind its limiter; and the limiter the
    jobs queue behind counts its acquisitions."""
    out, report = _run(tmp_path, _THREADS)
    assert out == "30\n"
    executors = {e["label"]: e for e in report["executors"]["executors"]}
    assert set(executors) == {"anyio worker threads (a limiter of 2)", "trio worker threads"}
    limited = executors["anyio worker threads (a limiter of 2)"]
    assert (limited["submitted"], limited["completed"], limited["max_workers"]) == (6, 6, 2)
    assert [f["name"] for f in limited["functions"]] == ["__main__.lookup"]
    default = executors["trio worker threads"]
    assert (default["submitted"], default["completed"]) == (1, 1)
    assert [f["name"] for f in default["functions"]] == ["__main__.checksum"]
    (crm,) = [r for r in report["resources"]["resources"] if r["label"] == "prog.py:4"]
    assert (crm["primitive"], crm["acquisitions"], crm["releases"]) == ("capacity_limiter", 6, 6)
    # the six tasks ask in one batch of trio's: four find both tokens taken
    assert crm["contended_acquisitions"] == crm["waits"] == 4, crm

    done = asyncflow_cmd("run", "--no-executors", "--format", "json", "--output",
                         str(tmp_path / "off.json"), "prog.py", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "off.json").read_text())["executors"]["executors"] == []


_LOCKS = """\
import sys

import anyio

GUARD = anyio.Lock()
CAP = anyio.CapacityLimiter(1)


async def worker(slots):
    for _ in range(5):
        async with GUARD:
            await anyio.sleep(0)
        async with slots:
            await anyio.sleep(0)
        async with CAP:  # (anyio's on trio passes this straight to trio's own limiter)
            await anyio.sleep(0)


async def main():
    slots = anyio.Semaphore(2)
    async with anyio.create_task_group() as tg:
        for _ in range(4):
            tg.start_soon(worker, slots)
    print("done")


anyio.run(main, backend=sys.argv[1])
"""


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_anyio_locks_count_their_waits_on_either_backend(tmp_path: Path, backend: str) -> None:
    """anyio's Lock, Semaphore and CapacityLimiter (``async with`` each), made before the run
    (an adapter) or in it, count each acquisition and each wait on trio as on asyncio: a
    holder that awaits keeps the others waiting."""
    out, report = _run(tmp_path, _LOCKS, backend)
    assert out == "done\n"
    resources = {r["label"]: r for r in report["resources"]["resources"]}
    guard, cap, slots = resources["prog.py:5"], resources["prog.py:6"], resources["prog.py:20"]
    assert (guard["primitive"], guard["acquisitions"], guard["releases"]) == ("lock", 20, 20)
    assert (slots["primitive"], slots["acquisitions"], slots["releases"]) == ("semaphore", 20, 20)
    assert (cap["primitive"], cap["acquisitions"], cap["releases"]) == ("capacity_limiter", 20, 20)
    assert guard["contended_acquisitions"] == guard["waits"] > 0, guard
    assert guard["waiters_now"] == 0 and not guard["locked"]


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_consumers_queueing_for_a_saturated_pool_are_told_so(tmp_path: Path, backend: str) -> None:
    """examples/anyio_threads.py: eight consumers share a limiter of two threads. The pool is
    the one finding about it (not its limiter's contention too), and the full channel before
    the consumers points at the pool: more consumers would only queue there."""
    done = asyncflow_cmd(
        "run", "--format", "json", "--output", str(tmp_path / "r.json"),
        str(EXAMPLES / "anyio_threads.py"), backend,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == "enriched 100 orders\n"
    report = json.loads((tmp_path / "r.json").read_text())
    warnings = report["warnings"]
    by_kind = {w["kind"]: w for w in warnings if w["severity"] != "info"}
    assert set(by_kind) == {"bottleneck", "executor-saturated"}, warnings
    pool = "anyio worker threads (a limiter of 2)"
    assert by_kind["executor-saturated"]["subject"]["label"] == pool
    assert f"its consumers queue for `{pool}`, which is saturated" in by_kind["bottleneck"]["hint"]
    # (the jobs are submitted one call in: by customer_segment, which enrich awaits)
    futures = {f["label"]: f for f in report["futures"]["futures"]}
    assert futures["customer_segment"]["first_caller_id"] == futures["enrich"]["id"]


_NESTED = """\
import time

import anyio
import anyio.from_thread
import trio


def inner():
    return "inner"


async def from_a_thread():
    return await trio.to_thread.run_sync(inner)


def outer():
    return anyio.from_thread.run(from_a_thread)


async def main():
    print(await anyio.to_thread.run_sync(outer))


anyio.run(main, backend="trio")
"""


def test_a_trio_job_submitted_from_an_anyio_jobs_thread_is_counted(tmp_path: Path) -> None:
    """anyio's job ``outer`` runs ``from_a_thread`` back on trio, which runs ``inner`` in a
    thread of trio's own: two jobs, each counted once, in the one pool they share (anyio's
    default limiter on trio is trio's)."""
    out, report = _run(tmp_path, _NESTED)
    assert out == "inner\n"
    (pool,) = report["executors"]["executors"]
    assert pool["label"] == "anyio worker threads"
    jobs = {f["name"]: f["jobs"] for f in pool["functions"]}
    assert jobs == {"__main__.outer": 1, "__main__.inner": 1}


_TWO_LIMITERS = """\
import time

import anyio
import anyio.to_thread

upstream = anyio.CapacityLimiter(1)  # the program's own cap on calls upstream
workers = anyio.CapacityLimiter(1)  # the threads its blocking jobs run in


async def handler():
    await anyio.to_thread.run_sync(time.sleep, 0.005, limiter=workers)
    async with upstream:  # contended on its own account
        await anyio.sleep(0.01)


async def main():
    async with anyio.create_task_group() as tg:
        for _ in range(20):
            tg.start_soon(handler)


anyio.run(main)
"""


def test_a_limiter_beside_a_saturated_pool_keeps_its_own_finding(tmp_path: Path) -> None:
    """The callers of a saturated pool's jobs also queue for another limiter of theirs: that
    one is not the pool's queue, and its contention is its own finding."""
    _, report = _run(tmp_path, _TWO_LIMITERS)
    kinds = {(w["kind"], w["subject"]["label"]) for w in report["warnings"]}
    assert ("lock-contention", "prog.py:6") in kinds, kinds
    assert ("executor-saturated", "anyio worker threads (a limiter of 1)") in kinds, kinds
    assert not any(label == "prog.py:7" for kind, label in kinds if kind == "lock-contention")


_REFUSED = """\\
import trio


async def not_sync():
    pass


async def main():
    try:
        await trio.to_thread.run_sync(not_sync)
    except TypeError as exc:
        print(exc)


trio.run(main)
"""


def test_trio_refuses_an_async_function_in_a_thread_as_without_asyncflow(tmp_path: Path) -> None:
    """trio names the function it refuses: the program's, not a job of asyncflow's; and refuses
    it though the program's own coroutine functions are tracked (their calls are wrappers, but
    ``inspect.iscoroutine``, which trio asks of what the function returned, says yes)."""
    path = write(tmp_path / "prog.py", _REFUSED)
    plain = subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert (
        "Trio expected a sync function, but 'not_sync' appears to be asynchronous" in plain.stdout
    )
    profiled, report = _run(tmp_path, _REFUSED)
    assert profiled == plain.stdout
    assert report["executors"]["executors"] == []  # (it never ran: no job)


_BLOCKS_PER_RECORD = """\
import time

import trio


async def load(record):
    time.sleep(0.004)  # a blocking write per record, under the block threshold
    await trio.sleep(0)


async def main():
    for i in range(300):
        await load(i)
    print("loaded")


trio.run(main)
"""


def test_a_future_holding_a_trio_loop_is_told_trios_way_to_a_thread(tmp_path: Path) -> None:
    """Short blocks in every call of ``load``: the function that blocks is named (not ``main``,
    whose polls only contain its calls', one long poll and one short each), with its whole
    share of the busy time, and the advice is trio's, not asyncio's."""
    out, report = _run(tmp_path, _BLOCKS_PER_RECORD)
    assert out == "loaded\n"
    (held,) = [w for w in report["warnings"] if w["kind"] == "cpu-bound"]
    assert held["subject"]["label"] == "load"
    assert held["evidence"]["busy_percent"] >= 90, held
    assert "trio.to_thread.run_sync" in held["hint"] and "asyncio" not in held["hint"], held
