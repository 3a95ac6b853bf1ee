"""Pure functions from the resources' registry to the resource documents of
:mod:`asyncflow.schema`: ``/resources``, ``/resources/{id}/logs``, their part of the flow graph.

Cold path only. Everything hot-path lives behind :mod:`asyncflow.instrumentation.resources`'s read
models (``acquisitions``, ``releases``, ``holds_of``, ``logs_of``, ``probe``); this module never
unpacks a recorder's tuples.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import replace

from asyncflow import stats
from asyncflow.instrumentation.futures import call_field, call_state, gone_labels
from asyncflow.instrumentation.resources import (
    BARRIER,
    CONDITION,
    EVENT,
    LIMITER,
    SEMAPHORE,
    LogRecord,
    Probe,
    ResourceRecord,
    acquisitions,
    holds_of,
    logs_of,
    probe,
    releases,
    resource_registry,
)
from asyncflow.model.collector import Collector
from asyncflow.schema import (
    SCHEMA,
    BarrierInfo,
    ConditionInfo,
    EventInfo,
    FlowEdge,
    FlowNode,
    Location,
    PermitsInfo,
    ResourceEntry,
    ResourceFutureEntry,
    ResourceHolder,
    ResourceLogEntry,
    ResourceLogs,
    ResourcesDocument,
)
from asyncflow.views.paging import at_most, ordered_page

__all__ = [
    "UNTRACKED",
    "find_resource",
    "resource_count",
    "resource_entry",
    "resource_flow",
    "resource_logs",
    "resources_document",
]

#: the label of code outside any tracked call, as channels' edges name it
UNTRACKED = "(untracked)"


def _future_labels(collector: Collector) -> dict[int | None, str]:
    labels: dict[int | None, str] = {}
    for fid, label in gone_labels().items():  # folded futures keep their label on edges
        labels[fid] = label
    labels.update((f.id, f.label) for f in collector.futures())
    labels[None] = UNTRACKED
    return labels


def _count(value: float | None) -> int | None:
    """A permit count as JSON can carry it: unlimited (``math.inf``) is None."""
    if value is None or (isinstance(value, float) and math.isinf(value)):
        return None
    return int(value)


def _holders(
    record: ResourceRecord, labels: dict[int | None, str], now: int, origin: int
) -> list[ResourceHolder]:
    out = []
    for hold in holds_of(record):
        call = hold.call
        if call is None:
            out.append(
                ResourceHolder(
                    None,
                    None,
                    UNTRACKED,
                    hold.since_ns - origin,
                    max(0, now - hold.since_ns),
                    None,
                    None,
                )
            )
            continue
        fid = call.future.id
        out.append(
            ResourceHolder(
                call_id=call.call_id,
                future_id=fid,
                label=labels.get(fid, call.future.label),
                since_ns=hold.since_ns - origin,
                held_ns=max(0, now - hold.since_ns),
                call_state=call_state(call),
                outcome=call_field(call, "outcome"),
            )
        )
    return out


def _futures(record: ResourceRecord, labels: dict[int | None, str]) -> list[ResourceFutureEntry]:
    out = [
        ResourceFutureEntry(
            future_id=fid,
            label=labels.get(fid, "?"),
            waits=e.wait_count,
            total_wait_ns=e.wait_ns,
            max_wait_ns=e.wait_max,
            holds=e.hold_count,
            total_hold_ns=e.hold_ns,
            max_hold_ns=e.hold_max,
            signals=e.signals,
        )
        for fid, e in list(record.stats.edges.items())
    ]
    out.sort(key=lambda e: (-e.holds, -e.waits, -e.signals))
    return out


def _permits(record: ResourceRecord, now: Probe, held: int) -> PermitsInfo | None:
    if record.primitive not in (SEMAPHORE, LIMITER):
        return None
    return PermitsInfo(
        initial=_count(record.initial),
        bound=_count(record.bound),
        available=_count(now.value) if now.alive else None,
        held=held,
    )


def resource_entry(
    record: ResourceRecord,
    labels: dict[int | None, str],
    now: int,
    origin: int,
    qs: tuple[float, ...],
) -> ResourceEntry:
    """One resource's figures over the session, and its state now."""
    st = record.stats
    state = probe(record)
    holders = _holders(record, labels, now, origin)
    primitive = record.primitive
    # the waits going on now, by when each began (copied whole: the loop's thread may be
    # adding one); a gone resource has none
    opened = list(st.open_waits.items()) if state.alive else []
    return ResourceEntry(
        id=record.id,
        label=record.label,
        kind=record.kind,
        primitive=primitive,
        location=Location(record.file, record.line),
        state="active" if state.alive else "gone",
        folded=record.folded,
        locked=state.locked,
        acquisitions=acquisitions(record),
        contended_acquisitions=st.contended,
        releases=releases(record),
        unmatched_releases=st.unmatched,
        waits=st.wait_count,
        failed_waits=st.wait_failed,
        total_wait_ns=st.wait_ns,
        max_wait_ns=st.wait_max,
        wait_ns=at_most(stats.percentiles(st.wait_hist, qs), st.wait_max),
        waiters_now=max(st.waiting, state.queued) if state.alive else 0,
        max_waiters=max(st.max_waiting, st.waiting),
        holds=st.hold_count,
        total_hold_ns=st.hold_ns,
        max_hold_ns=st.hold_max,
        hold_ns=at_most(stats.percentiles(st.hold_hist, qs), st.hold_max),
        timed_holds=st.hold_timed,
        hold_sampling_interval=st.hold_interval,
        holders=holders,
        untracked_holds=st.untracked,
        abandoned_holds=st.abandoned,
        permits=_permits(record, state, len(holders) + st.untracked),
        event=EventInfo(state.is_set, st.sets, st.clears, st.immediate)
        if primitive == EVENT
        else None,
        barrier=BarrierInfo(
            parties=_count(record.initial),
            waiting=state.queued,
            broken=state.broken,
            passes=st.passes,
            broken_waits=st.broken,
            aborts=st.aborts,
            resets=st.resets,
        )
        if primitive == BARRIER
        else None,
        condition=ConditionInfo(st.notifies) if primitive == CONDITION else None,
        futures=_futures(record, labels),
        signals=st.notifies if primitive == CONDITION else st.sets if primitive == EVENT else 0,
        woken=st.woken if primitive in (CONDITION, EVENT) else 0,
        open_wait_ns=sum(max(0, now - since) * n for since, n in opened),
        longest_open_wait_ns=max((max(0, now - since) for since, _ in opened), default=0),
    )


def _most_waited(record: ResourceRecord) -> tuple[int, int, int]:
    st = record.stats
    return (-st.wait_ns, -(st.hold_count + st.wait_count), record.id)


def resources_document(
    collector: Collector, now: int, offset: int = 0, limit: int | None = None
) -> ResourcesDocument:
    """Every resource, most waited on first (total wait time, then use), paged by
    ``offset``/``limit``; only the page's entries are built."""
    records = resource_registry()
    labels = _future_labels(collector)
    origin = collector.session.start_ns
    qs = collector.options.percentiles
    page = ordered_page(records, _most_waited, offset, limit)
    entries = [resource_entry(r, labels, now, origin, qs) for r in page]
    shared = Counter(r.label for r in records)  # distinct names for one line's locks
    entries = [
        replace(e, name=f"{e.label} #{e.id}" if shared[e.label] > 1 else e.label) for e in entries
    ]
    return ResourcesDocument(
        schema=SCHEMA,
        total=len(records),
        offset=offset,
        limit=len(entries) if limit is None else limit,
        resources=entries,
    )


def find_resource(resource_id: int) -> ResourceRecord | None:
    """The resource with this id (live, recently gone, or an aggregate), or None."""
    for record in resource_registry():
        if record.id == resource_id:
            return record
    return None


def _log_entries(
    entries: list[LogRecord], origin: int, limit: int | None
) -> list[ResourceLogEntry]:
    newest = entries[::-1][:limit]
    return [
        ResourceLogEntry(
            e.position, e.timestamp_ns - origin, e.duration_ns, e.call_id, e.future_id, e.outcome
        )
        for e in newest
    ]


def resource_logs(record: ResourceRecord, origin: int, limit: int | None = None) -> ResourceLogs:
    """A resource's recent waits, timed holds and signals, newest first."""
    return ResourceLogs(
        schema=SCHEMA,
        resource_id=record.id,
        label=record.label,
        wait_logs=_log_entries(logs_of(record, "wait"), origin, limit),
        hold_logs=_log_entries(logs_of(record, "hold"), origin, limit),
        signal_logs=_log_entries(logs_of(record, "signal"), origin, limit),
    )


def resource_flow(
    collector: Collector, future_node: Callable[[int | None], str]
) -> tuple[list[FlowNode], list[FlowEdge]]:
    """The resources' part of the flow graph: a node per resource, and edges

    - future -> lock, semaphore, condition, limiter, barrier: its holds (``messages``; for a
      barrier, its waits), with the longest wait to get in as ``max_delay_ns``;
    - future -> event: its sets; event -> future: the waits it released.

    ``future_node(future_id)`` returns the id of the future's node, adding it to the graph
    (``views.flow`` has one); edges carry no percentiles (``delay_ns`` is empty).
    """
    del collector  # the registry is global; kept for the signature every part of flow() has
    nodes: list[FlowNode] = []
    edges: list[FlowEdge] = []
    for record in resource_registry():
        key = f"resource:{record.id}"
        nodes.append(FlowNode(key, "resource", record.label))
        for fid, e in list(record.stats.edges.items()):
            if record.primitive == EVENT:
                if e.signals:
                    edges.append(FlowEdge(future_node(fid), key, e.signals, {}, 0))
                if e.wait_count:
                    edges.append(FlowEdge(key, future_node(fid), e.wait_count, {}, e.wait_max))
                continue
            used = e.wait_count if record.primitive == BARRIER else e.hold_count
            if used or e.wait_count:
                edges.append(FlowEdge(future_node(fid), key, used, {}, e.wait_max))
    return nodes, edges


def resource_count() -> int:
    """How many resources the registry lists (for ``/profiler_status``)."""
    return len(resource_registry())
