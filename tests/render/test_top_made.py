"""``asyncflow top`` says where each task was made (``created_at``) as the report does: in the
tasks view, the graph view's rows and detail, and the task tree."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from asyncflow import schema
from asyncflow.render import top

FRAME = schema.AwaitFrame("/srv/app/worker.py", 9, "work")
MADE = schema.AwaitFrame("/srv/app/main.py", 38, "main")


def _task(name: str, parent: str | None = None, **fields: Any) -> schema.TaskEntry:
    entry = schema.TaskEntry(
        name, 1, "waiting", "work", None, None, None, None, [FRAME], None, FRAME, parent=parent
    )
    return replace(entry, **fields)


def _columns(view: str, entry: object) -> dict[str, str]:
    """Each column of a view by name, as the cell shows ``entry``."""
    (found,) = [v for v in top.VIEWS if v.name == view]
    return {c.name: c.cell(top.Row(entry)) for c in found.columns}


def test_the_tasks_view_says_where_and_by_whom_each_task_was_made() -> None:
    made = _task("Task-7", "Task-1", created_at=MADE, awaiters=["Task-1"])
    assert _columns("tasks", made)["made"] == "main.py:38"
    assert _columns("tasks", _task("Task-8"))["made"] == "-"
    lines = top._chain_lines(made, None)  # type: ignore[arg-type]
    assert "made by Task-1 at main.py:38 and awaited by Task-1" in lines
    orphan = top._chain_lines(_task("Task-9", created_at=MADE), None)  # type: ignore[arg-type]
    assert "made at main.py:38" in orphan
    # nothing known: no line about it
    assert not [x for x in top._chain_lines(_task("T"), None) if x.startswith("made")]  # type: ignore[arg-type]


def test_the_task_tree_says_the_line_each_task_was_made_on() -> None:
    tasks = [_task("Task-1", created_at=None)]
    tasks += [_task("Task-2", "Task-1", created_at=MADE, awaiters=["Task-1"])]
    tasks += [_task(f"W{n}", "Task-1", coroutine="worker", created_at=MADE) for n in range(5)]
    document = schema.TasksDocument(schema.SCHEMA, len(tasks), True, tasks, [])
    lines = top._tree_lines(document, {})
    assert lines[1] == "Task-1 work · waiting", lines
    assert lines[2] == "├─ Task-2 work · waiting · made at main.py:38", lines
    # a pool made on one line says it once
    assert lines[3] == "└─ 5 tasks of worker (W0 … W4) · made at main.py:38", lines


def test_the_graph_view_says_where_a_waiting_task_was_made() -> None:
    graph = schema.GraphDocument(
        schema.SCHEMA,
        True,
        [
            schema.GraphNode("task:Task-2", "task", "Task-2", "waiting", "work"),
            schema.GraphNode("resource:1", "event", "app.py:3"),
        ],
        [schema.GraphEdge("task:Task-2", "resource:1", "waits")],
        [],
    )
    tasks = [_task("Task-1"), _task("Task-2", "Task-1", created_at=MADE, awaiters=["Task-1"])]
    document = schema.TasksDocument(schema.SCHEMA, 2, True, tasks, [])
    (waiter,) = top._waiters(top.WaitGraph(graph, document))
    assert _columns("graph", waiter)["parent"] == "Task-1"
    whole = top._waiter_lines(waiter, None)  # type: ignore[arg-type]
    assert "made by Task-1 at main.py:38 and awaited by Task-1" in whole, whole


def _future(raised: int, errors: dict[str, int]) -> schema.FutureEntry:
    return schema.FutureEntry(
        id=1,
        label="fetch",
        source="m:fetch",
        location=schema.Location("m.py", 1),
        tracked_by="decorator",
        call_count=100,
        calls=schema.CallStates(0, 0, 0, 100, 0),
        outcomes=schema.Outcomes(100 - raised, raised, 0, 0, 0),
        total_polls=200,
        busy_ns=1,
        idle_ns=1,
        max_poll_duration_ns=1,
        poll_duration_ns={},
        call_duration_ns={},
        errors=errors,
    )


def test_the_futures_view_names_what_the_calls_raised_over_the_run() -> None:
    """The ended calls' raised column names the run's most frequent exception type."""
    errors = {"TimeoutError": 20, "ValueError": 5}
    assert _columns("futures", _future(25, errors))["raised"] == "25 TimeoutError…"
    assert _columns("futures", _future(3, {"KeyError": 3}))["raised"] == "3 KeyError"
    assert _columns("futures", _future(0, {}))["raised"] == "0"
    assert _columns("futures", _future(4, {}))["raised"] == "4"  # an older profiler's
