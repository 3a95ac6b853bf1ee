"""Stuck, not slow, under ``asyncflow run`` as a user runs it: a deadlock is named at exit
with nobody polling, and live at ``/graph`` and ``/warnings``; a healthy program is not."""

from __future__ import annotations

import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson

from tests.support.commands import ASYNCFLOW, EXAMPLES, asyncflow_cmd, write

HEALTHY = """
import asyncio

done = []

async def worker(lock: asyncio.Lock, jobs: asyncio.Queue[int]) -> None:
    while True:
        job = await jobs.get()
        async with lock:
            await asyncio.sleep(0.001)
            done.append(job)
        jobs.task_done()

async def main() -> None:
    lock = asyncio.Lock()
    jobs: asyncio.Queue[int] = asyncio.Queue(4)
    workers = [asyncio.create_task(worker(lock, jobs)) for _ in range(4)]
    for i in range(200):
        await jobs.put(i)
    await jobs.join()
    for w in workers:
        w.cancel()
    await asyncio.gather(*workers, return_exceptions=True)

asyncio.run(main())
"""


def _report(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = orjson.loads(path.read_bytes())
    return document


def _deadlocks(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [w for w in document["warnings"] if w["kind"] == "deadlock"]


def test_a_lock_order_deadlock_is_an_error_in_the_exit_report(tmp_path: Path) -> None:
    """Nobody polls: main gives up after 1.5 s and asyncio cancels the stuck transfers
    before the report is written; the collector's watch saw the cycle while it held."""
    report = tmp_path / "report.json"
    done = asyncflow_cmd(
        "run", "--port", "off", "--format", "json", "--output", str(report),
        str(EXAMPLES / "deadlock.py"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "gave up: 2 transfers still pending" in done.stdout
    (warning,) = _deadlocks(_report(report))
    assert warning["severity"] == "error"
    message = warning["message"]
    assert message.startswith("Deadlock: 2 tasks wait on one another's locks in a cycle")
    # every task, both locks by distinct names, where each waits and where each took its lock
    assert message.count("(transfer) waits at deadlock.py:30 on lock `deadlock.py:24 #") == 2
    assert "deadlock.py:24 #1" in message and "deadlock.py:24 #2" in message
    assert message.count("taken at deadlock.py:28") == 2
    assert warning["evidence"]["tasks"] == 2 and warning["evidence"]["resources"] == 2
    # each lock was held from before main's 1.5 s wait to the end: its row says so
    locks = [r for r in _report(report)["resources"]["resources"] if r["label"] == "deadlock.py:24"]
    assert len(locks) == 2
    assert all(r["holds"] == 1 and r["max_hold_ns"] >= 1_000_000_000 for r in locks), locks


@contextmanager
def _deadlocked(*options: str) -> Iterator[tuple[subprocess.Popen[str], dict[str, Any]]]:
    """``asyncflow run examples/deadlock.py --wait 0`` (stuck for good), once ``/graph``
    shows the cycle: it must within 2 s of the transfers' start. Yields the process and the
    graph; SIGTERM (how a stuck service is stopped) is up to the caller."""
    process = subprocess.Popen(
        [*ASYNCFLOW, "run", "--port", "0", *options, str(EXAMPLES / "deadlock.py"), "--wait", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None and process.stdout is not None
        url = process.stderr.readline().rsplit("endpoint: ", 1)[1].strip()
        assert process.stdout.readline() == "transfers started\n"
        started = time.monotonic()
        graph: dict[str, Any] = {"cycles": []}
        while not graph["cycles"] and time.monotonic() - started < 2.0:
            with urllib.request.urlopen(url + "/graph", timeout=10) as response:
                graph = orjson.loads(response.read())
        assert graph["cycles"], "no cycle at /graph within 2 s of the deadlock"
        graph["url"], graph["started"] = url, started
        yield process, graph
    finally:
        if process.returncode is None:
            process.kill()
            process.communicate(timeout=30)


def test_a_deadlock_is_live_at_graph_and_warnings_then_in_the_report_at_sigterm(
    tmp_path: Path,
) -> None:
    report = tmp_path / "report.json"
    with _deadlocked("--format", "json", "--output", str(report)) as (process, graph):
        (cycle,) = graph["cycles"]
        assert len(cycle["tasks"]) == 2 and len(cycle["nodes"]) == 4
        stuck = [n for n in graph["nodes"] if n["stuck"]]
        assert sorted(n["coroutine"] for n in stuck) == ["transfer", "transfer"]
        # /warnings reads no task: the collector's watch (each second) found it, in time
        found: list[dict[str, Any]] = []
        while not found and time.monotonic() - graph["started"] < 2.0:
            with urllib.request.urlopen(graph["url"] + "/warnings", timeout=10) as response:
                found = _deadlocks(orjson.loads(response.read()))
        (live,) = found
        assert live["active"] and live["severity"] == "error"
        # the task tree: main made both transfers and awaits them
        with urllib.request.urlopen(graph["url"] + "/tasks", timeout=10) as response:
            tasks = {t["coroutine"]: t for t in orjson.loads(response.read())["tasks"]}
        main = tasks["main"]["name"]
        assert tasks["transfer"]["parent"] == main and tasks["transfer"]["awaiters"] == [main]
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=30)
    document = _report(report)
    (warning,) = _deadlocks(document)
    assert warning["active"]  # still stuck when the report was taken
    assert len(document["graph"]["cycles"]) == 1


def test_the_table_report_lists_the_stuck_tasks_at_sigterm() -> None:
    with _deadlocked() as (process, _):
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
    assert "stuck tasks (2, in 1 deadlock)" in err, err
    lines = err.splitlines()
    at = lines.index("stuck tasks (2, in 1 deadlock)")
    rows = lines[at + 1 : at + 3]
    assert all("(transfer) waits at " in row and "on lock deadlock.py:24 #" in row for row in rows)
    assert all("held by Task-" in row and "(took it at " in row for row in rows), rows


def test_a_healthy_program_with_locks_and_queues_gets_no_deadlock(tmp_path: Path) -> None:
    script = write(tmp_path / "healthy.py", HEALTHY)
    report = tmp_path / "report.json"
    done = asyncflow_cmd(
        "run", "--port", "off", "--format", "json", "--output", str(report), str(script)
    )
    assert done.returncode == 0, done.stderr
    document = _report(report)
    assert _deadlocks(document) == []
    assert document["graph"]["cycles"] == []
    assert [w["kind"] for w in document["warnings"] if w["severity"] == "error"] == []
