"""Under ``asyncflow run``, the processes the program starts are profiled too, each on its own.

A multiprocessing child (spawn, fork or forkserver) and a bare ``os.fork()`` child each get a
profile named after the parent and their role, a report where the parent's options say (a
sibling file of the parent's), and the parent's report says where they went. What the program
sees does not change: exit codes, tracebacks, pickled targets. ``--no-children`` turns it off.
"""

from __future__ import annotations

import multiprocessing
import sys
from pathlib import Path

import orjson
import pytest

from tests.support.commands import asyncflow_cmd, write

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX start methods")

#: a program whose child runs an event loop with two tasks of its own; the child's exit code
#: is the program's
CHILDREN = """\
import asyncio
import multiprocessing
import os
import sys


async def crunch(n):
    await asyncio.sleep(0)
    return n


async def child_main(code):
    await asyncio.gather(crunch(1), crunch(2))
    return code


def work(code):
    sys.exit(asyncio.run(child_main(code)))


async def parent_main():
    await asyncio.sleep(0)


if __name__ == "__main__":
    how = sys.argv[1]
    asyncio.run(parent_main())
    if how == "os.fork":
        pid = os.fork()
        if pid == 0:
            try:
                work(3)
            except SystemExit as exc:
                code = exc.code
            # a forked child leaves as it would: through the interpreter's exit
            sys.exit(code)
        _, status = os.waitpid(pid, 0)
        sys.exit(os.waitstatus_to_exitcode(status))
    process = multiprocessing.get_context(how).Process(target=work, args=(3,))
    process.start()
    process.join()
    sys.exit(process.exitcode)
"""


def _labels(report: Path) -> set[str]:
    """The futures a JSON report shows calls of."""
    document = orjson.loads(report.read_bytes())
    return {e["label"] for e in document["futures"]["futures"] if e["call_count"]}


@pytest.mark.parametrize("how", ["spawn", "fork", "forkserver", "os.fork"])
def test_each_child_gets_its_own_report_beside_the_parents(tmp_path: Path, how: str) -> None:
    if how not in (*multiprocessing.get_all_start_methods(), "os.fork"):
        pytest.skip(f"no {how} here")
    script = write(tmp_path / "app.py", CHILDREN)
    report = tmp_path / "report.json"
    done = asyncflow_cmd(
        "run", "--format", "json", "--output", str(report), str(script), how, cwd=tmp_path
    )
    assert done.returncode == 3, done.stderr  # the child's exit code, passed on by the parent
    role = "fork-1" if how == "os.fork" else "process-1"
    child = tmp_path / f"report.{role}.json"
    assert child.is_file(), (sorted(p.name for p in tmp_path.iterdir()), done.stderr)
    assert {"child_main", "crunch"} <= _labels(child), _labels(child)
    assert orjson.loads(child.read_bytes())["status"]["name"] == f"app/{role}"
    assert "parent_main" in _labels(report)
    assert "child_main" not in _labels(report)  # the parent's profile is the parent's alone
    # the parent says where its children's reports went
    assert f"app/{role}" in done.stderr and str(child) in done.stderr, done.stderr
