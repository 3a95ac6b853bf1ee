"""``asyncflow top``: a live terminal view of a running profiler's endpoint, built on textual.

It reads the same JSON documents as any other client, about twice a second, and parses each
with the schema (:func:`asyncflow.schema.load`) into its typed document: top reads fields of
the schema's classes, never keys of raw JSON (and leaves out fields a newer asyncflow added).
An unreachable endpoint, a refused token or a document that does not parse (said with the
field at fault) is shown in the status line and retried; it never ends the view.

Every table is one :class:`View` in :data:`VIEWS`: the route it lists and the schema's class
of its document, its columns (each a value read from an entry, which is also what it sorts on,
how that value is shown, a priority that decides which columns stay on a narrow terminal, and
the line the help screen gives it), where a row's logs are and how to print them. A new
document (resources...) joins top by adding one ``View`` to that table; the key that shows it,
the footer, sorting, the help screen and the logs pane follow from it.
"""

from __future__ import annotations

import asyncio
import io
import os
import textwrap
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import aiohttp
from rich.console import Console
from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.css.query import NoMatches
from textual.screen import ModalScreen
from textual.widgets import DataTable, Footer, Static

from asyncflow.render.report import counted, named
from asyncflow.schema import (
    AwaitFrame,
    ChannelEntry,
    ChannelLogs,
    ChannelsDocument,
    DocumentError,
    ErrorDocument,
    ExecutorEntry,
    ExecutorsDocument,
    FunctionEntry,
    FunctionsDocument,
    FutureEntry,
    FutureLogs,
    FuturesDocument,
    GraphDocument,
    GraphEdge,
    GraphNode,
    Location,
    LoopDocument,
    LoopEntry,
    MetricEntry,
    MetricsDocument,
    ProfilerStatus,
    ResourceEntry,
    ResourcesDocument,
    StackFrame,
    StreamEntry,
    StreamLogs,
    StreamsDocument,
    TaskEntry,
    TasksDocument,
    ThreadEntry,
    ThreadsDocument,
    WarningEntry,
    WarningsDocument,
    load,
)

__all__ = [
    "VIEWS",
    "Column",
    "Context",
    "NotServed",
    "TopApp",
    "View",
    "WaitGraph",
    "Waiter",
    "compact_count",
    "compact_duration",
]

#: a list document, one of its entries, and a logs document
D = TypeVar("D")
E = TypeVar("E")
L = TypeVar("L")
_D = TypeVar("_D")


# -- compact units: a column of durations stays at most six characters wide ---------------------


def compact_duration(ns: int | None) -> str:
    """Nanoseconds in at most six characters: ``850ns``, ``12.3µs``, ``1.2ms``, ``4.56s``,
    ``27.8m`` (minutes), ``3.1h``, ``2.5d``; ``-`` for nothing measured."""
    if ns is None:
        return "-"
    if ns < 1000:
        return f"{ns}ns"
    for scale, unit, limit in (
        (1_000, "µs", 1000),
        (1_000_000, "ms", 1000),
        (1_000_000_000, "s", 600),  # up to 10 minutes in seconds, then minutes
        (60_000_000_000, "m", 100),
        (3_600_000_000_000, "h", 48),
    ):
        value = ns / scale
        if round(value, 1) < limit:
            return f"{value:.3g}{unit}" if value < 100 else f"{value:.0f}{unit}"
    days = ns / 86_400_000_000_000
    return f"{days:.3g}d" if days < 100 else f"{days:.0f}d"


def compact_count(n: int | None) -> str:
    """A count in at most six characters: ``12,345``, ``123k``, ``4.57M``."""
    if n is None:
        return "-"
    if n < 100_000:
        return f"{n:,}"
    if n < 999_500:
        return f"{n / 1000:.0f}k"
    if n < 999_500_000:
        return f"{n / 1e6:.3g}M"
    return f"{n / 1e9:.3g}G"


dur, count = compact_duration, compact_count


def _pct(values: dict[str, int] | None, key: str) -> int | None:
    return (values or {}).get(key)


def _where(location: Location | AwaitFrame | StackFrame | None) -> str:
    return f"{os.path.basename(location.file)}:{location.line}" if location else "-"


# -- the declarative table of views -------------------------------------------------------------


@dataclass(eq=False)
class Row(Generic[E]):
    """One row of a table: an entry of the list document, its key in the table, and what top
    fetched for it beyond the list."""

    entry: E
    #: its key in the table: its id, made unique (see ``_rows``)
    key: str = ""
    #: the age of a future's oldest live call, when top asked its logs (``_fetch_oldest``)
    oldest_ns: int = -1


@dataclass(frozen=True)
class Column(Generic[E]):
    """One column of a view: a value read from an entry (what it sorts on) and how it is shown.

    ``priority`` decides which columns stay when the terminal is narrow: 0 always stays, then 1,
    2... while they fit; the rest are dropped (the help screen still lists them). Numeric
    columns are right-aligned and sort biggest first; text columns sort A to Z.
    """

    name: str
    priority: int
    value: Callable[[E], Any]
    help: str
    show: Callable[[Any], str] = str
    numeric: bool = True
    sortable: bool = True
    #: the one column that takes the room left (the label), truncated with "…"
    flex: bool = False
    #: text columns are cut at this width
    max_width: int = 40
    #: cut from the left, keeping the end (``…ers/app.py:12``: the line number stays)
    cut_left: bool = False

    def read(self, row: Row[E]) -> Any:
        """The value of this column for ``row``."""
        return self.value(row.entry)

    def cell(self, row: Row[E]) -> str:
        """The text of this column for ``row``."""
        return self.show(self.read(row))

    def key(self, row: Row[E]) -> tuple[bool, Any]:
        """The sort key of ``row``: missing values (None) sort after the others when the
        order is biggest first."""
        value = self.read(row)
        return (value is not None, 0 if value is None else value)


def _dur(name: str, priority: int, value: Callable[[E], Any], help: str) -> Column[E]:
    return Column(name, priority, value, help, show=dur)


def _count(name: str, priority: int, value: Callable[[E], Any], help: str) -> Column[E]:
    return Column(name, priority, value, help, show=count)


def _text(
    name: str, priority: int, value: Callable[[E], Any], help: str, **options: Any
) -> Column[E]:
    return Column(name, priority, value, help, numeric=False, **options)


@dataclass
class Context:
    """What a log printer knows beyond the log: the time now and the labels of futures."""

    uptime_ns: int = 0
    #: future id -> label, from every document top has read
    labels: dict[int, str] = field(default_factory=dict)
    #: future ids a printer could not name (top then asks /futures and prints again)
    missing: set[int] = field(default_factory=set)
    #: the selected row's entry, as the list document gives it (None: no row)
    row: Any = None

    def future(self, future_id: int | None, call_id: int | None = None) -> str:
        """A future's label (and the call), as a person reads it."""
        if future_id is None:
            label = "(untracked code)"
        elif future_id in self.labels:
            label = self.labels[future_id]
        else:
            self.missing.add(future_id)
            label = f"future {future_id}"
        return label if call_id is None else f"{label} (call {call_id})"


class Get(Protocol):
    """Fetch a route of the endpoint and parse it as the schema's ``document`` class."""

    def __call__(self, path: str, document: type[_D], /) -> Awaitable[_D]: ...


class NotServed(RuntimeError):
    """The endpoint has no such route (404): an older asyncflow, before the route existed."""


@dataclass(frozen=True)
class Logs(Generic[L]):
    """Where a row's logs are, and how to print them."""

    #: the route (``{id}`` is the row's id) and the schema's class of its document
    route: str
    document: type[L]
    lines: Callable[[L, Context], list[str]]


def _entry_id(entry: Any) -> str:
    return str(entry.id)


@dataclass(frozen=True)
class View(Generic[D, E]):
    """One of top's tables: which document it lists and how."""

    name: str
    #: the key that shows it
    key: str
    #: one line for the help screen: what a row is
    about: str
    #: the list route, the schema's class of its document, and the entries it lists
    route: str
    document: type[D]
    entries: Callable[[D], list[E]]
    columns: tuple[Column[E], ...]
    #: the column it is sorted by at first
    sort: str
    #: a row's logs: fetched from their own route, or printed from the row itself
    logs: Logs[Any] | None = None
    row_lines: Callable[[E, Context], list[str]] | None = None
    #: what the pane below the table shows while no row is selected, from the list document
    detail: Callable[[D], list[str]] | None = None
    #: fetches more per row (e.g. each future's oldest live call) for the first rows shown
    enrich: Callable[[Get, list[Row[E]], Context], Awaitable[None]] | None = None
    #: a row's identity, which the cursor and the logs follow across sorts and refreshes
    row_id: Callable[[E], str] = _entry_id
    #: fetches the document from several routes instead of ``route`` alone
    fetch: Callable[[Get], Awaitable[D]] | None = None
    #: what the status line adds about the document (e.g. a route the profiler lacks)
    note: Callable[[D], str | None] | None = None

    def column(self, name: str) -> Column[E]:
        """The column called ``name``."""
        return next(c for c in self.columns if c.name == name)

    @property
    def has_logs(self) -> bool:
        """Whether enter shows something for a row."""
        return self.logs is not None or self.row_lines is not None


def _thread_name(t: ThreadEntry) -> str:
    name = t.name + (" (asyncflow)" if t.asyncflow else "")
    loops = t.loop_ids
    return name + (f" (loop {', '.join(map(str, loops))})" if loops else "")


def _percent(share: float | None) -> str:
    return "-" if share is None else f"{share:.0%}"


# futures ---------------------------------------------------------------------------------------


def _live(f: FutureEntry) -> int:
    calls = f.calls
    return calls.pending + calls.running + calls.suspended


def _started(f: FutureEntry) -> int:
    """Calls that were polled at least once (live or finished): idle time is theirs."""
    o = f.outcomes
    return max(0, f.call_count - f.calls.pending - o.never_awaited)


def _scheduled_p99(f: FutureEntry) -> int | None:
    """The 99th percentile of the wait from a wake-up to the poll it led to; None (``-``)
    when no wake-up was measured (uvloop's loop, a call awaited inside another), not 0."""
    return _pct(f.scheduled_delay_ns, "p99") if f.scheduled_polls else None


def _idle_per_call(f: FutureEntry) -> int | None:
    started = _started(f)
    return f.idle_ns // started if started else None


#: how many futures with live calls top asks for their oldest live call each refresh
OLDEST_FETCHES = 24


#: the oldest live call's age was not asked for this future
_UNASKED = -1


@dataclass(frozen=True)
class _OldestColumn(Column[FutureEntry]):
    """The age of a future's oldest live call: what top fetched for the row, not in the
    list."""

    def read(self, row: Row[FutureEntry]) -> Any:
        return row.oldest_ns if _live(row.entry) else None


def _show_oldest(age: int | None) -> str:
    return "?" if age == _UNASKED else dur(age)


async def _fetch_oldest(get: Get, rows: list[Row[FutureEntry]], ctx: Context) -> None:
    """The age of each future's oldest live call, from its logs (live calls come first there,
    oldest first). ``/futures`` does not carry it, so only the first rows shown are asked."""
    wanted = [row for row in rows if _live(row.entry)][:OLDEST_FETCHES]
    logs = await asyncio.gather(
        *(get(f"/futures/{row.entry.id}/logs?limit=1", FutureLogs) for row in wanted)
    )
    for row, log in zip(wanted, logs, strict=True):
        calls = log.calls
        if calls and calls[0].finished_ns is None:
            row.oldest_ns = max(0, ctx.uptime_ns - calls[0].created_ns)


def _call_lines(document: FutureLogs, ctx: Context) -> list[str]:
    lines = [
        f"{document.label}: live calls first (time = age), then finished ones (time = duration)",
        f"{'call':>7}  {'state':<9}  {'time':>6}  {'polls':>5}  {'busy':>6}  {'idle':>6}  "
        f"{'sched':>6}  task",
    ]
    # a future none of whose wake-ups was measured (uvloop) shows "-", not a 0 per call
    row = ctx.row
    measured = not isinstance(row, FutureEntry) or row.scheduled_polls > 0
    for c in document.calls:
        if c.finished_ns is None:
            time, state = max(0, ctx.uptime_ns - c.created_ns), c.state
        else:
            time, state = c.finished_ns - c.created_ns, c.outcome or c.state
        error = c.exception
        lines.append(
            f"{c.call_id:>7}  {state:<9}  {dur(time):>6}  {count(c.poll_count):>5}  "
            f"{dur(c.busy_ns):>6}  {dur(c.idle_ns):>6}  "
            f"{dur(c.scheduled_ns) if measured else '-':>6}  {c.task or '-'}"
            + (f"  {error.type}: {error.message}"[:60] if error else "")
        )
    return lines


# channels --------------------------------------------------------------------------------------


def _capacity(c: ChannelEntry) -> str:
    kind = c.channel_type
    return kind[len("bounded[") : -1] if kind.startswith("bounded[") else "∞"


def _message_lines(document: ChannelLogs, ctx: Context) -> list[str]:
    """Sends and receives, one per line, newest first; a receive says how long its message
    waited, and each names the future (and call) that sent or received it."""
    edges = ctx.row.senders + ctx.row.receivers if isinstance(ctx.row, ChannelEntry) else []
    for edge in edges:
        if edge.future_id is not None:
            ctx.labels.setdefault(edge.future_id, edge.label)
    events = [("sent", e) for e in document.sent_logs]
    events += [("received", e) for e in document.received_logs]
    events.sort(key=lambda pair: -pair[1].timestamp_ns)
    lines = [f"{document.label}: sends and receives, newest first"]
    for what, e in events[:20]:
        msg = "?" if e.msg_id is None else str(e.msg_id)
        line = f"{dur(e.timestamp_ns):>6}  {what:<8}  msg {msg:>6}  "
        line += f"by {ctx.future(e.future_id, e.call_id)}"
        if e.delay_ns is not None:
            line += f"  after {dur(e.delay_ns)}"
        if e.message is not None:
            line += f"  {e.message}"
        lines.append(line)
    return lines


# streams and loops -----------------------------------------------------------------------------


def _item_lines(document: StreamLogs, ctx: Context) -> list[str]:
    return [f"{document.label}: items, newest first"] + [
        f"item {e.index:>7}  at {dur(e.timestamp_ns):>6}  waited {dur(e.wait_ns):>6}"
        + (f"  {e.item}" if e.item is not None else "")
        for e in document.items
    ]


def _episode_lines(document: LoopDocument) -> list[str]:
    lines = []
    for loop in document.loops:
        for b in loop.blocking_lines[:3]:  # the lines that cost the most in all, first
            kind = f", {b.kind}" if b.kind else ""
            lines.append(
                f"loop {loop.id} blocked {b.count}x, {dur(b.total_ns)} in all, at {b.file}:"
                f"{b.line} ({b.function}), longest {dur(b.max_ns)}{kind}"
            )
        for e in loop.episodes[:5]:
            who = e.call.label if e.call else (e.task or "untracked code")
            top = e.stack[0] if e.stack else None
            where = f" at {top.file}:{top.line} ({top.function})" if top else ""
            state = "blocking now" if e.ongoing else "blocked"
            lines.append(f"loop {loop.id} {state} {dur(e.blocked_ns)} by {who}{where}")
    return lines or ["no blocked-loop episodes, no blocking lines"]


def _waits_on(task: TaskEntry) -> str | None:
    target = task.waits_on
    return None if target is None else target.description


def _program_frame(chain: list[AwaitFrame]) -> AwaitFrame | None:
    """The innermost frame outside the installed Python (asyncio, site-packages), else the
    innermost."""
    ours = [f for f in chain if "/lib/python3" not in f.file.replace(os.sep, "/")]
    frames = ours or chain
    return frames[-1] if frames else None


def _task_where(task: TaskEntry) -> str:
    # the document names the program's own frame; older ones did not: guess from the chain
    where = task.where
    return _where(where if where is not None else _program_frame(task.chain))


def _made(task: TaskEntry) -> str:
    """Where a task sits in the task tree, as the report says it: ``made by Task-1 at
    app.py:12 and awaited by Task-1``, ``made at app.py:12``; empty when nothing is known."""
    at = f" at {_where(task.created_at)}" if task.created_at is not None else ""
    parent, awaiters = task.parent, ", ".join(task.awaiters)
    if parent is not None and task.awaiters == [parent]:
        return f"made by {parent}{at} and awaited by {parent}"
    made = f"made by {parent}{at}" if parent is not None else f"made{at}" if at else ""
    return ", ".join(x for x in (made, f"awaited by {awaiters}" if awaiters else "") if x)


def _chain_lines(task: TaskEntry, ctx: Context) -> list[str]:
    lines = [f"{task.name}: its await chain, innermost last"]
    lines += [f"  {f.file}:{f.line} {f.function}" for f in task.chain]
    target = task.waits_on
    lines.append(f"waits on: {target.description if target else 'nothing known'}")
    made = _made(task)
    return lines + ([made] if made else [])


def _wait_lines(document: TasksDocument) -> list[str]:
    lines = []
    for w in document.waits[:8]:
        target = w.waits_on
        where = f" at {_where(w.where)}" if w.where else ""
        what = f" on {target.description}" if target else ""
        n = w.tasks
        tasks = (
            f"{count(n)} task of {w.label} waits"
            if n == 1
            else (f"{count(n)} tasks of {w.label} wait")
        )
        lines.append(f"{tasks}{where}{what}")
    if not document.consistent:
        lines.append("(a blocked loop was read from outside: its chains may be changing)")
    return lines or ["no task is waiting"]


def _status_line(status: ProfilerStatus) -> str:
    """The profiler's name, pid, age and counts, as the first line says them."""
    live = status.calls_live
    return (
        f"{status.name} · pid {status.pid} · up {dur(status.uptime_ns)} · "
        f"{counted(status.futures, 'future')} · {count(live)} live "
        f"call{'' if live == 1 else 's'} · {counted(status.channels, 'channel')} · "
        f"{counted(status.streams, 'stream')}"
        + (
            f" · {counted(status.internal_errors, 'internal error')}"
            if status.internal_errors
            else ""
        )
    )


def _noun(n: int, noun: str) -> str:
    """``noun`` for ``n`` of it, padded to its plural's width (the lines stay aligned)."""
    return f"{noun if n == 1 else noun + 's':<{len(noun) + 1}}"


def _job_lines(executor: ExecutorEntry, ctx: Context) -> list[str]:
    lines = [f"{executor.label}: jobs by function, then by the future that submitted them"]
    for group in executor.functions[:6] + executor.futures[:6]:
        lines.append(
            f"{count(group.jobs):>6} {_noun(group.jobs, 'job')}  "
            f"{group.name[:30]:<30}  queued "
            f"{dur(group.queued_ns):>6} (max {dur(group.max_queued_ns)})  ran "
            f"{dur(group.run_ns)}" + (f"  {group.raised} raised" if group.raised else "")
        )
    return lines


def _resource_lines(resource: ResourceEntry, ctx: Context) -> list[str]:
    lines = [f"{resource.label} ({resource.kind}): who waited and who held it"]
    for h in resource.holders[:4]:
        ended = f", its call {h.outcome}" if h.outcome else ""
        lines.append(f"  held by {h.label} for {dur(h.held_ns)}{ended}")
    for f in resource.futures[:6]:
        lines.append(
            f"{count(f.waits):>6} {_noun(f.waits, 'wait')} {dur(f.total_wait_ns):>6} (max "
            f"{dur(f.max_wait_ns)})  {count(f.holds):>6} {_noun(f.holds, 'hold')} "
            f"{dur(f.total_hold_ns):>6}"
            f"  {f.label[:30]}"
        )
    return lines


def _warning_subject(w: WarningEntry) -> str:
    s = w.subject
    return f"{s.kind} {s.label}"


def _warning_lines(w: WarningEntry, ctx: Context) -> list[str]:
    lines = textwrap.wrap(w.message, 78) + textwrap.wrap(f"→ {w.hint}", 78)
    lines.append("evidence: " + _evidence(w.evidence))
    return lines


def _evidence(evidence: Mapping[str, Any]) -> str:
    """A warning's evidence in words and units: ``producers blocked 28s, in use 7.07s``."""
    parts = []
    for key, value in evidence.items():
        if key.endswith("_ns") and isinstance(value, int):
            parts.append(f"{key[:-3].replace('_', ' ')} {dur(value)}")
        elif isinstance(value, int) and not isinstance(value, bool):
            parts.append(f"{key.replace('_', ' ')} {value:,}")
        else:
            parts.append(f"{key.replace('_', ' ')} {value}")
    return ", ".join(parts)


_SEVERITY = {"error": 3, "warning": 2, "info": 1}


def _loop_name(loop: LoopEntry) -> tuple[int, str]:
    return loop.id, loop.label.rsplit(".", 1)[-1]


def _running(loop: LoopEntry) -> str:
    running = loop.running
    return f"{running.label} {dur(running.elapsed_ns)}" if running else "-"


def _warning_count(warnings: list[WarningEntry]) -> str:
    """The warnings that hold now, shown on the status line whatever the view."""
    now = [w for w in warnings if w.active]
    if not now:
        return "no warnings · "
    worst = max(now, key=lambda w: _SEVERITY.get(w.severity, 0)).severity
    return f"⚠ {len(now)} warning{'' if len(now) == 1 else 's'} ({worst}; w shows them) · "


# the wait-for graph and the task tree ----------------------------------------------------------

#: tasks top asks ``/tasks`` for, to draw the task tree (``/graph`` has its own bound)
TREE_TASKS = 1000
#: lines the task tree takes at most below the table: it stays on the screen
TREE_LINES = 12
#: a line of the tree is cut at this width (a task named by its repr can be long)
TREE_WIDTH = 110
#: deadlocks spelled out below the table at most (the table marks them all)
CYCLE_LINES = 3
#: leaf children of one coroutine beyond this many share one line of the tree
_SIBLINGS = 3


@dataclass(frozen=True)
class WaitGraph:
    """The graph view's document: ``/graph``, and ``/tasks`` for the task tree."""

    #: None when the profiler does not serve ``/graph`` (an older asyncflow)
    graph: GraphDocument | None
    tasks: TasksDocument


@dataclass(frozen=True)
class Waiter:
    """One waiting task of the wait-for graph: a row of the graph view."""

    node: GraphNode
    #: what it waits on, in words
    waits_on: str
    #: who can release it: the holders of the lock, the producers of the queue, the tasks
    #: it awaits (empty: nobody the graph can name)
    releasers: tuple[str, ...]
    #: the same, short, for the table: ``held by Task-3 (1.16s, app.py:28)``
    short: tuple[str, ...]
    #: the deadlock it is in, numbered from 1 as ``GraphDocument.cycles`` lists them
    cycle: int | None
    #: its entry in ``/tasks`` (its parent, chain and awaiters), when listed
    task: TaskEntry | None
    #: the tasks it created that are alive, by name
    children: tuple[str, ...] = ()


async def _fetch_waits(get: Get) -> WaitGraph:
    """``/graph`` and ``/tasks``; a profiler without ``/graph`` still gives the tree."""
    tasks = await get(f"/tasks?limit={TREE_TASKS}", TasksDocument)
    try:
        graph: GraphDocument | None = await get("/graph", GraphDocument)
    except NotServed:
        graph = None
    return WaitGraph(graph, tasks)


def _node_text(node: GraphNode | None, node_id: str) -> str:
    """A graph node as a person names it: ``lock accounts #2``, ``get from queue jobs``."""
    if node is None:
        return node_id.removeprefix("task:")
    if node.kind == "task":
        return node.label
    if not node.id.startswith(("resource:", "channel:")):
        return node.label  # a wait asyncflow does not track: its description says it all
    queue = {"queue_get": "get from queue", "queue_put": "put into queue"}
    return f"{queue.get(node.kind, node.kind.replace('_', ' '))} {node.label}"


#: how a releaser edge reads, by its relation
_RELEASES = {"held_by": "held by", "sent_by": "filled by", "received_by": "drained by"}


def _releaser(edge: GraphEdge, short: bool = False) -> str:
    """``held by Task-3 for 1.16s (took it at app.py:28)``; short: ``held by Task-3 (1.16s,
    app.py:28)``."""
    text = f"{_RELEASES.get(edge.relation, edge.relation)} {edge.target.removeprefix('task:')}"
    held = [] if edge.held_ns is None else [dur(edge.held_ns)]
    where = [] if edge.where is None else [_where(edge.where)]
    if short:
        return text + (f" ({', '.join(held + where)})" if held or where else "")
    text += f" for {held[0]}" if held else ""
    return text + (f" (took it at {where[0]})" if where else "")


def _releasers(edges: Iterable[GraphEdge], short: bool = False) -> tuple[str, ...]:
    """Who can release a wait: each holder with how long and where it took it, then a queue's
    producers or consumers in one phrase, each task once (``drained by Task-4, Task-5``)."""
    holders: list[str] = []
    others: dict[str, list[str]] = {}
    for e in edges:
        if e.relation == "held_by":
            holders.append(_releaser(e, short))
            continue
        names = others.setdefault(_RELEASES.get(e.relation, e.relation), [])
        name = e.target.removeprefix("task:")
        if name not in names:
            names.append(name)
    return (*holders, *(f"{how} {', '.join(names)}" for how, names in others.items()))


def _cycle_members(graph: GraphDocument | None) -> dict[str, int]:
    """Node id -> the number of the first deadlock it is in."""
    members: dict[str, int] = {}
    for number, cycle in enumerate(graph.cycles if graph else [], 1):
        for node in cycle.nodes:
            members.setdefault(node, number)
    return members


def _children(tasks: TasksDocument) -> dict[str | None, list[TaskEntry]]:
    """Each listed task's children; the roots (no parent, or one not listed) under None."""
    names = {t.name for t in tasks.tasks}
    tree: dict[str | None, list[TaskEntry]] = {}
    for t in tasks.tasks:
        parent = t.parent if t.parent in names and t.parent != t.name else None
        tree.setdefault(parent, []).append(t)
    return tree


def _waiters(document: WaitGraph) -> list[Waiter]:
    """The graph's waiting tasks, deadlocked ones first (the graph lists its cycles first)."""
    graph = document.graph
    if graph is None:
        return []
    nodes = {n.id: n for n in graph.nodes}
    out: dict[str, list[GraphEdge]] = {}
    for e in graph.edges:
        out.setdefault(e.source, []).append(e)
    cycles = _cycle_members(graph)
    tasks = {t.name: t for t in document.tasks.tasks}
    tree = _children(document.tasks)
    rows = []
    for node in graph.nodes:
        edges = [e for e in out.get(node.id, []) if e.relation in ("waits", "awaits")]
        if node.kind != "task" or not edges:
            continue
        if edges[0].relation == "awaits":
            names = [_node_text(nodes.get(e.target), e.target) for e in edges]
            waits_on = ("task " if len(names) == 1 else "tasks ") + ", ".join(names)
            releasers = short = tuple(f"{name} ending" for name in names)
        else:
            target = edges[0].target
            waits_on = _node_text(nodes.get(target), target)
            releasers = _releasers(out.get(target, []))
            short = _releasers(out.get(target, []), short=True)
        entry = tasks.get(node.label)
        children = tuple(t.name for t in tree.get(node.label, [])) if entry else ()
        cycle = cycles.get(node.id)
        rows.append(Waiter(node, waits_on, releasers, short, cycle, entry, children))
    return rows


def _cycle_rank(w: Waiter) -> tuple[int, int, str]:
    """Deadlocked first (the first deadlock first), then stuck behind one, then the rest."""
    if w.cycle is not None:
        return 2, -w.cycle, f"⟳{w.cycle}"
    return (1, 0, "stuck") if w.node.stuck else (0, 0, "-")


def _waiter_name(w: Waiter) -> str:
    runs = w.node.coroutine
    return w.node.label if not runs or runs == w.node.label else f"{w.node.label} ({runs})"


def _cycle_text(graph: GraphDocument, number: int) -> str:
    """A deadlock in words: each task, what it waits on and who holds that, around."""
    cycle = graph.cycles[number - 1]
    nodes = {n.id: n for n in graph.nodes}
    relation = {(e.source, e.target): e.relation for e in graph.edges}
    path = cycle.nodes + cycle.nodes[:1]
    said: list[str] = []
    for i, node in enumerate(path[:-1]):
        if not node.startswith("task:"):
            continue
        me, then = _node_text(nodes.get(node), node), path[i + 1]
        if then.startswith("task:"):
            said.append(f"{me} awaits {_node_text(nodes.get(then), then)}")
            continue
        held = path[i + 2] if i + 2 < len(path) else path[0]
        how = _RELEASES.get(relation.get((then, held), ""), "released by")
        said.append(
            f"{me} waits on {_node_text(nodes.get(then), then)} {how} "
            f"{_node_text(nodes.get(held), held)}"
        )
    return f"⟳{number} DEADLOCK: " + "; ".join(said)


def _tree_lines(
    tasks: TasksDocument, marked: Mapping[str, int], waits: Mapping[str, str] | None = None
) -> list[str]:
    """The task tree, parent above children, at most ``TREE_LINES`` lines: the trees with a
    deadlocked task first, then tasks with children; many leaf tasks of one coroutine (a pool
    of workers, a task per request) share one line. ``waits`` names what a task waits on as
    the graph does (``lock accounts #2``), where it has it; each line is cut at
    ``TREE_WIDTH``."""
    tree = _children(tasks)
    parents = {t.name: t.parent for t in tasks.tasks}
    hot: set[str] = set()  # a deadlocked task and its ancestors
    for name in marked:
        up: str | None = name
        while up is not None and up not in hot:
            hot.add(up)
            up = parents.get(up)
    lines: list[str] = []
    seen: set[str] = set()
    drawn = [0]  # tasks on the lines so far

    def rank(t: TaskEntry) -> int:
        return 0 if t.name in hot else 1 if tree.get(t.name) else 2

    def line(t: TaskEntry) -> str:
        mark = f" ⟳{marked[t.name]}" if t.name in marked else ""
        said = (waits or {}).get(t.name) or (t.waits_on.description if t.waits_on else None)
        state = f" · waits on {said}" if said else f" · {t.state}"
        return f"{t.name}{mark} {t.future_label or t.coroutine}{state}{made_at([t])}"

    def made_at(group: list[TaskEntry]) -> str:
        """`` · made at app.py:38`` when every task of ``group`` was made on that line."""
        sites = {_where(t.created_at) for t in group if t.created_at is not None}
        if len(sites) != 1 or any(t.created_at is None for t in group):
            return ""
        return f" · made at {sites.pop()}"

    def emit(kids: list[TaskEntry], lead: str, root: bool) -> None:
        kids = sorted((k for k in kids if k.name not in seen), key=rank)
        seen.update(k.name for k in kids)
        groups: dict[str, list[TaskEntry]] = {}
        for k in kids:
            if rank(k) == 2:
                groups.setdefault(k.future_label or k.coroutine, []).append(k)
        items: list[TaskEntry | list[TaskEntry]] = []
        for k in kids:
            group = groups.get(k.future_label or k.coroutine, []) if rank(k) == 2 else []
            if len(group) <= _SIBLINGS:
                items.append(k)
            elif k is group[0]:
                items.append(group)
        for n, item in enumerate(items):
            if len(lines) >= TREE_LINES:
                return
            last = n == len(items) - 1
            fork = "" if root else "└─ " if last else "├─ "
            if isinstance(item, list):
                runs = item[0].future_label or item[0].coroutine
                lines.append(
                    f"{lead}{fork}{len(item)} tasks of {runs} ({item[0].name} … {item[-1].name})"
                    + made_at(item)
                )
                drawn[0] += len(item)
                continue
            lines.append(lead + fork + line(item))
            drawn[0] += 1
            inner = lead if root else lead + ("   " if last else "│  ")
            emit(tree.get(item.name, []), inner, False)

    emit(tree.get(None, []), "", True)
    listed, total = len(tasks.tasks), tasks.total
    head = f"task tree (parent → children), {counted(total, 'task')}"
    head += f", the first {listed} read" if total > listed else ""
    more = [f"… and {count(total - drawn[0])} more"] if total > drawn[0] else []
    return [_clip(text, TREE_WIDTH) for text in [head + ":", *lines, *more]]


def _graph_lines(document: WaitGraph) -> list[str]:
    """Below the graph's table: its deadlocks in words, then the task tree."""
    graph, lines = document.graph, []
    if graph is None:
        lines.append("this profiler serves no /graph (an older asyncflow): no wait-for graph")
    else:
        numbers = range(1, len(graph.cycles) + 1)
        lines += [_cycle_text(graph, n) for n in numbers[:CYCLE_LINES]]
        if len(graph.cycles) > CYCLE_LINES:
            lines.append(f"… and {len(graph.cycles) - CYCLE_LINES} more deadlocks (⟳ in the table)")
        if graph.omitted:
            lines.append(f"({count(graph.omitted)} nodes past the graph's bound are left out)")
        if not graph.consistent:
            lines.append("(a blocked loop was read from outside: its chains may be changing)")
    marked = {n.removeprefix("task:"): c for n, c in _cycle_members(graph).items()}
    waits = {w.node.label: w.waits_on for w in _waiters(document)}
    return lines + _tree_lines(document.tasks, marked, waits)


def _graph_note(document: WaitGraph) -> str | None:
    """The status line's word on the graph: a deadlock, or a profiler without ``/graph``."""
    graph = document.graph
    if graph is None:
        return "no /graph here (an older asyncflow): the task tree only"
    n = len(graph.cycles)
    return f"⟳ {n} DEADLOCK{'' if n == 1 else 'S'}" if n else None


def _waiter_lines(w: Waiter, ctx: Context) -> list[str]:
    """A waiting task whole: what it waits on, who can release it, where it is in the tree."""
    lines = [f"{w.node.label}: what it waits on and who can release it"]
    if w.cycle is not None:
        lines.append(f"in deadlock ⟳{w.cycle}: it waits on tasks that wait on it")
    elif w.node.stuck:
        lines.append("stuck: only tasks that cannot go on could release it")
    at = f" at {_where(w.node.where)}" if w.node.where else ""
    lines.append(f"waits on {w.waits_on}{at}")
    lines += [f"  {r}" for r in w.releasers] or ["  nobody the graph can name"]
    t = w.task
    if t is not None:
        lines.append(_made(t) or "not seen made (before asyncflow watched) and awaited by none")
    if w.children:
        lines.append(
            f"children: {', '.join(w.children[:8])}" + (" …" if len(w.children) > 8 else "")
        )
    if t is not None:
        lines += [f"  {_where(f)} {f.function}" for f in t.chain[-6:]]  # innermost last
    return lines


# fmt: off
def _function_errors(document: FunctionsDocument) -> list[str]:
    """Below the functions: what each one that raised raised, by exception type."""
    return [
        f"{f.label} raised " + ", ".join(f"{name} {n:,}" for name, n in f.errors.items())
        for f in document.functions
        if f.errors
    ][:8]


# A row's label, saying when it is the sum of gone objects or one that is gone (the text
# report's ``named``), from each document's own fields: ``folded_count`` (``folded`` for
# resources) and ``alive`` (``state`` ``gone`` for executors and resources).
def _main_error(f: FutureEntry) -> tuple[str, bool]:
    """The exception type a future's calls raised most over the run (``errors``), and whether
    they raised others too; ``""`` when not known (nothing raised, or an older profiler)."""
    if not f.errors:
        return "", False
    name = max(f.errors, key=lambda n: f.errors[n])
    return name, len(f.errors) > 1


def _show_raised(value: tuple[int, str, bool]) -> str:
    raised, name, more = value
    return f"{count(raised)} {name}{'…' if more else ''}" if raised and name else count(raised)


def _named_alive(e: FutureEntry | ChannelEntry | StreamEntry) -> str:
    return named(e.label, e.folded_count, not e.alive)


def _named_resource(r: ResourceEntry) -> str:
    return named(r.label, r.folded, r.state == "gone")


def _named_executor(e: ExecutorEntry) -> str:
    return named(e.label, e.folded_count, e.state == "gone")


VIEWS: tuple[View[Any, Any], ...] = (
    View[FuturesDocument, FutureEntry](
        "futures", "f",
        "one row per future: a decorated coroutine function, or every task running the same "
        "coroutine in whole-program mode",
        "/futures", FuturesDocument, lambda d: d.futures,
        (
            _text("future", 0, _named_alive, "the future's label", flex=True),
            _count("live", 1, _live, "calls not finished now (pending + running + suspended)"),
            _OldestColumn("oldest", 1, _live, "age of the oldest live call: a call waiting "
                          "forever keeps growing here (? = not asked: only the first "
                          f"{OLDEST_FETCHES} futures with live calls are, in the order shown)",
                          show=_show_oldest),
            _count("calls", 2, lambda f: f.call_count, "calls so far (live and finished)"),
            _dur("p95", 1, lambda f: _pct(f.poll_duration_ns, "p95"),
                 "95th percentile of the poll duration (one step from an await to the next); "
                 "a long poll blocks the loop"),
            _dur("max", 1, lambda f: f.max_poll_duration_ns, "the longest poll"),
            _dur("busyΣ", 2, lambda f: f.busy_ns,
                 "time spent polling, summed over all calls (live ones included)"),
            _count("polls", 3, lambda f: f.total_polls, "polls over all calls"),
            _dur("idle/call", 4, _idle_per_call,
                 "mean time a call spent suspended between polls (idleΣ / calls that started)"),
            _dur("sch-p99", 6, _scheduled_p99,
                 "99th percentile of the scheduled time: from a call's wake-up to its poll, "
                 "waiting in the loop's ready queue (high: the loop is too busy to run woken "
                 "calls promptly; - under uvloop, which it is not measured on)"),
            _dur("idleΣ", 5, lambda f: f.idle_ns,
                 "time suspended between polls, summed over all calls: with many calls at "
                 "once it is longer than the run"),
            _count("run", 6, lambda f: f.calls.running, "calls inside a poll now"),
            _count("susp", 6, lambda f: f.calls.suspended,
                   "calls suspended now (awaiting something)"),
            _count("pend", 7, lambda f: f.calls.pending, "calls created, not polled yet"),
            _count("done", 6, lambda f: f.calls.ready, "calls that returned or raised"),
            _count("cxl", 7, lambda f: f.calls.cancelled,
                   "calls cancelled, closed unfinished or never awaited"),
            Column("raised", 7, lambda f: (f.outcomes.raised, *_main_error(f)),
                   "calls that raised, with the run's most frequent exception type (…: and "
                   "other types)", show=_show_raised),
            _text("where", 8, lambda f: _where(f.location),
                  "where the function is defined (file:line)", max_width=28,
                  cut_left=True),
        ),
        sort="busyΣ",
        logs=Logs("/futures/{id}/logs?limit=20", FutureLogs, _call_lines), enrich=_fetch_oldest,
    ),
    View[ChannelsDocument, ChannelEntry](
        "channels", "c",
        "one row per instrumented queue or memory stream",
        "/channels", ChannelsDocument, lambda d: d.channels,
        (
            _text("channel", 0, _named_alive, "the channel's label", flex=True),
            Column("depth", 1, lambda c: (c.queue_size, _capacity(c)),
                   "messages in it now / its capacity (∞: unbounded)",
                   show=lambda v: f"{v[0]}/{v[1]}"),
            _dur("blockedΣ", 1, lambda c: c.producers_blocked_ns,
                 "time producers waited on a full channel, summed over producers"),
            _dur("starvedΣ", 1, lambda c: c.consumers_starved_ns,
                 "time consumers waited on an empty channel, summed over consumers"),
            _count("sent", 2, lambda c: c.sent_count, "messages sent"),
            _count("recv", 2, lambda c: c.received_count, "messages received"),
            _dur("p95", 2, lambda c: _pct(c.delay_ns, "p95"),
                 "95th percentile of a message's time in the channel (send to receive)"),
            _dur("max", 3, lambda c: c.max_delay_ns, "the longest time in the channel"),
            _dur("p50", 4, lambda c: _pct(c.delay_ns, "p50"), "median time in the channel"),
            _count("peak", 5, lambda c: c.max_queue_size, "the most messages it ever held"),
            Column("recv/s", 6, lambda c: c.receive_rate, "messages received per second",
                   show=lambda v: f"{v:.3g}"),
            _text("kind", 7, lambda c: c.kind.rsplit(".", 1)[-1],
                  "Queue, PriorityQueue, LifoQueue (asyncio) or MemoryObjectStream (anyio)",
                  max_width=20),
        ),
        sort="sent",
        logs=Logs("/channels/{id}/logs?limit=20", ChannelLogs, _message_lines),
    ),
    View[StreamsDocument, StreamEntry](
        "streams", "s",
        "one row per async generator or iterator: how long its consumer waited for items",
        "/streams", StreamsDocument, lambda d: d.streams,
        (
            _text("stream", 0, _named_alive, "the stream's label", flex=True),
            _text("state", 2, lambda s: s.state, "active, or how the last iteration ended"),
            _count("items", 1, lambda s: s.items_yielded, "items yielded"),
            _dur("p50", 2, lambda s: _pct(s.wait_ns, "p50"),
                 "median time the consumer waited for an item"),
            _dur("max", 1, lambda s: s.max_wait_ns, "the longest wait for an item"),
            _dur("waitΣ", 3, lambda s: s.total_wait_ns,
                 "time the consumer waited for items, summed over items"),
            _dur("usedΣ", 4, lambda s: s.consumer_ns,
                 "time the consumer spent between an item and asking for the next, summed"),
            _count("live", 3, lambda s: s.instances.get("active"), "iterations running now"),
            _text("where", 6, lambda s: _where(s.location),
                  "where it is defined (file:line)", max_width=28, cut_left=True),
        ),
        sort="items",
        logs=Logs("/streams/{id}/logs?limit=20", StreamLogs, _item_lines),
    ),
    View[LoopDocument, LoopEntry](
        "loops", "l",
        "one row per event loop: how late its callbacks run (lag) and what blocked it; the "
        "latest blocked-loop episodes are listed below the table",
        "/loop", LoopDocument, lambda d: d.loops,
        (
            Column("loop", 0, _loop_name, "the loop's number and class",
                   show=lambda v: f"{v[0]} {v[1]}", numeric=False, flex=True),
            _text("state", 1, lambda lp: "BLOCKED" if lp.blocked else lp.state,
                  "running, BLOCKED now, stopped or closed"),
            _dur("lag", 1, lambda lp: lp.lag_now_ns,
                 "the current lag: how late a callback scheduled now would run"),
            _dur("p99", 2, lambda lp: _pct(lp.lag_ns, "p99"), "99th percentile of the lag"),
            _dur("max", 1, lambda lp: lp.max_lag_ns, "the longest lag"),
            _count("blocks", 1, lambda lp: lp.blocked_count,
                   "blocked-loop episodes so far (longer than the block threshold)"),
            _count("tasks", 2, lambda lp: lp.tasks_alive, "tasks alive on it"),
            _text("running", 3, _running, "the tracked call in a poll now, and for how long",
                  max_width=30),
            _dur("p50", 4, lambda lp: _pct(lp.lag_ns, "p50"), "median lag"),
            _text("thread", 5, lambda lp: lp.thread, "the thread it runs in", max_width=20),
        ),
        sort="loop",
        detail=_episode_lines,
    ),
    View[TasksDocument, TaskEntry](
        "tasks", "t",
        "one row per live task (the first 200): what it runs, for how long, and what it waits "
        "on; below the table, waiting tasks counted by future, line and what they wait on",
        "/tasks?limit=200", TasksDocument, lambda d: d.tasks,
        (
            _text("future", 0, lambda t: t.future_label or t.coroutine,
                  "the tracked future it runs, else its coroutine's name", flex=True),
            _dur("age", 1, lambda t: t.age_ns, "time since its tracked call was created"),
            _text("waits", 1, _waits_on, "what it waits on, as a person names it",
                  max_width=40),
            _text("state", 2, lambda t: t.state, "waiting, scheduled, running or done"),
            _text("task", 3, lambda t: t.name, "the task's name", max_width=16),
            _text("where", 3, _task_where,
                  "the innermost line of the program's own code it is suspended at",
                  max_width=28, cut_left=True),
            _text("made", 4, lambda t: _where(t.created_at),
                  "the line that created it (create_task); enter: by which task",
                  max_width=28, cut_left=True),
            _count("loop", 6, lambda t: t.loop_id, "the loop it runs on"),
        ),
        sort="age",
        row_lines=_chain_lines, detail=_wait_lines,
        row_id=lambda t: f"{t.loop_id}:{t.name}",
    ),
    View[WarningsDocument, WarningEntry](
        "warnings", "w",
        "one row per diagnosis: the culprit in one sentence (enter shows it whole, with what "
        "to do and the figures); those that no longer hold are marked earlier",
        "/warnings", WarningsDocument, lambda d: d.warnings,
        (
            _text("warning", 0, lambda w: w.message, "the diagnosis", flex=True,
                  max_width=200),
            Column("sev", 1, lambda w: (w.active, _SEVERITY.get(w.severity, 0),
                                         w.severity),
                   "severity: error, warning or info; in ( ) when it no longer holds",
                   show=lambda v: v[2].upper() if v[0] else f"({v[2]})"),
            _text("kind", 2, lambda w: w.kind, "what kind of problem (a stable name)",
                  max_width=22),
            _text("about", 3, _warning_subject, "the future, channel, resource, executor or "
                  "loop it is about", max_width=30),
        ),
        sort="sev",
        row_lines=_warning_lines,
        row_id=lambda w: f"{w.kind}:{w.subject.kind}:{w.subject.id}:"
        f"{w.subject.label}",
    ),
    View[WaitGraph, Waiter](
        "graph", "g",
        "the wait-for graph, one row per waiting task: what it waits on and who can release it "
        "(the holders, producers or consumers, the tasks it awaits), deadlocks first (⟳); "
        "below the table each deadlock in words, then the task tree (parent → children)",
        "/graph", WaitGraph, _waiters,
        (
            _text("task", 0, _waiter_name, "the waiting task's name (and what it runs)",
                  flex=True),
            Column("cycle", 0, _cycle_rank, "⟳N: in deadlock N (each task waits on what the "
                   "next holds, around); stuck: behind a deadlock; -: something can still "
                   "release it", show=lambda v: v[2]),
            _text("waits", 1, lambda w: w.waits_on, "what it waits on: a lock, a queue, a "
                  "task...", max_width=32),
            _text("releaser", 1, lambda w: ", ".join(w.short) or "-",
                  "who can release it: held by (for how long, and the line where the holder "
                  "took it), filled by "
                  "(a queue's producers), drained by (its consumers), or the tasks it awaits",
                  max_width=48),
            _text("where", 2, lambda w: _where(w.node.where),
                  "the line of the program's own code where it waits", max_width=28,
                  cut_left=True),
            _text("parent", 3, lambda w: (w.task.parent if w.task else None) or "-",
                  "the task that created it", max_width=16),
        ),
        sort="cycle",
        row_lines=_waiter_lines, detail=_graph_lines, row_id=lambda w: w.node.id,
        fetch=_fetch_waits, note=_graph_note,
    ),
    View[ResourcesDocument, ResourceEntry](
        "resources", "k",
        "one row per lock, semaphore, condition, event, barrier or capacity limiter: who waits "
        "for it and for how long, and who holds it now",
        "/resources", ResourcesDocument, lambda d: d.resources,
        (
            _text("resource", 0, _named_resource, "the resource's label", flex=True),
            _text("kind", 1, lambda r: r.primitive, "lock, semaphore, event..."),
            _count("waiting", 1, lambda r: r.waiters_now, "tasks waiting for it now"),
            _dur("waitΣ", 1, lambda r: r.waited_so_far_ns,
                 "time callers waited for it, summed over waits, those going on now so far"),
            _dur("holdΣ", 2, lambda r: r.held_so_far_ns,
                 "time it was held, summed over holds, those open now so far (a wait far "
                 "longer: contention)"),
            _count("acq", 2, lambda r: r.acquisitions, "acquisitions so far"),
            _count("waited", 3, lambda r: r.contended_acquisitions,
                   "acquisitions that had to wait"),
            _dur("w-max", 3, lambda r: r.longest_wait_so_far_ns,
                 "the longest wait, one going on now so far"),
            _count("held", 4, lambda r: len(r.holders), "holds open now"),
            _text("where", 6, lambda r: _where(r.location),
                  "where it was created or instrumented (file:line)", max_width=28,
                  cut_left=True),
        ),
        sort="waitΣ",
        row_lines=_resource_lines,
    ),
    View[ExecutorsDocument, ExecutorEntry](
        "executors", "x",
        "one row per thread or process pool jobs were submitted to (run_in_executor, "
        "to_thread): jobs waiting for a worker are queued",
        "/executors", ExecutorsDocument, lambda d: d.executors,
        (
            _text("executor", 0, _named_executor, "the executor's label", flex=True),
            Column("workers", 1, lambda e: (e.workers, e.max_workers),
                   "workers started / the most it may start",
                   show=lambda v: f"{v[0]}/{'?' if v[1] is None else v[1]}"),
            _count("queued", 1, lambda e: e.queued, "jobs waiting for a worker now"),
            _count("running", 1, lambda e: e.running, "jobs running now"),
            _dur("q-p95", 1, lambda e: _pct(e.queued_ns, "p95"),
                 "95th percentile of the time a job waited for a worker"),
            _dur("q-max", 2, lambda e: e.max_queued_ns, "the longest wait for a worker"),
            _count("jobs", 2, lambda e: e.submitted, "jobs submitted"),
            _dur("run-p95", 3, lambda e: _pct(e.run_ns, "p95"),
                 "95th percentile of a job's run time"),
            _dur("queuedΣ", 4, lambda e: e.total_queued_ns,
                 "time jobs waited for a worker, summed over jobs"),
            _count("raised", 4, lambda e: e.raised, "jobs that raised"),
            _count("cxl", 5, lambda e: e.cancelled, "jobs cancelled before they ran"),
            _text("kind", 6, lambda e: e.kind, "thread or process"),
        ),
        sort="queued",
        row_lines=_job_lines,
    ),
    View[ThreadsDocument, ThreadEntry](
        "threads", "h",
        "one row per thread of the process: its state and the CPU it used, as a share of one "
        "core (a saturated executor or a busy thread beside the loop shows here)",
        "/threads", ThreadsDocument, lambda d: d.threads,
        (
            _text("thread", 0, _thread_name, "the thread's name; (loop N) when it runs an "
                  "instrumented event loop", flex=True),
            _text("state", 1, lambda t: t.state or "-", "running, sleeping, waiting (a "
                  "blocking kernel call), exited"),
            Column("cpu%", 1, lambda t: t.share, "CPU over wall time in the last interval "
                   "(100%: one core busy)", show=_percent),
            Column("avg%", 2, lambda t: t.avg_share, "CPU over wall time since first seen",
                   show=_percent),
            Column("max%", 2, lambda t: t.max_share, "the highest cpu% of any interval",
                   show=_percent),
            _dur("cpu", 3, lambda t: t.cpu_ns, "CPU time used since the thread started"),
            _dur("sys", 4, lambda t: t.system_ns, "of which in the kernel (system time)"),
            _count("tid", 5, lambda t: t.native_id, "the kernel's thread id"),
        ),
        sort="cpu%",
        row_id=lambda t: str(t.native_id),
    ),
    View[FunctionsDocument, FunctionEntry](
        "functions", "m",
        "one row per measured function or block (@asyncflow.measure, measure_block): wall time "
        "per call, from call to return, awaits included",
        "/functions", FunctionsDocument, lambda d: d.functions,
        (
            _text("function", 0, lambda f: f.label + (" [block]" if f.kind == "block"
                                                          else ""), "the label", flex=True),
            _count("calls", 1, lambda f: f.call_count,
                   "calls so far (recursion: the outermost call only)"),
            _dur("totalΣ", 1, lambda f: f.total_ns, "wall time summed over calls"),
            _dur("p95", 1, lambda f: _pct(f.duration_ns, "p95"),
                 "95th percentile of a call's wall time"),
            _dur("max", 2, lambda f: f.max_ns, "the longest call"),
            Column("share", 2, lambda f: f.share, "totalΣ over the profile's wall time "
                   "(above 100% when calls overlap)", show=_percent),
            _dur("selfΣ", 2, lambda f: f.self_ns, "totalΣ less the time in measured calls "
                 "nested in it (same task or thread)"),
            _count("errors", 3, lambda f: f.error_count, "calls that raised"),
            _count("run", 3, lambda f: f.running_count, "calls entered and not "
                   "returned now: a call that never returns shows here"),
            _dur("mean", 4, lambda f: f.mean_ns, "mean wall time of a call"),
            _text("where", 6, lambda f: _where(f.location),
                  "where it is defined (file:line)", max_width=28, cut_left=True),
        ),
        sort="totalΣ",
        detail=_function_errors,
    ),
    View[MetricsDocument, MetricEntry](
        "user metrics", "u",
        "one row per counter, gauge, histogram or value log the program updates "
        "(asyncflow.counter, gauge, histogram, value)",
        "/user_metrics", MetricsDocument, lambda d: d.metrics,
        (
            _text("metric", 0, lambda m: m.name, "the metric's name", flex=True),
            _text("kind", 1, lambda m: m.kind, "counter, gauge, histogram or value"),
            Column("value", 1, lambda m: m.value, "a counter's total, a gauge's value now, "
                   "the last value logged", show=lambda v: "-" if v is None else
                   (compact_count(v) if isinstance(v, int) else str(v)[:12]), numeric=False,
                   sortable=False),
            _count("updates", 1, lambda m: m.count,
                   "updates, samples or values logged so far"),
            Column("p50", 2, lambda m: _pct(m.percentiles, "p50"), "a histogram's median",
                   show=lambda v: "-" if v is None else compact_count(v)),
            Column("max", 2, lambda m: m.max, "the highest value (not counters)",
                   show=lambda v: "-" if v is None else f"{v:g}"),
            Column("min", 3, lambda m: m.min, "the lowest value (not counters)",
                   show=lambda v: "-" if v is None else f"{v:g}"),
        ),
        sort="updates",
    ),
)
# fmt: on


def _rows(view: View[Any, E], entries: list[E]) -> list[Row[E]]:
    """The table's rows, each keyed by its id, with ``#2``, ``#3``... on repeats (two tasks may
    bear one name), so that one odd document never stops the table from filling."""
    seen: dict[str, int] = {}
    rows = []
    for entry in entries:
        key = view.row_id(entry)
        seen[key] = n = seen.get(key, 0) + 1
        rows.append(Row(entry, key if n == 1 else f"{key}#{n}"))
    return rows


# -- fitting columns to the width --------------------------------------------------------------

#: DataTable pads each cell by one on each side; the vertical scrollbar takes one more
_PADDING = 2
_SCROLLBAR = 1


def fit(
    view: View[Any, Any], cells: list[tuple[str, ...]], width: int, sort: str
) -> list[tuple[int, int]]:
    """The columns that fit in ``width``, as (index, width) in the view's order: the flex column
    always, then by priority (the view's order breaking ties) while the rest still fit; the flex
    column then takes the room left, up to its longest cell."""
    wanted: list[int] = []
    for i, col in enumerate(view.columns):
        longest = max((len(row[i]) for row in cells), default=1)
        header = len(col.name) + (1 if col.name == sort else 0)
        wanted.append(max(header, min(longest, col.max_width)))
    room = width - _SCROLLBAR
    flex = [i for i, c in enumerate(view.columns) if c.flex]
    flex_min = {i: max(len(view.columns[i].name) + 1, min(wanted[i], 24)) for i in flex}
    used = sum(flex_min[i] + _PADDING for i in flex)
    chosen: dict[int, int] = {}
    order = sorted((c.priority, i) for i, c in enumerate(view.columns) if not c.flex)
    for _, i in order:
        col = view.columns[i]
        # A text column narrower than it wants (cut with "…") beats dropping it for a less
        # useful one.
        least = wanted[i] if col.numeric else min(wanted[i], max(len(col.name) + 1, 12))
        width = min(wanted[i], room - used - _PADDING)
        if width >= least:
            chosen[i] = width
            used += width + _PADDING
    for i in flex:
        chosen[i] = min(wanted[i], flex_min[i] + max(0, room - used))
        used += chosen[i] - flex_min[i]
    return sorted(chosen.items())


def _clip(text: str, width: int, left: bool = False) -> str:
    if len(text) <= width:
        return text
    return "…" + text[len(text) - width + 1 :] if left else text[: max(0, width - 1)] + "…"


# -- the app ------------------------------------------------------------------------------------


def _why(exc: BaseException) -> str:
    """What went wrong asking the endpoint, in words first (the status line is one line)."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "the profiler does not answer (the program ended or stopped profiling?)"
    if isinstance(exc, TimeoutError):
        return "the profiler did not answer in time"
    if isinstance(exc, aiohttp.ClientError):
        return f"the connection failed ({type(exc).__name__})"
    return " ".join(str(exc).split()) or type(exc).__name__  # one line: the status line


class HelpScreen(ModalScreen[None]):
    """What every key does and what every column means, one line each."""

    CSS = """
    HelpScreen { align: center middle; }
    #help { width: 100%; height: 100%; border: round $accent; padding: 0 1; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,question_mark,q", "dismiss", "Close help"),
    ]

    def __init__(self, first: str) -> None:
        super().__init__()
        self.first = first

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):
            # the box's border and padding take 4 columns, its scrollbar 2
            yield Static(help_text(self.first, self.app.size.width - 6), markup=False)


KEYS = (
    (
        " ".join(v.key for v in VIEWS),
        f"show {', '.join(v.name for v in VIEWS)} (1-9: the views in that order)",
    ),
    ("< >  o", "sort by the column to the left / right (o: to the right)"),
    ("r", "reverse the sort; clicking a column's header sorts by it, again reverses"),
    ("enter", "show the highlighted row's recent logs below; they follow that row"),
    ("escape", "close the logs"),
    ("p", "pause refreshing"),
    ("?", "this help"),
    ("q", "quit"),
)


def _wrapped(name: str, text: str, indent: int, width: int) -> list[str]:
    """``name`` then ``text`` wrapped under itself, as a definition list reads."""
    head = f"  {name:<{indent}}  "
    return textwrap.wrap(
        text,
        width=max(len(head) + 20, width),
        initial_indent=head,
        subsequent_indent=" " * len(head),
    ) or [head]


def help_text(first: str = "futures", width: int = 100) -> str:
    """The help screen's text, wrapped at ``width``: ``first``'s columns, the keys, then every
    other view's columns."""
    views = sorted(VIEWS, key=lambda v: v.name != first)
    lines: list[str] = []
    for n, view in enumerate(views):
        lines += textwrap.wrap(f"{view.name} ({view.key}): {view.about}", width=width)
        indent = max(len(c.name) for c in view.columns)
        for c in view.columns:
            lines += _wrapped(c.name, c.help, indent, width)
        lines += [""]
        if n == 0:
            lines += ["keys"]
            for keys, what in KEYS:
                lines += _wrapped(keys, what, 8, width)
            lines += [
                "",
                "Units: ns µs ms s, m = minutes, h = hours, d = days; k/M = thousands/millions.",
                "Σ marks a sum over calls, producers, consumers or items: it can exceed the run.",
                "Columns that do not fit the width are dropped, least useful first.",
                "",
            ]
    return "\n".join(lines).rstrip()


#: the views whose keys the footer shows (the others' are on the help screen)
_FOOTER_VIEWS = 6


class TopApp(App[None]):
    """The live view. ``refresh_now()`` fetches once; a timer calls it every ``interval``."""

    TITLE = "asyncflow top"
    ENABLE_COMMAND_PALETTE = False  # its footer entry would push "q Quit" off an 80-column line
    CSS = """
    #status { height: 1; background: $boost; }
    #table { height: 1fr; scrollbar-size-vertical: 1; }
    #detail { height: auto; max-height: 40%; border-top: solid $accent; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        # The footer holds the first views, Sort, Help and Quit within 80 columns (more views
        # pushed "? Help" and "q Quit" off the line); every view's key is on the help screen.
        *(
            Binding(v.key, f"show('{v.name}')", v.name.capitalize(), show=n < _FOOTER_VIEWS)
            for n, v in enumerate(VIEWS)
        ),
        *(Binding(str(n), f"show('{v.name}')", show=False) for n, v in enumerate(VIEWS, 1)),
        Binding("greater_than_sign,o", "sort(1)", "Sort", key_display=">"),
        Binding("less_than_sign", "sort(-1)", "Sort left", show=False),
        # r and p are on the help screen: the footer keeps room for every view's key
        Binding("r", "reverse", "Reverse", show=False),
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("p", "pause", "Pause", show=False),
        Binding("escape", "unselect", "Close logs", show=False),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(self, url: str, token: str | None = None, interval: float = 0.5) -> None:
        super().__init__()
        self.url = url.rstrip("/")
        self.token = token
        self.interval = interval
        self.view = VIEWS[0].name
        self.sort = {v.name: v.sort for v in VIEWS}
        self.reversed = dict.fromkeys(self.sort, False)
        self.paused = False
        self.selected: str | None = None  # id of the row whose logs are shown
        self.rows: list[Row[Any]] = []
        self.detail: Any = None  # the list document, for views with a detail pane
        #: the selected row's logs document (or its entry, for a view without a logs route)
        self.logs: Any = None
        self.context = Context()
        self.error: str | None = None
        self.name_line = ""
        self.refreshes = 0  # answers shown so far (tests wait on it)
        # what was fetched per row beyond its list (oldest live call), kept until asked again
        self._oldest: dict[tuple[str, str], int] = {}
        self._shown: list[tuple[int, int]] = []  # (column index, width) on screen now
        self._session: aiohttp.ClientSession | None = None
        self._busy = False  # a refresh is in flight; a tick meanwhile is skipped

    @property
    def current(self) -> View[Any, Any]:
        """The view shown."""
        return next(v for v in VIEWS if v.name == self.view)

    def compose(self) -> ComposeResult:
        yield Static("connecting…", id="status", markup=False)
        yield DataTable(id="table", cursor_type="row", zebra_stripes=True)
        yield Static("", id="detail", markup=False)
        yield Footer(compact=True)

    async def on_mount(self) -> None:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else None
        self._session = aiohttp.ClientSession(
            headers=headers, timeout=aiohttp.ClientTimeout(total=max(2.0, self.interval * 4))
        )
        self._redraw()
        await self.refresh_now()
        self.set_interval(self.interval, self.refresh_now)

    async def on_unmount(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _get(self, path: str, document: type[_D]) -> _D:
        """``path``'s document, parsed with the schema.

        Raises:
            RuntimeError: the endpoint answered an error (its message is said).
            DocumentError: the answer is not a ``document``: a field is missing or of another
                type (the message says which); fields it does not have are left out.
        """
        assert self._session is not None
        async with self._session.get(self.url + path) as response:
            body = await response.json(content_type=None)
            if response.status != 200:
                try:
                    message = load(ErrorDocument, body, ignore_unknown=True).error.message
                except DocumentError:
                    message = response.reason or "no reason given"
                if response.status == 401:
                    message = f"the endpoint refused the token: {message}"
                error = NotServed if response.status == 404 else RuntimeError
                raise error(f"{response.status}: {message}")
        try:
            # a field top does not know is a newer asyncflow's: a new field is compatible
            return load(document, body, ignore_unknown=True)
        except DocumentError as exc:
            raise DocumentError(
                f"GET {path.partition('?')[0]} answered a document top cannot read: {exc}"
            ) from None

    async def refresh_now(self) -> None:
        """Fetch the current view's documents and redraw; errors go to the status line."""
        if self.paused or self._busy:
            return
        self._busy = True
        try:
            await self._fetch(self.current)
        except NoMatches:  # the app is closing under a refresh in flight
            pass
        finally:
            self._busy = False

    async def _fetch(self, view: View[Any, Any]) -> None:
        asked = self.selected
        selected = asked
        try:
            status = await self._get("/profiler_status", ProfilerStatus)
            warnings = await self._get("/warnings", WarningsDocument)
            if view.fetch is not None:
                document = await view.fetch(self._get)
            else:
                document = await self._get(view.route, view.document)
            note = view.note(document) if view.note is not None else None
            rows = _rows(view, view.entries(document))
            ids = {row.key for row in rows}
            if selected is not None and selected not in ids:
                selected = None  # gone from the list: nothing to follow
            context = Context(uptime_ns=status.uptime_ns, labels=self.context.labels)
            for row in rows:  # what each row had fetched for it last time, until asked again
                row.oldest_ns = self._oldest.get((view.name, row.key), _UNASKED)
            if view.name == "futures":
                context.labels.update({row.entry.id: row.entry.label for row in rows})
            if view.enrich is not None:
                await view.enrich(self._get, self._sorted(view, rows), context)
            logs = None
            if selected is not None and view.logs is not None:
                logs = await self._get(view.logs.route.format(id=selected), view.logs.document)
            elif selected is not None:  # a view without logs shows the row itself
                logs = next(row.entry for row in rows if row.key == selected)
        except (aiohttp.ClientError, TimeoutError, RuntimeError, ValueError) as exc:
            self.error = f"{_why(exc)} · {self.url} · retrying every {self.interval:g} s"
            self._status()
            return
        if view.name != self.view or self.selected != asked:
            return  # the user switched views or rows meanwhile: this answer is for another
        self._oldest = {
            (view.name, row.key): row.oldest_ns for row in rows if row.oldest_ns != _UNASKED
        }
        self.error = None
        self.name_line = (f"{note} · " if note else "") + _warning_count(warnings.warnings)
        self.name_line += _status_line(status)
        self.rows, self.detail, self.logs, self.context = rows, document, logs, context
        if self.selected is not None and selected is None:
            self.selected = None  # the selected row is gone
        self._redraw()
        if self.context.missing and self.logs is not None:
            await self._name_futures()
        self.refreshes += 1
        self._status()

    async def _name_futures(self) -> None:
        """Logs named futures top has not seen: read their labels once and print again."""
        try:
            futures = await self._get("/futures", FuturesDocument)
        except (aiohttp.ClientError, TimeoutError, RuntimeError, ValueError):
            return
        self.context.labels.update({f.id: f.label for f in futures.futures})
        self.context.missing.clear()
        self._show_detail()

    def _status(self) -> None:
        arrow = "▲" if self.reversed[self.view] else "▼"
        state = "PAUSED · " if self.paused else ""
        text = (
            self.error
            if self.error
            else f"{state}{self.view} by {self.sort[self.view]} {arrow} · {self.name_line}"
        )
        self.query_one("#status", Static).update(Text(text, style="bold red" if self.error else ""))

    def _sorted(self, view: View[Any, E], rows: Iterable[Row[E]]) -> list[Row[E]]:
        column = view.column(self.sort[view.name])
        # Stable: ties keep the document's order. Numbers biggest first, text A to Z.
        descending = column.numeric != self.reversed[view.name]
        return sorted(rows, key=column.key, reverse=descending)

    def _redraw(self) -> None:
        view = self.current
        table = self.query_one("#table", DataTable)
        # The cursor follows an entity, not a position: the selected one (its logs are shown),
        # else the one highlighted before the rows were sorted or refreshed.
        follow = self.selected if self.selected is not None else self._highlighted(table)
        cursor = table.cursor_row
        rows = self._sorted(view, self.rows)
        cells = [tuple(c.cell(row) for c in view.columns) for row in rows]
        width = table.size.width or self.size.width
        shown = fit(view, cells, width, self.sort[view.name])
        if shown != self._shown:
            table.clear(columns=True)
            arrow = "▲" if self.reversed[view.name] else "▼"
            for i, w in shown:
                col = view.columns[i]
                name = col.name + (arrow if col.name == self.sort[view.name] else "")
                table.add_column(
                    Text(name, justify="right" if col.numeric else "left"), width=w, key=col.name
                )
            self._shown = shown
        else:
            table.clear()
        for row, values in zip(rows, cells, strict=True):
            table.add_row(
                *(
                    Text(
                        _clip(values[i], w, view.columns[i].cut_left),
                        justify="right" if view.columns[i].numeric else "left",
                    )
                    for i, w in shown
                ),
                key=row.key,
            )
        if rows:
            ids = [row.key for row in rows]
            target = ids.index(follow) if follow in ids else min(cursor, len(rows) - 1)
            table.move_cursor(row=target, animate=False)
        self._show_detail()

    def _show_detail(self) -> None:
        view = self.current
        lines: list[str] = []
        if self.selected is not None and self.logs is not None and view.has_logs:
            row = next((r for r in self.rows if r.key == self.selected), None)
            self.context.row = None if row is None else row.entry
            if view.logs is not None:
                lines = view.logs.lines(self.logs, self.context)
            elif view.row_lines is not None:
                lines = view.row_lines(self.logs, self.context)
        elif self.selected is not None:
            lines = ["loading logs…"]
        elif view.detail is not None and self.detail is not None:
            lines = view.detail(self.detail)
        self.query_one("#detail", Static).update("\n".join(lines))

    @staticmethod
    def _highlighted(table: DataTable[Any]) -> str | None:
        if not table.row_count:
            return None
        return table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value

    def on_resize(self) -> None:
        self._shown = []
        self._redraw()

    def table_text(self) -> list[tuple[str, ...]]:
        """The table's rows as shown (what the tests read)."""
        table = self.query_one("#table", DataTable)
        return [tuple(str(c) for c in table.get_row_at(i)) for i in range(table.row_count)]

    def header(self) -> list[str]:
        """The column names on screen now, the sort arrow included."""
        return [str(c.label) for c in self.query_one("#table", DataTable).columns.values()]

    def screen_text(self) -> str:
        """The terminal's contents as plain text, as a person sees them (textual's own
        screenshot, rendered as text instead of SVG)."""
        width, height = self.size
        console = Console(
            width=width, height=height, file=io.StringIO(), record=True, legacy_windows=False
        )
        console.print(self.screen._compositor.render_update(full=True))
        return "\n".join(line.rstrip() for line in console.export_text().splitlines())

    async def action_show(self, view: str) -> None:
        if view == self.view:
            return
        self.view = view
        self.selected = self.logs = self.detail = None
        self.rows = []
        self._shown = []
        self._redraw()
        self._status()
        self.call_later(self.refresh_now)

    def action_sort(self, step: int) -> None:
        view = self.current
        shown = [view.columns[i].name for i, _ in self._shown if view.columns[i].sortable]
        names = shown or [c.name for c in view.columns if c.sortable]
        now = self.sort[self.view]
        at = names.index(now) if now in names else -1
        self._sort_by(names[(at + step) % len(names)])

    def _sort_by(self, name: str, *, reverse: bool = False) -> None:
        self.sort[self.view] = name
        self.reversed[self.view] = reverse
        self._shown = []  # the arrow moves
        self._redraw()
        self._status()

    def action_reverse(self) -> None:
        self._sort_by(self.sort[self.view], reverse=not self.reversed[self.view])

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        name = event.column_key.value
        if name is None or not self.current.column(name).sortable:
            return
        same = name == self.sort[self.view]
        self._sort_by(name, reverse=not self.reversed[self.view] if same else False)

    def action_pause(self) -> None:
        self.paused = not self.paused
        self._status()

    def action_help(self) -> None:
        self.push_screen(HelpScreen(self.view))

    def action_unselect(self) -> None:
        self.selected = self.logs = None
        self._show_detail()

    def _select(self, row_id: str) -> None:
        self.selected = row_id
        self.logs = None
        self._show_detail()
        self.call_later(self.refresh_now)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if not self.current.has_logs or event.row_key.value is None:
            return
        self._select(event.row_key.value)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        # With logs open, they follow the cursor. A highlight that is not the row under the
        # cursor now is stale (posted while the table was being refilled) and is ignored.
        key = event.row_key.value
        table = self.query_one("#table", DataTable)
        if self.selected is None or key is None or key == self.selected:
            return
        if key == self._highlighted(table):
            self._select(key)
