"""How the endpoint process is started: detached from the program by an intermediate that
costs its first answer as little as it can (issue 28)."""

from __future__ import annotations

import os
import re
import selectors
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import asyncflow
from asyncflow.instrumentation import futures
from asyncflow.serve import server
from tests.support.commands import ASYNCFLOW
from tests.support.compiled_path import compiled
from tests.support.http import get

pytestmark = pytest.mark.skipif(
    not server.PROCESS or not hasattr(os, "pidfd_open") or not Path("/proc").exists(),
    reason="no endpoint process here",
)


@pytest.mark.skipif(shutil.which("setsid") is None, reason="no setsid(1) here")
def test_a_shell_detaches_the_endpoint_process_not_a_second_python(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The intermediate ran before the endpoint process could start: a Python of its own took
    # 10-140 ms (more on a loaded machine) of the time to the first answer; a shell and
    # setsid(1) take a few.
    monkeypatch.setenv("ASYNCFLOW_ENDPOINT_PROCESS", "1")
    started: list[list[str]] = []
    real = subprocess.Popen

    def popen(args: list[str], *rest: Any, **kwargs: Any) -> Any:
        started.append(list(args))
        return real(args, *rest, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", popen)
    with asyncflow.profile("start", format="none", port=0) as prof:
        assert prof.url is not None and get(prof.url, "/profiler_status")[0] == 200
        link = prof._server.link if prof._server is not None else None
        assert link is not None and link.process.pid is not None
        pid = link.process.pid
        # the pid held is the endpoint process itself, in a session of its own, no child here
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert server._ENDPOINT.encode() in command
        assert os.getsid(pid) == pid and os.getsid(0) != pid
        with open(f"/proc/{pid}/stat") as stat:
            assert int(stat.read().rsplit(")", 1)[1].split()[1]) != os.getpid()  # its parent
    (intermediate,) = started
    assert intermediate[0] != sys.executable, intermediate[:3]


def test_the_endpoint_process_serves_before_it_imports_the_schema() -> None:
    # The schema's dataclasses (some 30-60 ms to import, 15-20% of what the endpoint process
    # imports) are needed for /openapi.json and an error's body, not to serve a first answer:
    # the program sends the documents as JSON.
    probe = textwrap.dedent(
        f"""
        import runpy, sys
        runpy.run_path({server._ENDPOINT!r}, run_name="probe")["_bare_package"]()
        import asyncflow.serve._http
        print("asyncflow.schema" in sys.modules)
        """
    )
    done = subprocess.run(
        [sys.executable, "-P", "-c", probe], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "False\n"


_BUSY = """
import asyncio, sys, threading

async def work(told):
    while not told.is_set():  # at work on its loop, yielding between short computations
        sum(range(20000))
        await asyncio.sleep(0)

async def main():
    told = threading.Event()  # stdin closed: the test is done (read on a thread, GIL free)
    threading.Thread(target=lambda: (sys.stdin.read(), told.set()), daemon=True).start()
    if sys.argv[1] == "profile":
        import asyncflow
        with asyncflow.profile("busy", port=0, format="none") as prof:
            print(prof.url, flush=True)
            await work(told)
    else:  # under `asyncflow run`, which tracks every task
        await work(told)
    print("busy to the end", flush=True)

asyncio.run(main())
"""


def _busy(how: str, tmp_path: Path) -> tuple[subprocess.Popen[str], str]:
    script = tmp_path / "busy.py"
    script.write_text(_BUSY)
    env = {**os.environ, "ASYNCFLOW_ENDPOINT_PROCESS": "1"}
    if how == "profile":
        command = [sys.executable, str(script), how]
    else:
        command = [*ASYNCFLOW, "run", "--port", "0", "--format", "none", str(script), how]
    program = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert program.stdin is not None and program.stdout is not None
    assert program.stderr is not None
    said = program.stdout if how == "profile" else program.stderr
    line = said.readline()
    url = re.search(r"http://127\.0\.0\.1:\d+", line)
    assert url is not None, line
    return program, url.group()


@pytest.mark.parametrize("how", [pytest.param("profile", marks=compiled), "run"])
def test_every_route_answers_a_program_that_keeps_its_loop_busy(how: str, tmp_path: Path) -> None:
    # A program computing on its loop and yielding every fraction of a millisecond drops and
    # takes the GIL back so often that another thread waiting for it rarely wins: the
    # profiler's thread waited for it after every system call. Started on that thread once
    # start() had returned, the endpoint process took 7 s to start and no client was answered;
    # under `asyncflow run`, with the process up, /profiler_status and /tasks each went
    # unanswered for 4 s. The process now starts before start() returns, and the program's
    # threads hand the GIL over to the profiler's when it woke for work: on the compiled path
    # from any loop; on the pure-Python one at a tracked call's poll, so under `asyncflow run`
    # (a loop that runs no tracked call, as this program under profile(), hands nothing over).
    program, url = _busy(how, tmp_path)
    try:
        for path in ("/profiler_status", "/tasks", "/futures", "/loop", "/snapshot", "/tasks"):
            status, body, _ = get(url, path, timeout=5)
            assert status == 200, (path, body)
        assert how == "profile" or len(body["tasks"]) >= 1, body  # run tracks every task
    finally:
        said, _ = program.communicate(timeout=30)
    assert said == "busy to the end\n"  # still at work when it answered


def test_the_hand_over_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    # ASYNCFLOW_GIL_HAND_OVER=0: the profiler's loop waits in the standard selector, which
    # asks nobody for the GIL, on either path.
    monkeypatch.setenv("ASYNCFLOW_GIL_HAND_OVER", "0")
    with asyncflow.profile("plain-turns", format="none", port=None) as prof:
        assert prof._loop is not None
        selector = prof._loop._selector  # type: ignore[attr-defined]
        assert type(selector) is selectors.DefaultSelector
        assert type(selector._selector).__name__ == "epoll"  # type: ignore[attr-defined]
    monkeypatch.setenv("ASYNCFLOW_GIL_HAND_OVER", "1")
    with asyncflow.profile("handing", format="none", port=None) as prof:
        assert prof._loop is not None
        selector = prof._loop._selector  # type: ignore[attr-defined]
        if futures._speedups is None:  # the pure-Python path says when it waits (_handing)
            assert type(selector).__name__ == "_HandingSelector"
        else:
            assert type(selector._selector).__name__ == (
                "_HandingEpoll" if hasattr(futures._speedups, "wait_events") else "epoll"
            )
