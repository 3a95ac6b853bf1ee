"""anyio and trio under ``asyncflow run``: memory object streams are instrumented like queues
on either backend, and a program on trio is told, once, that trio's tasks are not profiled
(issue 26)."""

from __future__ import annotations

import json
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
    "not profiled: {name}{times}: asyncflow watches asyncio's and uvloop's event loops, not "
    "trio's: trio's tasks, its loop's health and blocked-loop detection are not profiled "
    "(anyio's asyncio backend is)"
)


def _run(tmp_path: Path, script: str, *args: str) -> tuple[str, dict[str, object]]:
    """The program's standard output, and its JSON report."""
    path = write(tmp_path / "prog.py", script)
    report = tmp_path / "report.json"
    done = asyncflow_cmd(
        "run", "--format", "json", "--output", str(report), str(path), *args, cwd=tmp_path
    )
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
