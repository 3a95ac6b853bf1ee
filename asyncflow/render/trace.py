"""The trace recorder: polls, blocked loops, queue depths, loop lag and message flows, as a
Chrome trace event file that Perfetto (ui.perfetto.dev) and ``chrome://tracing`` open.

Opt-in (``trace=`` / ``ASYNCFLOW_TRACE`` / ``asyncflow run --trace FILE``). When on, a poll
probe (the hot paths' per-poll seam) appends one small tuple per poll to a ring of the last
``trace_events`` events; everything else is read on the profiler's thread at each collector
tick, from what the recorders keep anyway: the channels' logs of timed messages, the loop
monitor's episodes and lags, the channels' depths. Nothing is added to the hot path when the
recorder is off: no probe is set.

The file has one process per thread that ran tracked polls (named after its event loop), one
track per task in it (the outermost tracked call of the task: the task's own coroutine in
whole-program mode), one track per loop for its blocked-loop episodes, and counter tracks for
loop lag and queue depth. Every timed message becomes a flow arrow (``s`` then ``f``, keyed by
channel and ``msg_id``) from the poll that sent it to the poll that received it, when both
polls are still in the ring; and every sampled message followed through its stages (its
lineage) one arrow chain (``s``, ``t`` at each stage's receive and send, ``f``), category
``lineage``, through the polls of it still in the ring. The metadata says how many events the
ring dropped.
"""

from __future__ import annotations

import bisect
import itertools
import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from asyncflow import clock
from asyncflow._version import __version__
from asyncflow.instrumentation import _session
from asyncflow.model import read
from asyncflow.schema import fit_text
from asyncflow.views.lineage import recent_chains

if TYPE_CHECKING:
    from asyncflow.model.collector import Collector

__all__ = ["PENDING_KEPT", "TraceRecorder", "flow_id", "render"]

#: timed sends kept per channel while their receive is not seen yet (a deeper backlog of timed
#: messages loses its oldest arrows, counted in the metadata)
PENDING_KEPT = 1024

#: calls named beyond the ring's size before the names of calls no longer in it are dropped
_NAMES_SLACK = 10_000

# Kinds of the cold-path events in the ring (a poll's tuple starts with its start time, an int).
_MESSAGE = "message"
_EPISODE = "blocked"
_DEPTH = "depth"
_LAG = "lag"
_CHAIN = "lineage"
#: a lineage chain's flow id: past every message arrow's (channel ids stay below 2**20)
_CHAIN_IDS = 1 << 52

#: process ids of the file: counters of channels first, then one per thread
_CHANNELS_PID = 1
#: thread ids start high, so that none is taken for a process's main thread
_FIRST_TID = 10_000
_UNNAMED: read.CallName = (0, "?", None, 0)


def flow_id(channel_id: int, msg_id: int) -> int:
    """The id of a message's flow arrow: its channel in the high bits, its ``msg_id`` (modulo
    2**32) in the low ones; below 2**53 for any channel id a program reaches, so that
    JavaScript viewers read it exactly."""
    return (channel_id << 32) | (msg_id & 0xFFFF_FFFF)


class _Cursor:
    """How far the recorder has read one channel's logs."""

    __slots__ = ("depth", "last_received", "last_sent", "pending", "timed")

    def __init__(self) -> None:
        self.last_sent = 0  # the msg_id of the newest timed send read
        self.last_received = -1  # the index of the newest timed receive read
        self.timed = 0  # the channel's timed receives when last read
        self.depth = -1  # the depth last written as a counter
        #: timed sends read, not received yet: msg_id -> (sent at, sending call id)
        self.pending: dict[int, tuple[int, int | None]] = {}


@dataclass
class _Figures:
    """What the recorder lost, for the file's metadata."""

    messages_missed: int = 0  # timed receives that left the channel's log before a tick read it
    sends_forgotten: int = 0  # timed sends whose receive came after PENDING_KEPT newer ones


class TraceRecorder:
    """Owns the ring; ``tick`` and ``document`` run on the profiler's thread only."""

    def __init__(self, collector: Collector, capacity: int, output: str | None) -> None:
        self.collector = collector
        collector.on_tick("recording the trace", self.tick)
        self.capacity = capacity
        #: where the trace is written when the profiler stops (None: only served)
        self.output = output
        self.ring: deque[tuple[Any, ...]] = deque(maxlen=capacity)
        self._seq = itertools.count()
        #: the model's tap of every poll, appended to the ring as it ends
        self.tap = read.PollTap(self.ring.append)
        #: call id -> (future id, future label, task name, thread) of the calls whose polls are
        #: in the ring (pruned on the tick when it holds many more)
        self.names = self.tap.names
        #: events the collector's tick appended (the polls' own numbers count the polls)
        self.cold = 0
        #: whether polls are recorded (the probe seam was there and took the probe)
        self.polls = False
        self._cursors: dict[int, _Cursor] = {}
        self._loops: dict[int, tuple[int, int]] = {}  # loop id -> (last episode id, heartbeats)
        self._chains = 0  # the number of the last lineage chain read
        self.lost = _Figures()

    # -- lifecycle (the profiler's start and stop) ---------------------------------------------

    def attach(self) -> None:
        """Start recording polls: the model's tap on both hot paths (beside a probe already
        set, which keeps its calls)."""
        if self.tap.attach():
            self.polls = True

    def detach(self) -> None:
        """Stop recording polls (idempotent); leaves any other probe in place."""
        self.tap.detach()

    def finish(self) -> None:
        """The profiler stops: stop recording, read what is left, write the file if asked."""
        self.detach()
        try:
            self.tick()
        except Exception as exc:
            _session.internal_error("reading the trace's last events", exc)
        if self.output is None:
            return
        try:
            data = self.data()
            with open(self.output, "wb") as out:
                out.write(data)
        except Exception as exc:  # the trace cannot be written: the program goes on
            _session.internal_error(f"writing the trace to {self.output!r}", exc)

    # -- the collector's tick ------------------------------------------------------------------

    def tick(self, now: int | None = None) -> None:
        """Move what the recorders keep anyway into the ring: timed messages, finished
        blocked-loop episodes, depths and lags that changed."""
        if now is None:
            now = clock.now_ns()
        self._messages(now)
        for chain in recent_chains(self._chains):
            self._chains = chain.seq
            if len(chain.hops) > 1:  # one channel: the message's own arrow says it all
                self._append(_CHAIN, chain.seq, chain.origin_call, chain.hops)
        self._loop_events(now)
        names = self.names
        if len(names) > self.capacity + _NAMES_SLACK:
            polled = {e[2] for e in list(self.ring) if type(e[0]) is int}
            for call_id in [c for c in list(names) if c not in polled]:
                names.pop(call_id, None)

    def _append(self, *event: Any) -> None:
        self.cold += 1
        self.ring.append((event[0], next(self._seq), *event[1:]))

    def _messages(self, now: int) -> None:
        cursors = self._cursors
        seen = set()
        for channel in read.channels():
            cid = channel.id
            seen.add(cid)
            cursor = cursors.get(cid)
            if cursor is None:
                cursor = cursors[cid] = _Cursor()
            depth = channel.depth
            if depth is not None and depth != cursor.depth:
                cursor.depth = depth
                self._append(_DEPTH, now, cid, channel.label, depth)
            if channel.newest_timed_send == cursor.last_sent and channel.timed == cursor.timed:
                continue  # nothing timed since the last tick
            pending = cursor.pending
            for send in channel.sends(cursor.last_sent):
                if send.msg_id > cursor.last_sent:
                    pending[send.msg_id] = (send.at_ns, send.call_id)
                    cursor.last_sent = send.msg_id
            while len(pending) > PENDING_KEPT:
                del pending[next(iter(pending))]
                self.lost.sends_forgotten += 1
            taken = 0
            for receive in channel.receives(cursor.last_received):
                if receive.index <= cursor.last_received:
                    continue
                cursor.last_received = receive.index
                taken += 1
                sent = pending.pop(receive.msg_id, None)
                if sent is None:
                    continue  # its send was never read (forgotten, or timed before a reset)
                self._append(
                    _MESSAGE,
                    cid,
                    channel.label,
                    receive.msg_id,
                    sent[0],
                    sent[1],
                    receive.at_ns,
                    receive.call_id,
                )
            timed = channel.timed
            self.lost.messages_missed += max(0, timed - cursor.timed - taken)
            cursor.timed = timed
        for cid in [c for c in cursors if c not in seen]:
            del cursors[cid]

    def _loop_events(self, now: int) -> None:
        states = read.loop_states(self.collector, {i: last for i, (last, _) in self._loops.items()})
        for state in states:
            loop_id, thread = state.loop.id, state.loop.thread
            last_id, beats = self._loops.get(loop_id, (0, 0))
            finished = [e for e in state.episodes if e.id > last_id and not e.ongoing]
            for e in sorted(finished, key=lambda e: e.id):
                self._append(_EPISODE, thread, loop_id, e.since_ns, e.blocked_ns, *_blame(e))
                last_id = e.id
            if state.heartbeats != beats:
                self._append(_LAG, now, thread, loop_id, state.lag_last_ns)
            self._loops[loop_id] = (last_id, state.heartbeats)
        if len(self._loops) > len(states):  # loops the monitor forgot: so do we
            known = {state.loop.id for state in states}
            for loop_id in [i for i in self._loops if i not in known]:
                del self._loops[loop_id]

    # -- the document --------------------------------------------------------------------------

    def data(self) -> bytes:
        """The ring as the bytes of a Chrome trace event file (call on the profiler's thread):
        what ``GET /trace`` serves and the file ``trace=`` names holds."""
        self.tick()
        now = clock.now_ns()
        return _Builder(self, now).build()

    def document(self) -> dict[str, Any]:
        """The ring as a Chrome trace event document: :meth:`data`, parsed."""
        document: dict[str, Any] = orjson.loads(self.data())
        return document


def _blame(e: read.EpisodeReading) -> tuple[int, str, str, str]:
    """(call id, future label, task name, innermost line) of a blocked-loop episode."""
    return e.call_id, e.future_label, e.task, e.where


def _us(ns: int) -> float:
    """Microseconds, as the format counts them, to the nanosecond."""
    return round(ns / 1000, 3)


def _text(value: str) -> str:
    """A name without control characters (some viewers refuse them even escaped), and fit for
    UTF-8: a lone surrogate (a file name that is not UTF-8) is written as its escape."""
    if value.isprintable():
        return value
    return "".join(c if c.isprintable() else _unprintable(c) for c in value)


def _unprintable(c: str) -> str:
    return fit_text(c) if "\ud800" <= c <= "\udfff" else "?"


class _Track:
    __slots__ = ("call", "ends", "name", "pid", "starts", "tid")

    def __init__(self, pid: int, tid: int, name: str, call: int) -> None:
        self.pid = pid
        self.tid = tid
        self.name = name
        self.call = call
        # the outermost polls' bounds, in start order: what a flow's end must fall in
        self.starts: list[int] = []
        self.ends: list[int] = []

    def covers(self, at: int) -> bool:
        i = bisect.bisect_right(self.starts, at) - 1
        return i >= 0 and at <= self.ends[i]


class _Builder:
    """Writes the file's JSON text directly: one line of text per poll from a format made once
    per track and label (a full ring is about a hundred thousand polls; a dict per event, then
    serialising the tree, took seconds of the profiler's thread and made the collector run).
    The rarer events (arrows, episodes, counters) are dicts serialised one by one."""

    def __init__(self, recorder: TraceRecorder, now: int) -> None:
        self.recorder = recorder
        self.now = now
        self.origin = recorder.collector.session.start_ns
        #: the events' JSON texts and, beside them, their times (ns since the origin): the
        #: file lists them in time order
        self.texts: list[bytes] = []
        self.times: list[int] = []
        self.meta: list[dict[str, Any]] = []
        self._pids: dict[int, int] = {}  # thread ident -> pid
        self._tids = itertools.count(_FIRST_TID)
        self._loop_tracks: dict[int, int] = {}  # loop id -> tid
        self._loops_by_thread: dict[int, read.LoopIdentity] = {}
        self.flows = 0
        self.flows_unbound = 0
        self.chains = 0
        self.chains_unbound = 0

    def build(self) -> bytes:
        recorder = self.recorder
        ring = list(recorder.ring)  # one copy, taken while the program's threads append
        # Polls are numbered as they begin, from 0: the newest kept says how many there were
        # (less any still running now, which are not in the ring yet).
        polls = [i for i, e in enumerate(ring) if type(e[0]) is int]
        recorded = recorder.cold + 1 + max((ring[i][4] for i in polls), default=-1)
        for loop in read.loops(recorder.collector):
            self._loops_by_thread.setdefault(loop.thread, loop)
        others = [e for e in ring if type(e[0]) is not int]
        kept = len(ring)
        self.meta.append(_meta(_CHANNELS_PID, None, "process_name", "channels"))
        self.meta.append(_meta(_CHANNELS_PID, None, "process_sort_index", 0, key="sort_index"))
        by_call = self._polls(ring, polls)
        del polls
        for e in others:
            kind = e[0]
            if kind == _MESSAGE:
                self._message(e, by_call)
            elif kind == _CHAIN:
                self._chain(e, by_call)
            elif kind == _EPISODE:
                self._episode(e[2], e[3], e[4], e[5], e[6:])
            elif kind == _DEPTH:
                _, _, at, cid, label, depth = e
                self._counter(_CHANNELS_PID, at, f"{_text(label)} (channel {cid})", "depth", depth)
            elif kind == _LAG:
                _, _, at, thread, loop_id, lag = e
                self._counter(self._pid(thread), at, f"loop {loop_id} lag", "ms", lag / 1e6)
        self._ongoing_episodes()
        del ring, others
        origin_wall = time.time() - (self.now - self.origin) / 1e9
        lost = recorder.lost
        metadata = {
            "asyncflow": {
                "name": _text(recorder.collector.options.name),
                "version": __version__,
                "pid": os.getpid(),
                "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(origin_wall)),
                "capacity": recorder.capacity,
                "recorded": recorded,
                "kept": kept,
                "dropped": max(0, recorded - kept),
                "polls_recorded": recorder.polls,
                "flows": self.flows,
                "flows_unbound": self.flows_unbound,
                "lineage_chains": self.chains,
                "lineage_chains_unbound": self.chains_unbound,
                "messages_missed": lost.messages_missed,
                "sends_forgotten": lost.sends_forgotten,
            }
        }
        texts, times = self.texts, self.times
        # In time order (stable: what began at the same time stays in the order it was made).
        # The polls of each thread come in the order they began already; sorting the numbers
        # and then picking the texts is cheaper than sorting pairs.
        order = sorted(range(len(times)), key=times.__getitem__)
        head = orjson.dumps(self.meta)[1:-1]
        body = b",".join([texts[i] for i in order])
        del order, self.texts, self.times
        parts = [b'{"traceEvents":[', head]
        if head and body:
            parts.append(b",")
        parts += [body, b'],"metadata":', orjson.dumps(metadata), b"}"]
        return b"".join(parts)

    def _pid(self, thread: int) -> int:
        pid = self._pids.get(thread)
        if pid is None:
            pid = self._pids[thread] = len(self._pids) + _CHANNELS_PID + 1
            loop = self._loops_by_thread.get(thread)
            name = _thread_name(thread, loop)
            if loop is not None:
                name = f"{name} · event loop {loop.id}"
            self.meta.append(_meta(pid, None, "process_name", _text(name)))
            self.meta.append(_meta(pid, None, "process_sort_index", pid, key="sort_index"))
        return pid

    def _new_track(self, pid: int, name: str) -> int:
        tid = next(self._tids)
        self.meta.append(_meta(pid, tid, "thread_name", _text(name)))
        self.meta.append(_meta(pid, tid, "thread_sort_index", tid, key="sort_index"))
        return tid

    def _event(self, at: int, event: dict[str, Any]) -> None:
        """One of the rarer events, at ``at`` (ns since the origin)."""
        self.times.append(at)
        self.texts.append(orjson.dumps(event))

    def _polls(self, ring: list[tuple[Any, ...]], polls: list[int]) -> dict[int, _Track]:
        """One X slice per poll (``polls``: their places in ``ring``, which is the order they
        ended), on its task's track; returns the tracks by the call ids that own them (the
        outermost tracked call of each task). The loop runs once per poll of a full ring: it
        is kept to a few lookups and one ``%`` of a format made once per call and track."""
        names = self.recorder.names
        by_thread: dict[int, list[int]] = {}
        thread_of: dict[int, int] = {}  # call id -> thread
        for i in polls:
            call_id = ring[i][2]
            thread = thread_of.get(call_id)
            if thread is None:
                thread = thread_of[call_id] = names.get(call_id, _UNNAMED)[3]
            mine = by_thread.get(thread)
            if mine is None:
                mine = by_thread[thread] = []
            mine.append(i)
        del thread_of
        by_call: dict[int, _Track] = {}
        #: (track id, future id, label) -> the format of that future's polls on that track, in
        #: two parts: the call id goes between them
        formats: dict[tuple[int, Any, str], tuple[bytes, bytes]] = {}
        origin = self.origin
        texts, times = self.texts, self.times
        for thread, mine in by_thread.items():
            pid = self._pid(thread)
            # In the order they began; a poll that ended (entered the ring) before this one did
            # is not around it.
            begun = [ring[i][4] for i in mine]
            mine = [mine[j] for j in sorted(range(len(mine)), key=begun.__getitem__)]
            del begun
            tracks: dict[int, _Track] = {}  # outermost call id -> its track, in this thread
            #: call id -> (its track, the format of its polls there)
            call_formats: dict[int, tuple[_Track, bytes]] = {}
            stack: list[tuple[int, _Track]] = []  # (end number, track) of the enclosing polls
            for ended in mine:
                t0, dt, call_id, outcome, _ = ring[ended]
                while stack and stack[-1][0] < ended:
                    stack.pop()
                if stack:
                    track = stack[-1][1]
                else:
                    track = tracks.get(call_id)  # type: ignore[assignment]
                    if track is None:
                        track = tracks[call_id] = self._track(pid, call_id)
                        by_call[call_id] = track
                    track.starts.append(t0)
                    track.ends.append(t0 + dt)
                stack.append((ended, track))
                known = call_formats.get(call_id)
                if known is None or known[0] is not track:
                    future_id, label, _, _ = names.get(call_id, _UNNAMED)
                    key = (track.tid, future_id, label)
                    parts = formats.get(key)
                    if parts is None:
                        parts = formats[key] = _poll_format(pid, track.tid, future_id, label)
                    fmt = parts[0] + orjson.dumps(call_id) + parts[1]
                    call_formats[call_id] = (track, fmt)
                else:
                    fmt = known[1]
                at = t0 - origin
                try:
                    if at < 0 or dt < 0:
                        raise ValueError(at)  # a number "%d.%03d" cannot write
                    if outcome == "suspended":
                        text = fmt % (at // 1000, at % 1000, dt // 1000, dt % 1000, b"")
                    else:
                        more = b',"outcome":' + orjson.dumps(outcome)
                        text = fmt % (at // 1000, at % 1000, dt // 1000, dt % 1000, more)
                except (TypeError, ValueError):  # not the numbers a poll has: as a dict
                    text = self._poll_dict(pid, track.tid, call_id, t0, dt, outcome)
                texts.append(text)
                times.append(at)
        return by_call

    def _track(self, pid: int, call_id: int) -> _Track:
        """The track of a task whose outermost tracked call is ``call_id``."""
        _, label, task, _ = self.recorder.names.get(call_id, _UNNAMED)
        name = f"{task} ({label})" if task else f"call {call_id} ({label})"
        track = _Track(pid, 0, name, call_id)
        track.tid = self._new_track(pid, name)
        return track

    def _poll_dict(self, pid: int, tid: int, call_id: int, t0: int, dt: int, outcome: str) -> bytes:
        future_id, label, _, _ = self.recorder.names.get(call_id, _UNNAMED)
        args: dict[str, Any] = {"call_id": call_id, "future_id": future_id}
        if outcome != "suspended":
            args["outcome"] = outcome
        return orjson.dumps(
            {
                "name": _text(label),
                "cat": "poll",
                "ph": "X",
                "ts": _us(t0 - self.origin),
                "dur": _us(dt),
                "pid": pid,
                "tid": tid,
                "args": args,
            }
        )

    def _message(self, e: tuple[Any, ...], by_call: dict[int, _Track]) -> None:
        _, _, cid, label, msg_id, sent_at, sender, received_at, receiver = e
        source = by_call.get(sender) if sender is not None else None
        target = by_call.get(receiver) if receiver is not None else None
        if source is None or target is None or not source.covers(sent_at):
            self.flows_unbound += 1
            return
        if not target.covers(received_at):
            self.flows_unbound += 1
            return
        self.flows += 1
        ident = flow_id(cid, msg_id)
        name = "message"
        args = {"channel": _text(label), "channel_id": cid, "msg_id": msg_id}
        self._event(
            sent_at - self.origin,
            {
                "name": name,
                "cat": "message",
                "ph": "s",
                "ts": _us(sent_at - self.origin),
                "pid": source.pid,
                "tid": source.tid,
                "id": ident,
                "args": args,
            },
        )
        self._event(
            received_at - self.origin,
            {
                "name": name,
                "cat": "message",
                "ph": "f",
                "bp": "e",
                "ts": _us(received_at - self.origin),
                "pid": target.pid,
                "tid": target.tid,
                "id": ident,
                "args": {**args, "delay_ns": received_at - sent_at},
            },
        )

    def _chain(self, e: tuple[Any, ...], by_call: dict[int, _Track]) -> None:
        """One sampled message's way as one arrow chain: its first send, then each stage's
        receive and send, to its last receive; the points whose polls left the ring are left
        out (fewer than two: no chain)."""
        _, _, seq, origin_call, hops = e
        points: list[tuple[int, int | None]] = []
        sender = origin_call
        for _, sent_at, received_at, receiver in hops:
            points += [(sent_at, sender), (received_at, receiver)]
            sender = receiver
        bound = []
        for at, call in points:
            track = by_call.get(call) if call is not None else None
            if track is not None and track.covers(at):
                bound.append((at, track))
        if len(bound) < 2:
            self.chains_unbound += 1
            return
        self.chains += 1
        args = {"channels": len(hops), "sampled_message": seq}
        for i, (at, track) in enumerate(bound):
            phase = "s" if i == 0 else "f" if i == len(bound) - 1 else "t"
            event = {
                "name": "lineage",
                "cat": "lineage",
                "ph": phase,
                "ts": _us(at - self.origin),
                "pid": track.pid,
                "tid": track.tid,
                "id": _CHAIN_IDS + seq,
                "args": args,
            }
            if phase != "s":
                event["bp"] = "e"
            self._event(at - self.origin, event)

    def _loop_track(self, thread: int, loop_id: int) -> tuple[int, int]:
        pid = self._pid(thread)
        tid = self._loop_tracks.get(loop_id)
        if tid is None:
            tid = self._loop_tracks[loop_id] = self._new_track(pid, f"event loop {loop_id}")
        return pid, tid

    def _episode(
        self,
        thread: int,
        loop_id: int,
        since: int,
        blocked: int,
        blame: tuple[Any, ...],
        ongoing: bool = False,
    ) -> None:
        call_id, label, task, where = blame
        pid, tid = self._loop_track(thread, loop_id)
        args: dict[str, Any] = {"blocked_ns": blocked}
        if call_id:
            args["call_id"] = call_id
            args["future"] = _text(label)
        if task:
            args["task"] = _text(task)
        if where:
            args["where"] = _text(where)
        if ongoing:
            args["ongoing"] = True
        self._event(
            since - self.origin,
            {
                "name": f"blocked: {_text(label or where or 'untracked code')}",
                "cat": "blocked",
                "ph": "X",
                "ts": _us(since - self.origin),
                "dur": _us(blocked),
                "pid": pid,
                "tid": tid,
                "args": args,
            },
        )

    def _ongoing_episodes(self) -> None:
        """The episode a loop is in now, as long as it has lasted so far."""
        for state in read.loop_states(self.recorder.collector):
            e = state.ongoing
            if e is None:
                continue
            blocked = max(e.blocked_ns, self.now - e.since_ns)
            loop = state.loop
            self._episode(loop.thread, loop.id, e.since_ns, blocked, _blame(e), ongoing=True)

    def _counter(self, pid: int, at: int, name: str, key: str, value: float) -> None:
        self._event(
            at - self.origin,
            {
                "name": name,
                "cat": "counter",
                "ph": "C",
                "ts": _us(at - self.origin),
                "pid": pid,
                "args": {key: value},
            },
        )


def _poll_format(pid: int, tid: int, future_id: Any, label: str) -> tuple[bytes, bytes]:
    """The JSON text of a poll of future ``future_id`` on track ``tid``, in two parts that its
    call id goes between; the start and duration are left to write (each ``%d.%03d`` µs), and
    its extra args (``%s``)."""
    fixed = orjson.dumps({"name": _text(label), "cat": "poll", "ph": "X", "pid": pid, "tid": tid})
    head = fixed[:-1].replace(b"%", b"%%") + b',"ts":%d.%03d,"dur":%d.%03d,"args":{"call_id":'
    tail = b',"future_id":' + orjson.dumps(future_id).replace(b"%", b"%%") + b"%s}}"
    return head, tail


def _meta(pid: int, tid: int | None, name: str, value: Any, key: str = "name") -> dict[str, Any]:
    event: dict[str, Any] = {"name": name, "ph": "M", "pid": pid, "args": {key: value}}
    if tid is not None:
        event["tid"] = tid
    return event


def _thread_name(thread: int, loop: read.LoopIdentity | None) -> str:
    name = loop.thread_name if loop is not None and loop.thread == thread else ""
    if not name:
        name = next((t.name for t in threading.enumerate() if t.ident == thread), "")
    return f"thread {name}" if name else f"thread {thread}"


def render(document: dict[str, Any]) -> bytes:
    """The document as the bytes of a ``.json`` trace file."""
    return orjson.dumps(document)
