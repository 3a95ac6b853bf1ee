"""The table report's stuck tasks: each waiting task, what it waits on, who holds it, where,
and the task that made it, bounded."""

from __future__ import annotations

import dataclasses

from asyncflow.render.report import render_table
from asyncflow.schema import (
    AwaitFrame,
    FuturesDocument,
    GraphCycle,
    GraphDocument,
    GraphEdge,
    GraphNode,
    ProfilerStatus,
    Snapshot,
    TaskEntry,
    TasksDocument,
)


def _at(line: int, function: str = "f") -> AwaitFrame:
    return AwaitFrame("app.py", line, function)


def _task(name: str, coroutine: str, line: int, stuck: bool = False) -> GraphNode:
    return GraphNode(f"task:{name}", "task", name, "waiting", coroutine, _at(line), stuck)


def _entry(name: str, coroutine: str, parent: str | None, awaiters: list[str]) -> TaskEntry:
    return TaskEntry(
        name, 1, "waiting", coroutine, None, None, None, None, [], None,
        awaiters=awaiters, parent=parent,
    )  # fmt: skip


def _hang() -> Snapshot:
    """A deadlock (two transfers), 20 workers on an event nobody sets (made and gathered by
    `spawn`), a producer on a full queue whose consumer died, and main asleep."""
    workers = [f"Task-{i}" for i in range(10, 30)]
    nodes = [
        _task("Task-2", "transfer", 11, stuck=True),
        GraphNode("resource:2", "lock", "app.py:6 #2"),
        _task("Task-3", "transfer", 11, stuck=True),
        GraphNode("resource:1", "lock", "app.py:6 #1"),
        _task("Task-1", "main", 47),
        GraphNode("sleep:sleep (3.6e+03 s left)", "sleep", "sleep (3.6e+03 s left)"),
        _task("Task-4", "spawn", 19),
        *(_task(w, "worker", 15) for w in workers),
        GraphNode("resource:3", "event", "app.py:40"),
        _task("Task-6", "produce", 27),
        GraphNode("channel:1:put", "queue_put", "app.py:42"),
    ]
    edges = [
        GraphEdge("task:Task-2", "resource:2", "waits", _at(11)),
        GraphEdge("resource:2", "task:Task-3", "held_by", _at(9), 1_500_000_000),
        GraphEdge("task:Task-3", "resource:1", "waits", _at(11)),
        GraphEdge("resource:1", "task:Task-2", "held_by", _at(9), 1_500_000_000),
        GraphEdge("task:Task-1", "sleep:sleep (3.6e+03 s left)", "waits", _at(47)),
        *(GraphEdge("task:Task-4", f"task:{w}", "awaits", _at(19)) for w in workers),
        *(GraphEdge(f"task:{w}", "resource:3", "waits", _at(15)) for w in workers),
        GraphEdge("task:Task-6", "channel:1:put", "waits", _at(27)),
    ]
    cycle = GraphCycle(
        ["task:Task-2", "resource:2", "task:Task-3", "resource:1"], ["Task-2", "Task-3"]
    )
    graph = GraphDocument(1, True, nodes, edges, [cycle])
    tasks = [
        _entry("Task-1", "main", None, []),
        _entry("Task-2", "transfer", "Task-1", []),
        _entry("Task-3", "transfer", "Task-1", []),
        _entry("Task-4", "spawn", "Task-1", []),
        _entry("Task-6", "produce", "Task-1", []),
        *(_entry(w, "worker", "Task-4", ["Task-4"]) for w in workers),
    ]
    status = ProfilerStatus(
        1, "svc", "0", 1, "3.11", 2_000_000_000, True, 5, 3, 0, None, 2, 0, 0, 0
    )
    return Snapshot(
        1, status, FuturesDocument(1, 0, 0, 0, []), graph=graph,
        tasks=TasksDocument(1, len(tasks), True, tasks, []),
    )  # fmt: skip


def _section(text: str, heading: str) -> list[str]:
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(heading))
    end = next((i for i in range(at + 1, len(lines)) if not lines[i].startswith("  ")), None)
    return lines[at : end if end is not None else len(lines)]


def test_stuck_tasks_say_what_they_wait_on_who_holds_it_where_and_who_made_them() -> None:
    text = render_table(_hang(), (50.0,), limit=10)
    assert _section(text, "stuck tasks") == [
        "stuck tasks (2, in 1 deadlock)",
        "  Task-2 (transfer) waits at app.py:11 on lock app.py:6 #2, held by Task-3 (took it at"
        " app.py:9, 1.5 s ago); made by Task-1",
        "  Task-3 (transfer) waits at app.py:11 on lock app.py:6 #1, held by Task-2 (took it at"
        " app.py:9, 1.5 s ago); made by Task-1",
    ]


def test_other_waiting_tasks_are_listed_grouped_most_first_and_sleepers_left_out() -> None:
    text = render_table(_hang(), (50.0,), limit=10)
    assert _section(text, "waiting tasks") == [
        "waiting tasks (22 more, not stuck: something alive may still release them)",
        "  20 tasks (worker) wait at app.py:15 on event app.py:40; made and awaited by Task-4:"
        " Task-10, Task-11, Task-12 and 17 more",
        "  Task-4 (spawn) waits at app.py:19 for 20 tasks: Task-10, Task-11, Task-12 and 17 more;"
        " made by Task-1",
        "  Task-6 (produce) waits at app.py:27 to put into full queue app.py:42, which no live task"
        " drains; made by Task-1",
    ]
    assert "Task-1 (main)" not in text  # asleep: a timer ends its wait


def test_the_lists_are_bounded_by_the_limit() -> None:
    text = render_table(_hang(), (50.0,), limit=1)
    assert _section(text, "stuck tasks")[1:] == [
        "  Task-2 (transfer) waits at app.py:11 on lock app.py:6 #2, held by Task-3 (took it at"
        " app.py:9, 1.5 s ago); made by Task-1",
        "  … 1 more stuck task (limit=1; limit=0 shows all)",
    ]
    waiting = _section(text, "waiting tasks")
    assert len(waiting) == 3 and waiting[1].startswith("  20 tasks (worker)")
    assert waiting[2] == "  … 2 more groups (limit=1; limit=0 shows all)"


def test_a_wait_asyncflow_does_not_track_is_named_by_its_kind_and_description() -> None:
    snap = _hang()
    assert snap.graph is not None
    untracked = GraphNode("event:wait for event", "event", "wait for event")
    nodes = [n for n in snap.graph.nodes if n.id != "resource:3"] + [untracked]
    edges = [
        GraphEdge(e.source, untracked.id, e.relation, e.where) if e.target == "resource:3" else e
        for e in snap.graph.edges
    ]
    graph = GraphDocument(1, True, nodes, edges, snap.graph.cycles)
    text = render_table(Snapshot(1, snap.status, snap.futures, graph=graph), (50.0,), 10)
    # without the tasks document, the task tree is what the graph says: who awaits them
    assert (
        "  20 tasks (worker) wait at app.py:15 on event (wait for event); awaited by Task-4:"
        " Task-10, Task-11, Task-12 and 17 more\n" in text
    )


def test_a_task_says_the_line_it_was_made_on() -> None:
    snapshot = _hang()
    assert snapshot.tasks is not None
    made_at = {
        "Task-2": AwaitFrame("app.py", 50, "main"),  # its parent known: by whom, and where
        "Task-10": AwaitFrame("app.py", 33, "spawn"),  # made and awaited by its parent
        "Task-6": AwaitFrame("app.py", 52, "main"),
    }
    tasks = [
        dataclasses.replace(t, created_at=made_at.get(t.name), parent=None)
        if t.name == "Task-6"
        else dataclasses.replace(t, created_at=made_at.get(t.name, t.created_at))
        for t in snapshot.tasks.tasks
    ]
    snapshot = dataclasses.replace(snapshot, tasks=dataclasses.replace(snapshot.tasks, tasks=tasks))
    text = render_table(snapshot, (50.0,), limit=10)
    assert _section(text, "stuck tasks")[1].endswith("; made by Task-1 at app.py:50")
    waiting = _section(text, "waiting tasks")
    # the group splits: Task-10 was made on its own line, the other 19 on no known line
    assert (
        "  Task-10 (worker) waits at app.py:15 on event app.py:40; made at app.py:33 and"
        " awaited by Task-4" in waiting
    )
    assert waiting[-1].endswith("drains; made at app.py:52")  # its parent not known


def test_tasks_past_those_a_snapshot_lists_stay_in_their_group() -> None:
    """A snapshot lists 200 tasks; the graph has them all. The tasks past the list take their
    place in the task tree from their graph nodes (and the tasks the graph says await them),
    so that 200 workers made on one line are one group, not 196 with their maker and 4
    without."""
    snap = _hang()
    assert snap.graph is not None and snap.tasks is not None
    nodes = [
        dataclasses.replace(n, parent="Task-4") if n.coroutine == "worker" else n
        for n in snap.graph.nodes
    ]
    listed = [t for t in snap.tasks.tasks if t.name not in {f"Task-{i}" for i in range(25, 30)}]
    snap = dataclasses.replace(
        snap,
        graph=dataclasses.replace(snap.graph, nodes=nodes),
        tasks=dataclasses.replace(snap.tasks, tasks=listed),
    )
    waiting = _section(render_table(snap, (50.0,), limit=10), "waiting tasks")
    assert waiting[1] == (
        "  20 tasks (worker) wait at app.py:15 on event app.py:40; made and awaited by Task-4:"
        " Task-10, Task-11, Task-12 and 17 more"
    )
