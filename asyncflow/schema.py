"""The documents asyncflow produces: one wire schema for snapshots, reports, the endpoint and CLI.

Every document is a frozen, slotted dataclass that orjson serialises as it is. Durations and
timestamps are integers in nanoseconds; timestamps count from the profiler's start. Percentile
maps are keyed ``"p50"``, ``"p99.9"``... and are empty when nothing was measured yet.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson

__all__ = [
    "OWN_CODE",
    "ROUTE",
    "SCHEMA",
    "AwaitFrame",
    "BarrierInfo",
    "BlockedEpisode",
    "BlockedLine",
    "CallEntry",
    "CallStates",
    "Cancellations",
    "ChannelEntry",
    "ChannelLogEntry",
    "ChannelLogs",
    "ChannelsDocument",
    "ConditionInfo",
    "DocumentError",
    "EdgeEntry",
    "ErrorDocument",
    "ErrorInfo",
    "EventInfo",
    "ExceptionInfo",
    "ExecutorEntry",
    "ExecutorsDocument",
    "FlowDocument",
    "FlowEdge",
    "FlowNode",
    "FunctionEntry",
    "FunctionsDocument",
    "FutureEntry",
    "FutureLogs",
    "FuturesDocument",
    "GraphCycle",
    "GraphDocument",
    "GraphEdge",
    "GraphNode",
    "JobGroup",
    "LineageHop",
    "LineageMessage",
    "LineagePath",
    "LineageTail",
    "LiveSample",
    "Location",
    "LoopDocument",
    "LoopEntry",
    "MetricEntry",
    "MetricsDocument",
    "NeverAwaitedEntry",
    "NotProfiledEntry",
    "Outcomes",
    "PermitsInfo",
    "PollAllocations",
    "PollCpu",
    "ProfilerStatus",
    "ResourceEntry",
    "ResourceFutureEntry",
    "ResourceHolder",
    "ResourceLogEntry",
    "ResourceLogs",
    "ResourcesDocument",
    "RunningCall",
    "Snapshot",
    "StackFrame",
    "StreamEntry",
    "StreamItemEntry",
    "StreamLogs",
    "StreamsDocument",
    "TaskEntry",
    "TasksDocument",
    "ThreadEntry",
    "ThreadsDocument",
    "ValueSample",
    "WaitSummary",
    "WaitTarget",
    "WarningEntry",
    "WarningSubject",
    "WarningsDocument",
    "dumps",
    "fit_text",
    "load",
]

#: Bumped by any change that breaks a field of a document.
SCHEMA = 1


#: ``FutureEntry.tracked_by`` of the program's own coroutine functions, which ``asyncflow run``
#: tracks without being asked
OWN_CODE = "own_code"
#: ``FutureEntry.tracked_by`` of a web framework's route (each request a call of it)
ROUTE = "route"


@dataclass(frozen=True, slots=True)
class Location:
    """Where a future is defined."""

    file: str
    line: int


@dataclass(frozen=True, slots=True)
class CallStates:
    """How many calls of a future are in each state now."""

    pending: int
    running: int
    suspended: int
    ready: int
    cancelled: int


@dataclass(frozen=True, slots=True)
class Outcomes:
    """How finished calls ended. ``ready`` = returned + raised; ``cancelled`` = the rest."""

    returned: int
    raised: int
    cancelled: int
    #: closed (``close()``, or garbage-collected) after it had started
    closed: int
    #: garbage-collected or closed without ever being polled
    never_awaited: int
    #: of ``closed``: garbage-collected after it had started, never finished (a task that
    #: nothing referenced, destroyed while pending: the loop keeps only a weak reference to it)
    dropped: int = 0


@dataclass(frozen=True, slots=True)
class Cancellations:
    """Cancellation requests thrown into a future's calls, and what came of them."""

    #: calls that received at least one (Task.cancel(), a timeout, a task group's cancel)
    requested: int = 0
    #: of those, calls that returned normally while their task was still being cancelled
    swallowed: int = 0
    #: of those, calls that raised something else (asyncio.timeout's TimeoutError, say)
    raised: int = 0
    #: the longest time from a call's first request to its end
    max_to_end_ns: int = 0


@dataclass(frozen=True, slots=True)
class LiveSample:
    """A future's live calls at one moment, sampled by the collector."""

    #: how long before the document was built
    ago_ns: int
    #: calls not finished then
    live: int
    #: calls created up to then
    created: int


@dataclass(frozen=True, slots=True)
class FutureEntry:
    """One tracked coroutine definition and the totals over its calls in this session."""

    id: int
    label: str
    #: ``module:qualname``
    source: str
    location: Location
    #: ``decorator``, ``task`` (whole-program mode), ``instrument`` or ``own_code`` (a coroutine
    #: function of the program's own code, tracked by ``asyncflow run`` unasked: ``OWN_CODE``)
    tracked_by: str
    call_count: int
    calls: CallStates
    outcomes: Outcomes
    total_polls: int
    #: sum of poll durations over all calls, live ones included
    busy_ns: int
    #: time calls spent suspended between polls, live ones included
    idle_ns: int
    max_poll_duration_ns: int
    poll_duration_ns: dict[str, int]
    #: from a call's creation to its end, over finished calls
    call_duration_ns: dict[str, int]
    #: whether its function (or code) still exists; a gone future stays listed, among the
    #: last few gone, until it is folded into the aggregate of its label
    alive: bool = True
    #: for an aggregate, how many gone futures of this label (and tracked_by) it sums; 0 else
    folded_count: int = 0
    cancellations: Cancellations = field(default_factory=Cancellations)
    #: live calls over the whole profile, oldest first, in at most 32 samples (about one a
    #: second at first, further apart as the profile grows): a task leak is a steady rise
    live_series: list[LiveSample] = field(default_factory=list)
    #: CPU time of its polls, with ``cpu=True``; None when not measured
    cpu: PollCpu | None = None
    #: memory its polls allocated, with ``allocations=True``; None when not measured
    allocations: PollAllocations | None = None
    #: scheduled time: the sum of the waits from a task's wake-up (handed to its loop) to the
    #: poll it led to (the loop's queueing delay), over the calls that are a task's own
    #: (whole-program mode, or a tracked call made a task) or the first tracked call an
    #: untracked task awaits (anyio's task group tasks), live ones included; part of idle_ns
    scheduled_ns: int = 0
    #: how many wake-ups were measured so, and the longest wait
    scheduled_polls: int = 0
    max_scheduled_ns: int = 0
    #: percentiles of those waits, one per wake-up
    scheduled_delay_ns: dict[str, int] = field(default_factory=dict)
    #: ``asyncio.gather`` calls one of its calls took part in, counted where every child was
    #: a task running a tracked call and none was cancelled (the gather waited for all)
    gathers: int = 0
    #: of those, the gathers whose last call to end was one of its: the one the gather
    #: waited for
    gathers_last: int = 0
    #: calls that raised, by exception type name, over the whole run (not only the log of
    #: recent calls): at most 16 names, the rest counted together under ``(other)``
    errors: dict[str, int] = field(default_factory=dict)
    #: how long before the document was built its first call of the session was made (a
    #: service's first request, for a route); None: no call yet, or not known
    first_call_ago_ns: int | None = None
    #: the future whose call was running when its first call was made: its caller (for a
    #: coroutine awaited in that call) or its maker (for a task); None: none, or not known
    first_caller_id: int | None = None


@dataclass(frozen=True, slots=True)
class PollCpu:
    """CPU time of a future's measured polls (``cpu=True``): the polling thread's CPU clock
    (user and system time together) read around each poll."""

    #: polls measured (those that ran while the profiler measured), and their busy time
    polls: int
    busy_ns: int
    #: CPU time the polling thread used in them
    cpu_ns: int
    #: busy minus CPU: time the polls held the loop without computing (a blocking system
    #: call, waiting for the GIL another thread held, page faults)
    off_cpu_ns: int
    #: the most CPU time one poll used
    max_poll_cpu_ns: int
    #: the poll that held the loop longest off the CPU: its busy and CPU time, and its call
    worst_poll_busy_ns: int
    worst_poll_cpu_ns: int
    worst_poll_call_id: int | None
    #: cpu_ns split into the thread's user time and system time (the kernel working for it:
    #: system calls, page faults), where the platform gives them apart (Linux); null elsewhere
    user_ns: int | None = None
    system_ns: int | None = None


@dataclass(frozen=True, slots=True)
class PollAllocations:
    """Memory a future's measured polls allocated (``allocations=True``, through tracemalloc):
    net per poll, growth and release summed apart."""

    polls: int
    #: bytes the polls left allocated, summed over polls whose traced memory grew
    allocated_bytes: int
    #: bytes released, summed over polls whose traced memory shrank
    freed_bytes: int
    #: the most one poll grew the traced memory by
    max_poll_bytes: int
    #: net small-object blocks (``sys.getallocatedblocks()``: objects up to 512 bytes) the
    #: polls left in use: allocated minus freed during each poll, summed; can be negative
    allocated_blocks: int | None = None


@dataclass(frozen=True, slots=True)
class FuturesDocument:
    """``GET /futures``: futures sorted by busy time, most first."""

    schema: int
    total: int
    offset: int
    limit: int
    futures: list[FutureEntry]
    #: coroutines of the whole program created and never awaited, by function, most first
    never_awaited: list[NeverAwaitedEntry] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ExceptionInfo:
    """What a call raised: the exception's type and (truncated) message."""

    type: str
    message: str


@dataclass(frozen=True, slots=True)
class CallEntry:
    """One call of a future, as listed in its log."""

    call_id: int
    future_id: int
    state: str
    poll_count: int
    total_poll_duration_ns: int
    max_poll_duration_ns: int
    last_poll_duration_ns: int
    busy_ns: int
    idle_ns: int
    created_ns: int
    first_poll_ns: int | None
    finished_ns: int | None
    #: how long the poll in progress has been running (``running`` calls only)
    current_elapsed_ns: int | None
    #: the name of the task the call ran in, when it ran in one
    task: str | None
    #: ``returned``, ``raised``, ``cancelled``, ``closed``, ``never_awaited``; None while live
    outcome: str | None
    exception: ExceptionInfo | None
    #: truncated ``repr()`` of the return value, only with ``log_result=True``
    result: str | None
    #: cancellations thrown into the call
    cancel_requests: int = 0
    #: after one: ``cancelled`` (it did), ``swallowed`` (returned while its task was still
    #: cancelling), ``withdrawn`` (returned after the request was withdrawn, as asyncio.timeout
    #: does) or ``raised`` (something else); None while live or never asked
    cancel_outcome: str | None = None
    #: time from the first request to the call's end
    cancel_to_end_ns: int | None = None
    #: CPU time its polls used (``cpu=True``); None when not measured
    cpu_ns: int | None = None
    #: its user and system parts, where the platform gives them apart (Linux); else None
    user_ns: int | None = None
    system_ns: int | None = None
    #: bytes its polls left allocated, and released (``allocations=True``); None when not
    allocated_bytes: int | None = None
    freed_bytes: int | None = None
    #: net small-object blocks its polls left in use (allocated minus freed; can be negative)
    allocated_blocks: int | None = None
    #: its scheduled time: the sum of its task's waits from a wake-up to the poll it led to
    #: (part of idle_ns); 0 for a call that is not its task's own (or the first tracked call
    #: its untracked task awaits)
    scheduled_ns: int = 0


@dataclass(frozen=True, slots=True)
class FutureLogs:
    """``GET /futures/{id}/logs``: every unfinished call, then the most recent finished ones."""

    schema: int
    future_id: int
    label: str
    calls: list[CallEntry]


@dataclass(frozen=True, slots=True)
class NotProfiledEntry:
    """Something the program ran that asyncflow could not profile, and why."""

    #: ``loop`` (an event loop whose tasks are not tracked) or ``trio`` (trio's scheduler)
    kind: str
    #: the loop's class (``module.qualname``), or the trio entry point (``trio.run``)
    name: str
    reason: str
    #: how many times it was met: loops of that class, runs of trio
    count: int


@dataclass(frozen=True, slots=True)
class ProfilerStatus:
    """``GET /profiler_status``: the profiler itself."""

    schema: int
    name: str
    version: str
    pid: int
    python: str
    uptime_ns: int
    running: bool
    #: polls and call ends recorded (exact)
    events_recorded: int
    #: finished-call log entries lost because the collector fell behind
    events_dropped: int
    internal_errors: int
    last_internal_error: str | None
    futures: int
    calls_live: int
    channels: int
    streams: int
    #: true: the compiled hot path records calls; false: the pure-Python one does (not built,
    #: or ``ASYNCFLOW_NO_EXTENSIONS=1``); null: not said (a document from an older version)
    accelerated: bool | None = None
    #: what the program ran that asyncflow could not profile (an event loop that refused its
    #: task factory, trio), each with the reason
    not_profiled: list[NotProfiledEntry] = field(default_factory=list)
    #: tasks that raised forgotten unjudged by never-retrieved, past the 1,000 remembered at
    #: once that nobody had retrieved yet (a task the finding may miss), in this profile
    unretrieved_dropped: int = 0
    #: attached to a running program (``asyncflow attach``): the live tasks it adopted, made
    #: before the attach (what they run is not timed); null: started with the program
    adopted_tasks: int | None = None
    #: the web frameworks whose application a server started on a tracked loop (its lifespan
    #: or startup ran: ``starlette``, which FastAPI is, or ``aiohttp``): the program serves
    #: requests, each a call of its route's future, whether or not one came yet; empty: none
    #: (or a document from an older version)
    serving: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class EdgeEntry:
    """Messages one future sent into, or received from, a channel."""

    future_id: int | None
    #: the future's label; ``(untracked)`` for code outside any tracked call
    label: str
    messages: int
    #: time in channel of those messages (for sends: of the ones received so far)
    delay_ns: dict[str, int]
    max_delay_ns: int


@dataclass(frozen=True, slots=True)
class ChannelEntry:
    """One instrumented channel (asyncio queue or anyio memory stream)."""

    id: int
    label: str
    #: ``asyncio.Queue``, ``asyncio.PriorityQueue``, ``anyio.MemoryObjectStream``...
    kind: str
    #: ``bounded[N]`` or ``unbounded``
    channel_type: str
    #: ``active`` or ``closed``
    state: str
    sent_count: int
    received_count: int
    #: receives that could not be paired with a send (storage changed behind the queue's back)
    unpaired_count: int
    queue_size: int
    max_queue_size: int
    #: messages per second, between the first and the last timed message
    send_rate: float
    receive_rate: float
    #: time in channel, send to receive, of the timed messages (each weighted by the messages
    #: it stands for)
    delay_ns: dict[str, int]
    #: the longest time in channel among the timed messages
    max_delay_ns: int
    #: total time producers waited on a full channel (every wait is timed; one going on
    #: now counts up to now)
    producers_blocked_ns: int
    #: total time consumers waited on an empty channel (every wait is timed; one going on
    #: now counts up to now)
    consumers_starved_ns: int
    #: who sent and who received; counts add up to ``sent_count`` and ``received_count``, and
    #: are exact while ``sampling_interval`` is 1 (else each timed message stands for the ones
    #: since the previous timed message)
    senders: list[EdgeEntry]
    receivers: list[EdgeEntry]
    #: messages whose time in channel was measured (every message paired while sampling is 1)
    timed_count: int = 0
    #: one message in this many is timed now (1: all of them)
    sampling_interval: int = 1
    #: messages sent and never to be received: the channel was garbage-collected (or, for a
    #: memory stream, every receive side closed) with them still in it
    lost_count: int = 0
    #: whether its queue or stream still exists (``state`` says ``closed`` for a gone one and
    #: for a memory stream closed but still held); a gone channel stays listed, among the last
    #: few gone, until it is folded into the aggregate of its label
    alive: bool = True
    #: for an aggregate, how many gone channels of this label (and kind) it sums; 0 else
    folded_count: int = 0


@dataclass(frozen=True, slots=True)
class ChannelsDocument:
    """``GET /channels``: channels, busiest first."""

    schema: int
    total: int
    offset: int
    limit: int
    channels: list[ChannelEntry]


@dataclass(frozen=True, slots=True)
class ChannelLogEntry:
    """One send or receive; ``delay_ns`` is set on receives paired with their send."""

    index: int
    msg_id: int | None
    timestamp_ns: int
    call_id: int | None
    future_id: int | None
    delay_ns: int | None
    #: truncated ``repr()`` of the message, only with ``log_messages=True``
    message: str | None


@dataclass(frozen=True, slots=True)
class ChannelLogs:
    """``GET /channels/{id}/logs``: recent sends and receives, newest first."""

    schema: int
    channel_id: int
    label: str
    sent_logs: list[ChannelLogEntry]
    received_logs: list[ChannelLogEntry]


@dataclass(frozen=True, slots=True)
class StreamEntry:
    """One tracked async iterator or async generator definition."""

    id: int
    label: str
    source: str
    location: Location
    #: ``active`` while any iteration is; else how the last one ended: ``exhausted``,
    #: ``closed``, ``cancelled`` or ``failed``
    state: str
    #: iterations by state
    instances: dict[str, int]
    items_yielded: int
    #: how long the consumer waited for each timed item (time inside ``__anext__``)
    wait_ns: dict[str, int]
    max_wait_ns: int
    #: the timed waits, each weighted by the items it stands for (exact while sampling is 1)
    total_wait_ns: int
    #: time the consumer spent between receiving an item and asking for the next: the
    #: iterations' whole time (to now for those active) less ``total_wait_ns``
    consumer_ns: int
    #: items whose wait was measured
    timed_count: int = 0
    #: one item in this many is timed now (1: all of them)
    sampling_interval: int = 1
    #: always ``wrapped``: every generator of a decorated function, and every iterable, is
    #: iterated through asyncflow's wrapper. Kept for readers of schema 1, which also knew
    #: ``compiled`` (a decorated function compiled again from its source, retired since)
    mode: str = "wrapped"
    #: always None (it said why a decorated function was not compiled again); kept likewise
    fallback_reason: str | None = None
    #: whether its function's code (or its iterator's type) still exists; a gone stream stays
    #: listed, among the last few gone, until it is folded into the aggregate of its label
    alive: bool = True
    #: for an aggregate, how many gone streams of this label it sums; 0 else
    folded_count: int = 0


@dataclass(frozen=True, slots=True)
class StreamsDocument:
    """``GET /streams``: streams, most items first."""

    schema: int
    total: int
    offset: int
    limit: int
    streams: list[StreamEntry]


@dataclass(frozen=True, slots=True)
class StreamItemEntry:
    """One item a stream yielded."""

    index: int
    timestamp_ns: int
    wait_ns: int
    #: truncated ``repr()``, only with ``log_items=True``
    item: str | None


@dataclass(frozen=True, slots=True)
class StreamLogs:
    """``GET /streams/{id}/logs``: recent items, newest first."""

    schema: int
    stream_id: int
    label: str
    items: list[StreamItemEntry]


@dataclass(frozen=True, slots=True)
class FlowNode:
    """A future, channel or stream in the flow graph; ``id`` is ``"future:3"``, ``"channel:1"``."""

    id: str
    kind: str
    label: str


@dataclass(frozen=True, slots=True)
class FlowEdge:
    """Messages from a future into a channel, or from a channel to a future."""

    source: str
    target: str
    messages: int
    delay_ns: dict[str, int]
    max_delay_ns: int


@dataclass(frozen=True, slots=True)
class LineageHop:
    """One hop of a message's way: the time it waited in a channel, or spent in a stage."""

    #: ``channel`` (waiting in it) or ``stage`` (from the stage's receive to its send)
    kind: str
    #: the channel's or the stage's (future's) label
    name: str
    duration_ns: int
    #: for a stage: the part of it its call was running (polled); the rest it waited on
    #: something else inside the stage; None for a channel, or a stage outside tracked calls
    busy_ns: int | None = None


@dataclass(frozen=True, slots=True)
class LineageMessage:
    """One sampled message that went the whole path, hop by hop."""

    end_to_end_ns: int
    #: when its first send happened, in nanoseconds since the profile's start
    sent_ns: int
    #: channel, stage, channel, ... stage, channel: they add up to ``end_to_end_ns``
    hops: list[LineageHop]


@dataclass(frozen=True, slots=True)
class LineageTail:
    """The hop where a path's tail (its sampled messages at or past its p99 end to end) spent
    most of its time: the one the ``slow-path`` finding names."""

    #: its index among the hops (channel, stage, channel, ...)
    hop: int
    #: the hop in the finding's words: ``in `enrich`, waiting on something inside it``
    said: str
    #: its share of those messages' end-to-end time, in percent
    share_percent: int
    #: the mean time those messages spent in it
    mean_ns: int


@dataclass(frozen=True, slots=True)
class LineagePath:
    """A path through the flow graph (source, channel, stage, channel, ... sink) and the
    end-to-end latency of the sampled messages that went all of it."""

    #: ``src → parse → enrich → sink``: the stages (futures), the source first
    label: str
    #: the futures' labels, the source first and the last receiver last
    stages: list[str]
    #: the channels' labels, in order (one fewer than ``stages``)
    channels: list[str]
    #: sampled messages that completed the path
    messages: int
    #: from the source's send to the last receive, percentiles of those messages
    end_to_end_ns: dict[str, int]
    max_end_to_end_ns: int
    #: the mean time per hop (channel, stage, channel...), over those messages
    mean_hops: list[LineageHop]
    #: the slowest messages, slowest first, with their hops
    slowest: list[LineageMessage]
    #: the flow graph's nodes along the path (source, channel, stage, ... channel, last
    #: receiver): hop ``i`` is node ``i + 1``
    node_ids: list[str] = field(default_factory=list)
    #: the hop that dominates the tail; None while no message went the whole path
    tail: LineageTail | None = None


@dataclass(frozen=True, slots=True)
class FlowDocument:
    """``GET /flow``: the data-flow graph."""

    schema: int
    nodes: list[FlowNode]
    edges: list[FlowEdge]
    #: message lineage: each path the sampled messages went, most messages first
    lineage: list[LineagePath] = field(default_factory=list)
    #: sampled messages whose lineage was let go: the bounded tables of chains in flight or of
    #: paths were full, or a chain grew past its length bound
    lineage_dropped: int = 0


@dataclass(frozen=True, slots=True)
class RunningCall:
    """A tracked call whose poll is running on a loop, and since when."""

    future_id: int
    label: str
    call_id: int
    #: when its current poll started
    since_ns: int
    #: how long that poll had run when this was read
    elapsed_ns: int


@dataclass(frozen=True, slots=True)
class StackFrame:
    """One frame of a stack; ``code`` is the source line when it could be read."""

    file: str
    line: int
    function: str
    code: str | None


@dataclass(frozen=True, slots=True)
class BlockedEpisode:
    """A time the loop did not run its callbacks for longer than the block threshold."""

    id: int
    started_ns: int
    blocked_ns: int
    #: still blocked when this was read (``blocked_ns`` is then a lower bound)
    ongoing: bool
    #: the task that was running, and the innermost tracked call on the stack, if any
    task: str | None
    call: RunningCall | None
    #: the loop thread's stack taken while it was blocked, innermost frame first
    stack: list[StackFrame]
    #: CPU time the loop's thread used over ``cpu_wall_ns`` of the episode (from the first look
    #: at it to its end); null where another thread's CPU clock cannot be read (not Linux)
    cpu_ns: int | None = None
    cpu_wall_ns: int = 0
    #: ``cpu`` (the thread was on the CPU at least half of the time measured, or runnable at
    #: most looks: computing, if short of a core), ``blocking`` (a sleep, blocking I/O, a lock:
    #: little CPU), or null when the CPU was not measured
    kind: str | None = None
    #: the route of the request the running task served (``GET /orders/{order_id}``), when a
    #: web framework routed it (whole-program mode); null otherwise
    route: str | None = None


@dataclass(frozen=True, slots=True)
class BlockedLine:
    """One line of the program that blocked its loop, each time at least ``block_min_ns``:
    the line's total, which ranks it (time lost, not the longest block)."""

    file: str
    line: int
    function: str
    #: the source line, when it could be read
    code: str | None
    #: blocks at this line, their sum, the longest, and when the latest ended
    count: int
    total_ns: int
    max_ns: int
    last_ns: int
    #: CPU time the loop's thread used over ``cpu_wall_ns`` of those blocks; null where
    #: another thread's CPU clock cannot be read (not Linux)
    cpu_ns: int | None
    cpu_wall_ns: int
    #: ``cpu``, ``blocking`` or null, as for an episode; ``import`` when most of its blocks
    #: were imports (the stack inside the import system: a module imported on first use)
    kind: str | None
    #: the innermost tracked call's future at the latest block (null: untracked code)
    future_id: int | None
    label: str | None
    #: the route of the request the latest block served, as an episode's ``route``
    route: str | None = None


@dataclass(frozen=True, slots=True)
class LoopEntry:
    """One instrumented event loop's health."""

    id: int
    label: str
    thread: str
    #: ``running``, ``stopped`` (not running now) or ``closed``
    state: str
    #: the current lag: the late heartbeat's wait so far, or the last one measured
    lag_now_ns: int
    lag_ns: dict[str, int]
    max_lag_ns: int
    heartbeats: int
    tasks_alive: int
    running: RunningCall | None
    blocked: bool
    blocked_count: int
    #: the most recent episodes, newest first
    episodes: list[BlockedEpisode]
    #: the longest finished episodes, longest first, whenever they happened
    worst_episodes: list[BlockedEpisode] = field(default_factory=list)
    #: heartbeats late by more than the block threshold while the loop waited in its selector:
    #: woken, its thread waited for the CPU or the GIL; no code blocked it (not in blocked_count)
    late_wakeups: int = 0
    #: the lines that blocked it for ``block_min_ns`` or more, the most time lost first (at most
    #: 32; blocks at lines no longer listed are counted in ``other_blocks``, ``other_blocks_ns``)
    blocking_lines: list[BlockedLine] = field(default_factory=list)
    other_blocks: int = 0
    other_blocks_ns: int = 0


@dataclass(frozen=True, slots=True)
class LoopDocument:
    """``GET /loop``: every event loop asyncflow instruments."""

    schema: int
    block_threshold_ns: int
    loops: list[LoopEntry]
    #: a block this long is counted on its line's total (``blocking_lines``)
    block_min_ns: int = 0


@dataclass(frozen=True, slots=True)
class AwaitFrame:
    """One coroutine of a task's await chain, at the line where it is suspended now."""

    file: str
    line: int
    function: str


@dataclass(frozen=True, slots=True)
class WaitTarget:
    """What a task waits on, resolved to something a person recognises."""

    #: ``queue_get``, ``queue_put``, ``queue_join``, ``lock``, ``semaphore``, ``condition``,
    #: ``event``, ``barrier``, ``sleep``, ``task``, ``gather``, ``wait``, ``taskgroup``,
    #: ``executor``, ``io`` or ``future`` (anything else, described by its repr)
    kind: str
    #: in words: "get from queue app.py:12", "sleep (1.5 s left)", "task Task-7"
    description: str
    #: the document entry it names, when asyncflow tracks it: ``channel:3``, ``resource:2``,
    #: ``task:Task-7``
    ref: str | None
    #: the label of the queue, resource, task or function it names
    label: str | None
    #: for a sleep, the time left
    remaining_ns: int | None
    #: for a gather, asyncio.wait or task group, the children not finished yet
    children: int | None


@dataclass(frozen=True, slots=True)
class TaskEntry:
    """One live task: what it runs, where it is suspended, and what it waits on."""

    name: str
    loop_id: int
    #: ``waiting`` (on ``waits_on``), ``scheduled`` (ready to run its next step), ``running``
    #: (in the middle of a step when read) or ``done``
    state: str
    #: the qualified name of the task's coroutine
    coroutine: str
    #: the tracked future and call the task runs, when asyncflow tracks it
    future_id: int | None
    future_label: str | None
    call_id: int | None
    #: time since the tracked call was created; None for untracked tasks
    age_ns: int | None
    #: the await chain from the task's coroutine inwards, innermost last
    chain: list[AwaitFrame]
    waits_on: WaitTarget | None
    #: the innermost frame of the chain in the program's own code (not asyncio's, not an
    #: installed package's, not asyncflow's): the line a person looks at
    where: AwaitFrame | None = None
    #: the tracked calls in its await chain, outermost first: a resource's holder
    #: (``ResourceHolder.call_id``) is one of them when this task holds it
    chain_calls: list[int] = field(default_factory=list)
    #: the ``async with`` blocks open in its chain, outermost first: the lines where it took
    #: the locks and permits it holds while it waits
    held_at: list[AwaitFrame] = field(default_factory=list)
    #: the tasks it waits for (the task it awaits, a gather's, ``asyncio.wait``'s or a task
    #: group's unfinished children), by name
    awaits: list[str] = field(default_factory=list)
    #: the tasks that wait for it, by name (the task tree's edges upwards)
    awaiters: list[str] = field(default_factory=list)
    #: the task that created it, by name, when asyncflow saw it made (None: made outside a
    #: task, before asyncflow watched, or untracked)
    parent: str | None = None
    #: where it was made: the line that called ``create_task`` (or ``ensure_future``, a task
    #: group's ``create_task``; asyncio's own frames left out, so a library that made it is
    #: named, not the program line that called the library), when asyncflow saw it made
    #: (whole-program mode); None: made before asyncflow watched, or untracked
    created_at: AwaitFrame | None = None
    #: the locks asyncflow does not track (made before an attach) that it holds in an open
    #: ``async with`` block while it waits, by the words a wait on one ends with
    #: (``Lock at 0x…``): read from the task's references, as ``asyncflow dump`` reads them
    holds: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class WaitSummary:
    """Waiting tasks of one future counted by the program's line and what they wait on."""

    future_id: int | None
    #: the future's label, or the coroutine's name for untracked tasks
    label: str
    #: the innermost frame of the program's own code (not asyncio's) in their chains
    where: AwaitFrame | None
    waits_on: WaitTarget | None
    tasks: int


@dataclass(frozen=True, slots=True)
class TasksDocument:
    """``GET /tasks``: every live task on every watched loop, and where they wait, counted."""

    schema: int
    #: live tasks in all (``tasks`` is one page of them)
    total: int
    #: True when every loop was read on its own thread; False when a blocked loop had to be
    #: read from outside, while it ran (its running task's chain may be changing)
    consistent: bool
    tasks: list[TaskEntry]
    #: waiting tasks grouped by future, line and what they wait on, most first (every task
    #: walked)
    waits: list[WaitSummary]
    #: tasks walked for ``tasks`` and ``waits``: all of them up to 10,000, then the first
    #: 10,000 in the list's order (None: every one, from an older profiler)
    walked: int | None = None


@dataclass(frozen=True, slots=True)
class GraphNode:
    """One node of the wait-for graph: a task, what it waits on, or who can release that."""

    #: ``task:NAME``, ``resource:ID``, ``channel:ID:get`` (its readers' wait) or
    #: ``channel:ID:put`` (its writers'); for a wait asyncflow does not track,
    #: ``KIND:DESCRIPTION`` (``sleep:...``, ``executor:...``)
    id: str
    #: ``task``, or what it is: a WaitTarget's kind (``lock``, ``semaphore``, ``condition``,
    #: ``event``, ``queue_get``...), ``channel`` or ``resource``
    kind: str
    #: a task's name, a resource's or channel's label (``app.py:12 #3``), or the description
    label: str
    #: a task's state (``waiting``, ``scheduled``, ``running``); None for other nodes
    state: str | None = None
    #: a task's coroutine (its tracked future's label when tracked)
    coroutine: str | None = None
    #: a task's line in the program's own code where it waits
    where: AwaitFrame | None = None
    #: a task that cannot go on: what it waits on can only be released by tasks that
    #: cannot go on either (a member of a cycle, or stuck behind one)
    stuck: bool = False
    #: a task's place in the task tree, as its ``/tasks`` entry says: the task that made it
    #: and the line it was made on (a snapshot lists 200 tasks; the graph has them all)
    parent: str | None = None
    created_at: AwaitFrame | None = None


@dataclass(frozen=True, slots=True)
class GraphEdge:
    """``source`` waits for ``target``: a task for what it waits on, and that for the tasks
    that can release it."""

    source: str
    target: str
    #: ``waits`` (a task waits on the target), ``awaits`` (a task waits for the target task to
    #: end), ``held_by`` (a lock or permit held by the target task), ``sent_by`` (a queue that
    #: the target task, a producer, can fill), ``received_by`` (a full queue the target task,
    #: a consumer, can drain)
    relation: str
    #: ``waits``: the program's line where the task waits; ``held_by``: the line of the
    #: ``async with`` block in which the holder took it, when it is one
    where: AwaitFrame | None = None
    #: ``held_by``: how long it has been held
    held_ns: int | None = None


@dataclass(frozen=True, slots=True)
class GraphCycle:
    """A deadlock: tasks each waiting on what the next holds (or is), around to the first."""

    #: the cycle's node ids in order (a task, what it waits on, the task that holds it...)
    nodes: list[str]
    #: its tasks' names, in the same order
    tasks: list[str]


@dataclass(frozen=True, slots=True)
class GraphDocument:
    """``GET /graph``: the wait-for graph of every waiting task, and the cycles in it."""

    schema: int
    #: as ``TasksDocument.consistent``: False when a blocked loop was read from outside
    consistent: bool
    #: the waiting tasks, what they wait on and the tasks that can release it
    nodes: list[GraphNode]
    edges: list[GraphEdge]
    #: deadlocks: cycles of tasks that wait on one another through locks, queues or awaits
    cycles: list[GraphCycle]
    #: nodes (and their edges) left out past the graph's bound; cycles are found first
    omitted: int = 0


@dataclass(frozen=True, slots=True)
class JobGroup:
    """An executor's jobs of one function, or submitted by the calls of one future."""

    #: the function's qualified name, or the future's label
    name: str
    #: the submitting future, for groups by future
    future_id: int | None
    jobs: int
    raised: int
    #: time the jobs waited for a worker, in all and the longest
    queued_ns: int
    max_queued_ns: int
    #: time the jobs ran, in all and the longest
    run_ns: int
    max_run_ns: int


@dataclass(frozen=True, slots=True)
class ExecutorEntry:
    """A thread or process pool that ``run_in_executor``/``to_thread`` submitted jobs to."""

    id: int
    label: str
    #: ``thread`` or ``process`` (process jobs are timed from submission to completion)
    kind: str
    #: ``alive``, or ``gone`` once the executor object was collected
    state: str
    #: the most workers it may start, and those it has started now
    max_workers: int | None
    workers: int
    submitted: int
    #: jobs waiting for a worker now, and jobs running now
    queued: int
    running: int
    completed: int
    raised: int
    #: jobs cancelled before a worker took them: they never ran
    cancelled: int
    queued_ns: dict[str, int]
    total_queued_ns: int
    max_queued_ns: int
    run_ns: dict[str, int]
    total_run_ns: int
    max_run_ns: int
    #: jobs by the function run, most run time first
    functions: list[JobGroup]
    #: jobs by the tracked future whose call submitted them, most jobs first
    futures: list[JobGroup]
    #: for an aggregate, how many gone executors of this label (and kind) it sums; 0 else
    folded_count: int = 0
    #: the most jobs running at once (``max_workers`` of them: every worker was busy)
    max_running: int = 0
    #: anyio's or trio's threads behind a capacity limiter: that limiter's resource id, when it
    #: is instrumented (its waits are this pool's queue); None otherwise
    limiter_id: int | None = None


@dataclass(frozen=True, slots=True)
class ExecutorsDocument:
    """``GET /executors``: every executor jobs were submitted to."""

    schema: int
    executors: list[ExecutorEntry]


@dataclass(frozen=True, slots=True)
class ThreadEntry:
    """One thread of the process, as the collector's last sample saw it."""

    #: the kernel's thread id (``threading.get_native_id()``)
    native_id: int
    #: Python's ``threading.get_ident()``; None for a thread Python did not start
    ident: int | None
    #: the ``threading.Thread`` name, or the kernel's (15 characters) for a foreign thread
    name: str
    #: whether Python runs code in it (a ``threading.Thread``, the main thread...)
    python: bool
    #: ``Thread.daemon``; None for a foreign thread
    daemon: bool | None
    #: whether it is asyncflow's own (the profiler's thread)
    asyncflow: bool
    #: ``running``, ``sleeping``, ``waiting`` (uninterruptible: disk, a blocking kernel call),
    #: ``stopped``, ``zombie`` (Linux); ``exited`` once gone; None where the platform says not
    state: str | None
    #: CPU time used since the thread started (user + system), to the nanosecond on Linux
    cpu_ns: int | None
    #: user and system CPU time, at the kernel's tick resolution (10 ms on most systems)
    user_ns: int | None
    system_ns: int | None
    #: CPU time over wall time in the last interval, a fraction of one CPU (1.0: one core busy)
    share: float | None
    #: the highest share over any interval since first seen
    max_share: float | None
    #: CPU time over wall time since first seen
    avg_share: float | None
    #: the length of the last interval
    interval_ns: int
    #: when the profiler first saw it, relative to the profiler's start
    first_seen_ns: int
    #: ids of the instrumented event loops it runs (``GET /loop``); empty for a thread beside
    #: the loops (an executor's worker, a library's thread)
    loop_ids: list[int] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ThreadsDocument:
    """``GET /threads``: every thread of the process, the busiest in the last interval first,
    then the last threads that exited."""

    schema: int
    #: ``proc`` (Linux: every OS thread, with state and CPU time) or ``threading`` (elsewhere:
    #: Python's threads, names and ids only)
    source: str
    #: when the sample was taken, relative to the profiler's start
    sampled_ns: int
    #: samples taken so far (one every ``sample_interval_ns`` on the collector's tick, and one
    #: before a document when the last is older than 0.1 s)
    samples: int
    sample_interval_ns: int
    #: live threads (the exited ones listed are not counted)
    total: int
    #: CPU time over wall time of every live thread together, in the last interval
    process_share: float | None
    threads: list[ThreadEntry]


@dataclass(frozen=True, slots=True)
class NeverAwaitedEntry:
    """Coroutines of one function that were created and never awaited."""

    function: str
    #: where the function is defined
    location: Location
    #: the line that created them, when origin tracking was on
    created_at: AwaitFrame | None
    count: int


@dataclass(frozen=True, slots=True)
class WarningSubject:
    """What a warning is about."""

    #: ``future``, ``channel``, ``stream``, ``resource``, ``executor`` or ``loop``
    kind: str
    #: its id in its own document, when it has one
    id: int | None
    label: str
    location: Location | None


@dataclass(frozen=True, slots=True)
class WarningEntry:
    """One diagnosis: the culprit, in one sentence, with the figures that prove it."""

    #: a stable slug: ``loop-blocked``, ``bottleneck``, ``lock-contention``...
    kind: str
    #: ``info``, ``warning`` or ``error``
    severity: str
    subject: WarningSubject
    #: one sentence naming the culprit and the figure that proves it
    message: str
    #: what to look at or do next
    hint: str
    #: the figures behind the sentence (durations in ns, shares in percent)
    evidence: dict[str, int]
    first_seen_ns: int
    last_seen_ns: int
    #: whether it still held at the last evaluation
    active: bool


@dataclass(frozen=True, slots=True)
class WarningsDocument:
    """``GET /warnings``: the diagnoses, those that hold now and most severe first."""

    schema: int
    #: when the warnings were last evaluated
    evaluated_ns: int
    warnings: list[WarningEntry]


@dataclass(frozen=True, slots=True)
class FunctionEntry:
    """One measured function or block (``@asyncflow.measure``, ``asyncflow.measure_block``).

    Times are wall time; an async function's runs from its call to its completion, awaits
    included. Recursion is counted once per outermost call.
    """

    id: int
    label: str
    #: ``function``, ``block``, or ``other`` (the labels past the table's size, counted together)
    kind: str
    #: ``module:qualname`` of the function, or of the code the block is in
    source: str
    location: Location
    is_async: bool
    call_count: int
    #: calls that raised (by exception type in ``errors``)
    error_count: int
    errors: dict[str, int]
    #: wall time of every call, summed
    total_ns: int
    #: total time minus that of measured calls nested in the same task (or thread)
    self_ns: int
    mean_ns: int
    max_ns: int
    #: percentiles of a call's total time
    duration_ns: dict[str, int]
    #: ``total_ns`` over the profile's wall time (above 1 when calls overlap)
    share: float
    #: calls entered and not left now (recursion: the outermost only): a call that never
    #: returns shows here, and in ``current_elapsed_ns``, while it runs
    running_count: int = 0
    #: how long the oldest of the ``running_count`` calls has been running
    current_elapsed_ns: int = 0


@dataclass(frozen=True, slots=True)
class FunctionsDocument:
    """``GET /functions``: every measured function and block, most total time first."""

    schema: int
    total: int
    offset: int
    limit: int
    #: the profile's wall time, which ``share`` divides by
    elapsed_ns: int
    functions: list[FunctionEntry]
    #: distinct labels counted under ``(other names)`` because the table was full
    labels_folded: int = 0


@dataclass(frozen=True, slots=True)
class ValueSample:
    """One value of a value log (``asyncflow.value(name, v)``) and when it was logged."""

    at_ns: int
    value: float | int | str


@dataclass(frozen=True, slots=True)
class MetricEntry:
    """One counter, gauge, histogram or value log the program updates."""

    id: int
    name: str
    #: ``counter``, ``gauge``, ``histogram`` or ``value``
    kind: str
    #: updates (counter, gauge), samples (histogram), values logged (value)
    count: int
    #: the counter's total, the gauge's value now, the last value logged (None for histograms)
    value: float | int | str | None
    #: the least and greatest value seen (gauge values, histogram samples, numbers logged;
    #: None for counters)
    min: float | int | None
    max: float | int | None
    #: the sum of a histogram's samples
    sum: float | int
    #: a histogram's percentiles, at integer resolution
    percentiles: dict[str, int]
    #: a value log's last values, oldest first
    recent: list[ValueSample]


@dataclass(frozen=True, slots=True)
class MetricsDocument:
    """``GET /user_metrics``: the program's own counters, gauges, histograms and value logs."""

    schema: int
    total: int
    offset: int
    limit: int
    metrics: list[MetricEntry]
    #: distinct names counted under ``(other metrics)`` because the table was full
    names_folded: int = 0


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything at once: what ``prof.snapshot()`` returns and the ``json`` report contains."""

    schema: int
    status: ProfilerStatus
    futures: FuturesDocument
    future_logs: list[FutureLogs] = field(default_factory=list)
    channels: ChannelsDocument | None = None
    channel_logs: list[ChannelLogs] = field(default_factory=list)
    flow: FlowDocument | None = None
    streams: StreamsDocument | None = None
    stream_logs: list[StreamLogs] = field(default_factory=list)
    loop: LoopDocument | None = None
    executors: ExecutorsDocument | None = None
    resources: ResourcesDocument | None = None
    resource_logs: list[ResourceLogs] = field(default_factory=list)
    tasks: TasksDocument | None = None
    #: the wait-for graph and its deadlocks (``GET /graph``)
    graph: GraphDocument | None = None
    #: every thread of the process (``GET /threads``)
    threads: ThreadsDocument | None = None
    #: the diagnoses, as ``GET /warnings`` lists them
    warnings: list[WarningEntry] = field(default_factory=list)
    #: measured functions and blocks (``GET /functions``)
    functions: FunctionsDocument | None = None
    #: the program's counters, gauges, histograms and value logs (``GET /user_metrics``)
    user_metrics: MetricsDocument | None = None


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """What went wrong with a request."""

    status: int
    message: str


@dataclass(frozen=True, slots=True)
class ErrorDocument:
    """Every error the endpoint answers: ``{"error": {"status": ..., "message": ...}}``."""

    error: ErrorInfo


def dumps(document: Any, *, pretty: bool = False) -> bytes:
    """Serialise a document (or a list/dict of them) to JSON bytes.

    Text that is not valid Unicode (a lone surrogate: a file name ``os.fsdecode`` could not
    decode, a task name or a label made from one) is written as its escape (see
    :func:`fit_text`), never refused: the program's text must not break a document.
    """
    option = (orjson.OPT_INDENT_2 if pretty else 0) | orjson.OPT_NON_STR_KEYS
    try:
        return orjson.dumps(document, option=option)
    except TypeError as exc:  # orjson.JSONEncodeError
        if "surrogates" not in str(exc):
            raise
    # The rare path: a copy with every string fit for UTF-8 (the common one costs nothing).
    return orjson.dumps(_fit(document), option=option)


def fit_text(text: str) -> str:
    """``text`` fit for UTF-8: each lone surrogate written as its escape (``"caf\\udce9"`` for
    ``os.fsdecode(b"caf\\xe9")``), as ``repr()`` writes it; any other text as it is. The one
    rule for every document and export (JSON, the Prometheus text, the trace, OTel)."""
    if text.isascii():  # constant time: nearly every label, name and file
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _fit(value: Any) -> Any:
    """``value`` as orjson would write it, with every string (keys too) through fit_text."""
    if isinstance(value, str):
        return fit_text(value)
    if isinstance(value, dict):
        return {fit_text(k) if isinstance(k, str) else k: _fit(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_fit(item) for item in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _fit(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return value


_D = TypeVar("_D")


class DocumentError(ValueError):
    """A JSON document does not have the shape of the schema's class; the message says where."""


def load(cls: type[_D], data: Any, *, ignore_unknown: bool = False) -> _D:
    """Rebuild a document (e.g. a :class:`Snapshot` read back from a file) from decoded JSON.

    Args:
        ignore_unknown: leave out fields the class does not have (a newer asyncflow's: a new
            field is compatible), as a client of the endpoint does; else they are an error.

    Raises:
        DocumentError: a field is missing, unknown or of the wrong type; the message gives its
            path, e.g. ``futures.futures[3].busy_ns``.
    """
    result: _D = _load(cls, data, cls.__name__, not ignore_unknown)
    return result


def _load(tp: Any, data: Any, where: str, strict: bool = True) -> Any:
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        errors = []
        for option in typing.get_args(tp):
            try:
                return _load(option, data, where, strict)
            except DocumentError as exc:
                # "expected null" says nothing about a value that is there: what failed inside
                # the other option (an unknown field three levels down, say) is the news
                if option is not type(None) or data is None:
                    errors.append(exc)
        raise errors[-1]
    if tp is type(None):
        if data is not None:
            raise DocumentError(f"{where}: expected null, got {type(data).__name__}")
        return None
    if tp in (int, str, bool, float):
        ok = isinstance(data, tp) and (tp is bool or not isinstance(data, bool))
        if tp is float and isinstance(data, int) and not isinstance(data, bool):
            return float(data)
        if not ok:
            raise DocumentError(f"{where}: expected {tp.__name__}, got {type(data).__name__}")
        return data
    if tp is Any:
        return data
    if origin is list:
        if not isinstance(data, list):
            raise DocumentError(f"{where}: expected a list, got {type(data).__name__}")
        (item,) = typing.get_args(tp)
        return [_load(item, x, f"{where}[{i}]", strict) for i, x in enumerate(data)]
    if origin is dict:
        if not isinstance(data, dict):
            raise DocumentError(f"{where}: expected an object, got {type(data).__name__}")
        _, value = typing.get_args(tp)
        return {str(k): _load(value, v, f"{where}.{k}", strict) for k, v in data.items()}
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if not isinstance(data, dict):
            raise DocumentError(f"{where}: expected an object, got {type(data).__name__}")
        hints = _hints(tp)
        fields = {f.name: f for f in dataclasses.fields(tp)}
        unknown = sorted(set(data) - set(fields))
        if unknown and strict:
            raise DocumentError(f"{where}: unknown field(s) {', '.join(unknown)}")
        values = {}
        for name, f in fields.items():
            if name in data:
                values[name] = _load(hints[name], data[name], f"{where}.{name}", strict)
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise DocumentError(f"{where}: missing field {name!r}")
        return tp(**values)
    raise DocumentError(f"{where}: cannot load {tp!r}")


_hint_cache: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    hints = _hint_cache.get(cls)
    if hints is None:
        hints = _hint_cache[cls] = typing.get_type_hints(cls)
    return hints


# Resources: synchronisation primitives (docs/architecture.md, "Words": resource). Appended by
# the resources work; the lead adds them to __all__, the Snapshot and the OpenAPI document when
# wiring the routes.


@dataclass(frozen=True, slots=True)
class ResourceHolder:
    """A hold open now: which call holds the resource, since when."""

    call_id: int | None
    future_id: int | None
    #: the future's label; ``(untracked)`` for code outside any tracked call
    label: str
    #: when the hold began (the acquisition returned)
    since_ns: int
    #: how long it has been held when this was read
    held_ns: int
    #: the holding call's state now: ``running``, ``suspended``... or, once it has ended
    #: without giving the hold back, ``ready`` or ``cancelled``; None when not tracked
    call_state: str | None
    #: how the holding call ended (``returned``, ``raised``, ``cancelled``...), if it has
    outcome: str | None


@dataclass(frozen=True, slots=True)
class ResourceFutureEntry:
    """What one future did with one resource: its waits, its holds, its signals."""

    future_id: int | None
    #: the future's label; ``(untracked)`` for code outside any tracked call
    label: str
    #: waits that ended (every one counted and timed)
    waits: int
    total_wait_ns: int
    max_wait_ns: int
    #: holds that ended; while ``hold_sampling_interval`` of the resource is above 1 each timed
    #: hold stands for the holds since the previous one, as channels' edges do
    holds: int
    total_hold_ns: int
    max_hold_ns: int
    #: sets of an event, notifies of a condition, aborts and resets of a barrier
    signals: int


@dataclass(frozen=True, slots=True)
class PermitsInfo:
    """A semaphore's or capacity limiter's permits."""

    #: permits when it was instrumented (a limiter's total tokens); None: unlimited
    initial: int | None
    #: a bounded semaphore's bound (anyio's ``max_value``); None when unbounded
    bound: int | None
    #: permits free now (None once the primitive is gone or unlimited)
    available: int | None
    #: permits held now: acquired and not released (``holders`` names them)
    held: int


@dataclass(frozen=True, slots=True)
class EventInfo:
    """An event's flag and signals."""

    is_set: bool | None
    sets: int
    clears: int
    #: waits that found the event set and returned at once (not in ``waits``)
    immediate_waits: int


@dataclass(frozen=True, slots=True)
class BarrierInfo:
    """A barrier's parties and what became of its waits."""

    parties: int | None
    #: tasks waiting at the barrier now
    waiting: int
    broken: bool | None
    #: waits that passed the barrier
    passes: int
    #: waits that ended in ``BrokenBarrierError`` (after an abort or a reset)
    broken_waits: int
    aborts: int
    resets: int


@dataclass(frozen=True, slots=True)
class ConditionInfo:
    """A condition's notifications (its lock's figures are the resource's own)."""

    #: ``notify()`` and ``notify_all()`` calls
    notifies: int


@dataclass(frozen=True, slots=True)
class ResourceEntry:
    """One instrumented synchronisation primitive (or the aggregate of gone ones)."""

    id: int
    label: str
    #: ``asyncio.Lock``, ``asyncio.BoundedSemaphore``, ``anyio.CapacityLimiter``, ``app.MyLock``
    kind: str
    #: ``lock``, ``semaphore``, ``condition``, ``event``, ``barrier`` or ``capacity_limiter``
    primitive: str
    #: where it was created (whole-program mode) or instrumented
    location: Location
    #: ``active``, or ``gone`` once the primitive was freed
    state: str
    #: gone resources whose figures are summed here; 0 for a single resource
    folded: int
    #: held (or, for a semaphore, out of permits) now; None for events and barriers
    locked: bool | None
    #: successful acquisitions (exact)
    acquisitions: int
    #: acquisitions that had to wait (exact)
    contended_acquisitions: int
    releases: int
    #: releases that ended no hold asyncflow saw: a semaphore released as a signal before
    #: its taker's acquisition returned, or a hold taken before asyncflow watched
    unmatched_releases: int
    #: waits that ended, whatever the outcome (exact, each timed): a contended acquisition, a
    #: wait for an event that was not set, a condition wait, a barrier wait
    waits: int
    #: waits that ended in an exception: cancelled, timed out, broken barrier
    failed_waits: int
    total_wait_ns: int
    max_wait_ns: int
    wait_ns: dict[str, int]
    #: tasks waiting now, and the most at once
    waiters_now: int
    max_waiters: int
    #: holds that ended (exact); timed holds each stand for the holds since the previous one
    holds: int
    total_hold_ns: int
    #: the longest timed hold
    max_hold_ns: int
    hold_ns: dict[str, int]
    #: holds whose duration was measured
    timed_holds: int
    #: one hold in this many is timed now (1: all of them)
    hold_sampling_interval: int
    #: the holds open now, oldest first: which calls hold it, since when
    holders: list[ResourceHolder]
    #: holds open beyond the ones named in ``holders``
    untracked_holds: int
    #: holds still open when the primitive was freed: never given back
    abandoned_holds: int
    permits: PermitsInfo | None
    event: EventInfo | None
    barrier: BarrierInfo | None
    condition: ConditionInfo | None
    #: which futures waited on it, held it, signalled it; most holds first
    futures: list[ResourceFutureEntry]
    #: its label, with ``#id`` when other resources have the same (locks made on one line:
    #: ``bank.py:9 #1``, ``bank.py:9 #2``), as the wait-for graph and its findings name it
    name: str = ""
    #: what wakes its waiters: a condition's ``notify()``/``notify_all()`` calls, an event's
    #: ``set()`` calls (0 for the other kinds)
    signals: int = 0
    #: a condition's or event's waits that returned, each a task woken (and run) by a signal;
    #: ``woken / signals`` is the wake-ups per signal: a ``notify_all()`` herd reads as many
    #: per notify, as tokio-console's self-wake lint reads wakes per poll (0 for other kinds)
    woken: int = 0
    #: the waits going on now (``waiters_now`` counts them), summed for as long as each has
    #: been so far, and the longest of them: a deadlock's at SIGTERM, an event never set
    #: (``waits``, ``total_wait_ns`` and ``max_wait_ns`` are of the waits that ended)
    open_wait_ns: int = 0
    longest_open_wait_ns: int = 0

    @property
    def waited_so_far_ns(self) -> int:
        """The time tasks waited for it: the waits that ended (``total_wait_ns``) and those
        going on now, for as long as they have been so far."""
        return self.total_wait_ns + self.open_wait_ns

    @property
    def longest_wait_so_far_ns(self) -> int:
        """The longest wait, one going on now for as long as it has been so far."""
        return max(self.max_wait_ns, self.longest_open_wait_ns)

    @property
    def held_so_far_ns(self) -> int:
        """The time it was held: the holds that ended (``total_hold_ns``) and those open now,
        for as long as they have been so far (a deadlock's lock, a permit never given back)."""
        return self.total_hold_ns + sum(h.held_ns for h in self.holders)

    @property
    def longest_hold_so_far_ns(self) -> int:
        """The longest hold, an open one for as long as it has been so far."""
        return max([self.max_hold_ns, *(h.held_ns for h in self.holders)])


@dataclass(frozen=True, slots=True)
class ResourcesDocument:
    """``GET /resources``: resources, most waited on first."""

    schema: int
    total: int
    offset: int
    limit: int
    resources: list[ResourceEntry]


@dataclass(frozen=True, slots=True)
class ResourceLogEntry:
    """One wait, hold or signal; ``duration_ns`` is None for signals."""

    index: int
    timestamp_ns: int
    duration_ns: int | None
    call_id: int | None
    future_id: int | None
    #: a wait's outcome (``acquired``, ``woken``, ``cancelled``, ``raised``, ``broken``);
    #: ``released`` for a hold; the signal (``set``, ``clear``, ``notify``, ``notify_all``,
    #: ``abort``, ``reset``)
    outcome: str


@dataclass(frozen=True, slots=True)
class ResourceLogs:
    """``GET /resources/{id}/logs``: recent waits, (timed) holds and signals, newest first."""

    schema: int
    resource_id: int
    label: str
    wait_logs: list[ResourceLogEntry]
    hold_logs: list[ResourceLogEntry]
    signal_logs: list[ResourceLogEntry]
