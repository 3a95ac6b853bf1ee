"""Short, bounded text of each document, for a coding agent (``asyncflow mcp``'s tools).

Each function takes a document and gives a few lines a model reads at a glance: one line per
entry, its figures labelled in words (no table to line up), the most important entries first
and at most ``limit`` of them, and a last line saying how many were left out and how to see
more. Names the program chose (a task's, a label) are shown escaped of control characters.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from asyncflow.render.report import counted, format_duration, printable, stuck_lines
from asyncflow.schema import (
    AwaitFrame,
    BlockedEpisode,
    BlockedLine,
    ChannelEntry,
    ChannelsDocument,
    EdgeEntry,
    ExecutorsDocument,
    FutureEntry,
    FuturesDocument,
    GraphDocument,
    Location,
    LoopDocument,
    ProfilerStatus,
    ResourceEntry,
    ResourcesDocument,
    StackFrame,
    StreamEntry,
    StreamsDocument,
    TasksDocument,
    WaitTarget,
    WarningEntry,
)
from asyncflow.views.graph import resource_names

__all__ = [
    "channels",
    "executors",
    "futures",
    "left_out",
    "loop",
    "resources",
    "status",
    "streams",
    "tasks",
    "warnings",
]

#: names listed in one line (senders, holders...) before "and N more"
_NAMES = 3


def left_out(shown: int, total: int, noun: str, limit: int) -> list[str]:
    """The last line of a list cut at ``limit``: how many were left out and how to see them;
    nothing when none was."""
    if total <= shown:
        return []
    return [
        f"({total - shown:,} more {noun} left out: call again with a larger limit than {limit})"
    ]


def _text(lines: Iterable[str]) -> str:
    return printable("\n".join(lines)) + "\n"


def _at(where: Location | AwaitFrame | StackFrame | BlockedLine | None) -> str:
    if where is None:
        return ""
    return f"{where.file.rsplit('/', 1)[-1]}:{where.line}"


def _p(values: dict[str, int], key: str) -> str:
    return format_duration(values.get(key))


def _names(names: Sequence[str]) -> str:
    shown = ", ".join(names[:_NAMES])
    return shown + (f" and {len(names) - _NAMES:,} more" if len(names) > _NAMES else "")


def status(s: ProfilerStatus, source: str) -> str:
    """Whose profiler it is, how long it ran, what it tracks and what it lost."""
    state = "running" if s.running else "stopped"
    lines = [
        f"{s.name}: pid {s.pid}, {state}, up {format_duration(s.uptime_ns)}, asyncflow "
        f"{s.version}, Python {s.python} (read from {source})",
        f"tracks {counted(s.futures, 'future')} ({s.calls_live:,} calls live), "
        f"{counted(s.channels, 'channel')}, {counted(s.streams, 'stream')}",
        f"events: {s.events_recorded:,} recorded, {s.events_dropped:,} dropped; internal errors: "
        f"{s.internal_errors:,}"
        + (f" (last: {s.last_internal_error})" if s.last_internal_error else ""),
    ]
    for n in s.not_profiled:
        lines.append(f"not profiled: {n.kind} {n.name} ({n.count:,}): {n.reason}")
    return _text(lines)


def warnings(entries: Sequence[WarningEntry], limit: int) -> str:
    """The diagnoses, as the document orders them (those that hold now, most severe first):
    the sentence, the hint and the evidence of each."""
    if not entries:
        return "no warnings: asyncflow found nothing wrong\n"
    holding = sum(w.active for w in entries)
    lines = [
        f"{counted(len(entries), 'warning')}: {holding:,} holding now, "
        f"{len(entries) - holding:,} held earlier"
    ]
    for w in entries[:limit]:
        when = (
            "now"
            if w.active
            else (
                f"earlier, {format_duration(w.first_seen_ns)} to {format_duration(w.last_seen_ns)} "
                "into the run"
            )
        )
        subject = f"{w.subject.kind} `{w.subject.label}`"
        if w.subject.location is not None:
            subject += f" at {_at(w.subject.location)}"
        lines.append(f"{w.severity.upper()} {w.kind} ({when}) about {subject}: {w.message}")
        lines.append(f"  hint: {w.hint}")
        if w.evidence:
            lines.append("  evidence: " + ", ".join(map(_evidence, w.evidence.items())))
    return _text([*lines, *left_out(min(limit, len(entries)), len(entries), "warnings", limit)])


def _evidence(item: tuple[str, int]) -> str:
    name, value = item
    if name.endswith("_ns"):
        return f"{name.removesuffix('_ns')} {format_duration(value)}"
    return f"{name}={value:,}"


def _future(f: FutureEntry) -> str:
    o, c = f.outcomes, f.calls
    cancelled = o.cancelled + o.closed + o.never_awaited
    live = c.pending + c.running + c.suspended
    name = f.label + (f" ({f.folded_count:,} gone, summed)" if f.folded_count else "")
    return (
        f"{name}: {counted(f.call_count, 'call')} ({o.returned:,} returned, {o.raised:,} raised, "
        f"{cancelled:,} cancelled; {live:,} live), {counted(f.total_polls, 'poll')}; busy "
        f"{format_duration(f.busy_ns)}, idle {format_duration(f.idle_ns)}; poll p50 "
        f"{_p(f.poll_duration_ns, 'p50')} p99 {_p(f.poll_duration_ns, 'p99')} max "
        f"{format_duration(f.max_poll_duration_ns)}; call p50 {_p(f.call_duration_ns, 'p50')} "
        f"p99 {_p(f.call_duration_ns, 'p99')}"
        + (f"; raised {_counts(f.errors)}" if f.errors else "")
        + f" [{f.source} at {_at(f.location)}]"
    )


def _counts(counts: dict[str, int]) -> str:
    ranked = sorted(counts.items(), key=lambda kv: -kv[1])
    return _names([f"{n:,} {name}" for name, n in ranked])


def futures(doc: FuturesDocument, limit: int) -> str:
    """The futures, most busy first: calls and how they ended, busy and idle time, the
    percentiles of a poll and of a call, the exceptions raised, and where each is defined."""
    shown = doc.futures[:limit]
    lines = [f"{counted(doc.total, 'future')}, most busy first:"] + [_future(f) for f in shown]
    if doc.never_awaited:
        never = [f"{n.function} ({n.count:,}x at {_at(n.location)})" for n in doc.never_awaited]
        lines.append(f"never awaited: {_names(never)}")
    return _text([*lines, *left_out(len(shown), doc.total, "futures", limit)])


def _edges(edges: Sequence[EdgeEntry]) -> str:
    return _names([f"{e.label} ({e.messages:,})" for e in edges]) or "none"


def _channel(c: ChannelEntry) -> str:
    gone = " (gone)" if not c.alive else ""
    return (
        f"{c.label}{gone} ({c.kind}, {c.channel_type}): {c.sent_count:,} sent, "
        f"{c.received_count:,} received, {c.queue_size:,} queued now (max {c.max_queue_size:,}); "
        f"time in channel p50 {_p(c.delay_ns, 'p50')} p99 {_p(c.delay_ns, 'p99')} max "
        f"{format_duration(c.max_delay_ns)}; producers blocked "
        f"{format_duration(c.producers_blocked_ns)}, consumers starved "
        f"{format_duration(c.consumers_starved_ns)}; senders: {_edges(c.senders)}; receivers: "
        f"{_edges(c.receivers)}" + (f"; {c.lost_count:,} lost" if c.lost_count else "")
    )


def channels(doc: ChannelsDocument, limit: int) -> str:
    """The channels (queues, memory streams), most messages first: traffic, depth, time in the
    channel, blocked producers and starved consumers, and who sends and receives."""
    shown = doc.channels[:limit]
    if not doc.total:
        return "no channels: no instrumented queue or memory stream\n"
    lines = [f"{counted(doc.total, 'channel')}, most messages first:"] + [
        _channel(c) for c in shown
    ]
    return _text([*lines, *left_out(len(shown), doc.total, "channels", limit)])


def _stream(x: StreamEntry) -> str:
    name = x.label + (
        f" ({x.folded_count:,} gone, summed)" if x.folded_count else "" if x.alive else " (gone)"
    )
    runs = ", ".join(f"{n:,} {state}" for state, n in x.instances.items() if n)
    return (
        f"{name} ({x.state}; iterations: {runs or 'none'}): {counted(x.items_yielded, 'item')}; "
        f"the consumer waited for an item p50 {_p(x.wait_ns, 'p50')} p99 {_p(x.wait_ns, 'p99')} "
        f"max {format_duration(x.max_wait_ns)}, {format_duration(x.total_wait_ns)} in all, and "
        f"spent {format_duration(x.consumer_ns)} between items [{x.source} at {_at(x.location)}]"
    )


def streams(doc: StreamsDocument, limit: int) -> str:
    """The async iterators and generators (streams), most items first: iterations and how they
    ended, items, how long the consumer waited for an item and spent between items."""
    if not doc.total:
        return "no streams: no tracked async iterator or generator\n"
    shown = doc.streams[:limit]
    lines = [f"{counted(doc.total, 'stream')}, most items first:"] + [_stream(x) for x in shown]
    return _text([*lines, *left_out(len(shown), doc.total, "streams", limit)])


def _target(w: WaitTarget | None) -> str:
    if w is None:
        return "nothing (running or ready)"
    return w.description


def tasks(doc: TasksDocument, graph: GraphDocument | None, limit: int) -> str:
    """Live tasks and their waits: first the wait-for graph's view of a hang (the stuck tasks,
    a deadlock's first, then those waiting on something the program must release), then the
    tasks grouped by where they wait and on what, then one line per task."""
    lines = [
        f"{counted(doc.total, 'live task')}"
        + ("" if doc.consistent else " (read while they changed: counts may be off by a few)")
    ]
    lines += [line.removeprefix("  ") for line in stuck_lines(graph, doc, limit) if line]
    if doc.waits:
        ranked = doc.waits[:limit]
        lines.append("tasks by where they wait, most first:")
        for w in ranked:
            where = f" at {_at(w.where)}" if w.where is not None else ""
            lines.append(f"{counted(w.tasks, 'task')} of {w.label}{where}: {_target(w.waits_on)}")
        lines += left_out(len(ranked), len(doc.waits), "groups", limit)
    shown = doc.tasks[:limit]
    if shown:
        lines.append("tasks:")
    for t in shown:
        runs = t.future_label or t.coroutine
        age = f", {format_duration(t.age_ns)} old" if t.age_ns is not None else ""
        where = f" at {_at(t.where)}" if t.where is not None else ""
        lines.append(f"{t.name} ({runs}{age}) {t.state}{where}: {_target(t.waits_on)}")
    return _text([*lines, *left_out(len(shown), doc.total, "tasks", limit)])


def _resource(r: ResourceEntry, name: str) -> str:
    holders = _names([f"{h.label} ({format_duration(h.held_ns)})" for h in r.holders])
    gone = f" ({r.folded:,} gone, summed)" if r.folded else " (gone)" if r.state == "gone" else ""
    return (
        f"{name}{gone} ({r.kind} at {_at(r.location)}): {r.acquisitions:,} acquired "
        f"({r.contended_acquisitions:,} after waiting); waits {r.waits:,} "
        f"({r.failed_waits:,} failed), {format_duration(r.total_wait_ns)} in all, p99 "
        f"{_p(r.wait_ns, 'p99')}, max {format_duration(r.max_wait_ns)}; holds {r.holds:,}, "
        f"{format_duration(r.total_hold_ns)} in all, max {format_duration(r.max_hold_ns)}; "
        f"{r.waiters_now:,} waiting now (max {r.max_waiters:,})"
        + (f"; held now by {holders}" if holders else "")
        + (f"; {r.abandoned_holds:,} holds never given back" if r.abandoned_holds else "")
    )


def resources(doc: ResourcesDocument, limit: int) -> str:
    """The locks, semaphores, conditions, events, barriers and limiters, most waited on first:
    acquisitions, waits, holds, who waits and who holds now."""
    if not doc.total:
        return "no resources: no instrumented lock, semaphore, event, condition or barrier\n"
    names = resource_names(doc.resources)
    shown = doc.resources[:limit]
    lines = [f"{counted(doc.total, 'resource')}, most waited on first:"]
    lines += [_resource(r, names[r.id]) for r in shown]
    return _text([*lines, *left_out(len(shown), doc.total, "resources", limit)])


def _episode(e: BlockedEpisode) -> str:
    frame = e.stack[0] if e.stack else None  # the innermost: the line that held the loop
    at = f" at {_at(frame)} in {frame.function}" if frame is not None else ""
    code = f" `{frame.code.strip()}`" if frame is not None and frame.code else ""
    what = e.call.label if e.call is not None else (e.task or "untracked code")
    kind = f", {e.kind}" if e.kind else ""
    route = f", serving {e.route}" if e.route else ""
    ongoing = " (still blocked)" if e.ongoing else ""
    return f"blocked {format_duration(e.blocked_ns)}{ongoing} by {what}{at}{code}{kind}{route}"


def loop(doc: LoopDocument, limit: int) -> str:
    """Each event loop's health: its lag, how often it was blocked and by which lines, and its
    worst and latest blocked episodes, each with the line that held it."""
    if not doc.loops:
        return "no event loops watched\n"
    lines = [f"blocked means one step ran longer than {format_duration(doc.block_threshold_ns)}"]
    for entry in doc.loops:
        lines.append(
            f"loop {entry.id} on {entry.thread} ({entry.state}): lag now "
            f"{format_duration(entry.lag_now_ns)}, p50 {_p(entry.lag_ns, 'p50')}, p99 "
            f"{_p(entry.lag_ns, 'p99')}, max {format_duration(entry.max_lag_ns)}; "
            f"{counted(entry.tasks_alive, 'task')} alive; blocked {entry.blocked_count:,}x"
            + (" (blocked NOW)" if entry.blocked else "")
        )
        for line in entry.blocking_lines[:limit]:
            code = f" `{line.code.strip()}`" if line.code else ""
            lines.append(
                f"  line {_at(line)} in {line.function}{code}: {line.count:,}x, "
                f"{format_duration(line.total_ns)} in all, max {format_duration(line.max_ns)}"
            )
        lines += [
            "  " + x
            for x in left_out(
                min(limit, len(entry.blocking_lines)), len(entry.blocking_lines), "lines", limit
            )
        ]
        worst = entry.worst_episodes[:limit]
        lines += [f"  longest: {_episode(e)}" for e in worst]
        shown = {e.id for e in worst}
        latest = [e for e in entry.episodes if e.id not in shown][:limit]
        lines += [f"  latest: {_episode(e)}" for e in latest]
        more = entry.blocked_count - len(worst) - len(latest)
        if more > 0:
            lines.append(f"  ({counted(more, 'more episode')} left out)")
    return _text(lines)


def executors(doc: ExecutorsDocument, limit: int) -> str:
    """The executors jobs went to, busiest first: workers, jobs queued and running, and the
    time jobs waited for a worker against the time they ran."""
    if not doc.executors:
        return "no executors: no job was submitted to an instrumented pool\n"
    shown = doc.executors[:limit]
    lines = [f"{counted(len(doc.executors), 'executor')}, busiest first:"]
    for e in shown:
        most = "" if e.max_workers is None else f" of {e.max_workers:,}"
        top = _names([f"{g.name} ({g.jobs:,})" for g in e.functions])
        lines.append(
            f"{e.label} ({e.kind}): {e.workers:,}{most} workers; {e.submitted:,} jobs, "
            f"{e.queued:,} queued and {e.running:,} running now, {e.raised:,} raised; waited "
            f"{format_duration(e.total_queued_ns)} in all (max {format_duration(e.max_queued_ns)})"
            f", ran {format_duration(e.total_run_ns)} (max {format_duration(e.max_run_ns)})"
            + (f"; jobs: {top}" if top else "")
        )
    return _text([*lines, *left_out(len(shown), len(doc.executors), "executors", limit)])
