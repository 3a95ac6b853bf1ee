"""How the endpoint process is started: detached from the program by an intermediate that
costs its first answer as little as it can (issue 28)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import asyncflow
from asyncflow.serve import server
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
