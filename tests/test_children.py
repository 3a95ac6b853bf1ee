"""Under ``asyncflow run``, the processes the program starts are profiled too, each on its own.

A multiprocessing child (spawn, fork or forkserver) and a bare ``os.fork()`` child each get a
profile named after the parent and their role, a report where the parent's options say (a
sibling file of the parent's), and the parent's report says where they went. What the program
sees does not change: exit codes, tracebacks, pickled targets. ``--no-children`` turns it off.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from asyncflow import _children, cli
from asyncflow.serve import registry
from tests.support.commands import EXAMPLES, asyncflow_cmd, write

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


#: a child that fails, and what the parent sees of it and of its process object
FAILING = """\
import multiprocessing
import pickle
import sys


class Work:
    def __init__(self, word):
        self.word = word

    def __call__(self):
        raise ValueError(f"{self.word} in the child")


if __name__ == "__main__":
    process = multiprocessing.get_context(sys.argv[1]).Process(target=Work("boom"))
    process.start()
    process.join()
    print("exitcode", process.exitcode, "run" in vars(process), type(process).run.__qualname__)
"""


@pytest.mark.parametrize("how", ["spawn", "fork"])
def test_a_failing_child_fails_as_it_would_unprofiled(tmp_path: Path, how: str) -> None:
    if how not in multiprocessing.get_all_start_methods():
        pytest.skip(f"no {how} here")
    script = write(tmp_path / "fail.py", FAILING)
    plain = subprocess.run(
        [sys.executable, str(script), how], capture_output=True, text=True, timeout=60
    )
    profiled = asyncflow_cmd("run", "--port", "off", "--format", "none", str(script), how)
    assert plain.returncode == profiled.returncode == 0
    # the same exit code, the process object as it was (its own run(), no attribute left)
    assert profiled.stdout == plain.stdout == "exitcode 1 False BaseProcess.run\n"
    # the same traceback, with one frame of asyncflow's where it ran the work
    plain_lines = plain.stderr.splitlines()
    said, _, _ = profiled.stderr.partition("asyncflow: the processes the program started")
    lines = [line for line in said.splitlines() if not line.startswith("asyncflow:")]
    ours = [i for i, line in enumerate(lines) if "asyncflow" in line]
    assert len(ours) == 1 and "_children.py" in lines[ours[0]], profiled.stderr
    carets = set(lines[ours[0] + 2].strip()) <= set("^~")  # under the line, on 3.11+
    del lines[ours[0] : ours[0] + (3 if carets else 2)]
    assert lines == plain_lines, profiled.stderr


def test_no_children_leaves_them_unprofiled(tmp_path: Path) -> None:
    script = write(tmp_path / "app.py", CHILDREN)
    report = tmp_path / "report.json"
    for given in (["--no-children"], []):
        env = {} if given else {"ASYNCFLOW_NO_CHILDREN": "1"}
        done = asyncflow_cmd(
            "run",
            *given,
            "--format",
            "json",
            "--output",
            str(report),
            str(script),
            "spawn",
            env=env,
        )
        assert done.returncode == 3, done.stderr
        assert sorted(p.name for p in tmp_path.iterdir()) == ["app.py", "report.json"]
        assert "profiled on their own" not in done.stderr
        assert "app/process-1" not in done.stderr


def test_a_table_report_on_stderr_is_headed_by_the_childs_name(tmp_path: Path) -> None:
    script = write(tmp_path / "app.py", CHILDREN)
    done = asyncflow_cmd("run", "--port", "off", str(script), "spawn", cwd=tmp_path)
    assert done.returncode == 3, done.stderr
    assert done.stdout == ""  # standard output stays the program's
    heading = re.search(
        r"^asyncflow: report of 'app/process-1' \(pid (\d+)\):\n", done.stderr, re.M
    )
    assert heading is not None, done.stderr
    after = done.stderr[heading.end() :]
    assert after.startswith("asyncflow · app/process-1 · ")
    assert re.search(r"^child_main +1 ", after, re.M)
    # the parent's report, then where the child's went
    parents = done.stderr.index("asyncflow · app · ")
    listed = done.stderr.index("asyncflow: the processes the program started were profiled")
    assert heading.start() < parents < listed
    assert f"  app/process-1  pid {heading[1]}  standard error\n" in done.stderr[listed:]


#: a child that waits until its parent terminates it (SIGTERM)
TERMINATED = """\
import asyncio
import multiprocessing
import sys


async def wait_for_the_end(ready):
    ready.set()
    await asyncio.sleep(3600)


def work(ready):
    asyncio.run(wait_for_the_end(ready))


if __name__ == "__main__":
    context = multiprocessing.get_context(sys.argv[1])
    ready = context.Event()
    process = context.Process(target=work, args=(ready,))
    process.start()
    assert ready.wait(60)
    process.terminate()
    process.join(60)
    print("exitcode", process.exitcode)
"""


@pytest.mark.parametrize("how", ["spawn", "fork"])
def test_a_terminated_child_reports_then_dies_by_sigterm(tmp_path: Path, how: str) -> None:
    if how not in multiprocessing.get_all_start_methods():
        pytest.skip(f"no {how} here")
    script = write(tmp_path / "app.py", TERMINATED)
    report = tmp_path / "report.json"
    done = asyncflow_cmd(
        "run", "--port", "off", "--format", "json", "--output", str(report), str(script), how
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"exitcode -{signal.SIGTERM.value}\n"  # as it would be unprofiled
    assert "wait_for_the_end" in _labels(tmp_path / "report.process-1.json")


def test_the_workers_example_gets_a_report_per_worker(tmp_path: Path) -> None:
    report = tmp_path / "report.txt"
    done = asyncflow_cmd("run", "--output", str(report), str(EXAMPLES / "workers.py"))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "2 workers done\n"
    for role in ("process-1", "process-2"):
        text = (tmp_path / f"report.{role}.txt").read_text()
        assert text.startswith(f"asyncflow · workers/{role} · ")
        assert re.search(r"^handle +20 +20/0/0 ", text, re.M), text
        # awaited, not a task's: tracked because the script's functions are, in the child too
        assert re.search(r"^fetch +20 +20/0/0 ", text, re.M), text
        assert f"  workers/{role}  pid " in done.stderr
    # the parent's table report ends with the same list
    assert report.read_text().endswith(
        done.stderr[done.stderr.index("asyncflow: the processes the program started") :]
    )


#: a pool whose workers are told there is no more work, then terminated (``with Pool(...)``)
POOL = """\
import asyncio
import multiprocessing
import sys


async def square(n):
    await asyncio.sleep(0)
    return n * n


def job(n):
    return asyncio.run(square(n))


def ready(started):
    started.release()


if __name__ == "__main__":
    context = multiprocessing.get_context(sys.argv[1])
    started = context.Semaphore(0)
    with context.Pool(2, initializer=ready, initargs=(started,)) as pool:
        for _ in range(2):  # both workers run (unprofiled, one could be terminated first)
            assert started.acquire(timeout=60)
        print(sum(pool.map(job, range(10))), flush=True)
"""


@pytest.mark.parametrize("how", ["spawn", "fork"])
def test_a_pools_workers_report_though_the_pool_terminates_them(tmp_path: Path, how: str) -> None:
    if how not in multiprocessing.get_all_start_methods():
        pytest.skip(f"no {how} here")
    script = write(tmp_path / "app.py", POOL)
    report = tmp_path / "report.json"
    done = asyncflow_cmd(
        "run", "--port", "off", "--format", "json", "--output", str(report), str(script), how
    )
    assert (done.returncode, done.stdout) == (0, "285\n"), done.stderr
    squares = 0
    for number in (1, 2):  # a worker still writing its report when terminated finishes it
        child = orjson.loads((tmp_path / f"report.pool-worker-{number}.json").read_bytes())
        assert child["status"]["name"] == f"app/pool-worker-{number}"
        squares += sum(
            e["call_count"] for e in child["futures"]["futures"] if e["label"] == "square"
        )
    assert squares == 10


#: forks that run no event loop: one execs another program, one just exits
FORKS_WITHOUT_A_LOOP = """\
import os
import sys

for how in ("exec", "exit"):
    pid = os.fork()
    if pid == 0:
        if how == "exec":
            os.execv(sys.executable, [sys.executable, "-c", "print('exec', flush=True)"])
        sys.exit(0)
    os.waitpid(pid, 0)
"""


def test_a_fork_that_runs_no_event_loop_is_left_alone(tmp_path: Path) -> None:
    script = write(tmp_path / "app.py", FORKS_WITHOUT_A_LOOP)
    report = tmp_path / "report.txt"
    stale = write(tmp_path / "report.fork-1.txt", "an earlier run's")
    os.utime(stale, (0, 0))
    done = asyncflow_cmd("run", "--output", str(report), str(script))
    assert (done.returncode, done.stdout) == (0, "exec\n"), done.stderr
    assert "app/fork" not in done.stderr  # not profiled, not listed (nor the earlier file)
    assert stale.read_text() == "an earlier run's"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "app.py",
        "report.fork-1.txt",
        "report.txt",
    ]


def _register_as(pid: int, name: str, started: float, child_of: tuple[int, str] | None) -> None:
    """A registry file for live process ``pid``, as its own profiler would write it."""
    document = {
        "version": 1,
        "pid": pid,
        "name": name,
        "argv": ["python", name],
        "url": f"http://127.0.0.1:{6000 + pid % 1000}",
        "started": started,
        "token": False,
        "process_start": registry.process_start(pid),
        "parent": None if child_of is None else child_of[0],
        "role": None if child_of is None else child_of[1],
    }
    registry.directory().mkdir(mode=0o700, parents=True, exist_ok=True)
    (registry.directory() / f"{pid}.json").write_bytes(orjson.dumps(document))


def test_ps_lists_each_worker_after_its_parent_with_the_parents_pid(
    capsys: pytest.CaptureFixture[str],
) -> None:
    sleeping = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(3)
    ]
    try:
        parent, worker, other = (p.pid for p in sleeping)
        _register_as(parent, "app", 100.0, None)
        _register_as(other, "other", 101.0, None)  # started before the worker
        _register_as(worker, "app/fork-1", 102.0, (parent, "fork-1"))
        assert cli.main(["ps"]) == 0
        header, *rows = capsys.readouterr().out.splitlines()
        assert header.split()[:3] == ["PID", "PARENT", "NAME"]
        assert [row.split()[:3] for row in rows] == [
            [str(parent), "-", "app"],
            [str(worker), str(parent), "app/fork-1"],
            [str(other), "-", "other"],
        ]
        assert cli.main(["ps", "--json"]) == 0
        listed = orjson.loads(capsys.readouterr().out)
        assert [(e["pid"], e["parent"], e["role"]) for e in listed] == [
            (parent, None, None),
            (worker, parent, "fork-1"),
            (other, None, None),
        ]
    finally:
        for process in sleeping:
            process.kill()
            process.wait()


def test_a_line_to_the_shared_stderr_is_one_write(monkeypatch: pytest.MonkeyPatch) -> None:
    # The processes of one program share stderr; print() writes a line's text and its end
    # apart, and under PYTHONUNBUFFERED a worker's "profiling" line landed between another's
    # text and its end (docs/services.md's workers block read two lines as one, in CI).
    writes: list[str] = []

    class Recorded:
        def write(self, text: str) -> int:
            writes.append(text)
            return len(text)

        def flush(self) -> None:
            writes.append("<flush>")

    monkeypatch.setattr(sys, "stderr", Recorded())
    _children.say("asyncflow: profiling 'workers/process-1'; endpoint: not served")
    assert writes == ["asyncflow: profiling 'workers/process-1'; endpoint: not served\n", "<flush>"]
    monkeypatch.setattr(sys, "stderr", None)  # no stderr (pythonw, a closed one): nobody to tell
    _children.say("asyncflow: profiling 'x'; endpoint: not served")
