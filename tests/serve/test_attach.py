"""Armed mode: ``asyncflow run --armed``, ``asyncflow.arm()``, and ``attach``, ``detach`` and
``dump`` acting on real processes through their control socket (issue 30)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import signal
import stat
import subprocess
import sys
import threading
import time
import urllib.request
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest

import asyncflow
from asyncflow import _armed, cli
from asyncflow.instrumentation import own_code
from asyncflow.render.dump import DumpDocument, render_dump
from asyncflow.schema import load
from asyncflow.serve import control, registry
from tests.support.commands import asyncflow_cmd, write

TIMEOUT = 30.0

#: tasks parked on a lock, an event and a queue before anyone attaches; then, line by line
#: on standard input: "spawn NAME" makes a task that waits on a new event, "" ends it all
#: (exit status 3)
PROGRAM = """
import asyncio, sys

async def holder(lock, event):
    async with lock:
        await event.wait()

async def waiter(lock):
    async with lock:
        pass

async def getter(queue):
    return await queue.get()

async def parked(event):
    await event.wait()

async def main():
    lock, event, queue = asyncio.Lock(), asyncio.Event(), asyncio.Queue()
    tasks = [asyncio.create_task(holder(lock, event), name="holder")]
    await asyncio.sleep(0)
    tasks.append(asyncio.create_task(waiter(lock), name="waiter"))
    tasks.append(asyncio.create_task(getter(queue), name="getter"))
    await asyncio.sleep(0)
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = (await loop.run_in_executor(None, sys.stdin.readline)).split()
        if not line:
            break
        tasks.append(asyncio.create_task(parked(event), name=line[1]))
        await asyncio.sleep(0)
        print("spawned", flush=True)
    event.set()
    queue.put_nowait(1)
    await asyncio.gather(*tasks)
    sys.exit(3)

asyncio.run(main())
"""


class Armed:
    """A program run by ``asyncflow run --armed``, driven through its standard input."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.pid = process.pid

    def line(self) -> str:
        """The program's next line on standard output (bounded: TIMEOUT)."""
        got: list[str] = []
        reader = threading.Thread(target=lambda: got.append(self.process.stdout.readline()))  # type: ignore[union-attr]
        reader.start()
        reader.join(TIMEOUT)
        assert got, "the armed program said nothing in time"
        return got[0].strip()

    def spawn(self, name: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(f"spawn {name}\n")
        self.process.stdin.flush()
        assert self.line() == "spawned"

    def end(self) -> int:
        assert self.process.stdin is not None
        self.process.stdin.close()
        return self.process.wait(TIMEOUT)


@contextmanager
def armed_program(
    tmp_path: Path, text: str = PROGRAM, options: tuple[str, ...] = ()
) -> Iterator[Armed]:
    """``text`` (a program that prints "ready") run by ``asyncflow run --armed [options]
    app.py``; with ``options`` ``("python",)``, by ``python app.py`` (it arms itself)."""
    script = write(tmp_path / "app.py", text)
    command = (
        [sys.executable, str(script)]
        if options == ("python",)
        else [sys.executable, "-m", "asyncflow", "run", "--armed", *options, str(script)]
    )
    process = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    program = Armed(process)
    try:
        assert program.line() == "ready", process.stderr.read() if process.stderr else ""
        yield program
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(TIMEOUT)
        for stream in (process.stdin, process.stdout, process.stderr):
            if stream is not None:
                stream.close()


class Done:
    """What ``asyncflow ARGS`` did, run in this process (the client needs no process of its
    own: each one would take a second to start here)."""

    def __init__(self, capsys: pytest.CaptureFixture[str], *args: str) -> None:
        self.returncode = cli.main(list(args))
        self.stdout, self.stderr = capsys.readouterr()


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=TIMEOUT) as response:
        return orjson.loads(response.read())


def by_name(tasks: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in tasks}


def tasks_within(url: str, names: set[str], seconds: float) -> dict[str, dict[str, Any]]:
    """``/tasks`` by name, read again (the endpoint caches a document a moment) until it
    lists every task of ``names``; fails past ``seconds``."""
    began = time.monotonic()
    while True:
        tasks = by_name(get(url + "/tasks")["tasks"])
        if names <= set(tasks):
            return tasks
        assert time.monotonic() - began < seconds, f"{names - set(tasks)} not listed in time"


def test_an_armed_program_is_listed_attached_detached_and_ends_with_its_own_status(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with armed_program(tmp_path) as program:
        pid = program.pid
        socket = control.socket_path(pid)
        assert stat.S_ISSOCK(socket.stat().st_mode)
        assert socket.stat().st_mode & 0o777 == 0o600
        assert registry.directory().stat().st_mode & 0o777 == 0o700

        # armed: listed as such, with no endpoint
        done = Done(capsys, "ps", "--json")
        (entry,) = orjson.loads(done.stdout)
        assert (entry["pid"], entry["armed"], entry["url"], entry["name"]) == (pid, True, "", "app")
        done = Done(capsys, "ps")
        assert done.stdout.splitlines()[1].split()[:4] == [str(pid), "-", "app", "(armed)"]

        # attach: the endpoint, and the tasks made before it, with their waits, within 2 s
        done = Done(capsys, "attach", str(pid))
        assert done.returncode == 0, done.stderr
        url = done.stdout.strip()
        assert url.startswith("http://127.0.0.1:")
        assert f"attached to 'app' (pid {pid})" in done.stderr
        tasks = tasks_within(url, {"holder", "waiter", "getter"}, 2.0)
        waits = {name: tasks[name]["waits_on"]["kind"] for name in ("holder", "waiter", "getter")}
        assert waits == {"holder": "event", "waiter": "lock", "getter": "queue_get"}
        for name in ("holder", "waiter"):
            assert tasks[name]["state"] == "waiting"
            assert tasks[name]["chain"][0]["function"] == name
            assert tasks[name]["call_id"] is None  # made before: not a call of a future
        assert not any(t["name"].startswith("asyncflow-") for t in tasks.values())
        entry = orjson.loads(Done(capsys, "ps", "--json").stdout)[0]
        assert (entry["armed"], entry["url"]) == (False, url)

        # a task made while attached is tracked from its start
        program.spawn("during")
        during = tasks_within(url, {"during"}, TIMEOUT)["during"]
        assert during["call_id"] is not None
        assert during["future_label"] == "parked"

        # attach again: the same endpoint
        again = Done(capsys, "attach", str(pid))
        assert (again.returncode, again.stdout.strip()) == (0, url)
        assert "is attached already" in again.stderr

        # detach: its report, and armed again; a task made now is not tracked
        done = Done(capsys, "detach", str(pid))
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("asyncflow · app · elapsed ")
        assert "it runs armed again" in done.stderr
        entry = orjson.loads(Done(capsys, "ps", "--json").stdout)[0]
        assert (entry["armed"], entry["url"]) == (True, "")
        program.spawn("after")
        dump = orjson.loads(Done(capsys, "dump", str(pid), "--format", "json").stdout)
        tasks = by_name(dump["tasks"]["tasks"])
        assert dump["state"] == "armed"
        assert tasks["after"]["call_id"] is None
        done = Done(capsys, "detach", str(pid))
        assert done.returncode == 2
        assert "it is armed, not attached: there is nothing to detach" in done.stderr

        # and it can be attached again
        done = Done(capsys, "attach", str(pid))
        assert done.returncode == 0, done.stderr
        tasks_within(done.stdout.strip(), {"holder", "during", "after"}, 2.0)

        assert program.end() == 3
    # nothing is left behind: no socket, no registry file
    assert list(registry.directory().iterdir()) == []


def test_dump_lists_every_task_of_an_armed_program_and_what_it_waits_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with armed_program(tmp_path) as program:
        done = Done(capsys, "dump", str(program.pid))
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert lines[0] == f"asyncflow: pid {program.pid} (app), armed: 4 live tasks"
        assert any(
            "holder (holder) waiting at " in line and "wait for event" in line for line in lines
        )
        (waiter,) = [line for line in lines if line.startswith("  waiter (waiter) waiting at ")]
        assert "acquire lock Lock at 0x" in waiter
        # asyncio does not say who holds a plain lock: the holder's `async with` block does
        assert waiter.endswith(f", held by holder (at {tmp_path / 'app.py'}:6)")
        assert "waiting tasks (4, not stuck: something alive may still release them)" in lines

        done = Done(capsys, "dump", str(program.pid), "--format", "json")
        dump = load(DumpDocument, orjson.loads(done.stdout))
        assert (dump.pid, dump.name, dump.state, dump.url) == (program.pid, "app", "armed", None)
        names = {t.name for t in dump.tasks.tasks}
        assert names == {"Task-1", "holder", "waiter", "getter"}
        assert dump.tasks.total == 4
        (held,) = dump.held_by
        assert (held.task, held.where.line, held.where.function) == ("holder", 6, "holder")
        assert held.target.startswith("Lock at 0x")
        assert render_dump(dump).splitlines()[0] == lines[0]
        assert program.end() == 3


#: a loop that parks a task, then blocks in a read of standard input (no callback runs)
BLOCKED = """
import asyncio, sys

async def parked(event):
    await event.wait()

async def main():
    event = asyncio.Event()
    task = asyncio.create_task(parked(event), name="parked")
    await asyncio.sleep(0)
    print("ready", flush=True)
    sys.stdin.readline()  # the loop is blocked here
    event.set()
    await task

asyncio.run(main())
"""


def test_a_blocked_loop_is_read_from_outside_and_adopted_when_it_runs_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with armed_program(tmp_path, BLOCKED) as program:
        done = Done(capsys, "dump", str(program.pid))
        assert done.returncode == 0, done.stderr
        assert "  parked (parked) waiting at " in done.stdout
        assert "(a blocked loop was read from outside: its chains may be changing)" in done.stdout

        done = Done(capsys, "attach", str(program.pid))
        assert done.returncode == 0, done.stderr
        assert "2 live tasks adopted; 1 loop blocked, adopted when it next runs" in done.stderr
        tasks = get(done.stdout.strip() + "/tasks")
        assert tasks["consistent"] is False
        assert "parked" in by_name(tasks["tasks"])
        assert program.end() == 0


#: a parent that forks a worker (as gunicorn does), which runs an event loop; both end when
#: standard input closes, the parent with its worker's status
FORKING = """
import asyncio, os, sys

async def parked(event):
    await event.wait()

async def worker():
    event = asyncio.Event()
    task = asyncio.create_task(parked(event), name="in-the-worker")
    await asyncio.sleep(0)
    print(f"ready {os.getpid()}", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    event.set()
    await task

print("ready", flush=True)  # (before the worker's line, whichever process runs first)
pid = os.fork()
if pid == 0:
    asyncio.run(worker())
    sys.exit(5)
sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""


def test_a_forked_worker_is_armed_from_its_first_event_loop(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with armed_program(tmp_path, FORKING) as program:
        said, worker = program.line().split()  # (the parent said "ready" already)
        assert said == "ready"
        child = int(worker)
        assert child != program.pid
        done = Done(capsys, "ps", "--json")
        listed = {e["pid"]: e for e in orjson.loads(done.stdout)}
        assert listed[program.pid]["armed"] and listed[child]["armed"]
        done = Done(capsys, "dump", str(child))
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(f"asyncflow: pid {child} (app/fork-1), armed: 2 live tasks")
        assert (listed[child]["name"], listed[child]["parent"]) == ("app/fork-1", program.pid)
        assert "  in-the-worker (parked) waiting at " in done.stdout
        done = Done(capsys, "dump", str(program.pid))  # the parent runs no loop of its own
        assert done.stdout.startswith(f"asyncflow: pid {program.pid} (app), armed: 0 live tasks")
        assert program.end() == 5
    assert list(registry.directory().iterdir()) == []


def test_attach_detach_and_dump_refuse_what_is_not_an_armed_process_of_this_user(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        for command in ("attach", "detach", "dump"):
            done = Done(capsys, command, str(plain.pid))
            assert done.returncode == 2
            assert done.stderr.startswith(
                f"asyncflow {command}: error: process {plain.pid} is not armed (no control "
                "socket at "
            )
            assert "start it with 'asyncflow run --armed ...' or call asyncflow.arm() in it" in (
                done.stderr
            )
    finally:
        assert plain.stdin is not None
        plain.stdin.close()
        plain.wait(TIMEOUT)
    # a pid no process has now (that one, ended)
    done = Done(capsys, "dump", str(plain.pid))
    assert done.returncode == 2
    assert done.stderr == f"asyncflow dump: error: no process has pid {plain.pid}\n"
    done = Done(capsys, "attach", "0")
    assert done.returncode == 2
    assert "'0' is not a process id (a whole number > 0)" in done.stderr


def test_another_users_process_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    def kill(pid: int, signal: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "kill", kill)
    with pytest.raises(control.ControlError) as caught:
        control.request(4242, "dump", TIMEOUT)
    assert str(caught.value) == (
        "process 4242 belongs to another user: asyncflow acts only on your own processes"
    )


def test_a_socket_served_by_another_process_than_the_one_named_is_not_trusted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    other = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        asyncflow.arm("me")
        try:
            # the socket of this process, found where process `other`'s would be
            mine = control.socket_path(os.getpid())
            monkeypatch.setattr(control, "socket_path", lambda pid: mine)
            with pytest.raises(control.NotArmedError) as caught:
                control.request(other.pid, "dump", TIMEOUT)
            assert f"is served by process {os.getpid()}, not by it" in str(caught.value)
        finally:
            _armed.disarm()
    finally:
        assert other.stdin is not None
        other.stdin.close()
        other.wait(TIMEOUT)


async def test_arm_in_a_running_program_dumps_its_own_loop() -> None:
    event = asyncio.Event()

    async def stuck() -> None:
        await event.wait()

    task = asyncio.create_task(stuck(), name="stuck-here")
    await asyncio.sleep(0)
    asyncflow.arm("in-process", port=0)
    try:
        assert _armed.armed()
        asyncflow.arm("again")  # arming again does nothing
        answer = await asyncio.to_thread(control.request, os.getpid(), "dump", TIMEOUT)
        dump = load(DumpDocument, answer["dump"])
        assert dump.name == "in-process"
        (entry,) = [t for t in dump.tasks.tasks if t.name == "stuck-here"]
        assert entry.waits_on is not None and entry.waits_on.kind == "event"
        assert (
            entry.chain[0].function
            == "test_arm_in_a_running_program_dumps_its_own_loop.<locals>.stuck"
        )
    finally:
        _armed.disarm()
        event.set()
        await task
    assert not _armed.armed()
    assert not control.socket_path(os.getpid()).exists()


def test_arm_refuses_a_bad_option_and_a_host_other_machines_reach() -> None:
    with pytest.raises(ValueError, match="port"):
        asyncflow.arm("x", port="nope")
    with pytest.raises(ValueError) as caught:
        asyncflow.arm("x", host="0.0.0.0", token="s3cret-token")
    assert "an armed process serves its endpoint on this machine only" in str(caught.value)
    assert not _armed.armed()


@pytest.mark.skipif(sys.version_info >= (3, 14), reason="sys.remote_exec exists from 3.14")
def test_remote_exec_refuses_before_python_3_14() -> None:
    done = asyncflow_cmd("attach", "--remote-exec", str(os.getpid()))
    assert done.returncode == 2
    assert done.stderr.startswith(
        "asyncflow attach: error: --remote-exec needs Python 3.14 or newer (sys.remote_exec, "
        "PEP 768); this is 3."
    )


def test_arming_a_profiled_process_does_nothing() -> None:
    with asyncflow.profile("profiled", format="none"):
        asyncflow.arm("late")
        assert not _armed.armed()
        assert not control.socket_path(os.getpid()).exists()


def test_remote_exec_arms_the_process_with_the_script_it_writes_then_attaches(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # No Python 3.14 here: sys.remote_exec is played by running the script in this process,
    # which is the one named (as the real one runs it in the target's main thread).
    ran: list[str] = []

    def remote_exec(pid: int, script: str) -> None:
        assert pid == os.getpid()
        assert Path(script).parent == registry.directory()
        assert Path(script).stat().st_mode & 0o077 == 0
        text = Path(script).read_text()
        ran.append(text)
        exec(compile(text, script, "exec"), {})

    monkeypatch.setattr(sys, "remote_exec", remote_exec, raising=False)
    plain_warning = warnings._warn_unawaited_coroutine  # type: ignore[attr-defined]
    try:
        done = Done(capsys, "attach", "--remote-exec", str(os.getpid()), "--port", "0")
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("http://127.0.0.1:")
        (text,) = ran
        assert text.endswith("import asyncflow\nasyncflow.arm()\n")
        assert [p.name for p in registry.directory().iterdir() if p.suffix == ".py"] == []
        # armed already: the next attach does not run the script again
        done = Done(capsys, "attach", "--remote-exec", str(os.getpid()))
        assert "is attached already" in done.stderr
        assert len(ran) == 1
        # own code imported from now on is tracked, never-awaited coroutines counted...
        assert own_code._finder in sys.meta_path
        assert warnings._warn_unawaited_coroutine is not plain_warning  # type: ignore[attr-defined]
        assert Done(capsys, "detach", str(os.getpid())).returncode == 0
        # ... until the detach takes them back
        assert own_code._finder not in sys.meta_path
        assert warnings._warn_unawaited_coroutine is plain_warning  # type: ignore[attr-defined]
    finally:
        _armed.disarm()


def test_the_listener_answers_a_bad_request_with_an_error_and_goes_on() -> None:
    import socket

    asyncflow.arm("listening")
    try:
        for sent in (b"not json\n", b'{"command": "rm -rf"}\n', b"[1, 2]\n", b""):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                client.settimeout(TIMEOUT)
                client.connect(str(control.socket_path(os.getpid())))
                client.sendall(sent)
                client.shutdown(socket.SHUT_WR)
                answer = orjson.loads(client.makefile("rb").readline())
            assert answer["ok"] is False
            assert answer["error"].startswith("unknown request ")
        status = control.request(os.getpid(), "status", TIMEOUT)
        assert status == {"ok": True, "name": "listening", "state": "armed", "url": None}
        with pytest.raises(control.ControlError) as caught:
            control.request(os.getpid(), "detach", TIMEOUT)
        assert str(caught.value) == (
            f"process {os.getpid()}: it is armed, not attached: there is nothing to detach"
        )
    finally:
        _armed.disarm()


def test_a_program_that_ends_while_attached_writes_its_report_where_the_options_say(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # as `asyncflow run` does: the report written at the end, the program's own exit status
    output = tmp_path / "report.json"
    with armed_program(tmp_path, options=("--output", str(output), "--format", "json")) as program:
        done = Done(capsys, "attach", str(program.pid))
        assert done.returncode == 0, done.stderr
        program.spawn("during")
        assert program.end() == 3
    report = orjson.loads(output.read_bytes())
    assert report["status"]["name"] == "app"
    assert "parked" in {f["label"] for f in report["futures"]["futures"]}
    # SIGTERM (docker stop, systemd): the report first, then the end by SIGTERM, as under
    # `asyncflow run`
    output.unlink()
    with armed_program(tmp_path, options=("--output", str(output), "--format", "json")) as program:
        assert Done(capsys, "attach", str(program.pid)).returncode == 0
        program.process.send_signal(signal.SIGTERM)
        assert program.process.wait(TIMEOUT) == -signal.SIGTERM
    assert orjson.loads(output.read_bytes())["status"]["name"] == "app"
    # the table, on standard error (standard output is the program's)
    with armed_program(tmp_path) as program:
        assert Done(capsys, "attach", str(program.pid)).returncode == 0
        assert program.end() == 3
        assert program.process.stderr is not None
        assert "asyncflow · app · elapsed " in program.process.stderr.read()
    # detached before the end: the report went to detach, none is written at the end
    with armed_program(tmp_path) as program:
        assert Done(capsys, "attach", str(program.pid)).returncode == 0
        assert Done(capsys, "detach", str(program.pid)).returncode == 0
        assert program.end() == 3
        assert program.process.stderr is not None
        assert "asyncflow · app · elapsed " not in program.process.stderr.read()


#: a program that arms itself: its report at the end is written by the interpreter's exit
#: (after the profiler's own atexit hook, which the attach registered later, stopped it)
ARMS_ITSELF = """
import asyncio, sys
import asyncflow

asyncflow.arm("self-armed", output=sys.argv[1], format="json")

async def main():
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    sys.exit(4)

asyncio.run(main())
"""


def test_a_program_that_arms_itself_and_ends_while_attached_writes_its_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "self.json"
    script = write(tmp_path / "app.py", ARMS_ITSELF)
    process = subprocess.Popen(
        [sys.executable, str(script), str(output)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    program = Armed(process)
    try:
        assert program.line() == "ready"
        assert Done(capsys, "attach", str(program.pid)).returncode == 0
        assert program.end() == 4
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(TIMEOUT)
        for stream in (process.stdin, process.stdout, process.stderr):
            if stream is not None:
                stream.close()
    assert orjson.loads(output.read_bytes())["status"]["name"] == "self-armed"


#: a parent that starts a child by each of multiprocessing's methods (uvicorn's --workers
#: spawn theirs), each parking a task in an event loop; all end when standard input closes
STARTING = """
import asyncio, multiprocessing, os, sys

async def parked(event):
    await event.wait()

async def work(method, done):
    event = asyncio.Event()
    task = asyncio.create_task(parked(event), name=f"in-{method}")
    await asyncio.sleep(0)
    # (one write: under PYTHONUNBUFFERED print() writes the line's end apart, and the three
    # children's lines interleaved)
    sys.stdout.write(f"ready {method} {os.getpid()}\\n")
    sys.stdout.flush()
    await asyncio.get_running_loop().run_in_executor(None, done.wait)
    event.set()
    await task

def worker(method, done):
    asyncio.run(work(method, done))
    sys.exit(6)

if __name__ == "__main__":
    print("ready", flush=True)
    done = multiprocessing.get_context("spawn").Event()
    children = []
    for method in ("spawn", "forkserver", "fork"):
        context = multiprocessing.get_context(method)
        children.append(context.Process(target=worker, args=(method, done)))
        children[-1].start()
    sys.stdin.readline()
    done.set()
    for child in children:
        child.join()
    sys.exit(3 if [c.exitcode for c in children] == [6, 6, 6] else 1)
"""


@contextmanager
def _killed_at_the_end(pids: dict[str, int]) -> Iterator[None]:
    """The children of a test that failed, which would wait for their parent for ever."""
    try:
        yield
    finally:
        for pid in pids.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_the_processes_an_armed_program_starts_are_armed_by_every_start_method(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pids: dict[str, int] = {}
    with armed_program(tmp_path, STARTING) as program, _killed_at_the_end(pids):
        ready = dict(program.line().split()[1:] for _ in range(3))
        pids.update((method, int(pid)) for method, pid in ready.items())
        roles = {"spawn": "process-1", "forkserver": "process-2", "fork": "process-3"}
        listed = {e["pid"]: e for e in orjson.loads(Done(capsys, "ps", "--json").stdout)}
        for method, pid in pids.items():
            entry = listed[pid]
            assert (entry["armed"], entry["parent"], entry["role"], entry["name"]) == (
                True,
                program.pid,
                roles[method],
                f"app/{roles[method]}",
            )
            done = Done(capsys, "dump", str(pid))
            assert done.returncode == 0, done.stderr
            assert f"(app/{roles[method]}), armed: " in done.stdout.splitlines()[0]
            assert f"  in-{method} (parked) waiting at " in done.stdout
        # a spawned child is attached as any armed process is; its report at its end goes to
        # standard error under its name (standard output is its parent's)
        done = Done(capsys, "attach", str(pids["spawn"]))
        assert done.returncode == 0, done.stderr
        tasks_within(done.stdout.strip(), {"in-spawn"}, 2.0)
        listed = {e["pid"]: e for e in orjson.loads(Done(capsys, "ps", "--json").stdout)}
        assert (listed[pids["spawn"]]["armed"], listed[pids["spawn"]]["parent"]) == (
            False,
            program.pid,
        )
        spawned = pids["spawn"]
        assert program.end() == 3
        pids.clear()  # joined by their parent: gone (their pids may be another's soon)
        assert program.process.stderr is not None
        said = program.process.stderr.read()
        assert f"asyncflow: report of 'app/process-1' (pid {spawned}):" in said
    # each child took its socket and registry file away (multiprocessing ends it by os._exit)
    assert list(registry.directory().iterdir()) == []


#: a module of the program's own, imported only when asked for (after an attach)
LATER = """
import asyncio

async def inner():
    await asyncio.sleep(0)

async def outer():
    await inner()
"""

#: a program that, line by line on standard input: "before" awaits a coroutine function of
#: its script's own (imported before any attach), "later" imports later.py and awaits its
#: outer() (no task of its own: tracked only as the program's own code), and drops a
#: coroutine of each unawaited; "" ends it
OWN_CODE = """
import asyncio, gc, sys

async def early():
    await asyncio.sleep(0)

async def main():
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = (await loop.run_in_executor(None, sys.stdin.readline)).strip()
        if not line:
            break
        if line == "later":
            import later
            await later.outer()
            later.inner()  # never awaited
        else:
            await early()
            early()  # never awaited
        gc.collect()
        print("done", flush=True)

asyncio.run(main())
"""


def test_attach_tracks_own_code_imported_after_it_and_counts_never_awaited_coroutines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path / "later.py", LATER)
    with armed_program(tmp_path, OWN_CODE) as program:
        done = Done(capsys, "attach", str(program.pid))
        assert done.returncode == 0, done.stderr
        assert program.process.stdin is not None
        for line in ("before", "later"):
            program.process.stdin.write(line + "\n")
            program.process.stdin.flush()
            assert program.line() == "done"
        futures = get(done.stdout.strip() + "/futures")
        by_label = {f["label"]: f for f in futures["futures"]}
        # imported after the attach: its coroutine functions are futures, their calls counted
        # whether a task runs them or not, and one never awaited is an outcome of its future
        assert by_label["outer"]["call_count"] == 1
        assert (by_label["inner"]["call_count"], by_label["inner"]["outcomes"]) == (
            2,
            {**by_label["inner"]["outcomes"], "returned": 1, "never_awaited": 1},
        )
        # defined before it: left as it is (its code cannot be compiled again); coroutines
        # never awaited are counted by Python's warning, which the attach took over, whenever
        # their function was defined
        assert "early" not in by_label
        never = {e["function"]: e["count"] for e in futures["never_awaited"]}
        assert never == {"early": 1, "inner": 1}, never
        assert program.end() == 0


def test_a_child_gets_the_options_that_cross_into_another_process() -> None:
    class Ticking:  # a live reporter: no plain data, and this one does not pickle
        def __init__(self) -> None:
            self.ticks = lambda: None

        def tick(self, tick: object) -> None:
            pass

    asyncflow.arm(
        "parent", output="report.json", port=7001, reporters=[Ticking()], percentiles=(50, 99)
    )
    try:
        armed = _armed._armed
        assert armed is not None
        child = armed.child("process-1")
        assert child.name == "parent/process-1"
        assert child.options == {
            "output": os.path.abspath("report.process-1.json"),  # (where it was asked for)
            "port": 0,
            "percentiles": (50, 99),
        }
        assert pickle.loads(pickle.dumps(child)) == child
    finally:
        _armed.disarm()


def test_ps_counts_an_armed_process_up_from_its_first_registration_across_attach_and_detach(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The registry file is written again at attach and at detach: it keeps when the process
    # registered first, or `asyncflow ps` says UP 0s of a process up for minutes.
    with armed_program(tmp_path) as program:
        pid = program.pid
        first = orjson.loads(Done(capsys, "ps", "--json").stdout)[0]["started"]
        done = Done(capsys, "attach", str(pid))
        assert done.returncode == 0, done.stderr
        attached = orjson.loads(Done(capsys, "ps", "--json").stdout)[0]
        assert (attached["armed"], attached["started"]) == (False, first)
        done = Done(capsys, "detach", str(pid))
        assert done.returncode == 0, done.stderr
        detached = orjson.loads(Done(capsys, "ps", "--json").stdout)[0]
        assert (detached["armed"], detached["started"]) == (True, first)
        assert program.end() == 3


#: a loop blocked in a plain function a coroutine called (the task's await chain ends a
#: frame above it, at the line that called it)
BLOCKED_IN_A_CALL = """
import asyncio, sys

def block():
    sys.stdin.readline()  # the loop is blocked here

async def step():
    print("ready", flush=True)
    block()

async def main():
    await step()

asyncio.run(main())
"""


def test_dump_says_the_line_a_blocked_loop_is_blocked_at_not_its_task_s_last_await(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with armed_program(tmp_path, BLOCKED_IN_A_CALL) as program:
        done = Done(capsys, "dump", str(program.pid))
        assert done.returncode == 0, done.stderr
        assert f"  Task-1 (main) running at {tmp_path / 'app.py'}:5\n" in done.stdout
        done = Done(capsys, "dump", str(program.pid), "--format", "json")
        (task,) = load(DumpDocument, orjson.loads(done.stdout)).tasks.tasks
        assert task.where is not None
        assert (task.where.line, task.where.function) == (5, "block")
        assert program.end() == 0


def test_a_report_of_an_attach_that_tracked_nothing_says_everything_predates_the_attach(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Every task was made before the attach: none is a tracked call, and the report says so
    # (not that no @asyncflow.future was called, nor that --include/--exclude left them out).
    with armed_program(tmp_path) as program:
        done = Done(capsys, "attach", str(program.pid))
        assert done.returncode == 0, done.stderr
        done = Done(capsys, "detach", str(program.pid))
        assert done.returncode == 0, done.stderr
        assert "--include/--exclude" not in done.stdout
        assert (
            "(no futures were tracked: asyncflow was attached to the running program and "
            "adopted 4 live tasks made before it: what they run is not timed (docs/attach.md "
            "says what is); only tasks made after the attach are)"
        ) in done.stdout
        assert program.end() == 3
