"""Healthy services stay quiet: a FastAPI + httpx + aiosqlite service under uvicorn, and an
aiohttp service with its own client session, run under ``asyncflow run`` with no code change and
a few hundred requests, get at most two warnings, none of them wrong.

Each service calls an upstream served by a plain uvicorn (a process of its own, never profiled)
on a unix socket; the load comes from this process, over the service's own unix socket.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest

from tests.support.commands import write

pytestmark = pytest.mark.slow

UPSTREAM = """
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b'{"price": 42}'})
"""

FASTAPI_APP = """
import asyncio
import contextlib
import os

import aiosqlite
import httpx
from fastapi import FastAPI


@contextlib.asynccontextmanager
async def lifespan(app):
    app.state.db = await aiosqlite.connect(os.environ["APP_DB"])
    await app.state.db.execute(
        "CREATE TABLE IF NOT EXISTS items (id INTEGER PRIMARY KEY, name TEXT)"
    )
    await app.state.db.executemany(
        "INSERT OR REPLACE INTO items VALUES (?, ?)", [(i, f"item{i}") for i in range(100)]
    )
    await app.state.db.commit()
    transport = httpx.AsyncHTTPTransport(uds=os.environ["APP_UPSTREAM"])
    app.state.http = httpx.AsyncClient(transport=transport, base_url="http://upstream")
    app.state.pool = asyncio.Semaphore(8)
    yield
    await app.state.http.aclose()
    await app.state.db.close()


app = FastAPI(lifespan=lifespan)


@app.get("/items/{item_id}")
async def item(item_id: int):
    async with app.state.pool:
        query = "SELECT name FROM items WHERE id = ?"
        async with app.state.db.execute(query, (item_id % 100,)) as cursor:
            row = await cursor.fetchone()
    price = (await app.state.http.get("/price")).json()["price"]
    return {"id": item_id, "name": row[0], "price": price}
"""

AIOHTTP_APP = """
import asyncio
import os

import aiohttp
from aiohttp import web


async def session(app):
    connector = aiohttp.UnixConnector(path=os.environ["APP_UPSTREAM"])
    app["http"] = aiohttp.ClientSession(connector=connector)
    app["pool"] = asyncio.Semaphore(8)
    yield
    await app["http"].close()


async def item(request):
    async with request.app["pool"]:
        async with request.app["http"].get("http://upstream/price") as response:
            price = (await response.json())["price"]
    return web.json_response({"id": int(request.match_info["id"]), "price": price})


app = web.Application()
app.cleanup_ctx.append(session)
app.router.add_get("/items/{id}", item)
web.run_app(app, path=os.environ["APP_SOCK"], print=None, access_log=None)
"""

UVICORN = [sys.executable, "-m", "uvicorn"]
RUN = [sys.executable, "-m", "asyncflow", "run"]
REQUESTS = 400
CLIENTS = 20


async def _wait_for(path: Path, process: subprocess.Popen[bytes]) -> None:
    """Until the server listens on ``path`` (bounded: 30 s), or fails if it exits first."""
    with anyio.fail_after(30):
        while not path.exists():
            if process.poll() is not None:
                raise AssertionError(f"{process.args!r} exited with {process.returncode}")
            await anyio.sleep(0.02)


@pytest.fixture
async def upstream(tmp_path: Path) -> AsyncIterator[Path]:
    """A plain uvicorn (not profiled) answering every GET on a unix socket."""
    write(tmp_path / "upstream.py", UPSTREAM)
    sock = tmp_path / "up.sock"
    process = subprocess.Popen(
        [*UVICORN, "upstream:app", "--uds", str(sock), "--log-level", "warning"],
        cwd=tmp_path,
    )
    try:
        await _wait_for(sock, process)
        yield sock
    finally:
        process.terminate()
        process.wait(timeout=30)


async def _load(sock: Path) -> None:
    """REQUESTS GETs, CLIENTS at a time, each answered 200."""
    transport = httpx.AsyncHTTPTransport(uds=str(sock))
    async with httpx.AsyncClient(transport=transport, base_url="http://service") as client:
        limiter = anyio.Semaphore(CLIENTS)

        async def one(i: int) -> None:
            async with limiter:
                response = await client.get(f"/items/{i}")
                assert response.status_code == 200, response.text

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for i in range(REQUESTS):
                    tg.start_soon(one, i)


async def _profiled(
    tmp_path: Path, program: list[str], sock: Path, env: dict[str, str], load: bool = True
) -> dict[str, Any]:
    """Run ``program`` under ``asyncflow run``, load it (unless not ``load``: it listens, no
    request comes), stop it as a user would (Ctrl-C), and return its JSON exit report."""
    report = tmp_path / "report.json"
    # as a user runs it (the suite's sampling left out), on the hot path the suite runs on
    # (ASYNCFLOW_NO_EXTENSIONS), registered in the test's runtime directory
    clean = {k: v for k, v in os.environ.items() if k != "ASYNCFLOW_SAMPLING"}
    process = subprocess.Popen(
        [*RUN, "--format", "json", "--output", str(report), "--port", "off", *program],
        cwd=tmp_path,
        env={**clean, **env},
        stderr=subprocess.PIPE,
    )
    try:
        await _wait_for(sock, process)
        if load:
            await _load(sock)
    finally:
        process.send_signal(signal.SIGINT)
        _, stderr = await anyio.to_thread.run_sync(lambda: process.communicate(timeout=60))
        print(stderr.decode(errors="replace"))  # shown when the test fails
    assert process.returncode == 0, stderr.decode()
    return dict(orjson.loads(report.read_bytes()))


def _warnings(report: dict[str, Any]) -> list[dict[str, Any]]:
    return list(report["warnings"])


def _shown(warnings: list[dict[str, Any]]) -> str:
    return "\n".join(f"{w['severity']} {w['kind']}: {w['message']}" for w in warnings)


#: the kinds that judge the loop's time (blocked loops, long polls, CPU work): on a machine
#: whose cores other processes share, a service's loop can really wait that long for the CPU,
#: and tests/views judges those kinds with a fake clock
LOOP_TIME = {"loop-blocked", "long-poll", "cpu-bound", "off-cpu-poll"}


def _precise(warnings: list[dict[str, Any]]) -> None:
    """At most two warnings (the loop's time aside), none that blames asyncflow or a launcher,
    and none of the kinds a healthy service must not get: its locks, pools and queues are
    fine."""
    assert len([w for w in warnings if w["kind"] not in LOOP_TIME]) <= 2, _shown(warnings)
    wrong = {
        "lock-contention",
        "permits-leaked",
        "starved",
        "bottleneck",
        "channel-unread",
        "messages-lost",
        "event-never-set",
        "task-leak",
        "cancellation-storm",
        "executor-saturated",
        # the stuck and waste findings: a healthy service has none of them
        "deadlock",
        "dead-consumer",
        "dead-producer",
        "unbounded-growth",
        "busy-wait",
        "wakeup-storm",
        "tail-latency",
        "never-retrieved",
    }
    assert not [w for w in warnings if w["kind"] in wrong], _shown(warnings)
    for w in warnings:
        where = w["subject"]["location"]
        if where is not None:
            assert "asyncflow" not in Path(where["file"]).parts, _shown(warnings)
            assert Path(where["file"]).name != "asyncflow", _shown(warnings)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
async def test_a_healthy_fastapi_service_gets_at_most_two_warnings(
    tmp_path: Path, upstream: Path, loop: str
) -> None:
    write(tmp_path / "app.py", FASTAPI_APP)
    sock = tmp_path / "app.sock"
    report = await _profiled(
        tmp_path,
        # (a keep-alive longer than the test: uvicorn's 5 s could close a connection the client
        # was reusing just as it sent, while a loaded machine stalled the loop)
        [
            *("-m", "uvicorn", "app:app", "--loop", loop, "--uds", str(sock)),
            *("--log-level", "warning", "--timeout-keep-alive", "120"),
        ],
        sock,
        {"APP_DB": str(tmp_path / "db.sqlite"), "APP_UPSTREAM": str(upstream)},
    )
    # the service was seen: its request tasks, its pool and httpcore's locks
    labels = {f["label"] for f in report["futures"]["futures"]}
    assert "RequestResponseCycle.run_asgi" in labels, labels
    kinds = {r["kind"] for r in report["resources"]["resources"]}
    assert {"asyncio.Semaphore", "anyio.Lock"} <= kinds, kinds
    _precise(_warnings(report))


async def test_a_healthy_aiohttp_service_gets_at_most_two_warnings(
    tmp_path: Path, upstream: Path
) -> None:
    write(tmp_path / "aio_app.py", AIOHTTP_APP)
    sock = tmp_path / "app.sock"
    report = await _profiled(
        tmp_path,
        ["aio_app.py"],
        sock,
        {"APP_SOCK": str(sock), "APP_UPSTREAM": str(upstream)},
    )
    labels = {f["label"] for f in report["futures"]["futures"]}
    assert labels & {"RequestHandler._handle_request", "item"}, labels
    _precise(_warnings(report))


#: a service whose lifespan loads a certificate store, 300 ms on its loop, before it listens
STARTING_APP = """
import contextlib
import time

from fastapi import FastAPI


@contextlib.asynccontextmanager
async def lifespan(app):
    time.sleep(0.3)  # a certificate store, read synchronously at start-up
    yield


app = FastAPI(lifespan=lifespan)


@app.get("/health")
async def health():
    return {"ok": True}
"""


async def test_a_service_no_request_came_to_says_its_start_up_block_as_info(
    tmp_path: Path,
) -> None:
    """A worker that the other workers' requests all went to, or a service started and
    stopped unused: its start-up's block held no request up, and says so as info, as it does in
    a worker that served; the report lists the web framework it serves with."""
    write(tmp_path / "app.py", STARTING_APP)
    sock = tmp_path / "app.sock"
    program = ["-m", "uvicorn", "app:app", "--loop", "uvloop", "--uds", str(sock)]
    report = await _profiled(tmp_path, [*program, "--log-level", "warning"], sock, {}, load=False)
    assert report["status"]["serving"] == ["starlette"], report["status"]
    warnings = _warnings(report)
    # (on a loaded machine uvicorn's import of the app can block the loop long enough to be a
    # line of its own: an import, info too)
    (blocked,) = [
        w for w in warnings if w["kind"] == "loop-blocked" and "`time.sleep(0.3)`" in w["message"]
    ]
    assert blocked["severity"] == "info", _shown(warnings)
    assert blocked["message"].endswith("no request yet: no request waited"), _shown(warnings)
    assert not [w for w in warnings if w["severity"] != "info"], _shown(warnings)
