"""The exit report: a snapshot rendered as a table for people, or as JSON for tools."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import TypeVar

from asyncflow.model.waits import is_library_file
from asyncflow.schema import (
    OWN_CODE,
    ChannelEntry,
    ExecutorEntry,
    FlowDocument,
    FutureEntry,
    FutureLogs,
    GraphDocument,
    GraphEdge,
    GraphNode,
    LoopEntry,
    ProfilerStatus,
    ResourceEntry,
    Snapshot,
    StreamEntry,
    TaskEntry,
    TasksDocument,
    ThreadEntry,
    WarningEntry,
    dumps,
)
from asyncflow.stats import percentile_key
from asyncflow.views.graph import resource_names

__all__ = [
    "counted",
    "format_duration",
    "named",
    "printable",
    "render",
    "render_table",
    "stuck_lines",
]

_E = TypeVar("_E")


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and its noun, in the singular for one: ``1 future``, ``2 futures``, ``1,024 calls``.

    Args:
        n: the count.
        noun: the noun in the singular.
        plural: its plural, when it is not ``noun`` + ``s``.
    """
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def format_duration(ns: int | None) -> str:
    """Nanoseconds in a human unit: ``850 ns``, ``12.3 µs``, ``4.56 ms``, ``1.23 s``."""
    if ns is None:
        return "-"
    for scale, unit in ((1_000_000_000, "s"), (1_000_000, "ms"), (1_000, "µs")):
        if ns >= scale:
            value = ns / scale
            return f"{value:.3g} {unit}" if value < 1000 else f"{value:,.0f} {unit}"
    return f"{ns} ns"


def named(label: str, folded: int, gone: bool) -> str:
    """A row's name: an aggregate says how many gone objects it sums, a gone object that it is
    gone, so that neither reads as one living thing."""
    if folded:
        return f"{label} ({folded:,} gone, summed)"
    return f"{label} (gone)" if gone else label


def _call_percentiles(percentiles: tuple[float, ...]) -> tuple[float, ...]:
    """The call durations shown: the lowest and the highest percentile asked for (p50 and
    p99 by default), the middle and the tail of a call's whole life."""
    return tuple(sorted({min(percentiles), max(percentiles)})) if percentiles else ()


def _sched_percentile(percentiles: tuple[float, ...]) -> tuple[float, ...]:
    """The scheduled delay shown: the highest percentile asked for (p99 by default). A high
    one means the loop was too busy to run a woken call promptly."""
    return (max(percentiles),) if percentiles else ()


def scheduled_delay(entry: FutureEntry, key: str) -> str:
    """A future's scheduled delay at ``key``, or ``-`` when no wake-up of it was measured
    (uvloop's loop, or a call awaited inside another), not a misleading 0."""
    if not entry.scheduled_polls:
        return "-"
    return format_duration(entry.scheduled_delay_ns.get(key))


def _row(
    entry: FutureEntry, percentiles: tuple[float, ...], live: bool, sched: tuple[float, ...]
) -> list[str]:
    o = entry.outcomes
    cancelled = o.cancelled + o.closed + o.never_awaited
    return [
        named(entry.label, entry.folded_count, live and not entry.alive),
        f"{entry.call_count:,}",
        f"{o.returned}/{o.raised}/{cancelled}",
        *(
            format_duration(entry.call_duration_ns.get(percentile_key(q)))
            for q in _call_percentiles(percentiles)
        ),
        f"{entry.total_polls:,}",
        format_duration(entry.busy_ns),
        format_duration(entry.idle_ns),
        *(scheduled_delay(entry, percentile_key(q)) for q in sched),
        *(format_duration(entry.poll_duration_ns.get(percentile_key(q))) for q in percentiles),
        format_duration(entry.max_poll_duration_ns),
    ]


#: the exception types named under a future that raised, and the length of the last message
_RAISED_NAMED = 3
_MESSAGE = 60
#: the name a future's exception types past the profiler's bound are counted under
#: (``FutureEntry.errors``)
_OTHER_TYPES = "(other)"


def _raised_line(entry: FutureEntry, logs: FutureLogs | None) -> list[str]:
    """The line under a future whose calls raised: the exception types of the whole run (its
    ``errors``) most first, else those its log of recent calls holds (an older document), and
    the newest one's message from the log."""
    raised = entry.outcomes.raised
    if not raised or (logs is None and not entry.errors):
        return []
    logged = (
        [c.exception for c in logs.calls if c.outcome == "raised" and c.exception] if logs else []
    )
    if entry.errors:
        text = f"{raised:,} raised: {_named_types(entry.errors)}"
    else:
        types: dict[str, int] = {}
        for exc in logged:
            types[exc.type] = types.get(exc.type, 0) + 1
        kept = sum(c.finished_ns is not None for c in logs.calls) if logs else 0
        if not types:
            return [f"  └ {raised:,} raised, none among the last {counted(kept, 'call')} logged"]
        if raised == len(logged):
            text = f"{raised:,} raised: {_named_types(types)}"
        else:  # the log keeps the recent calls only: name what it saw as that
            text = f"{raised:,} raised, {len(logged):,} among the last {kept:,} calls: "
            text += _named_types(types)
    if logged:
        last = logged[0]  # the log lists finished calls newest first
        message = " ".join(last.message.split())  # one line, whatever the program put in it
        if len(message) > _MESSAGE:
            message = message[: _MESSAGE - 1] + "…"
        if message:
            text += f"; last {last.type}: {message}"
    return [f"  └ {text}"]


def _named_types(types: dict[str, int]) -> str:
    """``20 TimeoutError, 5 ValueError``: the most frequent first, the rest counted; the
    calls of the types past the profiler's bound (``(other)``) as calls."""
    other = types.get(_OTHER_TYPES, 0)
    ranked = sorted(
        ((name, n) for name, n in types.items() if name != _OTHER_TYPES), key=lambda kv: -kv[1]
    )  # stable: the newest first on ties, for a log's
    said = ", ".join(f"{n:,} {name}" for name, n in ranked[:_RAISED_NAMED])
    if other:
        rest = other + sum(n for _, n in ranked[_RAISED_NAMED:])
        return said + f" and {rest:,} of other types"
    if len(ranked) > _RAISED_NAMED:
        said += f" and {counted(len(ranked) - _RAISED_NAMED, 'other type')}"
    return said


#: futures never called, named on one line under the table
_NEVER_NAMED = 8


def render_table(snapshot: Snapshot, percentiles: tuple[float, ...], limit: int) -> str:
    """The table report, with a header line: the top ``limit`` futures by busy time and the
    first ``limit`` rows of every other table but the loops' (0 = all)."""
    status = snapshot.status
    # A report taken while the program runs says which objects are gone; one taken at its end
    # (the exit report, where most may be) names only the aggregates of gone ones as such.
    live = status.running
    every = snapshot.futures.futures
    futures = [f for f in every if f.call_count]  # one never called is a name, not a row
    # (the program's own coroutine functions, tracked unasked, are no news when never called:
    # a parent whose workers ran them, an app whose other routes nobody asked for)
    never = [
        named(f.label, f.folded_count, live and not f.alive)
        for f in every
        if not f.call_count and f.tracked_by != OWN_CODE
    ]
    shown = futures if limit == 0 else futures[:limit]
    calls = sum(f.call_count for f in futures)
    header = (
        f"asyncflow · {status.name} · elapsed {format_duration(status.uptime_ns)} · "
        f"{counted(len(every), 'future')} · {counted(calls, 'call')} · "
        f"{counted(status.events_dropped, 'event')} dropped"
    )
    if status.internal_errors:
        header += f" · {counted(status.internal_errors, 'internal error')}"
    if status.accelerated is False:
        header += " · pure-Python hot path"
    if status.unretrieved_dropped:  # never-retrieved's bound: its finding may miss them
        header += (
            f" · {counted(status.unretrieved_dropped, 'raised task')} unjudged "
            "(never-retrieved remembers 1,000 at once)"
        )
    # The scheduled delay only where a wake-up was measured: the table stays as narrow as
    # before under uvloop, or when no call is its task's own coroutine.
    sched = _sched_percentile(percentiles) if any(f.scheduled_polls for f in shown) else ()
    columns = [
        "future",
        "calls",
        "ok/err/cxl",
        *(f"{percentile_key(q)} call" for q in _call_percentiles(percentiles)),
        "polls",
        "busy",
        "idle",
        *(f"sched {percentile_key(q)}" for q in sched),
        *(f"{percentile_key(q)} poll" for q in percentiles),
        "max poll",
    ]
    lines = [header, "", *_not_profiled(status), *_warnings(snapshot.warnings)]
    if futures:
        logs = {entry.future_id: entry for entry in snapshot.future_logs}
        rows = _table([columns, *(_row(f, percentiles, live, sched) for f in shown)])
        lines.append(rows[0])
        for f, row in zip(shown, rows[1:], strict=True):
            lines += [row, *_raised_line(f, logs.get(f.id))]
    if len(shown) < len(futures):
        lines.append(_more(len(futures) - len(shown), "futures", limit))
    if never:
        names = ", ".join(never[:_NEVER_NAMED])
        if len(never) > _NEVER_NAMED:
            names += f" and {len(never) - _NEVER_NAMED} more"
        lines.append(f"never called: {names}")
    if not every:
        lines.append(_no_futures(snapshot))
    lines += stuck_lines(snapshot.graph, snapshot.tasks, limit)
    lines += _functions_section(snapshot, percentiles, limit)
    measured = [f for f in shown if f.cpu is not None or f.allocations is not None]
    if measured:
        lines += ["", *_table([_POLL_COLUMNS, *(_poll_row(f, live) for f in measured)])]
    channels = snapshot.channels.channels if snapshot.channels is not None else []
    lines += _section(
        _CHANNEL_COLUMNS, partial(_channel_row, live=live), channels, limit, "channels"
    )
    lines += _lineage_section(snapshot.flow, percentiles, limit)
    resources = snapshot.resources.resources if snapshot.resources is not None else []
    distinct = resource_names(resources)  # locks made on one line: `app.py:9 #1`, `#2`
    # the program's own first: a server's per-request events must not hide its one lock
    resources = sorted(
        (replace(r, label=distinct[r.id]) for r in resources),
        key=lambda r: is_library_file(r.location.file),
    )
    lines += _section(
        _RESOURCE_COLUMNS, partial(_resource_row, live=live), resources, limit, "resources"
    )
    executors = snapshot.executors.executors if snapshot.executors is not None else []
    lines += _section(
        _EXECUTOR_COLUMNS, partial(_executor_row, live=live), executors, limit, "executors"
    )
    streams = snapshot.streams.streams if snapshot.streams is not None else []
    lines += _section(_STREAM_COLUMNS, partial(_stream_row, live=live), streams, limit, "streams")
    lines += _section(_THREAD_COLUMNS, _thread_row, _threads_shown(snapshot), limit, "threads")
    loops = snapshot.loop.loops if snapshot.loop is not None else []
    if loops:
        lines += ["", *_table([_LOOP_COLUMNS, *(_loop_row(entry) for entry in loops)])]
        for entry in loops:
            lines += _episodes(entry)
    return "\n".join(lines) + "\n"


def _not_profiled(status: ProfilerStatus) -> list[str]:
    """One line for each thing the program ran that asyncflow could not profile, and a blank."""
    lines = []
    for entry in status.not_profiled:
        what = f"event loop {entry.name}" if entry.kind == "loop" else entry.name
        times = f" ({entry.count:,} times)" if entry.count > 1 else ""
        lines.append(f"not profiled: {what}{times}: {entry.reason}")
    return [*lines, ""] if lines else []


def _no_futures(snapshot: Snapshot) -> str:
    """Why no future was tracked, as far as the snapshot tells."""
    if snapshot.status.not_profiled:
        return "(no futures were tracked: what the program ran is not profiled, see above)"
    adopted = snapshot.status.adopted_tasks
    if adopted is not None:
        return (
            "(no futures were tracked: asyncflow was attached to the running program and "
            f"adopted {counted(adopted, 'live task')} made before it: what they run is not "
            "timed (docs/attach.md says what is); only tasks made after the attach are)"
        )
    loops = snapshot.loop.loops if snapshot.loop is not None else []
    if loops:
        names = ", ".join(sorted({entry.label for entry in loops}))
        return (
            f"(no futures were tracked: asyncflow watched {counted(len(loops), 'event loop')} "
            f"({names}), but no task it tracks ran there: no @asyncflow.future call, and no "
            "task of the program's own that --include/--exclude kept)"
        )
    return (
        "(no futures were tracked: no event loop ran where asyncflow watched, and no "
        "@asyncflow.future coroutine was called; asyncflow run watches every loop, "
        "asyncflow.instrument_tasks() the one it is called on, and a server that runs its "
        "loops in worker processes has a report from each)"
    )


def _section(
    columns: list[str], row: Callable[[_E], list[str]], entries: list[_E], limit: int, noun: str
) -> list[str]:
    """A blank line and the table of the first ``limit`` entries (0: all), saying how many
    more there are; nothing for no entries."""
    if not entries:
        return []
    shown = entries if limit == 0 else entries[:limit]
    lines = ["", *_table([columns, *map(row, shown)])]
    if len(shown) < len(entries):
        lines.append(_more(len(entries) - len(shown), noun, limit))
    return lines


def _more(count: int, noun: str, limit: int) -> str:
    """How many rows the limit left out; ``noun`` is the plural the rows are named by."""
    one = noun.removesuffix("s")
    return f"… {count:,} more {one if count == 1 else noun} (limit={limit}; limit=0 shows all)"


_CHANNEL_COLUMNS = [
    "channel",
    "type",
    "sent",
    "received",
    "depth/max",
    "p50 in queue",
    "max in queue",
    "producers blocked",
    "consumers starved",
]


def _channel_row(c: ChannelEntry, live: bool) -> list[str]:
    return [
        named(c.label, c.folded_count, live and not c.alive),
        c.channel_type,
        f"{c.sent_count:,}",
        f"{c.received_count:,}",
        f"{c.queue_size}/{c.max_queue_size}" + (f", {c.lost_count:,} lost" if c.lost_count else ""),
        format_duration(c.delay_ns.get("p50")),
        format_duration(c.max_delay_ns if c.delay_ns else None),  # none timed yet: "-"
        format_duration(c.producers_blocked_ns),
        format_duration(c.consumers_starved_ns),
    ]


def _lineage_section(
    flow: FlowDocument | None, percentiles: tuple[float, ...], limit: int
) -> list[str]:
    """Lineage: each path of two channels or more, its end-to-end percentiles, and its slowest
    sampled message hop by hop."""
    paths = [p for p in flow.lineage if len(p.channels) > 1] if flow is not None else []
    if not paths:
        return []
    keys = [percentile_key(q) for q in percentiles]
    columns = ["path", "messages", *(f"{k} end to end" for k in keys), "max end to end"]
    shown = paths if limit == 0 else paths[:limit]
    rows = [
        [
            p.label,
            f"{p.messages:,}",
            *(format_duration(p.end_to_end_ns.get(k)) for k in keys),
            format_duration(p.max_end_to_end_ns),
        ]
        for p in shown
    ]
    lines = ["", "Lineage (sampled messages, end to end)", *_table([columns, *rows])]
    for p in shown:
        if p.slowest:
            m = p.slowest[0]
            hops = " · ".join(
                f"{h.name} {format_duration(h.duration_ns)}"
                + (f" (busy {format_duration(h.busy_ns)})" if h.busy_ns is not None else "")
                for h in m.hops
            )
            lines.append(f"  slowest of {p.label}: {format_duration(m.end_to_end_ns)} = {hops}")
    if len(shown) < len(paths):
        lines.append(_more(len(paths) - len(shown), "paths", limit))
    if flow is not None and flow.lineage_dropped:
        lines.append(
            f"  ({counted(flow.lineage_dropped, 'sampled message')} not followed: "
            "the lineage's bounded tables were full)"
        )
    return lines


_STREAM_COLUMNS = ["stream", "state", "items", "p50 wait", "max wait", "total wait", "consumer"]


def _stream_row(s: StreamEntry, live: bool) -> list[str]:
    return [
        named(s.label, s.folded_count, live and not s.alive),
        s.state,
        f"{s.items_yielded:,}",
        format_duration(s.wait_ns.get("p50")),
        format_duration(s.max_wait_ns),
        format_duration(s.total_wait_ns),
        format_duration(s.consumer_ns),
    ]


_LOOP_COLUMNS = ["loop", "thread", "lag p50", "lag p99", "max lag", "blocked"]


def _loop_row(entry: LoopEntry) -> list[str]:
    return [
        f"loop {entry.id} ({entry.state})",
        entry.thread or "?",
        format_duration(entry.lag_ns.get("p50")),
        format_duration(entry.lag_ns.get("p99")),
        format_duration(entry.max_lag_ns),
        f"{entry.blocked_count}x",
    ]


def _path(file: str) -> str:
    """A source file as the user would type it: relative to the working directory when it is
    under it (a script run as ``python x.py`` has an absolute path in its code objects)."""
    if not os.path.isabs(file):
        return file
    try:
        relative = os.path.relpath(file)
    except ValueError:  # another drive (Windows)
        return file
    return file if relative.startswith(os.pardir) else relative


def _blocking_lines(entry: LoopEntry, shown: int) -> list[str]:
    """The lines that cost the loop the most time in all, blocks short of an episode included:
    a line blocking every request 40 ms outranks a one-off start-up block."""
    lines = []
    for b in entry.blocking_lines[:shown]:
        kind = ""
        if b.kind is not None and b.cpu_ns is not None and b.cpu_wall_ns:
            kind = f", {b.kind} ({round(100 * b.cpu_ns / b.cpu_wall_ns)}% CPU)"
        who = f" by {b.label}" if b.label else ""
        lines.append(
            f"  loop {entry.id} lost {format_duration(b.total_ns)} at {_path(b.file)}:{b.line} "
            f"({b.function}) {b.count:,}x, longest {format_duration(b.max_ns)}{kind}{who}"
            + (f": {b.code}" if b.code else "")
        )
    more = len(entry.blocking_lines) - len(lines) + entry.other_blocks
    if more > 0:
        lost = sum(b.total_ns for b in entry.blocking_lines[shown:]) + entry.other_blocks_ns
        lines.append(
            f"  … {format_duration(lost)} more lost at other lines of loop {entry.id} "
            f"(the {len(lines)} that lost the most are shown)"
        )
    return lines


def _episodes(entry: LoopEntry, shown: int = 3) -> list[str]:
    """The longest blocked-loop episodes, each with the line that blocked, and what is left out.

    The longest are taken from those kept as the longest and the newest (the ongoing one is
    among the newest), so a long block early on is never pushed out by later, shorter ones.
    """
    kept = {e.id: e for e in (*entry.worst_episodes, *entry.episodes)}
    longest = sorted(kept.values(), key=lambda e: (-e.blocked_ns, e.id))[:shown]
    lines = _blocking_lines(entry, shown)
    for e in longest:
        who = e.call.label if e.call is not None else (e.task or "untracked code")
        where = ""
        if e.stack:
            top = e.stack[0]
            where = f" at {_path(top.file)}:{top.line} ({top.function})"
            if top.code:
                where += f": {top.code}"
        lines.append(f"  loop {entry.id} blocked {format_duration(e.blocked_ns)} by {who}{where}")
    more = entry.blocked_count - len(longest)
    if more > 0:
        lines.append(
            f"  … {more} more episode{'s' if more > 1 else ''} of loop {entry.id} "
            f"(the {len(longest)} longest of {entry.blocked_count} are shown)"
        )
    if entry.late_wakeups:
        lines.append(
            f"  loop {entry.id} woke up late {entry.late_wakeups}x: idle in its selector, its "
            "thread waited for the CPU or the GIL (no code held it)"
        )
    return lines


_WRAP = 100


def _held(w: WarningEntry) -> str:
    """When a warning that no longer holds did: its first and last evaluation that found it
    ("found", not "held": beside a lock's hold, a deadlock's window read as that hold's)."""
    if w.active:
        return ""
    first, last = format_duration(w.first_seen_ns), format_duration(w.last_seen_ns)
    if w.first_seen_ns == w.last_seen_ns:
        return f" (found at {first} into the run)"
    return f" (found from {first} to {last} into the run)"


def _warnings(warnings: list[WarningEntry]) -> list[str]:
    """The diagnoses first: each sentence, then what to do about it; nothing when none."""
    if not warnings:
        return []
    holding = [w for w in warnings if w.active]
    title = (
        f"warnings ({len(holding)})"
        if len(holding) == len(warnings)
        else (f"warnings ({len(holding)} now, {len(warnings) - len(holding)} earlier)")
    )
    lines = [title]
    for w in warnings:
        tag = w.severity.upper() if w.active else f"({w.severity})"
        body = textwrap.wrap(w.message + _held(w), _WRAP - 11) or [""]
        lines.append(f"  {tag:<8} {body[0]}")
        lines += [f"{'':11}{line}" for line in body[1:]]
        hint = textwrap.wrap(f"→ {w.hint}", _WRAP - 11)
        lines += [f"{'':11}{line}" for line in hint]
    return [*lines, ""]


_RESOURCE_COLUMNS = [
    "resource",
    "kind",
    "acquired/set",
    "waited",
    "wait total",
    "max wait",
    "hold total",
    "max hold",
    "waiting now/max",
    "held by",
]


#: waits that a timer or the outside world ends: a task in one is not part of a hang's story
_ENDED_BY_ITSELF = frozenset({"sleep", "io"})
#: task names listed for a wait on (or of) several tasks, before "and K more"
_NAMES = 3


def _names(names: list[str]) -> str:
    """``Task-1, Task-2, Task-3 and 17 more``."""
    shown = ", ".join(names[:_NAMES])
    return shown + (f" and {len(names) - _NAMES:,} more" if len(names) > _NAMES else "")


def _waits_on(
    node_id: str, out: dict[str, list[GraphEdge]], nodes: dict[str, GraphNode]
) -> tuple[str, str]:
    """Where a waiting task waits (`` at app.py:12``) and on what, with who can release it."""
    edges = [e for e in out.get(node_id, []) if e.target in nodes]
    awaited = [nodes[e.target].label for e in edges if e.relation == "awaits"]
    at = next((e.where for e in edges if e.where is not None), None)
    where = f" at {_path(at.file)}:{at.line}" if at is not None else ""
    parts = []
    if awaited:
        one = len(awaited) == 1
        parts.append(
            f"for task {awaited[0]}" if one else f"for {len(awaited)} tasks: {_names(awaited)}"
        )
    for e in edges:
        if e.relation != "waits":
            continue
        target = nodes[e.target]
        text = _target(target)
        by = out.get(target.id, [])
        holders = [
            _holder(h, nodes[h.target]) for h in by if h.relation == "held_by" and h.target in nodes
        ]
        drains = [
            nodes[h.target].label for h in by if h.relation == "received_by" and h.target in nodes
        ]
        fills = [nodes[h.target].label for h in by if h.relation == "sent_by" and h.target in nodes]
        if holders:
            text += f", held by {', '.join(holders[:_NAMES])}"
            if len(holders) > _NAMES:
                text += f" and {len(holders) - _NAMES:,} more"
        elif target.kind == "queue_put":
            text += f", drained by {_names(drains)}" if drains else ", which no live task drains"
        elif target.kind == "queue_get":
            text += f", filled by {_names(fills)}" if fills else ", which no live task fills"
        parts.append(text)
    return where, " and ".join(parts)


#: what a task waiting on a queue does, by the graph node's kind
_QUEUE_WAITS = {
    "queue_put": "to put into full queue",
    "queue_get": "to get from empty queue",
    "queue_join": "on the join of queue",
}


def _target(node: GraphNode) -> str:
    """What a task waits on, in words: ``on lock app.py:6 #2``, ``to put into full queue
    app.py:12``; a wait asyncflow does not track by its kind and description."""
    if node.kind in _QUEUE_WAITS:
        return f"{_QUEUE_WAITS[node.kind]} {node.label}"
    if node.id.startswith(("resource:", "channel:")):
        return f"on {node.kind} {node.label}"
    return f"on {node.kind}" + (f" ({node.label})" if node.label != node.kind else "")


def _holder(edge: GraphEdge, task: GraphNode) -> str:
    """A holder and where and when it took what it holds: ``Task-3 (took it at app.py:9, 1.5 s
    ago)``."""
    took = [f"at {_path(edge.where.file)}:{edge.where.line}"] if edge.where is not None else []
    if edge.held_ns is not None:
        took.append(f"{format_duration(edge.held_ns)} ago")
    return f"{task.label} (took it {', '.join(took)})" if took else task.label


def _tree(node: GraphNode, task: TaskEntry | None, awaited_by: list[str]) -> str:
    """Where a task sits in the task tree: ``made by Task-1 at app.py:12``, ``awaited by
    Task-4``; ``made at app.py:12`` when the task that made it is not known. From its entry in
    the tasks' document, else (past the tasks a snapshot lists) from its node and the tasks
    the graph says await it."""
    parent, site = node.parent, node.created_at
    awaiting = awaited_by
    if task is not None:
        parent, site, awaiting = task.parent, task.created_at, task.awaiters
    at = f" at {_path(site.file)}:{site.line}" if site is not None else ""
    awaiters = _names(awaiting)
    if parent is not None and awaiting == [parent]:
        return f"made{at} and awaited by {parent}"
    made = f"made by {parent}{at}" if parent is not None else f"made{at}" if at else ""
    return ", ".join(x for x in (made, f"awaited by {awaiters}" if awaiters else "") if x)


def stuck_lines(graph: GraphDocument | None, live: TasksDocument | None, limit: int) -> list[str]:
    """The tasks waiting when the documents were read, as one debugging a hang reads them: first
    those that cannot go on (those of a deadlock first), one line each; then the others that
    wait on something the program must release (not a sleep, not a socket), grouped by what
    they run, where they wait, on what, and who made them, most first. Each says where it
    waits, on what, who holds or can release that, and which task made it (from ``live``, the
    tasks' document, when given). ``limit`` bounds each list (0: all). The report's section,
    and ``asyncflow mcp``'s tasks tool."""
    if graph is None:
        return []
    nodes = {n.id: n for n in graph.nodes}
    out: dict[str, list[GraphEdge]] = {}
    awaited_by: dict[str, list[str]] = {}
    for e in graph.edges:
        out.setdefault(e.source, []).append(e)
        if e.relation == "awaits" and e.source in nodes:
            awaited_by.setdefault(e.target, []).append(nodes[e.source].label)
    tasks = {t.name: t for t in live.tasks} if live is not None else {}

    def place(node: GraphNode) -> str:
        return _tree(node, tasks.get(node.label), awaited_by.get(node.id, []))

    in_cycles = [name for c in graph.cycles for name in c.tasks]
    order = {f"task:{name}": i for i, name in enumerate(dict.fromkeys(in_cycles))}
    stuck = sorted(
        (n for n in graph.nodes if n.kind == "task" and n.stuck),
        key=lambda n: order.get(n.id, len(order)),
    )
    lines: list[str] = []
    if stuck:
        k = len(graph.cycles)
        heading = f"stuck tasks ({len(stuck)}" + (f", in {counted(k, 'deadlock')})" if k else ")")
        lines += ["", heading]
        for node in stuck if limit == 0 else stuck[:limit]:
            where, what = _waits_on(node.id, out, nodes)
            tree = place(node)
            who = f"{node.label} ({node.coroutine})" if node.coroutine else node.label
            lines.append(f"  {who} waits{where} {what}" + (f"; {tree}" if tree else ""))
        if limit and len(stuck) > limit:
            lines.append("  " + _more(len(stuck) - limit, "stuck tasks", limit))
    groups: dict[tuple[str, ...], list[str]] = {}
    for node in graph.nodes:
        if node.kind != "task" or node.stuck or node.id not in out:
            continue
        waits = [nodes[e.target].kind for e in out[node.id] if e.target in nodes]
        if not waits or all(kind in _ENDED_BY_ITSELF for kind in waits):
            continue
        where, what = _waits_on(node.id, out, nodes)
        key = (node.coroutine or "", where, what, place(node))
        groups.setdefault(key, []).append(node.label)
    if groups:
        waiting = sum(map(len, groups.values()))
        more = " more" if stuck else ""
        ranked = sorted(groups.items(), key=lambda kv: -len(kv[1]))
        lines += [
            "",
            f"waiting tasks ({waiting:,}{more}, not stuck: something alive may still release them)",
        ]
        for (coroutine, where, what, tree), names in ranked if limit == 0 else ranked[:limit]:
            of = f" ({coroutine})" if coroutine else ""
            if len(names) == 1:
                line = f"  {names[0]}{of} waits{where} {what}" + (f"; {tree}" if tree else "")
            else:
                line = f"  {len(names):,} tasks{of} wait{where} {what}" + (
                    f"; {tree}" if tree else ""
                )
                line += f": {_names(names)}"
            lines.append(line)
        if limit and len(ranked) > limit:
            lines.append("  " + _more(len(ranked) - limit, "groups", limit))
    if graph.omitted:
        lines.append(f"  ({counted(graph.omitted, 'more node')} of the wait-for graph left out)")
    return lines


def _resource_row(r: ResourceEntry, live: bool) -> list[str]:
    holders = sorted({h.label for h in r.holders})
    held_by = ", ".join(holders[:2]) + (f" +{len(holders) - 2}" if len(holders) > 2 else "")
    if r.event is not None:
        acquired = f"{r.event.sets} set" if r.event.sets != 1 else "1 set"
    else:
        acquired = f"{r.acquisitions:,}"
    timed = r.event is None and (r.timed_holds > 0 or r.held_so_far_ns > 0 or not r.holds)
    return [
        named(r.label, r.folded, live and r.state == "gone"),
        r.primitive.replace("capacity_limiter", "limiter"),
        acquired,
        # every wait: a contended acquisition, a condition's or event's wait, one given up
        f"{r.waits:,}" + (f" ({r.failed_waits:,} gave up)" if r.failed_waits else ""),
        # the waits and holds going on now too, so far: a deadlock's at SIGTERM is not 0 ns
        format_duration(r.waited_so_far_ns),
        format_duration(r.longest_wait_so_far_ns),
        # (a lock never waited for counts its holds without timing them: "-", not 0 ns)
        format_duration(r.held_so_far_ns) if timed else "-",
        format_duration(r.longest_hold_so_far_ns) if timed else "-",
        f"{r.waiters_now}/{r.max_waiters}",
        held_by or "-",
    ]


_EXECUTOR_COLUMNS = [
    "executor",
    "workers",
    "jobs",
    "queued now",
    "running",
    "p50 queued",
    "max queued",
    "p50 run",
    "max run",
    "raised",
]


def _executor_row(e: ExecutorEntry, live: bool) -> list[str]:
    workers = f"{e.workers}/{e.max_workers}" if e.max_workers else str(e.workers)
    return [
        named(e.label, e.folded_count, live and e.state == "gone"),
        workers,
        f"{e.submitted:,}",
        f"{e.queued:,}",
        f"{e.running:,}",
        format_duration(e.queued_ns.get("p50")),
        format_duration(e.max_queued_ns),
        format_duration(e.run_ns.get("p50")),
        format_duration(e.max_run_ns),
        f"{e.raised:,}",
    ]


_POLL_COLUMNS = [
    "future (cpu, allocations)",
    "busy",
    "cpu",
    "user",
    "system",
    "off cpu",
    "worst poll: busy",
    "cpu",
    "allocated",
    "freed",
    "max/poll",
    "blocks",
]


def _bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for scale, unit in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= scale:
            value = n / scale
            return f"{value:.3g} {unit}" if value < 1000 else f"{value:,.0f} {unit}"
    return f"{n} B"


def _poll_row(f: FutureEntry, live: bool) -> list[str]:
    c, a = f.cpu, f.allocations
    return [
        named(f.label, f.folded_count, live and not f.alive),
        format_duration(c.busy_ns) if c is not None else "-",
        format_duration(c.cpu_ns) if c is not None else "-",
        format_duration(c.user_ns) if c is not None else "-",
        format_duration(c.system_ns) if c is not None else "-",
        format_duration(c.off_cpu_ns) if c is not None else "-",
        format_duration(c.worst_poll_busy_ns) if c is not None else "-",
        format_duration(c.worst_poll_cpu_ns) if c is not None else "-",
        _bytes(a.allocated_bytes) if a is not None else "-",
        _bytes(a.freed_bytes) if a is not None else "-",
        _bytes(a.max_poll_bytes) if a is not None else "-",
        f"{a.allocated_blocks:+,}" if a is not None and a.allocated_blocks is not None else "-",
    ]


_THREAD_COLUMNS = ["thread", "state", "cpu", "user", "system", "avg cpu", "max cpu", "last"]


def _threads_shown(snapshot: Snapshot) -> list[ThreadEntry]:
    """The threads, when there is more to see than the main thread and asyncflow's own (an
    executor's workers, a library's threads): a single-threaded program gets no table."""
    threads = snapshot.threads.threads if snapshot.threads is not None else []
    others = [t for t in threads if t.name != "MainThread" and not t.asyncflow]
    return threads if others else []


def _share(share: float | None) -> str:
    return "-" if share is None else f"{share:.0%}"


def _thread_row(t: ThreadEntry) -> list[str]:
    name = f"{t.name} (asyncflow)" if t.asyncflow else t.name
    if t.loop_ids:
        name += f" (loop {', '.join(map(str, t.loop_ids))})"
    return [
        f"{name} [{t.native_id}]",
        t.state or "-",
        format_duration(t.cpu_ns),
        format_duration(t.user_ns),
        format_duration(t.system_ns),
        _share(t.avg_share),
        _share(t.max_share),
        _share(t.share),
    ]


def _functions_section(snapshot: Snapshot, percentiles: tuple[float, ...], limit: int) -> list[str]:
    """The measured functions and blocks, most total time first, then the program's metrics."""
    lines: list[str] = []
    functions = snapshot.functions.functions if snapshot.functions is not None else []
    if functions:
        shown = functions if limit == 0 else functions[:limit]
        columns = [
            "function",
            "calls",
            "errors",
            "total",
            "self",
            "mean",
            *(percentile_key(q) for q in percentiles),
            "max",
            "of wall",
        ]
        rows = [
            [
                f.label + (" [block]" if f.kind == "block" else ""),
                f"{f.call_count:,}",
                f"{f.error_count:,}",
                format_duration(f.total_ns),
                format_duration(f.self_ns),
                format_duration(f.mean_ns),
                *(format_duration(f.duration_ns.get(percentile_key(q))) for q in percentiles),
                format_duration(f.max_ns),
                f"{f.share:.1%}",
            ]
            for f in shown
        ]
        lines += ["", *_table([columns, *rows])]
        if len(shown) < len(functions):
            lines.append(_more(len(functions) - len(shown), "functions", limit))
    metrics = snapshot.user_metrics.metrics if snapshot.user_metrics is not None else []
    if metrics:
        shown_metrics = metrics if limit == 0 else metrics[:limit]
        columns = ["metric", "kind", "count", "value", "min", "max", "sum", "p50", "p99"]
        rows = [
            [
                m.name,
                m.kind,
                f"{m.count:,}",
                _number(m.value),
                _number(m.min),
                _number(m.max),
                _number(m.sum) if m.kind == "histogram" else "-",
                _number(m.percentiles.get("p50")),
                _number(m.percentiles.get("p99")),
            ]
            for m in shown_metrics
        ]
        lines += ["", *_table([columns, *rows])]
        if len(shown_metrics) < len(metrics):
            lines.append(_more(len(metrics) - len(shown_metrics), "metrics", limit))
    return lines


def _number(v: float | str | None) -> str:
    if v is None:
        return "-"
    if isinstance(v, str):
        return v if len(v) <= 24 else v[:23] + "…"
    if isinstance(v, float) and not v.is_integer():
        return f"{v:,.4g}"
    return f"{int(v):,}"


def _table(rows: list[list[str]]) -> list[str]:
    """Rows as aligned text: the first column left-aligned, the others right-aligned."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)]
        ).rstrip()
        for r in rows
    ]


def printable(text: str) -> str:
    """``text`` with every control character but the line breaks shown escaped (``\\x1b``):
    names the program chose (a thread's, a value logged) never drive the terminal."""
    if all(c == "\n" or c.isprintable() for c in text):
        return text
    return "".join(c if c == "\n" or c.isprintable() else repr(c)[1:-1] for c in text)


def render(snapshot: Snapshot, format: str, percentiles: tuple[float, ...], limit: int) -> str:
    """A snapshot in one of the report formats (``table``, ``json``, ``json-pretty``)."""
    if format == "table":
        return printable(render_table(snapshot, percentiles, limit))
    if format in ("json", "json-pretty"):
        return dumps(snapshot, pretty=format == "json-pretty").decode() + "\n"
    raise ValueError(f"format={format!r}: expected table, json or json-pretty")
