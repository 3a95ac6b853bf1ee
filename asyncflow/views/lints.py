"""Warnings: the documents turned into diagnoses naming the culprit and the figure that proves it.

Each lint is a pure function from the documents to findings. A :class:`WarningBook` runs them on
the profiler's thread (never on the hot path), keeps one warning per kind and subject, remembers
when each was first and last seen and whether it still holds, and stays bounded.

Lints speak about what a person can act on: a stage of a pipeline, a lock, a pool, a line. They
stay quiet on a healthy program: a consumer waiting on an empty queue is a service waiting for
work, not a problem, so starvation is only ``info``.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from asyncflow.config import WARN_THRESHOLDS, WARNING_KINDS
from asyncflow.filtering import matches
from asyncflow.model.waits import is_asyncflow_file, is_library_file
from asyncflow.schema import (
    ROUTE,
    SCHEMA,
    AwaitFrame,
    BlockedEpisode,
    BlockedLine,
    ChannelEntry,
    EdgeEntry,
    ExecutorEntry,
    FutureEntry,
    GraphDocument,
    GraphEdge,
    LineagePath,
    Location,
    LoopEntry,
    NeverAwaitedEntry,
    ResourceEntry,
    ResourceFutureEntry,
    Snapshot,
    StackFrame,
    WarningEntry,
    WarningsDocument,
    WarningSubject,
)
from asyncflow.views.lineage import dominant_hop

__all__ = [
    "LINTS",
    "MAX_WARNINGS",
    "Documents",
    "Finding",
    "Thresholds",
    "WarningBook",
    "documents_of",
    "evaluate",
]

#: Warnings kept at most; the oldest that no longer hold go first.
MAX_WARNINGS = 200
SEVERITIES = ("info", "warning", "error")


@dataclass(frozen=True, slots=True)
class Thresholds:
    """When a figure becomes a warning. Defaults suit a service; each is an option."""

    #: a poll that runs this long without yielding holds every other task back
    long_poll_ns: int = 100_000_000
    #: a line whose blocks of the loop (each of at least the monitor's ``block_min``) add up
    #: to this is named, even when none reached the block threshold
    block_total_ns: int = 200_000_000
    #: a future whose polls each hold the loop this long on average (every other task waits
    #: that long at each), that take this share of the busy time of such futures, and this
    #: share of the wall time
    cpu_poll_ns: int = 2_000_000
    cpu_share: float = 0.5
    cpu_wall_share: float = 0.2
    #: a bounded channel whose producers waited this share of the elapsed time
    blocked_share: float = 0.2
    #: ... is info, not the consumers' fault, when they waited for the loop (woken, their
    #: next poll not run yet: scheduled time) this share of their time or more
    loop_wait_share: float = 0.5
    #: consumers waiting this share of the elapsed time on an empty channel
    starved_share: float = 0.5
    #: a channel's producers (for a bottleneck) or consumers (for starvation) waited at least
    #: this long in all: a share of a few milliseconds of a short run is noise, not a finding
    min_wait_ns: int = 100_000_000
    #: a channel written this many times and never read
    unread_messages: int = 10
    #: a future whose finished calls ended cancelled in this share, at least this many
    cancel_share: float = 0.5
    cancel_min: int = 10
    #: an executor whose jobs waited for a thread longer than they ran, at least this many jobs
    executor_min_jobs: int = 5
    #: a future whose live calls rose to at least this many, at least doubling, while at most
    #: ``leak_finish_share`` of the calls created meanwhile finished
    leak_min_live: int = 50
    leak_finish_share: float = 0.1
    #: an unbounded channel holding at least this many messages, at its most yet, whose
    #: messages waited at least ``growth_min_delay`` in it and whose producers never waited
    growth_min_depth: int = 1000
    growth_min_delay_ns: int = 100_000_000
    #: a future polled at least this many times per call, each poll and each gap between two
    #: polls shorter than ``busy_wait_gap``, with no message or wait to account for them
    busy_wait_polls: int = 1000
    busy_wait_gap_ns: int = 1_000_000
    #: a future of at least ``tail_min_calls`` finished calls whose p99 call duration is at
    #: least ``tail_ratio`` times its p50, and at least ``tail_min``
    tail_ratio: int = 10
    tail_min_calls: int = 50
    tail_min_ns: int = 100_000_000
    #: ... and that, once it took part in at least ``tail_min_gathers`` gathers, ended last in
    #: most of them (fewer: its tail is judged alone, as for calls awaited alone)
    tail_min_gathers: int = 10
    #: ... and whose tail's excess over its median is more than this many times the loop's
    #: p99 lag, plus the time the loop's thread waited for a core in its blocks (a late loop
    #: wakes each call late at every await: the loop's lag, not a tail; 0: neither counts)
    tail_lag_factor: int = 4
    #: a path (source, channel, stage... sink) of at least two channels and
    #: ``path_min_messages`` sampled messages whose p99 end-to-end latency is at least
    #: ``path_ratio`` times its p50 and at least ``path_min``
    path_ratio: int = 4
    path_min_messages: int = 20
    path_min_ns: int = 50_000_000
    #: a condition notified at least ``storm_min_signals`` times whose notifies woke at least
    #: ``storm_ratio`` waiters each on average
    storm_ratio: int = 10
    storm_min_signals: int = 100
    #: a lock, semaphore or limiter at least this many acquisitions of which had to wait, whose
    #: waiters waited more than twice as long as it was held
    contention_min_waits: int = 10
    #: finding kinds silenced (``warn="no-lock-contention"``)
    silenced: frozenset[str] = frozenset()
    #: modules whose findings are silenced (``warn="ignore:httpcore.*"``): patterns matched as
    #: ``--exclude`` matches them, against the module (and function) of a finding's subject
    ignored: tuple[str, ...] = ()

    @classmethod
    def from_options(cls, pairs: Iterable[tuple[str, float | str]]) -> Thresholds:
        """The defaults, with what the ``warn`` option sets (seconds become nanoseconds), the
        kinds it silences (``("no", kind)``) and the modules it ignores
        (``("ignore", pattern)``)."""
        values: dict[str, Any] = {}
        silenced: set[str] = set()
        ignored: list[str] = []
        for name, value in pairs:
            if name == "no":
                silenced.add(str(value))
                continue
            if name == "ignore":
                ignored.append(str(value))
                continue
            assert isinstance(value, float | int)
            if WARN_THRESHOLDS.get(name) == "seconds":  # (the option's own table says which)
                values[f"{name}_ns"] = round(value * 1e9)
            elif isinstance(getattr(cls, name, None), int):
                values[name] = int(value)
            else:
                values[name] = float(value)
        return cls(**values, silenced=frozenset(silenced), ignored=tuple(ignored))


@dataclass(frozen=True, slots=True)
class Documents:
    """What the lints read: the documents as of one evaluation."""

    now_ns: int
    #: the profile's wall time so far
    elapsed_ns: int
    futures: Sequence[FutureEntry] = ()
    channels: Sequence[ChannelEntry] = ()
    loops: Sequence[LoopEntry] = ()
    executors: Sequence[ExecutorEntry] = ()
    resources: Sequence[ResourceEntry] = ()
    never_awaited: Sequence[NeverAwaitedEntry] = ()
    block_threshold_ns: int = 100_000_000
    #: the program serves requests: a server started a web framework's application, whose
    #: requests are calls of their routes' futures (``ProfilerStatus.serving``)
    serves: bool = False
    #: future id -> (created_ns, finished_ns, outcome) of its recent finished calls, in
    #: nanoseconds since the profile's start, oldest first
    recent_ends: Mapping[int, Sequence[tuple[int, int, str]]] = field(default_factory=dict)
    #: the wait-for graph (``/graph``), when the tasks were read
    graph: GraphDocument | None = None
    #: future id -> (type, message) of the exception its latest call that raised raised, of
    #: the futures whose recent calls' log holds one
    errors: Mapping[int, tuple[str, str]] = field(default_factory=dict)
    #: the tasks that raised and whose exception nobody has retrieved yet, as (future id,
    #: exception type, message, when it raised in nanoseconds since the profile's start),
    #: oldest first; read live only (a snapshot on file does not hold the tasks)
    unretrieved: Sequence[tuple[int, str, str, int]] = ()
    #: message lineage: the paths the sampled messages went (``/flow``'s ``lineage``)
    paths: Sequence[LineagePath] = ()


def documents_of(snapshot: Snapshot, now_ns: int = 0) -> Documents:
    """What the lints read, from a snapshot (live, or loaded from a file)."""
    loop = snapshot.loop
    return Documents(
        now_ns=now_ns,
        elapsed_ns=snapshot.status.uptime_ns,
        futures=snapshot.futures.futures,
        channels=snapshot.channels.channels if snapshot.channels is not None else (),
        loops=loop.loops if loop is not None else (),
        executors=snapshot.executors.executors if snapshot.executors is not None else (),
        resources=snapshot.resources.resources if snapshot.resources is not None else (),
        never_awaited=snapshot.futures.never_awaited,
        block_threshold_ns=loop.block_threshold_ns if loop is not None else 100_000_000,
        serves=bool(snapshot.status.serving),
        recent_ends={
            logs.future_id: [
                (c.created_ns, c.finished_ns, c.outcome or "returned")
                for c in logs.calls
                if c.finished_ns is not None
            ]
            for logs in snapshot.future_logs
        },
        graph=snapshot.graph,
        paths=snapshot.flow.lineage if snapshot.flow is not None else (),
        errors={
            logs.future_id: (c.exception.type, c.exception.message)
            for logs in snapshot.future_logs
            for c in logs.calls
            if c.exception is not None
        },
    )


@dataclass(frozen=True, slots=True)
class Finding:
    """One diagnosis from one evaluation."""

    kind: str
    severity: str
    subject: WarningSubject
    message: str
    hint: str
    evidence: dict[str, int] = field(default_factory=dict)


Lint = Callable[[Documents, Thresholds], Iterable[Finding]]


# -- words -------------------------------------------------------------------------------------


_UNITS = ((1_000_000_000, "s"), (1_000_000, "ms"), (1_000, "µs"))


def _duration(ns: int) -> str:
    """Three significant figures in the largest unit that fits; never an exponent (999.95 ms
    rounds to 1 s, not "1e+03 ms")."""
    for i, (scale, unit) in enumerate(_UNITS):
        if ns >= scale:
            shown = float(f"{ns / scale:.3g}")
            if shown >= 1000 and i > 0:
                scale, unit = _UNITS[i - 1]
                shown = float(f"{ns / scale:.3g}")
            return f"{shown:.0f} {unit}" if shown >= 100 else f"{shown:g} {unit}"
    return f"{ns} ns"


def _where(location: Location | None) -> str:
    """`` (app.py:12)``; a library's file with its package's folder, `` (starlette/routing.py:
    280)``: several packages have a ``routing.py``."""
    if location is None or not location.file or location.file == "?":
        return ""
    name = os.path.basename(location.file)
    if is_library_file(location.file) and not location.file.startswith("<"):
        name = f"{os.path.basename(os.path.dirname(location.file))}/{name}"
    return f" ({name}:{location.line})"


def _names(edges: Iterable[EdgeEntry], limit: int = 3) -> str:
    return _named(edges, limit)[0]


def _named(edges: Iterable[EdgeEntry], limit: int = 3) -> tuple[str, int]:
    """The futures of ``edges`` that moved messages, busiest first, and how many they are."""
    labels = [e.label for e in sorted(edges, key=lambda e: -e.messages) if e.messages]
    if not labels or labels == ["(untracked)"]:
        return "untracked code", 1
    shown = ", ".join(f"`{label}`" for label in labels[:limit])
    return (shown if len(labels) <= limit else f"{shown} and {len(labels) - limit} more"), len(
        labels
    )


def _calls_at_once(
    edges: Iterable[EdgeEntry], futures: dict[int, FutureEntry], in_use_ns: int
) -> int:
    """How many calls stand on one side of a channel at once: for each future that moved
    messages, its calls' lifetimes (busy and idle time, summed) over the time the channel was
    in use, rounded up, at most its call count; one for untracked code. Eight workers that
    live through the crawl are eight consumers, each of which may wait the whole time; a
    thousand short handlers, a few at a time, are a few."""
    total = 0
    for e in edges:
        if not e.messages:
            continue
        f = futures.get(e.future_id) if e.future_id is not None else None
        if f is None or in_use_ns <= 0:
            total += 1
            continue
        total += max(1, min(f.call_count, -(-(f.busy_ns + f.idle_ns) // in_use_ns)))
    return max(1, total)


def _self_fed(c: ChannelEntry) -> bool:
    """Whether the channel's consumers sent most of its messages themselves: a work queue that
    its workers feed (a crawler's frontier), where no other stage sets the pace or waits."""
    readers = {e.future_id for e in c.receivers if e.messages and e.future_id is not None}
    sent = sum(e.messages for e in c.senders)
    own = sum(e.messages for e in c.senders if e.future_id in readers)
    return bool(readers) and sent > 0 and 2 * own >= sent


def _who(count: int, names: str, role: str) -> str:
    """``its producer `parse```, ``its 4 producers `parse```."""
    return f"its {role} {names}" if count == 1 else f"its {count} {role}s {names}"


def _future_subject(f: FutureEntry) -> WarningSubject:
    return WarningSubject("future", f.id, f.label, f.location)


def _channel_subject(c: ChannelEntry) -> WarningSubject:
    return WarningSubject("channel", c.id, c.label, None)


def _percent(part: int, whole: int) -> int:
    return round(100 * part / whole) if whole > 0 else 0


# -- the lints -----------------------------------------------------------------------------------


def _episode_line(episode: BlockedEpisode) -> str:
    """The program's own line in a blocked loop's stack (innermost first), and what it called."""
    stack = episode.stack
    if not stack:
        return ""
    called = stack[0].function
    mine = next((f for f in stack if not is_library_file(f.file)), None)
    if mine is None:
        return f" in {called}"
    where = f"{os.path.basename(mine.file)}:{mine.line}"
    return f" at {where}" if mine is stack[0] else f" at {where} (in {called})"


def _own_frame(episode: BlockedEpisode) -> StackFrame | None:
    """The frame a blocking line is named after: the program's own, else the innermost."""
    stack = episode.stack
    return next((f for f in stack if not is_library_file(f.file)), stack[0] if stack else None)


class _Cause:
    """One blocking line of a loop, and what the lints know of it: its blocks (of at least
    ``block_min``), the episode that holds now at it, the futures whose figures it explains."""

    __slots__ = ("line", "loop", "ongoing")

    def __init__(self, loop: LoopEntry, line: BlockedLine | None, ongoing: BlockedEpisode | None):
        self.loop = loop
        self.line = line
        self.ongoing = ongoing

    @property
    def future_id(self) -> int | None:
        if self.ongoing is not None and self.ongoing.call is not None:
            return self.ongoing.call.future_id
        return self.line.future_id if self.line is not None else None

    @property
    def total_ns(self) -> int:
        return self.line.total_ns if self.line is not None else 0


def _causes(docs: Documents, th: Thresholds) -> list[_Cause]:
    """The blocking lines that cost enough to name, the most time lost first: a line that
    blocked the loop for the block threshold once, or ``block_total`` in all, or blocks it now.
    (Loops read from an older recording, without lines, are judged by their episodes.)"""
    causes: list[_Cause] = []
    for loop in docs.loops:
        ongoing = next((e for e in loop.episodes if e.ongoing), None)
        where = _own_frame(ongoing) if ongoing is not None else None
        for line in loop.blocking_lines:
            now = None
            if where is not None and (where.file, where.line) == (line.file, line.line):
                now, ongoing = ongoing, None
            if now or line.max_ns >= docs.block_threshold_ns or line.total_ns >= th.block_total_ns:
                causes.append(_Cause(loop, line, now))
        if ongoing is not None and loop.blocking_lines:
            causes.append(_Cause(loop, None, ongoing))
    causes.sort(key=lambda c: (c.ongoing is None, -c.total_ns))
    return causes


def _explained(docs: Documents, th: Thresholds) -> set[int]:
    """Futures whose long polls and busy time a blocking line's finding already names."""
    return {c.future_id for c in _causes(docs, th) if c.future_id is not None}


def _cpu_words(kind: str | None, cpu_ns: int | None, wall_ns: int) -> str:
    if kind == "import":
        return ", importing a module (its code loaded, compiled and run) on the loop"
    if kind is None or cpu_ns is None or wall_ns <= 0:
        return ""
    percent = _percent(cpu_ns, wall_ns)
    if kind == "cpu":
        return f", computing ({percent}% of it on the CPU): CPU work on the loop"
    return (
        f", using little CPU ({percent}% of it): a blocking call (a sleep, blocking I/O, a "
        "lock) on the loop"
    )


#: (a module imported on first use, inside a request: the same in either library's words)
_IMPORT_HINT = (
    "import it at start-up (at the top of the module, or in the app's lifespan) so that no "
    "request pays for it; an import inside a function runs once per process"
)
_HINTS = {
    "import": _IMPORT_HINT,
    "cpu": "run the CPU work in an executor (await asyncio.to_thread(...), or a process pool "
    "for pure Python) or yield (await asyncio.sleep(0)) more often",
    "blocking": "await asyncio.to_thread(...) for the call, or use an async API (asyncio.sleep, "
    "an async client or driver)",
}
_HINT = (
    "move the blocking call off the loop (asyncio.to_thread) or make it await; the episode's "
    "stack is in /loop"
)
#: ... in trio's words, for a trio run's loop (anyio on trio has the same in anyio.to_thread)
_TRIO_HINTS = {
    "import": _IMPORT_HINT,
    "cpu": "run the CPU work in a thread (await trio.to_thread.run_sync(...), or a process "
    "pool for pure Python) or yield (await trio.lowlevel.checkpoint()) more often",
    "blocking": "await trio.to_thread.run_sync(...) for the call, or use an async API "
    "(trio.sleep, an async client or driver)",
}
_TRIO_HINT = (
    "move the blocking call off the loop (trio.to_thread.run_sync) or make it await; the "
    "episode's stack is in /loop"
)


def _on_trio(docs: Documents) -> bool:
    """Whether every loop seen is a trio run's: advice is then in trio's words."""
    return bool(docs.loops) and all(loop.label.startswith("trio.") for loop in docs.loops)


def _to_thread(docs: Documents) -> str:
    """How the program runs a call in a thread, in its loop's library's words."""
    return "trio.to_thread.run_sync" if _on_trio(docs) else "asyncio.to_thread"


def _hint(loop: LoopEntry, kind: str | None) -> str:
    """What to do about a block, in the words of the loop's library."""
    if loop.label.startswith("trio."):
        return _TRIO_HINTS.get(kind or "", _TRIO_HINT)
    return _HINTS.get(kind or "", _HINT)


def _line_finding(cause: _Cause, futures: dict[int, FutureEntry], top: int | None) -> Finding:
    """One blocking line's finding: what blocks now, how often and how long in all, whether the
    thread computed, and its future's long poll and busy time (the same cause)."""
    loop, line, now = cause.loop, cause.line, cause.ongoing
    frame = _own_frame(now) if now is not None else None
    if line is not None:
        file, number, function, code, label = (
            line.file, line.line, line.function, line.code, line.label
        )  # fmt: skip
    else:
        file, number = (frame.file, frame.line) if frame is not None else ("?", 0)
        function, code = (frame.function, frame.code) if frame is not None else ("?", None)
        label = None
    route = now.route if now is not None else line.route if line is not None else None
    if now is not None and now.call is not None:
        label = now.call.label
    where = f"{os.path.basename(file)}:{number}"
    who = f"`{label}`" if label else f"Untracked code in {function}"
    if route and route != label:  # the request it served: `checksum` in `GET /orders/{id}`
        who += f" in `{route}`"
    shown = (code or "").split("  #")[0].strip()  # the statement, without its comment
    at = f"at {where}" + (f" (`{shown}`)" if shown else "")
    evidence: dict[str, int] = {"loop_id": loop.id}
    kind, cpu_ns, wall = None, None, 0
    if now is not None:
        message = (
            f"The event loop is blocked now, for {_duration(now.blocked_ns)} so far, by "
            f"{who[0].lower() + who[1:] if not label else who} {at}"
        )
        evidence["ongoing_ns"] = now.blocked_ns
        if line is not None:
            message += "; before, it blocked it {}, {}".format(*_blocks(line))
    else:
        assert line is not None
        times, amount = _blocks(line)
        message = f"{who} blocked the event loop {times} {at}, {amount}"
    if line is not None:
        kind, cpu_ns, wall = line.kind, line.cpu_ns, line.cpu_wall_ns
        evidence |= {"blocks": line.count, "total_ns": line.total_ns, "longest_ns": line.max_ns}
    f = futures.get(cause.future_id) if cause.future_id is not None else None
    if f is not None and kind is None and f.cpu is not None and f.cpu.busy_ns:
        # measured per poll instead (cpu=True): what the long-poll or off-cpu-poll lint read
        kind = "cpu" if f.cpu.cpu_ns * 2 > f.cpu.busy_ns else "blocking"
        cpu_ns, wall = f.cpu.cpu_ns, f.cpu.busy_ns
    if cpu_ns is not None and wall:
        evidence |= {"cpu_ns": cpu_ns, "cpu_wall_ns": wall}
    message += _cpu_words(kind, cpu_ns, wall)
    if f is not None:
        evidence["max_poll_ns"] = f.max_poll_duration_ns
        if f.id == top:  # what cpu-bound would say, of the same cause
            evidence["busy_ns"] = f.busy_ns
            if line is not None and 2 * f.busy_ns > 3 * line.total_ns:
                # the monitor sees a block only if it looks while it lasts: its count is a
                # lower bound, where the busy time counts every poll
                message += (
                    f"; those are the blocks the loop's monitor saw: all of `{f.label}`'s "
                    f"polls, every one counted, held the loop {_duration(f.busy_ns)}"
                )
            elif line is None or 10 * f.busy_ns > 11 * line.total_ns:  # (more than said)
                message += f"; `{f.label}` held the loop {_duration(f.busy_ns)} in all"
    if kind is None and now is None:
        message += ": every other task waited meanwhile"
    total_ns = line.total_ns if line is not None else 0
    longest_ns = max(line.max_ns if line is not None else 0, now.blocked_ns if now else 0)
    lost = now is not None or longest_ns >= 1_000_000_000 or total_ns >= 1_000_000_000
    return Finding(
        "loop-blocked",
        "error" if lost else "warning",
        WarningSubject("line", None, where, Location(file, number)),
        message,
        _hint(loop, kind),
        evidence,
    )


def _blocks(line: BlockedLine) -> tuple[str, str]:
    """``once``, ``for 602 ms``; ``149 times``, ``6.71 s in all (the longest 45 ms)``."""
    if line.count == 1:
        return "once", f"for {_duration(line.max_ns)}"
    return (
        f"{line.count} times",
        f"{_duration(line.total_ns)} in all (the longest {_duration(line.max_ns)})",
    )


def _loop_episodes(loop: LoopEntry) -> Finding | None:
    """A loop's episodes, for a loop read without blocking lines (an older recording)."""
    kept = [*loop.episodes, *loop.worst_episodes]  # the newest, and the longest ever
    if not loop.blocked_count or not kept:
        return None
    worst = max(kept, key=lambda e: e.blocked_ns)
    culprit = f"`{worst.call.label}`" if worst.call is not None else "untracked code"
    severity = "error" if worst.ongoing or worst.blocked_ns >= 1_000_000_000 else "warning"
    times = "once" if loop.blocked_count == 1 else f"{loop.blocked_count} times"
    message = (
        f"The event loop was blocked {times}, the longest for {_duration(worst.blocked_ns)},"
        f" by {culprit}{_episode_line(worst)}: every other task waited meanwhile"
    )
    if worst.ongoing:
        message = (
            f"The event loop is blocked now, for {_duration(worst.blocked_ns)} so far, by "
            f"{culprit}{_episode_line(worst)}"
        )
    return Finding(
        "loop-blocked",
        severity,
        WarningSubject("loop", loop.id, loop.label, None),
        message,
        _hint(loop, worst.kind),
        {
            "episodes": loop.blocked_count,
            "longest_ns": worst.blocked_ns,
            "max_lag_ns": loop.max_lag_ns,
        },
    )


def blocked_loop(docs: Documents, th: Thresholds) -> Iterator[Finding]:
    """A line blocked the loop: which, how often, how long in all, and whether its thread
    computed or waited meanwhile. One finding per line, the most time lost first, carrying
    what the long-poll and cpu-bound lints would have said of its future (one cause, one
    finding)."""
    futures = _by_id(docs)
    top = _cpu_top(docs, th)
    first, note = _no_request_before(docs)
    for cause in _causes(docs, th):
        finding = _line_finding(cause, futures, top.id if top is not None else None)
        line = cause.line
        if (
            first is not None
            and cause.ongoing is None
            and line is not None
            and line.count == 1
            and line.last_ns <= first
        ):
            finding = dataclasses.replace(finding, severity="info", message=finding.message + note)
        elif (
            cause.ongoing is None and line is not None and line.count == 1 and line.kind == "import"
        ):
            finding = dataclasses.replace(  # (once a process: the first call that needed it)
                finding,
                severity="info",
                message=finding.message
                + ": a module imported on first use, which only the first call that needed it "
                "waited for",
            )
        yield finding
    for loop in docs.loops:
        if not loop.blocking_lines:
            episodes = _loop_episodes(loop)
            if episodes is not None:
                yield episodes


#: what a block said before a web service's first request began says of it
AT_START_UP = "; at start-up, before the first request began: no request waited"
#: what a block said of a web service that no request came to (yet) says of it
NO_REQUEST_YET = "; the service had no request yet: no request waited"
#: the kinds of finding about the loop's time that a start-up's block makes
_START_UP_KINDS = frozenset({"loop-blocked", "long-poll"})


def _first_request_ns(docs: Documents) -> int | None:
    """When the service's first routed request began, from the profiler's start; None when
    it routed none (not a web service, or none yet). A block that ended before then (a TLS
    store loaded in the lifespan, an app imported in a worker's loop) held no request up."""
    agos = [
        f.first_call_ago_ns
        for f in docs.futures
        if f.tracked_by == ROUTE and f.first_call_ago_ns is not None
    ]
    return max(0, docs.elapsed_ns - max(agos)) if agos else None


def _no_request_before(docs: Documents) -> tuple[int | None, str]:
    """Until when (from the profiler's start) a web service had no request, and what a
    one-off block then says of it: its first routed request's start; now, for a service that
    no request came to (a worker the others' requests went to, a service started and stopped
    unused); None for a program that serves none (no web framework's application started)."""
    first = _first_request_ns(docs)
    if first is not None:
        return first, AT_START_UP
    return (docs.elapsed_ns, NO_REQUEST_YET) if docs.serves else (None, AT_START_UP)


def _frame_of(f: FutureEntry, frame: StackFrame) -> bool:
    """Whether a stack frame runs the code of future ``f`` (its file, its function)."""
    function = f.source.rpartition(":")[2].rpartition(".")[2]
    return (
        frame.function == function
        and bool(f.location.file)
        and os.path.basename(frame.file) == os.path.basename(f.location.file)
    )


def _callers_of_long_polls(docs: Documents, long: Sequence[FutureEntry]) -> dict[int, int]:
    """Futures whose long poll only contained a callee's: a caller that awaits a callee in the
    same task polls it inside its own poll, so the callee's blocking makes the caller's poll
    just as long. A blocked loop's stack shows who called whom: the innermost tracked call is
    the culprit, and a long-polling future whose frame encloses it is left out unless its
    longest poll exceeds the callee's by the threshold itself. Returns each such caller's id
    with its callees' longest poll. Where no stack was read (the monitor saw no block of it),
    the futures a long-polling future was first called in (``first_caller_id``, a few calls
    out: the route's request task around the handler ``get_db``) are such callers too."""
    by_id = {f.id: f for f in long}
    callers: dict[int, int] = {}
    first = {f.id: f.first_caller_id for f in docs.futures}
    for made in long:
        caller = first.get(made.id)
        for _ in range(_CALL_DEPTH):
            around = by_id.get(caller) if caller is not None else None
            if around is not None and around.id != made.id:
                callers[around.id] = max(callers.get(around.id, 0), made.max_poll_duration_ns)
            caller = first.get(caller) if caller is not None else None
    for loop in docs.loops:
        for episode in [*loop.episodes, *loop.worst_episodes]:
            inner = by_id.get(episode.call.future_id) if episode.call is not None else None
            if inner is None:
                continue
            frames = episode.stack  # innermost first
            at = next((i for i, fr in enumerate(frames) if _frame_of(inner, fr)), None)
            if at is None:
                continue
            for outer in long:
                if outer.id != inner.id and any(_frame_of(outer, fr) for fr in frames[at + 1 :]):
                    callee = max(callers.get(outer.id, 0), inner.max_poll_duration_ns)
                    callers[outer.id] = callee
    return callers


def _long_polls(docs: Documents, th: Thresholds) -> list[FutureEntry]:
    """Futures with a poll over ``long_poll`` that is their own (not only a callee's) and that
    no blocking line's finding names already."""
    explained = _explained(docs, th)
    long = [f for f in docs.futures if f.max_poll_duration_ns >= th.long_poll_ns]
    callers = _callers_of_long_polls(docs, long)
    return [
        f
        for f in long
        if f.id not in explained
        and not (f.id in callers and f.max_poll_duration_ns - callers[f.id] < th.long_poll_ns)
    ]


def _seen_blocking(f: FutureEntry, docs: Documents) -> int:
    """The longest block the loop monitor saw of ``f`` (a call it made, a call made in it, or
    its route); 0: none. A long poll it did not see, while its own looks came late, is the
    process stalled, not the poll's code (the monitor looks at least every heartbeat, and a
    poll over the block threshold always makes a late heartbeat); so is one it saw block for
    less than half its length: the monitor did not run for the rest of it either."""
    near = {f.id} | _callees(docs, {f.id}) | {i for i in _callers(docs, {f.id}) if i is not None}
    seen = 0
    for loop in docs.loops:
        for line in loop.blocking_lines:
            if line.future_id in near or line.route == f.label:
                seen = max(seen, line.max_ns)
        for e in (*loop.episodes, *loop.worst_episodes):
            if e.call is not None and (e.call.future_id in near or e.route == f.label):
                seen = max(seen, e.blocked_ns)
    return seen


def _off_cpu(f: FutureEntry, th: Thresholds) -> bool:
    """Its longest poll off the CPU (measured with ``cpu=True``) held the loop ``long_poll``
    and was mostly not computing."""
    c = f.cpu
    return (
        c is not None
        and c.worst_poll_busy_ns >= th.long_poll_ns
        and c.worst_poll_cpu_ns * 2 <= c.worst_poll_busy_ns
    )


def long_poll(docs: Documents, th: Thresholds) -> Iterator[Finding]:
    """A poll ran longer than the threshold without yielding to the loop: the innermost
    future's, not its callers' too. One finding per future: when it also holds most of the
    loop's busy time (cpu-bound), that is said here; when its poll was off the CPU, in
    off-cpu-poll's finding instead."""
    top = _cpu_top(docs, th)
    stalled = any(loop.late_wakeups for loop in docs.loops)
    for f in _long_polls(docs, th):
        if _off_cpu(f, th):
            continue
        longest = f.max_poll_duration_ns
        message = (
            f"A poll of `{f.label}`{_where(f.location)} ran {_duration(longest)} without "
            f"yielding to the event loop"
        )
        evidence = {"max_poll_ns": longest, "threshold_ns": th.long_poll_ns, "polls": f.total_polls}
        # (a poll over the block threshold always makes the heartbeat late: seen as a block)
        seeable = longest >= docs.block_threshold_ns
        seen = _seen_blocking(f, docs) if seeable and docs.loops else longest
        if (stalled or seen) and 2 * seen < longest:
            saw = (
                f", but the loop monitor saw it block the loop for {_duration(seen)} of it at "
                "most, its own looks late for the rest: the whole process did not run then"
                if seen
                else ", but the loop monitor saw no block of it, and its own look at the "
                "loop came late too (a late wake-up): the whole process did not run then"
            )
            yield Finding(
                "long-poll",
                "info",
                _future_subject(f),
                message + saw,
                "nothing to do in the code if it stays rare; a machine short of CPU (or a "
                "paused process) stretches a short poll",
                evidence,
            )
            continue
        if top is not None and top.id == f.id:
            total = sum(g.busy_ns for g in docs.futures)
            message += (
                f"; it holds the loop {_percent(f.busy_ns, total)}% of all busy time "
                f"({_duration(f.busy_ns)} over {f.call_count} calls)"
            )
            evidence["busy_ns"] = f.busy_ns
        yield Finding(
            "long-poll",
            "warning",
            _future_subject(f),
            message,
            "look for blocking or CPU-heavy code between two awaits in it",
            evidence,
        )


def off_cpu_poll(docs: Documents, th: Thresholds) -> Iterator[Finding]:
    """A long poll used little CPU (with ``cpu=True``): it held the loop without computing.
    (Its long poll is this finding's, not long-poll's too.)"""
    for f in _long_polls(docs, th):
        c = f.cpu
        if c is None or not _off_cpu(f, th):
            continue
        yield Finding(
            "off-cpu-poll",
            "warning",
            _future_subject(f),
            f"A poll of `{f.label}`{_where(f.location)} held the loop "
            f"{_duration(c.worst_poll_busy_ns)} but used {_duration(c.worst_poll_cpu_ns)} of "
            f"CPU: it was blocked in a system call, waiting for the GIL, or not scheduled",
            f"look for blocking I/O or time.sleep in it (run it with {_to_thread(docs)}), a "
            "thread holding the GIL (GET /threads), or an overloaded machine",
            {
                "busy_ns": c.worst_poll_busy_ns,
                "cpu_ns": c.worst_poll_cpu_ns,
                "call_id": c.worst_poll_call_id or 0,
                "off_cpu_ns": c.off_cpu_ns,
                "max_poll_ns": f.max_poll_duration_ns,
            },
        )


def _holds_the_loop(f: FutureEntry, th: Thresholds) -> bool:
    """Whether ``f``'s polls each hold the loop ``cpu_poll`` or more on average. A future
    taking short turns (an HTTP client's polls, 75 us each) is where the loop's CPU went, not
    a loop held: every other task runs between its polls."""
    return f.total_polls > 0 and f.busy_ns >= th.cpu_poll_ns * f.total_polls


def _contains(outer: FutureEntry, inner: FutureEntry) -> bool:
    """Whether ``outer``'s polls only contain ``inner``'s: ``inner`` has at least four fifths
    of its busy time (and no more), in polls at least four fifths as long, on average or at the
    95th percentile (a call that blocks once and then awaits has one long poll and one short
    one: its average is half its caller's, its long polls are its caller's)."""
    if inner.id == outer.id or not 4 * outer.busy_ns <= 5 * inner.busy_ns <= 5 * outer.busy_ns:
        return False
    if 5 * inner.busy_ns * outer.total_polls >= 4 * outer.busy_ns * inner.total_polls:
        return True
    inner_p95 = inner.poll_duration_ns.get("p95", 0)
    return inner_p95 > 0 and 5 * inner_p95 >= 4 * outer.poll_duration_ns.get("p95", 0)


def _innermost(held: list[FutureEntry]) -> list[FutureEntry]:
    """``held`` without the futures whose polls only contain another's (``_contains``): a
    route's request task polls the handler that hashes a password inside its own polls, so its
    busy time and its polls are (nearly) the handler's."""
    return [f for f in held if not any(_contains(f, g) for g in held)]


def _cpu_top(docs: Documents, th: Thresholds) -> FutureEntry | None:
    """Of the futures whose polls hold the loop, the one that holds it most: at least
    ``cpu_share`` of their busy time, and ``cpu_wall_share`` of the wall time; None when none
    does. (Not the future with the most busy time: a client taking short turns can have more
    than a handler that hashes a password for 15 ms at each poll.)"""
    held = _innermost([f for f in docs.futures if _holds_the_loop(f, th)])
    total = sum(f.busy_ns for f in held)
    if total <= 0 or docs.elapsed_ns <= 0 or len(docs.futures) < 2:
        return None
    top = max(held, key=lambda f: f.busy_ns)
    if top.busy_ns / total < th.cpu_share or top.busy_ns / docs.elapsed_ns < th.cpu_wall_share:
        return None
    return top


def _cpu_used(docs: Documents, f: FutureEntry) -> bool | None:
    """Whether ``f``'s busy time was spent on the CPU: measured per poll (``cpu=True``), else
    by its blocking lines' thread CPU clock; None when nothing says."""
    if f.cpu is not None and f.cpu.busy_ns:
        return f.cpu.cpu_ns * 2 > f.cpu.busy_ns
    kinds = {
        line.kind
        for loop in docs.loops
        for line in loop.blocking_lines
        if line.future_id == f.id and line.kind is not None
    }
    return ("cpu" in kinds) if kinds else None


def cpu_bound(docs: Documents, th: Thresholds) -> Iterator[Finding]:
    """One future holds the loop far more than every other: CPU work on the loop, if its
    thread was computing. Said by the blocking line's or the long poll's finding when there is
    one (one cause, one finding); not said when the CPU was measured idle (then it is blocking,
    which the lines name)."""
    top = _cpu_top(docs, th)
    if top is None or top.id in _explained(docs, th):
        return
    if top in _long_polls(docs, th):
        return  # long-poll or off-cpu-poll names it, with its share of the busy time
    stormed = {f.future_id for r in _storms(docs, th) for f in r.futures if f.waits}
    if top.id in stormed:
        return  # its polls are the wake-ups of a storm: wakeup-storm names the cause
    if any(f.id == top.id for f, *_ in _spinners(docs, th)):
        return  # its busy time is a spin: busy-wait names the cause
    used = _cpu_used(docs, top)
    if used is False:
        return
    # (the busy time of the calls whose polls only contained its own is its, not more of it)
    total = sum(f.busy_ns for f in docs.futures if not _contains(f, top))
    what = "CPU work on the loop" if used else "CPU work or blocking calls on the loop"
    thread = (
        f"a thread ({_to_thread(docs)})" if _on_trio(docs) else "an executor (asyncio.to_thread)"
    )
    yield Finding(
        "cpu-bound",
        "warning",
        _future_subject(top),
        f"`{top.label}`{_where(top.location)} holds the event loop {_percent(top.busy_ns, total)}%"
        f" of all busy time ({_duration(top.busy_ns)} over {top.call_count} calls,"
        f" {_duration(top.busy_ns // top.total_polls)} a poll on average,"
        f" {_percent(top.busy_ns, docs.elapsed_ns)}% of the wall time): {what}",
        f"run its CPU work in {thread} or yield more often"
        if used
        else f"run its CPU work in {thread} or yield more often; if it makes blocking calls, "
        f"await them in a thread ({_to_thread(docs)}) or use an async API",
        {
            "busy_ns": top.busy_ns,
            "busy_percent": _percent(top.busy_ns, total),
            "wall_percent": _percent(top.busy_ns, docs.elapsed_ns),
        },
    )


def never_awaited(docs: Documents, th: Thresholds) -> Iterator[Finding]:
    """Coroutines created and never awaited: their work silently never ran."""
    for entry in docs.never_awaited:
        site = entry.created_at
        where = f", created at {os.path.basename(site.file)}:{site.line}" if site else ""
        times = "once" if entry.count == 1 else f"{entry.count} times"
        yield Finding(
            "never-awaited",
            "warning",
            WarningSubject("future", None, entry.function, entry.location),
            f"Coroutine `{entry.function}`{_where(entry.location)} was called and never "
            f"awaited {times}{where}: its body never ran",
            "await it, or hand it to asyncio.create_task",
            {"count": entry.count},
        )
    for f in docs.futures:
        if f.outcomes.never_awaited:
            yield Finding(
                "never-awaited",
                "warning",
                _future_subject(f),
                f"{f.outcomes.never_awaited} calls of `{f.label}`{_where(f.location)} were "
                "never awaited: their bodies never ran",
                "await it, or hand it to asyncio.create_task",
                {"count": f.outcomes.never_awaited},
            )


def _own_futures(docs: Documents) -> set[int]:
    """The futures of the program's own code: defined outside Python's library, installed
    packages and asyncflow."""
    return {f.id for f in docs.futures if not is_library_file(f.location.file)}


def _library_channel(c: ChannelEntry, own: set[int]) -> bool:
    """Whether only libraries' futures use a channel (a framework's internal queue, such as
    uvicorn's lifespan queue): every side that moved messages is a tracked future of library
    code. Untracked code may be the program's, so a channel it uses is the program's."""
    used = [e for e in (*c.senders, *c.receivers) if e.messages]
    return bool(used) and all(e.future_id is not None and e.future_id not in own for e in used)


def unread_channel(docs: Documents, th: Thresholds) -> Iterator[Finding]:
    """A channel written and never read: its messages pile up."""
    own = _own_futures(docs)
    for c in docs.channels:
        if c.received_count or c.sent_count < th.unread_messages or c.state != "active":
            continue
        if _library_channel(c, own):
            continue
        yield Finding(
            "channel-unread",
            "warning",
            _channel_subject(c),
            f"Channel `{c.label}` received {c.sent_count} messages from {_names(c.senders)} and"
            f" none was ever read: {c.queue_size} are waiting in it",
            "start its consumer, or check that it reads the same queue object",
            {"sent": c.sent_count, "queue_size": c.queue_size},
        )


def lost_messages(docs: Documents, th: Thresholds) -> Iterator[Finding]:
    """A channel collected or closed with messages still in it."""
    own = _own_futures(docs)
    dead = _dead_consumers(docs, th)
    for c in docs.channels:
        if not c.lost_count or _library_channel(c, own) or c.id in dead:
            continue  # (lost because its consumer died: dead-consumer says so)
        yield Finding(
            "messages-lost",
            "error",
            _channel_subject(c),
            f"{c.lost_count} messages sent into `{c.label}` by {_names(c.senders)} were never "
            "received: the channel was dropped or closed with them still in it",
            "drain the queue (await q.join()) before dropping it",
            {"lost": c.lost_count, "sent": c.sent_count},
        )


def _active_ns(c: ChannelEntry, elapsed_ns: int) -> int:
    """How long the channel was in use: from its first message to its last (as its send rate
    measures them), else the whole profile. A pipeline that ran for one second of a long
    profile is judged over that second."""
    if c.send_rate > 0 and c.sent_count > 1:
        span = round((c.sent_count - 1) / c.send_rate * 1e9)
        if 0 < span < elapsed_ns:
            return span
    return elapsed_ns


def _blocked_share(
    c: ChannelEntry, docs: Documents, th: Thresholds, futures: dict[int, FutureEntry]
) -> float | None:
    """The share of the time a bounded channel held each producer waiting, when it is a
    backlog (producers blocked long enough, and longer than consumers starved); else None."""
    if c.channel_type == "unbounded" or docs.elapsed_ns <= 0 or not c.received_count:
        return None
    if c.producers_blocked_ns < th.min_wait_ns or _self_fed(c):
        return None
    in_use = _active_ns(c, docs.elapsed_ns)
    producers = _calls_at_once(c.senders, futures, in_use)
    share = c.producers_blocked_ns / producers / in_use
    if share < th.blocked_share or c.producers_blocked_ns <= c.consumers_starved_ns:
        return None
    return share


def _by_id(docs: Documents) -> dict[int, FutureEntry]:
    return {f.id: f for f in docs.futures}


def _backlog(
    c: ChannelEntry, docs: Documents, th: Thresholds, futures: dict[int, FutureEntry]
) -> float | None:
    """The share of the time an unbounded channel's consumers waited for messages (each
    consuming call), when it is a backlog: its messages waited ``path_min`` in it at the
    median, over at least ``path_min_messages``, while its consumers waited for input less
    than ``blocked_share`` of the time (a stage slower than the rate for every message; no
    producer is held back to say so); else None."""
    if c.channel_type != "unbounded" or docs.elapsed_ns <= 0 or _self_fed(c):
        return None
    if c.max_queue_size >= th.growth_min_depth:
        return None  # deep enough for unbounded-growth (and messages-lost, once dropped)
    if c.received_count < th.path_min_messages or c.delay_ns.get("p50", 0) < th.path_min_ns:
        return None
    in_use = _active_ns(c, docs.elapsed_ns)
    share = c.consumers_starved_ns / _calls_at_once(c.receivers, futures, in_use) / in_use
    return share if share < th.blocked_share else None


def _starved_share(
    c: ChannelEntry, docs: Documents, th: Thresholds, futures: dict[int, FutureEntry]
) -> float | None:
    """The share of the time a channel's consumers waited on it empty (each consuming call),
    when that is long enough to say its producers set the pace; else None."""
    if docs.elapsed_ns <= 0 or not c.received_count or c.producers_blocked_ns:
        return None
    if c.consumers_starved_ns < th.min_wait_ns or _self_fed(c):
        return None
    in_use = _active_ns(c, docs.elapsed_ns)
    share = c.consumers_starved_ns / _calls_at_once(c.receivers, futures, in_use) / in_use
    return share if share >= th.starved_share else None


def _readers(channels: Iterable[ChannelEntry]) -> set[int]:
    """The futures that received messages from any of the channels."""
    return {e.future_id for c in channels for e in c.receivers if e.messages and e.future_id}


def bottleneck(docs: Documents, th: Thresholds) -> Iterator[Finding]:
    """A bounded channel full and its producers blocked: the consumers are the slow stage.

    In a chain of stages, a slow last stage backs up every channel before it; a stage that is
    itself held up by a full output is not the slow one, so only the channel whose consumers
    are not blocked producers elsewhere is named. The share is per producing call: four
    ``parse`` calls blocked the whole second make 100%, not 400%.
    """
    futures = _by_id(docs)
    own = _own_futures(docs)
    backed_up = {
        c.id: s for c in docs.channels if (s := _blocked_share(c, docs, th, futures)) is not None
    }
    held_up = {
        e.future_id
        for c in docs.channels
        if c.id in backed_up
        for e in c.senders
        if e.messages and e.future_id is not None
    }
    dead = _dead_consumers(docs, th)
    pools = _saturated_pools(docs, th)
    for c in docs.channels:
        share = backed_up.get(c.id)
        backlog = _backlog(c, docs, th, futures) if share is None else None
        if (share is None and backlog is None) or _library_channel(c, own) or c.id in dead:
            continue  # (a dead consumer: dead-consumer says why the producers wait)
        readers = {e.future_id for e in c.receivers if e.messages}
        if readers and readers <= held_up:
            continue  # its consumers wait on a full output themselves: the slow stage is later
        consumers, stages = _named(c.receivers)
        in_use = _active_ns(c, docs.elapsed_ns)
        producers = _calls_at_once(c.senders, futures, in_use)
        if backlog is not None:  # unbounded: no producer waits, its messages do
            yield _backlog_finding(c, backlog, in_use, futures)
            continue
        assert share is not None
        percent = min(100, round(share * 100))
        calling = sorted(readers | _callees(docs, {f for f in readers if f is not None}), key=str)
        pool = next((pools[f] for f in calling if f in pools), None)
        advice = (
            "speed up or add consumers of this channel; the producers can go no faster"
            if pool is None
            else f"its consumers queue for `{pool}`, which is saturated: give that pool more "
            "workers; more consumers would only queue there too"
        )
        severity, said = "warning", ""
        waited = _loop_wait_share(readers, futures, in_use, th)
        if waited is not None:
            severity, advice = "info", "unblock the loop first: the consumers wait for it"
            it, its = ("it", "its") if stages == 1 else ("they", "their")
            said = (
                f"; but {it} waited for the loop {min(100, round(waited * 100))}% of {its} "
                f"time (woken, {its} next poll not run yet) while other code held it: what "
                f"holds up the loop holds {'it' if stages == 1 else 'them'} up"
            )
        yield Finding(
            "bottleneck",
            severity,
            _channel_subject(c),
            f"{consumers} {'is' if stages == 1 else 'are'} the bottleneck: its input "
            f"`{c.label}` ({c.channel_type}) was full, and "
            f"{_who(producers, _names(c.senders), 'producer')} "
            f"{'was' if producers == 1 else 'were'} blocked {percent}% of the "
            f"{_duration(in_use)} it was in use ({_duration(c.producers_blocked_ns)} in "
            f"all){said}",
            advice,
            {
                "producers_blocked_ns": c.producers_blocked_ns,
                "consumers_starved_ns": c.consumers_starved_ns,
                "in_use_ns": in_use,
                "producers": producers,
                "blocked_percent": percent,
                "max_queue_size": c.max_queue_size,
            },
        )


def _loop_wait_share(
    readers: set[int | None], futures: dict[int, FutureEntry], in_use: int, th: Thresholds
) -> float | None:
    """The share of the consumers' time (their calls' busy and idle time) they waited for the
    loop (woken, their next poll not run yet: scheduled time), when it is at least
    ``loop_wait_share`` and other code held the loop: the consumers' own polls took at most
    the rest of the channel's time in use (consumers that compute wait for each other, and
    are the slow stage). None otherwise, or when none of them had a wake-up measured (under
    uvloop or trio, say)."""
    entries = [futures[f] for f in readers if f is not None and f in futures]
    if not any(e.scheduled_polls for e in entries):
        return None
    time = sum(e.busy_ns + e.idle_ns for e in entries)
    busy = sum(e.busy_ns for e in entries)
    if time <= 0 or busy > (1 - th.loop_wait_share) * in_use:
        return None
    share = sum(e.scheduled_ns for e in entries) / time
    return share if share >= th.loop_wait_share else None


def _backlog_finding(
    c: ChannelEntry, share: float, in_use: int, futures: dict[int, FutureEntry]
) -> Finding:
    consumers, stages = _named(c.receivers)
    n = _calls_at_once(c.receivers, futures, in_use)
    percent = min(100, round(share * 100))
    return Finding(
        "bottleneck",
        "warning",
        _channel_subject(c),
        f"{consumers} {'is' if stages == 1 else 'are'} the bottleneck: its input "
        f"`{c.label}` (unbounded) built up to {c.max_queue_size} messages, which waited "
        f"{_duration(c.delay_ns.get('p50', 0))} in it at the median (the longest "
        f"{_duration(c.max_delay_ns)}), while {_who(n, _names(c.receivers), 'consumer')} "
        f"waited for messages {percent}% of the {_duration(in_use)} it was in use",
        "speed up or add consumers of this channel: it takes messages more slowly than they come",
        {
            "consumers_starved_ns": c.consumers_starved_ns,
            "in_use_ns": in_use,
            "consumers": n,
            "starved_percent": percent,
            "p50_delay_ns": c.delay_ns.get("p50", 0),
            "max_queue_size": c.max_queue_size,
        },
    )


def starved(docs: Documents, th: Thresholds) -> Iterator[Finding]:
    """Consumers waiting on an empty channel most of the time: the producers set the pace.

    The share is per consuming call (eight workers waiting the whole second make 100%, not
    800%). A work queue its own consumers feed has no other stage to name: its workers wait
    on each other's output, which is how it ends, not a pace set from outside.
    """
    futures = _by_id(docs)
    own = _own_futures(docs)
    dead = _dead_producers(docs, th)
    shares = {c.id: s for c in docs.channels if (s := _starved_share(c, docs, th, futures))}
    # a stage that waits for its own input passes its producers' pace on, and one whose input
    # backs up sets the pace after it (the bottleneck): the channels after them are not paced
    # by their producers
    upstream = _readers(
        c for c in docs.channels if c.id in shares or _backlog(c, docs, th, futures) is not None
    )
    for c in docs.channels:
        share = shares.get(c.id)
        if share is None or c.id in dead:
            continue  # its producers died: dead-producer says why the consumers wait
        if _library_channel(c, own):
            continue  # a framework's own queue (a server waiting for its shutdown signal)
        writers = {e.future_id for e in c.senders if e.messages}
        if writers and writers <= upstream:
            continue  # its producers wait on an earlier stage: the pace is set before them
        in_use = _active_ns(c, docs.elapsed_ns)
        consumers = _calls_at_once(c.receivers, futures, in_use)
        producers, stages = _named(c.senders)
        percent = min(100, round(share * 100))
        yield Finding(
            "starved",
            "info",
            _channel_subject(c),
            f"{producers} {'sets' if stages == 1 else 'set'} the pace of `{c.label}`: "
            f"{_who(consumers, _names(c.receivers), 'consumer')} waited for messages "
            f"{percent}% of the time ({_duration(c.consumers_starved_ns)} in all)",
            "fine for a service waiting for work; in a batch pipeline, the producers are the "
            "stage to speed up",
            {
                "consumers_starved_ns": c.consumers_starved_ns,
                "consumers": consumers,
                "starved_percent": percent,
            },
        )


def _swept_at_the_end(f: FutureEntry) -> int:
    """Calls that ended together at the end after long lives: a shutdown cancelling its
    long-lived tasks (subscribers, workers, pollers), not a storm.

    The live series says when calls ended, to within one of its samples (about a second
    apart at first). In the last interval in which calls of the future ended (the one since
    the last sample included), those that were already alive at its start and ended in it
    are swept, provided no call of the future was created after it. A storm of timeouts is
    short calls ending interval after interval: few of them outlive a sample boundary, and
    they keep coming. (Fewer than ``cancel_min`` swept calls are not a sweep.)"""
    live_now = f.calls.pending + f.calls.running + f.calls.suspended
    points = [(0, 0), *((s.created, s.live) for s in f.live_series), (f.call_count, live_now)]
    for (created_before, live_before), (created, live) in zip(
        reversed(points[:-1]), reversed(points[1:]), strict=True
    ):
        ended = (created - live) - (created_before - live_before)
        if ended <= 0:
            if created != created_before:
                return 0  # calls created after the last ones ended: not the end of anything
            continue
        new = created - created_before
        return max(0, min(ended - new, live_before))
    return 0


#: cancelled calls that ended within this of the future's last call to end, with no call ending
#: otherwise among them, ended in one sweep (a shutdown cancels its tasks in one loop turn or two)
SWEEP_NS = 50_000_000


def _swept_together(ends: Sequence[tuple[int, int, str]]) -> int:
    """Long-lived calls of the recent log cancelled in one burst at its very end: what a
    shutdown (a server closing its kept-alive connections, a task group torn down) looks like
    in a run too short for the live series to say it. Every call that ended in the burst
    ended cancelled, or it is no burst; and only calls that had lived at least half the time
    the log spans count (a timeout cuts calls short, a shutdown ends calls that were meant to
    last)."""
    if not ends:
        return 0
    first = min(created for created, _, _ in ends)
    last = max(finished for _, finished, _ in ends)
    burst = [(c, f, outcome) for c, f, outcome in ends if f >= last - SWEEP_NS]
    if any(outcome != "cancelled" for _, _, outcome in burst):
        return 0
    return sum(
        1
        for created, finished, _ in burst
        if finished > created and finished - created >= (finished - first) / 2
    )


def _judged(docs: Documents) -> list[FutureEntry]:
    """The futures whose calls' lives are judged (cancelled, leaking): the program's own, where
    it has any tracked. A library's tasks (a server's connection handlers, cancelled when a
    client closes its keep-alive connection, alive as long as it stays) live by the library's
    rules; where they cut the program's work short, the program's own calls inside them say
    so. With no future of the program's own (``--no-own-code``), every future is judged."""
    own = [f for f in docs.futures if not is_library_file(f.location.file)]
    return own or list(docs.futures)


def cancellation_storm(docs: Documents, th: Thresholds) -> Iterator[Finding]:
    """Most calls of a future end cancelled (timeouts, usually); calls cancelled in one sweep
    at the end after long lives (a shutdown) are left out."""
    leaking = _leaking(docs, th)
    for f in _judged(docs):
        if f.id in leaking:
            continue  # its calls leaked and the shutdown cancelled them: the leak says so
        o = f.outcomes
        at_end = max(_swept_at_the_end(f), _swept_together(docs.recent_ends.get(f.id, ())))
        swept = min(o.cancelled, at_end)
        if swept < th.cancel_min:
            swept = 0  # a call or two that outlived a sample: too few to call it a sweep
        cancelled = o.cancelled - swept
        finished = o.returned + o.raised + o.cancelled - swept
        if cancelled < th.cancel_min or cancelled < th.cancel_share * finished:
            continue
        also = f" (and {swept} more at the end, in one sweep)" if swept else ""
        yield Finding(
            "cancellation-storm",
            "warning",
            _future_subject(f),
            f"{cancelled} of {finished} finished calls of `{f.label}`{_where(f.location)} "
            f"ended cancelled{also}: their work was thrown away",
            "check the timeouts around it against its call durations",
            {"cancelled": cancelled, "finished": finished, "swept": swept}
            if swept
            else {"cancelled": cancelled, "finished": finished},
        )


def swallowed_cancellation(docs: Documents, th: Thresholds) -> Iterator[Finding]:
    """A call caught a cancellation and went on to return normally: it cannot be stopped."""
    for f in docs.futures:
        c = f.cancellations
        if not c.swallowed:
            continue
        times = "once" if c.swallowed == 1 else f"{c.swallowed} times"
        yield Finding(
            "cancellation-swallowed",
            "warning",
            _future_subject(f),
            f"`{f.label}`{_where(f.location)} swallowed a cancellation {times}: its calls "
            "caught CancelledError and returned normally, so whoever cancelled them (a timeout, "
            "a shutdown, a task group) waited on work that would not stop",
            "re-raise CancelledError after cleaning up (or call uncancel() if it really is "
            "handled)",
            {"swallowed": c.swallowed, "requested": c.requested},
        )


def _leak(f: FutureEntry, th: Thresholds) -> Finding | None:
    """A future's live calls grew (the live series, up to its peak) while almost none of the
    calls created meanwhile finished: a leak. Judged from the peak, so that it still holds at
    exit once the shutdown cancelled the leaked tasks; but calls that ended after the peak
    must have ended cancelled (a sweep): calls that return again are a burst draining."""
    live_now = f.calls.pending + f.calls.running + f.calls.suspended
    points = [(s.ago_ns, s.live, s.created) for s in f.live_series]
    if len(points) < 4:
        return None
    points.append((0, live_now, f.call_count))
    at = max(range(len(points)), key=lambda i: (points[i][1], i))
    if at < 3:
        return None  # its growth must span a few samples, not one burst
    (first_ago, first_live, first_created), (peak_ago, peak, peak_created) = points[0], points[at]
    created = peak_created - first_created
    finished = created - (peak - first_live)
    if peak < th.leak_min_live or peak < 2 * max(1, first_live):
        return None
    if finished > th.leak_finish_share * created:
        return None
    o = f.outcomes
    if live_now < peak and o.returned + o.raised > th.leak_finish_share * f.call_count:
        return None  # its calls end by themselves: a backlog that drained, not a leak
    since = (
        ""
        if live_now >= peak
        else "; none is alive now: they ended cancelled (the shutdown's sweep)"
        if not live_now
        else f"; {live_now} are alive now, the others ended cancelled"
    )
    return Finding(
        "task-leak",
        "warning",
        _future_subject(f),
        f"`{f.label}`{_where(f.location)} is leaking: its live calls grew from "
        f"{first_live} to {peak} over {_duration(first_ago - peak_ago)} while "
        f"{finished} of the {created} calls created meanwhile finished{since}",
        "look at /tasks for where its calls wait: something they wait on never comes",
        {
            "live_from": first_live,
            "live_now": live_now,
            "live_peak": peak,
            "created": created,
            "finished": finished,
        },
    )


def _leaking(docs: Documents, th: Thresholds) -> set[int]:
    return {f.id for f in _judged(docs) if _leak(f, th) is not None}


def task_leak(docs: Documents, th: Thresholds) -> Iterator[Finding]:
    """A future's live calls keep growing and almost none finish (judged up to their peak)."""
    for f in _judged(docs):
        finding = _leak(f, th)
        if finding is not None:
            yield finding


#: a job that waited this long on average waited for a worker, not for a thread to wake and
#: take it (a hand-off takes well under a millisecond, a few on a machine short of cores)
HAND_OFF_NS = 10_000_000


def _saturated(docs: Documents, th: Thresholds) -> list[ExecutorEntry]:
    saturated = {s.subject.id for s in executor_saturated(docs, th)}
    return [e for e in docs.executors if e.id in saturated]


def _saturated_pools(docs: Documents, th: Thresholds) -> dict[int, str]:
    """The futures that submitted jobs to a saturated executor: future id -> the pool's label."""
    return {
        g.future_id: e.label
        for e in _saturated(docs, th)
        for g in e.futures
        if g.future_id is not None
    }


def executor_saturated(docs: Documents, th: Thresholds) -> Iterator[Finding]:
    """Jobs wait for a worker longer than they run, in an executor whose workers were all busy
    at once, or whose jobs waited longer than a thread takes to wake (in one executor: the sum
    of gone ones, each waiting to start its first worker, is no saturation; nor is a pool never
    busy at once whose micro-jobs wait longer to be handed to a thread than they run). A pool
    of short CPU-bound jobs may never be seen busy at once (a job holds the GIL from its start
    to its end) and still keep its jobs waiting: the wait says so then, unless the program's
    loops were blocked for at least half as long as the jobs waited. A blocked loop holds the
    GIL, and on trio a job asks for its thread through the loop: its jobs waited for the loop,
    which more workers would not change, and the blocking lines' finding names the cause."""
    blocked_ns = sum(
        sum(line.total_ns for line in loop.blocking_lines) + loop.other_blocks_ns
        for loop in docs.loops
    )
    for e in docs.executors:
        if (
            e.folded_count
            or e.completed < th.executor_min_jobs
            or e.total_queued_ns <= e.total_run_ns
        ):
            continue
        if (
            e.max_workers is not None
            and e.max_running < e.max_workers
            and (
                e.total_queued_ns < HAND_OFF_NS * e.completed or 2 * blocked_ns >= e.total_queued_ns
            )
        ):
            continue
        workers = (
            "its one worker"
            if e.max_workers == 1
            else f"one of {e.max_workers} workers"
            if e.max_workers
            else "one of its workers"
        )
        top = e.functions[0].name if e.functions else "its jobs"
        yield Finding(
            "executor-saturated",
            "warning",
            WarningSubject("executor", e.id, e.label, None),
            f"Executor `{e.label}` is saturated: its {e.completed} jobs waited "
            f"{_duration(e.total_queued_ns)} in all for {workers}, against "
            f"{_duration(e.total_run_ns)} running"
            f" ({e.queued} queued now; most time in `{top}`)",
            "give it more workers, or submit fewer or shorter jobs",
            {
                "queued_ns": e.total_queued_ns,
                "run_ns": e.total_run_ns,
                "queued_now": e.queued,
                "max_workers": e.max_workers or 0,
            },
        )


def _resource_subject(r: ResourceEntry) -> WarningSubject:
    return WarningSubject("resource", r.id, r.label, r.location)


def _waiters(r: ResourceEntry, limit: int = 3) -> str:
    return _waiting(r.futures, limit)


def _waiting(futures: Iterable[ResourceFutureEntry], limit: int = 3) -> str:
    waited = [f for f in sorted(futures, key=lambda f: -f.total_wait_ns) if f.waits]
    if not waited:
        return "its callers"
    shown = ", ".join(f"`{f.label}`" for f in waited[:limit])
    return shown if len(waited) <= limit else f"{shown} and {len(waited) - limit} more"


_ACQUIRED = ("lock", "semaphore", "capacity_limiter", "condition")


def _leaked_holds(r: ResourceEntry) -> int:
    return len([h for h in r.holders if h.outcome is not None]) + r.abandoned_holds


def _failed(r: ResourceEntry) -> str:
    n = r.failed_waits
    return f"{n} wait{' was' if n == 1 else 's were'} given up (timed out or cancelled)"


@dataclass(slots=True)
class _Site:
    """The resources created at one line (one label, one kind): one finding for all of them,
    with their figures summed. A library's resources (a connection pool's lock per
    connection) count only the waits of the program's own futures."""

    first: ResourceEntry
    count: int = 0
    acquisitions: int = 0
    contended: int = 0
    failed: int = 0
    wait_ns: int = 0
    hold_ns: int = 0
    max_waiters: int = 0
    futures: dict[str, ResourceFutureEntry] = field(default_factory=dict)
    ids: set[int] = field(default_factory=set)

    def add(self, r: ResourceEntry) -> None:
        self.count += 1
        self.ids.add(r.id)
        self.acquisitions += r.acquisitions
        self.contended += r.contended_acquisitions
        self.failed += r.failed_waits
        self.wait_ns += r.total_wait_ns
        self.hold_ns += r.total_hold_ns
        self.max_waiters = max(self.max_waiters, r.max_waiters)
        for f in r.futures:
            had = self.futures.get(f.label)
            if had is None:
                self.futures[f.label] = f
                continue
            self.futures[f.label] = ResourceFutureEntry(
                had.future_id,
                f.label,
                had.waits + f.waits,
                had.total_wait_ns + f.total_wait_ns,
                max(had.max_wait_ns, f.max_wait_ns),
                had.holds + f.holds,
                had.total_hold_ns + f.total_hold_ns,
                max(had.max_hold_ns, f.max_hold_ns),
                had.signals + f.signals,
            )

    def judged_for(self, own: set[int]) -> None:
        """A library's resources: keep only the waits of the program's own futures."""
        if not is_library_file(self.first.location.file):
            return
        mine = {k: f for k, f in self.futures.items() if f.future_id in own}
        if len(mine) < len(self.futures):
            self.failed = 0  # whose waits were given up is not known per future
        self.futures = mine
        self.contended = sum(f.waits for f in mine.values())
        self.wait_ns = sum(f.total_wait_ns for f in mine.values())

    def name(self) -> str:
        """``Lock `cache```, ``16 locks created at `_synchronization.py:68```."""
        primitive = self.first.primitive.replace("_", " ")
        if self.count == 1:
            return f"{primitive.capitalize()} `{self.first.label}`"
        plural = primitive[:-1] + "ies" if primitive.endswith("y") else primitive + "s"
        return f"{self.count} {plural} created at `{self.first.label}`"


def _site_key(r: ResourceEntry) -> tuple[str, str, str, int]:
    return (r.primitive, r.label, r.location.file, r.location.line)


def _by_site(resources: Iterable[ResourceEntry]) -> list[_Site]:
    """The resources grouped by creation site, the most waited on first in each group."""
    sites: dict[tuple[str, str, str, int], _Site] = {}
    for r in sorted(resources, key=lambda r: -r.total_wait_ns):
        site = sites.get(_site_key(r))
        if site is None:
            site = sites[_site_key(r)] = _Site(r)
        site.add(r)
    return list(sites.values())


def _site_subject(site: _Site) -> WarningSubject:
    return _resource_subject(site.first)


def contention(docs: Documents, th: Thresholds) -> Iterator[Finding]:
    """A lock or semaphore that its callers queue for far longer than anyone holds it.

    Judged on the waits that acquired it: waits that were given up (timed out, cancelled) got
    nothing to hold, and when holds were never given back (see permits-leaked) they waited
    for permits that no longer existed, which holding it for less would not cure. Where most
    waits were given up, the warning says so instead. The resources created at one line are
    judged together, and a library's by the waits of the program's own futures: a library's
    lock that serialises the library's own tasks is not the program's to fix.
    """
    own = _own_futures(docs)
    acquired = [
        r
        for r in docs.resources
        if r.primitive in _ACQUIRED and not (_leaked_holds(r) and r.state != "gone")
    ]  # (leaked permits: permits-leaked says why the waits were long)
    queues = {e.limiter_id for e in _saturated(docs, th)} - {None}
    for site in _by_site(acquired):
        site.judged_for(own)
        if site.contended < th.contention_min_waits or site.wait_ns <= 2 * site.hold_ns:
            continue
        if site.ids <= queues:
            continue  # the limiters of pools whose jobs queue: executor-saturated says so
        name, waiters = site.name(), _waiting(site.futures.values())
        many = site.count > 1
        evidence = {
            "contended": site.contended,
            "acquisitions": site.acquisitions,
            "failed_waits": site.failed,
            "wait_ns": site.wait_ns,
            "hold_ns": site.hold_ns,
            "max_waiters": site.max_waiters,
        }
        if many:
            evidence["resources"] = site.count
        failed = f"{site.failed} wait{' was' if site.failed == 1 else 's were'} given up"
        failed += " (timed out or cancelled)"
        if site.failed >= site.contended:
            yield Finding(
                "lock-contention",
                "warning",
                _site_subject(site),
                f"{name} {'are' if many else 'is'} held longer than {waiters} will wait: "
                f"{failed} against {site.contended} that waited and got "
                f"{'them' if many else 'it'}, {_duration(site.wait_ns)} of waiting in all, "
                f"while {'they were' if many else 'it was'} held {_duration(site.hold_ns)}"
                f" (up to {site.max_waiters} waiting at once)",
                "find what holds it so long (the holders in /resources), or give its callers "
                "longer timeouts",
                evidence,
            )
            continue
        also = f", and {failed}" if site.failed else ""
        yield Finding(
            "lock-contention",
            "warning",
            _site_subject(site),
            f"{name} serialise{'' if many else 's'} {waiters}: {site.contended} of "
            f"{site.acquisitions} acquisitions waited{also}, {_duration(site.wait_ns)} in all, "
            f"to hold {'them' if many else 'it'} {_duration(site.hold_ns)} (up to "
            f"{site.max_waiters} waiting at once)",
            "hold it for less (no await while holding it), or split what it guards",
            evidence,
        )


def _library_resource(r: ResourceEntry, own: set[int]) -> bool:
    """Whether a resource is a library's own business: created in library code, and none of
    the program's own futures waited on it, held it or signalled it."""
    return is_library_file(r.location.file) and not any(f.future_id in own for f in r.futures)


def permits_leaked(docs: Documents, th: Thresholds) -> Iterator[Finding]:
    """Permits taken by calls that ended without giving them back."""
    own = _own_futures(docs)
    for r in docs.resources:
        ended = [h for h in r.holders if h.outcome is not None]
        leaked = len(ended) + r.abandoned_holds
        if not leaked or r.primitive not in _ACQUIRED or r.state == "gone":
            continue  # (once the primitive is gone, its permits no longer hold anyone up)
        if _library_resource(r, own):
            continue
        calls: dict[tuple[str, str], int] = {}
        for h in ended:
            key = (h.label, h.outcome or "ended")
            calls[key] = calls.get(key, 0) + 1
        who = [
            f"{n} call{'' if n == 1 else 's'} of `{label}` {outcome}"
            for (label, outcome), n in sorted(calls.items(), key=lambda kv: (-kv[1], kv[0]))
        ]
        if r.abandoned_holds:
            who.append(f"{r.abandoned_holds} more whose calls are gone")
        exhausted = r.permits is not None and r.permits.available == 0
        words = "permit" if leaked == 1 else "permits"
        if exhausted and r.failed_waits:
            after = (
                f"; none is left, so callers wait until they give up: {_failed(r)}, "
                f"{_duration(r.total_wait_ns)} of waiting in all"
            )
        elif exhausted:
            after = "; none is left, so every caller now waits forever"
        else:
            after = ""
        yield Finding(
            "permits-leaked",
            "error" if exhausted else "warning",
            _resource_subject(r),
            f"{r.primitive.replace('_', ' ').capitalize()} `{r.label}` has {leaked} {words} "
            f"never given back: {_and(who)} without releasing it{after}",
            "release in a finally block, or use `async with`",
            {
                "leaked": leaked,
                "available": -1 if r.permits is None else r.permits.available or 0,
                "failed_waits": r.failed_waits,
                "wait_ns": r.total_wait_ns,
            },
        )


def _and(parts: Sequence[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _waited_whole_lives(
    r: ResourceEntry, futures: dict[int, FutureEntry]
) -> list[tuple[ResourceFutureEntry, FutureEntry]]:
    """The futures that waited on ``r`` for (nearly) all of their calls' lives and whose calls
    ended cancelled, or waited once each (and gave the wait up: ``asyncio.wait_for(ready.wait(),
    5)``, its timeout caught): tasks that did nothing but wait for it, until they were given up.
    (A call that waits on it again and again, working between its timeouts, is not one: a
    periodic job waiting on a shutdown signal; nor, on 3.11, are the tasks of asyncio's
    ``Event.wait`` that such a job's ``wait_for`` makes, more than one a call of the job.)"""
    out = []
    for rf in r.futures:
        f = futures.get(rf.future_id) if rf.future_id is not None else None
        if f is None or not rf.waits or not (f.outcomes.cancelled or rf.waits <= f.call_count):
            continue
        maker = _library_futures_maker(f, futures)
        if maker is not None and rf.waits > maker.call_count:
            continue  # its maker waited again and again: judged as the maker's own waits are
        if rf.total_wait_ns * 10 >= 9 * (f.busy_ns + f.idle_ns) > 0:
            out.append((rf, f))
    return out


def _library_futures_maker(f: FutureEntry, futures: dict[int, FutureEntry]) -> FutureEntry | None:
    """The program's future whose call first made library future ``f`` (asyncio's
    ``Event.wait`` in a task of its own, as ``asyncio.wait_for`` runs it on 3.11); None for
    the program's own future, or one no program's call made."""
    maker = futures.get(f.first_caller_id) if f.first_caller_id is not None else None
    if (
        maker is None
        or not is_library_file(f.location.file)
        or is_library_file(maker.location.file)
    ):
        return None
    return maker


def _made_by(f: FutureEntry, futures: dict[int, FutureEntry]) -> str:
    """``f``'s label, and for a library's future (asyncio's ``Event.wait`` in a task of its
    own, as ``asyncio.wait_for`` runs it on 3.11) the program's call it was first made in."""
    maker = _library_futures_maker(f, futures)
    if maker is None:
        return f"`{f.label}`"
    return f"`{f.label}`, made in `{maker.label}`{_where(maker.location)},"


def event_never_set(docs: Documents, th: Thresholds) -> Iterator[Finding]:
    """Tasks wait on an event (or condition) nobody has set (notified). While they wait it is
    only ``info`` (a shutdown signal is waited on until the end); once tasks that waited on it
    their whole life were given up (cancelled: a timeout, the shutdown), it is a warning."""
    own = _own_futures(docs)
    futures = _by_id(docs)
    for r in docs.resources:
        e, c = r.event, r.condition
        if e is not None:
            if e.sets:
                continue
            what, never = "event", "nobody ever set it"
        elif c is not None and r.primitive == "condition":
            if c.notifies:
                continue
            what, never = "condition", "nobody ever notified it"
        else:
            continue
        if _library_resource(r, own):
            continue
        whole = _waited_whole_lives(r, futures) if r.failed_waits else []
        if whole:
            calls = sum(rf.waits for rf, _ in whole)
            wait_ns = sum(rf.total_wait_ns for rf, _ in whole)
            names = _and([_made_by(f, futures) for _, f in whole][:3])
            cancelled = all(f.outcomes.cancelled for _, f in whole)
            ended = (
                ("was cancelled" if calls == 1 else "were cancelled")
                if cancelled
                else "gave up waiting (a timeout, or a cancellation)"
            )
            yield Finding(
                "event-never-set",
                "warning",
                _resource_subject(r),
                f"{calls} call{'' if calls == 1 else 's'} of {names} waited on {what} "
                f"`{r.name or r.label}` {'its' if calls == 1 else 'their'} whole "
                f"li{'fe' if calls == 1 else 'ves'} ({_duration(wait_ns)} in all, up to "
                f"{_duration(r.max_wait_ns)} each) and {ended}: {never}",
                f"find who should {'set' if what == 'event' else 'notify'} it: an error or an "
                "early return on that path skips it (set it in a finally block)",
                {"waits": calls, "wait_ns": wait_ns, "max_wait_ns": r.max_wait_ns, "signals": 0},
            )
            continue
        if not r.waiters_now:
            continue
        yield Finding(
            "event-never-set",
            "info",
            _resource_subject(r),
            f"{r.waiters_now} task{' waits' if r.waiters_now == 1 else 's wait'} on {what} "
            f"`{r.label}`, which {'nobody has set' if what == 'event' else 'nobody has notified'}"
            " yet",
            "fine for a shutdown signal; otherwise find who should set it (/tasks shows them)",
            {"waiters": r.waiters_now},
        )


def _live(f: FutureEntry) -> int:
    return f.calls.pending + f.calls.running + f.calls.suspended


def _dead(edges: Iterable[EdgeEntry], futures: dict[int, FutureEntry]) -> list[FutureEntry]:
    """The futures on one side of a channel, when every one is tracked, none has a live call
    and at least one's calls raised: that side of the channel died. Empty otherwise."""
    used = [e for e in edges if e.messages]
    found = [futures.get(e.future_id) for e in used if e.future_id is not None]
    side = [f for f in found if f is not None]
    if not used or len(side) < len(used) or any(_live(f) for f in side):
        return []
    return side if any(f.outcomes.raised for f in side) else []


def _dead_consumers(docs: Documents, th: Thresholds) -> dict[int, list[FutureEntry]]:
    """Channels whose consumers all ended, one with an exception, while messages were left
    in them (sent and never received) and its producers waited or it kept filling: channel
    id -> its dead consumers."""
    futures = _by_id(docs)
    own = _own_futures(docs)
    out: dict[int, list[FutureEntry]] = {}
    for c in docs.channels:
        left = c.sent_count - c.received_count
        if left <= 0 or _library_channel(c, own):
            continue
        if c.producers_blocked_ns < th.min_wait_ns and left < th.unread_messages:
            continue
        dead = _dead(c.receivers, futures)
        if dead:
            out[c.id] = dead
    return out


def _error_of(docs: Documents, f: FutureEntry) -> str:
    """``raised KeyError: 'price'`` when the log holds it, else ``raised``."""
    error = docs.errors.get(f.id)
    if error is None:
        return "raised"
    kind, message = error
    return f"raised {kind}: {message}" if message else f"raised {kind}"


def dead_consumer(docs: Documents, th: Thresholds) -> Iterator[Finding]:
    """The only consumers of a channel ended with an exception, and what its producers send
    is left in it: a dead stage, not a slow one (never called a bottleneck)."""
    channels = {c.id: c for c in docs.channels}
    futures = _by_id(docs)
    for channel_id, dead in _dead_consumers(docs, th).items():
        c = channels[channel_id]
        left = c.sent_count - c.received_count
        culprit = next(f for f in dead if f.outcomes.raised)
        # each call a consumer task of its own: one function run as two workers is two
        tasks = sum(max(1, f.call_count) for f in dead)
        who = _and(
            [
                (f"{f.call_count} calls of " if f.call_count > 1 else "")
                + f"`{f.label}`{_where(f.location)}"
                for f in dead
            ]
        )
        only = "The only consumer" if tasks == 1 else f"All {tasks} consumers"
        it = "it" if tasks == 1 else "they" if len(dead) == 1 else f"`{culprit.label}`"
        producers = _calls_at_once(c.senders, futures, _active_ns(c, docs.elapsed_ns))
        blocked = (
            f"; {_who(producers, _names(c.senders), 'producer')} "
            f"{'was' if producers == 1 else 'were'} blocked {_duration(c.producers_blocked_ns)}"
            " in all on the full channel"
            if c.producers_blocked_ns >= th.min_wait_ns
            else ""
        )
        yield Finding(
            "dead-consumer",
            "error",
            _channel_subject(c),
            f"{only} of `{c.label}`, {who}, died: {it} {_error_of(docs, culprit)} after "
            f"{c.received_count} messages; the {left} sent since were never received{blocked}",
            "handle the error in the consumer (per message), or restart it; await its task "
            "(or use a TaskGroup) so that its exception is not lost",
            {
                "left": left,
                "received": c.received_count,
                "producers_blocked_ns": c.producers_blocked_ns,
                "consumers": tasks,
            },
        )


def _dead_producers(docs: Documents, th: Thresholds) -> dict[int, list[FutureEntry]]:
    """Channels whose producers all ended, one with an exception, and whose consumers then
    waited on it, empty, for at least ``min_wait``: channel id -> its dead producers."""
    futures = _by_id(docs)
    own = _own_futures(docs)
    out: dict[int, list[FutureEntry]] = {}
    for c in docs.channels:
        if c.sent_count != c.received_count or c.consumers_starved_ns < th.min_wait_ns:
            continue
        if _library_channel(c, own):
            continue
        dead = _dead(c.senders, futures)
        if dead:
            out[c.id] = dead
    return out


def dead_producer(docs: Documents, th: Thresholds) -> Iterator[Finding]:
    """The only producers of a channel ended with an exception, and its consumers wait for
    messages that will not come: a dead stage, not a slow one (never a ``starved`` pace)."""
    channels = {c.id: c for c in docs.channels}
    futures = _by_id(docs)
    for channel_id, dead in _dead_producers(docs, th).items():
        c = channels[channel_id]
        culprit = next(f for f in dead if f.outcomes.raised)
        who = _and([f"`{f.label}`{_where(f.location)}" for f in dead])
        only = "The only producer" if len(dead) == 1 else f"All {len(dead)} producers"
        it = "it" if len(dead) == 1 else f"`{culprit.label}`"
        consumers = _calls_at_once(c.receivers, futures, _active_ns(c, docs.elapsed_ns))
        yield Finding(
            "dead-producer",
            "error",
            _channel_subject(c),
            f"{only} of `{c.label}`, {who}, died: {it} {_error_of(docs, culprit)} after "
            f"{c.sent_count} messages; {_who(consumers, _names(c.receivers), 'consumer')} "
            f"{'has' if consumers == 1 else 'have'} waited {_duration(c.consumers_starved_ns)}"
            " in all for messages that will not come",
            "handle the error in the producer (per item), or restart it; await its task (or "
            "use a TaskGroup) so that its exception reaches the consumers",
            {
                "sent": c.sent_count,
                "consumers_starved_ns": c.consumers_starved_ns,
                "producers": len(dead),
            },
        )


#: a task's exception unretrieved this long is named: one awaited (or gathered) a little later
#: is not (asyncio's own shutdown, a supervisor's periodic check)
UNRETRIEVED_AFTER_NS = 1_000_000_000


def task_dropped(docs: Documents, th: Thresholds) -> Iterator[Finding]:
    """Calls garbage-collected after they started, never finished: a task that nothing
    referenced, destroyed while pending. The loop keeps only a weak reference to a task, so a
    task started and forgotten (``asyncio.ensure_future(work())``, ``create_task`` with its
    result dropped) whose awaits lead to nothing else alive is collected mid-way, and its work
    stops where it was (asyncio says ``Task was destroyed but it is pending!``). A coroutine
    it awaited is closed by it, not dropped: only the task's own call counts."""
    for f in docs.futures:
        n = f.outcomes.dropped
        if not n:
            continue
        calls = "A call" if n == 1 else f"{n} calls"
        were = "was" if n == 1 else "were"
        yield Finding(
            "task-dropped",
            "error",
            _future_subject(f),
            f"{calls} of `{f.label}`{_where(f.location)} {were} destroyed while pending: "
            "the garbage collector took them midway, as nothing referenced their tasks "
            "(asyncio logs `Task was destroyed but it is pending!`), so their work stopped "
            "where it was",
            "keep a reference to each task until it is done (add it to a set and discard it in "
            "a done callback, or start it in an asyncio.TaskGroup): the event loop keeps only a "
            "weak reference to a task",
            {"dropped": n, "closed": f.outcomes.closed},
        )


def never_retrieved(docs: Documents, th: Thresholds) -> Iterator[Finding]:
    """Tasks whose coroutine raised and whose exception nobody retrieved (awaited, gathered,
    read with ``exception()``) for a while: asyncio says so only when the task is collected,
    silent while the program runs. An error, as asyncio's own log of it is: the failure is
    lost. A dead consumer's or producer's task is that finding's, with its channel."""
    futures = _by_id(docs)
    dead = {
        f.id
        for side in (_dead_consumers(docs, th), _dead_producers(docs, th))
        for stage in side.values()
        for f in stage
    }
    origin = docs.now_ns - docs.elapsed_ns
    by_future: dict[int, list[tuple[int, str, str, int]]] = {}
    for entry in docs.unretrieved:
        future_id, _, _, raised_ns = entry
        waited = docs.now_ns - (origin + raised_ns)
        if future_id in futures and future_id not in dead and waited >= UNRETRIEVED_AFTER_NS:
            by_future.setdefault(future_id, []).append(entry)
    for future_id, tasks in by_future.items():
        f = futures[future_id]
        first_ns = tasks[0][3]
        latest = tasks[-1]
        error = f"{latest[1]}: {latest[2]}" if latest[2] else latest[1]
        count = "a task" if len(tasks) == 1 else f"{len(tasks)} tasks"
        first = _duration(first_ns)
        yield Finding(
            "never-retrieved",
            "error",
            _future_subject(f),
            f"`{f.label}`{_where(f.location)} ran in {count} that raised {error} "
            f"({'first ' if len(tasks) > 1 else ''}{first} into the run) and nobody has "
            "retrieved the exception: the task is done and its failure is silent "
            "(asyncio logs it only when the task is freed)",
            "await the task (or gather it) where its result is needed, add a done callback "
            "(task.add_done_callback) that reads task.exception() and logs or restarts, or "
            "run it in an asyncio.TaskGroup, which raises its exception in the parent",
            {
                "tasks": len(tasks),
                "first_raised_ns": first_ns,
                "last_raised_ns": latest[3],
            },
        )


def unbounded_growth(docs: Documents, th: Thresholds) -> Iterator[Finding]:
    """An unbounded channel fills faster than it drains, at its deepest now, its messages
    waiting longer and longer, and nothing holds its producers back."""
    own = _own_futures(docs)
    for c in docs.channels:
        if c.channel_type != "unbounded" or c.producers_blocked_ns or c.state != "active":
            continue
        depth = c.queue_size
        if depth < th.growth_min_depth or depth * 10 < 9 * c.max_queue_size:
            continue  # small, or drained from its peak: it does not grow now
        waited = max(c.max_delay_ns, c.delay_ns.get("p99", 0))
        if waited < th.growth_min_delay_ns or c.send_rate <= c.receive_rate:
            continue
        if _library_channel(c, own):
            continue
        senders, n_senders = _named(c.senders)
        receivers, n_receivers = _named(c.receivers)
        yield Finding(
            "unbounded-growth",
            "warning",
            _channel_subject(c),
            f"Channel `{c.label}` (unbounded) keeps growing: {depth} messages wait in it, its "
            f"most yet, and they waited up to {_duration(waited)}; {senders} "
            f"send{'s' if n_senders == 1 else ''} {c.send_rate:.0f}/s and {receivers} "
            f"take{'s' if n_receivers == 1 else ''} {c.receive_rate:.0f}/s, and nothing holds "
            "the producers back",
            "bound it (asyncio.Queue(maxsize=...)) so that the producers wait, or add consumers"
            " (or make them faster)",
            {
                "depth": depth,
                "max_delay_ns": waited,
                "send_rate": round(c.send_rate),
                "receive_rate": round(c.receive_rate),
            },
        )


#: A spinning future's polls outnumber what it waited for (messages, primitives, thread jobs)
#: by far more than this: a stage of an anyio pipeline yields about three to five times an
#: item (anyio checkpoints around each receive and each thread job, as ``sleep(0)`` does), and
#: on trio its thread jobs are not seen at all, yet it waits on something at every item.
SPIN_POLLS_PER_WAIT = 8


def _spinners(docs: Documents, th: Thresholds) -> Iterator[tuple[FutureEntry, int, int, int]]:
    """The program's futures polled thousands of times per call, each poll and each gap
    between polls sub-millisecond, with too few messages, waits or thread jobs to account for
    their polls (``SPIN_POLLS_PER_WAIT``); each with its polls per call, its mean poll and its
    mean gap."""
    woken: dict[int, int] = {}
    for c in docs.channels:
        for e in (*c.receivers, *c.senders):
            if e.future_id is not None:
                woken[e.future_id] = woken.get(e.future_id, 0) + e.messages
    for r in docs.resources:
        for rf in r.futures:
            if rf.future_id is not None:
                woken[rf.future_id] = woken.get(rf.future_id, 0) + rf.waits + rf.holds
    for x in docs.executors:
        for job in x.futures:  # jobs it awaited on a worker thread (anyio's file I/O...)
            if job.future_id is not None:
                woken[job.future_id] = woken.get(job.future_id, 0) + job.jobs
    own = _own_futures(docs)
    for f in docs.futures:
        if f.id not in own or not f.call_count or not f.total_polls:
            continue
        per_call = f.total_polls // f.call_count
        waited = woken.get(f.id, 0)
        if per_call < th.busy_wait_polls or SPIN_POLLS_PER_WAIT * waited >= f.total_polls:
            continue
        poll_ns, gap_ns = f.busy_ns // f.total_polls, f.idle_ns // f.total_polls
        if poll_ns >= th.busy_wait_gap_ns or gap_ns >= th.busy_wait_gap_ns:
            continue
        yield f, per_call, poll_ns, gap_ns


def busy_wait(docs: Documents, th: Thresholds) -> Iterator[Finding]:
    """A future that spins on the loop (``while not flag: await asyncio.sleep(0)``): polled
    thousands of times per call, sub-millisecond each, with nothing to wake it."""
    for f, per_call, poll_ns, gap_ns in _spinners(docs, th):
        yield Finding(
            "busy-wait",
            "warning",
            _future_subject(f),
            f"`{f.label}`{_where(f.location)} busy-waits: it was polled {per_call} times per "
            f"call ({f.total_polls} polls over {f.call_count} call"
            f"{'' if f.call_count == 1 else 's'}), each poll {_duration(poll_ns)} and "
            f"{_duration(gap_ns)} apart on average, with nothing to wait on: it spins the loop "
            "(await asyncio.sleep(0) in a loop) instead of waiting",
            "wait on an asyncio.Event (or a Condition, or a future) that whoever changes the "
            "flag sets, instead of polling it",
            {
                "polls_per_call": per_call,
                "polls": f.total_polls,
                "calls": f.call_count,
                "poll_ns": poll_ns,
                "gap_ns": gap_ns,
            },
        )


def _storms(docs: Documents, th: Thresholds) -> list[ResourceEntry]:
    """The program's conditions whose notifies each woke ``storm_ratio`` waiters or more."""
    own = _own_futures(docs)
    return [
        r
        for r in docs.resources
        if r.primitive == "condition"
        and r.signals >= th.storm_min_signals
        and r.woken >= th.storm_ratio * r.signals
        and not _library_resource(r, own)
    ]


def wakeup_storm(docs: Documents, th: Thresholds) -> Iterator[Finding]:
    """A condition whose every notify wakes many waiters (``notify_all()`` for each item):
    all of them run to find one item, and all but one go back to waiting."""
    own = _own_futures(docs)
    for r in _storms(docs, th):
        per = r.woken // r.signals
        waiting = [f for f in r.futures if f.waits]
        names = _waiting(r.futures)
        notifiers = _and([f"`{f.label}`" for f in r.futures if f.signals][:3]) or "its callers"
        polls_ns = sum(
            f.busy_ns
            for f in docs.futures
            if f.id in {w.future_id for w in waiting} and f.id in own
        )
        cost = f"; {names} spent {_duration(polls_ns)} on the loop in all" if polls_ns else ""
        yield Finding(
            "wakeup-storm",
            "warning",
            _resource_subject(r),
            f"Condition `{r.name or r.label}` wakes {per} waiters per notify: {r.woken} "
            f"wake-ups for {r.signals} notifies by {notifiers}, up to {r.max_waiters} waiting "
            f"at once: where one of them can go on, the others run only to wait again{cost}",
            "notify() (or notify(n)) as many waiters as can go on, not notify_all(); or hand "
            "the items out through an asyncio.Queue",
            {
                "woken": r.woken,
                "signals": r.signals,
                "per_signal": per,
                "max_waiters": r.max_waiters,
            },
        )


def _cut_by_timeouts(f: FutureEntry) -> bool:
    """Whether a cancellation (a timeout, mostly) cut at least 1% of the future's calls: its
    p99 is then the timeout the program set, which bounds the tail by design (the
    cancellations have their own finding when they are most calls)."""
    o = f.outcomes
    return 100 * f.cancellations.requested >= max(1, o.returned + o.raised + o.cancelled)


def _gathered(f: FutureEntry, th: Thresholds) -> tuple[bool, str]:
    """Whether the gathers ``f`` took part in wait for its tail (it ended last in most of
    them, or too few were counted to tell, or none: its calls are awaited alone), and the
    sentence that says so."""
    gathers, last = f.gathers, f.gathers_last
    if not gathers:
        return True, ""
    fact = f", and it finished last in {last} of the {gathers} gathers it was part of"
    if 2 * last > gathers:
        return True, fact + ", so each of them waited for its tail"
    return gathers < th.tail_min_gathers, fact


def _caused_by(loop: LoopEntry, ids: Collection[int], labels: Collection[str]) -> bool:
    """Whether the judged code's blocks (of the futures ``ids``, or labelled ``labels``) make
    up most of the time the loop was blocked: its lag is then that code's own doing, which
    does not excuse that code's tail."""
    total = sum(line.total_ns for line in loop.blocking_lines)
    own = sum(
        line.total_ns
        for line in loop.blocking_lines
        if line.future_id in ids or line.label in labels
    )
    return total > 0 and 2 * own >= total


def _lateness_ns(
    docs: Documents, th: Thresholds, ids: Collection[int] = (), labels: Collection[str] = ()
) -> int:
    """How late a loop ran its calls, as far as it explains a tail: its heartbeats' p99 lag at
    each of ``tail_lag_factor`` awaits, plus the time its thread waited for a core inside the
    blocks the monitor saw (kind ``cpu``, off the CPU: runnable, the machine short of cores),
    and at least the block threshold at each late wake-up (woken in its selector, its thread
    waited for a core), and the imports that held it (kind ``import``, whole: a warm-up). The
    heartbeat (one in flight at a time) sees such a stall once, however long: on a loaded
    machine the lag's p99 stays small while a call waits through several.
    Not the lag of a loop that the judged code's own blocks held up most: a stage that
    blocks the loop for its slow messages makes the lag, which is its tail, not an excuse."""
    late = 0
    for loop in docs.loops if th.tail_lag_factor else ():  # 0: judged as if on time
        starved = loop.late_wakeups * docs.block_threshold_ns + sum(
            max(0, line.total_ns * (line.cpu_wall_ns - line.cpu_ns) // line.cpu_wall_ns)
            for line in loop.blocking_lines
            if line.kind == "cpu" and line.cpu_ns is not None and line.cpu_wall_ns > 0
        )
        # (and the imports that held it, whole: a module imported on first use makes the
        # calls in flight wait once, a warm-up's tail that no later call has)
        starved += sum(line.total_ns for line in loop.blocking_lines if line.kind == "import")
        lag = 0 if _caused_by(loop, ids, labels) else loop.lag_ns.get("p99", 0)
        late = max(late, th.tail_lag_factor * lag + starved)
    return late


def _waits_named_elsewhere(docs: Documents, th: Thresholds) -> set[int | None]:
    """Futures whose waits another finding names as its cause: the waiters of a lock or
    semaphore that serialises them or whose permits leaked, the producers of a channel whose
    consumers died or that a slow stage holds full. Their slow calls are those waits: hedging
    them (a tail's advice) adds load to the same lock or channel."""
    resources = {
        (s.subject.label, s.subject.location)
        for s in (*contention(docs, th), *permits_leaked(docs, th))
    }
    channels = {s.subject.id for s in (*dead_consumer(docs, th), *bottleneck(docs, th))}
    named = {
        w.future_id
        for r in docs.resources
        if (r.label, r.location) in resources
        for w in r.futures
        if w.waits
    }
    named |= {e.future_id for c in docs.channels if c.id in channels for e in c.senders}
    return named | _callers(docs, named)


#: how far up (or down) the calls made in one another the findings follow a wait
_CALL_DEPTH = 3


def _callers(docs: Documents, ids: set[int | None]) -> set[int | None]:
    """The futures whose calls the futures ``ids`` were first called in (``first_caller_id``),
    and theirs, a few levels up: ``create_order`` awaiting ``price_for``, which waits on a
    lock, waits on it too."""
    found: set[int | None] = set()
    level = set(ids)
    for _ in range(_CALL_DEPTH):
        level = {f.first_caller_id for f in docs.futures if f.id in level} - found - {None}
        found |= level
    return found


def _callees(docs: Documents, ids: set[int]) -> set[int]:
    """The futures first called in the calls of the futures ``ids``, a few levels down."""
    found: set[int] = set()
    level = set(ids)
    for _ in range(_CALL_DEPTH):
        level = {f.id for f in docs.futures if f.first_caller_id in level} - found
        found |= level
    return found


def tail_latency(docs: Documents, th: Thresholds) -> Iterator[Finding]:
    """A future whose slowest calls (p99) take many times its median call: whoever waits for
    all of them (a gather, a page of lookups) waits for its tail. Where its calls take part
    in gathers, only if it ended last in most of them: where a slower sibling ends last in
    every gather anyway, its tail costs no one anything. Not a future whose calls a
    timeout cut (its p99 is the timeout, which the program chose), nor one that gave up
    waiting on a lock, semaphore or condition: its tail is its own timeout, and what held the
    resource so long is the cause (the resource's finding), not a tail of its own; nor one
    whose waits another finding names (``_waits_named_elsewhere``), nor one whose calls were
    dropped (``task-dropped``: their durations end when the collector ran). Nor a
    tail the loop's own lateness explains (``_lateness_ns`` reaches the tail's excess over the
    median): a loop short of CPU wakes every call late, by about its lag at each await,
    whatever the call does, and the loop's figures say so."""
    gave_up = {w.future_id for r in docs.resources if r.failed_waits for w in r.futures if w.waits}
    named = _waits_named_elsewhere(docs, th)
    own = _own_futures(docs)
    for f in docs.futures:
        if f.id in gave_up or f.id in named or f.outcomes.dropped or _cut_by_timeouts(f):
            continue
        d = f.call_duration_ns
        p50, p99 = d.get("p50", 0), d.get("p99", 0)
        finished = f.outcomes.returned + f.outcomes.raised
        if f.id not in own or finished < th.tail_min_calls or p50 <= 0:
            continue
        if p99 < th.tail_min_ns or p99 < th.tail_ratio * p50:
            continue
        if _lateness_ns(docs, th, ids={f.id}) >= p99 - p50:
            continue
        waited_for, gathered = _gathered(f, th)
        if not waited_for:
            continue
        p95 = d.get("p95")
        also = f" (p95 {_duration(p95)})" if p95 is not None else ""
        why = gathered or (": whatever waits for several of them (a gather) waits for the slowest")
        evidence = {"p50_ns": p50, "p99_ns": p99, "calls": finished, "ratio": p99 // p50}
        if f.gathers:
            evidence |= {"gathers": f.gathers, "gathers_last": f.gathers_last}
        yield Finding(
            "tail-latency",
            "warning",
            _future_subject(f),
            f"`{f.label}`{_where(f.location)} has a slow tail: its p99 call takes "
            f"{_duration(p99)}, {p99 // p50} times its median of {_duration(p50)}{also}, over "
            f"{finished} calls{why}",
            "find what its slow calls do differently (its calls' log, /futures/ID/calls); give "
            "them a timeout, or hedge (a second try after the p95)",
            evidence,
        )


def slow_path(docs: Documents, th: Thresholds) -> Iterator[Finding]:
    """A path through the pipeline whose slowest messages (p99, end to end) take many times its
    median, naming the hop (a channel's wait or a stage) where those messages spent most of
    their time. Unlike the bottleneck (throughput: who keeps a channel full), this is about the
    latency of single messages. Not a tail the loop's lateness explains (as ``tail-latency``)."""
    for p in docs.paths:
        if len(p.channels) < 2 or p.messages < th.path_min_messages:
            continue
        p50, p99 = p.end_to_end_ns.get("p50", 0), p.end_to_end_ns.get("p99", 0)
        if p50 <= 0 or p99 < th.path_min_ns or p99 < th.path_ratio * p50:
            continue
        stages = {name for stage in p.stages for name in stage.split(" → ")}
        if _lateness_ns(docs, th, labels=stages) >= p99 - p50:
            continue  # (a lag the path's own stages made is its tail: not excused)
        found = dominant_hop(p, p99)
        if found is None:
            continue
        index, hop, share, spent = found
        # a stage that handed each message to a task of its own (`dispatch → work`, derive()):
        # none queue behind the slow one, more workers would not help
        handed = index % 2 == 1 and " → " in p.stages[index // 2 + 1]
        yield Finding(
            "slow-path",
            "warning",
            WarningSubject("path", None, p.label, None),
            f"the p99 end-to-end latency of `{p.label}` is {_duration(p99)}, "
            f"{round(100 * share)}% of it {hop} (median {_duration(p50)}, over "
            f"{p.messages} sampled messages)",
            "look at that hop of the slowest messages (`/flow`'s lineage): the task each "
            "message was handed to is slow for some; none wait behind it, so the slow case "
            "itself is to speed up"
            if handed
            else "look at that hop of the slowest messages (`/flow`'s lineage): a stage slow for "
            "some messages holds up those queued behind it; give it more workers or take the "
            "slow case out of line",
            {
                "p50_ns": p50,
                "p99_ns": p99,
                "messages": p.messages,
                "hop": index,
                "share_percent": round(100 * share),
                "hop_ns": spent,
            },
        )


def _at(frame: AwaitFrame | None) -> str:
    return f"{os.path.basename(frame.file)}:{frame.line}" if frame is not None else "?"


def deadlock(docs: Documents, th: Thresholds) -> Iterator[Finding]:
    """Tasks wait on one another in a cycle (through locks, queues or awaits): none can go on."""
    graph = docs.graph
    if graph is None:
        return
    nodes = {n.id: n for n in graph.nodes}
    edges = {(e.source, e.target): e for e in graph.edges}
    for cycle in graph.cycles:
        path = cycle.nodes
        if not path or any(n not in nodes for n in path):
            continue
        parts: list[str] = []
        resources = 0
        held: list[int] = []
        for i, node_id in enumerate(path):
            node = nodes[node_id]
            nxt = path[(i + 1) % len(path)]
            if node.kind == "task":
                who = f"`{node.label}`" + (f" ({node.coroutine})" if node.coroutine else "")
                edge = edges.get((node_id, nxt))
                if edge is not None and edge.relation == "awaits":
                    parts.append(f"{who} awaits task `{nodes[nxt].label}` at {_at(edge.where)}")
                else:
                    target = nodes[nxt]
                    at = _at(edge.where if edge is not None else node.where)
                    parts.append(f"{who} waits at {at} on {target.kind} `{target.label}`")
                continue
            resources += 1
            edge = edges.get((node_id, nxt))
            if edge is None:
                continue
            if edge.relation == "held_by":
                took = f", taken at {_at(edge.where)}" if edge.where is not None else ""
                since = f" for {_duration(edge.held_ns)}" if edge.held_ns is not None else ""
                parts[-1] += f", held by `{nodes[nxt].label}`{took}{since}"
                if edge.held_ns is not None:
                    held.append(edge.held_ns)
            else:
                role = "filled" if edge.relation == "sent_by" else "drained"
                parts[-1] += f", {role} only by `{nodes[nxt].label}`"
        first = nodes[path[0]]
        where = first.where
        n = len(cycle.tasks)
        plural = {"queue_get": "queues", "queue_put": "queues"}
        kinds = sorted({plural.get(nodes[n].kind, nodes[n].kind + "s") for n in path[1::2]})
        what = f"on one another's {_and(kinds)}" if resources else "for one another"
        subject_label = " -> ".join(cycle.tasks)
        message = (
            f"Deadlock: {n} task{'s wait' if n > 1 else ' waits'} {what} in a cycle, "
            f"and none can go on: " + "; ".join(parts)
        )
        if n == 1 and resources:
            message += " (itself: asyncio's locks are not reentrant)"
        hint = (
            "take the locks in one order everywhere (sort them by a key), or hold one at a "
            "time; /graph shows the cycle"
            if resources
            else "a task must not await a task that awaits it (directly or through others); "
            "/graph shows the cycle"
        )
        if any(nodes[n].kind == "lock" and n.startswith("lock:") for n in path[1::2]):
            message += (
                " (the holders read from the tasks' references: the locks were made before "
                "asyncflow attached, and are not timed)"
            )
        evidence = {"tasks": n, "resources": resources}
        if held:
            evidence["held_ns"] = min(held)
        yield Finding(
            "deadlock",
            "error",
            WarningSubject(
                "task",
                None,
                subject_label,
                Location(where.file, where.line) if where is not None else None,
            ),
            message,
            hint,
            evidence,
        )


#: how the wait-for graph knows who holds a lock made before an attach (not instrumented)
_ADOPTED = (
    "the holder read from the tasks' references: the lock was made before asyncflow "
    "attached, and is not timed"
)


def lock_held_by_waiter(docs: Documents, th: Thresholds) -> Iterator[Finding]:
    """Tasks wait on a lock made before an attach whose holder, found from the tasks'
    references, itself waits (on an event, a queue, another task...): the stuck tasks that
    ``/resources`` cannot show, as it does not see the lock. Info: how long it has held is
    not known; a deadlock through such locks is the ``deadlock`` lint's."""
    graph = docs.graph
    if graph is None:
        return
    nodes = {n.id: n for n in graph.nodes}
    in_cycles = {n for c in graph.cycles for n in c.nodes}
    waiters: dict[str, list[str]] = {}
    out: dict[str, list[GraphEdge]] = {}
    for e in graph.edges:
        out.setdefault(e.source, []).append(e)
        if e.relation == "waits" and e.source in nodes:
            waiters.setdefault(e.target, []).append(nodes[e.source].label)
    for lock in graph.nodes:
        if lock.kind != "lock" or not lock.id.startswith("lock:") or lock.id in in_cycles:
            continue
        held_by = [e.target for e in out.get(lock.id, []) if e.relation == "held_by"]
        holder = nodes.get(held_by[0]) if held_by else None
        waits = [e for e in out.get(held_by[0], []) if e.target in nodes] if held_by else []
        if holder is None or not waits or not waiters.get(lock.id):
            continue
        names = sorted(waiters[lock.id])
        n = len(names)
        shown = ", ".join(f"`{name}`" for name in names[:3]) + (", ..." if n > 3 else "")
        who = f"`{holder.label}`" + (f" ({holder.coroutine})" if holder.coroutine else "")
        first = waits[0]
        on = nodes[first.target]
        what = (
            f"awaits task `{on.label}`"
            if first.relation == "awaits"
            else f"waits at {_at(first.where)} ({on.label})"
        )
        where = holder.where
        yield Finding(
            "lock-held-by-waiter",
            "info",
            WarningSubject(
                "task",
                None,
                holder.label,
                Location(where.file, where.line) if where is not None else None,
            ),
            f"{n} task{'s' if n > 1 else ''} ({shown}) wait{'' if n > 1 else 's'} on "
            f"{lock.label} held by {who}, which {what}; {_ADOPTED}",
            f"`asyncflow dump {os.getpid()}` or /tasks shows each task, what it waits on and "
            "who holds it; /graph shows the chain. Whatever the holder waits for must come "
            "before they can go on",
            {"tasks": n},
        )


LINTS: tuple[Lint, ...] = (
    blocked_loop,
    long_poll,
    off_cpu_poll,
    cpu_bound,
    never_awaited,
    unread_channel,
    lost_messages,
    bottleneck,
    starved,
    cancellation_storm,
    swallowed_cancellation,
    task_leak,
    executor_saturated,
    contention,
    permits_leaked,
    event_never_set,
    dead_consumer,
    dead_producer,
    never_retrieved,
    task_dropped,
    unbounded_growth,
    busy_wait,
    tail_latency,
    slow_path,
    wakeup_storm,
    deadlock,
    lock_held_by_waiter,
)

#: the lints that read only the wait-for graph, and the kinds of warning they make: the
#: collector's watch evaluates them on the graph it reads (``/warnings`` reads no tasks)
GRAPH_LINTS: tuple[Lint, ...] = (deadlock, lock_held_by_waiter)
GRAPH_KINDS = frozenset({"deadlock", "lock-held-by-waiter"})


def evaluate(
    docs: Documents, thresholds: Thresholds, lints: Sequence[Lint] = LINTS
) -> list[Finding]:
    """Every finding of every lint on ``docs``."""
    findings: list[Finding] = []
    for lint in lints:
        findings.extend(lint(docs, thresholds))
    kept = [f for f in findings if not _ours(f) and not _silenced(f, docs, thresholds)]
    return _one_per_site(kept)


#: subjects named by their creation site: several at one line make one finding
_BY_SITE = ("resource", "channel", "stream")


def _site_of(finding: Finding) -> tuple[str, str, str, str, int] | None:
    s = finding.subject
    if s.kind not in _BY_SITE:
        return None
    where = s.location
    return (finding.kind, s.kind, s.label, where.file if where else "", where.line if where else 0)


def _one_per_site(findings: list[Finding]) -> list[Finding]:
    """Findings of one kind about several channels or streams created at one line (or named
    alike) become one, the first (the worst, in each lint's order), saying how many."""
    groups: dict[tuple[str, str, str, str, int], list[Finding]] = {}
    out: list[Finding | tuple[str, str, str, str, int]] = []
    for f in findings:
        site = _site_of(f)
        if site is None:
            out.append(f)
            continue
        if site not in groups:
            groups[site] = []
            out.append(site)
        groups[site].append(f)
    merged: list[Finding] = []
    for item in out:
        if isinstance(item, Finding):
            merged.append(item)
            continue
        first, *rest = groups[item]
        if not rest:
            merged.append(first)
            continue
        n = len(rest) + 1
        merged.append(
            Finding(
                first.kind,
                max((f.severity for f in groups[item]), key=SEVERITIES.index),
                first.subject,
                f"{first.message} (and {n - 1} more {first.subject.kind}s created at "
                f"`{first.subject.label}` alike)",
                first.hint,
                {**first.evidence, f"{first.subject.kind}s": n},
            )
        )
    return merged


def _ours(finding: Finding) -> bool:
    """A finding whose site is asyncflow's own code or the console script that launched the
    program: never the program's to act on."""
    where = finding.subject.location
    return where is not None and bool(where.file) and is_asyncflow_file(where.file)


def _module_of(path: str) -> str:
    """The dotted module a file is: ``__main__`` for the program's script, else read against
    ``sys.path`` (the longest entry holding it), or its name without ``.py`` when none does."""
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    if main and os.path.abspath(main) == path:
        return "__main__"
    best = ""
    for entry in sys.path:
        root = os.path.join(os.path.abspath(entry or os.curdir), "")
        if path.startswith(root) and len(root) > len(best):
            best = root
    relative = path[len(best) :] if best else os.path.basename(path)
    module = os.path.splitext(relative)[0].replace(os.sep, ".")
    return module.removesuffix(".__init__")


def _subject_names(finding: Finding, docs: Documents) -> list[tuple[str, str]]:
    """(module, qualified name) pairs a finding is about, for ``ignore:PATTERN``: a future's
    own, a located subject's module; a channel's, the futures that used it."""
    s = finding.subject
    futures = {f.id: f for f in docs.futures}
    if s.kind == "future" and s.id in futures:
        module, _, qualname = futures[s.id].source.rpartition(":")
        return [(module, qualname)]
    if s.location is not None and s.location.file and s.location.file != "?":
        return [(_module_of(s.location.file), s.label)]
    if s.kind == "channel":
        channel = next((c for c in docs.channels if c.id == s.id), None)
        used = [] if channel is None else [*channel.senders, *channel.receivers]
        ids = [e.future_id for e in used if e.messages]
        sources = [futures[i].source for i in ids if i is not None and i in futures]
        if sources and len(sources) == len(ids):
            return [(m, q) for m, _, q in (source.rpartition(":") for source in sources)]
    return []


def _silenced(finding: Finding, docs: Documents, th: Thresholds) -> bool:
    """Whether the user silenced the finding's kind, or every module it is about."""
    if finding.kind in th.silenced:
        return True
    if not th.ignored:
        return False
    names = _subject_names(finding, docs)
    return bool(names) and all(
        any(matches(p, module, qualname) for p in th.ignored) for module, qualname in names
    )


class _Held:
    __slots__ = ("active", "finding", "first_seen", "last_seen")

    def __init__(self, finding: Finding, now: int) -> None:
        self.finding = finding
        self.first_seen = now
        self.last_seen = now
        self.active = True


def _key(finding: Finding) -> tuple[str, str, int | None, str]:
    """One warning per kind and subject; subjects named by their site are one per site (the
    site's first resource or channel may change from one evaluation to the next)."""
    s = finding.subject
    if s.kind in _BY_SITE:
        where = f"{s.location.file}:{s.location.line}" if s.location is not None else ""
        return (finding.kind, s.kind, None, f"{s.label}\0{where}")
    return (finding.kind, s.kind, s.id, s.label)


class WarningBook:
    """The warnings of one profile over time: one per kind and subject, bounded."""

    def __init__(self, thresholds: Thresholds | None = None, limit: int = MAX_WARNINGS) -> None:
        self.thresholds = thresholds or Thresholds()
        self.limit = limit
        self._held: dict[tuple[str, str, int | None, str], _Held] = {}
        self.evaluated_ns = 0

    def update(
        self,
        docs: Documents,
        lints: Sequence[Lint] = LINTS,
        kinds: frozenset[str] | None = None,
        keep: frozenset[str] = frozenset(),
    ) -> None:
        """Evaluate every lint now; warnings not found again no longer hold. Given ``lints``
        and the ``kinds`` of warning they make, only those are evaluated and may stop holding
        (the collector's watch for deadlocks, with nobody asking); warnings of the kinds in
        ``keep`` hold as they did (``docs`` lacks what their lint reads)."""
        seen = set()
        for finding in evaluate(docs, self.thresholds, lints):
            key = _key(finding)
            seen.add(key)
            held = self._held.get(key)
            if held is None:
                self._held[key] = _Held(finding, docs.now_ns)
            else:
                held.finding, held.last_seen, held.active = finding, docs.now_ns, True
        for key, held in self._held.items():
            if key not in seen and (kinds is None or key[0] in kinds) and key[0] not in keep:
                held.active = False
        self._judge_start_up(docs)
        self.evaluated_ns = docs.now_ns
        if len(self._held) > self.limit:
            # keep those that hold now, then the most recently seen
            ranked = sorted(self._held.items(), key=lambda kv: (kv[1].active, kv[1].last_seen))
            for key, _ in ranked[: len(self._held) - self.limit]:
                del self._held[key]

    def _judge_start_up(self, docs: Documents) -> None:
        """A block found while a web service started (its lifespan importing, an ongoing block
        then an error), which held no more before its first request began, held no request up:
        once that request is known, it is info, as the same block judged at the end is."""
        first, note = _no_request_before(docs)
        if first is None:
            return
        began = docs.now_ns - docs.elapsed_ns + first
        for held in self._held.values():
            f = held.finding
            if (
                not held.active
                and f.kind in _START_UP_KINDS
                and f.severity != "info"
                and held.last_seen <= began
            ):
                held.finding = dataclasses.replace(f, severity="info", message=f.message + note)

    def holds(self, kind: str) -> bool:
        """Whether a warning of ``kind`` held at the last evaluation."""
        return any(h.active for key, h in self._held.items() if key[0] == kind)

    def document(self, start_ns: int) -> WarningsDocument:
        """Most severe first, those that hold now before those that held earlier; then in the
        lints' order (``WARNING_KINDS``), not by when each was first seen, which the
        collector's evaluations once a second make vary from one run to the next."""
        rank = {s: i for i, s in enumerate(SEVERITIES)}
        order = {kind: i for i, kind in enumerate(WARNING_KINDS)}
        held = sorted(
            self._held.values(),
            key=lambda h: (
                not h.active,
                -rank[h.finding.severity],
                order.get(h.finding.kind, len(order)),
                h.first_seen,
            ),
        )
        return WarningsDocument(
            schema=SCHEMA,
            evaluated_ns=max(0, self.evaluated_ns - start_ns) if self.evaluated_ns else 0,
            warnings=[
                WarningEntry(
                    kind=h.finding.kind,
                    severity=h.finding.severity,
                    subject=h.finding.subject,
                    message=h.finding.message,
                    hint=h.finding.hint,
                    evidence=h.finding.evidence,
                    first_seen_ns=max(0, h.first_seen - start_ns),
                    last_seen_ns=max(0, h.last_seen - start_ns),
                    active=h.active,
                )
                for h in held
            ],
        )
