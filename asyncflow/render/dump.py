"""``asyncflow dump PID``: every task of a process, what it waits on and who holds that.

The document is the live tasks as ``/tasks`` lists them (all of them walked, up to 10,000)
and the wait-for graph they make (``/graph``), read in the process itself on the control
thread; the text is one line per task, then the report's stuck-tasks section
(:func:`~asyncflow.render.report.stuck_lines`) over the same two documents.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from asyncflow.render.report import _path, counted, stuck_lines
from asyncflow.schema import AwaitFrame, GraphDocument, TaskEntry, TasksDocument

__all__ = ["DumpDocument", "HeldBy", "render_dump"]


@dataclass(frozen=True, slots=True)
class HeldBy:
    """A task that holds a lock, semaphore or condition asyncflow does not instrument (made
    before an attach, or while armed): it took it with ``async with`` and waits in the block."""

    #: the primitive, as a wait on it ends: ``Lock at 0x7f…``
    target: str
    #: the task that holds it
    task: str
    #: its frame inside the ``async with`` block
    where: AwaitFrame


@dataclass(frozen=True, slots=True)
class DumpDocument:
    """``asyncflow dump PID --format json``: a process's tasks and wait-for graph, read once."""

    schema: int
    #: the process dumped
    pid: int
    #: its profile's name (the script's, or what ``arm(name)`` or ``--name`` gave)
    name: str
    #: ``armed`` (no profiler: only what the walk reads from the tasks themselves) or
    #: ``attached`` (a profiler runs: holders of the primitives and queues it instruments)
    state: str
    #: the endpoint's URL while attached; None when armed
    url: str | None
    #: every live task walked (``tasks.walked`` of ``tasks.total``)
    tasks: TasksDocument
    #: the wait-for graph of those tasks: who waits on what, who holds it, the deadlocks
    graph: GraphDocument
    #: who holds the locks, semaphores and conditions asyncflow does not instrument (the
    #: graph knows only the holders of those it does)
    held_by: list[HeldBy] = field(default_factory=list)


def _at(frame: AwaitFrame | None) -> str:
    # (the file as the report says it: relative to the working directory, under it)
    return f" at {_path(frame.file)}:{frame.line}" if frame is not None else ""


def _task_line(task: TaskEntry, held_by: dict[str, list[HeldBy]]) -> str:
    what = ""
    if task.waits_on is not None:
        what = f" on {task.waits_on.description}"
        holders = next((h for t, h in held_by.items() if what.endswith(t)), [])
        if holders:
            what += ", held by " + ", ".join(f"{h.task} ({_at(h.where)[1:]})" for h in holders)
    tracked = f", call {task.call_id} of {task.future_label}" if task.call_id is not None else ""
    return f"  {task.name} ({task.coroutine}{tracked}) {task.state}{_at(task.where)}{what}"


def render_dump(document: DumpDocument, limit: int = 0) -> str:
    """The dump as text: a heading, one line per task (``limit`` of them; 0: all), then the
    waiting tasks as the report's stuck-tasks section says them."""
    tasks = document.tasks
    where = f", endpoint {document.url}" if document.url else ""
    walked = tasks.walked if tasks.walked is not None else len(tasks.tasks)
    of = f" ({walked:,} walked)" if walked < tasks.total else ""
    lines = [
        f"asyncflow: pid {document.pid} ({document.name}), {document.state}{where}: "
        f"{counted(tasks.total, 'live task')}{of}"
    ]
    shown = tasks.tasks if limit == 0 else tasks.tasks[:limit]
    held_by: dict[str, list[HeldBy]] = {}
    for h in document.held_by:
        held_by.setdefault(h.target, []).append(h)
    lines += [_task_line(t, held_by) for t in shown]
    if len(shown) < len(tasks.tasks):
        lines.append(f"  ... and {len(tasks.tasks) - len(shown):,} more (--limit 0 lists all)")
    if not tasks.consistent:
        lines.append("  (a blocked loop was read from outside: its chains may be changing)")
    lines += stuck_lines(document.graph, tasks, limit)
    return "\n".join(lines) + "\n"
