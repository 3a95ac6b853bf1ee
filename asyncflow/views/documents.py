"""Pure functions from the collector's state to the documents of :mod:`asyncflow.schema`.

Lists are built in time proportional to the page they return: the records are ordered by a
cheap key first, and only the entries of the page are built.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import operator
import os
import platform
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from asyncflow import clock, stats
from asyncflow._version import __version__
from asyncflow.instrumentation import _raised, _session, every_loop, gathers, routes
from asyncflow.instrumentation.channels import ChannelRecord, Edge, channel_registry, edge_counts
from asyncflow.instrumentation.cpu import PollFigures, call_figures
from asyncflow.instrumentation.executors import executor_registry
from asyncflow.instrumentation.futures import (
    RUNNING,
    CallRecord,
    FutureRecord,
    accelerated,
    call_field,
    call_state,
    gone_labels,
)
from asyncflow.instrumentation.loops import LoopRecord, loop_registry
from asyncflow.instrumentation.resources import resource_registry
from asyncflow.instrumentation.streams import (
    ACTIVE,
    StreamRecord,
    consumer_ns,
    recent_items,
    stream_registry,
)
from asyncflow.model.collector import Collector, live_calls
from asyncflow.model.monitor import BlockLine, Episode, LoopState, running_calls
from asyncflow.model.threads import FRESH_NS, threads_document
from asyncflow.model.waits import SlicedWalk, TaskWalk, walk_loop
from asyncflow.schema import (
    SCHEMA,
    BlockedEpisode,
    BlockedLine,
    CallEntry,
    CallStates,
    Cancellations,
    ChannelEntry,
    ChannelLogEntry,
    ChannelLogs,
    ChannelsDocument,
    EdgeEntry,
    ExceptionInfo,
    ExecutorsDocument,
    FlowDocument,
    FlowEdge,
    FlowNode,
    FutureEntry,
    FutureLogs,
    FuturesDocument,
    GraphDocument,
    LiveSample,
    Location,
    LoopDocument,
    LoopEntry,
    NotProfiledEntry,
    Outcomes,
    PollAllocations,
    PollCpu,
    ProfilerStatus,
    ResourceEntry,
    ResourcesDocument,
    RunningCall,
    Snapshot,
    StackFrame,
    StreamEntry,
    StreamItemEntry,
    StreamLogs,
    StreamsDocument,
    TasksDocument,
    WarningsDocument,
)
from asyncflow.views import function_views, lints, resource_views, wait_views
from asyncflow.views import lineage as lineage_views
from asyncflow.views.graph import graph_document
from asyncflow.views.paging import at_most, ordered_page

__all__ = [
    "channel_entry",
    "channel_logs",
    "channels_document",
    "flow",
    "future_entry",
    "future_logs",
    "futures_document",
    "loop_document",
    "snapshot",
    "status",
    "stream_entry",
    "stream_logs",
    "streams_document",
    "wait_for_graph",
    "warnings_document",
    "watch_for_deadlocks",
]


_R = TypeVar("_R")


def _running_for(r: CallRecord, now: int) -> int:
    start = r.start
    return max(0, now - start) if start else 0


def _idle(r: CallRecord, now: int) -> int:
    if not r.first:
        return 0
    end = r.finished or now
    running = 0 if r.finished else _running_for(r, now)
    return max(0, end - r.first - r.busy - running)


def _busy_now(record: FutureRecord, now: int) -> int:
    """A future's busy time up to ``now``, live calls included (as its entry reports it)."""
    busy = record.stats.busy_done
    for r in live_calls(record):
        start = r.start
        busy += r.busy + (now - start if start and now > start else 0)
    return busy


def future_entry(
    record: FutureRecord,
    now: int,
    percentiles: tuple[float, ...],
    figures: PollFigures | None = None,
) -> FutureEntry:
    """One future's totals over the session, live calls included up to ``now`` (and the CPU
    time and allocations of its polls, when ``figures`` measured them)."""
    st = record.stats
    live = live_calls(record)
    pending = running = 0
    polls, busy, idle, max_poll = st.polls_done, st.busy_done, st.idle_done, st.max_poll_done
    for r in live:  # inlined _running_for and _idle: with 10,000 live calls this loop is hot
        start, first, r_busy = r.start, r.first, r.busy
        elapsed = now - start if start and now > start else 0
        if elapsed:
            running += 1
        elif not first:
            pending += 1
        polls += r.polls
        busy += r_busy + elapsed
        if first:
            finished = r.finished
            idle += max(
                0, finished - first - r_busy if finished else now - first - r_busy - elapsed
            )
        longest = r.max if r.max > elapsed else elapsed
        if longest > max_poll:
            max_poll = longest
    ready, cancelled = st.returned + st.raised, st.cancelled + st.closed + st.never_awaited
    return FutureEntry(
        id=record.id,
        label=record.label,
        source=record.source,
        location=Location(record.file, record.line),
        tracked_by=record.tracked_by,
        call_count=st.created,
        calls=CallStates(
            pending=pending,
            running=running,
            suspended=len(live) - pending - running,
            ready=ready,
            cancelled=cancelled,
        ),
        outcomes=Outcomes(
            returned=st.returned,
            raised=st.raised,
            cancelled=st.cancelled,
            closed=st.closed,
            never_awaited=st.never_awaited,
            dropped=st.dropped,
        ),
        total_polls=polls,
        busy_ns=busy,
        idle_ns=idle,
        max_poll_duration_ns=max_poll,
        poll_duration_ns=at_most(stats.percentiles(st.poll_hist, percentiles), max_poll),
        call_duration_ns=stats.percentiles(st.call_hist, percentiles),
        alive=record.alive,
        folded_count=record.folded,
        cancellations=Cancellations(
            requested=st.cancel_requested,
            swallowed=st.cancel_swallowed,
            raised=st.cancel_raised,
            max_to_end_ns=st.max_cancel_to_end,
        ),
        live_series=[
            LiveSample(max(0, now - at), live, created)
            for at, live, created in (st.series.points() if st.series is not None else ())
        ],
        **_poll_figures(figures, record.id),
        **_scheduled(st, percentiles),
        **_gathered(record.id),
        errors=dict(st.error_types),
        first_call_ago_ns=max(0, now - first) if (first := getattr(st, "first_call", 0)) else None,
        first_caller_id=getattr(st, "first_caller", 0) or None,
    )


def _gathered(future_id: int) -> dict[str, Any]:
    """The gathers a call of the future took part in, and those it ended last in."""
    c = gathers.counts(future_id)
    return {"gathers": c.gathers, "gathers_last": c.last}


def _scheduled(st: Any, percentiles: tuple[float, ...]) -> dict[str, Any]:
    """A future's scheduled time (counted where each woken poll starts, live calls included)."""
    hist = st.sched_hist
    return {
        "scheduled_ns": st.sched_total,
        "scheduled_polls": sum(hist.values()),
        "max_scheduled_ns": st.max_sched,
        "scheduled_delay_ns": at_most(stats.percentiles(hist, percentiles), st.max_sched),
    }


def _poll_figures(figures: PollFigures | None, future_id: int) -> dict[str, Any]:
    f = figures.futures.get(future_id) if figures is not None else None
    if f is None or figures is None:
        return {}
    out: dict[str, Any] = {}
    if figures.cpu:
        out["cpu"] = PollCpu(
            polls=f.polls,
            busy_ns=f.measured_busy_ns,
            cpu_ns=f.cpu_ns,
            off_cpu_ns=max(0, f.measured_busy_ns - f.cpu_ns),
            max_poll_cpu_ns=f.max_cpu_ns,
            worst_poll_busy_ns=f.worst_busy_ns,
            worst_poll_cpu_ns=f.worst_cpu_ns,
            worst_poll_call_id=f.worst_call_id or None,
            user_ns=f.user_ns if figures.split else None,
            system_ns=f.system_ns if figures.split else None,
        )
    if figures.allocations:
        out["allocations"] = PollAllocations(
            polls=f.polls,
            allocated_bytes=f.alloc_bytes,
            freed_bytes=f.freed_bytes,
            max_poll_bytes=f.max_alloc_bytes,
            allocated_blocks=f.blocks if figures.count_blocks else None,
        )
    return out


def call_entry(r: CallRecord, now: int, origin: int) -> CallEntry:
    """One call as its log lists it; timestamps relative to ``origin``."""
    elapsed = 0 if r.finished else _running_for(r, now)
    state = RUNNING if elapsed else call_state(r)
    exception = None
    exc_type = call_field(r, "exc_type")
    if exc_type is not None:
        exception = ExceptionInfo(exc_type, call_field(r, "exc_message") or "")
    return CallEntry(
        call_id=r.call_id,
        future_id=r.future.id,
        state=state,
        poll_count=r.polls,
        total_poll_duration_ns=r.busy,
        max_poll_duration_ns=r.max,
        last_poll_duration_ns=r.last,
        busy_ns=r.busy + elapsed,
        idle_ns=_idle(r, now),
        created_ns=r.created - origin,
        first_poll_ns=r.first - origin if r.first else None,
        finished_ns=r.finished - origin if r.finished else None,
        current_elapsed_ns=elapsed if state == RUNNING else None,
        task=call_field(r, "task"),
        outcome=call_field(r, "outcome"),
        exception=exception,
        result=call_field(r, "result"),
        cancel_requests=call_field(r, "cancel_requests") or 0,
        cancel_outcome=call_field(r, "cancel_outcome"),
        cancel_to_end_ns=call_field(r, "cancel_to_end"),
        scheduled_ns=r.sched,
        **_call_figures(r),
    )


def _call_figures(r: CallRecord) -> dict[str, Any]:
    figures = call_figures(r)
    if figures is None:
        return {}
    out: dict[str, Any] = {}
    if figures.cpu:
        out["cpu_ns"] = figures.cpu_ns
        if figures.owner.split:
            out["user_ns"], out["system_ns"] = figures.user_ns, figures.system_ns
    if figures.allocations:
        out["allocated_bytes"], out["freed_bytes"] = figures.alloc_bytes, figures.freed_bytes
        if figures.owner.count_blocks:
            out["allocated_blocks"] = figures.blocks
    return out


_call_id = operator.attrgetter("call_id")


def future_logs(
    record: FutureRecord, now: int, origin: int, limit: int | None = None
) -> FutureLogs:
    """Every unfinished call (oldest first), then recent finished calls (newest first)."""
    live = live_calls(record)
    live.sort(key=_call_id)
    recent = list(record.stats.recent or ())
    recent.reverse()
    if limit is not None:
        # what can be shown (of 100,000 live calls, the 1,000 a snapshot keeps), and enough
        # after any of them the next lines leave out
        live = live[: limit + len(recent)]
    # A call folded where it finishes, on another thread, between the two copies is in both:
    # it is listed once, as it is now (finished).
    finished = {id(r) for r in recent}
    live = [r for r in live if id(r) not in finished]
    calls = live + recent
    if limit is not None:
        calls = calls[:limit]
    return FutureLogs(
        schema=SCHEMA,
        future_id=record.id,
        label=record.label,
        calls=[call_entry(r, now, origin) for r in calls],
    )


def futures_document(
    collector: Collector, now: int, offset: int = 0, limit: int | None = None
) -> FuturesDocument:
    """Every future, most busy first, paged by ``offset``/``limit``."""
    records = collector.futures()
    keys = {f.id: (-_busy_now(f, now), -f.stats.created, f.id) for f in records}
    chosen = ordered_page(records, lambda f: keys[f.id], offset, limit)
    qs = collector.options.percentiles
    page = [future_entry(f, now, qs, collector.poll_figures) for f in chosen]
    return FuturesDocument(
        schema=SCHEMA,
        total=len(records),
        offset=offset,
        limit=len(page) if limit is None else limit,
        futures=page,
        never_awaited=wait_views.never_awaited_entries(),
    )


def status(collector: Collector, now: int, running: bool) -> ProfilerStatus:
    """The profiler's own health and counts."""
    futures = collector.futures()
    live = 0
    polls = calls_ended = 0
    for f in futures:
        st = f.stats
        n = len(st.live)
        live += n
        calls_ended += st.created - n
        polls += st.polls_done + sum(r.polls for r in live_calls(f))
    return ProfilerStatus(
        schema=SCHEMA,
        name=collector.options.name,
        version=__version__,
        pid=os.getpid(),
        python=platform.python_version(),
        uptime_ns=max(0, now - collector.session.start_ns),
        running=running,
        events_recorded=polls + calls_ended,
        events_dropped=collector.dropped,
        internal_errors=_session.errors.count,
        last_internal_error=_session.errors.last,
        futures=len(futures),
        calls_live=live,
        channels=len(channel_registry()),
        streams=len(stream_registry()),
        accelerated=accelerated,
        not_profiled=[
            NotProfiledEntry(b.kind, b.name, b.reason, b.count) for b in every_loop.not_profiled()
        ],
        unretrieved_dropped=_raised.dropped(collector.session.epoch),
        adopted_tasks=collector.session.adopted,
        serving=routes.serving(),
    )


def _labels(collector: Collector) -> dict[int | None, str]:
    # futures folded into an aggregate keep their label on the edges that still name them
    labels: dict[int | None, str] = {}
    for fid, label in gone_labels().items():
        labels[fid] = label
    labels.update((f.id, f.label) for f in collector.futures())
    labels[None] = "(untracked)"
    return labels


_counts = edge_counts


def _edges(
    edges: dict[int | None, Edge],
    counts: dict[int | None, int],
    labels: dict[int | None, str],
    qs: tuple[float, ...],
) -> list[EdgeEntry]:
    out = [
        EdgeEntry(
            future_id=fid,
            label=labels.get(fid, "?"),
            messages=counts.get(fid, e.count),
            delay_ns=at_most(stats.percentiles(e.delay_hist, qs), e.delay_max),
            max_delay_ns=e.delay_max,
        )
        for fid, e in list(edges.items())
    ]
    out.sort(key=lambda e: -e.messages)
    return out


def _rate(first: tuple[int, int], last: tuple[int, int]) -> float:
    """Messages per second between two (message number, timestamp) points."""
    count, span = last[0] - first[0], last[1] - first[1]
    return round(count * 1e9 / span, 3) if span > 0 and count > 0 else 0.0


def channel_entry(
    record: ChannelRecord, labels: dict[int | None, str], qs: tuple[float, ...]
) -> ChannelEntry:
    """One channel's figures over the session."""
    st = record.stats
    sent, received = st.sent, st.received
    try:
        size = int(record.size())
    except Exception:  # a closed or broken channel may refuse to say
        size = 0
    blocked_now, starved_now = record.waiting_ns(clock.now_ns())
    return ChannelEntry(
        id=record.id,
        label=record.label,
        kind=record.kind,
        channel_type=record.channel_type,
        state="active" if record.alive and not record.closed else "closed",
        sent_count=sent,
        received_count=received,
        unpaired_count=st.unpaired,
        queue_size=size,
        max_queue_size=st.max_size,
        send_rate=_rate((1, st.first_sent_ns), st.last_sent),
        receive_rate=_rate(st.first_received, st.last_received),
        delay_ns=at_most(stats.percentiles(st.delay_hist, qs), st.delay_max),
        max_delay_ns=st.delay_max,
        producers_blocked_ns=st.blocked_ns + blocked_now,
        consumers_starved_ns=st.starved_ns + starved_now,
        senders=_edges(st.senders, _counts(st.senders, sent, st.last_sender), labels, qs),
        receivers=_edges(
            st.receivers, _counts(st.receivers, received, st.last_receiver), labels, qs
        ),
        timed_count=st.timed,
        sampling_interval=st.interval,
        lost_count=record.lost_count(),
        alive=record.alive,
        folded_count=record.folded,
    )


def channels_document(
    collector: Collector, offset: int = 0, limit: int | None = None
) -> ChannelsDocument:
    """Every channel, most messages first, paged by ``offset``/``limit``."""
    labels = _labels(collector)
    qs = collector.options.percentiles
    records = channel_registry()
    chosen = ordered_page(records, lambda c: (-c.stats.sent, c.id), offset, limit)
    page = [channel_entry(c, labels, qs) for c in chosen]
    return ChannelsDocument(
        schema=SCHEMA,
        total=len(records),
        offset=offset,
        limit=len(page) if limit is None else limit,
        channels=page,
    )


def channel_logs(record: ChannelRecord, origin: int, limit: int | None = None) -> ChannelLogs:
    """A channel's recent sends and receives, newest first."""
    st = record.stats
    sent = list(st.sent_log)[::-1][:limit]
    received = list(st.received_log)[::-1][:limit]
    return ChannelLogs(
        schema=SCHEMA,
        channel_id=record.id,
        label=record.label,
        sent_logs=[
            ChannelLogEntry(index, mid, ts - origin, cid, fid, None, text)
            for index, mid, ts, cid, fid, text in sent
        ],
        received_logs=[
            ChannelLogEntry(index, mid, ts - origin, cid, fid, delay, text)
            for index, mid, ts, cid, fid, delay, text in received
        ],
    )


def flow(collector: Collector) -> FlowDocument:
    """The data-flow graph: futures and channels as nodes, sends and receives as edges."""
    labels = _labels(collector)
    qs = collector.options.percentiles
    nodes: dict[str, FlowNode] = {}
    edges: list[FlowEdge] = []

    def future_node(fid: int | None) -> str:
        key = f"future:{fid}" if fid is not None else "future:untracked"
        nodes.setdefault(key, FlowNode(key, "future", labels.get(fid, "?")))
        return key

    for r in stream_registry():
        key = f"stream:{r.id}"
        nodes[key] = FlowNode(key, "stream", r.label)
    resource_nodes, resource_edges = resource_views.resource_flow(collector, future_node)
    nodes.update((node.id, node) for node in resource_nodes)
    edges += resource_edges
    for executor in executor_registry():  # future -> executor: the jobs its calls submitted
        key = f"executor:{executor.id}"
        nodes[key] = FlowNode(key, "executor", executor.label)
        with executor.lock:
            jobs = list(executor.stats.by_future.items())
        for future_id, figures in jobs:
            edge = FlowEdge(future_node(future_id), key, figures.jobs, {}, figures.max_queued_ns)
            edges.append(edge)
    for c in channel_registry():
        key = f"channel:{c.id}"
        nodes[key] = FlowNode(key, "channel", c.label)
        st = c.stats
        counts = _counts(st.senders, st.sent, st.last_sender)
        for fid, e in list(st.senders.items()):
            edges.append(_flow_edge(future_node(fid), key, e, counts.get(fid, e.count), qs))
        counts = _counts(st.receivers, st.received, st.last_receiver)
        for fid, e in list(st.receivers.items()):
            edges.append(_flow_edge(key, future_node(fid), e, counts.get(fid, e.count), qs))
    names = {n.id: n.label for n in nodes.values()}
    chans = {int(k.split(":")[1]): v for k, v in names.items() if k.startswith("channel:")}
    chans.update((-int(k.split(":")[1]), v) for k, v in names.items() if k.startswith("stream:"))
    paths = lineage_views.lineage_paths(labels, chans, qs)
    return FlowDocument(
        schema=SCHEMA,
        nodes=list(nodes.values()),
        edges=edges,
        lineage=paths,
        lineage_dropped=lineage_views.dropped(),
    )


def _flow_edge(source: str, target: str, e: Edge, messages: int, qs: tuple[float, ...]) -> FlowEdge:
    return FlowEdge(
        source=source,
        target=target,
        messages=messages,
        delay_ns=at_most(stats.percentiles(e.delay_hist, qs), e.delay_max),
        max_delay_ns=e.delay_max,
    )


def stream_entry(record: StreamRecord, qs: tuple[float, ...], now: int) -> StreamEntry:
    """One stream definition's figures over the session, up to ``now``."""
    st = record.stats
    instances = dict(st.instances)
    state = ACTIVE
    if not instances[ACTIVE]:
        ended = [s for s, n in instances.items() if n]
        state = ended[-1] if len(ended) == 1 else (ended[0] if ended else ACTIVE)
    return StreamEntry(
        id=record.id,
        label=record.label,
        source=record.source,
        location=Location(record.file, record.line),
        state=state,
        instances=instances,
        items_yielded=st.items,
        wait_ns=at_most(stats.percentiles(st.wait_hist, qs), st.wait_max),
        max_wait_ns=st.wait_max,
        total_wait_ns=st.wait_ns,
        consumer_ns=consumer_ns(st, now),
        timed_count=st.timed,
        sampling_interval=st.interval,
        alive=record.alive,
        folded_count=record.folded,
    )


def streams_document(
    collector: Collector, offset: int = 0, limit: int | None = None
) -> StreamsDocument:
    """Every stream, most items first, paged by ``offset``/``limit``."""
    qs = collector.options.percentiles
    records = stream_registry()
    chosen = ordered_page(records, lambda r: (-r.stats.items, r.id), offset, limit)
    now = clock.now_ns()
    page = [stream_entry(r, qs, now) for r in chosen]
    return StreamsDocument(
        schema=SCHEMA,
        total=len(records),
        offset=offset,
        limit=len(page) if limit is None else limit,
        streams=page,
    )


def stream_logs(record: StreamRecord, origin: int, limit: int | None = None) -> StreamLogs:
    """A stream's recent items, newest first."""
    items = recent_items(record.stats)[::-1][:limit]
    return StreamLogs(
        schema=SCHEMA,
        stream_id=record.id,
        label=record.label,
        items=[StreamItemEntry(i, ts - origin, wait, text) for i, ts, wait, text in items],
    )


def _running_call(r: CallRecord | None, now: int, origin: int) -> RunningCall | None:
    start = r.start if r is not None else 0
    if r is None or not start:
        return None
    return RunningCall(r.future.id, r.future.label, r.call_id, start - origin, max(0, now - start))


def _episode(e: Episode, now: int, origin: int) -> BlockedEpisode:
    call = e.call
    blocked = max(e.blocked_ns, now - e.since) if e.ongoing else e.blocked_ns
    return BlockedEpisode(
        id=e.id,
        started_ns=e.since - origin,
        blocked_ns=blocked,
        ongoing=e.ongoing,
        task=e.task,
        call=None
        if call is None
        else RunningCall(
            call.future.id, call.future.label, call.call_id, e.since - origin, blocked
        ),
        stack=[StackFrame(*frame) for frame in e.stack],
        cpu_ns=e.cpu_ns if e.cpu_wall_ns else None,
        cpu_wall_ns=e.cpu_wall_ns,
        kind=e.kind,
        route=e.route,
    )


def _blocked_line(line: BlockLine, origin: int) -> BlockedLine:
    return BlockedLine(
        file=line.file,
        line=line.line,
        function=line.function,
        code=line.code,
        count=line.count,
        total_ns=line.total_ns,
        max_ns=line.max_ns,
        last_ns=max(0, line.last_ns - origin),
        cpu_ns=line.cpu_ns if line.cpu_wall_ns else None,
        cpu_wall_ns=line.cpu_wall_ns,
        kind=line.kind,
        future_id=line.future_id,
        label=line.label,
        route=line.route,
    )


def _tasks_alive(loop: object, listed: int | None = None) -> int:
    try:
        counted = getattr(loop, "tasks_alive", None)  # a trio run counts its own
        if counted is not None:
            return int(counted())
        if listed is not None:  # counted by a reading of the tasks of the same moment
            return listed
        return len(asyncio.all_tasks(loop))  # type: ignore[arg-type]
    except Exception:  # a loop closing under us
        return 0


def loop_entry(
    state: LoopState, now: int, origin: int, qs: tuple[float, ...], listed: int | None = None
) -> LoopEntry:
    """One loop's health now (``listed``: its live tasks as a reading counted them)."""
    loop = state.loop()
    if loop is None or state.closed or loop.is_closed():
        condition, alive, running = "closed", 0, None
    elif not loop.is_running():
        condition, alive, running = "stopped", _tasks_alive(loop, listed), None
    else:
        _, inner, _ = running_calls(state.record.thread)
        alive = _tasks_alive(loop, listed)
        condition, running = "running", _running_call(inner, now, origin)
    with state.lock:
        episodes = [_episode(e, now, origin) for e in state.episodes]
        worst = [_episode(e, now, origin) for e in state.worst]
        lag_now = state.lag_now(now) if condition == "running" else state.lag_last
        ongoing = state.ongoing is not None
        lines = [_blocked_line(line, origin) for line in state.blocking_lines()]
        other_blocks, other_ns = state.lines_evicted, state.evicted_ns
    return LoopEntry(
        id=state.record.id,
        label=state.record.label,
        thread=state.record.thread_name,
        state=condition,
        lag_now_ns=lag_now,
        lag_ns=at_most(stats.percentiles(state.lag_hist, qs), state.lag_max),
        max_lag_ns=state.lag_max,
        heartbeats=state.heartbeats,
        tasks_alive=alive,
        running=running,
        blocked=ongoing,
        blocked_count=state.episode_count,
        episodes=episodes,
        worst_episodes=worst,
        late_wakeups=state.late_wakeups,
        blocking_lines=lines,
        other_blocks=other_blocks,
        other_blocks_ns=other_ns,
    )


def loop_document(
    collector: Collector, now: int, alive: Mapping[int, int] | None = None
) -> LoopDocument:
    """Every instrumented loop's health, oldest loop first.

    Args:
        alive: live tasks by loop id as a reading of the tasks counted them (listing 100,000
            tasks again took 0.1-0.36 s); a loop not in it has its tasks listed now.
    """
    monitor = collector.monitor
    origin = collector.session.start_ns
    qs = collector.options.percentiles
    states = sorted(monitor.states.values(), key=lambda s: s.record.id)
    counts = alive or {}
    return LoopDocument(
        schema=SCHEMA,
        block_threshold_ns=monitor.threshold_ns,
        loops=[loop_entry(s, now, origin, qs, counts.get(s.record.id)) for s in states],
        block_min_ns=monitor.block_min_ns,
    )


def snapshot(
    collector: Collector,
    running: bool = True,
    waiting_thread: int | None = None,
    logs_limit: int | None = None,
    reading: wait_views.TaskReading | None = None,
    tasks_graph: tuple[TasksDocument, GraphDocument] | None = None,
) -> Snapshot:
    """Every document at once, as of now (drain first for an up-to-date picture).

    Args:
        waiting_thread: the thread that asked and waits for it (``prof.snapshot()``): a loop
            of that thread cannot run a callback now, so its tasks are read from here.
        logs_limit: the newest entries kept in each log (a recording's tick); None: all.
        reading: the tasks as read lately (the endpoint's), instead of reading them now.
        tasks_graph: the tasks and the wait-for graph as built lately (a recording's moment
            between its rebuilds), instead of building them.
    """
    now = clock.now_ns()
    origin = collector.session.start_ns
    futures = futures_document(collector, now)
    by_id = {f.id: f for f in collector.futures()}
    channels = channels_document(collector)
    loop = loop_document(collector, now, None if reading is None else reading.alive)
    executors = wait_views.executors_document(collector.options.percentiles, by_id.values())
    resources = resource_views.resources_document(collector, now)
    tasks, graph = tasks_graph or _tasks_and_graph(
        collector, now, resources, channels, SNAPSHOT_TASKS, waiting_thread, reading=reading
    )
    warnings = _warnings(collector, now, futures, channels, loop, executors, resources, graph)
    return Snapshot(
        schema=SCHEMA,
        status=status(collector, now, running),
        futures=futures,
        future_logs=[future_logs(by_id[e.id], now, origin, logs_limit) for e in futures.futures],
        channels=channels,
        channel_logs=[channel_logs(c, origin, logs_limit) for c in channel_registry()],
        flow=flow(collector),
        streams=streams_document(collector),
        stream_logs=[stream_logs(r, origin, logs_limit) for r in stream_registry()],
        loop=loop,
        executors=executors,
        resources=resources,
        resource_logs=[
            resource_views.resource_logs(r, origin, logs_limit) for r in resource_registry()
        ],
        tasks=tasks,
        graph=graph,
        threads=threads_document(collector.threads, now, origin, 0 if not running else FRESH_NS),
        warnings=warnings.warnings,
        functions=function_views.functions_document(collector, now),
        user_metrics=function_views.metrics_document(collector, now),
    )


def _warnings(
    collector: Collector,
    now: int,
    futures: FuturesDocument,
    channels: ChannelsDocument,
    loop: LoopDocument,
    executors: ExecutorsDocument,
    resources: ResourcesDocument,
    graph: GraphDocument | None = None,
) -> WarningsDocument:
    docs = lints.Documents(
        now_ns=now,
        elapsed_ns=max(0, now - collector.session.start_ns),
        futures=futures.futures,
        channels=channels.channels,
        loops=loop.loops,
        executors=executors.executors,
        resources=resources.resources,
        never_awaited=futures.never_awaited,
        block_threshold_ns=loop.block_threshold_ns,
        serves=bool(routes.serving()),
        recent_ends=_recent_ends(collector),
        graph=graph,
        errors=_errors(collector),
        unretrieved=_unretrieved(collector),
        paths=lineage_views.lineage_paths(
            _labels(collector),
            {c.id: c.label for c in channel_registry()}
            | {-r.id: r.label for r in stream_registry()},
            collector.options.percentiles,
        ),
    )
    book = warning_book(collector)
    # Without the tasks read (``/warnings``), the deadlocks are the collector's watch's.
    book.update(docs, keep=frozenset() if graph is not None else lints.GRAPH_KINDS)
    return book.document(collector.session.start_ns)


#: each collector's diagnoses over time, kept here (the documents' layer) and not on the
#: collector, which imports no lint; gone with the collector
_books: weakref.WeakKeyDictionary[Collector, lints.WarningBook] = weakref.WeakKeyDictionary()


def warning_book(collector: Collector) -> lints.WarningBook:
    """The collector's warnings over time (evaluated on its thread), made on first use."""
    book = _books.get(collector)
    if book is None:
        thresholds = lints.Thresholds.from_options(collector.options.warn)
        book = _books[collector] = lints.WarningBook(thresholds)
    return book


def _recent_ends(collector: Collector) -> dict[int, list[tuple[int, int, str]]]:
    """When each future's recent finished calls began and ended (since the profile's start),
    and how: for the cancellation lint, of the futures with cancelled calls."""
    origin = collector.session.start_ns
    ends: dict[int, list[tuple[int, int, str]]] = {}
    for record in collector.futures():
        recent = record.stats.recent
        if recent and record.stats.cancelled:
            ends[record.id] = [
                (r.created - origin, r.finished - origin, call_field(r, "outcome") or "returned")
                for r in list(recent)
            ]
    return ends


def warnings_document(collector: Collector) -> WarningsDocument:
    """``GET /warnings``: every lint evaluated now over every document."""
    now = clock.now_ns()
    qs = collector.options.percentiles
    return _warnings(
        collector,
        now,
        futures_document(collector, now),
        channels_document(collector),
        loop_document(collector, now),
        wait_views.executors_document(qs, collector.futures()),
        resource_views.resources_document(collector, now),
    )


#: tasks a snapshot lists at most (the summary of where they wait counts them all)
SNAPSHOT_TASKS = 200
#: live tasks up to which the collector's watch reads every task each second; past it, only
#: while a lock or semaphore has been held ``STUCK_HELD_NS`` with a task waiting on it
WALK_TASKS = 2000


def _tasks_and_graph(
    collector: Collector,
    now: int,
    resources: ResourcesDocument,
    channels: ChannelsDocument,
    limit: int,
    waiting_thread: int | None = None,
    outside: bool = True,
    reading: wait_views.TaskReading | None = None,
) -> tuple[TasksDocument, GraphDocument]:
    """Every live task, read now (or as ``reading`` read them), as ``/tasks`` lists them (its
    first ``limit``), and the wait-for graph they make with the resources and channels."""
    if reading is None:
        answers = wait_views.responsive_loops(collector.monitor, now)

        def responsive(record: LoopRecord) -> bool:
            return record.thread != waiting_thread and answers(record)

        reading = wait_views.read_tasks(responsive, None, outside)
    consistent = reading.consistent
    entries = reading.task_entries()
    tasks = TasksDocument(
        schema=SCHEMA,
        total=reading.total,
        consistent=consistent,
        tasks=entries[:limit],
        waits=reading.waits,
        walked=len(entries),
    )
    return tasks, graph_document(entries, resources.resources, channels.channels, consistent)


#: how often the collector looks for deadlocks with nobody asking (twice a second: a
#: deadlock is at ``/warnings`` within a second, on a loaded machine too)
STUCK_EVERY_NS = 500_000_000
#: past ``WALK_TASKS`` live tasks, a lock held this long while a task waits on it is what
#: makes the watch read every task
STUCK_HELD_NS = 1_000_000_000


def watch_for_deadlocks(collector: Collector) -> None:
    """Look for deadlocks twice a second on the collector's tick, so that one that held during
    the run reaches the exit report whether or not anyone asked: a deadlocked program is
    ended by a timeout, Ctrl-C or SIGTERM, and its shutdown cancels the stuck tasks before
    the report is written. The tasks are read only where a deadlock may be: few tasks, or a
    lock held for a second while another task waits on it; reading the tasks costs the
    program at most 1% of its time.

    Each loop reads its own tasks in a callback the tick asks it to run, and a later tick
    takes what it read: the collector's thread never waits for the program (the loop monitor
    runs there), and a loop that does not answer within half a second is not read this time
    (a deadlocked loop is idle, and answers)."""
    due = [0]
    asked: list[_Asked] = []

    def tick(now: int) -> None:
        if asked:
            if not asked[0].ready(now):
                return
            reading = asked.pop()
            walks, spent_ns, consistent = reading.taken()
            if consistent:  # reading every task costs the program's loop: 1% of the time
                due[0] = max(due[0], reading.asked_ns + 100 * spent_ns)
            entries = [w.entry for w in wait_views.task_tree(walks)]
            channels = channels_document(collector).channels
            graph = graph_document(entries, reading.resources, channels, consistent)
            _judge_deadlocks(collector, now, graph)
            return
        if now < due[0]:
            return
        due[0] = now + STUCK_EVERY_NS
        resources = resource_views.resources_document(collector, now)
        alive = 0
        for state in list(collector.monitor.states.values()):
            loop = state.loop()
            alive += _tasks_alive(loop) if loop is not None and not loop.is_closed() else 0
        held = any(
            r.waiters_now and any(h.held_ns >= STUCK_HELD_NS for h in r.holders)
            for r in resources.resources
        )
        if alive <= WALK_TASKS or held:
            responsive = wait_views.responsive_loops(collector.monitor, now)
            asked.append(_Asked(now, resources.resources, responsive))

    collector.on_tick("looking for deadlocks", tick)
    collector.on_tick("evaluating the findings", _findings_watch(collector))


#: how often the collector evaluates every finding with nobody asking, at the most: a finding
#: that holds for a second reaches the exit report with when it began and ended
FINDINGS_EVERY_NS = 1_000_000_000
#: the share of one CPU the evaluation may take, at the most: after one that took *t* of the
#: collector thread's CPU time, the next comes ``t / FINDINGS_SHARE`` later at the earliest
FINDINGS_SHARE = 0.01


def _findings_watch(collector: Collector) -> Callable[[int], None]:
    """Every lint over the documents once a second, on the collector's thread (never on the
    program's loop: it reads what ``/warnings`` reads, and no task), into the collector's
    warnings, so that a finding that held during the run (a leak whose tasks the shutdown
    cancels, an event whose waiters were cancelled at exit) is in the exit report with when
    it first and last held, whether or not anyone asked. Spaced so that it takes at most
    ``FINDINGS_SHARE`` of one CPU (about 10 ms of CPU with 10,000 live tasks: once a second);
    the deadlocks stay the deadlock watch's."""
    due = [0]

    def tick(now: int) -> None:
        if now < due[0]:
            return
        began = time.thread_time_ns()  # the CPU it takes: a thread descheduled costs none
        warnings_document(collector)
        spent = time.thread_time_ns() - began
        due[0] = now + max(FINDINGS_EVERY_NS, round(spent / FINDINGS_SHARE))

    return tick


def _errors(collector: Collector) -> dict[int, tuple[str, str]]:
    """What the latest call that raised of each future raised (type, message), of the
    futures whose recent calls' log holds one: a dead consumer's finding names it."""
    errors: dict[int, tuple[str, str]] = {}
    for record in collector.futures():
        if not record.stats.raised:
            continue
        for r in reversed(list(record.stats.recent)):
            exc_type = call_field(r, "exc_type")
            if exc_type is not None:
                errors[record.id] = (exc_type, call_field(r, "exc_message") or "")
                break
    return errors


def _unretrieved(collector: Collector) -> list[tuple[int, str, str, int]]:
    """The tasks that raised and whose exception nobody has retrieved yet (since the start)."""
    origin = collector.session.start_ns
    return [
        (e.future_id, e.exc_type, e.exc_message, max(0, e.raised_ns - origin))
        for e in _raised.unretrieved()
        if e.raised_ns >= origin
    ]


class _Asked:
    """One reading of every loop's tasks for the deadlock watch: asked of each running loop
    (a callback it runs), read here for a loop that is not running."""

    def __init__(
        self, now: int, resources: list[ResourceEntry], responsive: Callable[[LoopRecord], bool]
    ) -> None:
        self.asked_ns = now
        self.resources = resources
        self.walks: list[TaskWalk] = []
        self.spent_ns = 0
        self.consistent = True
        self.pending: list[concurrent.futures.Future[tuple[list[TaskWalk], int]]] = []
        for record in loop_registry():
            loop = record.loop()
            if loop is None or loop.is_closed():
                continue
            if not loop.is_running():  # parked between runs: nothing changes it meanwhile
                self.walks.extend(walk_loop(record))
                continue
            if record.thread == threading.get_ident() or not responsive(record):
                self.consistent = False
                continue
            self.pending.append(_ask(loop, record))

    def ready(self, now: int) -> bool:
        """Whether every loop answered, or the time to answer is over (then those that did
        not are left out)."""
        if all(f.done() for f in self.pending):
            return True
        if now - self.asked_ns < STUCK_EVERY_NS:
            return False
        for f in self.pending:
            if f.cancel():
                self.consistent = False
        return True

    def taken(self) -> tuple[list[TaskWalk], int, bool]:
        """The walks read, the time the loops spent reading them, and whether every loop
        was read."""
        for f in self.pending:
            if f.cancelled() or f.exception() is not None:
                self.consistent = False
                continue
            walks, spent = f.result()
            self.walks.extend(walks)
            self.spent_ns += spent
        return self.walks, self.spent_ns, self.consistent


def _ask(
    loop: asyncio.AbstractEventLoop, record: LoopRecord
) -> concurrent.futures.Future[tuple[list[TaskWalk], int]]:
    """Have ``loop`` read its own tasks (and time it), soon, in slices of callbacks (never
    one long callback: see :class:`~asyncflow.model.waits.SlicedWalk`)."""
    done: concurrent.futures.Future[tuple[list[TaskWalk], int]] = concurrent.futures.Future()
    reading = SlicedWalk(record, loop)
    # The two callbacks reach the reading through ``held``, which the first of them to end the
    # reading empties: a future keeps its callbacks, so a callback that held the reading would
    # make a cycle (the reading, its future, the callback) of every walk it read, freed only
    # by a collection of the garbage collector, twice a second, in the program's process.
    held = [reading]

    def finished(walked: concurrent.futures.Future[list[TaskWalk]]) -> None:
        spent = held.pop().spent_ns if held else 0
        if walked.cancelled() or not done.set_running_or_notify_cancel():
            return
        exc = walked.exception()  # taken as a loop not read; never the program's
        if exc is not None:
            done.set_exception(exc)
        else:
            done.set_result((walked.result(), spent))

    def cancel(asked: concurrent.futures.Future[Any]) -> None:
        if asked.cancelled() and held:
            held.pop().done.cancel()  # no more slices

    reading.done.add_done_callback(finished)
    done.add_done_callback(cancel)
    try:
        loop.call_soon_threadsafe(reading.step)
    except RuntimeError:  # closed meanwhile
        done.cancel()
    return done


def wait_for_graph(
    collector: Collector, reading: wait_views.TaskReading | None = None
) -> GraphDocument:
    """``GET /graph``: the wait-for graph of every live task (those ``reading`` read, or read
    now), and its deadlocks."""
    now = clock.now_ns()
    resources = resource_views.resources_document(collector, now)
    channels = channels_document(collector)
    graph = _tasks_and_graph(collector, now, resources, channels, 0, reading=reading)[1]
    _judge_deadlocks(collector, now, graph)  # what /graph shows, /warnings says
    return graph


def _judge_deadlocks(collector: Collector, now: int, graph: GraphDocument) -> None:
    """The wait-for graph's lints (deadlocks, locks made before an attach held by a waiting
    task) on a graph just read, into the collector's warnings."""
    book = warning_book(collector)
    adopted = any(n.id.startswith("lock:") for n in graph.nodes)
    if not graph.cycles and not adopted and not any(map(book.holds, lints.GRAPH_KINDS)):
        return
    docs = lints.Documents(
        now_ns=now, elapsed_ns=max(0, now - collector.session.start_ns), graph=graph
    )
    book.update(docs, lints.GRAPH_LINTS, lints.GRAPH_KINDS)
