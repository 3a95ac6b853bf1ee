"""uvloop under ``asyncflow run``: a real uvicorn on uvloop (``--loop uvloop``, and ``--loop
auto``, which picks it whenever ``uvicorn[standard]`` is installed) and ``uvloop.run()`` get
their tasks tracked, their loop watched and a planted blocking call named by its line
(issue 26)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.commands import ASYNCFLOW, EXAMPLES, asyncflow_cmd, write

_APP = """\
import time


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["path"] == "/block":
        time.sleep(0.3)  # planted: blocks the loop
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})
"""

_UVLOOP_RUN = """\
import asyncio
import time

import uvloop


async def child(i):
    await asyncio.sleep(0.01)
    return i


async def main():
    print(sum(await asyncio.gather(*(child(i) for i in range(5)))))
    time.sleep(0.3)  # planted


uvloop.run(main())
"""


def _planted(source: str) -> int:
    """The line of the planted ``time.sleep`` in a program's source."""
    (line,) = [n for n, text in enumerate(source.splitlines(), 1) if "# planted" in text]
    return line


def _wait_for_line(log: Path, text: str, process: subprocess.Popen[bytes]) -> None:
    """Until ``text`` is in the log (bounded: 30 s), or the process ended."""
    deadline = time.monotonic() + 30
    while text not in log.read_text(errors="replace"):
        assert process.poll() is None, log.read_text(errors="replace")
        assert time.monotonic() < deadline, f"no {text!r} in 30 s:\n{log.read_text()}"
        time.sleep(0.02)


def _serve_and_report(tmp_path: Path, loop: str) -> tuple[dict[str, Any], str]:
    """uvicorn serving the app on a Unix socket under ``asyncflow run``, asked a few times
    and once at the blocking route, stopped by SIGINT; its JSON report and its stderr."""
    write(tmp_path / "app.py", _APP)
    sock, log, report = tmp_path / "app.sock", tmp_path / "stderr.log", tmp_path / "report.json"
    command = [*ASYNCFLOW, "run", "--format", "json", "--output", str(report)]
    command += ["-m", "uvicorn", "app:app", "--loop", loop, "--uds", str(sock)]
    command += ["--interface", "asgi3"]  # said, not guessed from the app's signature
    with open(log, "wb") as stderr:
        process = subprocess.Popen(command, cwd=tmp_path, stderr=stderr)
    try:
        _wait_for_line(log, "Application startup complete", process)
        transport = httpx.HTTPTransport(uds=str(sock))
        with httpx.Client(transport=transport, base_url="http://app", timeout=10) as client:
            for path in ("/", "/a", "/block", "/b"):
                assert client.get(path).text == "ok"
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return json.loads(report.read_text()), log.read_text()


def _blocked_at(report: dict[str, Any], file: str, line: int) -> list[dict[str, Any]]:
    """The loop's blocked episodes whose stack has ``file:line``."""
    return [
        episode
        for loop in report["loop"]["loops"]
        for episode in loop["episodes"]
        if any(f["file"].endswith(file) and f["line"] == line for f in episode["stack"])
    ]


@pytest.mark.parametrize("loop", ["uvloop", "auto"])
def test_uvicorn_on_uvloop_is_profiled(tmp_path: Path, loop: str) -> None:
    report, stderr = _serve_and_report(tmp_path, loop)
    labels = {f["label"]: f["call_count"] for f in report["futures"]["futures"]}
    # one task per request (uvicorn's cycle), and uvicorn's own serving tasks
    assert labels.get("RequestResponseCycle.run_asgi", 0) >= 4, labels
    assert any(label.startswith("Server.") for label in labels), labels
    (entry,) = report["loop"]["loops"]
    assert entry["heartbeats"] > 0
    assert entry["blocked_count"] >= 1, entry
    assert _blocked_at(report, "app.py", _planted(_APP)), report["loop"]
    assert report["status"]["not_profiled"] == []
    assert "Traceback" not in stderr, stderr


def test_uvloop_run_is_profiled(tmp_path: Path) -> None:
    path = write(tmp_path / "prog.py", _UVLOOP_RUN)
    report = tmp_path / "report.json"
    done = asyncflow_cmd(
        "run", "--format", "json", "--output", str(report), str(path), cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "10\n"
    data = json.loads(report.read_text())
    calls = {f["label"]: f["call_count"] for f in data["futures"]["futures"]}
    assert calls["child"] == 5 and calls["main"] == 1, calls
    assert _blocked_at(data, "prog.py", _planted(_UVLOOP_RUN)), data["loop"]


def test_uvloop_table_report_names_the_loop_and_the_block(tmp_path: Path) -> None:
    path = write(tmp_path / "prog.py", _UVLOOP_RUN)
    done = asyncflow_cmd("run", str(path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "0 futures" not in done.stderr
    assert "no futures were tracked" not in done.stderr
    assert f"prog.py:{_planted(_UVLOOP_RUN)} (main)" in done.stderr, done.stderr


def test_the_uvloop_example_runs_under_run(tmp_path: Path) -> None:
    done = asyncflow_cmd("run", str(EXAMPLES / "uvloop_service.py"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "· 4 futures · 42 calls ·" in done.stderr, done.stderr
    assert "uvloop_service.py:25 (handle)" in done.stderr, done.stderr


_IDLE_OR_BUSY = """\
import sys
import threading
import time

import uvloop

from asyncflow.model.monitor import waiting_in_selector

loop = uvloop.new_event_loop()
running, busy, release = threading.Event(), threading.Event(), threading.Event()
thread = threading.Thread(target=loop.run_forever)
thread.start()
loop.call_soon_threadsafe(running.set)
running.wait(10)


def look():
    return waiting_in_selector(sys._current_frames()[thread.ident], loop, thread.ident)


idle = look()  # in uvloop's compiled wait for I/O, under the frame that called run_forever


def block():
    busy.set()
    release.wait(10)  # the program's code, blocking the loop


loop.call_soon_threadsafe(block)
busy.wait(10)
blocked = look()
release.set()
loop.call_soon_threadsafe(loop.stop)
thread.join(10)
loop.close()
print(idle, blocked)
"""


def test_an_idle_uvloop_loop_is_seen_waiting_and_a_blocked_one_is_not(tmp_path: Path) -> None:
    """uvloop waits for I/O in compiled code, with no frame of its own: the loop monitor must
    tell that wait (a heartbeat late there is a late wake-up: the thread waited for the CPU or
    the GIL) from the program's code blocking the loop, or it blames the line that started the
    loop (``uvloop.run(main())``, ``asyncio.Runner.run``) for blocking it."""
    path = write(tmp_path / "prog.py", _IDLE_OR_BUSY)
    done = asyncflow_cmd("run", str(path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "True False\n"
