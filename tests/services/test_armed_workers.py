"""The workers of a real server run armed (``asyncflow run --armed``) are armed each on its own.

uvicorn's ``--workers 2`` (multiprocessing's spawn) and gunicorn's uvicorn workers (``os.fork``)
serve on a unix socket. ``asyncflow ps`` lists each worker as armed, with its parent and role;
one is attached, serves a request, and when the server is stopped with SIGTERM (as a supervisor
stops it: the servers stop their workers with SIGTERM too, and raise it again once shut down)
the attached worker writes its report beside its parent's file, and every armed process takes
its socket and registry file away.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from asyncflow.serve import registry
from tests.services.test_workers import APP, DEADLINE, _labels, _listening, _ps, _until
from tests.support.commands import ASYNCFLOW, asyncflow_cmd, write

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform == "win32", reason="unix sockets, fork"),
]


def _armed_workers(tmp_path: Path, server: list[str], kind: str) -> None:
    write(tmp_path / "app.py", APP)
    sock = tmp_path / "app.sock"
    err = tmp_path / "stderr.txt"
    report = tmp_path / "report.json"
    command = [*ASYNCFLOW, "run", "--armed", "--format", "json", "--output", str(report)]
    with err.open("w") as stderr:
        run = subprocess.Popen(
            [*command, *server], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=stderr
        )
    listed: list[dict[str, Any]] = []
    try:

        def workers() -> list[dict[str, Any]]:
            found = [e for e in _ps() if e["parent"] == run.pid]
            return found if len(found) == 2 else []

        listed = _until("two armed workers in asyncflow ps", workers)
        for entry in listed:
            assert entry["armed"] and entry["url"] == "", entry
            assert entry["role"].startswith(f"{kind}-"), entry
            assert entry["name"] == f"{Path(server[1]).name}/{entry['role']}", entry
        _until("the socket listening", lambda: _listening(sock))
        attached = listed[0]
        done = asyncflow_cmd("attach", str(attached["pid"]))
        assert done.returncode == 0, done.stderr
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), timeout=10) as client:

            def answered() -> bool:
                response = client.get("http://app/items", headers={"Connection": "close"})
                return bool(int(response.text) == attached["pid"])

            _until("an answer from the attached worker", answered)
        run.send_signal(signal.SIGTERM)
        run.wait(DEADLINE)
        listed = []  # the server waited for its workers: gone (their pids may be another's)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        for entry in listed:  # (workers a failed test left behind)
            with contextlib.suppress(ProcessLookupError):
                os.kill(entry["pid"], signal.SIGKILL)
    said = err.read_text()
    worker_report = tmp_path / f"report.{attached['role']}.json"
    assert worker_report.exists(), said
    assert orjson.loads(worker_report.read_bytes())["status"]["pid"] == attached["pid"]
    assert "audit" in _labels(worker_report), said
    assert not report.exists()  # the parent was never attached
    assert [p for p in registry.directory().iterdir()] == [], said


def test_uvicorn_workers_run_armed_each_on_its_own(tmp_path: Path) -> None:
    server = ["-m", "uvicorn", "app:app", "--workers", "2", "--uds", str(tmp_path / "app.sock")]
    _armed_workers(tmp_path, server, "process")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="gunicorn forks its workers")
def test_gunicorn_uvicorn_workers_run_armed_each_on_its_own(tmp_path: Path) -> None:
    sock = tmp_path / "app.sock"
    server = ["-m", "gunicorn", "app:app", "-k", "uvicorn.workers.UvicornWorker", "-w", "2"]
    server += ["--bind", f"unix:{sock}"]
    _armed_workers(tmp_path, server, "fork")
