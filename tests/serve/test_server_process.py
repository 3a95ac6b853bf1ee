"""The endpoint process: HTTP served beside the program, documents built in it.

The program binds the port and builds documents on the profiler's thread; a helper process,
started at the first connection, serves HTTP and asks the program only for what its cache does
not hold. These tests check that it is that process which serves, that it never outlives the
program or its profiler (also across ``fork``), that a killed one is replaced and said so, that
its cache saves the program work, and the in-process mode it falls back to.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import asyncflow
from asyncflow.serve import server
from asyncflow.views import documents as views
from tests.support.http import address, get, read_response, request


@pytest.fixture(autouse=True)
def _from_the_endpoint_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """HTTP served from the endpoint process, as in programs (conftest.py serves the other
    tests' endpoints on the profiler's thread)."""
    monkeypatch.setenv("ASYNCFLOW_ENDPOINT_PROCESS", "1")


pytestmark = pytest.mark.skipif(
    not server.PROCESS or not hasattr(os, "pidfd_open"), reason="no endpoint process here"
)


def endpoint_process(prof: asyncflow.Profiler) -> int:
    """The pid of the process serving ``prof``'s endpoint (asking once, so that one runs)."""
    assert prof.url is not None and get(prof.url, "/profiler_status")[0] == 200
    link = prof._server.link if prof._server is not None else None
    assert link is not None and link.process.pid is not None
    return link.process.pid


def wait_exit(pid: int, seconds: float = 10.0) -> bool:
    """Whether process ``pid`` has exited (or exits within ``seconds``)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], seconds)[0])
    finally:
        os.close(fd)


def serving_pid(prof: asyncflow.Profiler) -> int:
    """Which process holds the server's end of a live connection to ``prof``'s endpoint,
    found from the kernel's table of TCP sockets (Linux)."""
    ip, port = address(prof)
    with socket.create_connection((ip, port), timeout=10) as sock:
        sock.sendall(f"GET /flow HTTP/1.1\r\nHost: {ip}:{port}\r\n\r\n".encode())
        assert read_response(sock)[0] == 200  # accepted and answered: the connection is held
        near = sock.getsockname()[1]
        inode = None
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            fields = line.split()
            local, remote = fields[1], fields[2]
            if int(local.split(":")[1], 16) == port and int(remote.split(":")[1], 16) == near:
                inode = fields[9]
        assert inode is not None
        holders = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
            except OSError:
                continue
            for fd in fds:
                try:
                    if os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]":
                        holders.append(int(pid))
                except OSError:  # closed meanwhile (the listing's own descriptor, say)
                    pass
        assert len(holders) == 1, holders
        return holders[0]


@pytest.fixture
def served() -> Iterator[asyncflow.Profiler]:
    with asyncflow.profile("process", format="none", port=0) as prof:
        yield prof


# -- who serves -----------------------------------------------------------------------------------


def until(holds: Callable[[], bool], seconds: float = 30.0) -> bool:
    """Whether ``holds()`` becomes true within ``seconds`` (polled: a bounded wait)."""
    deadline = time.monotonic() + seconds
    while not holds():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux's /proc")
def test_a_helper_process_serves_and_the_program_builds(served: asyncflow.Profiler) -> None:
    child = endpoint_process(served)
    assert child != os.getpid()
    assert serving_pid(served) == child
    _, status, _ = get(served.url or "", "/profiler_status")
    assert status["pid"] == os.getpid()  # the documents are the program's


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux's /proc")
def test_the_process_starts_with_the_profiler_not_at_the_first_connection(
    served: asyncflow.Profiler,
) -> None:
    # A short program, or `asyncflow top` started beside it, must not wait for a process
    # started only when it connects: the process is up (it said "ready") before any client.
    server_ = served._server
    assert server_ is not None
    assert until(lambda: server_.link is not None and server_.link.ready)
    link = server_.link
    assert link is not None and server_.started == 1
    assert serving_pid(served) == link.process.pid  # that process serves the first client
    assert server_.started == 1  # and no other was started for it


def test_the_process_loads_none_of_asyncflows_front_door() -> None:
    # It serves HTTP: it imports aiohttp and the endpoint's own modules, never the profiler,
    # the options table or the hot path that `import asyncflow` brings (time before its first
    # answer, and memory). Its script's start-up, then what serving imports:
    probe = textwrap.dedent(
        f"""
        import runpy, sys
        runpy.run_path({server._ENDPOINT!r}, run_name="probe")["_bare_package"]()
        import asyncflow.serve._http
        print(sorted(m for m in sys.modules if m.startswith("asyncflow.") and
                     m.split(".")[1] in ("profiler", "config", "instrumentation", "model")))
        """
    )
    done = subprocess.run(
        [sys.executable, "-P", "-c", probe], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "[]\n"


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux's /proc")
@pytest.mark.parametrize("how", ["ASYNCFLOW_ENDPOINT_PROCESS=0", "no process here"])
def test_without_a_process_the_profilers_thread_serves(
    monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    if how == "no process here":
        monkeypatch.setattr(server, "PROCESS", False)
    else:
        monkeypatch.setenv("ASYNCFLOW_ENDPOINT_PROCESS", "0")
    with asyncflow.profile("here", format="none", port=0) as prof:
        assert serving_pid(prof) == os.getpid()
        assert prof._server is not None and prof._server.link is None


def test_a_process_that_cannot_start_falls_back_to_the_profilers_thread(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sys, "executable", "/bin/false")  # every process exits at once
    with asyncflow.profile("fallback", format="none", port=0) as prof:
        assert prof.url is not None
        status, body, _ = get(prof.url, "/profiler_status")  # waits in the backlog meanwhile
        assert status == 200 and body["pid"] == os.getpid()
        assert prof._server is not None and prof._server.started == server._START_FAILURES
    assert "serving it from the profiler's thread instead" in caplog.text


# -- its life: never longer than the program's or the profiler's ----------------------------------


def test_it_exits_when_the_profiler_stops(served: asyncflow.Profiler) -> None:
    child = endpoint_process(served)
    fd = os.pidfd_open(child)
    try:
        served.stop()
        assert select.select([fd], [], [], 0)[0]  # stop() waited for it
    finally:
        os.close(fd)
    assert served.url is None


PROGRAM = textwrap.dedent(
    """
    import os, sys, urllib.request
    import asyncflow
    prof = asyncflow.start("program", format="none", port=0)
    urllib.request.urlopen(prof.url + "/profiler_status", timeout=30).read()
    print(prof._server.link.process.pid, flush=True)
    how = sys.argv[1]
    if how == "fork":  # a worker forked now lives on after the program has gone
        hold = int(sys.argv[2])
        if os.fork() == 0:
            os.read(hold, 1)
            os._exit(0)
        os._exit(0)
    if how == "exit":
        sys.exit(0)  # the interpreter's own exit (atexit stops the profiler)
    if how == "crash":
        os._exit(3)  # no atexit, nothing: only the end of its socket pair tells the process
    sys.stdin.read()  # "kill": until killed
    """
)


@pytest.mark.parametrize("how", ["exit", "crash", "kill", "fork"])
def test_it_exits_when_the_program_ends_however_it_ends(tmp_path: Path, how: str) -> None:
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    hold_r, hold_w = os.pipe()
    program = subprocess.Popen(
        [sys.executable, str(script), how, str(hold_r)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        pass_fds=(hold_r,),
    )
    os.close(hold_r)
    try:
        assert program.stdout is not None
        line = program.stdout.readline()
        assert line.strip().isdigit(), line
        child = int(line)
        if how == "kill":
            program.send_signal(signal.SIGKILL)
        assert wait_exit(child), f"the endpoint process outlived the program ({how})"
        program.wait(10)
    finally:
        os.close(hold_w)  # the forked worker may go now
        if program.poll() is None:
            program.kill()
        program.wait(10)
        if program.stdin is not None:
            program.stdin.close()
        if program.stdout is not None:
            program.stdout.close()


def test_a_fork_while_the_process_starts_leaves_the_child_no_hold_on_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The process starts with the profiler, when a pre-fork server forks its workers: a worker
    # forked while it starts must not keep the program's end of its socket pair (the process
    # would outlive the program as long as that worker lives). Here the fork comes at the worst
    # moment, inside the start, and the child says what that descriptor is then.
    real = subprocess.Popen
    seen: list[str] = []

    def forking(*args: Any, **kwargs: Any) -> Any:
        (starting,) = [s for s in server._servers if s._spawning is not None]
        assert starting._spawning is not None
        fd = starting._spawning.fileno()
        read, write = os.pipe()
        child = os.fork()
        if child == 0:  # the worker: where does its copy of the descriptor point?
            try:
                os.write(write, os.readlink(f"/proc/self/fd/{fd}").encode())
            finally:
                os._exit(0)
        os.close(write)
        os.waitpid(child, 0)
        with os.fdopen(read, "rb") as said:
            seen.append(said.read().decode())
        return real(*args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", forking)
    with asyncflow.profile("forked", format="none", port=0) as prof:
        assert get(prof.url or "", "/profiler_status")[0] == 200
    assert seen == [os.devnull]


def test_a_killed_process_is_replaced_and_said_so(
    served: asyncflow.Profiler, caplog: pytest.LogCaptureFixture
) -> None:
    first = endpoint_process(served)
    os.kill(first, signal.SIGKILL)
    assert wait_exit(first)
    status, _, _ = get(served.url or "", "/flow")  # waits in the backlog for the next one
    assert status == 200
    second = endpoint_process(served)
    assert second not in (first, os.getpid())
    assert f"process (pid {first}) exited;" in caplog.text
    assert "another starts at the next connection" in caplog.text


# -- what the program pays: one build per document per window ------------------------------------


def counting_builds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    built: list[int] = []
    real = views.futures_document

    def counting(*args: Any) -> Any:
        built.append(1)
        return real(*args)

    monkeypatch.setattr(views, "futures_document", counting)
    without_the_findings_watch(monkeypatch)
    return built


def without_the_findings_watch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The collector's own evaluation of the findings (once a second) builds the futures too:
    the tests that count what the endpoint's requests cost the program leave it out."""
    monkeypatch.setattr(views, "_findings_watch", lambda collector: lambda now: None)


def test_identical_requests_within_the_window_cost_the_program_one_build(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(server, "LIMITS", server.Limits(cache_seconds=600.0))
    built = counting_builds(monkeypatch)
    with asyncflow.profile("cached", format="none", port=0) as prof:
        assert prof.url is not None and prof._server is not None
        answers: list[int] = []

        def client(n: int) -> None:
            for i in range(5):
                spelled = "0" * (n + i)  # spelled differently, one canonical request
                answers.append(request(prof, f"/futures?limit={spelled}7")[0])

        clients = [threading.Thread(target=client, args=(n,)) for n in range(8)]
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join(30)
        assert answers == [200] * 40
        assert len(built) == 1  # 40 requests, 8 at once: one document built in the program
        assert request(prof, "/futures?limit=8&offset=3")[0] == 200
        assert len(built) == 1  # another page: cut from the same document (its window)
        assert request(prof, f"/futures?offset={server.MAX_PAGE * 2}")[0] == 200
        assert len(built) == 2  # another window of the list: another document


def test_while_the_program_is_slow_to_rebuild_the_previous_document_is_served(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The program's thread busy (here: a build held at a gate), a client still gets an answer
    # within answer_within: the document built before, with its Age; the new one, once built,
    # serves the requests after it.
    monkeypatch.setattr(
        server,
        "LIMITS",
        server.Limits(cache_seconds=1e-9, cache_cost_share=0, answer_within=0.05),
    )
    gate = threading.Event()
    gate.set()
    built: list[int] = []
    real = views.futures_document

    rebuilt = threading.Event()

    def gated(*args: Any) -> Any:
        assert gate.wait(30)
        built.append(1)
        if len(built) == 2:
            rebuilt.set()
        return real(*args)

    monkeypatch.setattr(views, "futures_document", gated)
    without_the_findings_watch(monkeypatch)
    with asyncflow.profile("stale", format="none", port=0) as prof:
        status, headers, first = request(prof, "/futures")
        assert status == 200 and "age" not in headers and len(built) == 1
        gate.clear()  # the next build waits: out of date at once (1 ns), the first is served
        status, headers, second = request(prof, "/futures")
        # the cached answer, with its age in whole seconds (0 unless the machine stalled)
        assert status == 200 and second == first and int(headers["age"]) >= 0
        assert len(built) == 1  # answered while the program had not built the new one
        gate.set()
        assert rebuilt.wait(30) and len(built) == 2  # the rebuild went on without a client


def test_the_program_never_imports_aiohttp_when_the_endpoint_process_serves() -> None:
    # HTTP is the endpoint process's business: the program builds documents only, and pays
    # neither aiohttp's import (on the profiler's thread, holding the GIL) nor its memory.
    program = textwrap.dedent(
        """
        import json, sys, urllib.request
        import asyncflow
        with asyncflow.profile("light", format="none", port=0) as prof:
            with urllib.request.urlopen(prof.url + "/futures", timeout=30) as answer:
                assert json.load(answer)["futures"] is not None
        http = ("aiohttp", "yarl", "multidict")
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in http)
        print(loaded, "asyncflow.serve._http" in sys.modules)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60,
        env={**os.environ, "ASYNCFLOW_ENDPOINT_PROCESS": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == "[] False\n", done.stdout


def test_with_no_window_every_request_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server, "LIMITS", server.Limits(cache_seconds=0, cache_cost_share=0))
    built = counting_builds(monkeypatch)
    with asyncflow.profile("uncached", format="none", port=0) as prof:
        for _ in range(5):
            assert request(prof, "/futures")[0] == 200
        assert len(built) == 5


def test_an_internal_error_in_a_build_is_not_cached(
    monkeypatch: pytest.MonkeyPatch, served: asyncflow.Profiler
) -> None:
    monkeypatch.setattr(server, "LIMITS", server.Limits(cache_seconds=600.0))

    def broken(*args: object) -> object:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(views, "flow", broken)
    assert get(served.url or "", "/flow")[0] == 500
    monkeypatch.undo()
    assert get(served.url or "", "/flow")[0] == 200


# -- not the program's child: its generic reaping never meets it -----------------------------------

REAPER = textwrap.dedent(
    """
    import os, signal, urllib.request
    import asyncflow
    calls = []
    reaped = []

    def on_child(signum, frame):  # a generic reaper, as pre-fork servers have
        calls.append(signum)
        try:
            while (pid := os.waitpid(-1, os.WNOHANG)[0]) > 0:
                reaped.append(pid)
        except ChildProcessError:
            pass

    signal.signal(signal.SIGCHLD, on_child)
    prof = asyncflow.start("reaper", format="none", port=0)
    for _ in range(3):
        urllib.request.urlopen(prof.url + "/profiler_status", timeout=30).read()
    server = prof._server.link.process.pid
    try:
        found = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        found = None
    try:
        waited = os.wait()  # blocks forever if the endpoint process were a child
    except ChildProcessError:
        waited = None
    assert server not in reaped, reaped
    signals = len(calls)
    prof.stop()  # the intermediate reaped by the handler or not: stop() works all the same
    print(found, waited, signals, len(calls), flush=True)
    """
)


def test_the_endpoint_process_is_no_child_of_the_program(tmp_path: Path) -> None:
    script = tmp_path / "reaper.py"
    script.write_text(REAPER)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr
    found, waited, signals, after_stop = done.stdout.split()
    assert (found, waited) == ("None", "None")  # os.wait() and waitpid(-1) see no child
    # One SIGCHLD, from the intermediate that starts it and exits at once; none at stop.
    assert (signals, after_stop) == ("1", "1")
