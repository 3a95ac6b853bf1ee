"""anyio and trio under ``asyncflow run``: memory object streams are instrumented like queues
on either backend, and a program on trio is told, once, that trio's tasks are not profiled
(issue 26)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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

_TRIO_LINE = (
    "not profiled: {name}{times}: trio's tasks are tracked, not its loop: asyncflow watches "
    "asyncio's and uvloop's event loops, so there is no loop health and no blocked-loop "
    "detection on trio (anyio's asyncio backend has them)"
)


def _run(
    tmp_path: Path, script: str, *args: str, env: dict[str, str] | None = None
) -> tuple[str, dict[str, object]]:
    """The program's standard output, and its JSON report."""
    path = write(tmp_path / "prog.py", script)
    report = tmp_path / "report.json"
    done = asyncflow_cmd(
        "run", "--format", "json", "--output", str(report), str(path), *args, cwd=tmp_path,
        env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    data: dict[str, object] = json.loads(report.read_text())
    return done.stdout, data


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_memory_streams_are_channels_under_run_on_either_backend(
    tmp_path: Path, backend: str
) -> None:
    out, report = _run(tmp_path, _ETL, backend)
    assert out == "190\n"  # the program's own output, as without asyncflow
    channels = report["channels"]["channels"]  # type: ignore[index]
    (stream,) = [c for c in channels if c["kind"] == "anyio.MemoryObjectStream"]
    assert stream["label"] == "prog.py:15"
    assert (stream["sent_count"], stream["received_count"]) == (20, 20)
    assert stream["channel_type"] == "bounded[4]"
    not_profiled = report["status"]["not_profiled"]  # type: ignore[index]
    assert [entry["name"] for entry in not_profiled] == (["trio.run"] if backend == "trio" else [])


def test_no_memory_streams_leaves_them_alone(tmp_path: Path) -> None:
    write(tmp_path / "prog.py", _ETL)
    report = tmp_path / "report.json"
    done = asyncflow_cmd(
        "run", "--no-memory-streams", "--format", "json", "--output", str(report), "prog.py",
        "asyncio", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(report.read_text())["channels"]["channels"] == []


def test_a_trio_program_is_told_once_that_trio_is_not_profiled(tmp_path: Path) -> None:
    path = write(tmp_path / "prog.py", _TRIO)
    done = asyncflow_cmd("run", str(path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "done\ndone\n"
    line = _TRIO_LINE.format(name="trio.run", times=" (2 times)")
    assert done.stderr.count("not profiled:") == 1, done.stderr
    assert line in done.stderr
    assert "no task under" not in done.stderr
    _, report = _run(tmp_path, _TRIO)
    (entry,) = report["status"]["not_profiled"]  # type: ignore[index]
    assert entry == {
        "kind": "trio",
        "name": "trio.run",
        "reason": line.split("trio.run (2 times): ", 1)[1],
        "count": 2,
    }


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_anyio_example_runs_under_run(backend: str) -> None:
    done = asyncflow_cmd("run", str(EXAMPLES / "anyio_etl.py"), backend)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "loaded 200 rows\n"
    assert "anyio_etl.py:40  bounded[10]   200       200" in done.stderr, done.stderr
    assert ("not profiled: trio.run:" in done.stderr) == (backend == "trio")


def test_trio_tasks_are_tracked_as_asyncio_tasks_are(tmp_path: Path) -> None:
    """Through trio's Instrument API: each task spawned on trio (trio.run, anyio's trio
    backend) is a call of its coroutine function's future, tracked by ``task`` (the program's
    own coroutine functions, tracked as such, are left out here)."""
    alone = {"ASYNCFLOW_NO_OWN_CODE": "1"}
    out, report = _run(tmp_path, _TRIO, env=alone)
    assert out == "done\ndone\n"
    futures = report["futures"]["futures"]  # type: ignore[index]
    tasks = {f["label"]: f for f in futures if f["tracked_by"] == "task"}
    assert tasks["child"]["call_count"] == 6, tasks
    assert tasks["child"]["outcomes"]["returned"] == 6
    assert tasks["child"]["total_polls"] >= 12  # a start, a sleep(0), an end: two steps each
    assert tasks["main"]["call_count"] == 2
    assert not any(label.startswith("trio.") for label in tasks), tasks  # not trio's own
    _, etl = _run(tmp_path, _ETL, "trio", env=alone)
    labels = {f["label"] for f in etl["futures"]["futures"] if f["tracked_by"] == "task"}  # type: ignore[index]
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
