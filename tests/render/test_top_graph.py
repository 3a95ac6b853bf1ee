"""``asyncflow top``'s graph view: the wait-for graph, its deadlocks and the task tree."""

from __future__ import annotations

import asyncio
import gc
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from aiohttp import web

import asyncflow
from asyncflow import schema
from asyncflow.render import top
from asyncflow.render.top import TopApp
from tests.render.test_top import (
    NEVER,
    SIZE,
    detail,
    fake_endpoint,
    fake_status,
    row,
    status,
    until,
)


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return "asyncio", {"debug": False}  # textual under asyncio's debug mode is 3x slower


@pytest.fixture(autouse=True)
def _no_primitives_of_earlier_tests() -> None:
    gc.collect()  # an earlier test's lock, held when it was left, is no holder here


@asynccontextmanager
async def deadlocked() -> AsyncIterator[tuple[asyncio.Lock, asyncio.Lock]]:
    """Two transfers that take two locks (made on one line) in opposite order, started by a
    ``bank`` task: each holds the lock the other waits for."""
    first, second = (asyncflow.instrument_lock(asyncio.Lock(), name="accounts") for _ in "12")
    both = asyncio.Event()

    async def transfer(a: asyncio.Lock, b: asyncio.Lock) -> None:
        async with a:
            await both.wait()
            async with b:
                pass

    async def bank() -> None:
        await asyncio.gather(
            asyncio.create_task(transfer(first, second), name="one"),  # MADE_LINE
            asyncio.create_task(transfer(second, first), name="two"),
        )

    tasks = asyncflow.instrument_tasks()  # the task tree: who made whom
    try:
        started = asyncio.create_task(bank(), name="bank")
        with anyio.fail_after(5):
            while not (first.locked() and second.locked()):
                await asyncio.sleep(0)
    finally:
        tasks.undo()  # top's own tasks (textual's, aiohttp's) stay untracked
    both.set()
    with anyio.fail_after(5):
        while not (first._waiters and second._waiters):
            await asyncio.sleep(0)
    try:
        yield first, second
    finally:
        started.cancel()
        await asyncio.gather(started, return_exceptions=True)


#: the line ``deadlocked`` makes its first transfer on (the task tree's creation line)
MADE_LINE = next(
    n
    for n, text in enumerate(Path(__file__).read_text().splitlines(), 1)
    if text.endswith("# MADE_LINE")
)


async def test_the_graph_view_marks_a_deadlock_its_tasks_locks_and_tree() -> None:
    with asyncflow.profile("deadlocked", format="none", port=0) as prof:
        async with deadlocked():
            assert prof.url is not None
            app = TopApp(prof.url, interval=NEVER)
            async with app.run_test(size=SIZE) as pilot:
                await pilot.press("g")
                await until(pilot, lambda: {"one", "two"} <= names(app), "the two transfers")
                # deadlocked tasks come first, both marked as in the first deadlock
                assert {r[0].split()[0] for r in app.table_text()[:2]} == {"one", "two"}
                one, two = task_row(app, "one"), task_row(app, "two")
                assert one["task"].endswith(".transfer)")
                assert one["cycle"] == two["cycle"] == "⟳1"
                # each waits on one of the two locks, held by the other task
                assert one["waits"].startswith("lock accounts #")
                assert two["waits"].startswith("lock accounts #")
                assert one["waits"] != two["waits"]
                took = r", test_top_graph\.py:\d+\)"  # how long, where the holder took it
                assert re.fullmatch(rf"held by two \([0-9.]+[µm]?s{took}", one["releaser"]), one
                assert re.fullmatch(rf"held by one \([0-9.]+[µm]?s{took}", two["releaser"]), two
                assert one["where"].startswith("test_top_graph.py:")
                assert one["parent"] == two["parent"] == "bank"
                assert "⟳ 1 DEADLOCK" in status(app)
                below = detail(app).splitlines()
                (said,) = [line for line in below if line.startswith("⟳1 DEADLOCK: ")]
                assert said.count("waits on lock accounts #") == 2
                assert "held by one" in said and "held by two" in said
                assert len(set(re.findall(r"accounts #\d+", said))) == 2  # both locks
                # the task tree: bank above its two transfers, both marked
                at = below.index(next(line for line in below if line.startswith("task tree")))
                tree = below[at + 1 :]
                assert tree[0].startswith("bank ") and "waits on" in tree[0]
                assert {tree[1][:9], tree[2][:9]} == {"├─ one ⟳1", "└─ two ⟳1"}, tree
                assert "waits on lock accounts #" in tree[1]
                made_on = {re.sub(r".* · made at ", "", line) for line in tree[1:3]}
                assert made_on == {f"test_top_graph.py:{MADE_LINE + n}" for n in (0, 1)}, tree
                assert all(len(line) <= SIZE[0] for line in app.screen_text().splitlines())

                # enter: the task whole, with where the other took the lock it waits on
                await pilot.press("enter")
                first = app.table_text()[0][0].split()[0]
                await until(pilot, lambda: detail(app).startswith(f"{first}: "), "its detail")
                whole = detail(app)
                assert "in deadlock ⟳1" in whole and "took it at test_top_graph.py:" in whole
                made = f"made by bank at test_top_graph.py:{MADE_LINE}"  # and the line
                assert made in whole, whole


def names(app: TopApp) -> set[str]:
    """The tasks the graph's rows name."""
    return {r[0].split()[0] for r in app.table_text()}


def task_row(app: TopApp, name: str) -> dict[str, str]:
    """The graph's row of the task called ``name``, by column name as shown."""
    label = next(r[0] for r in app.table_text() if r[0].split()[0] == name)
    return row(app, label)


def fake_tasks(**fields: Any) -> dict[str, Any]:
    """A ``/tasks`` document as JSON: a parent with 40 workers and one odd task."""
    frame = schema.AwaitFrame("app.py", 9, "work")
    event = schema.WaitTarget("event", "event app.py:3", "resource:1", "app.py:3", None, None)

    def task(name: str, parent: str | None, runs: str) -> schema.TaskEntry:
        return schema.TaskEntry(
            name, 1, "waiting", runs, None, None, None, None, [frame], event, frame, parent=parent
        )

    tasks = [task("Task-1", None, "main")]
    tasks += [task(f"Task-{n}", "Task-1", "worker") for n in range(2, 42)]
    tasks += [task("Task-42", "Task-1", "watchdog")]
    document = schema.TasksDocument(schema.SCHEMA, len(tasks), True, tasks, [])
    return {**orjson.loads(schema.dumps(document)), **fields}


async def test_without_graph_top_says_so_shows_the_tree_and_keeps_asking() -> None:
    """An older profiler has no /graph: the status line says so (not as an error), the task
    tree is still drawn from /tasks, and the graph shows once the route answers."""
    status_document = orjson.loads(schema.dumps(replace(fake_status(), name="old")))
    answers: dict[str, tuple[int, Any]] = {
        "/profiler_status": (200, status_document),
        "/warnings": (200, {"schema": schema.SCHEMA, "evaluated_ns": 0, "warnings": []}),
        "/tasks": (200, fake_tasks()),
        "/graph": (404, {"error": {"status": 404, "message": "no route /graph"}}),
    }
    asked: list[str] = []

    async def answer(request: web.Request) -> web.Response:
        asked.append(request.path)
        code, body = answers[request.path]
        return web.json_response(body, status=code)

    async with fake_endpoint(answer) as url:
        app = TopApp(url, interval=NEVER)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("g")
            await until(pilot, lambda: "task tree" in detail(app), "the tree")
            assert "no /graph here (an older asyncflow)" in status(app)
            assert not status(app).startswith("404")  # a note, not an error
            assert app.table_text() == [] and app.is_running
            lines = detail(app).splitlines()
            assert lines[0].startswith("this profiler serves no /graph")
            assert lines[1] == "task tree (parent → children), 42 tasks:"
            # the 40 workers share a line; the odd one has its own
            assert lines[2].startswith("Task-1 main · waits on event app.py:3")
            assert "├─ Task-42 watchdog" in lines[3] or "Task-42" in lines[4]
            assert any("40 tasks of worker (Task-2 … Task-41)" in line for line in lines)
            before = asked.count("/graph")
            await app.refresh_now()
            assert asked.count("/graph") == before + 1  # it keeps asking
            # the profiler is upgraded: the graph shows at the next refresh
            graph = schema.GraphDocument(
                schema.SCHEMA,
                True,
                [
                    schema.GraphNode("task:Task-2", "task", "Task-2", "waiting", "worker"),
                    schema.GraphNode("resource:1", "event", "app.py:3"),
                ],
                [schema.GraphEdge("task:Task-2", "resource:1", "waits")],
                [],
            )
            answers["/graph"] = (200, orjson.loads(schema.dumps(graph)))
            await until(pilot, lambda: app.table_text(), "the graph's row")
            assert "no /graph" not in status(app)
            assert row(app, "Task-2 (worker)")["waits"] == "event app.py:3"
            assert row(app, "Task-2 (worker)")["releaser"] == "-"


def test_the_task_tree_stays_within_its_lines() -> None:
    """A deep chain and a wide pool: the tree never takes more than its lines, and says how
    many tasks it left out."""
    frame = schema.AwaitFrame("app.py", 9, "work")
    chain = [
        schema.TaskEntry(f"T{n}", 1, "scheduled", "step", None, None, None, None, [frame], None)
        for n in range(300)
    ]
    chain = [replace(t, parent=f"T{n - 1}" if n else None) for n, t in enumerate(chain)]
    document = schema.TasksDocument(schema.SCHEMA, 5000, True, chain, [])
    lines = top._tree_lines(document, {})
    assert len(lines) == top.TREE_LINES + 2
    assert lines[0] == "task tree (parent → children), 5,000 tasks, the first 300 read:"
    assert lines[-1] == f"… and {5000 - top.TREE_LINES:,} more"
    assert lines[2] == "└─ T1 step · scheduled"


def test_a_queues_consumers_are_named_once() -> None:
    """A full queue's consumers are one phrase, each task once, however many edges name it."""
    put = "channel:1:put"
    graph = schema.GraphDocument(
        schema.SCHEMA,
        True,
        [
            schema.GraphNode("task:P", "task", "P", "waiting", "produce"),
            schema.GraphNode(put, "queue_put", "jobs"),
            schema.GraphNode("task:C1", "task", "C1", "running", "consume"),
            schema.GraphNode("task:C2", "task", "C2", "running", "consume"),
        ],
        [
            schema.GraphEdge("task:P", put, "waits"),
            schema.GraphEdge(put, "task:C1", "received_by"),
            schema.GraphEdge(put, "task:C1", "received_by"),
            schema.GraphEdge(put, "task:C2", "received_by"),
        ],
        [],
    )
    tasks = schema.TasksDocument(schema.SCHEMA, 0, True, [], [])
    (waiter,) = top._waiters(top.WaitGraph(graph, tasks))
    assert waiter.waits_on == "put into queue jobs"
    assert waiter.releasers == waiter.short == ("drained by C1, C2",)
