"""A row per route on real services, with no code change: a FastAPI app under uvicorn and an
aiohttp app, run under ``asyncflow run``, each with a slow route (it awaits) and a blocking one
(it sleeps on the loop), show the two handlers as two rows with their own figures, beside the
framework's request task that every request used to fold into (issue 26).

Each service listens on a unix socket; the requests come from this process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest

from tests.support.commands import write

#: requests per route, one at a time; each route takes ``WAIT`` seconds
REQUESTS = 10
WAIT = 0.02

FASTAPI_APP = f"""
import asyncio
import time

from fastapi import FastAPI

app = FastAPI()


@app.get("/orders/{{order_id}}")
async def get_order(order_id: int) -> dict[str, int]:
    await asyncio.sleep({WAIT})  # slow: it waits, the loop is free
    return {{"id": order_id}}


@app.get("/report")
async def build_report() -> dict[str, str]:
    time.sleep({WAIT})  # blocking: the loop waits with it
    return {{"report": "ready"}}
"""

AIOHTTP_APP = f"""
import asyncio
import os
import time

from aiohttp import web

routes = web.RouteTableDef()


@routes.get("/orders/{{order_id}}")
async def get_order(request):
    await asyncio.sleep({WAIT})
    return web.json_response({{"id": int(request.match_info["order_id"])}})


@routes.view("/report")
class Report(web.View):
    async def get(self):
        time.sleep({WAIT})
        return web.json_response({{"report": "ready"}})


app = web.Application()
app.add_routes(routes)
web.run_app(app, path=os.environ["APP_SOCK"], print=None, access_log=None)
"""


async def _served(
    tmp_path: Path, program: list[str], sock: Path, options: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Run ``program`` under ``asyncflow run``, send each route ``REQUESTS`` requests, stop it
    as a user would (Ctrl-C) and return its JSON exit report."""
    report = tmp_path / "report.json"
    # the test's own settings aside; the hot path chosen for the suite stays chosen
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("ASYNCFLOW_") or k == "ASYNCFLOW_NO_EXTENSIONS"
    }
    asyncflow = [sys.executable, "-m", "asyncflow", "run", "--port", "off", *options]
    process = subprocess.Popen(
        [*asyncflow, "--format", "json", "--output", str(report), *program],
        cwd=tmp_path,
        env={**clean, "APP_SOCK": str(sock)},
        stderr=subprocess.PIPE,
    )
    try:
        with anyio.fail_after(30):
            while not sock.exists():
                assert process.poll() is None, f"the service exited with {process.returncode}"
                await anyio.sleep(0.02)
        transport = httpx.AsyncHTTPTransport(uds=str(sock))
        async with httpx.AsyncClient(transport=transport, base_url="http://service") as client:
            with anyio.fail_after(60):
                while True:  # until it answers (a route of none of the handlers: no call)
                    try:
                        assert (await client.get("/nowhere")).status_code == 404
                        break
                    except httpx.TransportError:  # (listening, or its workers not yet)
                        await anyio.sleep(0.05)
                for i in range(REQUESTS):
                    assert (await client.get(f"/orders/{i}")).json() == {"id": i}
                    assert (await client.get("/report")).json() == {"report": "ready"}
    finally:
        process.send_signal(signal.SIGINT)
        _, stderr = await anyio.to_thread.run_sync(lambda: process.communicate(timeout=60))
    assert process.returncode == 0, stderr.decode()
    return dict(orjson.loads(report.read_bytes()))


def _two_rows(report: dict[str, Any], slow_label: str, blocking_label: str) -> None:
    """The slow route and the blocking one are two rows of the program's own code, each
    called once per request: the blocking one's time is in its polls, the slow one's between
    them."""
    rows = {f["label"]: f for f in report["futures"]["futures"]}
    slow, blocking = rows[slow_label], rows[blocking_label]
    assert (slow["call_count"], slow["tracked_by"]) == (REQUESTS, "own_code")
    assert (blocking["call_count"], blocking["tracked_by"]) == (REQUESTS, "own_code")
    wait_ns = int(WAIT * 1e9)
    assert blocking["busy_ns"] >= REQUESTS * wait_ns
    assert blocking["poll_duration_ns"]["p50"] >= wait_ns * 0.9  # (bucketed: within 10%)
    # (medians: one stall of a loaded machine in a slow route's poll changes nothing)
    assert slow["idle_ns"] >= REQUESTS * (wait_ns - 1_000_000)
    assert slow["poll_duration_ns"]["p50"] < wait_ns / 2
    assert slow["call_duration_ns"]["p50"] >= wait_ns * 0.9


def _route_rows(
    report: dict[str, Any], slow_route: str, blocking_route: str, unmatched: str
) -> None:
    """Each route is a row of its own, named by its template (never a raw path), with a call per
    request and the request's whole time; the requests no route matched are one row,
    ``unmatched``."""
    rows = {f["label"]: f for f in report["futures"]["futures"]}
    slow, blocking = rows[slow_route], rows[blocking_route]
    assert (slow["call_count"], slow["tracked_by"]) == (REQUESTS, "route")
    assert (blocking["call_count"], blocking["tracked_by"]) == (REQUESTS, "route")
    wait_ns = int(WAIT * 1e9)
    assert blocking["busy_ns"] >= REQUESTS * wait_ns  # its handler's sleep is in its polls
    assert slow["idle_ns"] >= REQUESTS * (wait_ns - 1_000_000)  # its handler's wait between
    assert not any("/orders/" in label and "{" not in label for label in rows)  # no raw path
    # each route knows when its first request came (the requests came one route after another)
    assert 0 < blocking["first_call_ago_ns"] < slow["first_call_ago_ns"], (slow, blocking)
    # (the /nowhere requests, until it answered)
    assert 1 <= rows[unmatched]["call_count"] < REQUESTS, rows[unmatched]


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
async def test_fastapi_under_uvicorn_has_a_row_per_route(tmp_path: Path, loop: str) -> None:
    write(tmp_path / "shop.py", FASTAPI_APP)
    sock = tmp_path / "app.sock"
    command = ["-m", "uvicorn", "shop:app", "--loop", loop, "--uds", str(sock)]
    trace = tmp_path / "trace.json"
    options = ("--trace", str(trace))
    report = await _served(tmp_path, [*command, "--log-level", "warning"], sock, options)
    # (the handlers are rows whatever the loop: they are tracked where they are defined)
    _two_rows(report, "get_order", "build_report")
    _route_rows(report, "GET /orders/{order_id}", "GET /report", "(unmatched)")
    # every request was routed, or found no route: none is left in uvicorn's request task
    rows = {f["label"]: f for f in report["futures"]["futures"]}
    assert rows["RequestResponseCycle.run_asgi"]["call_count"] == 0
    # the trace's polls are named by their routes too
    polls = [e for e in orjson.loads(trace.read_bytes())["traceEvents"] if e.get("cat") == "poll"]
    named = {e["name"] for e in polls}
    assert {"GET /orders/{order_id}", "GET /report", "(unmatched)"} <= named, named
    assert "RequestResponseCycle.run_asgi" not in named
    # uvicorn's own coroutine functions are an installed package's: never the program's own
    own = {f["label"] for f in report["futures"]["futures"] if f["tracked_by"] == "own_code"}
    assert own == {"get_order", "build_report"}


async def test_no_routes_leaves_each_request_in_the_request_task(tmp_path: Path) -> None:
    write(tmp_path / "shop.py", FASTAPI_APP)
    sock = tmp_path / "app.sock"
    command = ["-m", "uvicorn", "shop:app", "--loop", "asyncio", "--uds", str(sock)]
    report = await _served(tmp_path, [*command, "--log-level", "warning"], sock, ("--no-routes",))
    rows = {f["label"]: f for f in report["futures"]["futures"]}
    assert not [label for label, f in rows.items() if f["tracked_by"] == "route"]
    assert rows["RequestResponseCycle.run_asgi"]["call_count"] > 2 * REQUESTS  # (and /nowhere)
    _two_rows(report, "get_order", "build_report")  # the handlers are still rows of their own


async def test_aiohttp_has_a_row_per_route(tmp_path: Path) -> None:
    write(tmp_path / "shop.py", AIOHTTP_APP)
    sock = tmp_path / "app.sock"
    report = await _served(tmp_path, ["shop.py"], sock)
    _two_rows(report, "get_order", "Report.get")
    # (a class-based view answers any method: its route is registered for "*")
    _route_rows(report, "GET /orders/{order_id}", "* /report", "(unmatched)")
    own = {f["label"] for f in report["futures"]["futures"] if f["tracked_by"] == "own_code"}
    assert own == {"get_order", "Report.get"}  # aiohttp's own are an installed package's


async def test_each_uvicorn_worker_has_the_rows_of_its_requests(tmp_path: Path) -> None:
    write(tmp_path / "shop.py", FASTAPI_APP)
    sock = tmp_path / "app.sock"
    command = ["-m", "uvicorn", "shop:app", "--workers", "2", "--uds", str(sock)]
    await _served(tmp_path, [*command, "--log-level", "warning"], sock)
    calls: dict[str, int] = {}
    workers = sorted(tmp_path.glob("report.process-*.json"))
    assert len(workers) == 2, workers
    for path in workers:  # each worker's own report (docs/services.md, Worker processes)
        for row in orjson.loads(path.read_bytes())["futures"]["futures"]:
            if row["tracked_by"] == "own_code":
                calls[row["label"]] = calls.get(row["label"], 0) + row["call_count"]
    assert calls == {"get_order": REQUESTS, "build_report": REQUESTS}


BLOCKING_APP = """
import time

from fastapi import FastAPI

app = FastAPI()


@app.get("/orders/{order_id}")
async def checksum(order_id: int) -> dict[str, int]:
    time.sleep(0.2)  # planted: blocks the loop
    return {"id": order_id}


@app.get("/report")
async def build_report() -> dict[str, str]:
    return {"report": "ready"}
"""


async def test_a_blocked_loop_names_the_handler_and_its_route(tmp_path: Path) -> None:
    """A handler that blocks the loop (the program's own code, tracked) is named with the route
    of the request it served, in the blocking line, its episode and the warning."""
    write(tmp_path / "shop.py", BLOCKING_APP)
    sock = tmp_path / "app.sock"
    command = ["-m", "uvicorn", "shop:app", "--loop", "asyncio", "--uds", str(sock)]
    report = await _served(tmp_path, [*command, "--log-level", "warning"], sock)
    (loop,) = report["loop"]["loops"]
    # (a loaded machine may add a block of its own, at start-up: only the handler's are judged)
    lines = [b["route"] for b in loop["blocking_lines"] if b["label"] == "checksum"]
    assert lines == ["GET /orders/{order_id}"], loop["blocking_lines"]
    episodes = [e for e in loop["episodes"] if e["call"] and e["call"]["label"] == "checksum"]
    assert episodes, loop["episodes"]
    assert {e["route"] for e in episodes} == {"GET /orders/{order_id}"}, episodes
    blocked = [w["message"] for w in report["warnings"] if w["kind"] == "loop-blocked"]
    assert any(
        m.startswith("`checksum` in `GET /orders/{order_id}` blocked the event loop ")
        for m in blocked
    ), blocked
