"""Worker processes of real servers are profiled, each on its own, under ``asyncflow run``.

uvicorn's ``--workers 2`` (multiprocessing's spawn) and gunicorn's uvicorn workers (``os.fork``)
serve on a unix socket; requests come over it with httpx, the server is stopped with SIGTERM as
a supervisor stops it. While they run, ``asyncflow ps`` lists each worker with its parent and
role; at the end each worker has written its own report, which names the app's own tasks, and
the parent's says where those reports went.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.support.commands import ASYNCFLOW, asyncflow_cmd, write

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform == "win32", reason="unix sockets, fork"),
]

#: an ASGI app that answers with its worker's pid, after a task of its own (``audit``)
APP = """
import asyncio
import os


async def audit(path):
    await asyncio.sleep(0)
    return path


class App:
    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        await asyncio.create_task(audit(scope["path"]))
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": str(os.getpid()).encode()})


app = App()
"""

#: how long a server may take to start its workers or to stop, on a loaded machine
DEADLINE = 60.0


def _until(what: str, check: Any, deadline: float = DEADLINE) -> Any:
    """Poll ``check()`` until it returns something true, for at most ``deadline`` seconds."""
    end = time.monotonic() + deadline
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < end, f"no {what} within {deadline} s"
        time.sleep(0.05)


def _ps() -> list[dict[str, Any]]:
    done = asyncflow_cmd("ps", "--json")
    assert done.returncode == 0, done.stderr
    listed: list[dict[str, Any]] = orjson.loads(done.stdout)
    return listed


def _labels(report: Path) -> set[str]:
    """The futures a JSON report shows calls of."""
    document = orjson.loads(report.read_bytes())
    return {e["label"] for e in document["futures"]["futures"] if e["call_count"]}


def _serve_and_stop(
    tmp_path: Path, server: list[str], ctrl_c: bool = False
) -> tuple[list[dict[str, Any]], set[int], str]:
    """Run ``asyncflow run`` with ``server`` (which serves ``app:app`` on ``tmp_path/app.sock``)
    until two workers are registered and two have answered, then SIGTERM it (or, ``ctrl_c``,
    SIGINT its process group, as Ctrl-C at a terminal does); returns what ``asyncflow ps``
    listed meanwhile, the pids that answered and the run's standard error."""
    write(tmp_path / "app.py", APP)
    sock = tmp_path / "app.sock"
    err = tmp_path / "stderr.txt"
    command = [*ASYNCFLOW, "run", "--format", "json", "--output", str(tmp_path / "report.json")]
    with err.open("w") as stderr:
        run = subprocess.Popen(
            [*command, *server],
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,  # a process group of its own, for Ctrl-C
        )
    served: set[int] = set()
    try:

        def workers() -> list[dict[str, Any]]:
            listed = _ps()
            return listed if [e for e in listed if e["parent"] is not None][1:] else []

        listed = _until("two workers in asyncflow ps", workers)
        _until("the socket listening", lambda: _listening(sock))
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), timeout=10) as client:

            def both() -> bool:
                for _ in range(20):  # a connection each: the kernel hands it to either worker
                    response = client.get("http://app/items", headers={"Connection": "close"})
                    assert response.status_code == 200
                    served.add(int(response.text))
                return len(served) >= 2

            _until("answers from two workers", both)
        if ctrl_c:
            os.killpg(run.pid, signal.SIGINT)
        else:
            run.send_signal(signal.SIGTERM)
        run.wait(DEADLINE)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    return listed, served, err.read_text()


def _check(
    tmp_path: Path, listed: list[dict[str, Any]], served: set[int], stderr: str, kind: str
) -> None:
    (parent,) = [e for e in listed if e["parent"] is None]
    children = [e for e in listed if e["parent"] is not None]
    assert len(children) == 2
    for entry in children:  # listed with their parent and role
        assert entry["parent"] == parent["pid"]
        assert re.fullmatch(f"{kind}-[0-9]+", entry["role"]), entry
        assert entry["name"] == f"{parent['name']}/{entry['role']}"
    assert len({e["url"] for e in listed}) == 3  # an endpoint each, none on another's port
    # Each worker that answered wrote its own report, which names the app's task. (A worker
    # its server found too slow to answer its health check on a loaded machine is replaced:
    # the reports are matched by pid, not by number.)
    reports = {}
    for report in tmp_path.glob(f"report.{kind}-*.json"):
        reports[orjson.loads(report.read_bytes())["status"]["pid"]] = report
    assert served <= set(reports), (sorted(p.name for p in tmp_path.iterdir()), stderr)
    for pid in served:
        assert "audit" in _labels(reports[pid]), (_labels(reports[pid]), stderr)
        assert str(reports[pid]) in stderr  # the parent says where it went
    assert "audit" not in _labels(tmp_path / "report.json")  # the parent served no request


def test_uvicorn_workers_are_profiled_each_on_its_own(tmp_path: Path) -> None:
    server = ["-m", "uvicorn", "app:app", "--workers", "2", "--loop", "uvloop"]
    server += ["--uds", str(tmp_path / "app.sock")]
    listed, served, stderr = _serve_and_stop(tmp_path, server)
    _check(tmp_path, listed, served, stderr, "process")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="gunicorn forks its workers")
@pytest.mark.parametrize("ctrl_c", [False, True], ids=["sigterm", "ctrl-c"])
def test_gunicorn_uvicorn_workers_are_profiled_each_on_its_own(
    tmp_path: Path, ctrl_c: bool
) -> None:
    sock = tmp_path / "app.sock"
    # the app first: what follows it is the program's (asyncflow run's own options come before)
    server = ["-m", "gunicorn", "app:app", "-k", "uvicorn.workers.UvicornWorker", "-w", "2"]
    server += ["--bind", f"unix:{sock}"]
    # (gunicorn's uvicorn workers set SIGINT to its default action: Ctrl-C reaches them too, and
    # uvicorn raises it again once it has shut down)
    listed, served, stderr = _serve_and_stop(tmp_path, server, ctrl_c)
    _check(tmp_path, listed, served, stderr, "fork")


def test_uvicorns_reloaded_server_is_profiled_each_time(tmp_path: Path) -> None:
    write(tmp_path / "app.py", APP)
    sock = tmp_path / "app.sock"
    report = tmp_path / "report.json"
    command = [*ASYNCFLOW, "run", "--format", "json", "--output", str(report)]
    server = ["-m", "uvicorn", "app:app", "--reload", "--uds", str(sock)]
    err = tmp_path / "stderr.txt"
    with err.open("w") as stderr:
        run = subprocess.Popen(
            [*command, *server], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=stderr
        )
    served: list[int] = []
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), timeout=10) as client:
            for role in ("process-1", "process-2"):  # the server, then the one reloaded

                def serving(role: str = role) -> list[dict[str, Any]]:
                    return [e for e in _ps() if e["role"] == role]

                (entry,) = _until(f"{role} in asyncflow ps", serving)
                # the reloader's socket, which the first server starts listening on, and which
                # outlives it: a request waits in its backlog until the next server accepts it
                _until("the socket listening", lambda: _listening(sock))
                response = client.get("http://app/", headers={"Connection": "close"})
                assert int(response.text) == entry["pid"]
                served.append(entry["pid"])
                write(tmp_path / "app.py", APP + "\n# changed\n")  # uvicorn reloads
        run.send_signal(signal.SIGTERM)
        run.wait(DEADLINE)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    stderr_text = err.read_text()
    for number, pid in enumerate(served, 1):
        child = tmp_path / f"report.process-{number}.json"
        assert orjson.loads(child.read_bytes())["status"]["pid"] == pid, stderr_text
        assert "audit" in _labels(child)
        assert str(child) in stderr_text


def _listening(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:  # not there yet, or not listening yet
            return False
    return True
