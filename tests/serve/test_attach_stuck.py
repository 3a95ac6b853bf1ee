"""Attaching to a stuck program: ``/warnings`` names the stuck tasks, though the locks they wait
on were made before the attach (not instrumented): their holders are read from the tasks'
references, as ``asyncflow dump`` reads them."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.serve.test_attach import Done, armed_program, get

#: a handler holds a lock while it waits on an event never set, three clients wait on the lock
#: (the reviewer's program); two tasks each hold a lock the other waits on (a deadlock); all
#: made before anyone attaches
STUCK = """
import asyncio, sys

async def handler(lock, event):
    async with lock:
        await event.wait()

async def client(lock):
    async with lock:
        pass

async def transfer(first, second):
    async with first:
        await asyncio.sleep(0)  # the other takes its first lock meanwhile
        async with second:
            pass

async def main():
    lock, event = asyncio.Lock(), asyncio.Event()
    a, b = asyncio.Lock(), asyncio.Lock()
    tasks = [asyncio.create_task(handler(lock, event), name="handler-0")]
    await asyncio.sleep(0)
    tasks += [asyncio.create_task(client(lock), name=f"client-{i}") for i in range(3)]
    tasks.append(asyncio.create_task(transfer(a, b), name="transfer-ab"))
    tasks.append(asyncio.create_task(transfer(b, a), name="transfer-ba"))
    for _ in range(10):
        await asyncio.sleep(0)
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.readline)
    sys.exit(3)

asyncio.run(main())
"""


def warnings_within(url: str, kinds: set[str], seconds: float) -> dict[str, dict[str, Any]]:
    """``/warnings`` by kind, read again (the collector's watch reads the tasks twice a
    second) until it holds a warning of each of ``kinds``; fails past ``seconds``."""
    began = time.monotonic()
    while True:
        found = {w["kind"]: w for w in get(url + "/warnings")["warnings"]}
        if kinds <= set(found):
            return found
        assert time.monotonic() - began < seconds, f"{kinds - set(found)} not at /warnings: {found}"
        time.sleep(0.1)  # polling a bounded wait, not timing anything


def test_warnings_after_an_attach_name_tasks_stuck_on_locks_made_before_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with armed_program(tmp_path, STUCK) as program:
        done = Done(capsys, "attach", str(program.pid))
        assert done.returncode == 0, done.stderr
        url = done.stdout.strip()
        found = warnings_within(url, {"deadlock", "lock-held-by-waiter"}, 10.0)

        deadlock = found["deadlock"]
        assert deadlock["severity"] == "error"
        assert "`transfer-ab`" in deadlock["message"]
        assert "`transfer-ba`" in deadlock["message"]
        assert "Lock at 0x" in deadlock["message"]

        held = found["lock-held-by-waiter"]
        message = held["message"]
        assert held["severity"] == "info"
        assert "3 tasks" in message and "`client-0`" in message
        assert "held by `handler-0`" in message
        assert "waits at app.py:6 (wait for event)" in message
        assert "made before asyncflow attached" in message
        assert f"asyncflow dump {program.pid}" in held["hint"]
        assert program.end() == 3
