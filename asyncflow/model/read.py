"""The read model: what the renderers and the endpoint read of the model, in typed form.

The hot path's registries, records and log tuples, and the loop monitor's states, are read
here and nowhere above the model (views excepted: they are functions of the model). The trace
recorder, the live reporters and the endpoint ask this module, and get small dataclasses (or
the hot path's records handed on whole to a view, never read above it):

- the channels with their timed messages (:func:`channels`), the event loops with their threads
  (:func:`loops`) and the monitor's reading of each (:func:`loop_states`), for the trace;
- the poll probe that feeds the trace's ring (:class:`PollTap`), the one piece of the trace on
  the hot path;
- finished calls handed to the live reporters (:class:`CallBatch`: :class:`FinishedCall` each,
  or :class:`CallTotals` summed by future and outcome);
- a future, channel or stream by id (:func:`future`, :func:`channel`, :func:`stream`), for the
  endpoint's ``/…/{id}/logs`` routes, which hand it to the view that builds the document.
"""

from __future__ import annotations

import functools
import itertools
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from asyncflow.instrumentation import _session, probes
from asyncflow.instrumentation.channels import channel_registry
from asyncflow.instrumentation.futures import call_field, registry
from asyncflow.instrumentation.loops import loop_registry
from asyncflow.instrumentation.recording import FinishedCall
from asyncflow.instrumentation.streams import stream_registry
from asyncflow.model.collector import finished_call
from asyncflow.schema import Location

if TYPE_CHECKING:
    from asyncflow.instrumentation.channels import ChannelRecord, ChannelStats
    from asyncflow.instrumentation.futures import CallRecord, FutureRecord
    from asyncflow.instrumentation.streams import StreamRecord
    from asyncflow.model.collector import Collector
    from asyncflow.model.monitor import Episode

__all__ = [
    "CallBatch",
    "CallName",
    "CallTotals",
    "ChannelReading",
    "EpisodeReading",
    "FinishedCall",
    "LoopIdentity",
    "LoopReading",
    "PollTap",
    "TimedReceive",
    "TimedSend",
    "channel",
    "channels",
    "finished_call",
    "future",
    "loop_states",
    "loops",
    "stream",
]


# -- finished calls, for the live reporters ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class CallTotals:
    """The calls of one future that finished since the previous tick with one outcome."""

    future_id: int
    label: str
    location: Location
    outcome: str
    calls: int
    #: their durations (creation to end), summed
    duration_ns: int
    busy_ns: int
    polls: int


class CallBatch:
    """Calls the collector folded since the previous tick, oldest first: built into
    :class:`FinishedCall` or :class:`CallTotals` only when read, so that a reporter that reads
    neither costs nothing per call."""

    __slots__ = ("_calls", "_records", "_totals")

    def __init__(self, records: Sequence[Any] = ()) -> None:
        #: the hot path's call records, as the collector handed them (read only here)
        self._records: Sequence[CallRecord] = records
        self._calls: tuple[FinishedCall, ...] | None = None
        self._totals: list[CallTotals] | None = None

    def __len__(self) -> int:
        return len(self._records)

    def calls(self) -> tuple[FinishedCall, ...]:
        """Each call, oldest first (exact)."""
        if self._calls is None:
            self._calls = tuple(finished_call(r) for r in self._records)
        return self._calls

    def totals(self) -> list[CallTotals]:
        """The calls summed by future and outcome, in the order each pair first finished."""
        if self._totals is None:
            sums: dict[tuple[Any, str], list[int]] = {}
            for r in self._records:
                key = (r.future, call_field(r, "outcome") or "returned")
                s = sums.get(key)
                if s is None:
                    s = sums[key] = [0, 0, 0, 0]
                s[0] += 1
                s[1] += r.finished - r.created
                s[2] += r.busy
                s[3] += r.polls
            self._totals = [
                CallTotals(
                    future.id,
                    future.label,
                    Location(future.file, future.line),
                    outcome,
                    calls,
                    duration,
                    busy,
                    polls,
                )
                for (future, outcome), (calls, duration, busy, polls) in sums.items()
            ]
        return self._totals


# -- records by id, for the endpoint's logs routes ---------------------------------------------


def future(future_id: int | None) -> FutureRecord | None:
    """The future with this id (live, recently gone, or an aggregate), or None."""
    return next((r for r in registry() if r.id == future_id), None)


def channel(channel_id: int | None) -> ChannelRecord | None:
    """The channel with this id (live, recently gone, or an aggregate), or None."""
    return next((r for r in channel_registry() if r.id == channel_id), None)


def stream(stream_id: int | None) -> StreamRecord | None:
    """The stream with this id (live, recently gone, or an aggregate), or None."""
    return next((r for r in stream_registry() if r.id == stream_id), None)


# -- channels and their timed messages, for the trace -------------------------------------------


@dataclass(frozen=True, slots=True)
class TimedSend:
    """One timed message's send, as its channel's log keeps it."""

    msg_id: int
    at_ns: int
    #: the tracked call that sent it; None outside any
    call_id: int | None


@dataclass(frozen=True, slots=True)
class TimedReceive:
    """One timed message's receive, as its channel's log keeps it."""

    #: the receive's number in its channel, from 0 (they grow by one per timed receive logged)
    index: int
    msg_id: int
    at_ns: int
    #: the tracked call that received it; None outside any
    call_id: int | None


@dataclass(slots=True)
class ChannelReading:
    """One channel (not an aggregate of gone ones) as it is now; its logs are read on demand.

    A fresh one each call, read-only by convention: not frozen, because the trace reads every
    channel on every tick, and a frozen dataclass costs four times as much to make (2 µs
    instead of 0.5 µs: 2 ms a tick for a thousand channels).
    """

    id: int
    label: str
    #: messages in it now; None once it is gone
    depth: int | None
    #: the ``msg_id`` of its newest timed send (0: none yet)
    newest_timed_send: int
    #: messages whose time in the channel was measured so far
    timed: int
    _stats: ChannelStats = field(repr=False, compare=False)

    def sends(self, after: int) -> list[TimedSend]:
        """The timed sends still in its log whose ``msg_id`` is above ``after``, oldest first."""
        return [TimedSend(e[1], e[2], e[3]) for e in list(self._stats.sent_log) if e[1] > after]

    def receives(self, after: int) -> list[TimedReceive]:
        """The timed receives still in its log whose ``index`` is above ``after``, oldest
        first."""
        return [
            TimedReceive(e[0], e[1], e[2], e[3])
            for e in list(self._stats.received_log)
            if e[0] > after
        ]


def channels() -> list[ChannelReading]:
    """Every channel of the session, live ones oldest first, then the last gone ones (the
    aggregates of older gone ones are left out: they have no messages of their own)."""
    found = []
    for record in channel_registry():
        if record.folded:
            continue
        st = record.stats
        depth = record.size() if record.alive else None
        found.append(ChannelReading(record.id, record.label, depth, st.sampled_send, st.timed, st))
    return found


# -- event loops and the monitor's reading of them, for the trace -------------------------------


@dataclass(frozen=True, slots=True)
class LoopIdentity:
    """An instrumented event loop and the thread that runs it."""

    id: int
    #: ``threading.get_ident()`` of its thread; 0 while not known
    thread: int
    thread_name: str


@dataclass(frozen=True, slots=True)
class EpisodeReading:
    """One blocked-loop episode, published (past the block threshold)."""

    #: its number in its loop, from 1
    id: int
    since_ns: int
    #: how long it lasted (so far, while ``ongoing``)
    blocked_ns: int
    ongoing: bool
    #: the innermost tracked call running, and its future's label; 0 and "" when none was
    call_id: int
    future_label: str
    #: the task that ran; "" when not known
    task: str
    #: the innermost line: ``function (file.py:line)``; "" when no stack was read
    where: str


@dataclass(frozen=True, slots=True)
class LoopReading:
    """What the loop monitor knows of one loop now, read under the loop state's lock."""

    loop: LoopIdentity
    heartbeats: int
    #: the lag the last heartbeat measured
    lag_last_ns: int
    #: the newest published episodes (at most the monitor's ``MAX_EPISODES``; those above the
    #: id :func:`loop_states` was given for this loop), newest first
    episodes: list[EpisodeReading]
    #: the episode under way, once published; None when the loop is not blocked now
    ongoing: EpisodeReading | None


def loops(collector: Collector) -> list[LoopIdentity]:
    """The loops the monitor watches (those gone included), then the others still alive, by
    id within each."""
    found: dict[int, LoopIdentity] = {}
    records = [state.record for state in list(collector.monitor.states.values())]
    for record in [*records, *loop_registry()]:
        if record.id not in found:
            found[record.id] = LoopIdentity(record.id, record.thread, record.thread_name)
    return list(found.values())


def loop_states(collector: Collector, after: Mapping[int, int] | None = None) -> list[LoopReading]:
    """The monitor's reading of every loop it watches.

    Args:
        collector: whose monitor.
        after: loop id -> the id of the newest episode already read: only newer ones are
            listed (read every tick, the others would be made again each time); None for all.
    """
    found = []
    for state in list(collector.monitor.states.values()):
        with state.lock:
            record = state.record
            ongoing = state.ongoing
            seen = 0 if after is None else after.get(record.id, 0)
            found.append(
                LoopReading(
                    LoopIdentity(record.id, record.thread, record.thread_name),
                    state.heartbeats,
                    state.lag_last,
                    [_episode(e) for e in state.episodes if e.id > seen],
                    _episode(ongoing) if ongoing is not None and ongoing.id else None,
                )
            )
    return found


def _episode(e: Episode) -> EpisodeReading:
    where = ""
    if e.stack:
        file, line, function, _ = e.stack[0]
        where = f"{function} ({os.path.basename(file)}:{line})"
    call = e.call
    call_id, label = (0, "") if call is None else (call.call_id, call.future.label)
    return EpisodeReading(
        e.id, e.since, e.blocked_ns, e.ongoing, call_id, label, e.task or "", where
    )


# -- the poll probe, for the trace --------------------------------------------------------------

#: what a traced call is noted as once: (future id, future label, task name, thread ident)
CallName = tuple[int, str, str | None, int]


class _Probe:
    """The poll probe: ``begin`` numbers the poll's start, ``end`` appends the poll to the ring.

    Polls are numbered as they begin, and enter the ring as they end: a poll is nested in
    another when it began later and entered the ring sooner, which times alone cannot tell when
    they are equal (a coarse or a fake clock, polls shorter than a tick of it).
    """

    __slots__ = ("begin", "end")

    def __init__(self, append: Callable[[Any], None], names: dict[int, CallName]) -> None:
        get_ident = threading.get_ident
        # begin(r) is next(counter, r): the next number, with no Python frame to run
        begin: Callable[[Any], int] = functools.partial(next, itertools.count())

        def end(r: Any, token: Any, t0: int, dt: int, outcome: str) -> None:
            # Only numbers and interned strings in the ring: such tuples leave the cyclic GC's
            # lists at its next young collection, so a full ring costs collections nothing.
            # A call is polled on one thread (its task's loop's): noted once, with its names.
            call_id = r.call_id
            if call_id not in names:
                future = r.future
                names[call_id] = (future.id, future.label, getattr(r, "task", None), get_ident())
            append((t0, dt, call_id, outcome, token))

        self.begin = begin
        self.end = end


class _Both:
    """Two probes in one (there is one probe seam): ``first`` was set before the tap."""

    __slots__ = ("begin", "end", "first", "second")

    def __init__(self, first: Any, second: _Probe) -> None:
        self.first = first
        self.second = second
        begin1, end1, begin2, end2 = first.begin, first.end, second.begin, second.end

        def begin(r: Any) -> tuple[Any, Any]:
            return begin1(r), begin2(r)

        def end(r: Any, token: Any, t0: int, dt: int, outcome: str) -> None:
            end1(r, token[0], t0, dt, outcome)
            end2(r, token[1], t0, dt, outcome)

        self.begin = begin
        self.end = end


class PollTap:
    """Every poll of every tracked call, appended by the hot paths as it ends.

    Each poll is one tuple ``(t0_ns, dt_ns, call_id, outcome, number)`` handed to ``append``
    (``outcome`` is ``suspended`` or how the call ended; ``number`` counts polls as they
    began, from 0), and each call polled is noted once in ``names`` as a :data:`CallName`.
    """

    def __init__(self, append: Callable[[tuple[int, int, int, str, int]], None]) -> None:
        #: call id -> (future id, future label, task name, thread ident) of the calls polled
        self.names: dict[int, CallName] = {}
        self._probe = _Probe(append, self.names)
        self._attached = False

    def attach(self) -> bool:
        """Set the probe on both hot paths (beside a probe already set, which keeps its calls);
        whether it was set (False: no probe seam, counted as an internal error)."""
        try:
            other = probes.poll_probe()
            probes.set_poll_probe(self._probe if other is None else _Both(other, self._probe))
        except Exception as exc:  # no probe seam: the rest of the trace is still recorded
            _session.internal_error("setting the trace recorder's poll probe", exc)
            return False
        self._attached = True
        return True

    def detach(self) -> None:
        """Stop (idempotent); leaves any other probe in place."""
        if not self._attached:
            return
        self._attached = False
        try:
            current = probes.poll_probe()
            if current is self._probe:
                probes.set_poll_probe(None)
            elif isinstance(current, _Both) and current.second is self._probe:
                probes.set_poll_probe(current.first)
        except Exception as exc:
            _session.internal_error("removing the trace recorder's poll probe", exc)
