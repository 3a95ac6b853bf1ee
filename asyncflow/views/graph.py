"""The wait-for graph: what each waiting task waits on, who can release it, and the deadlocks.

A pure function of the documents: the live tasks (``/tasks``: what each waits on, the tracked
calls down its chain, the tasks it awaits), the resources (``/resources``: who holds each lock
and permit) and the channels (``/channels``: which futures put into and take from each queue).
An edge goes from whoever waits to whatever it waits for: a task to the lock it waits on, the
lock to the task that holds it; a task to the queue it reads, the queue to the tasks that fill
it; a task to the tasks it awaits.

A task is *stuck* when it waits on something only stuck tasks can release; a cycle of stuck
tasks is a deadlock. Releasers asyncflow cannot name (code outside any task, a holder it did
not see take the lock, a producer with no live task) could release it, so a wait on them is
never stuck: the graph names a deadlock only when every task that could end it is in it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from asyncflow.schema import (
    SCHEMA,
    AwaitFrame,
    ChannelEntry,
    GraphCycle,
    GraphDocument,
    GraphEdge,
    GraphNode,
    ResourceEntry,
    TaskEntry,
)

__all__ = ["MAX_NODES", "graph_document", "resource_names"]

#: nodes a graph lists at most (cycles' nodes first); the count left out is in ``omitted``
MAX_NODES = 2000

#: waits that end only when every task awaited ends (gather, a task group, one awaited task)
_AWAITS_ALL = frozenset({"task", "gather", "taskgroup"})
#: waits whose releasers the graph names: the holders of a lock, the producers of a queue...
_HELD = frozenset({"lock", "semaphore"})


def resource_names(resources: Iterable[ResourceEntry]) -> dict[int, str]:
    """Each resource's name: its label, with ``#id`` when other resources share the label
    (locks created on one line: ``bank.py:9 #1`` and ``bank.py:9 #2``)."""
    entries = list(resources)
    seen: dict[str, int] = {}
    for r in entries:
        seen[r.label] = seen.get(r.label, 0) + 1
    return {
        r.id: r.name or (f"{r.label} #{r.id}" if seen[r.label] > 1 else r.label) for r in entries
    }


class _Builder:
    """The graph as it is built: nodes by id, edges, and each node's releasers."""

    def __init__(self) -> None:
        self.nodes: dict[str, GraphNode] = {}
        self.edges: list[GraphEdge] = []
        #: node id -> the node ids it waits for
        self.out: dict[str, list[str]] = {}
        #: nodes that something the graph does not name could release (never stuck)
        self.open: set[str] = set()
        #: waits that end only when every target does (else: when any does)
        self.all_of: set[str] = set()
        #: (source, target, relation) of the edges made: each once, however many tasks wait
        #: on the lock or queue whose releasers they name
        self._made: set[tuple[str, str, str]] = set()

    def node(self, node: GraphNode) -> None:
        self.nodes.setdefault(node.id, node)
        self.out.setdefault(node.id, [])

    def edge(self, edge: GraphEdge) -> None:
        key = (edge.source, edge.target, edge.relation)
        if key in self._made:
            return
        self._made.add(key)
        self.edges.append(edge)
        self.out.setdefault(edge.source, []).append(edge.target)


def _task_node(t: TaskEntry) -> GraphNode:
    return GraphNode(
        id=f"task:{t.name}",
        kind="task",
        label=t.name,
        state=t.state,
        coroutine=t.future_label or t.coroutine,
        where=t.where,
        parent=t.parent,
        created_at=t.created_at,
    )


def _held_where(holder: TaskEntry, held: list[int], resource_id: int) -> AwaitFrame | None:
    """The ``async with`` line where ``holder`` took the resource: its open with-blocks
    matched to the resources it holds, oldest first, when they are as many."""
    if len(holder.held_at) != len(held) or resource_id not in held:
        return None
    return holder.held_at[held.index(resource_id)]


def graph_document(
    tasks: Sequence[TaskEntry],
    resources: Sequence[ResourceEntry],
    channels: Sequence[ChannelEntry],
    consistent: bool = True,
    limit: int = MAX_NODES,
) -> GraphDocument:
    """``GET /graph``: the wait-for graph of the waiting tasks, and its cycles.

    Args:
        tasks: every live task (``TasksDocument.tasks`` read with no limit).
        resources: the resources, whose holders name the tasks that can release a lock.
        channels: the channels, whose senders and receivers release a queue's waiters.
        consistent: whether the tasks were read on their loops' threads.
        limit: nodes listed at most; cycles are found over all of them first.
    """
    by_name: dict[str, TaskEntry] = {}
    by_call: dict[int, str] = {}
    by_future: dict[int, list[str]] = {}
    for t in tasks:
        by_name.setdefault(t.name, t)
        for call in t.chain_calls:
            by_call[call] = t.name
        if t.future_id is not None:
            by_future.setdefault(t.future_id, []).append(t.name)
    rs = {r.id: r for r in resources}
    cs = {c.id: c for c in channels}
    names = resource_names(resources)
    # what each task holds, oldest hold first: to match holds to its open `async with` lines
    holds: dict[str, list[tuple[int, int]]] = {}
    for r in resources:
        for h in r.holders:
            holder = by_call.get(h.call_id) if h.call_id is not None else None
            if holder is not None:
                holds.setdefault(holder, []).append((h.since_ns, r.id))
    held_ids = {name: [rid for _, rid in sorted(pairs)] for name, pairs in holds.items()}
    untracked = _untracked_holders(tasks)

    g = _Builder()
    for t in tasks:
        if t.state != "waiting" or t.waits_on is None:
            continue
        me = f"task:{t.name}"
        g.node(_task_node(t))
        target = t.waits_on
        if t.awaits and target.kind in _AWAITS_ALL | {"wait", "future"}:
            for name in t.awaits:
                other = by_name.get(name)
                if other is not None:
                    g.node(_task_node(other))
                g.edge(GraphEdge(me, f"task:{name}", "awaits", t.where))
                if other is None:
                    g.open.add(f"task:{name}")
            if target.kind in _AWAITS_ALL and not target.description.startswith("wait_for"):
                g.all_of.add(me)
            else:  # asyncio.wait may return at the first, or at a timeout
                g.open.add(me)
            continue
        ref = target.ref
        kind, _, number = (ref or "").partition(":")
        if kind == "resource" and number.isdigit() and int(number) in rs:
            r = rs[int(number)]
            g.node(GraphNode(ref or "", r.primitive, names[r.id]))
            g.edge(GraphEdge(me, ref or "", "waits", t.where))
            _releasers_of_resource(g, r, ref or "", by_call, by_name, held_ids)
            if target.kind not in _HELD:
                g.open.add(ref or "")  # a condition or event: anyone may signal it
        elif kind == "channel" and number.isdigit() and int(number) in cs:
            # a queue's readers and its writers wait on different things: one node each
            c = cs[int(number)]
            key = f"{ref}:{'get' if target.kind == 'queue_get' else 'put'}"
            g.node(GraphNode(key, target.kind, c.label))
            g.edge(GraphEdge(me, key, "waits", t.where))
            if target.kind in ("queue_get", "queue_put"):
                _releasers_of_channel(g, c, key, target.kind, by_future, by_name)
            else:  # a join: the consumers' task_done(), whoever they are
                g.open.add(key)
        elif target.kind == "lock" and ref is None and target.description in untracked:
            # a lock made before an attach: its holder read from the tasks' references
            words = target.description.removeprefix(_ACQUIRE)
            key = f"lock:{words}"
            g.node(GraphNode(key, "lock", words))
            g.edge(GraphEdge(me, key, "waits", t.where))
            owner = untracked[target.description]
            g.node(_task_node(owner))
            g.edge(GraphEdge(key, f"task:{owner.name}", "held_by"))
        else:  # a sleep, a socket, an executor job, an untracked lock or queue: not stuck
            key = f"{target.kind}:{target.ref or target.description}"
            g.node(GraphNode(key, target.kind, target.label or target.description))
            g.edge(GraphEdge(me, key, "waits", t.where))
            g.open.add(key)
    stuck = _stuck(g)
    cycles = _cycles(g, stuck)
    return _document(g, stuck, cycles, consistent, limit)


#: how a wait on a lock starts (``acquire lock Lock at 0x…``): the rest names the lock
_ACQUIRE = "acquire lock "


def _untracked_holders(tasks: Sequence[TaskEntry]) -> dict[str, TaskEntry]:
    """The waits on locks asyncflow does not track (made before an attach), by the words the
    wait says (``acquire lock Lock at 0x…``), to the one task that holds each in an open
    ``async with`` block (``TaskEntry.holds``, read from the tasks' references). A lock no
    walked task holds so is left out: taken by ``acquire()`` or outside a task, its holder
    is unknown and could release it."""
    found: dict[str, TaskEntry] = {}
    for t in tasks:
        for words in t.holds:
            found[_ACQUIRE + words] = t
    return found


def _releasers_of_resource(
    g: _Builder,
    r: ResourceEntry,
    ref: str,
    by_call: dict[int, str],
    by_name: dict[str, TaskEntry],
    held_ids: dict[str, list[int]],
) -> None:
    """Edges from a lock or semaphore to the tasks holding it; open when it has a holder the
    graph cannot name, or a permit free."""
    named = 0
    for h in r.holders:
        holder = by_call.get(h.call_id) if h.call_id is not None else None
        if holder is None or holder not in by_name:
            continue
        named += 1
        g.node(_task_node(by_name[holder]))
        where = _held_where(by_name[holder], held_ids.get(holder, []), r.id)
        g.edge(GraphEdge(ref, f"task:{holder}", "held_by", where, h.held_ns))
    free = r.permits is not None and bool(r.permits.available)
    if named == 0 or named < len(r.holders) or r.untracked_holds or free:
        g.open.add(ref)


def _releasers_of_channel(
    g: _Builder,
    c: ChannelEntry,
    ref: str,
    kind: str,
    by_future: dict[int, list[str]],
    by_name: dict[str, TaskEntry],
) -> None:
    """Edges from a queue to the live tasks of the futures that put into it (for a get) or
    take from it (for a put); open when one of them has no live task the graph can name."""
    edges = c.senders if kind == "queue_get" else c.receivers
    relation = "sent_by" if kind == "queue_get" else "received_by"
    named = 0
    for e in edges:
        names = by_future.get(e.future_id, []) if e.future_id is not None else []
        if not names:
            g.open.add(ref)  # untracked code, or a future with no live task: may come back
            continue
        for name in names:
            named += 1
            g.node(_task_node(by_name[name]))
            g.edge(GraphEdge(ref, f"task:{name}", relation))
    if not named:
        g.open.add(ref)


def _stuck(g: _Builder) -> set[str]:
    """The nodes that cannot go on: start from every waiting task and what it waits on, and
    free whatever can be released, until nothing changes (the greatest fixed point), each
    edge looked at once: freeing a node frees the nodes that wait on it."""
    stuck = {n for n, node in g.nodes.items() if node.state in (None, "waiting")} - g.open
    waiting_on: dict[str, list[str]] = {}
    need: dict[str, int] = {}  # a gather's: the stuck tasks it still waits for
    free: list[str] = []
    for n in stuck:
        targets = g.out.get(n, [])
        for t in targets:
            waiting_on.setdefault(t, []).append(n)
        if n in g.all_of:  # a gather goes on once every task it awaits does
            need[n] = sum(1 for t in targets if t in stuck)
            if not need[n]:
                free.append(n)
        elif not targets or any(t not in stuck for t in targets):  # else any one will do
            free.append(n)
    while free:
        n = free.pop()
        if n not in stuck:
            continue
        stuck.discard(n)
        for source in waiting_on.get(n, ()):
            if source not in stuck:
                continue
            if source in need:
                need[source] -= 1
                if need[source] > 0:
                    continue
            free.append(source)
    return stuck


def _cycles(g: _Builder, stuck: set[str]) -> list[GraphCycle]:
    """One cycle through each strongly connected group of stuck nodes that holds a task."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on: set[str] = set()
    stack: list[str] = []
    groups: list[list[str]] = []
    counter = 0
    for root in sorted(stuck):
        if root in index:
            continue
        # Tarjan's, iteratively: (node, the next of its targets to look at)
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on.add(node)
            targets = [t for t in g.out.get(node, []) if t in stuck]
            if i < len(targets):
                work.append((node, i + 1))
                t = targets[i]
                if t not in index:
                    work.append((t, 0))
                elif t in on:
                    low[node] = min(low[node], index[t])
                continue
            for t in targets:
                if t in on:
                    low[node] = min(low[node], low[t])
            if low[node] == index[node]:
                group = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    group.append(w)
                    if w == node:
                        break
                groups.append(group)
    cycles = []
    for group in groups:
        members = set(group)
        first = min((n for n in group if n.startswith("task:")), default=None)
        if first is None:
            continue
        if len(group) == 1 and first not in g.out.get(first, []):
            continue  # a lone node without a self-loop is no cycle
        path = _path_back(g, first, members)
        if path:
            tasks = [g.nodes[n].label for n in path if n.startswith("task:")]
            cycles.append(GraphCycle(nodes=path, tasks=tasks))
    return cycles


def _path_back(g: _Builder, start: str, members: set[str]) -> list[str]:
    """A simple path from ``start`` back to itself inside ``members`` (breadth first: the
    shortest)."""
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for t in g.out.get(node, []):
                if t not in members:
                    continue
                if t == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return path[::-1]
                if t not in previous:
                    previous[t] = node
                    nxt.append(t)
        frontier = nxt
    return []


def _document(
    g: _Builder, stuck: set[str], cycles: list[GraphCycle], consistent: bool, limit: int
) -> GraphDocument:
    first = [n for c in cycles for n in c.nodes]
    order = list(dict.fromkeys(first + sorted(stuck) + list(g.nodes)))
    kept = set(order[:limit])
    nodes = []
    for n in order[:limit]:
        node = g.nodes[n]
        if n in stuck and node.kind == "task":
            node = dataclasses.replace(node, stuck=True)
        nodes.append(node)
    edges = [e for e in g.edges if e.source in kept and e.target in kept]
    return GraphDocument(
        schema=SCHEMA,
        consistent=consistent,
        nodes=nodes,
        edges=edges,
        cycles=cycles,
        omitted=max(0, len(order) - limit),
    )
